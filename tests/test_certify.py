"""`gates certify`: a stale claim whose runs reproduce under today's code is certified (a `certified`
entry in the claims history with today's fingerprint; no longer stale), one that does not reproduce is
not (exit 1, nothing written), and a sample re-runs only as many runs as asked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gates.record import INDEX, record_entry, write_report
from gates.record._index import read_index
from tests.conftest import regenerate_history, small_c05
from tests.helpers import gates

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def recorded(make_project):
    return make_project(small_c05())


def rewrite_evidence(project: Path, change, reason: str) -> None:
    """Change the evidence and index the change (a `rederived` entry), as a legitimate rewrite would."""
    path = project / "runs" / "c05-small" / "evidence.json"
    ev = json.loads(path.read_text())
    change(ev)
    path.write_text(json.dumps(ev, indent=2) + "\n")
    write_report(path.parent)  # verdict.md renders the evidence (its code hash included)
    record_entry(project / "runs", path, "rederived", reason)


def pretend_older_code(ev: dict) -> None:
    """The evidence as if computed by other code: one study file's recorded hash differs."""
    name = next(n for n in ev["code_files"] if n.startswith("models/"))
    ev["code_files"][name] = "0" * 64
    ev["code_sha256"] = "1" * 64


def status(project: Path) -> dict:
    done = gates(project, "status", "--json")
    assert done.returncode == 0, done.stderr
    return {c["id"]: c for c in json.loads(done.stdout)}["c05-small"]


def test_a_stale_claim_that_reproduces_is_certified_and_no_longer_stale(project):
    rewrite_evidence(project, pretend_older_code, "test: evidence from other code")
    before = status(project)
    assert before["stale"] and before["certified"] is None
    done = gates(project, "certify", "contracts/c05-small.yaml", "--reason", "after a refactor")
    assert done.returncode == 0, done.stderr
    assert "c05-small: certified (" in done.stdout and "reproduces" in done.stdout
    entry = read_index(project / "runs")[-1]
    assert entry.kind == "certified" and entry.reason == "after a refactor"
    n = len(json.loads((project / "runs/c05-small/evidence.json").read_text())["runs"])
    assert entry.reran == f"{n} of {n} completed runs"
    after = status(project)
    assert not after["stale"] and "after a refactor" in after["certified"]
    verified = gates(project, "verify")
    assert verified.returncode == 0, verified.stdout + verified.stderr  # the chain holds


def test_a_claim_whose_runs_do_not_reproduce_is_not_certified(project):
    def forge(ev):
        pretend_older_code(ev)
        run = next(r for r in ev["runs"] if r["status"] == "completed")
        run["metrics"]["test_acc"] = 0.123  # a recorded value today's code does not give

    rewrite_evidence(project, forge, "test: a forged value")
    regenerate_history(project / "runs")  # the `rederived` entry cannot vouch for new values
    index = (project / "runs" / INDEX).read_bytes()
    done = gates(project, "certify", "contracts/c05-small.yaml", "--reason", "after a refactor")
    assert done.returncode == 1
    assert "DOES NOT reproduce" in done.stdout and "test_acc re-runs as" in done.stderr
    assert "not certified: c05-small" in done.stderr
    assert (project / "runs" / INDEX).read_bytes() == index  # nothing written
    assert status(project)["stale"]


def test_a_sample_reruns_as_many_runs_as_asked(project):
    done = gates(
        project,
        "certify",
        "contracts/c05-small.yaml",
        "--reason",
        "spot",
        "--sample",
        "1",
        "--seed",
        "3",
    )
    assert done.returncode == 0, done.stderr
    n = len(json.loads((project / "runs/c05-small/evidence.json").read_text())["runs"])
    assert read_index(project / "runs")[-1].reran == f"1 of {n} completed runs"
    assert done.stdout.count("reproduces") == 1


def test_a_new_attempt_is_measured_from_its_own_code_not_an_older_certification(project):
    from gates.record import certifications

    gates(project, "certify", "contracts/c05-small.yaml", "--reason", "spot", "--sample", "1")
    assert "c05-small" in certifications(project / "runs")
    path = project / "runs" / "c05-small" / "evidence.json"
    record_entry(project / "runs", path, "recorded", "test: another attempt")
    assert "c05-small" not in certifications(project / "runs")
