"""The dashboard shows what `gates status` and verdict.md say of a claim (issues #23, #24, #25): every
attempt on the record, the design a contract declares, its regime and the runs it shares, a regime left by
a superseded sibling, each condition's estimand, scale and adjustment, arms that did not run as designed
(failed and skipped runs), bars beyond the ceiling, tuning stopped at an edge, and rules the record
predates; on the live server and in `gates report --html`.

No training: the frozen claims (tests/fixtures) are copied into a tmp project, a few contracts and runs
are changed the way a researcher's work would change them (a crashed arm, a new attempt, a declared
design, a ceiling), and every record is written by the platform's own code (gates.ledger.write_evidence,
gates.record._writer, gates.execution._runner.rederive), so that `gates verify` holds on all of them."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import urllib.request
from datetime import datetime, timezone
from html import escape
from pathlib import Path

import pytest
import yaml

from tests.conftest import FIXTURE_CLAIMS, REDERIVED, copy_claims, frozen_evidence

REASON = "fixed the crash in <path_only>'s feature builder"  # markup: shown as text
BLIND = {
    "flat_address": "it never sees node values",
    "path_only": "it sees only the L/R path, never node values",
}
NO_CONVERGENCE = "full-batch probe runs of 300 steps & the curves flatten by step 150"
CEILING_WHY = "one pattern in ten is ambiguous at depth 6"
ERROR = "index 7 is out of bounds for axis 0 with size 7"
PAGES = (
    "c05-structural-probe",
    "c05-structural-probe-hard",
    "c05-structural-probe-v2",
    "c05-structural-probe-tuned",
    "c05-baseline-control",
    "spr096-topology",
    "c05-not-converged",
)


def h(text) -> str:
    """Text as the pages show it (HTML-escaped)."""
    return escape(str(text), quote=True)


# ---------------------------------------------------------------------------------- the project
def _edit_contract(root: Path, contract_id: str, change) -> None:
    """Change a copied contract (a new version of it, for the test) and re-point its evidence at it."""
    from gates.contract import load_contract
    from gates.record import write_evidence

    path = root / "contracts" / f"{contract_id}.yaml"
    data = yaml.safe_load(path.read_text())
    change(data)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    ev = json.loads((root / "runs" / contract_id / "evidence.json").read_text())
    ev["contract_sha256"] = load_contract(path).sha256
    write_evidence(root / "runs", ev)


def _edit_runs(root: Path, contract_id: str, change) -> None:
    from gates.record import write_evidence

    ev = json.loads((root / "runs" / contract_id / "evidence.json").read_text())
    change(ev["runs"])
    write_evidence(root / "runs", ev)


def _failed(run: dict) -> dict:
    """A run whose study raised, as gates.execution._runner records it."""
    run.update(
        status="failed",
        halt_reason="error",
        metrics={},
        first_signal=None,
        halt_detail=(
            f"study 'c05_probe' raised IndexError at models/c05_probe.py:88 in run(): {ERROR}\n"
            f'Traceback (most recent call last):\n  File "models/c05_probe.py", line 88\n'
            f"IndexError: {ERROR}"
        ),
        error={"type": "IndexError", "message": ERROR, "where": "models/c05_probe.py:88"},
    )
    return run


def build_project(folder: Path) -> Path:
    """Every frozen claim in a tmp project, brought to today's engine, with:

    * c05-structural-probe: a design (factor, blind arms, no_convergence) and two attempts: attempt 1
      invalid (its path_only arm crashed on every seed), attempt 2 recorded with a reason;
    * c05-structural-probe-hard: path_only failed on seed 0 and was skipped on the others
      (stop_rules.failures.max_consecutive 1): invalid, not run as designed; it supersedes
      c05-not-converged in another regime, which leaves that regime to its siblings;
    * c05-structural-probe-v2: a known ceiling below supported_if[0]'s bar: invalid, beyond the ceiling;
    * as frozen: tuning stopped at an edge (-tuned), a log-scale ratio (spr096-topology), a failing
      positive control (c05-baseline-control), runs shared across contracts (-v2, -baseline-control,
      -sequential-early)."""
    from gates.contract import load_contract
    from gates.entities import RunRecord
    from gates.execution import rederive
    from gates.execution._runner import skipped_record
    from gates.inference import judge_claim
    from gates.record import (
        attempt_field,
        plan_recording,
        read_evidence,
        record_entry,
        write_evidence,
    )
    from gates.record._derive import run_records, verdict_fields
    from gates.record._writer import backfill_index

    root = copy_claims(folder, rederive=False)
    runs_root = root / "runs"

    def design(d):
        d.update(factor=["features"], blind=BLIND, no_convergence=NO_CONVERGENCE)

    def hard(d):
        d["stop_rules"]["failures"] = {"max_consecutive": 1}
        d["supersedes"] = "c05-not-converged"

    def ceiling(d):
        d["decision"]["supported_if"][0]["ceiling"] = {"value": 0.9, "why": CEILING_WHY}

    _edit_contract(root, "c05-structural-probe", design)
    _edit_contract(root, "c05-structural-probe-hard", hard)
    _edit_contract(root, "c05-structural-probe-v2", ceiling)
    _edit_runs(
        root,
        "c05-structural-probe",
        lambda runs: [_failed(r) for r in runs if r["arm"] == "path_only"],
    )

    def crash_then_skip(runs):
        arm = [r for r in runs if r["arm"] == "path_only"]
        _failed(arm[0])
        for r in arm[1:]:
            seed = r["seed"]
            r.clear()
            r.update(
                skipped_record("path_only", seed, [RunRecord.model_validate(arm[0])]).as_dict()
            )

    _edit_runs(root, "c05-structural-probe-hard", crash_then_skip)
    backfill_index(runs_root)
    for contract_id in FIXTURE_CLAIMS:
        rederive(load_contract(root / "contracts" / f"{contract_id}.yaml"), runs_root, REDERIVED)

    # attempt 2 of the probe, its crash fixed: recorded with a reason, as `gates run --record --reason` does,
    # before its successor -v2 was recorded (after it, another attempt is refused: it would spend alpha
    # -v2 was judged on), so -v2 is set aside meanwhile, then re-derived under the family it now has
    successor = runs_root / "c05-structural-probe-v2"
    aside = folder / "aside"
    successor.rename(aside)
    loaded = load_contract(root / "contracts" / "c05-structural-probe.yaml")
    recording = plan_recording(loaded, runs_root, record=True, reason=REASON)
    loaded = loaded.replace(
        family=recording.family
    )  # judged at what attempt 1 left, as gates run does
    current = read_evidence(runs_root / "c05-structural-probe" / "evidence.json").as_dict()
    runs = frozen_evidence("c05-structural-probe")["runs"]
    records = run_records(runs)
    base = {
        k: v for k, v in current.items() if k not in ("not_run", "beyond_ceiling", "tuning_edges")
    }
    fresh = verdict_fields(loaded, {**base, "runs": runs}, judge_claim(loaded, records), records)
    fresh["attempt"] = attempt_field(recording)
    fresh["created_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    path = write_evidence(runs_root, fresh)
    record_entry(runs_root, path, "recorded", REASON)
    aside.rename(successor)
    rederive(
        load_contract(root / "contracts" / "c05-structural-probe-v2.yaml"), runs_root, REDERIVED
    )
    return root


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    return build_project(tmp_path_factory.mktemp("dash-claims"))


@pytest.fixture(scope="module")
def checks(project) -> dict:
    """gates.verify's checks (what `gates status --full` prints), by contract id."""
    from gates.verify import verify

    return {c.contract_id: c for c in verify(project / "runs", project / "contracts")}


def evidence(project: Path, contract_id: str) -> dict:
    return json.loads((project / "runs" / contract_id / "evidence.json").read_text())


@pytest.fixture(scope="module")
def served(project) -> dict[str, str]:
    """The index and the contract pages, fetched over HTTP from the dashboard server."""
    from gates.dashboard.server import make_server
    from gates.dashboard.site import Site

    site = Site(
        project / "runs",
        project / "contracts",
        f"sqlite:///{project / 'mlflow.db'}",
        "http://127.0.0.1:5000",
    )
    server = make_server(site, "127.0.0.1", 0)
    threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    ).start()
    base = f"http://127.0.0.1:{server.server_address[1]}/"
    try:
        pages = {}
        for name in ("index", *PAGES):
            with urllib.request.urlopen(
                base + ("" if name == "index" else f"contract/{name}"), timeout=60
            ) as r:
                assert r.status == 200
                pages[name] = r.read().decode()
        return pages
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def static(project, tmp_path_factory) -> dict[str, str]:
    """The same pages written by `gates report --html`."""
    out = tmp_path_factory.mktemp("dash-claims-report")
    done = subprocess.run(
        [sys.executable, "-m", "gates", "report", "--html", str(out)],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    pages = {"index": (out / "index.html").read_text()}
    pages.update({name: (out / "contract" / f"{name}.html").read_text() for name in PAGES})
    return pages


@pytest.fixture(params=["server", "static"])
def pages(request) -> dict[str, str]:
    return request.getfixturevalue("served" if request.param == "server" else "static")


def row(html: str, contract_id: str) -> str:
    return re.search(rf'<tr id="row-{re.escape(contract_id)}">.*?</tr>', html, re.S).group(0)


def section(html: str, heading: str) -> str:
    """From an <h2> to the next one."""
    m = re.search(rf"<h2>{re.escape(heading)}</h2>(.*?)(?=<h2>|</main>)", html, re.S)
    assert m, f"no section {heading!r}"
    return m.group(1)


# ---------------------------------------------------------------------------------- the records
def test_the_records_are_what_the_platform_writes(checks, project):
    """Every claim in the project verifies: the pages show records `gates verify` accepts."""
    assert {cid: c.status for cid, c in checks.items()} == {cid: "ok" for cid in FIXTURE_CLAIMS}
    probe = evidence(project, "c05-structural-probe")
    assert (
        probe["attempt"]["number"] == 2 and probe["attempt"]["earlier"][0]["verdict"] == "invalid"
    )
    assert checks["c05-structural-probe"].attempts == 2
    hard = evidence(project, "c05-structural-probe-hard")
    assert hard["verdict"] == "invalid" and [x["arm"] for x in hard["not_run"]] == ["path_only"]
    assert sorted(r["status"] for r in hard["runs"] if r["arm"] == "path_only") == [
        "failed",
        "skipped",
        "skipped",
    ]
    assert (
        evidence(project, "c05-structural-probe-v2")["beyond_ceiling"][0]["condition"]
        == "supported_if[0]"
    )
    assert evidence(project, "c05-structural-probe-tuned")["tuning_edges"]
    assert (
        checks["c05-baseline-control"].regime_left and checks["c05-structural-probe-v2"].shared_runs
    )


# ---------------------------------------------------------------------------------- 1. attempts
def test_every_attempt_is_on_the_index_and_the_contract_page(pages, checks, project):
    from gates.cli._printers import claim_notes

    c = checks["c05-structural-probe"]
    note = f"attempt 2; earlier: {'; '.join(c.earlier)}"
    assert note in claim_notes(c, str, short=True)  # the line `gates status` prints
    assert c.earlier[0].startswith("attempt 1 invalid (")
    assert h(note) in row(pages["index"], "c05-structural-probe")
    assert "attempt 1;" not in pages["index"] and "earlier:" not in row(
        pages["index"], "c05-structural-probe-hard"
    )
    page = pages["c05-structural-probe"]
    assert h(c.earlier[0]) in page  # the claims history's line
    # the evidence's own attempt record, as verdict.md's "Attempt 2 at this claim ..." section
    attempts = section(page, "Attempts")
    assert f"Attempt 2 at this claim, recorded because: {h(REASON)}; earlier:" in attempts
    earlier = evidence(project, "c05-structural-probe")["attempt"]["earlier"][0]
    assert (
        'attempt 1: <span class="v v-invalid">invalid</span>' in attempts
        and h(earlier["recorded"]) in attempts
    )
    assert earlier["why"] and all(h(w) in attempts for w in earlier["why"])
    assert any("did not run as designed" in w for w in earlier["why"])
    assert "<path_only>" not in page  # the reason is text


# ---------------------------------------------------------------------------------- 2. design, regime, siblings
def test_the_declared_design_and_regime_are_beside_the_verdict(pages, project):
    from gates.record import describe_regime

    design = section(pages["c05-structural-probe"], "Design")
    assert "factor under test: <code>features</code>" in design
    for arm, why in BLIND.items():
        assert f"<code>{arm}</code> fails by construction: {h(why)}" in design
    assert f"runs not judged for convergence: {h(NO_CONVERGENCE)}" in design
    regime = evidence(project, "c05-structural-probe")["regime"]
    assert f"regime: {h(describe_regime(regime))}" in design
    # the Design section comes before the reasons, as in verdict.md
    page = pages["c05-structural-probe"]
    assert (
        page.index("<h2>Design</h2>")
        < page.index("<h2>Why</h2>")
        < page.index("<h2>Conditions</h2>")
    )
    # a contract that declares nothing shows its regime only
    hard = section(pages["c05-structural-probe-hard"], "Design")
    assert "regime: pattern=[0.9,-0.4,0.7]" in hard and "fails by construction" not in hard


def test_shared_runs_and_a_left_regime_are_flagged(pages, checks):
    from gates.record import describe_shared

    for cid in ("c05-structural-probe-v2", "c05-baseline-control"):
        shared = checks[cid].shared_runs
        cells = row(pages["index"], cid)
        assert f"shares runs with {len(shared)} other contract" in cells
        for other, runs in shared.items():
            assert f">{other}</a> ({len(runs)})" in cells
    v2 = section(pages["c05-structural-probe-v2"], "Design")
    assert h(describe_shared(checks["c05-structural-probe-v2"].shared_runs)) in v2

    left = {cid for cid, c in checks.items() if c.regime_left}
    assert left == {
        "c05-baseline-control",
        "c05-sequential-early",
        "c05-structural-probe-tuned",
        "c05-structural-probe-v2",
    }
    for cid in left:
        cells = row(pages["index"], cid)
        assert "regime left: sibling" in cells and ">c05-not-converged</a> superseded by" in cells
        assert f'title="{h(checks[cid].regime_left.note)}"' in cells
    for cid in set(checks) - left:
        assert "regime left" not in row(pages["index"], cid)
    assert (
        f"Regime left: {h(checks['c05-baseline-control'].regime_left.note)}"
        in pages["c05-baseline-control"]
    )
    assert "superseded by" in row(pages["index"], "c05-not-converged")


# ---------------------------------------------------------------------------------- 3. conditions
def test_each_condition_states_its_estimand_scale_and_adjustment(pages, project):
    for cid in ("c05-structural-probe", "spr096-topology", "c05-baseline-control"):
        ev, page = evidence(project, cid), pages[cid]
        assert ev["settings"]["correction"] == "iut+holm"
        for c in ev["conditions"] + ev.get("controls", []):
            assert c["estimand"] and c["adjustment"]
            assert f"estimates: {h(c['estimand'])}" in page and h(c["adjustment"]) in page
        families = section(page, "Conditions")
        assert (
            "intersection-union test" in families and "Holm-corrected at &alpha; = 0.05" in families
        )
        assert "Holm-corrected p-values across all" not in page
    log = section(pages["spr096-topology"], "Conditions")
    assert [c["scale"] for c in evidence(project, "spr096-topology")["conditions"]] == [
        "log",
        "log",
    ]
    assert (
        log.count('<span class="small scale">log scale</span>') == 4
    )  # margin and interval of each
    assert "exp(margin) is the factor by which the bar is cleared" in log
    assert "log scale" not in section(pages["c05-structural-probe"], "Conditions")
    controls = section(pages["c05-baseline-control"], "Controls")
    assert (
        "positive control" in controls
        and "intersection-union" in controls
        and 'class="m m-invalidates"' in controls  # a failing control: coloured as invalidating
    )


def test_holm_evidence_keeps_the_old_wording(project):
    """Evidence recorded under "holm" (engine 2) still reads "Holm across all conditions"."""
    from gates.dashboard import render
    from gates.dashboard.site import Site
    from gates.record import Evidence

    site = Site(
        project / "runs", project / "contracts", f"sqlite:///{project / 'mlflow.db'}", "http://x"
    )
    view = site.claims.view("c05-structural-probe")
    stored = view.evidence.as_dict()
    view.evidence = Evidence.of(
        {
            **stored,
            "settings": {**stored["settings"], "correction": "holm"},
            "conditions": [
                {k: v for k, v in c.items() if k not in ("estimand", "scale", "adjustment")}
                for c in stored["conditions"]
            ],
        }
    )
    html = render.contract_page(view, render.SERVER, "http://x", "")
    assert (
        "Holm-corrected p-values across all 8 conditions" in html
        and "intersection-union" not in html
    )
    assert "estimates:" not in html and "adjusted: -</span>" in html


# ---------------------------------------------------------------------------------- 4. verdict-level
def test_an_arm_not_run_as_designed_makes_the_page_say_invalid(pages, project):
    ev = evidence(project, "c05-structural-probe-hard")
    assert "not run as designed: path_only" in row(pages["index"], "c05-structural-probe-hard")
    assert "not run as designed" not in row(pages["index"], "c05-structural-probe")
    page = pages["c05-structural-probe-hard"]
    part = section(page, "Did not run as designed")
    x = ev["not_run"][0]
    assert "0 of 3 runs completed (1 failed, 2 not run after its arm kept failing)" in x["text"]
    assert h(x["text"]) in part and h(x["settle"]) in part
    assert f"models/c05_probe.py:88: IndexError: {ERROR}" in part


def test_skipped_runs_have_no_mlflow_link_and_show_their_error(pages, project):
    ev = evidence(project, "c05-structural-probe-hard")
    runs = section(pages["c05-structural-probe-hard"], "Runs: final metrics per arm and seed")
    skipped = [r for r in ev["runs"] if r["status"] == "skipped"]
    assert len(skipped) == 2 and all(r["mlflow_run_id"] is None for r in skipped)
    linked = [r for r in ev["runs"] if r.get("mlflow_run_id")]
    assert runs.count('href="http://127.0.0.1:5000/#/experiments/') == len(linked) == 10
    assert "runs/None" not in runs and "None" not in runs
    table = re.search(r'<table class="runs">.*?</table>', runs, re.S).group(0)
    rows = re.findall(r"<tr><td>path_only</td>.*?</tr>", table, re.S)
    assert len(rows) == 3
    failed = next(r for r in rows if "s-failed" in r)
    assert f'<code class="mono error">models/c05_probe.py:88: IndexError: {ERROR}</code>' in failed
    assert "whole detail" in failed and "Traceback (most recent call last):" in failed
    for r in (r for r in rows if "s-skipped" in r):
        assert h(skipped[0]["halt_detail"]) in r and '<span class="small">none</span>' in r
    assert "2 runs were skipped: not run after its arm kept failing" in runs
    lost = section(pages["c05-structural-probe-hard"], "Lost values")
    assert (
        "path_only.test_acc seed 1: skipped: failures" in lost
        and "path_only.test_acc seed 0: failed: error" in lost
    )


def test_a_bar_beyond_the_ceiling_and_tuning_at_an_edge(pages, project):
    ev = evidence(project, "c05-structural-probe-v2")
    assert ev["verdict"] == "invalid"
    assert "bar beyond the ceiling: supported_if[0]" in row(
        pages["index"], "c05-structural-probe-v2"
    )
    part = section(pages["c05-structural-probe-v2"], "Bars beyond the ceiling")
    assert "the best possible arm reaches 0.9" in part and h(CEILING_WHY) in part
    assert h(ev["beyond_ceiling"][0]["settle"]) in part

    edges = evidence(project, "c05-structural-probe-tuned")["tuning_edges"]
    cells = row(pages["index"], "c05-structural-probe-tuned")
    assert "tuning stopped at an edge: flat_address, path_only, subheap_kernel and 1 more" in cells
    why = section(pages["c05-structural-probe-tuned"], "Why")
    assert "Tuning stopped at the edge of its search" in why
    for arm, text in edges.items():
        assert f"<code>{arm}</code>: {h(text)}" in why


# ---------------------------------------------------------------------------------- 5. rule flags among the rest
def test_rule_flags_stay_a_count_on_the_index_and_a_list_on_the_page(pages, checks):
    for cid in ("c05-structural-probe-v2", "c05-structural-probe", "c05-baseline-control"):
        flags = checks[cid].rule_flags
        assert flags
        cells = row(pages["index"], cid)
        assert f"recorded under older rules ({len(flags)})" in cells
        assert not any(h(f) in cells for f in flags)  # the long texts are on the contract page
        page = pages[cid]
        assert all(h(f) in page for f in flags)
    # a row with many flags stays a handful of short lines
    busy = row(pages["index"], "c05-structural-probe-v2")
    assert busy.count('<div class="small">') <= 7
    assert len(re.sub(r"<[^>]+>", "", busy)) < 1200


def test_every_page_is_escaped_and_script_free(pages):
    for name, html in pages.items():
        assert "<script" not in html.lower(), name
        assert "<path_only>" not in html, name


# ---------------------------------------------------------------------------------- learning curves
def test_runs_never_started_are_not_looked_up_in_mlflow(project):
    """A skipped run has no MLflow run: the curves note says it was never started, and no history is read
    for it."""
    from gates.dashboard.site import Site

    asked = []

    class Client:
        def get_metric_history(self, run_id, metric):
            assert run_id, "a run without an MLflow run id was looked up"
            asked.append(run_id)
            return []

    site = Site(
        project / "runs", project / "contracts", f"sqlite:///{project / 'mlflow.db'}", "http://x"
    )
    site.store.client = lambda: (Client(), None)
    html = site.contract("c05-structural-probe-hard")
    assert (
        asked
        and "2 of 12 runs have no MLflow run (never started: path_only/seed 1 (skipped), path_only/seed 2"
        in html
    )
    assert "10 of 12 runs have no metric history" in html


def test_fields_of_an_unexpected_shape_never_reach_the_page(project):
    """attempt, design, regime, not_run, beyond_ceiling, tuning_edges and a run's error are typed by the
    evidence records: another shape makes the evidence unreadable (one lost claim, its page without
    evidence), so the page renders only records of the shapes it reads."""
    from gates.dashboard import render
    from gates.dashboard.data import _design_flags
    from gates.dashboard.site import Site
    from gates.record import Evidence

    site = Site(
        project / "runs", project / "contracts", f"sqlite:///{project / 'mlflow.db'}", "http://x"
    )
    view = site.claims.view("c05-structural-probe-hard")
    stored = view.evidence.as_dict()
    with pytest.raises(ValueError, match="malformed evidence: tuning_edges.x"):
        Evidence.of({**stored, "tuning_edges": {"x": 1}})
    for value in (5, "text", ["a"]):
        for key in ("attempt", "design", "regime", "not_run", "beyond_ceiling", "tuning_edges"):
            with pytest.raises(ValueError, match=f"malformed evidence: {key}"):
                Evidence.of({**stored, key: value})
        runs = [{**r, "error": value} for r in stored["runs"]]
        with pytest.raises(ValueError, match="malformed evidence: runs.0.error"):
            Evidence.of({**stored, "runs": runs})
    view.evidence = Evidence.of(
        {
            **stored,
            "attempt": {
                "number": 2,
                "earlier": [{"number": 1, "verdict": "refuted", "why": ["one"]}],
            },
        }
    )
    html = render.contract_page(view, render.SERVER, "http://x", "")
    assert "<li>one</li>" in html and "<h2>Runs: final metrics per arm and seed</h2>" in html
    assert _design_flags(view.evidence)["not_run"] == ["path_only"]
