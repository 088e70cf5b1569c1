"""`gates pilot CONTRACT`: train a draft's arms briefly on seeds no claim can use (gates.execution.run_pilot)."""

from __future__ import annotations

from pathlib import Path

import typer

from gates.cli._common import THREADS, out


def pilot(
    contract: Path = typer.Argument(
        ..., help="Contract YAML file (a draft: it need not be registered)."
    ),
    arm: list[str] | None = typer.Option(
        None, "--arm", help="An arm to pilot (repeat for more; default: every arm)."
    ),
    steps: int | None = typer.Option(
        None, "--steps", min=1, help="Steps per run (default: the contract's budget; at most it)."
    ),
    seeds: int = typer.Option(
        1, "--seeds", min=1, max=10, help="Pilot seeds per arm (2**31, 2**31 + 1, ...)."
    ),
    tracking_uri: str | None = typer.Option(
        None,
        "--tracking-uri",
        help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db).",
    ),
    threads: int | None = THREADS,
):
    """Pilot a contract before registering it: train its arms (or --arm) for --steps on seeds no contract
    or tuning can use (2**31 and up), recorded in the contract's MLflow experiment as pilots. Nothing is
    written under runs/; `gates check` and the verdict list every pilot of the contract's id with when it
    ran, on which version of the contract and what it measured (what was known before)."""
    from gates.execution import load_checked, run_pilot
    from gates.record import pilot_lines, resolve_uri
    from gates.study import cpu_threads

    loaded = load_checked(contract)
    with cpu_threads(threads):
        pilots = run_pilot(
            loaded, resolve_uri(tracking_uri), arms=arm or None, steps=steps, seeds=seeds
        )
    for line in pilot_lines(pilots, loaded.sha256):
        out.print(line, markup=False)
    out.print(
        "pilots stay on the record: `gates check` and the verdict list them beside the contract",
        markup=False,
    )
