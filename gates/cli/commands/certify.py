"""`gates certify CONTRACT... --reason TEXT`: recorded claims checked against today's code
(gates.verify.certify)."""

from __future__ import annotations

from pathlib import Path

import typer

from gates.cli._common import CONTRACTS_DIR, RUNS_DIR, err, out, parse_tolerance
from gates.errors import UserError


def certify(
    contracts: list[Path] = typer.Argument(..., help="Contract YAML files of recorded claims."),
    reason: str = typer.Option(
        ..., "--reason", help="Why (recorded in runs/INDEX.jsonl), e.g. the refactor it follows."
    ),
    sample: int | None = typer.Option(
        None,
        "--sample",
        min=1,
        help="Re-run this many of each claim's completed runs, chosen at random (a fresh seed, "
        "printed, or --seed), instead of all of them.",
    ),
    seed: int | None = typer.Option(None, "--seed", help="Seed of the --sample choice."),
    tolerance: str | None = typer.Option(
        None,
        "--tolerance",
        metavar="ABS,REL",
        help="Tolerance for contracts without a `replay` section (default: replay's defaults, "
        "1e-6,1e-6: the same machine; CI's audit uses 0.01,0.01 across machines); a declared one "
        "is always used as declared. Recorded in the certified entry.",
    ),
    runs_dir: Path = RUNS_DIR,
    contracts_dir: Path = CONTRACTS_DIR,
):
    """Check recorded claims against today's code: re-run their completed runs (each bare, on the
    CPU thread count it recorded) and compare every recorded metric within the contract's replay
    tolerance. When all reproduce, a `certified` entry with today's code fingerprint and the runs
    re-run is appended to the claims history, and the claim is no longer stale (stale means: not
    checked against today's code). A run recorded on other CPU kernels that re-runs off its record is
    judged against a re-run under the code the claim stands on (a clean checkout of its commit) instead.
    Exit 1 when any run does not reproduce; nothing is written then."""
    from gates.execution import load_checked, require_in_contracts
    from gates.verify import certify as certify_claim

    if not reason.strip():
        raise UserError("give a reason: it is recorded in the claims index", field="--reason")
    default_tolerance = parse_tolerance(tolerance, "--tolerance")
    failed = []
    for path in contracts:
        loaded = load_checked(path)
        require_in_contracts(loaded, contracts_dir)
        done = certify_claim(
            loaded,
            runs_dir,
            reason,
            sample=sample,
            seed=seed,
            default_tolerance=default_tolerance,
            log=lambda line: out.print(line, markup=False, highlight=False),
        )
        if done.certified:
            out.print(
                f"{loaded.id}: certified under code {str(done.entry.code_sha256)[:12]} "
                f"({_what_reran(done.entry)})",
                markup=False,
            )
        else:
            failed.append(loaded.id)
            for problem in done.problems:
                err.print(f"{loaded.id}: {problem}", markup=False, highlight=False)
    if failed:
        err.print(
            f"not certified: {', '.join(failed)} (runs that do not reproduce under today's code; "
            f"nothing written)",
            markup=False,
        )
        raise typer.Exit(1)


def _what_reran(entry) -> str:
    """What a `certified` entry's re-runs showed, in words: the runs that reproduce their record, and
    those from other CPU kernels that re-run as the code the claim stands on does here."""
    said = [f"{entry.reran} reproduce their record"] if entry.reran_runs else []
    elsewhere = entry.reran_elsewhere
    if elsewhere:
        commits = ", ".join(sorted({r.commit[:12] for r in elsewhere}))
        said.append(
            f"{len(elsewhere)} recorded on other CPU kernels re-run{'s' if len(elsewhere) == 1 else ''} "
            f"as the code of commit {commits} does here"
        )
    return "; ".join(said)
