"""`run_plan`, the one entry point that runs a contract's plan: preflight, tuning, every arm x seed
look by look under the stop rules, the verdict and evidence (gates/execution/_tasks.py drives it), on
one of its backends, as Optuna has storages:

- inline: each job in this process (a plain `gates run`; `jobs=1`);
- processes: N local processes (`jobs=N`, gates/execution/_processes.py);
- Ray: Ray tasks on a local instance or a cluster (`executor="ray"`, gates/execution/_ray.py).

Whichever runs them, a job computes on the driver's thread count, so a run's metrics are a single
process's on that many threads. `execute`, `run_contract`, `run_processes` and `run_ray` are the names
callers knew before there was one entry point: thin wrappers of `run_plan`.
"""

from __future__ import annotations

from pathlib import Path

from gates.contract import LoadedContract
from gates.errors import UserError
from gates.execution import _runner as runner
from gates.execution import _tasks as tasks
from gates.execution._locks import contract_lock
from gates.record import Evidence, Recording, plan_recording

EXECUTORS = ("local", "ray")


def run_plan(
    loaded: LoadedContract,
    tracking_uri: str,
    runs_root: Path,
    recording: Recording | None = None,
    *,
    executor: str = "local",
    jobs: int = 1,
    ray_address: str | None = None,
    fresh: bool = False,
    progress: runner.Progress | None = None,
    optuna_storage: str | None = None,
    threads: int | None = None,
    record: bool = False,
    reason: str | None = None,
    processes=None,
) -> runner.Outcome:
    """Run everything the contract asks for and decide here. A contract without evidence (or whose
    evidence was withdrawn) records attempt 1 (N + 1) in runs/<id>/ and the claims history; one with
    evidence is reproduced and compared with it, writing nothing under runs/, unless `record` (with a
    `reason`) records another attempt (`recording`: as gates.record.plan_recording decides, given).

    `executor`: "local" (in this process, or in `jobs` > 1 local processes; `processes`: a
    ProcessBackend already started, closed by its owner, e.g. for several contracts in a row) or
    "ray" (`ray_address`: a cluster; none or `local`: a local instance). `threads`: the CPU threads
    every job computes on (None: torch's count in this process as it is).

    One driver at a time per contract (runs/.<id>.lock): a second is a UserError naming the first's
    pid, before it opens the store. Runs a killed driver left RUNNING are closed (KILLED) and redone;
    finished runs of the same contract and code are reused unless `fresh`."""
    from gates.study import cpu_threads

    if executor not in EXECUTORS:
        raise UserError(
            f"--executor {executor}: expected one of {', '.join(EXECUTORS)}", field="--executor"
        )
    if jobs < 1 or (executor == "ray" and jobs > 1):
        raise UserError(
            f"--jobs {jobs}: expected a whole number >= 1, with the local executor (Ray runs as "
            f"many tasks at once as its cluster has CPUs for)",
            field="--jobs",
        )
    progress = progress or runner.SilentProgress()
    tuning_url = tasks.tuning_storage(loaded, tracking_uri, optuna_storage)
    recording = recording or plan_recording(loaded, runs_root, record=record, reason=reason)
    with cpu_threads(threads):
        if executor == "ray":
            from gates.execution import _ray

            return _ray.drive_on_ray(
                loaded,
                tracking_uri,
                runs_root,
                recording,
                address=ray_address,
                fresh=fresh,
                progress=progress,
                tuning_url=tuning_url,
                threads=_torch_threads(),
            )
        with contract_lock(runs_root, loaded.id):
            if jobs == 1 and processes is None:
                return tasks.drive(
                    lambda parent: tasks.InlineBackend(parent, progress),
                    loaded,
                    tracking_uri,
                    runs_root,
                    recording,
                    None,  # (the inline backend computes on the count as it is)
                    progress,
                    tuning_url,
                    fresh=fresh,
                )
            from gates.execution._processes import ProcessBackend

            backend = processes or ProcessBackend(jobs)
            try:
                return tasks.drive(
                    lambda parent: backend,
                    loaded,
                    tracking_uri,
                    runs_root,
                    recording,
                    _torch_threads(),  # the driver's, under --threads: every task's
                    progress,
                    tuning_url,
                    fresh=fresh,
                )
            finally:
                if processes is None:
                    backend.close()


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()


# ---------------------------------------------------------------------------------- former names
def execute(
    loaded: LoadedContract,
    tracking_uri: str,
    runs_root: Path,
    *,
    fresh: bool = False,
    progress: runner.Progress | None = None,
    optuna_storage: str | None = None,
    record: bool = False,
    reason: str | None = None,
) -> runner.Outcome:
    """`run_plan` in this process."""
    return run_plan(
        loaded,
        tracking_uri,
        runs_root,
        fresh=fresh,
        progress=progress,
        optuna_storage=optuna_storage,
        record=record,
        reason=reason,
    )


def run_contract(
    loaded: LoadedContract,
    tracking_uri: str,
    runs_root: Path,
    *,
    fresh: bool = False,
    progress: runner.Progress | None = None,
    optuna_storage: str | None = None,
) -> Evidence:
    """`run_plan` in this process; its evidence (recorded, or reproduced and compared)."""
    return run_plan(
        loaded,
        tracking_uri,
        runs_root,
        fresh=fresh,
        progress=progress,
        optuna_storage=optuna_storage,
    ).evidence


def run_processes(
    loaded: LoadedContract,
    tracking_uri: str,
    runs_root: Path,
    jobs: int,
    *,
    backend=None,
    **options,
) -> runner.Outcome:
    """`run_plan` in `jobs` local processes (`backend`: a ProcessBackend already started)."""
    return run_plan(loaded, tracking_uri, runs_root, jobs=jobs, processes=backend, **options)


def run_ray(
    loaded: LoadedContract,
    tracking_uri: str,
    runs_root: Path,
    *,
    address: str | None = None,
    **options,
) -> runner.Outcome:
    """`run_plan` as Ray tasks (`address`: a cluster; none: a local instance)."""
    return run_plan(loaded, tracking_uri, runs_root, executor="ray", ray_address=address, **options)
