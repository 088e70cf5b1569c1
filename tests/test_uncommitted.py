"""Nothing is recorded from files no commit holds: `gates run` (recording) and `gates certify` refuse,
before any training, a contract or study code that is untracked, changed since HEAD or outside any git
repository (one line naming the files, exit 2), in a researcher's own project as in this one;
reproducing a recorded claim runs from any tree."""

from __future__ import annotations

import pytest

from gates.record._provenance import uncommitted
from tests.conftest import git, small_c05, write_contract
from tests.helpers import gates


@pytest.fixture
def strict(monkeypatch):
    """The refusal as a user meets it (the test suite otherwise allows uncommitted files)."""
    monkeypatch.delenv("GATES_ALLOW_UNCOMMITTED")


def test_names_untracked_changed_and_outside_files_and_nothing_committed(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    (repo / "my_study").mkdir(parents=True)
    study, helper = repo / "my_study" / "study.py", repo / "my_study" / "helper.py"
    study.write_text("A = 1\n")
    helper.write_text("B = 1\n")
    git(repo, "init", "-q")
    assert uncommitted([study]) == [f"{study} (untracked)"]  # a repository without a commit
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "study")
    assert uncommitted([study, helper]) == []
    helper.write_text("B = 2\n")
    extra = repo / "my_study" / "extra.py"
    extra.write_text("C = 1\n")
    monkeypatch.chdir(repo)  # named relative to where the user is
    assert uncommitted([study, helper, extra]) == [
        "my_study/helper.py (changed)",
        "my_study/extra.py (untracked)",
    ]
    git(repo, "add", "-A")  # staged is not committed
    assert uncommitted([helper]) == ["my_study/helper.py (changed)"]
    outside = tmp_path / "installed.py"
    outside.write_text("D = 1\n")
    assert uncommitted([outside]) == [f"{outside} (in no git repository)"]
    assert uncommitted([outside], outside_git=False) == []  # an installed distribution's file


def test_recording_from_an_uncommitted_contract_is_refused_before_any_training(tmp_path, strict):
    project = tmp_path / "p"
    (project / "runs").mkdir(parents=True)
    (project / "contracts").mkdir()
    write_contract(project / "contracts", small_c05(), "c05-small.yaml")
    done = gates(project, "run", "contracts/c05-small.yaml")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "contracts/c05-small.yaml (in no git repository)" in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not (project / "mlflow.db").exists() and list((project / "runs").iterdir()) == []
    git(project, "init", "-q")
    done = gates(project, "run", "contracts/c05-small.yaml")
    assert done.returncode == 2 and "contracts/c05-small.yaml (untracked)" in done.stderr


@pytest.fixture(scope="module")
def recorded(make_project):
    return make_project(small_c05())


def test_certify_refuses_an_uncommitted_contract_and_reproducing_runs_from_any_tree(
    recorded, make_project, strict
):
    project = make_project(copy_of=recorded)
    done = gates(project, "certify", "contracts/c05-small.yaml", "--reason", "r", "--sample", "1")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "cannot certify" in done.stderr and "contracts/c05-small.yaml" in done.stderr
    # re-deriving writes an entry too, its verdict from today's engine: refused alike
    done = gates(project, "rederive", "contracts/c05-small.yaml", "--reason", "r")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "cannot re-derive from files no commit holds" in done.stderr
    done = gates(project, "run", "contracts/c05-small.yaml")  # reproduces the record: allowed
    assert done.returncode == 0, done.stdout + done.stderr
