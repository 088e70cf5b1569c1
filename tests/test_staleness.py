"""Staleness, like `dvc status`: which files of the code a claim's evidence was computed with changed
since, from the evidence's per-file hashes or, for older evidence, from its recorded commit's tree."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from gates.record import Staleness, code_files, code_sha256, git, staleness
from gates.record._provenance import files_at_commit

STUDY = "gates.models.probe"


@pytest.fixture
def repo(tmp_path):
    """A git repository shaped like this one: gates/ and a study module importing a shared module."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    root = tmp_path / "repo"
    files = {
        "gates/__init__.py": "",
        "gates/inference/_verdict.py": "ENGINE = 1\n",
        "models/__init__.py": "",
        "models/probe.py": "from models.common import layer\n\nVALUE = layer()\n",
        "models/common.py": "def layer():\n    return 1\n",
        "models/other.py": "OTHER = 2\n",  # another study's module: not a dependency of the probe
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    git = ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(git[:3] + ["init", "-q"], check=True)
    subprocess.run(git + ["add", "."], check=True)
    subprocess.run(git + ["commit", "-qm", "study"], check=True)
    commit = subprocess.run(
        git[:3] + ["rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    return root, commit


def old_evidence(root: Path, commit: str) -> dict:
    """Evidence as recorded before per-file hashes: a fingerprint and a commit."""
    return {
        "study": "probe",
        "code_sha256": code_sha256(STUDY, root),
        "git_commit": commit,
    }


def test_the_fingerprint_covers_the_platform_and_the_study_closure_only(repo):
    root, _ = repo
    assert sorted(code_files(STUDY, root)) == [
        "gates/__init__.py",
        "gates/inference/_verdict.py",
        "models/__init__.py",
        "models/common.py",
        "models/probe.py",
    ]


def test_old_evidence_names_changed_files_from_its_commit(repo):
    root, commit = repo
    ev = old_evidence(root, commit)
    assert staleness(ev, STUDY, root) == Staleness(False)

    (root / "models" / "other.py").write_text("OTHER = 3\n")  # another study's code: not stale
    assert not staleness(ev, STUDY, root).stale

    (root / "models" / "common.py").write_text("def layer():\n    return 2\n")  # uncommitted edit
    (root / "gates" / "history.py").write_text("# new, untracked\n")
    found = staleness(ev, STUDY, root)
    # stale is the study's code; the platform file is noted, not counted
    assert found.stale and found.files == ("models/common.py",)
    assert (
        found.note == f"compared with commit {commit[:12]}; 1 platform file in gates/ changed too"
    )

    (root / "models" / "probe.py").unlink()  # the study module itself gone
    assert "models/probe.py" in staleness(ev, STUDY, root).files


def test_evidence_whose_commit_does_not_hash_to_it_says_so(repo):
    root, commit = repo
    ev = {
        **old_evidence(root, commit),
        "code_sha256": "0" * 64,
    }  # computed with uncommitted changes
    found = staleness(ev, STUDY, root)
    assert found.stale and found.files == ("unknown files",) and "never committed" in found.note


def test_unknown_commit_gives_unknown_files(repo):
    root, commit = repo
    (root / "models" / "common.py").write_text("def layer():\n    return 2\n")
    for missing in ("f" * 40, "unknown"):
        ev = {**old_evidence(root, commit), "code_sha256": "1" * 64, "git_commit": missing}
        found = staleness(ev, STUDY, root)
        assert (
            found.stale
            and found.files == ("unknown files",)
            and "not in this repository" in found.note
        )


def test_new_evidence_names_files_from_its_own_hashes_without_git(repo):
    root, commit = repo
    prov_files = code_files(STUDY, root)
    ev = {
        "study": "probe",
        "code_sha256": code_sha256(STUDY, root),
        "code_files": prov_files,
        "git_commit": commit,
    }
    shutil.rmtree(root / ".git")  # per-file hashes need no history
    assert not staleness(ev, STUDY, root).stale
    (root / "gates" / "verdict.py").write_text(
        "ENGINE = 2\n"
    )  # the platform alone: noted, not stale
    found = staleness(ev, STUDY, root)
    assert (
        not found.stale
        and found.files == ()
        and found.note == "1 platform file in gates/ changed too"
    )
    (root / "models" / "probe.py").write_text(
        (root / "models" / "probe.py").read_text() + "# edited\n"
    )
    found = staleness(ev, STUDY, root)
    assert found.stale and found.files == ("models/probe.py",)


def test_unregistered_study_is_stale_with_unknown_files(repo):
    root, commit = repo
    found = staleness(old_evidence(root, commit), None, root)
    assert found.stale and found.files == ("unknown files",)


def test_the_committed_claims_old_evidence_reproduces_from_its_commits():
    """Every frozen committed evidence (tests/fixtures/claims) without per-file hashes: its recorded
    commit's tree in this repository hashes to its recorded code sha256, so the files named stale are
    exactly those that changed."""
    import json

    from gates.study import study_module
    from tests.conftest import FIXTURE_RUNS

    if git("rev-parse", "HEAD") is None:
        pytest.skip("not a git checkout")
    checked = 0
    for path in sorted(FIXTURE_RUNS.glob("*/evidence.json")):
        ev = json.loads(path.read_text())
        if ev.get("code_files") or ev.get("git_dirty") != "false":
            continue
        at = files_at_commit(ev["git_commit"], study_module(ev["study"]))
        if at is None:
            pytest.skip(f"commit {ev['git_commit'][:12]} not available (a shallow clone)")
        assert at[0] == ev["code_sha256"], path
        checked += 1
    assert (
        checked >= 7
    )  # claims of the c05_probe, spr_hash, relation_closure, treeheap_translator, twin_tree studies
