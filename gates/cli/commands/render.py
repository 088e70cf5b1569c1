"""`gates render [ID...]`: verdict.md rewritten from evidence.json (gates.record.write_report)."""

from __future__ import annotations

from pathlib import Path

import typer

from gates.cli._common import RUNS_DIR, out
from gates.errors import UserError


def render(
    ids: list[str] | None = typer.Argument(
        None, help="Contract ids (default: every runs/*/evidence.json)."
    ),
    runs_dir: Path = RUNS_DIR,
):
    """Rewrite runs/<id>/verdict.md from runs/<id>/evidence.json (after a change of the report renderer;
    `gates verify` requires verdict.md to be exactly the rendering of the evidence). The evidence is
    not changed."""
    import re

    from gates.contract import SLUG
    from gates.record import EVIDENCE, evidence_dir, write_report

    for i in ids or []:
        if not re.fullmatch(SLUG.strip("^$"), i):
            raise UserError(
                f"{i!r} is not a contract id; expected an id like c05-structural-probe", field="ids"
            )
    folders = (
        [evidence_dir(runs_dir, i) for i in ids]
        if ids
        else sorted(p.parent for p in runs_dir.glob(f"*/{EVIDENCE}"))
    )
    for folder in folders:
        try:
            written = write_report(folder)
        except ValueError as e:
            raise UserError(
                f"{e}; expected valid evidence (restore it from git, or run the contract again)",
                file=str(folder / EVIDENCE),
            ) from None
        out.print(f"rendered {written}", markup=False, highlight=False)
