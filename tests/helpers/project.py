"""Temporary projects as tests build them: a folder with contracts/ and runs/, empty, holding copies of
the frozen claims, a copy of another (recorded) project, or contracts run into it; in a git repository
when asked. tests/conftest.py's `make_project` fixture builds them in fresh temporary folders."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path


def new_project(
    folder: Path,
    *contracts: dict | Path,
    record: bool | Iterable[str] = True,
    claims: bool | Iterable[str] = (),
    copy_of: Path | None = None,
    tracking_uri: str | None = None,
    git: bool = False,
) -> Path:
    """A project in `folder` (or in folder/project with `claims`, as tests.conftest.copy_claims makes it):
    its root.

    claims: copies of these frozen claims (True: all of them), indexed and brought to today's verdict
    engine (copy_claims). copy_of: a copy of that project (a module fixture's recorded one, that one test
    may change). Otherwise contracts/ and runs/, empty.
    contracts: written to contracts/ (a dict as <id>.yaml, a file copied under its name), then recorded
    in this process as `gates run` in the project would (record=True: each of them; a collection of
    ids: those; False: none), into runs/ and the MLflow store `tracking_uri` (the project's mlflow.db
    by its absolute path unless given: "sqlite:///mlflow.db" is what `gates run` records by default).
    git: the project committed to a git repository of its own (`committed`)."""
    from tests.conftest import copy_claims, write_contract

    if copy_of is not None:
        assert not claims, "a copy of a project or of frozen claims, not both"
        root = Path(shutil.copytree(copy_of, folder, dirs_exist_ok=True))
    elif claims:
        root = copy_claims(folder, *(() if claims is True else claims))
    else:
        root = folder
    (root / "contracts").mkdir(parents=True, exist_ok=True)
    (root / "runs").mkdir(exist_ok=True)
    ids = []
    for contract in contracts:
        if isinstance(contract, dict):
            write_contract(root / "contracts", contract, f"{contract['id']}.yaml")
            ids.append(contract["id"])
        else:
            shutil.copy(contract, root / "contracts")
            ids.append(Path(contract).stem)
    if record:
        run_contracts(root, *(ids if record is True else record), tracking_uri=tracking_uri)
    if git:
        committed(root)
    return root


def run_contracts(root: Path, *contract_ids: str, tracking_uri: str | None = None) -> None:
    """contracts/<id>.yaml of each, run in `root` (its working folder, as `gates run` there) in this
    process: recorded into root/runs and the MLflow store `tracking_uri` (root/mlflow.db unless given)."""
    from gates.contract import load_contract
    from tests.helpers import run_contract

    uri = tracking_uri or f"sqlite:///{root / 'mlflow.db'}"
    cwd = os.getcwd()
    os.chdir(root)  # evidence records contract paths relative to the project, as `gates run` does
    try:
        for contract_id in contract_ids:
            run_contract(load_contract(f"contracts/{contract_id}.yaml"), uri, root / "runs")
    finally:
        os.chdir(cwd)


def committed(root: Path, message: str | None = None) -> Path:
    """`root` committed (every file but the MLflow store) to a git repository of its own, by a
    throwaway identity; the commit's subject `message`, or "recorded" and its contract ids."""
    if message is None:
        ids = sorted(p.stem for p in (root / "contracts").glob("*.yaml"))
        message = " ".join(["recorded", *ids])
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }
    (root / ".gitignore").write_text("mlflow.db\nmlruns/\n")
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", message]):
        done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, env=env)
        assert done.returncode == 0, done.stderr
    return root
