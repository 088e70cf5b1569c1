"""Throughput of the plan's backends at equal cores: the same small C05 contract run by the local
process pool (`gates run --jobs N`) and by the Ray executor (`gates run --executor ray`) on a local Ray
instance of N CPUs, N = 1 and 2, on this machine, into one SQLite MLflow store; then the time from
SIGKILLing the Ray worker process of a running task to its retry's run starting.

    python benchmarks/distributed_throughput.py [--seeds 3] [--steps 2000] [--no-kill]
        [--json benchmarks/results/distributed_throughput.json]

Both start their processes before the run and have the platform imported in them (the pool's N
processes, Ray's one worker per CPU), so start-up is not counted; "wall" runs from the first job
submitted to the last record back in the driver, "busy" from the first run's start to the last run's
end (MLflow's times). Per backend and slot count: jobs per minute (jobs / wall) and overhead per job,
(wall x slots - the runs' own training seconds) / jobs: what a job costs beyond its training (the
scheduler, MLflow, starting the study, idle slots). The ratio Ray / pool of jobs per minute is the
number to watch (target: within 20%, i.e. at least 0.8).
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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# the local Ray instances listen on loopback only: Ray reads the switch on its first import
from gates.execution._ray import LOOPBACK_ONLY  # noqa: E402

os.environ.update({k: os.environ.get(k, v) for k, v in LOOPBACK_ONLY.items()})

from gates.contract import load_contract  # noqa: E402
from tests.conftest import small_c05, write_contract  # noqa: E402


def contract(contract_id: str, seeds: int, steps: int) -> dict:
    data = small_c05(id=contract_id)
    for cfg in data["arms"].values():
        cfg.update(train_trees=400, test_trees=60)
    data["seeds"] = list(range(seeds))
    data["budget"] = {"steps": steps, "eval_every": 20}
    data["preflight"]["falsifiable_point"]["by_step"] = steps
    return data


def wait_for(condition, timeout: float, what: str, poll: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(poll)
    raise TimeoutError(f"no {what} within {timeout:g} s")


def rates(result: dict, slots: int) -> dict:
    """Jobs per minute, and overhead per job: the slot-seconds of the wall time not spent training."""
    return {
        **result,
        "slots": slots,
        "jobs_per_min": 60 * result["jobs"] / result["wall"],
        "overhead_per_job": (result["wall"] * slots - result["trained_s"]) / result["jobs"],
    }


class Clock:
    """A progress sink that notes when the first job was submitted and the last record came back."""

    def __init__(self):
        self.first = self.last = None

    def start(self, arm, seed, steps, skipped=None):
        self.first = self.first or time.time()

    def update(self, arm, seed, step, metrics):
        pass

    def end(self, record):
        self.last = time.time()


def measured(outcome, clock: Clock, uri: str, slots: int) -> dict:
    from mlflow import MlflowClient

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


# ---------------------------------------------------------------------------------- the pool
def pool_run(folder: Path, slots: int, data: dict, uri: str) -> dict:
    from gates.execution import ProcessBackend, run_plan

    with ProcessBackend(slots) as backend:
        # every process started (each takes one wait) and the platform imported (its initializer)
        for done in [backend.pool.submit(time.sleep, 1) for _ in range(slots)]:
            done.result()
        path = write_contract(folder / "contracts", data, f"{data['id']}.yaml")
        clock = Clock()
        outcome = run_plan(
            load_contract(path), uri, folder / "runs", jobs=slots, processes=backend, progress=clock
        )
    return measured(outcome, clock, uri, slots)


# ---------------------------------------------------------------------------------- Ray
def start_ray(slots: int):
    import ray

    from gates.execution import starting_local_instance

    with starting_local_instance():  # as `gates run --executor ray` starts its own
        ray.init(
            address="local",
            num_cpus=slots,
            include_dashboard=False,
            log_to_driver=False,
            logging_level=logging.ERROR,
        )

    @ray.remote(num_cpus=1)
    def warm():  # (defined here: Ray ships it by value, whatever imported this file)
        import gates.execution._jobs  # noqa: F401

        time.sleep(1)

    ray.get([warm.remote() for _ in range(slots)])  # one worker per CPU, the platform imported
    return ray


def ray_run(folder: Path, slots: int, data: dict, uri: str) -> dict:
    from gates.execution import run_plan

    ray = start_ray(slots)
    try:
        path = write_contract(folder / "contracts", data, f"{data['id']}.yaml")
        clock = Clock()
        outcome = run_plan(
            load_contract(path), uri, folder / "runs", executor="ray", progress=clock
        )
    finally:
        ray.shutdown()
    return measured(outcome, clock, uri, slots)


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
    from mlflow import MlflowClient

    from gates.execution import run_plan

    ray = start_ray(1)
    client = MlflowClient(uri)
    try:
        path = write_contract(folder / "contracts", data, f"{data['id']}.yaml")
        outcome: list = []

        def drive():
            try:
                outcome.append(run_plan(load_contract(path), uri, folder / "runs", executor="ray"))
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


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--seeds", type=int, default=3, help="seeds per arm (4 arms): jobs = 4 x seeds"
    )
    parser.add_argument(
        "--steps", type=int, default=2000, help="training steps per job (about 1 s per 400)"
    )
    parser.add_argument("--slots", default="1,2", help="slot counts (processes, Ray CPUs)")
    parser.add_argument(
        "--no-kill", action="store_true", help="skip the Ray worker kill-and-retry timing"
    )
    parser.add_argument("--json", type=Path, help="also write every number to this file")
    args = parser.parse_args(argv)
    slot_counts = [int(n) for n in args.slots.split(",")]
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)  # each job on one thread: N slots on N cores
    folder = Path(tempfile.mkdtemp(prefix="gates-bench-dist-"))
    (folder / "contracts").mkdir()
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    results: dict = {
        "seeds": args.seeds,
        "steps": args.steps,
        "jobs": 4 * args.seeds,
        "cpu_cores": os.cpu_count(),
        "store": "sqlite",
    }
    started = time.perf_counter()

    def say(name: str, r: dict) -> None:
        print(
            f"{name}: {r['jobs']} jobs, wall {r['wall']:.1f} s, busy {r['busy']:.1f} s, "
            f"{r['jobs_per_min']:.1f} jobs/min, overhead {r['overhead_per_job']:.2f} s/job",
            flush=True,
        )

    print(
        f"{4 * args.seeds} jobs of {args.steps} steps; {os.cpu_count()} CPU cores; {uri}",
        flush=True,
    )
    results["cpu_parallelism_before"] = cpu_parallelism()
    # the backends side by side at each slot count, so that both see the machine as it is then
    for n in slot_counts:
        results[f"pool_{n}"] = r = pool_run(
            folder, n, contract(f"bench-pool{n}", args.seeds, args.steps), uri
        )
        say(f"pool, {n} process(es)", r)
        results[f"ray_{n}"] = r = ray_run(
            folder, n, contract(f"bench-ray{n}", args.seeds, args.steps), uri
        )
        say(f"Ray, {n} CPU(s)", r)
        ratio = r["jobs_per_min"] / results[f"pool_{n}"]["jobs_per_min"]
        results[f"ratio_ray_to_pool_{n}"] = ratio
        print(
            f"Ray / pool at {n} slot(s): {ratio:.2f}x jobs/min "
            f"({'within' if ratio >= 0.8 else 'NOT within'} 20%)",
            flush=True,
        )
    if not args.no_kill:
        kill = ray_kill_and_retry(folder, contract("bench-ray-kill", args.seeds, args.steps), uri)
        results["ray_kill"] = kill
        print(f"SIGKILL of a Ray task's worker -> its retry's run starts: {kill['retried']:.2f} s")
    results["cpu_parallelism_after"] = ideal = cpu_parallelism()
    print(
        f"two CPU-bound processes gain {results['cpu_parallelism_before']:.2f}x (before), "
        f"{ideal:.2f}x (after) over one on this machine (the ceiling)"
    )
    results["seconds"] = round(time.perf_counter() - started, 1)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
        print(f"wrote {args.json}")
    return results


if __name__ == "__main__":
    main()
