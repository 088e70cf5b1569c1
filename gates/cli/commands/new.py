"""`gates new ID --study NAME`: a contract skeleton to fill in (gates.contract.write)."""

from __future__ import annotations

from pathlib import Path

import typer

from gates.cli._common import CONTRACTS_DIR, out


def new(
    contract_id: str = typer.Argument(
        ...,
        metavar="ID",
        help="Id of the new contract (lowercase letters, "
        "digits, '-'); the file is contracts/ID.yaml.",
    ),
    study: str = typer.Option(
        ..., "--study", help="Registered study the contract runs (see `gates studies`)."
    ),
    contracts_dir: Path = CONTRACTS_DIR,
):
    """Write a contract skeleton contracts/ID.yaml for a study: every required field, two arms with the
    study's default config, the five preflight gates as prompts, and "TODO: ..." wherever you decide.
    `gates check` refuses it, naming each placeholder, until every one is replaced. Never overwrites."""
    from gates.contract import write

    path = write(contracts_dir, contract_id, study)
    out.print(
        f'wrote {path}: replace each "TODO: ..." value, then `gates check {path}`',
        markup=False,
        highlight=False,
    )
