"""Screenshots of the dashboard for the docs: the board (all claims, and filtered) and a supported, a
refuted and an invalid claim, at 1280 px wide in headless Chromium (Playwright driving Debian's
/usr/bin/chromium, as tests/test_dashboard.py does).

    python docs/screenshots/take.py [OUT]      # OUT defaults to this folder

The repository's runs/, contracts/ and mlflow.db are copied into a temporary folder and served from
there by the dashboard's own server, so nothing is written into runs/ (the copy is read-only to the
dashboard anyway). The claims pictured: c05-structural-probe-v3 (supported, with controls and the
learning curves in the committed store), c05-structural-probe-hard (refuted: a refuted_if condition
holds), c05-baseline-control (invalid: its positive control fails).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
SHOTS = {
    "index.png": "",
    "index-filtered.png": "?q=subheap&verdict=supported&sort=date",
    "claim-supported.png": "contract/c05-structural-probe-v3",
    "claim-refuted.png": "contract/c05-structural-probe-hard",
    "claim-invalid.png": "contract/c05-baseline-control",
}


def main(out: Path) -> list[Path]:
    from playwright.sync_api import sync_playwright

    from gates.dashboard.server import make_server
    from gates.dashboard.site import Site

    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp)
        shutil.copytree(ROOT / "runs", copy / "runs")
        shutil.copytree(ROOT / "contracts", copy / "contracts")
        if (ROOT / "mlflow.db").is_file():
            shutil.copy(ROOT / "mlflow.db", copy / "mlflow.db")
        site = Site(
            copy / "runs", copy / "contracts", f"sqlite:///{copy / 'mlflow.db'}", "http://x"
        )
        server = make_server(site, "127.0.0.1", 0)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        base = f"http://127.0.0.1:{server.server_address[1]}/"
        written = []
        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(
                    executable_path=CHROMIUM, headless=True, args=["--no-sandbox", "--disable-gpu"]
                )
                page = browser.new_page(viewport={"width": 1280, "height": 900})
                for name, path in SHOTS.items():
                    page.goto(base + path)
                    page.screenshot(path=str(out / name), full_page=True)
                    written.append(out / name)
                browser.close()
        finally:
            server.shutdown()
            server.server_close()
    quantize(written)
    return written


def quantize(paths: list[Path]) -> None:
    """256 colours: a page of text and flat charts loses nothing visible (skipped without Pillow)."""
    try:
        from PIL import Image
    except ImportError:
        return
    for path in paths:
        Image.open(path).convert("RGB").quantize(256).save(path, optimize=True)


if __name__ == "__main__":
    for path in main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent):
        print(path)
