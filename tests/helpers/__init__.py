"""What tests share beyond pytest fixtures (those are in tests/conftest.py): small callables over the
platform's one entry point (`from tests.helpers import ...`, as tests import tests.conftest)."""

from __future__ import annotations

from pathlib import Path


def run_contract(loaded, tracking_uri: str, runs_root: Path, **options):
    """A plain `gates run` of `loaded` in this process (gates.execution.run_plan, its options): the
    evidence, recorded or reproduced and compared with the record."""
    from gates.execution import run_plan

    return run_plan(loaded, tracking_uri, runs_root, **options).evidence
