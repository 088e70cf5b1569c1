"""The claims dashboard, for real: two small C05 contracts run through the runner into a temp MLflow
store (one supported, one refuted by futility halts, its claim full of markup), one pending contract;
`gates dashboard` started as a subprocess and read over HTTP and in headless Chromium (Playwright
driving Debian's /usr/bin/chromium); `gates report --html` read the same way from files."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import small_c05

pytestmark = pytest.mark.usefixtures("one_thread")

MARKUP = '<script>alert("x")</script> halts & <b>bold</b> claims'
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def markup_contract() -> dict:
    """Small C05 whose futility rule halts the two address arms at step 40: refuted, with halts."""
    data = small_c05(id="markup-claim", claim=MARKUP)
    rule = data["stop_rules"]["futility"][0]
    rule.update(arms=["flat_address", "path_only"], min_rel_improvement=1.0)
    return data


@pytest.fixture(scope="module")
def project(make_project):
    """c05-small and markup-claim recorded into the project's mlflow.db as `gates run` records by default;
    c05-pending not run."""
    return make_project(
        small_c05(),
        markup_contract(),
        small_c05(id="c05-pending"),
        record=("c05-small", "markup-claim"),
        tracking_uri="sqlite:///mlflow.db",
        name="dash-project",
    )


def start_dashboard(cwd: Path, *args: str):
    """`gates dashboard --port 0` in `cwd`; (process, base URL) once it listens."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "gates", "dashboard", "--port", "0", *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    line = proc.stdout.readline()
    match = re.search(r"serving (http://127\.0\.0\.1:\d+/)", line)
    if not match:
        proc.kill()
        pytest.fail(f"gates dashboard did not start: {line!r}")
    return proc, match.group(1)


@pytest.fixture(scope="module")
def server(project):
    proc, url = start_dashboard(project)
    yield url
    proc.terminate()
    proc.wait(timeout=10)


def fetch(url: str, method: str = "GET"):
    req = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, dict(r.headers), r.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read().decode()


def row(html: str, contract_id: str) -> str:
    return re.search(rf'<tr id="row-{contract_id}">.*?</tr>', html, re.S).group(0)


def conditions_table(html: str) -> str:
    """The decision's conditions (controls have a table of their own)."""
    return re.search(r'<table class="conditions">.*?</table>', html, re.S).group(0)


# ---------------------------------------------------------------------------------- HTTP
def test_index_lists_every_contract_with_verdict_and_hash_status(server):
    status, headers, html = fetch(server)
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    assert (
        "script-src" not in headers["Content-Security-Policy"]
        and "default-src 'none'" in headers["Content-Security-Policy"]
    )
    assert "v-supported" in row(html, "c05-small") and ">ok<" in row(html, "c05-small")
    assert "v-refuted" in row(html, "markup-claim")
    pending = row(html, "c05-pending")
    assert "v-pending" in pending and "evidence missing" in pending
    assert 'href="/contract/c05-small"' in html


def test_claim_markup_is_shown_as_text_never_as_markup(server):
    for page in ("", "contract/markup-claim"):
        _, _, html = fetch(server + page)
        assert (
            "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; halts &amp; &lt;b&gt;bold&lt;/b&gt;"
            in html
        )
        assert "<script" not in html and "<b>" not in html


def test_contract_view_draws_conditions_curves_stop_rules_and_halts(project, server):
    import json

    ev = json.loads((project / "runs" / "markup-claim" / "evidence.json").read_text())
    status, _, html = fetch(server + "contract/markup-claim")
    assert status == 200
    estimated = [c for c in ev["conditions"] if c["estimate"] is not None]
    assert (
        len(ev["conditions"]) == 8 and len(estimated) == 4
    )  # the halted arms have no completed seed
    table = conditions_table(html)
    # each supported_if condition shares its row with its refuted_if mirror: 4 rows, 2 on halted arms
    assert table.count("data-meaning=") == 4 and table.count('class="small mirror"') == 4
    assert table.count('<svg class="condition-interval"') == 2 and table.count("no estimate") == 2
    controls = ev.get("controls", [])  # the subheap arms' positive controls: not halted, estimated
    assert html.count('<svg class="condition-interval"') == 2 + sum(
        c["estimate"] is not None for c in controls
    )
    # a chart per metric the runs logged, the decision's (test_acc, gate 5) group first; train and
    # validation curves among them
    charts = re.findall(r'aria-label="learning curves of ([^"]+)"', html)
    assert {"test_acc", "train_acc", "val_acc", "train_loss", "val_loss"} <= set(charts)
    assert charts.index("test_acc") < charts.index("train_loss")
    assert "futility look at step 40" in html and "futility bar: worse than 0.5" in html
    halted = [r for r in ev["runs"] if r["status"] == "halted"]
    assert {r["arm"] for r in halted} == {"flat_address", "path_only"}
    for r in halted:
        assert f"{r['arm']} seed {r['seed']} halted at step 40" in html
    # the bars drawn come from the evidence: one per mirrored pair; gate 5 where its metric is
    assert "supported_if[0] + refuted_if[0]: subheap_kernel.test_loss &lt;= 0.5" in html
    assert html.count('<g class="gate5">') == 1
    assert "gate 5: subheap_kernel.test_acc &gt;= 0.95 by step 60" in html
    # which test each condition got and why; the halted arms' values listed as lost; gate 3 measured
    assert "one-sample t" in html and "roughly lognormal" in html
    assert "<h2>Lost values</h2>" in html and "flat_address.test_loss seed 0: halted" in html
    assert "<h2>Predicted ablation (gate 3)</h2>" in html
    exp = ev["mlflow"]["experiment_id"]
    for r in ev["runs"]:
        url = f"http://127.0.0.1:5000/#/experiments/{exp}/runs/{r['mlflow_run_id']}"
        assert f'href="{url}?workflowType=machine_learning"' in html  # the runs' view, not GenAI
    # the experiment links to the arms view `gates run` wrote on it (docs/mlflow.md)
    arms = (
        "?workflowType=machine_learning&amp;viewStateShareKey=gates-arms&amp;compareRunsMode=CHART"
    )
    assert f'href="http://127.0.0.1:5000/#/experiments/{exp}/runs{arms}"' in html
    assert ev["contract_sha256"] in html and ev["git_commit"] in html and ev["code_sha256"] in html
    assert "no metric history" not in html and "not found" not in html


def test_read_only_and_unknown_pages(server):
    for method in ("POST", "PUT", "DELETE", "PATCH", "BREW"):
        status, headers, _ = fetch(server, method)
        assert status == 405 and headers["Allow"] == "GET, HEAD"
    status, headers, body = fetch(server + "contract/c05-small", "HEAD")
    assert status == 200 and body == "" and int(headers["Content-Length"]) > 1000
    assert fetch(server + "contract/no-such-claim")[0] == 404
    assert fetch(server + "contract/..%2f..%2fetc%2fpasswd")[0] == 404
    assert fetch(server + "nothing-here")[0] == 404
    status, _, html = fetch(server + "contract/c05-pending")
    assert status == 200 and "No evidence yet" in html


def test_without_mlflow_store_the_evidence_shows_without_curves(project, tmp_path):
    """A fresh clone has evidence but no mlflow.db: the page says so, and nothing creates the store."""
    from gates.dashboard.site import Site

    clone = tmp_path / "clone"
    shutil.copytree(project / "contracts", clone / "contracts")
    shutil.copytree(project / "runs", clone / "runs")
    site = Site(
        clone / "runs",
        clone / "contracts",
        f"sqlite:///{clone / 'mlflow.db'}",
        "http://127.0.0.1:5000",
    )
    html = site.contract("c05-small")
    assert f"MLflow store sqlite:///{clone / 'mlflow.db'} not found" in html
    assert (
        '<svg class="learning-curve"' not in html
        and conditions_table(html).count('<svg class="condition-interval"') == 4  # mirrors merged
    )
    assert "v-supported" in row(site.index(), "c05-small")
    assert not (clone / "mlflow.db").exists()


def test_edited_contract_is_flagged(project, tmp_path):
    from gates.dashboard.site import Site

    clone = tmp_path / "clone"
    shutil.copytree(project, clone)
    path = clone / "contracts" / "c05-small.yaml"
    path.write_text(path.read_text().replace("claim: ", "claim: EDITED ", 1))
    cwd = os.getcwd()
    os.chdir(clone)
    try:
        site = Site(
            Path("runs"), Path("contracts"), "sqlite:///mlflow.db", "http://mlflow.example:5000"
        )
        html = site.index()
        contract = site.contract("c05-small")
    finally:
        os.chdir(cwd)
    assert "edited after evidence" in row(html, "c05-small") and "LOST" in row(html, "c05-small")
    assert "stop rules (futility, convergence) are not drawn" in contract
    assert '<svg class="learning-curve"' in contract  # the curves still come from the store
    assert "http://mlflow.example:5000/#/experiments/" in contract


@pytest.fixture(scope="module")
def static_report(project, tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    done = subprocess.run(
        [sys.executable, "-m", "gates", "report", "--html", str(out)],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return out


def test_static_report_has_every_page_with_relative_links(static_report):
    out = static_report
    index = (out / "index.html").read_text()
    for cid in ("c05-small", "markup-claim", "c05-pending"):
        assert f'href="contract/{cid}.html"' in index
        page = (out / "contract" / f"{cid}.html").read_text()
        assert 'href="../index.html"' in page
    assert "&lt;script&gt;" in index and "<script" not in index
    charts = re.findall(
        r'aria-label="learning curves of ([^"]+)"',
        (out / "contract" / "c05-small.html").read_text(),
    )
    assert charts[0] == "train_acc" and {"test_acc", "train_loss", "val_loss"} <= set(charts)


# ---------------------------------------------------------------------------------- real browser
@pytest.fixture(scope="module")
def browser():
    missing = None
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing = "playwright is not installed (pip install -e '.[dev]')"
    if missing is None and not os.path.exists(CHROMIUM):
        missing = f"{CHROMIUM} is missing (apt-get install chromium chromium-driver)"
    if missing:
        if os.environ.get("GATES_REQUIRE_SERVICES"):
            pytest.fail(f"GATES_REQUIRE_SERVICES is set but {missing}")
        pytest.skip(missing)
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield b
        b.close()


def open_page(browser):
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    dialogs = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    return page, dialogs


def check_in_browser(page, dialogs, index_url: str, shots: Path, name: str):
    page.goto(index_url)
    assert page.locator("#row-c05-small .verdict .v").inner_text().strip() == "supported"
    assert page.locator("#row-markup-claim .verdict .v").inner_text().strip() == "refuted"
    assert page.locator("#row-c05-pending .verdict .v").inner_text().strip() == "pending"
    assert MARKUP in page.locator("#row-markup-claim").inner_text()  # shown as text
    page.screenshot(path=str(shots / f"{name}-index.png"), full_page=True)
    page.click("#row-markup-claim a")
    page.wait_for_load_state()
    assert "markup-claim" in page.url
    assert page.locator("h1").inner_text().startswith("markup-claim")
    # 8 conditions in 4 rows (each with its mirror), 2 of them on halted arms
    assert page.locator("table.conditions svg.condition-interval").count() == 2
    curves = page.locator("svg.learning-curve")
    assert curves.count() >= 5 and curves.first.bounding_box()["width"] > 500
    loss = page.locator('svg.learning-curve[aria-label="learning curves of train_loss"]')
    # one mean per arm and its band across the 3 seeds, arms overlaid; 6 halts and their legend
    arms = ["flat_address", "path_only", "subheap_kernel", "path_subheap_kernel"]
    assert sorted(
        loss.locator("path.mean").evaluate_all("ps => ps.map(p => p.dataset.arm)")
    ) == sorted(arms)
    assert loss.locator("path.band").count() == 4
    assert loss.locator("path.halt").count() == 6 + 1
    assert "halted run" in loss.text_content() and "gate 5" not in loss.text_content()
    shot = shots / f"{name}-contract.png"
    page.screenshot(path=str(shot), full_page=True)
    print(f"screenshot: {shot}")
    assert dialogs == []  # no script ran: the claim's <script> is text


def test_dashboard_in_chromium(browser, server, tmp_path):
    page, dialogs = open_page(browser)
    check_in_browser(page, dialogs, server, tmp_path, "dashboard")


def test_static_report_in_chromium(browser, static_report, tmp_path):
    page, dialogs = open_page(browser)
    check_in_browser(page, dialogs, (static_report / "index.html").as_uri(), tmp_path, "report")
    assert page.url.startswith("file://") and page.url.endswith("/contract/markup-claim.html")


def test_dashboard_serves_concurrent_readers(server):
    """ThreadingHTTPServer with one MLflow reader at a time: parallel page loads all succeed."""
    from concurrent.futures import ThreadPoolExecutor

    pages = ["", "contract/c05-small", "contract/markup-claim", "contract/c05-pending"] * 3
    started = time.perf_counter()
    with ThreadPoolExecutor(6) as pool:
        statuses = list(pool.map(lambda p: fetch(server + p)[0], pages))
    assert statuses == [200] * len(pages), statuses
    assert time.perf_counter() - started < 60


def test_a_busy_port_is_a_one_line_user_error(tmp_path):
    import socket

    from gates.dashboard.server import make_server
    from gates.dashboard.site import Site
    from gates.errors import UserError

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(
            UserError, match=rf"--port: cannot listen on 127\.0\.0\.1:{port} .*expected a free port"
        ):
            make_server(
                Site(tmp_path, tmp_path, "sqlite:///none.db", "http://x"), "127.0.0.1", port
            )


def test_report_into_an_unwritable_folder_is_a_one_line_error(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "gates",
            "report",
            "--html",
            str(blocker / "report"),
            "--runs-dir",
            str(tmp_path / "runs"),
            "--contracts-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert (
        done.stderr.startswith("error: --html: cannot write the report into")
        and "Traceback" not in done.stderr
    )
    assert len(done.stderr.strip().splitlines()) == 1


def test_dashboard_port_out_of_range_is_a_one_line_error(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "gates",
            "dashboard",
            "--port",
            "99999",
            "--runs-dir",
            str(tmp_path),
            "--contracts-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.startswith("error: --port: cannot listen on 127.0.0.1:99999")
