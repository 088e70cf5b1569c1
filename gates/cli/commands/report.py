"""`gates report --html DIR`: the dashboard's pages as static HTML (for CI artifacts)."""

from __future__ import annotations

from pathlib import Path

import typer

from gates.cli._common import CONTRACTS_DIR, MLFLOW_UI, RUNS_DIR, TRACKING_URI, out
from gates.errors import UserError


def report(
    html: Path = typer.Option(
        ..., "--html", help="Folder to write index.html and contract/<id>.html into."
    ),
    runs_dir: Path = RUNS_DIR,
    contracts_dir: Path = CONTRACTS_DIR,
    tracking_uri: str | None = TRACKING_URI,
    mlflow_ui: str = MLFLOW_UI,
):
    """Write the dashboard's pages as static HTML files with relative links (for CI artifacts)."""
    from gates.dashboard.site import Site
    from gates.record import resolve_uri

    try:
        written = Site(runs_dir, contracts_dir, resolve_uri(tracking_uri), mlflow_ui).write_static(
            html
        )
    except OSError as e:  # e.g. a folder that cannot be created or written
        raise UserError(
            f"cannot write the report into {html}: {e.strerror or e}; expected a writable folder",
            field="--html",
        ) from None
    out.print(f"wrote {len(written)} pages: {written[0]}", markup=False, highlight=False)
