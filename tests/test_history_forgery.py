"""Issue #39: what a forger who edits files and commits can no longer do to the claims history unseen:
follow a link put in place of it, write a certification by hand, or break a reader with a malformed
entry."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from gates.record import INDEX
from gates.record._index import line_sha256, read_index
from tests.conftest import small_c05
from tests.helpers import committed, gates
from tests.test_certify import pretend_older_code, rewrite_evidence
from tests.test_history_integrity import CID, evidence_path, git, one_line

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def recorded(make_project):
    return make_project(small_c05())


def status(project: Path) -> dict:
    done = gates(project, "status", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    return {c["id"]: c for c in json.loads(done.stdout)}[CID]


def append_by_hand(runs: Path, entry: dict) -> None:
    """Append an entry as a forger would: chained onto the last line (`prev` right), written by hand."""
    path = runs / INDEX
    last = path.read_bytes().rstrip(b"\n").rsplit(b"\n", 1)[-1]
    line = json.dumps({**entry, "prev": line_sha256(last)}, separators=(", ", ": "))
    with path.open("a") as f:
        f.write(line + "\n")


# ---------------------------------------------------------------------------------- finding 1: a link
@pytest.mark.parametrize("where", ["inside", "outside"])
def test_a_history_replaced_by_a_link_is_never_followed(project, tmp_path, where):
    committed(project)
    index = project / "runs" / INDEX
    # the forged history: the same entries (a refuted claim could be left out of it)
    target = project / "runs" / "forged.jsonl" if where == "inside" else tmp_path / "forged.jsonl"
    shutil.copy(index, target)
    index.unlink()
    os.symlink(target, index)
    done = gates(project, "verify")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "symbolic link" in one_line(done) and "never followed" in done.stdout
    assert "history_not_a_file" in status(project)["problem_codes"]
    git(project, "add", "-A")
    git(project, "commit", "-qm", "a quiet fix")
    done = gates(project, "verify")
    assert done.returncode == 1 and "symbolic link" in one_line(done)
    # nothing is appended through it either
    before = target.read_bytes()
    done = gates(project, "withdraw", CID, "--reason", "x")
    assert done.returncode == 2 and "symbolic link" in one_line(done)
    assert target.read_bytes() == before


def test_a_runs_folder_replaced_by_a_link_is_never_followed(project, tmp_path):
    committed(project)
    elsewhere = tmp_path / "elsewhere"
    shutil.move(project / "runs", elsewhere)
    os.symlink(elsewhere, project / "runs")
    done = gates(project, "verify")
    assert done.returncode == 1 and "symbolic link" in one_line(done)


# ---------------------------------------------------------------------------------- finding 4: malformed
def certified_by_hand(project: Path, **fields) -> dict:
    """A `certified` entry as `gates certify` wrote one before issue #39, with today's code: what a
    forger appends to make a changed study read current."""
    from gates.record import current_provenance
    from gates.study import study_module

    ev = json.loads(evidence_path(project).read_text())
    latest = [e for e in read_index(project / "runs") if e.contract_id == CID][-1]
    prov = current_provenance(study_module(ev["study"]))
    n = sum(r["status"] == "completed" for r in ev["runs"])
    entry = {
        **{k: v for k, v in latest.data.items() if k != "rederived_from"},
        "kind": "certified",
        "reason": "after a refactor",
        "code_sha256": prov.code_sha256,
        "code_files": prov.code_files,
        "reran": f"{n} of {n} completed runs",
        "tolerance": {"abs": 1e-6, "rel": 1e-6},
    }
    entry.update(fields)
    return entry


def test_a_malformed_entry_is_one_line_with_a_code_in_every_reader(project):
    append_by_hand(project / "runs", certified_by_hand(project, tolerance={"abs": "huge"}))
    for args in (("verify",), ("status", "-v"), ("report", "--html", "r")):
        done = gates(project, *args)
        text = one_line(done)  # no traceback
        assert done.returncode in (0, 1), (args, text)
    done = gates(project, "verify")
    assert done.returncode == 1 and 'tolerance.abs is "huge"' in done.stdout
    assert "history_malformed" in status(project)["problem_codes"]
    from gates.dashboard.site import Site

    site = Site(project / "runs", project / "contracts", "sqlite:///none.db", "http://x")
    assert CID in site.index() and "history" in site.contract(CID)  # pages, not a 500


# ---------------------------------------------------------------------------------- finding 3: by hand
def stale(project: Path) -> None:
    rewrite_evidence(project, pretend_older_code, "test: evidence from other code")
    assert status(project)["stale"]


def test_a_certification_written_by_hand_does_not_make_a_changed_study_current(project):
    stale(project)
    append_by_hand(project / "runs", certified_by_hand(project))
    found = status(project)
    assert found["stale"] and found["certified"] is None
    assert "certification_ignored" in found["problem_codes"]
    assert gates(project, "verify", "--strict-code").returncode == 1
    assert gates(project, "verify").returncode == 0  # a note: the claim itself still holds


def recorded_values(project) -> list[dict]:
    """Every completed run's values as the evidence records them: what a forger copies as re-runs."""
    ev = json.loads(evidence_path(project).read_text())
    return [
        {"arm": r["arm"], "seed": r["seed"], "metrics": dict(r["metrics"])}
        for r in ev["runs"]
        if r["status"] == "completed"
    ]


def test_a_certification_whose_reruns_contradict_the_evidence_loses_the_claim(project):
    stale(project)
    reran = recorded_values(project)
    append_by_hand(project / "runs", certified_by_hand(project, reran_runs=reran))
    found = status(project)  # values copied from the evidence: consistent, counted
    assert not found["stale"] and found["certified"]
    reran[0]["metrics"]["test_acc"] += 0.25  # a re-run that gave something else
    append_by_hand(project / "runs", certified_by_hand(project, reran_runs=reran))
    done = gates(project, "verify")
    assert done.returncode == 1 and "the entry vouches for re-runs the evidence" in done.stdout
    found = status(project)
    assert "certification_invalid" in found["problem_codes"] and found["stale"]


def test_gates_certify_records_the_reruns_and_they_verify(project):
    stale(project)
    done = gates(project, "certify", f"contracts/{CID}.yaml", "--reason", "r", "--sample", "1")
    assert done.returncode == 0, done.stdout + done.stderr
    entry = read_index(project / "runs")[-1]
    assert len(entry.reran_runs) == 1 and entry.reran_runs[0].metrics
    assert gates(project, "verify", "--strict-code").returncode == 0


def test_a_certification_committed_with_other_code_than_it_names_loses_the_claim(project):
    """The history and the code in one repository (as here): the fingerprint a certification names
    must be the code of the commit that added it."""
    root = Path(__file__).resolve().parent.parent
    for package in ("gates", "models"):
        shutil.copytree(
            root / package, project / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    committed(project)
    stale(project)
    reran = recorded_values(project)
    entry = certified_by_hand(project, reran_runs=reran)
    append_by_hand(project / "runs", entry)
    git(project, "commit", "-qam", "certified with the code of this commit")
    assert gates(project, "verify", "--strict-code").returncode == 0
    append_by_hand(project / "runs", {**entry, "code_sha256": "ab" * 32})
    git(project, "commit", "-qam", "certified under code that is not here")
    done = gates(project, "verify")
    assert done.returncode == 1 and "is not the code of commit" in done.stdout


# ---------------------------------------------------------------------------------- finding 7: memory
@pytest.mark.parametrize("shape", ["many values", "many bytes"])
def test_evidence_past_its_caps_is_refused_in_one_line_before_it_is_parsed(project, shape):
    """Memory follows the number of JSON values: 59 MB of small objects took 3 GB to verify. Past
    either cap the evidence is refused (the claim lost, one line), never parsed."""
    # the caps this test asks for: well below what a machine has (gates.record._files holds them)
    MAX_EVIDENCE_BYTES, MAX_JSON_VALUES = 16 * 1024 * 1024, 250_000
    ev = json.loads(evidence_path(project).read_text())
    if shape == "many values":  # under the byte cap, past the values cap
        ev["pad"] = [0] * (MAX_JSON_VALUES + 1)
        expected = f"more than {MAX_JSON_VALUES} values"
    else:  # past the byte cap, few values
        ev["pad"] = "x" * (MAX_EVIDENCE_BYTES + 1)
        expected = f"larger than {MAX_EVIDENCE_BYTES} bytes"
    text = json.dumps(ev)
    assert len(text) <= MAX_EVIDENCE_BYTES or shape == "many bytes"
    evidence_path(project).write_text(text)
    for args in (("verify",), ("status", "-v")):
        done = gates(project, *args)
        assert done.returncode in (0, 1) and expected in one_line(done), (args, done.stdout)
    assert gates(project, "verify").returncode == 1


# ---------------------------------------------------------------------------------- finding 11: successors
def registered_again(project: Path, **changes) -> Path:
    """The withdrawn claim's contract under a new id, reworded, with an easier bar: the same study,
    arms and kinds of conditions."""
    import yaml

    from tests.conftest import write_contract

    data = yaml.safe_load((project / "contracts" / f"{CID}.yaml").read_text())
    data["id"] = "c05-fresh-start"
    data["claim"] = "An entirely different sentence about kernels and trees, nothing alike."
    data["decision"]["supported_if"][0]["value"] = 0.1
    data.update(changes)
    return write_contract(project / "contracts", data, "c05-fresh-start.yaml")


def test_a_withdrawn_claim_registered_again_unlinked_is_refused(project):
    assert gates(project, "withdraw", CID, "--reason", "refuted").returncode == 0
    registered_again(project)
    done = gates(project, "check", "contracts/c05-fresh-start.yaml")
    assert done.returncode == 2 and f"supersedes: {CID}" in one_line(done), done.stdout
    registered_again(project, supersedes=CID)
    done = gates(project, "check", "contracts/c05-fresh-start.yaml")
    # linked, it is a version of the withdrawn claim's family, which spent its alpha (issue #38)
    assert done.returncode == 2 and "no alpha left" in one_line(done), done.stdout + done.stderr
    assert f"supersedes: {CID}" not in one_line(done)


def test_a_withdrawn_claim_recorded_again_unlinked_loses_the_new_claim(project):
    from gates.contract import load_contract
    from gates.record import record_entry, write_report

    assert gates(project, "withdraw", CID, "--reason", "refuted").returncode == 0
    folder = project / "runs" / "c05-fresh-start"
    shutil.copytree(project / "runs" / CID, folder)
    path = registered_again(project)
    shutil.rmtree(project / "runs" / CID)  # its evidence may go: the withdrawal keeps its design
    (project / "contracts" / f"{CID}.yaml").unlink()
    ev = json.loads((folder / "evidence.json").read_text())
    ev["contract_id"], ev["contract_sha256"] = "c05-fresh-start", load_contract(path).sha256
    ev["claim"] = json.loads(json.dumps(load_contract(path).contract.claim))
    ev.pop("attempt", None)
    (folder / "evidence.json").write_text(json.dumps(ev, indent=2) + "\n")
    write_report(folder)
    record_entry(project / "runs", folder / "evidence.json", "recorded")
    done = gates(project, "verify")
    assert done.returncode == 1 and f"supersedes: {CID}" in done.stdout, done.stdout
    found = {c["id"]: c for c in json.loads(gates(project, "status", "--json").stdout)}
    assert "unlinked_successor" in found["c05-fresh-start"]["problem_codes"]


# ---------------------------------------------------------------------------------- finding 2: the verifier
def test_a_commit_that_changes_the_verifier_with_the_claims_is_named(project):
    """CI runs the verifier of the commit it checks: one that changes gates/ and the claims history at
    once is named for review (the threat model says what would close it)."""
    (project / "gates").mkdir()
    (project / "gates" / "lenient.py").write_text("LENIENT = True\n")
    committed(project)  # one commit: the claims and gates/
    done = gates(project, "verify")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "changed gates/ together with runs/INDEX.jsonl" in done.stdout
    assert "recorded c05-small" in done.stdout  # the commit, by its subject
    (project / "gates" / "lenient.py").write_text("LENIENT = False\n")
    git(project, "commit", "-qam", "only the platform")
    assert "1 commit changed gates/" in gates(project, "verify").stdout  # that one is not counted
