"""The pages: served by `gates dashboard`, written as files by `gates report --html` (one renderer)."""

from __future__ import annotations

import re
from pathlib import Path

from gates.dashboard import render
from gates.dashboard.board import BoardQuery
from gates.dashboard.data import Claims, Store
from gates.dashboard.svg import e
from gates.record import atomic_write_text

ID = re.compile(r"^[a-z0-9][a-z0-9-]{0,79}$")  # a contract id (gates.contract's slug)


class Site:
    def __init__(self, runs_dir: Path, contracts_dir: Path, tracking_uri: str, mlflow_ui: str):
        self.store = Store(tracking_uri)
        self.claims = Claims(Path(runs_dir), Path(contracts_dir), self.store)
        self.mlflow_ui = mlflow_ui

    def warm(self) -> None:
        """Load the claim checks and open the store ahead of the first request (imports take seconds)."""
        try:
            self.claims.all()
            self.store.client()
        except Exception:  # the request that needs them will say what is wrong
            pass

    def footer(self) -> str:
        path = self.store.sqlite_path()
        found = "" if path is None else (" (found)" if path.is_file() else " (not found)")
        return (
            f"Evidence from {e(self.claims.runs_dir)}/, contracts from {e(self.claims.contracts_dir)}/, "
            f"MLflow store {e(self.store.uri)}{found}, MLflow UI {e(self.mlflow_ui)}."
        )

    def index(self, links: render.Links = render.SERVER, query: str = "") -> str:
        """The board; `query`: the request's query string (search, filters, sort); a static page
        lists every claim."""
        return render.index_page(
            list(self.claims.all().values()), links, self.footer(), BoardQuery.parse(query)
        )

    def contract(self, contract_id: str, links: render.Links = render.SERVER) -> str | None:
        """The contract page, or None when there is no such contract."""
        view = self.claims.view(contract_id) if ID.match(contract_id) else None
        if view is None:
            return None
        return render.contract_page(view, links, self.mlflow_ui, self.footer())

    def not_found(self, what: str, links: render.Links = render.SERVER) -> str:
        return render.not_found_page(what, links, self.footer())

    def write_static(self, out: Path) -> list[Path]:
        """index.html and contract/<id>.html under `out`, with relative links (for CI artifacts)."""
        written = [out / "index.html"]
        atomic_write_text(written[0], self.index(render.STATIC_INDEX))
        for contract_id in self.claims.all():
            path = out / "contract" / f"{contract_id}.html"
            atomic_write_text(path, self.contract(contract_id, render.STATIC_CONTRACT))
            written.append(path)
        return written
