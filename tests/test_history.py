"""The claims history (runs/INDEX.jsonl): backfill, the hash chain, every kind of quiet rewrite named by
`gates verify`, withdrawals, a kill between evidence and index, supersedes, concurrent appends."""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gates.contract import load_contract
from gates.record import GENESIS, INDEX, check_history, latest_entries, record_entry, sha256_file
from gates.record._index import line_sha256, read_index
from gates.record._writer import backfill_index, withdraw_claim
from gates.verify import verify
from tests.conftest import FIXTURE_CLAIMS, FIXTURE_RUNS, small_c05, write_contract
from tests.helpers import gates, run_contract

pytestmark = pytest.mark.usefixtures("one_thread")


def copy_evidence(tmp_path: Path, ids: list[str] | None = None) -> Path:
    """The frozen committed claims' evidence (tests/fixtures/claims, the recorded bytes; no index) in
    tmp_path/runs."""
    runs = tmp_path / "runs"
    for evidence in sorted(FIXTURE_RUNS.glob("*/evidence.json")):
        if ids is None or evidence.parent.name in ids:
            (runs / evidence.parent.name).mkdir(parents=True)
            shutil.copy(evidence, runs / evidence.parent.name / "evidence.json")
    return runs


def lines(runs: Path) -> list[bytes]:
    return (runs / INDEX).read_bytes().splitlines(keepends=True)


def ids_of(runs: Path) -> list[str]:
    return [json.loads(line)["contract_id"] for line in lines(runs)]


# ---------------------------------------------------------------------------------- the index alone
def test_backfill_chains_every_claim_once(tmp_path):
    runs = copy_evidence(tmp_path)
    added = backfill_index(runs)
    n = len(list(runs.glob("*/evidence.json")))
    assert len(added) == n == len(FIXTURE_CLAIMS) >= 7  # the quiet rewrites below need 7
    assert backfill_index(runs) == []  # idempotent
    entries = read_index(runs)
    assert [e.kind for e in entries] == ["backfilled"] * n
    assert entries[0].prev == GENESIS
    raw = lines(runs)
    for before, entry in zip(raw, entries[1:]):
        assert entry.prev == line_sha256(before.rstrip(b"\n"))
    for entry in entries:
        evidence = runs / entry.contract_id / "evidence.json"
        assert entry.evidence_sha256 == sha256_file(evidence)
        assert entry.verdict == json.loads(evidence.read_text())["verdict"]
        recorded_engine = json.loads(evidence.read_text()).get("engine_version")
        assert entry.engine_version == (
            recorded_engine or "1"
        )  # "1": from before engines were numbered
    assert check_history(runs, {}) == {}


def test_every_quiet_rewrite_is_named(tmp_path):
    runs = copy_evidence(tmp_path)
    backfill_index(runs)
    index = runs / INDEX
    original = index.read_bytes()
    ids = ids_of(runs)

    # an entry edited: the next line's prev no longer matches; the edited verdict disagrees with its evidence
    raw = lines(runs)
    edited = json.loads(raw[5])
    edited["verdict"] = "supported" if edited["verdict"] != "supported" else "refuted"
    raw[5] = json.dumps(edited, separators=(", ", ": ")).encode() + b"\n"
    index.write_bytes(b"".join(raw))
    problems = check_history(runs, {})
    assert any("chain broken at line 7" in p for p in problems[ids[6]])
    assert any("chain broken at line 7" in p for p in problems[ids[5]])
    assert any("the entry was edited" in p for p in problems[ids[5]])

    # an entry removed: the chain breaks where it was, and its evidence has no entry any more
    raw = original.splitlines(keepends=True)
    index.write_bytes(b"".join(raw[:2] + raw[3:]))
    problems = check_history(runs, {})
    assert any("chain broken at line 3" in p for p in problems[ids[3]])
    assert any("has no entry" in p for p in problems[ids[2]])

    # entries reordered
    raw = original.splitlines(keepends=True)
    raw[1], raw[2] = raw[2], raw[1]
    index.write_bytes(b"".join(raw))
    problems = check_history(runs, {})
    assert any("chain broken at line 2" in p for p in problems[ids[2]])

    # the last entry edited: no line follows it, but its evidence no longer matches it
    raw = original.splitlines(keepends=True)
    last = json.loads(raw[-1])
    last["evidence_sha256"] = "0" * 64
    raw[-1] = json.dumps(last, separators=(", ", ": ")).encode() + b"\n"
    index.write_bytes(b"".join(raw))
    assert any("changed without an index entry" in p for p in check_history(runs, {})[ids[-1]])
    index.write_bytes(original)
    assert check_history(runs, {}) == {}

    # evidence changed without an entry, then an entry that says why
    evidence = runs / ids[0] / "evidence.json"
    evidence.write_text(evidence.read_text() + " ")
    (problem,) = check_history(runs, {})[ids[0]]
    assert "changed without an index entry" in problem and ids[0] in problem
    record_entry(runs, evidence, "rederived", reason="re-derived by verdict engine 2")
    assert check_history(runs, {}) == {}
    assert latest_entries(runs)[ids[0]].reason == "re-derived by verdict engine 2"

    # evidence gone without a withdrawal; then withdrawn: nothing to say
    evidence.unlink()
    (problem,) = check_history(runs, {})[ids[0]]
    assert "disappeared without a withdrawal" in problem and "contract is gone too" in problem
    withdraw_claim(runs, ids[0], "the corpus it was measured on was wrong")
    assert check_history(runs, {}) == {}
    assert latest_entries(runs)[ids[0]].evidence_sha256 is None

    # evidence that was never indexed
    (runs / "new-claim").mkdir()
    shutil.copy(runs / ids[1] / "evidence.json", runs / "new-claim" / "evidence.json")
    assert "has no entry" in check_history(runs, {})["new-claim"][0]


def test_torn_append_is_named_and_the_next_append_repairs_it(tmp_path):
    runs = copy_evidence(tmp_path, ["c05-structural-probe", "twin-tree-toy"])
    backfill_index(runs)
    with open(runs / INDEX, "ab") as f:
        f.write(b'{"kind": "recorded", "contract_id": "c05-str')  # power lost mid-append
    problems = check_history(runs, {})
    assert all(any("is not a JSON object" in p for p in found) for found in problems.values())
    with pytest.raises(ValueError, match="line 3 is not a JSON object"):
        read_index(runs)
    entry = record_entry(runs, runs / "twin-tree-toy" / "evidence.json", "rederived", "test")
    assert len(read_index(runs)) == 3 and entry.prev == line_sha256(lines(runs)[1].rstrip(b"\n"))
    assert check_history(runs, {}) == {}


def _append_many(runs: str, evidence: str, n: int) -> None:
    for i in range(n):
        record_entry(Path(runs), Path(evidence), "rederived", f"writer {os.getpid()} entry {i}")


def test_concurrent_appends_keep_one_chain(tmp_path):
    runs = copy_evidence(tmp_path, ["c05-structural-probe"])
    evidence = runs / "c05-structural-probe" / "evidence.json"
    ctx = multiprocessing.get_context("fork")
    writers = [
        ctx.Process(target=_append_many, args=(str(runs), str(evidence), 25)) for _ in range(4)
    ]
    for w in writers:
        w.start()
    for w in writers:
        w.join()
    assert [w.exitcode for w in writers] == [0, 0, 0, 0]
    assert len(read_index(runs)) == 100
    assert check_history(runs, {}) == {}


def test_record_refuses_unknown_kinds_and_missing_evidence(tmp_path):
    runs = copy_evidence(tmp_path, ["c05-structural-probe"])
    with pytest.raises(ValueError, match="unknown index entry kind"):
        record_entry(runs, runs / "c05-structural-probe" / "evidence.json", "edited")
    with pytest.raises(ValueError, match="only a withdrawal may name missing evidence"):
        record_entry(runs, runs / "nothing" / "evidence.json", "recorded")


# ---------------------------------------------------------------------------------- with gates run
@pytest.fixture(scope="module")
def recorded(make_project):
    """One small C05 contract run into a temp project (its evidence indexed by the runner)."""
    root = make_project(small_c05())
    return root, f"sqlite:///{root / 'mlflow.db'}"


@pytest.fixture
def project(recorded, make_project):
    """A copy of the recorded project (contracts/, runs/, mlflow.db) to tamper with."""
    copy = make_project(copy_of=recorded[0])
    return copy, f"sqlite:///{copy / 'mlflow.db'}"


def status_json(project: Path) -> dict[str, dict]:
    result = gates(project, "status", "--json")
    assert result.returncode == 0, result.stderr
    return {row["id"]: row for row in json.loads(result.stdout)}


def test_runner_indexes_its_evidence(project):
    root, _ = project
    (entry,) = read_index(root / "runs")
    evidence = root / "runs" / "c05-small" / "evidence.json"
    assert entry.kind == "recorded" and entry.evidence_sha256 == sha256_file(evidence)
    ev = json.loads(evidence.read_text())
    assert entry.contract_sha256 == ev["contract_sha256"] and entry.verdict == ev["verdict"]
    assert entry.engine_version == ev.get("engine_version", entry.engine_version)
    assert ev["supersedes"] is None and "models/c05_probe.py" in ev["code_files"]


def test_verify_fails_on_rewrites_and_passes_a_withdrawn_claim(project):
    root, _ = project
    assert gates(root, "verify").returncode == 0
    row = status_json(root)["c05-small"]
    assert row["hash_ok"] is True and row["withdrawn"] is False and row["stale"] is False
    assert row["stale_files"] == [] and row["superseded_by"] == [] and row["supersedes"] is None
    assert isinstance(row["rule_flags"], list)

    evidence = root / "runs" / "c05-small" / "evidence.json"
    original = evidence.read_bytes()
    evidence.write_bytes(original.replace(b'"created_at": "', b'"created_at": "1', 1))
    result = gates(root, "verify")
    assert result.returncode == 1 and "changed without an index entry" in result.stdout

    evidence.write_bytes(original)
    record_entry(
        root / "runs", evidence, "rederived", "a second entry, so that one follows the first"
    )
    index = root / "runs" / INDEX
    honest = index.read_bytes()
    index.write_bytes(honest.replace(b'"recorded"', b'"backfilled"', 1))  # history rewritten
    result = gates(root, "verify")
    assert result.returncode == 1 and "chain broken at line 2" in result.stdout
    index.write_bytes(honest)
    assert gates(root, "verify").returncode == 0

    evidence.unlink()
    result = gates(root, "verify")
    assert result.returncode == 1 and "disappeared without a withdrawal" in result.stdout

    result = gates(root, "withdraw", "c05-small", "--reason", "probe data had a leak")
    assert result.returncode == 0, result.stderr
    result = gates(root, "verify")
    assert result.returncode == 0, result.stdout
    assert "withdrawn c05-small" in result.stdout and "probe data had a leak" in result.stdout
    assert "0 of 0 claims hold their evidence; 1 withdrawn" in result.stdout
    row = status_json(root)["c05-small"]
    assert (
        row["withdrawn"] is True
        and row["status"] == "withdrawn"
        and "probe data had a leak" in row["withdrawal"]
    )
    (root / "contracts" / "c05-small.yaml").unlink()  # a withdrawn claim may lose its files
    assert gates(root, "verify").returncode == 0
    again = gates(root, "withdraw", "c05-small", "--reason", "twice")
    assert (
        again.returncode == 2
        and "already withdrawn" in again.stderr
        and "Traceback" not in again.stderr
    )
    unknown = gates(root, "withdraw", "no-such-claim", "--reason", "x")
    assert unknown.returncode == 2 and "no recorded claim" in unknown.stderr


def test_a_contract_gone_with_its_evidence_is_named(project):
    root, _ = project
    (root / "runs" / "c05-small" / "evidence.json").unlink()
    (root / "runs" / "c05-small" / "verdict.md").unlink()
    (root / "contracts" / "c05-small.yaml").unlink()
    result = gates(root, "verify")
    assert result.returncode == 1
    assert "LOST c05-small" in result.stdout and "its contract is gone too" in result.stdout


def test_running_again_after_a_withdrawal_records_the_claim_anew(project, monkeypatch):
    root, uri = project
    withdraw_claim(root / "runs", "c05-small", "checking")
    (check,) = verify(root / "runs", root / "contracts")
    assert check.status == "withdrawn"
    monkeypatch.chdir(root)
    run_contract(
        load_contract("contracts/c05-small.yaml"), uri, root / "runs"
    )  # reuses the finished runs
    assert [e.kind for e in read_index(root / "runs")] == ["recorded", "withdrawn", "recorded"]
    (check,) = verify(root / "runs", root / "contracts")
    assert check.status == "ok" and not check.withdrawn


def test_kill_between_evidence_and_index_is_named_and_the_next_run_repairs_it(project):
    """SIGKILL `gates run --record` (another attempt: a plain `gates run` of a recorded contract reproduces it
    and writes nothing) right after evidence.json is in place and before its index entry: verify names the
    unindexed evidence; running the contract again completes that attempt under its own number."""
    root, uri = project
    killer = (
        "import os, signal, sys\n"
        "import gates.execution._runner as runner\n"
        "runner.record_entry = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)\n"
        "from gates.cli import main\n"
        f"sys.argv = ['gates', 'run', 'contracts/c05-small.yaml', '--tracking-uri', {uri!r}, '--record',\n"
        "            '--reason', 'a second attempt']\n"
        "main()\n"
    )
    before = sha256_file(root / "runs" / "c05-small" / "evidence.json")
    killed = subprocess.run(
        [sys.executable, "-c", killer], cwd=root, capture_output=True, text=True
    )
    assert killed.returncode == -9, killed.stderr
    assert (
        sha256_file(root / "runs" / "c05-small" / "evidence.json") != before
    )  # new evidence, unindexed
    assert (
        json.loads((root / "runs" / "c05-small" / "evidence.json").read_text())["attempt"]["number"]
        == 2
    )
    result = gates(root, "verify")
    assert result.returncode == 1
    assert "c05-small/evidence.json changed without an index entry" in result.stdout
    assert "re-running an interrupted one repairs this" in result.stdout
    rerun = gates(
        root, "run", "contracts/c05-small.yaml", "--tracking-uri", uri
    )  # no --record: a repair
    assert rerun.returncode == 0, rerun.stderr
    assert "recorded attempt 2" in rerun.stdout
    assert gates(root, "verify").returncode == 0
    assert [e.kind for e in read_index(root / "runs")] == ["recorded", "recorded"]
    attempt = json.loads((root / "runs" / "c05-small" / "evidence.json").read_text())["attempt"]
    assert attempt["number"] == 2 and [a["number"] for a in attempt["earlier"]] == [1]


def test_supersedes_chain_in_evidence_report_and_status(project, monkeypatch):
    root, uri = project
    data = small_c05(id="c05-small-v2", supersedes="c05-small")
    data["seeds"] = [0, 1, 2]
    write_contract(root / "contracts", data, "c05-small-v2.yaml")
    rows = status_json(root)
    assert rows["c05-small"]["superseded_by"] == [
        "c05-small-v2"
    ]  # the repository says so before any run
    assert (
        rows["c05-small-v2"]["supersedes"] == "c05-small"
        and rows["c05-small-v2"]["status"] == "pending"
    )
    monkeypatch.chdir(root)
    evidence = run_contract(load_contract("contracts/c05-small-v2.yaml"), uri, root / "runs")
    assert evidence.supersedes == "c05-small"
    assert "Supersedes `c05-small`" in (root / "runs" / "c05-small-v2" / "verdict.md").read_text()
    assert (
        "superseded" not in (root / "runs" / "c05-small" / "verdict.md").read_text()
    )  # the old record is untouched
    rows = status_json(root)
    assert (
        rows["c05-small"]["superseded_by"] == ["c05-small-v2"]
        and rows["c05-small"]["verdict"] is not None
    )
    table = gates(root, "status", "-v")
    assert "superseded by c05-small-v2" in table.stdout and "supersedes c05-small" in table.stdout
    result = gates(root, "verify")
    assert result.returncode == 0, result.stdout
    assert "note: superseded by c05-small-v2" in result.stdout


def test_status_and_verify_name_stale_files(project):
    """Evidence whose recorded per-file hash of the study module differs from today's file is stale,
    naming that file; `verify` notes it, `verify --strict-code` fails on it."""
    root, _ = project
    evidence = root / "runs" / "c05-small" / "evidence.json"
    ev = json.loads(evidence.read_text())
    ev["code_files"]["models/c05_probe.py"] = (
        "0" * 64
    )  # as if it had been computed with another c05_probe.py
    ev["code_sha256"] = "1" * 64
    evidence.write_text(json.dumps(ev, indent=2) + "\n")
    from gates.record import render_report

    (root / "runs" / "c05-small" / "verdict.md").write_text(render_report(ev))
    record_entry(root / "runs", evidence, "rederived", "test: code fingerprint of another checkout")
    row = status_json(root)["c05-small"]
    assert row["stale"] is True and row["stale_files"] == ["models/c05_probe.py"]
    table = gates(root, "status", "-v")
    assert "stale: models/c05_probe.py" in table.stdout
    result = gates(root, "verify")
    assert (
        result.returncode == 0
        and "note: stale: code changed since its evidence: models/c05_probe.py" in result.stdout
    )
    strict = gates(root, "verify", "--strict-code")
    assert strict.returncode == 1
    assert "LOST c05-small" in strict.stdout and "stale (--strict-code)" in strict.stdout
    assert "models/c05_probe.py" in strict.stdout
    assert "`gates certify contracts/c05-small.yaml --reason TEXT` re-runs it" in " ".join(
        strict.stdout.split()
    )


def test_strict_code_fails_only_standing_claims(tmp_path):
    """A superseded claim stands for nothing today: stale, it is noted, never a failure (issue #39)."""
    from tests.conftest import copy_claims

    root = copy_claims(tmp_path, "c05-structural-probe", "c05-structural-probe-v2")
    for cid in ("c05-structural-probe", "c05-structural-probe-v2"):
        evidence = root / "runs" / cid / "evidence.json"
        ev = json.loads(evidence.read_text())
        ev.setdefault("code_files", {})["models/c05_probe.py"] = "0" * 64  # another c05_probe.py
        evidence.write_text(json.dumps(ev, indent=2) + "\n")
        record_entry(root / "runs", evidence, "rederived", "test: another checkout's code")
    checks = {c.contract_id: c for c in verify(root / "runs", root / "contracts", strict_code=True)}
    assert checks["c05-structural-probe"].stale and checks["c05-structural-probe"].status == "ok"
    assert checks["c05-structural-probe-v2"].status == "lost"


def test_a_reproduction_of_a_stale_claim_names_the_contract_and_gates_certify(project):
    """After a code change, `gates run` reproduces the claim ("reproduced") and says how to clear its
    staleness: `gates certify` with the contract's path (never the literal CONTRACT), and the path in
    the hint to record another attempt."""
    root, uri = project
    evidence = root / "runs" / "c05-small" / "evidence.json"
    ev = json.loads(evidence.read_text())
    ev["code_files"]["models/c05_probe.py"] = "0" * 64  # computed with another c05_probe.py
    ev["code_sha256"] = "1" * 64
    evidence.write_text(json.dumps(ev, indent=2) + "\n")
    from gates.record import render_report

    (root / "runs" / "c05-small" / "verdict.md").write_text(render_report(ev))
    record_entry(root / "runs", evidence, "rederived", "test: code fingerprint of another checkout")
    done = gates(root, "run", "contracts/c05-small.yaml", "--tracking-uri", uri)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "reproduced: " in done.stdout and "CONTRACT" not in done.stdout
    assert "gates run contracts/c05-small.yaml --record --reason TEXT" in done.stdout
    (hint,) = [line for line in done.stdout.splitlines() if line.startswith("the claim is stale")]
    assert "models/c05_probe.py" in hint
    assert "`gates certify contracts/c05-small.yaml --reason TEXT`" in hint


def test_dashboard_shows_withdrawn_superseded_and_stale_claims(project):
    """The dashboard's index and contract pages: a withdrawn claim as withdrawn (its record kept), the
    supersedes chain both ways with links, stale code naming the files."""
    from gates.dashboard.site import Site

    root, uri = project
    write_contract(
        root / "contracts",
        small_c05(id="c05-small-v2", supersedes="c05-small"),
        "c05-small-v2.yaml",
    )
    evidence = root / "runs" / "c05-small" / "evidence.json"
    ev = json.loads(evidence.read_text())
    ev["code_files"]["models/c05_probe.py"] = "0" * 64
    ev["code_sha256"] = "1" * 64
    evidence.write_text(json.dumps(ev, indent=2) + "\n")
    from gates.record import render_report

    (root / "runs" / "c05-small" / "verdict.md").write_text(render_report(ev))
    record_entry(root / "runs", evidence, "rederived", "test: another checkout's code")
    site = Site(root / "runs", root / "contracts", uri, "http://127.0.0.1:5000")
    index = site.index()
    old_row = index[index.index('<tr id="row-c05-small">') :]
    old_row = old_row[: old_row.index("</tr>")]
    assert 'superseded by <a href="/contract/c05-small-v2">c05-small-v2</a>' in old_row
    assert '<span class="stale" title="models/c05_probe.py">stale (1 file)</span>' in old_row
    page = site.contract("c05-small")
    assert (
        "Superseded by" in page
        and "Stale: the code this evidence was computed with has changed" in page
    )
    assert "<code>models/c05_probe.py</code>" in page
    assert 'Supersedes <a href="/contract/c05-small">c05-small</a>' in site.contract("c05-small-v2")

    withdraw_claim(root / "runs", "c05-small", "a leak <found> in the probe data")
    site = Site(root / "runs", root / "contracts", uri, "http://127.0.0.1:5000")
    index = site.index()
    row = index[index.index('<tr id="row-c05-small">') :]
    row = row[: row.index("</tr>")]
    assert 'class="v v-withdrawn">withdrawn</span> <s class="small">' in row
    page = site.contract("c05-small")
    assert "Withdrawn: a leak &lt;found&gt; in the probe data" in page
    assert (
        "Runs: final metrics per arm and seed" in page
    )  # the evidence stays visible, never deleted
