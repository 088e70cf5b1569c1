"""The claims history as an adversary meets it (issue #28): re-deriving cannot launder edited values,
git anchors the history (rewritten or regenerated histories fail), one id holds one contract, a
withdrawn claim re-registered unlinked is flagged, and strange files in place of the history or the
evidence (a folder, a FIFO, 200,000-deep JSON) give one line, never a traceback or a hang."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from gates.contract import load_contract
from gates.record import GENESIS, INDEX, record_entry, write_report
from gates.record._index import line_sha256, read_index
from tests.conftest import regenerate_history, small_c05, write_contract
from tests.helpers import committed, gates

pytestmark = pytest.mark.usefixtures("one_thread")

CID = "c05-small"


@pytest.fixture(scope="module")
def recorded(make_project):
    return make_project(small_c05())


def git(project: Path, *args: str) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }
    done = subprocess.run(["git", *args], cwd=project, capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout


def evidence_path(project: Path) -> Path:
    return project / "runs" / CID / "evidence.json"


def edit_value(project: Path, delta: float = 0.004) -> None:
    path = evidence_path(project)
    ev = json.loads(path.read_text())
    run = next(r for r in ev["runs"] if r["status"] == "completed")
    run["metrics"]["train_loss"] += delta  # read by no condition: the verdict does not move
    path.write_text(json.dumps(ev, indent=2) + "\n")
    write_report(path.parent)


def one_line(done: subprocess.CompletedProcess) -> str:
    text = (done.stderr + done.stdout).strip()
    assert "Traceback" not in text, text
    return text


# ---------------------------------------------------------------------------------- rederive
def test_rederive_refuses_evidence_edited_since_its_entry(project):
    edit_value(project)
    index = (project / "runs" / INDEX).read_bytes()
    done = gates(project, "rederive", f"contracts/{CID}.yaml", "--reason", "a correction")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "is not the evidence" in one_line(done) and len(done.stderr.strip().splitlines()) == 1
    assert (project / "runs" / INDEX).read_bytes() == index  # nothing laundered into the history
    assert gates(project, "verify").returncode == 1  # and the edit stays visible


def test_rederive_under_todays_engine_and_rules_has_nothing_to_correct(project):
    index = (project / "runs" / INDEX).read_bytes()
    done = gates(project, "rederive", f"contracts/{CID}.yaml", "--reason", "no reason really")
    assert done.returncode == 0 and f"{CID}: unchanged" in done.stdout
    assert (project / "runs" / INDEX).read_bytes() == index


def test_a_rederived_entry_records_what_it_corrected_and_pins_the_values(tmp_path):
    from tests.conftest import copy_claims

    root = copy_claims(
        tmp_path, "c05-structural-probe"
    )  # frozen under engine 2, re-derived to today's
    entries = read_index(root / "runs")
    assert [e.kind for e in entries] == ["backfilled", "rederived"]
    assert entries[1].rederived_from["engine_version"] == "2"
    assert entries[1].values_sha256 == entries[0].values_sha256


def test_an_entry_that_vouches_for_other_values_loses_the_claim(project):
    edit_value(project)
    record_entry(project / "runs", evidence_path(project), "rederived", "a quiet edit")
    done = gates(project, "verify")
    assert done.returncode == 1
    assert "vouches for per-seed values" in done.stdout + done.stderr


# ---------------------------------------------------------------------------------- git anchor
def rechain(runs: Path, edit) -> None:
    """Edit the history's entries with `edit(entries)` and recompute every `prev`: a chain anyone can
    recompute, which only git's record of the file exposes."""
    entries = [json.loads(line) for line in (runs / INDEX).read_text().splitlines()]
    edit(entries)
    prev, lines = GENESIS, []
    for e in entries:
        e["prev"] = prev
        line = json.dumps(e, ensure_ascii=False, separators=(", ", ": "))
        prev = line_sha256(line.encode())
        lines.append(line)
    (runs / INDEX).write_text("\n".join(lines) + "\n")


def test_a_rechained_history_committed_over_the_old_one_fails_verify(project):
    committed(project)
    assert gates(project, "verify").returncode == 0
    edit_value(project)
    sha = __import__("hashlib").sha256(evidence_path(project).read_bytes()).hexdigest()

    def forge(entries):
        entries[-1]["evidence_sha256"] = sha

    rechain(project / "runs", forge)
    assert gates(project, "verify").returncode == 1  # the working copy no longer extends HEAD's
    git(project, "commit", "-qam", "a quiet fix")
    done = gates(project, "verify")
    assert done.returncode == 1
    assert "were rewritten in commit" in done.stdout and "a quiet fix" in done.stdout


def test_a_regenerated_history_fails_verify(project):
    committed(project)
    edit_value(project)
    regenerate_history(project / "runs")
    done = gates(project, "verify")
    assert done.returncode == 1 and "the working copy" in done.stdout
    git(project, "commit", "-qam", "regenerated")
    assert gates(project, "verify").returncode == 1


def test_an_appended_history_passes_and_a_shallow_clone_says_what_it_did_not_check(
    project, tmp_path
):
    committed(project)
    assert gates(project, "withdraw", CID, "--reason", "test").returncode == 0
    git(project, "commit", "-qam", "withdrawn")
    assert gates(project, "verify").returncode == 0  # lines appended: the history grew
    shallow = tmp_path / "shallow"
    git(tmp_path, "clone", "-q", "--depth", "1", f"file://{project}", str(shallow))
    done = gates(shallow, "verify")
    assert done.returncode == 0 and "shallow clone" in done.stdout


# ---------------------------------------------------------------------------------- one id, one contract
def easier(project: Path, **changes) -> None:
    """Replace the contract under the same id with an easier bar."""
    path = project / "contracts" / f"{CID}.yaml"
    data = yaml.safe_load(path.read_text())
    data["decision"]["supported_if"][0]["value"] = 0.9
    data.update(changes)
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def test_a_new_contract_under_a_recorded_id_is_refused_before_training(project):
    shutil.rmtree(
        project / "runs" / CID
    )  # evidence replaced along with the contract: only the history says
    easier(project)
    done = gates(project, "run", f"contracts/{CID}.yaml")
    assert done.returncode == 2 and "one id, one contract" in one_line(done)


def test_two_contracts_under_one_id_in_the_history_fail_verify(project):
    easier(project)
    loaded = load_contract(project / "contracts" / f"{CID}.yaml")
    path = evidence_path(project)
    ev = json.loads(path.read_text())
    ev["contract_sha256"] = loaded.sha256
    path.write_text(json.dumps(ev, indent=2) + "\n")
    write_report(path.parent)
    record_entry(project / "runs", path, "recorded", "a moved goalpost")
    done = gates(project, "verify")
    assert done.returncode == 1 and "one id, one contract" in done.stdout


def test_a_withdrawn_id_takes_a_new_contract_that_declares_it(project):
    assert gates(project, "withdraw", CID, "--reason", "the bar was wrong").returncode == 0
    easier(project)
    done = gates(project, "check", f"contracts/{CID}.yaml")  # check refuses as run would
    assert done.returncode == 2 and f"supersedes: {CID}" in one_line(done)
    easier(project, supersedes=CID)
    assert gates(project, "check", f"contracts/{CID}.yaml").returncode == 0


def test_a_withdrawn_claim_re_registered_unlinked_is_flagged(project):
    assert gates(project, "withdraw", CID, "--reason", "refuted").returncode == 0
    data = yaml.safe_load((project / "contracts" / f"{CID}.yaml").read_text())
    data["id"] = "c05-small-again"
    write_contract(project / "contracts", data, "c05-small-again.yaml")
    shutil.copytree(project / "runs" / CID, project / "runs" / "c05-small-again")
    path = project / "runs" / "c05-small-again" / "evidence.json"
    ev = json.loads(path.read_text())
    ev["contract_id"], ev["contract_sha256"] = (
        "c05-small-again",
        load_contract(project / "contracts" / "c05-small-again.yaml").sha256,
    )
    path.write_text(json.dumps(ev, indent=2) + "\n")
    write_report(path.parent)
    record_entry(project / "runs", path, "recorded")
    done = gates(project, "status", "--json")
    found = {c["id"]: c for c in json.loads(done.stdout)}["c05-small-again"]
    assert "unlinked_successor" in found["problem_codes"]


# ---------------------------------------------------------------------------------- strange files
COMMANDS = (
    ("verify",),
    ("status", "-v"),
    ("withdraw", CID, "--reason", "x"),
    ("report", "--html", "r"),
)


@pytest.mark.parametrize("kind", ["folder", "fifo"])
def test_a_history_that_is_a_folder_or_a_fifo_gives_one_line(project, kind):
    index = project / "runs" / INDEX
    index.unlink()
    index.mkdir() if kind == "folder" else os.mkfifo(index)
    for args in COMMANDS:
        done = gates(
            project, *args, timeout=60
        )  # a FIFO read would hang: the timeout fails the test
        text = one_line(done)
        if args[0] == "report":  # the pages say it, on the claim's page
            text = (project / "r" / "contract" / f"{CID}.html").read_text()
        assert "not a regular file" in text, (args, text)
    assert gates(project, "verify").returncode == 1


def deep(n: int = 200_000) -> str:
    return "[" * n + "]" * n


def test_deep_json_as_evidence_or_history_line_gives_one_line(project):
    evidence_path(project).write_text(deep())
    for args in (*COMMANDS, ("render", f"contracts/{CID}.yaml")):
        done = gates(project, *args)
        assert "RecursionError" not in one_line(done), args
    with (project / "runs" / INDEX).open("a") as f:
        f.write(deep() + "\n")
    for args in COMMANDS:
        done = gates(project, *args)
        assert "RecursionError" not in one_line(done), args
    assert gates(project, "verify").returncode == 1
