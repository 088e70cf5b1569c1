"""Distributed throughput: the same small C05 contract run by 1 `gates worker`, then by 2, on the
deployment the README describes (PostgreSQL as Optuna's storage, an `mlflow server` on PostgreSQL),
all on this machine; then the time from SIGKILLing a worker mid-job to its job being failed as stale,
re-enqueued and re-claimed by a living worker. Beside them the Ray executor (`gates run --executor
ray`) on a local Ray instance of 1, then 2 CPUs, into the same `mlflow server`, and the time from
SIGKILLing the Ray worker process of a running task to its retry's run starting.

    python benchmarks/distributed_throughput.py [--seeds 3] [--steps 2000] [--heartbeat 1]
        [--executors postgres,ray] [--json benchmarks/results/distributed_throughput.json]

PostgreSQL: `$GATES_TEST_PG_URL` (a user that may create databases), else a throwaway cluster started
with the machine's initdb/pg_ctl (Debian package `postgresql`). Workers are started before the jobs are
enqueued and idle-poll, so process start-up is not counted; "wall" runs from the enqueue to the last
completed job, "busy" from the first claim to the last completion. Ray likewise: the instance is
started and its worker processes are up (one per CPU, the platform imported) before the run, "wall"
runs from the first task submitted to the last record back in the driver, "busy" from the first run's
start to the last run's end (MLflow's times). Per executor and slot count: jobs per minute (jobs /
wall) and overhead per job, (wall x slots - the runs' own training seconds) / jobs: what a job costs
beyond its training (the queue or the scheduler, MLflow, starting the study, idle slots).
"""

from __future__ import annotations

import argparse
import glob
import json
import logging
import os
import signal
import sys
import tempfile
import threading
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
    return rates(
        {
            "jobs": n,
            "wall": last - enqueued_at,
            "busy": last - first,
            "workers_used": len(workers),
            "trained_s": sum(t.user_attrs["record"]["seconds"] for t in done),
        },
        n_workers,
    )


def rates(result: dict, slots: int) -> dict:
    """Jobs per minute, and overhead per job: the slot-seconds of the wall time not spent training."""
    return {
        **result,
        "slots": slots,
        "jobs_per_min": 60 * result["jobs"] / result["wall"],
        "overhead_per_job": (result["wall"] * slots - result["trained_s"]) / result["jobs"],
    }


# ---------------------------------------------------------------------------------- Ray
class Clock:
    """A progress sink that notes when the first task was submitted and the last record came back."""

    def __init__(self):
        self.first = self.last = None

    def start(self, arm, seed, steps, skipped=None):
        self.first = self.first or time.time()

    def update(self, arm, seed, step, metrics):
        pass

    def end(self, record):
        self.last = time.time()


def warm_ray_workers(ray, slots: int) -> None:
    """One idle worker process per CPU with the platform imported, as idle `gates worker`s have it."""

    @ray.remote(num_cpus=1)
    def warm():
        import gates.execution._ray  # noqa: F401

        time.sleep(1)

    ray.get([warm.remote() for _ in range(slots)])


def ray_run(folder: Path, slots: int, data: dict, uri: str) -> dict:
    import ray
    from mlflow import MlflowClient

    from gates.execution import run_ray, starting_local_instance

    with starting_local_instance():  # workers at normal priority, as `gates run --executor ray`
        ray.init(
            address="local",
            num_cpus=slots,
            include_dashboard=False,
            log_to_driver=False,
            logging_level=logging.ERROR,
        )
    try:
        warm_ray_workers(ray, slots)
        path = write_contract(folder / "contracts", data, f"{data['id']}.yaml")
        clock = Clock()
        outcome = run_ray(load_contract(path), uri, folder / "runs", progress=clock)
    finally:
        ray.shutdown()
    client = MlflowClient(uri)
    runs = [client.get_run(r.mlflow_run_id).info for r in outcome.evidence.runs]
    return rates(
        {
            "jobs": len(runs),
            "wall": clock.last - clock.first,
            "busy": (max(r.end_time for r in runs) - min(r.start_time for r in runs)) / 1000,
            "trained_s": sum(r.seconds for r in outcome.evidence.runs),
        },
        slots,
    )


def _descends_from(pid: int, ancestor: int) -> bool:
    while pid > 1:
        if pid == ancestor:
            return True
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            return False
    return False


def running_ray_task() -> int | None:
    """The pid of a Ray worker process of ours running a job (Ray titles it by the task's name,
    `ray::gates ARM/seedN`)."""
    for path in glob.glob("/proc/[0-9]*/cmdline"):
        try:
            title = Path(path).read_bytes().split(b"\0")[0]
        except OSError:
            continue
        pid = int(path.split("/")[2])
        if title.startswith(b"ray::gates ") and _descends_from(pid, os.getpid()):
            return pid
    return None


def ray_kill_and_retry(folder: Path, data: dict, uri: str) -> dict:
    """One CPU (one task at a time): SIGKILL the worker process once its run has started in MLflow,
    then the time until the retry's run of the same arm x seed starts."""
    import ray
    from mlflow import MlflowClient

    from gates.execution import run_ray, starting_local_instance

    with starting_local_instance():  # workers at normal priority, as `gates run --executor ray`
        ray.init(
            address="local",
            num_cpus=1,
            include_dashboard=False,
            log_to_driver=False,
            logging_level=logging.ERROR,
        )
    client = MlflowClient(uri)
    try:
        warm_ray_workers(ray, 1)
        path = write_contract(folder / "contracts", data, f"{data['id']}.yaml")
        outcome: list = []

        def drive():
            try:
                outcome.append(run_ray(load_contract(path), uri, folder / "runs"))
            except BaseException as e:  # said by the main thread
                outcome.append(e)

        driver = threading.Thread(target=drive)
        driver.start()

        def children():
            exp = client.get_experiment_by_name(data["id"])
            if exp is None:
                return []
            found = client.search_runs([exp.experiment_id], "tags.`gates.role` = 'run'")
            return [(r.info, r.data.tags) for r in found]

        def started():
            if not driver.is_alive():
                raise AssertionError(
                    f"the run ended before a task was seen running: {outcome!s:.300}"
                )
            running = [(i, t) for i, t in children() if i.status == "RUNNING"]
            pid = running_ray_task()
            return (running[0], pid) if running and pid else None

        (info, tags), pid = wait_for(started, 300, "a running task", poll=0.05)
        os.kill(pid, signal.SIGKILL)
        killed_at = time.time()
        job = (tags["gates.arm"], tags["gates.seed"])

        def retried():
            return [
                i
                for i, t in children()
                if (t["gates.arm"], t["gates.seed"]) == job and i.run_id != info.run_id
            ]

        retry = wait_for(retried, 300, "the retry", poll=0.05)[0]
        driver.join()
    finally:
        ray.shutdown()
    assert outcome and getattr(outcome[0], "recorded", False), (
        f"the Ray run did not finish: {outcome!s:.300}"
    )
    return {"retried": retry.start_time / 1000 - killed_at}


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
    parser.add_argument(
        "--executors",
        default="postgres,ray",
        help="what to measure: postgres (gates workers on PostgreSQL), ray (Ray tasks), or both",
    )
    parser.add_argument("--json", type=Path, help="also write every number to this file")
    args = parser.parse_args()
    executors = set(args.executors.split(","))
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)  # each job on one thread: 1 and 2 slots on the 2 cores
    folder = Path(tempfile.mkdtemp(prefix="gates-bench-dist-"))
    (folder / "contracts").mkdir()
    results: dict = {
        "seeds": args.seeds,
        "steps": args.steps,
        "jobs": 4 * args.seeds,
        "cpu_cores": os.cpu_count(),
    }
    started = time.perf_counter()

    def say(name: str, r: dict) -> None:
        print(
            f"{name}: {r['jobs']} jobs, wall {r['wall']:.1f} s, busy {r['busy']:.1f} s, "
            f"{r['jobs_per_min']:.1f} jobs/min, overhead {r['overhead_per_job']:.2f} s/job",
            flush=True,
        )

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
        # the executors side by side at each slot count, so that both see the machine as it is then
        results["cpu_parallelism_before"] = cpu_parallelism()
        for n in (1, 2):
            if "postgres" in executors:
                data = contract(f"bench-pg{n}", args.seeds, args.steps)
                results[f"postgres_{n}"] = r = timed_run(folder, n, data, storage_url, uri, 10)
                say(f"{n} gates worker(s)", r)
            if "ray" in executors:
                data = contract(f"bench-ray{n}", args.seeds, args.steps)
                results[f"ray_{n}"] = r = ray_run(folder, n, data, uri)
                say(f"Ray, {n} CPU(s)", r)
        for name, key in (("2 workers / 1 worker", "postgres"), ("Ray 2 CPUs / 1 CPU", "ray")):
            if key in executors:
                one, two = results[f"{key}_1"], results[f"{key}_2"]
                print(
                    f"throughput {name}: {one['wall'] / two['wall']:.2f}x (wall), "
                    f"{one['busy'] / two['busy']:.2f}x (busy)",
                    flush=True,
                )
        if "postgres" in executors:
            kill = kill_and_reclaim(
                folder,
                contract("bench-kill", args.seeds, args.steps),
                storage_url,
                uri,
                args.heartbeat,
            )
            results["postgres_kill"] = {**kill, "heartbeat": args.heartbeat}
            print(
                f"SIGKILL mid-job -> failed as stale and re-enqueued: {kill['stale']:.2f} s; -> "
                f"re-claimed: {kill['reclaimed']:.2f} s (heartbeat {args.heartbeat} s, grace "
                f"{grace_seconds(args.heartbeat)} s)",
                flush=True,
            )
        if "ray" in executors:
            kill = ray_kill_and_retry(folder, contract("bench-ray-kill", 2, args.steps), uri)
            results["ray_kill"] = kill
            print(
                f"SIGKILL of a Ray task's worker -> its retry's run starts: {kill['retried']:.2f} s"
            )
    results["cpu_parallelism_after"] = ideal = cpu_parallelism()
    print(
        f"two CPU-bound processes gain {results['cpu_parallelism_before']:.2f}x (before), "
        f"{ideal:.2f}x (after) over one on this machine (the ceiling)"
    )
    results["seconds"] = round(time.perf_counter() - started, 1)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
