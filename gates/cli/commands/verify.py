"""`gates verify`: fail when a claim lost its evidence (gates.verify.verify)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from gates.cli._common import CONTRACTS_DIR, RUNS_DIR, err, out, parse_tolerance
from gates.cli._printers import print_checks, verify_summary


def verify(
    contracts: list[Path] | None = typer.Argument(
        None, help="Only these contracts (default: every claim in runs/)."
    ),
    replay: bool = typer.Option(
        False, "--replay", help="Also re-run contracts marked `replay: {ci: true}`."
    ),
    runs_dir: Path = RUNS_DIR,
    contracts_dir: Path = CONTRACTS_DIR,
    as_json: bool = typer.Option(False, "--json", help="Print the checks as JSON."),
    strict_code: bool = typer.Option(
        False,
        "--strict-code",
        help="Also fail on stale standing claims (not superseded or withdrawn): the code their "
        "evidence was computed with (the study's modules) changed since and no certification "
        "covers it; each names the `gates certify` that clears it (without it, stale claims are only "
        "reported).",
    ),
    audit_seconds: float | None = typer.Option(
        None,
        "--audit-seconds",
        min=0,
        help="Spot-check audit: re-run "
        "completed arm x seed runs of the contracts this verify does not "
        "replay, in an order seeded from the git commit (printed) that "
        "nothing recorded steers, for this many seconds; a run whose metrics "
        "do not reproduce within the contract's replay tolerance loses its "
        "claim; a run whose recorded seconds x 2 exceed the budget is not "
        "started and named unaudited, one that no longer fits the time left "
        "is passed over and listed, one that overruns its projection is "
        "stopped early and named unaudited; the runs not reached are counted.",
    ),
    audit_strict: bool = typer.Option(
        False,
        "--audit-strict",
        help="Also fail when the audit left runs "
        "unaudited for lack of time (too long for the budget, or stopped), or "
        "when a replay or audit did not reproduce runs computed on other CPU "
        "kernels or torch than this machine's (without it, only reported).",
    ),
    audit_seed: int | None = typer.Option(
        None,
        "--audit-seed",
        help="Seed of the audit's choice (default: "
        "a fresh random one, printed), e.g. to repeat a CI run's audit.",
    ),
    audit_tolerance: str | None = typer.Option(
        None,
        "--audit-tolerance",
        metavar="ABS,REL",
        help="Tolerance "
        "of the audit for contracts without a `replay` section (default: "
        "replay's defaults, 1e-6,1e-6: the same machine); a declared one "
        "is always used as declared.",
    ),
    jobs: int = typer.Option(
        1,
        "--jobs",
        min=1,
        help="With --replay: run the replays' arm x seed runs in this many local processes (each "
        "on the thread count its runs recorded; where none was recorded, the cores divided among "
        "the processes).",
    ),
):
    """Fail (exit 1) when a claim lost its evidence: contract edited after the fact, evidence missing or
    malformed, a verdict that no longer reproduces (from its metrics, by replay or by audit), or a claims
    history (runs/INDEX.jsonl) that was rewritten or does not vouch for the evidence (changed or gone
    without an entry). Withdrawn claims pass as withdrawn; stale claims are reported (--strict-code: fail),
    as are runs the audit stopped for lack of time and re-runs that differ from runs computed on
    other CPU kernels or torch (--audit-strict: fail)."""
    from gates.verify import UNAUDITED, UNCONFIRMED
    from gates.verify import verify as verify_claims

    def log(
        line: str,
    ) -> None:  # the audit's plan and results, as they happen (stderr under --json)
        (err if as_json else out).print(line, markup=False, highlight=False)

    parsed_tolerance = parse_tolerance(audit_tolerance, "--audit-tolerance")
    if replay or audit_seconds:
        from gates.execution import retain_freed_memory

        retain_freed_memory()  # this process trains: keep its large buffers between steps
    checks = verify_claims(
        runs_dir,
        contracts_dir,
        contracts or None,
        replay=replay,
        strict_code=strict_code,
        audit_seconds=audit_seconds,
        audit_seed=audit_seed,
        audit_tolerance=parsed_tolerance,
        jobs=jobs,
        log=log,
    )
    lost = [c for c in checks if c.status == "lost"]
    broken = [c for c in checks if c.status == "broken"]
    unaudited = [c for c in checks if UNAUDITED in c.codes]
    unconfirmed = [c for c in checks if UNCONFIRMED in c.codes]
    if as_json:
        print(json.dumps([c.as_dict() for c in checks], indent=2))
    else:
        print_checks(checks, strict_code)
        out.print(verify_summary(checks, unaudited, unconfirmed), markup=False, highlight=False)
    if lost or broken or (audit_strict and (unaudited or unconfirmed)):
        raise typer.Exit(1)
