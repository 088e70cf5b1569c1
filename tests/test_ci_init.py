"""CI in a researcher's own project (issue #42): `gates ci init` writes a workflow whose commands, run in
a fresh project of the example study (examples/my_study, installed in a site folder), pass while every
claim holds its evidence and fail once one does not."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from gates.verify import WORKFLOW_PATH, workflow
from gates.verify._workflow import workflow_commands
from tests.conftest import git
from tests.helpers import gates
from tests.test_plugin_study import CONTRACT, EXAMPLE, install_dist

INSTALLS = 2  # the workflow's install commands: CPU torch, then the project (need a package index)


@pytest.fixture
def project(tmp_path, make_project) -> tuple[Path, Path]:
    """(site folder with examples/my_study installed, a git project with its example contract run)."""
    site = tmp_path / "site"
    meta = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())["project"]
    install_dist(site, meta["name"], meta["version"], meta["entry-points"]["gates.studies"])
    shutil.copytree(EXAMPLE / "my_study", site / "my_study")
    root = make_project(CONTRACT, record=False, name="circle")
    done = gates(root, "run", f"contracts/{CONTRACT.name}", site=site)
    assert done.returncode == 0, done.stdout + done.stderr
    return site, root


def run_in_ci(site: Path, root: Path, command: str) -> subprocess.CompletedProcess:
    """A workflow command as CI runs it: bash in the checkout, `gates` on the PATH."""
    env = {
        **os.environ,
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]),
        "PYTHONPATH": str(site),
    }
    return subprocess.run(
        ["bash", "-c", command], cwd=root, capture_output=True, text=True, env=env, timeout=600
    )


def test_the_workflow_passes_while_claims_hold_and_fails_when_one_loses_its_evidence(project):
    site, root = project
    done = gates(root, "ci", "init", "--audit-seconds", "60", site=site)
    assert done.returncode == 0, done.stderr
    text = (root / WORKFLOW_PATH).read_text()
    assert text == workflow(audit_seconds=60)
    git(root, "init", "-q")
    git(root, "add", ".")  # the workflow, the contract and runs/ (not the MLflow store: see below)
    git(root, "rm", "-q", "--cached", "mlflow.db")
    git(root, "commit", "-qm", "circle-quadratic with its evidence")

    commands = workflow_commands(text)
    assert commands[:INSTALLS] == [
        "pip install torch --index-url https://download.pytorch.org/whl/cpu",
        "pip install -e .",
    ]
    assert commands[INSTALLS:] == ["gates verify --audit-seconds 60"]
    (root / "mlflow.db").unlink()  # a fresh checkout: no store, no cache
    for command in commands[INSTALLS:]:
        ran = run_in_ci(site, root, command)
        assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "1 of 1 claims hold their evidence" in ran.stdout
    assert "audit:" in ran.stdout  # the audit re-ran recorded runs

    evidence = root / "runs" / "circle-quadratic" / "evidence.json"
    data = json.loads(evidence.read_text())
    data["runs"][0]["metrics"]["test_acc"] = 0.99  # a forged value, committed
    evidence.write_text(json.dumps(data, indent=2))
    git(root, "commit", "-qam", "a better number")
    ran = run_in_ci(site, root, commands[-1])
    assert ran.returncode == 1 and "LOST circle-quadratic" in ran.stdout, ran.stdout


def test_init_never_overwrites_unasked_and_takes_the_project_s_options(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    first = gates(tmp_path, "ci", "init", site=site)
    assert first.returncode == 0, first.stderr
    again = gates(tmp_path, "ci", "init", "--replay", site=site)
    assert again.returncode == 2 and "exists; expected --force" in again.stderr
    assert "Traceback" not in again.stderr
    forced = gates(
        tmp_path,
        *("ci", "init", "--force", "--replay", "--strict-code", "--corpus", "tatoeba:en"),
        *("--install", "pip install -e .[studies]", "--audit-seconds", "0"),
        site=site,
    )
    assert forced.returncode == 0, forced.stderr
    commands = workflow_commands((tmp_path / WORKFLOW_PATH).read_text())
    assert commands == [
        "pip install torch --index-url https://download.pytorch.org/whl/cpu",
        "pip install -e .[studies]",
        "gates data fetch tatoeba:en",
        "gates verify --replay --strict-code",
    ]
