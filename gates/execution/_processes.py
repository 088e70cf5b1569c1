"""Local processes, `gates run CONTRACT --jobs N` (and `gates verify --replay --jobs N`): the plan's
jobs as tasks in N processes of this machine, a backend of the one plan driver
(gates/execution/_tasks.py: plan order, dependencies, the verdict and evidence written once, by this
process), with no cluster to install or start. Each task computes on the driver's thread count, so a
run's sums are those of a single-process run on that many threads.

Processes are started with `spawn` (a fork of a process that has imported torch or opened SQLite is not
safe) and kept for the run, each with its contexts (`_jobs.run_task`). Their standard output goes to
standard error: stdout is the driver's (its progress display, or JSON lines under --json).

Ctrl-C: the processes ignore SIGINT (the terminal sends it to the whole group); the driver's
KeyboardInterrupt cancels what is queued and sends SIGTERM to every process, which a running task turns
into a KeyboardInterrupt (its study stops and its MLflow run is closed as KILLED, as in one process);
finished runs stay in MLflow and the next `gates run` reuses them. A process that dies (killed, out of
memory) fails its job with a TaskError; its run, left RUNNING, is closed and redone by the next
`gates run`.
"""

from __future__ import annotations

import concurrent.futures as futures
import contextlib
import multiprocessing
import os
import signal
import sys

from gates.errors import storage_error
from gates.execution import _jobs as jobs
from gates.execution import _tasks as tasks
from gates.execution._job import ContextInfo, Job

CANCEL_WAIT_SECONDS = 10  # how long interrupted tasks get to close their MLflow runs


def _start_process() -> None:
    """In each new process: Ctrl-C is the driver's to handle; stdout onto stderr; the driver's cancel
    (SIGTERM) never lost in a callback (`redeliver_interrupts`)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.dup2(2, 1)
    redeliver_interrupts(signal.SIGTERM)


def redeliver_interrupts(signum: int) -> None:
    """An interrupt (the KeyboardInterrupt that `signum`'s handler raises) can land inside a callback
    that cannot raise (a weakref's, a finalizer's, run by the garbage collector wherever it runs):
    Python would print it as ignored and go on, so a Ctrl-C (the driver, SIGINT) or a cancel (a
    task's process, SIGTERM) would be lost and the run end as if never interrupted. Deliver it again
    instead, where it stops the work."""

    def hook(unraisable) -> None:
        if isinstance(unraisable.exc_value, KeyboardInterrupt):
            os.kill(os.getpid(), signum)
            return
        sys.__unraisablehook__(unraisable)

    sys.unraisablehook = hook


# the store's code, where an interrupt would land mid-statement: SQLAlchemy then logs its cleanup's
# failure with a traceback ("Error closing cursor") before the interrupt goes on
_STORE_CODE = (
    f"{os.sep}sqlalchemy{os.sep}",
    f"{os.sep}sqlite3{os.sep}",
    f"{os.sep}mlflow{os.sep}store{os.sep}",
)
_RETRY_SECONDS = 0.05


def _interrupt(_signum, frame):
    """The driver's cancel, raised where the task is, unless it is inside the store: then delivered
    again a moment later (SIGALRM), once the statement is done."""
    while frame is not None:
        if any(part in frame.f_code.co_filename for part in _STORE_CODE):
            signal.signal(signal.SIGALRM, _interrupt)
            signal.setitimer(signal.ITIMER_REAL, _RETRY_SECONDS)
            return
        frame = frame.f_back
    raise KeyboardInterrupt


def _run_task(info: ContextInfo, job: Job, readable: dict, threads: int) -> jobs.JobRecord:
    """`run_task` with SIGTERM as a KeyboardInterrupt while it runs (the driver's cancel)."""
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        return jobs.run_task(info, job, readable, threads)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)  # a cancel still waiting is for this task alone
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def threads_per_job(jobs: int) -> int:
    """The CPU threads of each of `jobs` processes when no recorded count decides: the cores shared
    out. Each process on torch's default of every core would oversubscribe them, and busy-waiting
    OpenMP threads slow small models many times over."""
    return max(1, (os.cpu_count() or 1) // jobs)


def job_threads(recorded_runs, jobs: int = 1) -> int | None:
    """The CPU threads a run's jobs compute on, when no --threads says: reproducing or replaying a
    record (`recorded_runs`, its RunRecords; None: nothing recorded), the count its runs all recorded;
    else, in `jobs` > 1 processes, `threads_per_job`; else None (the count as it is)."""
    from gates.study import recorded_threads

    counts = {recorded_threads(r.environment) for r in recorded_runs or ()}
    recorded = counts.pop() if len(counts) == 1 else None
    return recorded if recorded is not None or jobs == 1 else threads_per_job(jobs)


class ProcessBackend:
    """Tasks in `jobs` local processes (gates.execution._tasks.Backend)."""

    live = False

    def __init__(self, jobs: int):
        self.jobs, self.cancelled = jobs, False
        self.pool = futures.ProcessPoolExecutor(
            jobs, mp_context=multiprocessing.get_context("spawn"), initializer=_start_process
        )

    def room(self) -> int:
        return self.jobs

    def submit(self, info: ContextInfo, job: Job, readable: dict, threads: int):
        return self.pool.submit(_run_task, info, job, readable, threads)

    def wait(self, handles: list) -> list:
        return list(futures.wait(handles, return_when=futures.FIRST_COMPLETED).done)

    def result(self, handle, job: Job) -> jobs.JobRecord:
        try:
            return handle.result()
        except futures.process.BrokenProcessPool:
            raise tasks.TaskError(
                f"job {job.key}: a process of --jobs {self.jobs} died; finished runs are kept "
                f"and the next `gates run` reuses them"
            ) from None
        except KeyboardInterrupt:
            raise
        except Exception as e:
            found = storage_error(e)
            if found is not None:  # a full disk or an unwritable store: one line, as in one process
                raise found from None
            what = (str(e).strip().splitlines() or [""])[0]
            raise tasks.TaskError(
                f"job {job.key} failed in a process of --jobs {self.jobs}: "
                f"{type(e).__name__}: {what}; finished runs are kept and the next `gates run` "
                f"reuses them"
            ) from None

    def cancel(self, handles: list) -> None:
        self.cancelled = True
        for handle in handles:
            handle.cancel()  # the queued ones
        running = [h for h in handles if not h.done()]
        for process in self._processes():
            with contextlib.suppress(OSError):
                os.kill(process.pid, signal.SIGTERM)
        if running:
            futures.wait(running, timeout=CANCEL_WAIT_SECONDS)

    def close(self) -> None:
        if not self.cancelled:
            self.pool.shutdown(wait=True, cancel_futures=True)
            return
        # after a cancel, never wait on the pool: a process killed while its queue was being written
        # can leave the pool's manager thread waiting for good; what is still alive is killed
        for process in self._processes():
            with contextlib.suppress(OSError):
                os.kill(process.pid, signal.SIGKILL)
        self.pool.shutdown(wait=False, cancel_futures=True)

    def _processes(self) -> list:
        # the stdlib names its processes only privately; without them, the tasks run to their end
        return list((getattr(self.pool, "_processes", None) or {}).values())

    def __enter__(self) -> ProcessBackend:
        return self

    def __exit__(self, *_) -> None:
        self.close()
