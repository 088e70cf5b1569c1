"""Concurrency and leftovers (issue #17, section 4): one `gates run` per contract at a time, runs a kill
left RUNNING are closed as KILLED by the next run, and evidence files get ordinary permissions.

Real processes and signals: a `gates run` is stopped (SIGSTOP) while it trains, a second one must refuse
with one line naming the first's pid; the first is then SIGKILLed and the next run must close its
RUNNING run as KILLED and finish the contract.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gates.contract import load_contract
from gates.errors import UserError
from gates.record import EVIDENCE, REPORT, atomic_write_text, open_client
from tests.conftest import ROOT, small_c05, write_contract
from tests.helpers import run_contract

pytestmark = pytest.mark.usefixtures("one_thread")


def running_children(db: Path, timeout: float = 30) -> set[str]:
    """Nested (arm x seed) runs that MLflow holds as RUNNING, read straight from the store."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=timeout)
    try:
        return {
            r[0]
            for r in con.execute(
                "SELECT r.run_uuid FROM runs r JOIN tags t ON t.run_uuid = r.run_uuid "
                "WHERE r.status = 'RUNNING' AND t.key = 'gates.role' AND t.value = 'run'"
            )
        }
    finally:
        con.close()


def caught_running(db: Path) -> set[str]:
    try:
        return running_children(db, timeout=1)
    except sqlite3.OperationalError:  # stopped in the middle of a write: let it go on and try again
        return set()


def test_a_second_run_is_refused_and_a_killed_runs_leftovers_are_closed_as_killed(
    tmp_path, monkeypatch
):
    path = write_contract(tmp_path, small_c05(id="c05-lock"), "c05-lock.yaml")
    db = tmp_path / "mlflow.db"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    # the contract sits in the project folder itself: --contracts-dir . (gates run refuses one outside it)
    cmd = [
        sys.executable,
        "-m",
        "gates",
        "run",
        path.name,
        "--contracts-dir",
        ".",
        "--tracking-uri",
        "sqlite:///mlflow.db",
        "--json",
    ]
    first = subprocess.Popen(
        cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    try:
        assert (
            json.loads(first.stdout.readline())["event"] == "run"
        )  # one run finished, the next one trains
        deadline = time.monotonic() + 60
        while True:  # stop it while MLflow holds one of its runs as RUNNING
            first.send_signal(signal.SIGSTOP)
            if caught_running(db) or time.monotonic() > deadline:
                break
            first.send_signal(signal.SIGCONT)
            time.sleep(0.05)
        left_running = running_children(db)
        assert left_running, "the first run was never caught while training"

        second = subprocess.run(
            cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
        )
        assert second.returncode == 2, second.stderr[-2000:]
        assert second.stderr.strip().splitlines() == [
            f"error: another gates run of c05-lock is in progress (pid {first.pid}; lock "
            f"{Path('runs') / '.c05-lock.lock'}); wait for it to finish, or stop it and run again"
        ]
        # it trained nothing: under --json its stdout is the error as one JSON object, no run event
        assert [json.loads(line) for line in second.stdout.splitlines()] == [
            {
                "error": {
                    "code": "user_error",
                    "message": second.stderr.strip()[len("error: ") :],
                    "file": None,
                    "line": None,
                    "field": None,
                }
            }
        ]
    finally:
        first.kill()  # SIGKILL: no clean-up of any kind
        first.wait(timeout=30)
    assert running_children(db) == left_running  # a kill leaves them RUNNING
    assert (tmp_path / "runs" / ".c05-lock.lock").exists()  # and its lock file (no longer locked)

    monkeypatch.chdir(tmp_path)
    # an absolute URI: MLflow caches engines by URI, and a relative one may still point at another test's folder
    evidence = run_contract(load_contract(path.name), f"sqlite:///{db}", Path("runs"))
    with sqlite3.connect(db) as con:  # nothing is left RUNNING: no arm x seed, no parent run
        assert con.execute("SELECT count(*) FROM runs WHERE status = 'RUNNING'").fetchone()[0] == 0
    client = open_client(f"sqlite:///{db}")
    for run_id in left_running:
        run = client.get_run(run_id)
        assert run.info.status == "KILLED" and run.data.tags["gates.status"] == "killed"
    assert not {r.mlflow_run_id for r in evidence.runs} & left_running  # redone, not reused
    assert len(evidence.runs) == 12
    parent = client.get_run(evidence.mlflow.parent_run_id)
    assert parent.info.status == "FINISHED"
    assert not (tmp_path / "runs" / ".c05-lock.lock").exists()  # a clean exit removes its lock file
    umask = os.umask(0)
    os.umask(umask)
    for name in (EVIDENCE, REPORT):
        assert (
            stat.S_IMODE((tmp_path / "runs" / "c05-lock" / name).stat().st_mode) == 0o666 & ~umask
        )


def test_runs_left_running_by_a_dead_gates_run_are_closed_under_any_parent(tmp_path, monkeypatch):
    """After a code change the next run opens a new parent run; the killed run's RUNNING runs under the old
    parent are closed too, when their owner process is gone. A live owner's runs and runs without an owner
    (a distributed worker's) are left alone."""
    import socket

    data = small_c05(id="c05-owner")
    data["budget"] = {"steps": 20, "eval_every": 10}
    data["preflight"]["falsifiable_point"]["by_step"] = 20
    data["stop_rules"] = {"divergence": {"metrics": ["train_loss"]}}
    path = write_contract(tmp_path, data, "c05-owner.yaml")
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    evidence = run_contract(load_contract(path.name), uri, Path("runs"))
    client = open_client(uri)
    experiment = evidence.mlflow.experiment_id
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    host = socket.gethostname()

    def left(owner: str | None, role: str, parent: str | None = None) -> str:
        tags = {
            "gates.role": role,
            **({"gates.local_owner": owner} if owner else {}),
            **({"mlflow.parentRunId": parent} if parent else {}),
        }
        return client.create_run(experiment, tags=tags).info.run_id  # RUNNING

    old_parent = left(
        f"{host}:{dead.stdout.strip()}", "contract"
    )  # an older code's parent, its process killed
    abandoned = left(f"{host}:{dead.stdout.strip()}", "run", old_parent)
    live = left(
        f"{host}:{os.getppid()}", "run", old_parent
    )  # a live process (another --runs-dir, say)
    worker = left(None, "run", old_parent)  # a distributed worker's
    run_contract(
        load_contract(path.name), uri, Path("runs")
    )  # the same code: every arm x seed reused
    status = {r: client.get_run(r).info.status for r in (old_parent, abandoned, live, worker)}
    assert status == {old_parent: "KILLED", abandoned: "KILLED", live: "RUNNING", worker: "RUNNING"}
    assert client.get_run(abandoned).data.tags["gates.status"] == "killed"


def test_the_lock_is_per_contract_and_released_on_exit(tmp_path):
    from gates.execution._locks import contract_lock

    runs = tmp_path / "runs"
    with contract_lock(runs, "a"):
        with pytest.raises(UserError) as info:
            with contract_lock(runs, "a"):
                pass
        assert info.value.render().startswith(
            f"another gates run of a is in progress (pid {os.getpid()}; "
        )
        with contract_lock(runs, "b"):  # another contract runs alongside
            pass
    with contract_lock(runs, "a"):  # released
        pass
    assert sorted(p.name for p in runs.iterdir()) == []


def test_a_runs_folder_that_cannot_be_made_is_a_one_line_error(tmp_path):
    from gates.execution._locks import contract_lock

    (tmp_path / "runs").write_text("a file where the runs folder belongs")
    with pytest.raises(UserError) as info:
        with contract_lock(tmp_path / "runs", "a"):
            pass
    assert info.value.render() == (
        f"{tmp_path / 'runs'}: cannot create the runs folder (File exists); expected a "
        f"writable folder (--runs-dir)"
    )


@pytest.mark.parametrize("umask", [0o022, 0o027, 0o002])
def test_evidence_files_honour_the_umask(tmp_path, umask):
    before = os.umask(umask)
    try:
        atomic_write_text(tmp_path / "runs" / "x" / EVIDENCE, "{}\n")
    finally:
        os.umask(before)
    mode = stat.S_IMODE((tmp_path / "runs" / "x" / EVIDENCE).stat().st_mode)
    assert mode == 0o666 & ~umask  # 0644 under umask 022, never mkstemp's 0600
    assert sorted(p.name for p in (tmp_path / "runs" / "x").iterdir()) == [EVIDENCE]
