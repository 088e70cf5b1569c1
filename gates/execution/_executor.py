"""`run_plan`, the one entry point that runs a contract's plan: preflight, tuning, every arm x seed
look by look under the stop rules, the verdict and evidence (gates/execution/_tasks.py drives it), on
one of its backends, as Optuna has storages:

- inline: each job in this process (a plain `gates run`; `jobs=1`);
- processes: N local processes (`jobs=N`, gates/execution/_processes.py);
- Ray: Ray tasks on a local instance or a cluster (`executor="ray"`, gates/execution/_ray.py).

Whichever runs them, a job computes on the driver's thread count, so a run's metrics are a single
process's on that many threads.
"""

from __future__ import annotations

from pathlib import Path

from gates.contract import LoadedContract
from gates.errors import UserError
from gates.execution import _runner as runner
from gates.execution import _tasks as tasks
from gates.execution._locks import contract_lock
from gates.record import Recording, plan_recording

EXECUTORS = ("local", "ray")


def check_executor(executor: str, jobs: int = 1, ray_address: str | None = None) -> None:
    """The executor and its options, before any contract is read (`gates run` checks them first):
    a UserError naming the option (exit 2); Ray not installed, one line naming the extra."""
    from gates.errors import did_you_mean

    if executor not in EXECUTORS:
        raise UserError(
            f"{executor!r}{did_you_mean(executor, EXECUTORS)}; expected one of {', '.join(EXECUTORS)}",
            field="--executor",
        )
    if ray_address is not None and executor != "ray":
        raise UserError("applies only with --executor ray", field="--ray-address")
    if jobs < 1:
        raise UserError(f"{jobs}: expected a whole number >= 1", field="--jobs")
    if jobs > 1 and executor != "local":
        raise UserError(
            "--jobs runs the jobs in local processes, --executor ray as Ray tasks (as many at once "
            "as its cluster has CPUs for): expected one of them",
            field="--jobs",
        )
    if executor == "ray":
        from gates.execution._ray import import_ray

        # a local instance is started on loopback only, which Ray reads on its first import
        import_ray(local=ray_address in (None, "local"))


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
    `reason`) records another attempt (`recording`: as gates.record.plan_recording decided, given by a
    caller that admitted the contract first, as `gates run` does: then its evidence is not checked
    again; else the contract is refused here when it is not the one its evidence was recorded for).

    `executor`: "local" (in this process, or in `jobs` > 1 local processes; `processes`: a
    ProcessBackend already started, closed by its owner, e.g. for several contracts in a row) or
    "ray" (`ray_address`: a cluster; none or `local`: a local instance). `threads`: the CPU threads
    every job computes on (None: torch's count in this process as it is).

    One driver at a time per contract (runs/.<id>.lock): a second is a UserError naming the first's
    pid, before it opens the store. Runs a killed driver left RUNNING are closed (KILLED) and redone;
    finished runs of the same contract and code are reused unless `fresh`."""
    from gates.study import cpu_threads

    check_executor(executor, jobs, ray_address)
    progress = progress or runner.SilentProgress()
    tuning_url = tasks.tuning_storage(loaded, tracking_uri, optuna_storage)
    if recording is None:  # else planned by the caller after admitting the contract (`gates run`)
        runner.check_existing_evidence(loaded, runs_root)
        recording = plan_recording(loaded, runs_root, record=record, reason=reason)
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
