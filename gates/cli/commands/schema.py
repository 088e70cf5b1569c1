"""`gates schema [--study NAME]`: the JSON Schema of a contract, or of a study's arm config."""

from __future__ import annotations

import json

import typer

from gates.errors import UserError


def schema(
    study: str | None = typer.Option(
        None, "--study", help="Print this study's arm config schema instead."
    ),
):
    """Print the JSON Schema of a contract (for editors), or of one study's arm configuration."""
    from gates.contract import Contract
    from gates.errors import did_you_mean
    from gates.study import get_study, study_names

    if study is None:
        print(json.dumps(Contract.model_json_schema(), indent=2))
        return
    try:
        print(json.dumps(get_study(study).Config.model_json_schema(), indent=2))
    except KeyError:
        raise UserError(
            f"unknown study {study!r}{did_you_mean(study, study_names())}; "
            f"registered: {', '.join(study_names())}",
            field="--study",
        ) from None
