"""A busy MLflow store after Ctrl-C: the interrupted driver and its cancelled tasks close their runs at
the same moment, and SQLite lets one connection write at a time. Closing is tried again while the
store is busy and then left to the next `gates run`; MLflow's logged traceback of each busy try never
reaches the user (the interrupt is what they see), and other errors are still raised."""

from __future__ import annotations

import logging
import sqlite3

import pytest

from gates.errors import storage_error, store_busy
from gates.record import Tracker, close_after_interrupt


@pytest.fixture
def store(tmp_path):
    """(tracker, run id of a RUNNING run, the database file)."""
    path = tmp_path / "mlflow.db"
    tracker = Tracker(f"sqlite:///{path}")
    experiment = tracker.client.create_experiment("busy")
    run = tracker.client.create_run(experiment)
    return tracker, run.info.run_id, path


def hold(path) -> sqlite3.Connection:
    """Another connection holding the database's write lock (as a cancelled task closing its run)."""
    holder = sqlite3.connect(path, isolation_level=None, timeout=0)
    holder.execute("BEGIN EXCLUSIVE")
    return holder


def status(tracker: Tracker, run_id: str) -> str:
    return tracker.client.get_run(run_id).info.status


def test_a_busy_store_is_tried_again_and_the_run_closed_once_it_is_free(store, caplog):
    tracker, run_id, path = store
    holder = hold(path)
    tries = []

    def close():
        tries.append(1)
        try:
            tracker.kill(run_id)
        except Exception as e:
            assert store_busy(e) and storage_error(e) is None
            holder.rollback()  # the other writer is done
            raise

    with caplog.at_level(logging.DEBUG):
        close_after_interrupt(close, wait=0)
    assert len(tries) == 2 and status(tracker, run_id) == "KILLED"
    assert not [r for r in caplog.records if r.exc_info], "MLflow's busy traceback was logged"


def test_a_store_that_stays_busy_leaves_the_run_to_the_next_gates_run(store, caplog, capfd):
    tracker, run_id, path = store
    holder = hold(path)
    with caplog.at_level(logging.DEBUG):
        # one try: each waits out MLflow's own busy timeout (20 s) first
        close_after_interrupt(lambda: tracker.kill(run_id), attempts=1, wait=0)
    holder.rollback()
    assert status(tracker, run_id) == "RUNNING"  # closed as KILLED by the next `gates run`
    assert not [r for r in caplog.records if r.exc_info]
    assert "Traceback" not in capfd.readouterr().err


def test_other_errors_are_raised(store):
    from mlflow.exceptions import MlflowException

    tracker, _, _ = store
    with pytest.raises(MlflowException):  # a run the store does not hold
        close_after_interrupt(lambda: tracker.kill("0" * 32), wait=0)

    def fail():
        raise ValueError("not the store")

    with pytest.raises(ValueError):
        close_after_interrupt(fail, wait=0)
    assert not store_busy(ValueError("database is locked"))  # codes, never English text
