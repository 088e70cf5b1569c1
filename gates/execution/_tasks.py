"""A contract's plan as tasks, whatever runs them: the driver's side shared by the Ray executor
(`--executor ray`, gates/execution/_ray.py) and the local processes (`--jobs N`,
gates/execution/_processes.py).

The driver (this process) does what a single-process `gates run` does around the jobs: the contract's
lock, preflight and the parent MLflow run (gates.execution._runner.prepare_parent, own_parent), the plan's order of
work (gates/execution/_plan.py: tuning trials, then the arm x seed jobs look by look, `next_seeds`
between looks), the verdict and the evidence, written once, here (gates.execution._runner.finish). Each job is one
task that runs it with the distributed worker's code: the job's description is the one the distributed
coordinator enqueues (gates.execution._distributed.run_jobs, tune_jobs), the task rebuilds the worker's context
from the contract's text and the coordinator's code fingerprint (`load_context`: a process on other
code refuses) and runs `JOB_KINDS[kind]`, the function `gates worker` runs (stop rules, nested MLflow
run, tags, a relatively judged arm's comparison, an arm that keeps failing not run). The task computes
on exactly the driver's thread count, so its sums are those of a single-process run.

Order: a job is submitted once the jobs it needs have records (`after`: a relatively judged arm after
the arms it is compared with; a tuned arm's trial n after its trial n - 1, so each samples with the
trials before it finished, as in one process), and no more at once than the backend has room for: an
arm that keeps failing is then not run on the seeds after, as far as records show, as a `gates worker`
decides it, and Ctrl-C has little to cancel.

A backend (`Backend`) submits a task, waits for one, returns its record or raises `TaskError` (an error
of the platform's own in a task: the store unreachable, a process on other code; the other tasks are
cancelled, finished runs are kept) and cancels what is outstanding.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from gates.contract import LoadedContract
from gates.execution import _distributed as distributed
from gates.execution import _plan as plan
from gates.execution import _runner as runner
from gates.record import Recording


class TaskError(Exception):
    """A job's task raised an error of the platform's own, or its process died on every attempt."""

    code = "task_failed"


# ---------------------------------------------------------------------------------- the task
_CONTEXTS: dict[str, distributed.StudyContext] = {}  # per task process: contexts by contract
_TRACKERS: dict[str, object] = {}
_FOLDER: list[Path] = []


def run_task(info: dict, attrs: dict, records: dict[str, dict], threads: int) -> dict:
    """One job in a task process: the distributed worker's code for its kind (JOB_KINDS) on the context
    rebuilt from the driver's `queue_info` (kept for the process's next tasks), on `threads` CPU
    threads; `records`: the records it may read (the jobs it follows, its arm's earlier seeds)."""
    from gates.study import cpu_threads

    key = f"{info[distributed.ATTR]}:{info['gates.parent_run_id']}"
    if key not in _CONTEXTS:
        if not _FOLDER:
            _FOLDER.append(Path(tempfile.mkdtemp(prefix="gates-task-")))
        _CONTEXTS[key] = distributed.load_context(
            f"task:{info['gates.contract_id']}",
            0,
            info,
            _FOLDER[0] / str(len(_CONTEXTS)),
            trackers=_TRACKERS,
        )
    table = distributed.JobTable(records=dict(records))
    with cpu_threads(threads):
        return distributed.JOB_KINDS[attrs["kind"]](_CONTEXTS[key], attrs, table, lambda _id: None)


# ---------------------------------------------------------------------------------- the driver
class Backend(Protocol):
    """Where tasks run: `run_task(info, attrs, readable, threads)` for each submitted job."""

    def room(self) -> int:
        """How many tasks may run at once (at least one)."""

    def submit(self, info: dict, attrs: dict, readable: dict, threads: int):
        """Start `run_task` for one job; a handle to wait on."""

    def wait(self, handles: list) -> list:
        """Block until at least one of `handles` is done; those done."""

    def result(self, handle, attrs: dict) -> dict:
        """The job's record, or TaskError (a storage error: its own one-line error; Ctrl-C in the task:
        KeyboardInterrupt)."""

    def cancel(self, handles: list) -> None:
        """Stop the outstanding tasks and give them a moment to close their MLflow runs."""


class Tasks:
    """The driver's side: submits jobs as tasks in plan order as their dependencies allow and the
    backend has room, and collects their records."""

    def __init__(
        self, backend: Backend, parent: runner.ParentRun, info: dict, threads: int, progress
    ):
        self.backend, self.parent, self.info, self.threads = backend, parent, info, threads
        self.progress = progress
        self.records: dict[str, dict] = {}  # job -> record, every look's
        self.running: dict = {}  # handle -> the job's attrs

    def run(self, jobs: list[dict], reused: dict[tuple[str, int], dict] | None = None) -> list:
        """Each job's record, in job order: a finished run of the same contract and code (`reused`)
        taken as it is, every other job run as a task."""
        steps = self.parent.budget.steps
        pending = []
        for attrs in jobs:
            done = (reused or {}).get((attrs.get("arm"), attrs.get("seed")))
            if attrs["kind"] == plan.KIND_RUN and done is not None:
                record = runner.run_record(done)
                self.progress.start(attrs["arm"], attrs["seed"], steps, skipped=record)
                self.progress.end(record)
                self.records[attrs["job"]] = record
            else:
                pending.append(attrs)
        try:
            while pending or self.running:
                self._submit(pending, steps)
                if not self.running:  # (the plan lists a job's dependencies before it)
                    raise RuntimeError(
                        f"jobs wait on jobs that are not in the plan: {[a['job'] for a in pending]}"
                    )
                for handle in self.backend.wait(list(self.running)):
                    attrs = self.running.pop(handle)
                    record = self.backend.result(handle, attrs)
                    self.records[attrs["job"]] = record
                    distributed.show_record(self.progress, attrs, record, steps)
        except BaseException:
            handles = list(self.running)
            self.running.clear()
            self.backend.cancel(handles)
            raise
        return [self.records[attrs["job"]] for attrs in jobs]

    def _submit(self, pending: list[dict], steps: int) -> None:
        room = self.backend.room()
        for attrs in list(pending):
            if len(self.running) >= room:
                return
            if any(dep not in self.records for dep in attrs.get("after", [])):
                continue  # after the jobs it needs (they come earlier in the plan's order)
            pending.remove(attrs)
            # what the job may read: the jobs it follows, and its arm's runs (an arm that keeps failing)
            readable = {
                k: r
                for k, r in self.records.items()
                if k in attrs.get("after", []) or r.get("arm") == attrs["arm"]
            }
            handle = self.backend.submit(self.info, attrs, readable, self.threads)
            self.running[handle] = attrs
            if attrs["kind"] == plan.KIND_RUN:
                self.progress.start(attrs["arm"], attrs["seed"], steps)


def tuning_storage(
    loaded: LoadedContract, tracking_uri: str, optuna_storage: str | None
) -> str | None:
    """Where a tuned contract's trials are stored: `optuna_storage`, else the default beside the
    tracking store; None for a contract that tunes nothing."""
    if loaded.contract.tuning is None:
        return None
    from gates.execution import _tuning as tuning

    return optuna_storage or tuning.default_storage(tracking_uri)


def drive(
    backend_for: Callable[[runner.ParentRun], Backend],
    loaded: LoadedContract,
    tracking_uri: str,
    runs_root: Path,
    recording: Recording,
    threads: int,
    progress,
    tuning_url: str | None,
    *,
    fresh: bool,
) -> runner.Outcome:
    """The contract's parent run prepared and owned here, then its plan as tasks on
    `backend_for(parent)`: tuning trials (each arm's in order), the best configs applied, then the arm x
    seed jobs look by look; the verdict and evidence written here, as by `execute`. On Ctrl-C the tasks
    are cancelled and the parent run is marked KILLED, as a single process marks it."""
    parent = runner.prepare_parent(loaded, tracking_uri, runs_root, fresh=fresh)
    runner.own_parent(parent)
    backend = backend_for(parent)
    try:
        return _drive(backend, parent, runs_root, recording, threads, progress, tuning_url, fresh)
    except KeyboardInterrupt:
        # a task interrupted before its run's own handler was in place (while MLflow created the run)
        # left it RUNNING: closed now, as the next run would close it
        distributed.close_leftovers(parent, [])
        parent.tracker.client.set_terminated(parent.parent_id, status="KILLED")
        raise


def _drive(backend, parent, runs_root, recording, threads, progress, tuning_url, fresh):
    info = distributed.queue_info(parent)
    info["gates.tracking_uri"] = task_url(parent.tracking_uri)
    tasks = Tasks(backend, parent, info, threads, progress)
    done = runner.finished_runs(parent)  # a RUNNING child is a killed driver's: closed, redone
    reuse = runner.Reuse()
    reuse.other_code, reuse.other_code_sha256 = runner.runs_under_other_code(parent)
    loaded = parent.loaded
    if tuning_url is not None:  # tuning trials first (gates/execution/_tuning.py), then the seeds
        from gates.execution import _tuning as tuning

        if fresh:
            distributed.delete_tuning_studies(loaded, parent, tuning_url)
        # the storage's tables and each arm's study made here, once: tasks that start together on a
        # new storage would race to create them (SQLite: a UNIQUE constraint on alembic_version)
        for arm in loaded.contract.tuning.tuned_arms(loaded.contract.arms):
            tuning.open_study(loaded, arm, tuning_url, parent.prov.code_sha256)
        trials = distributed.tune_jobs(loaded, task_url(tuning_url))
        for before, after in zip(trials, trials[1:]):
            if before["arm"] == after["arm"]:  # trial n samples with trial n - 1 finished
                after["after"] = [before["job"]]
        tasks.run(trials)
        parent.apply_tuning(tuning_url, progress)
    records: list[dict] = []
    for seeds in plan.seeds_by_look(parent.loaded, records):  # look by look
        records += tasks.run(distributed.run_jobs(parent, seeds), reused=done)
    distributed.close_leftovers(parent, records)  # dead attempts' runs
    reuse.tally(records, reused=sum((r["arm"], r["seed"]) in done for r in records))
    return runner.finish(parent, records, runs_root, recording, reuse)


def task_url(url: str) -> str:
    """The store URL as a task opens it: a relative SQLite file or folder made absolute, since a task's
    current folder may not be the driver's (a Ray node's is `ray start`'s). Other URLs as they are."""
    prefix = "sqlite:///"
    if url.startswith(prefix) and not url[len(prefix) :].startswith("/"):
        return prefix + str(Path(url[len(prefix) :]).resolve())
    if "://" not in url and not url.startswith(("sqlite:", "file:")):
        return str(Path(url).resolve())
    return url
