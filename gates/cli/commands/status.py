"""`gates status [ID...]`: every claim in one line, or in detail, read without importing any study
(gates.verify.claims; --full: gates.verify.verify)."""

from __future__ import annotations

from pathlib import Path

import typer

from gates.cli._common import CONTRACTS_DIR, RUNS_DIR, out
from gates.cli._printers import (
    WIDE_STATUS,
    print_status_blocks,
    print_status_lines,
    print_status_table,
    status_json,
    status_row,
)
from gates.errors import UserError


def status(
    ids: list[str] | None = typer.Argument(
        None,
        metavar="[ID-or-glob...]",
        help="Only these claims: ids, or shell-style patterns (quoted: 'c05-*').",
    ),
    details: bool = typer.Option(
        False,
        "--details",
        "-v",
        help="Each claim with its hash check, code (stale files), notes and problems (a table on a "
        "terminal of 120 columns or more, else a block per claim), not one line.",
    ),
    runs_dir: Path = RUNS_DIR,
    contracts_dir: Path = CONTRACTS_DIR,
    as_json: bool = typer.Option(
        False,
        "--json",
        help="Print a JSON list, per claim: id, verdict, status, "
        "hash_ok, stale, stale_files, withdrawn, superseded_by, supersedes, family (its claim "
        "family and the alpha it was judged at), rule_flags, attempts, earlier_attempts, problems "
        "and their codes (problem_codes).",
    ),
    full: bool = typer.Option(
        False,
        "--full",
        help="Check every claim as `gates verify` does (re-derive "
        "each verdict, apply today's rules to each contract: imports every study; "
        "seconds instead of a fraction of one).",
    ),
):
    """Every claim (or those named) in one line: its id, verdict (withdrawn, superseded), date and
    state (ok, lost, pending, withdrawn; stale: its code changed since). With --details (-v): whether
    its hash still matches its evidence, the stale files, notes, rules it predates and problems (narrower
    than 120 columns: one block per claim, its id whole, each line cut to the width). Read from
    runs/*/evidence.json, the contracts' hashes and the claims history (runs/INDEX.jsonl), without
    importing any study: rules a contract predates are those its evidence recorded, and the
    re-derivation of each verdict is `gates verify`'s (or `--full`)."""
    if full:
        from gates.verify import verify as verify_claims

        checks = verify_claims(runs_dir, contracts_dir)
    else:
        from gates.verify import claims

        checks = claims(runs_dir, contracts_dir)
    if ids:
        checks = _named_claims(checks, ids)
    if as_json:
        print(status_json(checks))
        return
    rows = [status_row(c) for c in checks]
    if not details:
        print_status_lines(rows, out.width)
    elif out.width >= WIDE_STATUS:
        print_status_table(rows)
    else:
        print_status_blocks(rows, out.width)
    if not full:
        out.print(
            ("" if details else "`gates status -v [ID...]`: hash, code, notes and problems; ")
            + "from the evidence, contract hashes and claims history; `gates verify` also re-derives "
            "every verdict, `gates check` applies today's rules",
            markup=False,
            highlight=False,
            style="dim",
            soft_wrap=False,  # prose: wrapped at the terminal's width
        )


def _named_claims(checks: list, patterns: list[str]) -> list:
    """The claims whose id is one of `patterns` or matches it as a shell-style pattern (fnmatch), in
    their order; a pattern no claim matches is bad input (exit 2)."""
    from fnmatch import fnmatchcase

    from gates.errors import did_you_mean

    ids = [c.contract_id for c in checks]
    for pattern in patterns:
        if not any(fnmatchcase(i, pattern) for i in ids):
            raise UserError(
                f"no claim matches {pattern!r}{did_you_mean(pattern, ids)}; expected a claim's id or "
                f"a pattern such as 'c05-*' (`gates status` lists them)",
                field="ids",
            )
    return [c for c in checks if any(fnmatchcase(c.contract_id, p) for p in patterns)]
