"""`gates rederive CONTRACT... --reason TEXT`: recorded verdicts re-derived by today's engine."""

from __future__ import annotations

from pathlib import Path

import typer

from gates.cli._common import RUNS_DIR, out
from gates.errors import UserError


def rederive(
    contracts: list[Path] = typer.Argument(
        ..., help="Contract YAML files whose evidence to re-derive."
    ),
    reason: str = typer.Option(..., "--reason", help="Why (recorded in runs/INDEX.jsonl)."),
    runs_dir: Path = RUNS_DIR,
):
    """Re-derive recorded verdicts with today's verdict engine from their recorded per-seed values (no
    training), after a correction of the statistics: rewrites evidence.json and verdict.md where anything
    changed and appends a `rederived` entry with the reason to the claims index."""
    from gates.contract import load_contract
    from gates.execution import rederive as rederive_claim

    if not reason.strip():
        raise UserError("give a reason: it is recorded in the claims index", field="--reason")
    for path in contracts:
        loaded = load_contract(path)
        changed = rederive_claim(loaded, runs_dir, reason.strip())
        if changed is None:
            out.print(f"{loaded.id}: unchanged", markup=False)
        else:
            old, new = changed
            moved = [
                f"{c.list_name}[{c.index}] {o.outcome} -> {c.outcome}"
                for o, c in zip(old.conditions, new.conditions)
                if o.outcome != c.outcome
            ]
            out.print(
                f"{loaded.id}: {old.verdict} -> {new.verdict}"
                + (f" ({'; '.join(moved)})" if moved else ""),
                markup=False,
            )
