"""`gates dashboard`: serve the claims dashboard (gates.dashboard), read-only."""

from __future__ import annotations

from pathlib import Path

import typer

from gates.cli._common import CONTRACTS_DIR, MLFLOW_UI, RUNS_DIR, TRACKING_URI


def dashboard(
    runs_dir: Path = RUNS_DIR,
    contracts_dir: Path = CONTRACTS_DIR,
    tracking_uri: str | None = TRACKING_URI,
    mlflow_ui: str = MLFLOW_UI,
    host: str = typer.Option(
        "127.0.0.1", "--host", help="Address to listen on (local only by default)."
    ),
    port: int = typer.Option(8765, "--port", help="Port to listen on (0: any free port)."),
):
    """Serve the claims dashboard (read-only): every contract's verdict and hash check, and per contract its
    conditions' intervals, learning curves with stop rules and halts, per-seed metrics, provenance."""
    from gates.dashboard.server import serve
    from gates.dashboard.site import Site
    from gates.record import resolve_uri

    serve(Site(runs_dir, contracts_dir, resolve_uri(tracking_uri), mlflow_ui), host, port)
