"""Distributed throughput: the same small C05 contract run by 1 `gates worker`, then by 2, on the
deployment the README describes (PostgreSQL as Optuna's storage, an `mlflow server` on PostgreSQL),
all on this machine; then the time from SIGKILLing a worker mid-job to its job being failed as stale,
re-enqueued and re-claimed by a living worker.

    python benchmarks/distributed_throughput.py [--seeds 3] [--steps 2000] [--heartbeat 1]

PostgreSQL: `$GATES_TEST_PG_URL` (a user that may create databases), else a throwaway cluster started
with the machine's initdb/pg_ctl (Debian package `postgresql`). Workers are started before the jobs are
enqueued and idle-poll, so process start-up is not counted; "wall" runs from the enqueue to the last
completed job, "busy" from the first claim to the last completion.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gates.contract import load_contract
from gates.execution import grace_seconds, open_storage, run_distributed
from tests.conftest import small_c05, write_contract  # noqa: E402
from tests.test_distributed import (
    databases,
    mlflow_server,
    postgres_server,
    running_job,  # noqa: E402
    start_worker,
    stop_all,
    trials,
    wait_for,
)


def contract(contract_id: str, seeds: int, steps: int) -> dict:
    data = small_c05(id=contract_id)
    for cfg in data["arms"].values():
        cfg.update(train_trees=400, test_trees=60)
    data["seeds"] = list(range(seeds))
    data["budget"] = {"steps": steps, "eval_every": 20}
    data["preflight"]["falsifiable_point"]["by_step"] = steps
    return data


def enqueue(folder: Path, data: dict, storage_url: str, uri: str, heartbeat: int):
    path = write_contract(folder / "contracts", data, f"{data['id']}.yaml")
    loaded = load_contract(path)
    queued = run_distributed(
        loaded, uri, folder / "runs", storage_url, wait=False, heartbeat=heartbeat
    )
    return queued, time.time()


def timed_run(
    folder: Path, n_workers: int, data: dict, storage_url: str, uri: str, heartbeat: int
) -> dict:
    from optuna.trial import TrialState

    procs = [start_worker(storage_url, folder, f"{data['id']}-w{i}")[0] for i in range(n_workers)]
    storage = open_storage(storage_url, heartbeat)
    try:
        time.sleep(3)  # workers up and polling before anything is queued
        queued, enqueued_at = enqueue(folder, data, storage_url, uri, heartbeat)
        n = len(queued.enqueued)

        def all_done():
            done = [t for t in trials(storage, queued.study_name) if t.state == TrialState.COMPLETE]
            return done if len(done) == n else None

        done = wait_for(all_done, 1800, f"{n} jobs", poll=0.2)
    finally:
        stop_all(procs)
    last = max(t.datetime_complete.timestamp() for t in done)
    first = min(t.system_attrs["gates.claimed_at"] for t in done)
    workers = {t.system_attrs["gates.worker"] for t in done}
    return {
        "jobs": n,
        "wall": last - enqueued_at,
        "busy": last - first,
        "workers_used": len(workers),
    }


def kill_and_reclaim(folder: Path, data: dict, storage_url: str, uri: str, heartbeat: int) -> dict:
    from optuna.trial import TrialState

    started = [
        start_worker(storage_url, folder, f"{data['id']}-w{i}", "--heartbeat", str(heartbeat))
        for i in range(2)
    ]
    procs = {p.pid: p for p, _ in started}
    storage = open_storage(storage_url, heartbeat)
    try:
        time.sleep(3)
        queued, _ = enqueue(folder, data, storage_url, uri, heartbeat)
        trial, pid = wait_for(
            lambda: running_job(storage, queued.study_name, procs), 300, "a running job"
        )
        os.kill(pid, signal.SIGKILL)
        killed_at, killed_clock = time.time(), datetime.now()
        job = trial.user_attrs["job"]

        def reclaimed():
            return [
                t
                for t in trials(storage, queued.study_name)
                if t.user_attrs.get("job") == job
                and t.state in (TrialState.RUNNING, TrialState.COMPLETE)
                and t.system_attrs.get("retry_history") == [trial.number]
            ]  # (a WAITING copy inherits attrs)

        retry = wait_for(reclaimed, 300, "the re-claim", poll=0.05)[0]
        failed = storage.get_trial(trial._trial_id)
        assert failed.state == TrialState.FAIL
    finally:
        stop_all(procs.values())
    return {
        "stale": (failed.datetime_complete - killed_clock).total_seconds(),
        "reclaimed": retry.system_attrs["gates.claimed_at"] - killed_at,
    }


SPIN = "x = 0\nfor i in range(20_000_000):\n    x += i\n"


def cpu_parallelism() -> float:
    """What 2 processes can gain over 1 on this machine right now (2.0 on 2 idle cores): the same
    CPU-bound loop once alone, then twice at the same time."""
    import subprocess

    def spin(n: int) -> float:
        started = time.perf_counter()
        procs = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(n)]
        for p in procs:
            p.wait()
        return time.perf_counter() - started

    return 2 * spin(1) / spin(2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--seeds", type=int, default=3, help="seeds per arm (4 arms): jobs = 4 x seeds"
    )
    parser.add_argument(
        "--steps", type=int, default=2000, help="training steps per job (about 1 s per 400)"
    )
    parser.add_argument(
        "--heartbeat", type=int, default=1, help="heartbeat interval for the kill test (s)"
    )
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    folder = Path(tempfile.mkdtemp(prefix="gates-bench-dist-"))
    (folder / "contracts").mkdir()
    with (
        postgres_server() as admin,
        databases(admin, "optuna", "mlflow") as (storage_url, mlflow_db),
        mlflow_server(mlflow_db, folder / "artifacts") as uri,
    ):
        print(
            f"PostgreSQL + mlflow server {uri}; {4 * args.seeds} jobs of {args.steps} steps; "
            f"{os.cpu_count()} CPU cores",
            flush=True,
        )
        one = timed_run(
            folder, 1, contract("bench-one", args.seeds, args.steps), storage_url, uri, 10
        )
        print(
            f"1 worker : {one['jobs']} jobs, wall {one['wall']:.1f} s, busy {one['busy']:.1f} s",
            flush=True,
        )
        two = timed_run(
            folder, 2, contract("bench-two", args.seeds, args.steps), storage_url, uri, 10
        )
        print(
            f"2 workers: {two['jobs']} jobs, wall {two['wall']:.1f} s, busy {two['busy']:.1f} s "
            f"({two['workers_used']} workers took jobs)",
            flush=True,
        )
        ideal = cpu_parallelism()
        print(
            f"throughput 2 workers / 1 worker: {one['wall'] / two['wall']:.2f}x (wall), "
            f"{one['busy'] / two['busy']:.2f}x (busy); two CPU-bound processes gain {ideal:.2f}x over one on "
            f"this machine now (the ceiling)",
            flush=True,
        )
        kill = kill_and_reclaim(
            folder, contract("bench-kill", args.seeds, args.steps), storage_url, uri, args.heartbeat
        )
        print(
            f"SIGKILL mid-job -> failed as stale and re-enqueued: {kill['stale']:.2f} s; -> re-claimed: "
            f"{kill['reclaimed']:.2f} s (heartbeat {args.heartbeat} s, grace "
            f"{grace_seconds(args.heartbeat)} s)",
            flush=True,
        )


if __name__ == "__main__":
    main()
