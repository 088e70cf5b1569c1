"""`gates certify`: a stale claim whose runs reproduce under today's code is certified (a `certified`
entry in the claims history with today's fingerprint; no longer stale), one that does not reproduce is
not (exit 1, nothing written), and a sample re-runs only as many runs as asked."""

from __future__ import annotations

import json
import random
import subprocess
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


def certify(project: Path, *args: str):
    """`gates certify contracts/c05-small.yaml ARGS...` in `project`."""
    return gates(project, "certify", "contracts/c05-small.yaml", *args)


def status(project: Path) -> dict:
    done = gates(project, "status", "--json")
    assert done.returncode == 0, done.stderr
    return {c["id"]: c for c in json.loads(done.stdout)}["c05-small"]


def test_a_stale_claim_that_reproduces_is_certified_and_no_longer_stale(project):
    rewrite_evidence(project, pretend_older_code, "test: evidence from other code")
    before = status(project)
    assert before["stale"] and before["certified"] is None
    done = certify(project, "--reason", "after a refactor")
    assert done.returncode == 0, done.stderr
    assert "c05-small: certified under code " in done.stdout and "reproduces" in done.stdout
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
    done = certify(project, "--reason", "after a refactor")
    assert done.returncode == 1
    assert "DOES NOT reproduce" in done.stdout and "test_acc re-runs as" in done.stderr
    assert "not certified: c05-small" in done.stderr
    assert (project / "runs" / INDEX).read_bytes() == index  # nothing written
    assert status(project)["stale"]


def test_a_sample_reruns_as_many_runs_as_asked(project):
    done = certify(project, "--reason", "spot", "--sample", "1", "--seed", "3")
    assert done.returncode == 0, done.stderr
    n = len(json.loads((project / "runs/c05-small/evidence.json").read_text())["runs"])
    assert read_index(project / "runs")[-1].reran == f"1 of {n} completed runs"
    assert done.stdout.count("reproduces") == 1


def test_a_new_attempt_is_measured_from_its_own_code_not_an_older_certification(project):
    from gates.record import certifications

    certify(project, "--reason", "spot", "--sample", "1")
    assert "c05-small" in certifications(project / "runs")
    path = project / "runs" / "c05-small" / "evidence.json"
    record_entry(project / "runs", path, "recorded", "test: another attempt")
    assert "c05-small" not in certifications(project / "runs")


def recorded_elsewhere(code_at: str):
    """A change to the evidence: its first completed run as if computed on other CPU kernels, to a
    value this machine does not give, and the evidence as computed by the code of commit `code_at`
    of this repository."""
    from gates.record import PROJECT_ROOT
    from gates.record._provenance import files_at_commit
    from gates.study import study_module

    at = files_at_commit(code_at, study_module("c05_probe"), PROJECT_ROOT)

    def change(ev):
        run = next(r for r in ev["runs"] if r["status"] == "completed")
        run["environment"] = {**(run.get("environment") or {}), "cpu": "OTHER"}
        run["metrics"]["test_acc"] = 0.123
        ev["git_commit"] = code_at
        ev["code_sha256"], ev["code_files"] = at if at else ("2" * 64, ev["code_files"])

    return change


def head() -> str:
    from gates.record import PROJECT_ROOT

    done = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=PROJECT_ROOT, capture_output=True, text=True
    )
    return done.stdout.strip()


def test_a_run_recorded_on_other_kernels_is_judged_against_the_code_the_claim_stands_on(project):
    """A run computed on other CPU kernels that re-runs off its record cannot tell rounding from a
    change: it is re-run under the code the claim stands on (here: HEAD, in a clean checkout of its
    own) and, giving what today's code gives, listed apart (`reran_elsewhere`) from the runs that
    reproduce their record (`reran_runs`, counted in `reran`)."""
    rewrite_evidence(project, recorded_elsewhere(head()), "test: a run from another machine")
    regenerate_history(project / "runs")
    done = certify(project, "--reason", "after a refactor")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "not confirmable by its record here" in done.stdout
    assert f"re-runs as the code of commit {head()[:12]} does here" in done.stdout
    n = len(json.loads((project / "runs/c05-small/evidence.json").read_text())["runs"])
    assert (
        f"({n - 1} of {n} completed runs reproduce their record; 1 recorded on other CPU kernels "
        f"re-runs as the code of commit {head()[:12]} does here)"
    ) in done.stdout
    entry = read_index(project / "runs")[-1]
    assert entry.reran == f"{n - 1} of {n} completed runs" and len(entry.reran_runs) == n - 1
    (elsewhere,) = entry.reran_elsewhere
    assert elsewhere.commit == head() and elsewhere.metrics["test_acc"] != 0.123
    from gates.record import certifications

    assert "c05-small" in certifications(project / "runs")  # the entry holds as verify reads it
    assert "1 more from other CPU kernels re-ran as the code of" in status(project)["certified"]


def test_a_sample_whose_run_is_from_other_kernels_is_certified_by_the_code_it_stands_on(project):
    """Where the sampled run is the one from other kernels, nothing reproduces its record here, yet
    the code is vouched for: today's code computes what the claim's code computes, on this machine."""
    rewrite_evidence(project, recorded_elsewhere(head()), "test: a run from another machine")
    regenerate_history(project / "runs")
    ev = json.loads((project / "runs/c05-small/evidence.json").read_text())
    (other,) = [r for r in ev["runs"] if (r.get("environment") or {}).get("cpu") == "OTHER"]
    runs = sorted(ev["runs"], key=lambda r: (r["arm"], r["seed"]))
    # a seed whose order (certify's: every run, shuffled by it) starts with that run
    seed = next(s for s in range(1000) if random.Random(s).sample(runs, len(runs))[0] is other)
    done = certify(project, "--reason", "spot", "--sample", "1", "--seed", str(seed))
    assert done.returncode == 0, done.stdout + done.stderr
    entry = read_index(project / "runs")[-1]
    assert entry.reran == f"0 of {len(ev['runs'])} completed runs" and entry.reran_runs == ()
    assert [(r.arm, r.seed) for r in entry.reran_elsewhere] == [(other["arm"], other["seed"])]
    from gates.record import certifications

    assert "c05-small" in certifications(project / "runs")


def test_a_run_from_other_kernels_with_no_code_to_compare_with_is_not_certified(project):
    rewrite_evidence(project, recorded_elsewhere("f" * 40), "test: code that is nowhere")
    regenerate_history(project / "runs")
    index = (project / "runs" / INDEX).read_bytes()
    done = certify(project, "--reason", "after a refactor")
    assert done.returncode == 1
    assert "not confirmable by its record here" in done.stderr
    assert "no code of the claim to re-run here and compare with" in done.stderr
    assert (project / "runs" / INDEX).read_bytes() == index  # nothing written
