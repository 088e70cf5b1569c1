"""A contract's plan as tasks, whatever runs them: the one plan loop of `gates run`, whose backends
run each job in this process (`InlineBackend`, a plain `gates run`), in N local processes (`--jobs N`,
gates/execution/_processes.py) or as Ray tasks (`--executor ray`, gates/execution/_ray.py);
gates/execution/_executor.py picks one.

The driver (this process) holds the contract's lock and does everything around the jobs: preflight and
the parent MLflow run (gates.execution._runner.prepare_parent, own_parent), the plan's order of work
(gates/execution/_plan.py: tuning trials, then the arm x seed jobs look by look, `next_seeds` between
looks), reuse of finished runs, skipping an arm that keeps failing, the verdict and the evidence,
written once, here (gates.execution._runner.finish). Each job runs as gates/execution/_jobs.py runs it
(`JOB_KINDS`: stop rules, nested MLflow run, tags, a relatively judged arm's comparison), in a task
process on exactly the driver's thread count, so its sums are those of a single-process run.

Order: a job is submitted once the jobs it needs have records (`after`: a relatively judged arm after
the arms it is compared with; a tuned arm's trial n after its trial n - 1, so each samples with the
trials before it finished, as in one process), and no more at once than the backend has room for: an
arm that keeps failing is then not run on the seeds after, as far as records show, and Ctrl-C has
little to cancel.

A backend (`Backend`) submits a task, waits for one, returns its record or raises `TaskError` (an error
of the platform's own in a task: the store unreachable, a process on other code; the other tasks are
cancelled, finished runs are kept) and cancels what is outstanding.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from gates.contract import LoadedContract
from gates.entities import RunRecord
from gates.execution import _jobs as jobs
from gates.execution import _plan as plan
from gates.execution import _runner as runner
from gates.execution._job import KIND_RUN, ContextInfo, Job
from gates.record import Recording, close_after_interrupt


class TaskError(Exception):
    """A job's task raised an error of the platform's own, or its process died on every attempt."""

    code = "task_failed"


class Backend(Protocol):
    """Where tasks run: `_jobs.run_task(info, job, readable, threads)` for each submitted job.
    `live`: whether a task reports its progress itself (in this process); else the driver shows each
    record as it arrives."""

    live: bool

    def room(self) -> int:
        """How many tasks may run at once (at least one)."""

    def submit(self, info: ContextInfo, job: Job, readable: dict, threads: int):
        """Start one job's task; a handle to wait on."""

    def wait(self, handles: list) -> list:
        """Block until at least one of `handles` is done; those done."""

    def result(self, handle, job: Job) -> jobs.JobRecord:
        """The job's record, or TaskError (a storage error: its own one-line error; Ctrl-C in the task:
        KeyboardInterrupt)."""

    def cancel(self, handles: list) -> None:
        """Stop the outstanding tasks and give them a moment to close their MLflow runs."""


class InlineBackend:
    """Each job in this process, one at a time, on the parent run as the driver holds it (no contract
    reloaded, no code fingerprint checked: it is this process's), on the thread count as it is, with
    the progress display fed as the run reports: a plain `gates run`."""

    live = True

    def __init__(self, parent: runner.ParentRun, progress):
        self.context = jobs.JobContext(parent, histories={})
        self.progress = progress

    def room(self) -> int:
        return 1

    def submit(self, info: ContextInfo, job: Job, readable: dict, threads: int):
        return functools.partial(jobs.JOB_KINDS[job.kind], self.context, job, readable)

    def wait(self, handles: list) -> list:
        return handles[:1]  # (it runs when its result is asked for)

    def result(self, handle, job: Job) -> jobs.JobRecord:
        return handle(self.progress)

    def cancel(self, handles: list) -> None:
        pass  # nothing runs but the job that was interrupted


class Tasks:
    """The driver's side: submits jobs as tasks in plan order as their dependencies allow and the
    backend has room, and collects their records."""

    def __init__(
        self,
        backend: Backend,
        parent: runner.ParentRun,
        info: ContextInfo,
        threads: int,
        progress,
    ):
        self.backend, self.parent, self.info, self.threads = backend, parent, info, threads
        self.progress = progress
        self.records: dict[str, jobs.JobRecord] = {}  # job -> record, every look's
        self.running: dict = {}  # handle -> its Job
        self.reused: dict[tuple[str, int], RunRecord] = {}  # (arm, seed) -> a finished run's record

    def run(
        self, todo: list[Job], reused: dict[tuple[str, int], RunRecord] | None = None
    ) -> list[jobs.JobRecord]:
        """Each job's record, in job order: a finished run of the same contract and code (`reused`)
        taken as it is, every other job run as a task."""
        steps = self.parent.budget.steps
        self.reused = reused or {}
        pending = list(todo)
        try:
            while pending or self.running:
                self._submit(pending, steps)
                if not self.running:
                    if not pending:  # the last jobs were settled here (an arm that keeps failing)
                        break
                    # (the plan lists a job's dependencies before it)
                    raise RuntimeError(
                        f"jobs wait on jobs that are not in the plan: {[j.key for j in pending]}"
                    )
                for handle in self.backend.wait(list(self.running)):
                    job = self.running.pop(handle)
                    record = self.backend.result(handle, job)
                    self.records[job.key] = record
                    jobs.show_record(self.progress, job, record, steps, live=self.backend.live)
        except BaseException:
            handles = list(self.running)
            self.running.clear()
            self.backend.cancel(handles)
            raise
        return [self.records[job.key] for job in todo]

    def _settle(self, job: Job, record: RunRecord, steps: int) -> None:
        """A run job's record found here, without a task (reused, or not run)."""
        self.progress.start(job.arm, job.seed, steps, skipped=record)
        self.progress.end(record)
        self.records[job.key] = record

    def _submit(self, pending: list[Job], steps: int) -> None:
        room = self.backend.room()
        for job in list(pending):
            if len(self.running) >= room:
                return  # (a reused run is settled in its turn too: the display shows the plan's order)
            done = self.reused.get((job.arm, job.seed))
            if job.kind == KIND_RUN and done is not None:
                pending.remove(job)
                self._settle(job, done, steps)
                continue
            if any(dep not in self.records for dep in job.after):
                continue  # after the jobs it needs (they come earlier in the plan's order)
            pending.remove(job)
            if job.kind == KIND_RUN:
                failing = jobs.failing_before(self.parent.loaded, self.records, job)
                if failing:  # its arm failed on the seeds just before: not run
                    self._settle(job, runner.skipped_record(job.arm, job.seed, failing), steps)
                    continue
            readable = {k: self.records[k] for k in job.after}
            handle = self.backend.submit(self.info, job, readable, self.threads)
            self.running[handle] = job
            if job.kind == KIND_RUN:
                self.progress.start(job.arm, job.seed, steps)


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
    seed jobs look by look; the verdict and evidence written here. On Ctrl-C the tasks are cancelled
    and the parent run is marked KILLED. The caller holds the contract's lock."""
    parent = runner.prepare_parent(loaded, tracking_uri, runs_root, fresh=fresh)
    runner.own_parent(parent)
    backend = backend_for(parent)
    try:
        return _drive(backend, parent, runs_root, recording, threads, progress, tuning_url, fresh)
    except KeyboardInterrupt:
        _close_after_interrupt(parent)
        raise


def _close_after_interrupt(parent: runner.ParentRun) -> None:
    """After Ctrl-C: a task interrupted before its run's own handler was in place (while MLflow created
    the run) left it RUNNING, and the parent run is marked KILLED, while the cancelled tasks close their
    own runs (gates.record.close_after_interrupt: a busy store is tried again, then left to the next
    `gates run`)."""

    def close() -> None:
        jobs.close_leftovers(parent, [])
        parent.tracker.client.set_terminated(parent.parent_id, status="KILLED")

    close_after_interrupt(close)


def _drive(backend, parent, runs_root, recording, threads, progress, tuning_url, fresh):
    tasks = Tasks(
        backend, parent, jobs.job_info(parent, task_url(parent.tracking_uri)), threads, progress
    )
    done = runner.finished_runs(parent)  # a RUNNING child is a killed driver's: closed, redone
    reuse = runner.Reuse()
    reuse.other_code, reuse.other_code_sha256 = runner.runs_under_other_code(parent)
    loaded = parent.loaded
    if tuning_url is not None:  # tuning trials first (gates/execution/_tuning.py), then the seeds
        from gates.execution import _tuning as tuning

        if fresh:
            jobs.delete_tuning_studies(loaded, parent, tuning_url)
        # the storage's tables and each arm's study made here, once (tasks that start together on a
        # new storage would race to create them; SQLite: a UNIQUE constraint on alembic_version), and
        # the trials a killed run left RUNNING closed, uncounted (this driver holds the lock)
        for arm in loaded.contract.tuning.tuned_arms(loaded.contract.arms):
            tuning.reap_interrupted(
                loaded, arm, tuning_url, parent.tracker, parent.prov.code_sha256
            )
        tasks.run(jobs.tune_jobs(loaded, task_url(tuning_url)))
        parent.apply_tuning(tuning_url, progress)
    records: list[RunRecord] = []
    for seeds in plan.seeds_by_look(parent.loaded, records):  # look by look
        records += tasks.run(jobs.run_jobs(parent, seeds), reused=done)
    jobs.close_leftovers(parent, records)  # dead attempts' runs
    reuse.tally(records, reused=sum((r.arm, r.seed) in done for r in records))
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
