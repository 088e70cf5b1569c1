"""What tests share beyond pytest fixtures (those are in tests/conftest.py, `make_project` among them):
small callables over the platform's one entry point, the `gates` CLI as tests run it (cli.py),
temporary projects (project.py) and a user's own translation pairs (corpus.py). Tests import them as
`from tests.helpers import ...`, as they import tests.conftest."""

from __future__ import annotations

from pathlib import Path

from tests.helpers.cli import gates, run_main
from tests.helpers.corpus import translator_rows
from tests.helpers.project import committed, new_project, run_contracts

__all__ = [
    "committed",
    "gates",
    "new_project",
    "run_contract",
    "run_contracts",
    "run_main",
    "translator_rows",
]


def run_contract(loaded, tracking_uri: str, runs_root: Path, **options):
    """A plain `gates run` of `loaded` in this process (gates.execution.run_plan, its options): the
    evidence, recorded or reproduced and compared with the record."""
    from gates.execution import run_plan

    return run_plan(loaded, tracking_uri, runs_root, **options).evidence
