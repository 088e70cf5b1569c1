"""Screenshots of the MLflow UI as a reviewer first sees it, for docs/mlflow.md: an experiment opened
in a fresh browser (MLflow 3's GenAI mode), its runs table through `?workflowType=machine_learning`,
and the arms view the dashboard links to (the arms grouped, what the decision reads charted), at
1280 px wide in headless
Chromium (Playwright driving Debian's /usr/bin/chromium, as take.py does).

    python docs/screenshots/take_mlflow.py [EXPERIMENT] [OUT]   # default: c05-structural-probe-v4, here

(the README's first command, run once, makes that experiment and its arms view.)

The repository's mlflow.db is copied (SQLite's backup, consistent while a run writes to it) into a
temporary folder and served from there by `mlflow ui` on a free port, so nothing is written to it.
"""

from __future__ import annotations

import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from take import quantize  # the sibling script (run as a script, its folder is on sys.path)

from gates.record import ARMS_VIEW

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
ML_VIEW = "?workflowType=machine_learning"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _experiment_id(db: Path, experiment: str) -> str:
    con = sqlite3.connect(db)
    try:
        (exp,) = con.execute(
            "SELECT experiment_id FROM experiments WHERE name = ?", (experiment,)
        ).fetchone()
    finally:
        con.close()
    return str(exp)


def main(experiment: str, out: Path) -> list[Path]:
    from playwright.sync_api import sync_playwright

    out.mkdir(parents=True, exist_ok=True)
    written = []
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "mlflow.db"
        source = sqlite3.connect(f"file:{ROOT / 'mlflow.db'}?mode=ro", uri=True)
        target = sqlite3.connect(db)
        source.backup(target)
        source.close()
        target.close()
        exp = _experiment_id(db, experiment)
        port = _free_port()
        server = subprocess.Popen(
            ["mlflow", "ui", "--backend-store-uri", f"sqlite:///{db}", "--port", str(port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        base = f"http://127.0.0.1:{port}/"
        shots = {
            "mlflow-first-open.png": f"#/experiments/{exp}",
            "mlflow-runs.png": f"#/experiments/{exp}/runs{ML_VIEW}",
            # the arms view `gates run` writes on the experiment, as the dashboard links to it
            "mlflow-arms.png": f"#/experiments/{exp}/runs{ML_VIEW}&viewStateShareKey={ARMS_VIEW}"
            "&compareRunsMode=CHART",
        }
        try:
            for _ in range(120):  # until the server answers (its first start migrates the store)
                try:
                    urllib.request.urlopen(base, timeout=2)
                    break
                except OSError:
                    time.sleep(1)
            with sync_playwright() as p:
                browser = p.chromium.launch(
                    executable_path=CHROMIUM, headless=True, args=["--no-sandbox", "--disable-gpu"]
                )
                for name, path in shots.items():
                    page = browser.new_page(viewport={"width": 1280, "height": 860})  # fresh each
                    page.goto(base + path)
                    # the UI keeps polling (no network idle); its tables fill in within seconds
                    page.wait_for_timeout(8000)
                    page.screenshot(path=str(out / name))
                    written.append(out / name)
                    page.close()
                browser.close()
        finally:
            server.terminate()
            server.wait(timeout=30)
    quantize(written)
    return written


if __name__ == "__main__":
    name = sys.argv[1] if len(sys.argv) > 1 else "c05-structural-probe-v4"
    folder = Path(sys.argv[2]) if len(sys.argv) > 2 else Path(__file__).parent
    for path in main(name, folder):
        print(path)
