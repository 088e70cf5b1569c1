"""Distributed runs on existing engines: an Optuna RDB storage is the job queue (PostgreSQL across
machines; SQLite on one machine), a shared MLflow tracking server holds the runs.

Coordinator, `gates run CONTRACT --storage URL`: preflight and the parent MLflow run as a
single-process run does (gates.execution._runner.prepare_parent), then one Optuna study per contract version and
parent run, named `gates:<id>@<sha256[:12]>:<parent run id[:12]>`, with one enqueued trial per
arm x seed job (`study.enqueue_trial({}, user_attrs={"kind": "run", "job": ..., ...})`), in the order of
gates/execution/_plan.py: one look's jobs at a time (a contract without `sequential` is one look), waiting until
each has exactly one completed record and asking the plan whether the next look is needed; then it
decides the verdict once and writes the evidence, plots and parent-run tags with
gates.execution._runner.finish. Re-running it re-attaches: jobs that already have a
trial (waiting, running or complete) are not enqueued again.

Worker, `gates worker --storage URL`: claims a WAITING trial with the same row-locked
WAITING -> RUNNING transition that `study.ask()` uses (`storage.set_trial_state_values`, which reads
the trial row `SELECT ... FOR UPDATE` on PostgreSQL and returns False when another worker got there
first; on SQLite this module makes every transaction `BEGIN IMMEDIATE`, which serialises them). It
does not call `study.ask()` itself because ask creates a new, jobless trial when the queue is empty.
The job runs through gates.execution._runner.run_job (same stop rules, same MLflow child run and tags) while a
thread records Optuna heartbeats; the record (final metrics, status, halt, MLflow run id) goes into the
trial's user attrs and the trial is set COMPLETE.

Failure: a worker that dies stops beating. After the grace period, `optuna.storages.fail_stale_trials`
(called by every polling worker and by the waiting coordinator) fails its trial, and Optuna's
RetryHeartbeatStaleTrialCallback enqueues a copy (same user attrs, `failed_trial`/`retry_history` in
system attrs) that a living worker claims; that worker first closes the dead attempt's MLflow child
(KILLED). A worker whose trial was failed under it cannot complete it (the storage refuses to update a
finished trial, under the same row lock), so it records nothing and closes its own child run.

Relative futility (`behind_best_other_by`) compares a judged arm with the arms before it on the same
seed, so a judged job lists those jobs in `after` and is claimable only once they are complete; its
worker reads their metric histories from MLflow, as a single-process run does for reused runs.

Job kinds: every trial carries `kind`; "run" is an arm x seed of the contract. Other kinds (an Optuna
`tuning` trial, say) plug in through JOB_KINDS.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import socket
import tempfile
import threading
import time
import traceback
import uuid
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gates.contract import LoadedContract
from gates.errors import UserError
from gates.execution import _plan as plan
from gates.execution import _runner as runner

HEARTBEAT_SECONDS = 10  # Optuna's heartbeat interval (an integer number of seconds)
MAX_RETRY = 3  # a job whose worker dies this many times is reported, not retried forever
POLL_SECONDS = 0.5
STUDY_PREFIX = "gates:"
KIND_RUN = plan.KIND_RUN
KIND_TUNE = plan.KIND_TUNE
ATTR = "gates.contract_sha256"  # a study attr that marks a study as a gates contract's job queue


class Superseded(Exception):
    """This worker's trial was failed (stale) and re-enqueued: another worker now owns the job."""


class DeadJobs(Exception):
    """Jobs that have no completed record and nothing waiting or running for them."""


def grace_seconds(heartbeat: int) -> int:
    """How long a running trial may go without a heartbeat before it counts as stale."""
    return max(3 * heartbeat, heartbeat + 2)


# ---------------------------------------------------------------------------------- storage
def open_storage(url: str, heartbeat: int = HEARTBEAT_SECONDS):
    """An Optuna RDBStorage with heartbeats and retry of stale trials; bad URLs are user errors."""
    import optuna
    import sqlalchemy
    from optuna.exceptions import ExperimentalWarning

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=ExperimentalWarning)
    if heartbeat < 1:
        raise UserError(
            f"--heartbeat {heartbeat}: expected a whole number of seconds >= 1", field="--heartbeat"
        )
    try:
        from optuna.storages import RetryHeartbeatStaleTrialCallback as Retry  # optuna >= 4.9

        callback_arg = "heartbeat_stale_trial_callback"
    except ImportError:  # older optuna: the same callback under its former name
        from optuna.storages import RetryFailedTrialCallback as Retry

        callback_arg = "failed_trial_callback"
    sqlite = url.startswith("sqlite")
    kwargs = {"engine_kwargs": {"connect_args": {"timeout": 60}}} if sqlite else {}
    try:
        storage = optuna.storages.RDBStorage(
            url,
            heartbeat_interval=heartbeat,
            grace_period=grace_seconds(heartbeat),
            **{callback_arg: Retry(max_retry=MAX_RETRY)},
            **kwargs,
        )
    except ImportError as e:
        raise UserError(
            f"--storage {_safe(url)}: no database driver ({e}); for PostgreSQL: "
            f"pip install 'treeheap-gates[postgres]' (psycopg 3 and psycopg2)",
            field="--storage",
        ) from None
    except (sqlalchemy.exc.ArgumentError, ValueError) as e:
        raise UserError(
            f"--storage {_safe(url)}: {e}; expected an SQLAlchemy URL such as "
            f"postgresql://user:password@host:5432/db or sqlite:///optuna.db",
            field="--storage",
        ) from None
    except (sqlalchemy.exc.OperationalError, optuna.exceptions.StorageInternalError) as e:
        reason = str(getattr(e, "orig", None) or e.__cause__ or e).strip().splitlines()[0]
        raise UserError(
            f"--storage {_safe(url)}: cannot open the database ({reason}); expected a reachable "
            f"database that this user may write",
            field="--storage",
        ) from None
    if sqlite:
        _serialise_sqlite(storage.engine)
    return storage


def _serialise_sqlite(engine) -> None:
    """SQLite ignores SELECT ... FOR UPDATE; taking the write lock at BEGIN makes Optuna's
    read-check-write claim of a WAITING trial atomic across processes (SQLAlchemy's documented
    pysqlite recipe)."""
    from sqlalchemy import event

    @event.listens_for(engine, "connect")
    def _no_implicit_transactions(dbapi_connection, _record):
        dbapi_connection.isolation_level = None

    @event.listens_for(engine, "begin")
    def _begin_immediate(connection):
        connection.exec_driver_sql("BEGIN IMMEDIATE")

    engine.dispose()  # connections opened before the listeners are dropped


def _safe(url: str) -> str:
    """A storage URL without its password, for messages."""
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return url.split("@")[-1]


def study_name(loaded: LoadedContract, parent_id: str) -> str:
    return f"{STUDY_PREFIX}{loaded.id}@{loaded.sha256[:12]}:{parent_id[:12]}"


job_key = plan.job_key


# ---------------------------------------------------------------------------------- job table
@dataclass
class JobTable:
    """What the storage says about a study's jobs: the one accepted record per job (the completed
    trial with the lowest number whose record carries its own claim), what is still live, and what
    re-claims happened."""

    records: dict[str, dict] = field(default_factory=dict)  # job -> record
    trials: dict[str, int] = field(default_factory=dict)  # job -> number of the trial it came from
    live: dict[str, list[int]] = field(
        default_factory=dict
    )  # job -> numbers of waiting/running trials
    retries: dict[str, list[int]] = field(default_factory=dict)  # job -> numbers of failed attempts
    jobs: dict[str, dict] = field(default_factory=dict)  # job -> its user attrs (first seen)


def read_jobs(storage, study_id: int) -> JobTable:
    from optuna.trial import TrialState

    table = JobTable()
    for t in sorted(storage.get_all_trials(study_id, deepcopy=False), key=lambda t: t.number):
        job = t.user_attrs.get("job")
        if job is None:
            continue
        table.jobs.setdefault(job, dict(t.user_attrs))
        if t.state == TrialState.COMPLETE:
            record = t.user_attrs.get("record")
            if (
                job not in table.records
                and isinstance(record, dict)
                and record.get("claim") == t.system_attrs.get("gates.claim")
            ):
                table.records[job] = {k: v for k, v in record.items() if k != "claim"}
                table.trials[job] = t.number
        elif t.state in (TrialState.WAITING, TrialState.RUNNING):
            table.live.setdefault(job, []).append(t.number)
        elif t.state == TrialState.FAIL:
            table.retries.setdefault(job, []).append(t.number)
    return table


# ---------------------------------------------------------------------------------- coordinator
@dataclass
class Enqueued:
    study_name: str
    storage: str
    enqueued: list[str] = field(default_factory=list)  # jobs put in the queue by this call
    reused: list[str] = field(
        default_factory=list
    )  # jobs whose finished MLflow run (same contract, code) counts
    present: list[str] = field(default_factory=list)  # jobs that already had a trial


def queue_info(parent: runner.ParentRun, extra: dict | None = None) -> dict:
    """What a worker needs to run a parent run's jobs (`load_context` rebuilds it): the contract's text,
    the coordinator's code fingerprint, the MLflow parent run. A job study's user attrs; the Ray
    executor (gates/execution/_ray.py) ships the same dict with each task."""
    loaded = parent.loaded
    return {
        "gates.contract_id": loaded.id,
        "gates.code_sha256": parent.prov.code_sha256,
        "gates.contract_name": loaded.path.name,
        "gates.contract_yaml": loaded.path.read_text(encoding="utf-8"),
        "gates.tracking_uri": parent.tracking_uri,
        "gates.experiment_id": parent.experiment_id,
        "gates.parent_run_id": parent.parent_id,
        "gates.base_tags": parent.base_tags,
        **(extra or {}),
        ATTR: loaded.sha256,  # last: workers take a study up only once this is set
    }


def open_queue(parent: runner.ParentRun, storage, extra: dict | None = None):
    """The job study for this parent run (created on first use, with what workers need to know)."""
    import optuna

    name = study_name(parent.loaded, parent.parent_id)
    study = optuna.create_study(study_name=name, storage=storage, load_if_exists=True)
    if ATTR not in study.user_attrs:
        for key, value in queue_info(parent, extra).items():
            study.set_user_attr(key, value)
    return study


def run_jobs(parent: runner.ParentRun, seeds: list[int] | None = None) -> list[dict]:
    """The plan's arm x seed jobs (kind "run") of these seeds (default: all), as trial user attrs; a
    relatively judged job lists the jobs it is compared with in `after`. Each carries the arm config it
    runs (the tuned one after tuning)."""
    loaded = parent.loaded
    seeds = list(loaded.contract.seeds) if seeds is None else seeds
    return [
        {
            "kind": KIND_RUN,
            "job": j.key,
            "arm": j.arm,
            "seed": j.seed,
            "after": list(j.after),
            "config": loaded.arm_configs[j.arm].model_dump(mode="json"),
        }
        for j in plan.run_jobs(loaded, seeds)
    ]


def tune_jobs(loaded: LoadedContract, tuning_storage: str) -> list[dict]:
    """The plan's tuning trials (kind "tune"), one per pre-registered trial of every tuned arm."""
    return [
        {
            "kind": KIND_TUNE,
            "job": j.key,
            "arm": j.arm,
            "index": j.index,
            "after": [],
            "tuning_storage": tuning_storage,
        }
        for j in plan.tuning_jobs(loaded)
    ]


def enqueue(
    study, storage, parent: runner.ParentRun, jobs: list[dict], result: Enqueued
) -> Enqueued:
    """Enqueue every job that has no trial yet (waiting, running or complete); a "run" job finished
    earlier under this parent in MLflow (a single-process run, same contract and code) is added as
    a completed trial with that run's record instead."""
    import optuna

    study_id = storage.get_study_id_from_name(study.study_name)
    table = read_jobs(storage, study_id)
    done = runner.finished_runs(parent, kill_running=False)  # RUNNING children may be live workers'
    for attrs in jobs:
        key = attrs["job"]
        if key in table.records or key in table.live:
            result.present.append(key)
        elif attrs["kind"] == KIND_RUN and (attrs["arm"], attrs["seed"]) in done:
            token = uuid.uuid4().hex
            record = {**runner.run_record(done[(attrs["arm"], attrs["seed"])]), "claim": token}
            study.add_trial(
                optuna.trial.create_trial(
                    state=optuna.trial.TrialState.COMPLETE,
                    value=0.0,
                    user_attrs={
                        **attrs,
                        "record": record,
                        "mlflow_run_id": record["mlflow_run_id"],
                    },
                    system_attrs={"gates.claim": token, "gates.worker": "reused"},
                )
            )
            result.reused.append(key)
        else:
            study.enqueue_trial({}, user_attrs=attrs)
            result.enqueued.append(key)
    return result


def wait_for_jobs(
    storage,
    name: str,
    jobs: list[dict],
    progress: runner.Progress | None = None,
    *,
    steps: int = 0,
    poll: float = 1.0,
    timeout: float | None = None,
) -> list[dict]:
    """Poll until every job has its record (failing stale trials on the way); the records in job order."""
    import optuna

    progress = progress or runner.SilentProgress()
    study = optuna.load_study(study_name=name, storage=storage)
    study_id = storage.get_study_id_from_name(name)
    for attrs in jobs:
        if attrs["kind"] == KIND_RUN:
            progress.start(attrs["arm"], attrs["seed"], steps)
    shown: set[str] = set()
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        optuna.storages.fail_stale_trials(study)
        table = read_jobs(storage, study_id)
        for attrs in jobs:
            key = attrs["job"]
            if key in table.records and key not in shown:
                shown.add(key)
                show_record(progress, attrs, table.records[key], steps)
        if len(shown) == len(jobs):
            return [table.records[attrs["job"]] for attrs in jobs]
        dead = [
            a["job"] for a in jobs if a["job"] not in table.records and a["job"] not in table.live
        ]
        if dead:
            raise DeadJobs(
                f"{len(dead)} job(s) of study {name!r} have no completed record and nothing waiting or "
                f"running ({', '.join(dead)}; failed attempts: "
                f"{', '.join(f'{k}: {len(table.retries.get(k, []))}' for k in dead)}); see the workers' "
                f"logs; `gates run CONTRACT --storage URL` enqueues them again"
            )
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(
                f"jobs still open after {timeout:g} s: "
                f"{', '.join(a['job'] for a in jobs if a['job'] not in table.records)}"
            )
        time.sleep(poll)


def show_record(progress: runner.Progress, attrs: dict, record: dict, steps: int) -> None:
    """A job's record as it arrives from elsewhere (a worker, a Ray task): a run's final metrics and
    its end, or a tuning trial."""
    if attrs["kind"] == KIND_RUN:
        progress.update(attrs["arm"], attrs["seed"], steps, record["metrics"])
        progress.end(record)
    elif record.get("tuning_trial") and hasattr(progress, "tuning_trial"):
        progress.tuning_trial(record["tuning_trial"])


def close_leftovers(parent: runner.ParentRun, records: list[dict]) -> list[str]:
    """Close (KILLED) arm x seed child runs left RUNNING by dead workers that are not in the records."""
    kept = {r["mlflow_run_id"] for r in records}
    closed = []
    for run in parent.tracker.child_runs(parent.experiment_id, parent.parent_id):
        if (
            run.info.status == "RUNNING"
            and run.info.run_id not in kept
            and run.data.tags.get("gates.role") == "run"
        ):
            parent.tracker.kill(run.info.run_id)
            closed.append(run.info.run_id)
    return closed


def run_distributed(
    loaded: LoadedContract,
    tracking_uri: str,
    runs_root: Path,
    storage_url: str,
    *,
    fresh: bool = False,
    wait: bool = True,
    progress: runner.Progress | None = None,
    heartbeat: int = HEARTBEAT_SECONDS,
    poll: float = 1.0,
    optuna_storage: str | None = None,
    on_enqueued: Callable[[Enqueued], None] | None = None,
    recording: runner.Recording | None = None,
) -> runner.Outcome | Enqueued:
    """Enqueue the contract's jobs; unless `wait` is False, wait for them and return the outcome (the
    evidence recorded, or a recorded claim reproduced, exactly as a single-process run does:
    `recording`, default as `gates.record._attempts.plan_recording` decides).

    A contract with `tuning` goes in two phases: its tuning trials are jobs first (gates.execution._tuning
    .run_tuning_trial on the workers; studies in `optuna_storage`, default the job storage); once they
    are all done, the coordinator takes the tuning record and best configs (gates.execution._tuning.tune_and_apply,
    which finds the budget spent) and enqueues the arm x seed jobs with the tuned configs. With
    `wait=False` only the phase that can be enqueued now is."""
    recording = recording or runner.plan_recording(loaded, runs_root)
    storage = open_storage(storage_url, heartbeat)
    parent = runner.prepare_parent(loaded, tracking_uri, runs_root, fresh=fresh)
    reuse = runner.Reuse()
    reuse.other_code, reuse.other_code_sha256 = runner.runs_under_other_code(parent)
    study = open_queue(parent, storage)
    result = Enqueued(study.study_name, _safe(storage.url))
    if getattr(loaded.contract, "tuning", None) is not None:
        tuning_url = optuna_storage or storage_url
        if fresh:
            delete_tuning_studies(loaded, parent, tuning_url)
        jobs = tune_jobs(loaded, tuning_url)
        enqueue(study, storage, parent, jobs, result)
        if not wait:
            if on_enqueued is not None:
                on_enqueued(result)
            return result
        wait_for_jobs(storage, study.study_name, jobs, progress, poll=poll)
        parent.apply_tuning(tuning_url, progress)
    records: list[dict] = []
    for seeds in plan.seeds_by_look(
        parent.loaded, records
    ):  # one look at a time (gates/execution/_plan.py)
        jobs = run_jobs(parent, seeds)
        enqueue(study, storage, parent, jobs, result)
        if on_enqueued is not None:
            on_enqueued(result)
        if not wait:
            return result
        records += wait_for_jobs(
            storage, study.study_name, jobs, progress, steps=parent.budget.steps, poll=poll
        )
    close_leftovers(parent, records)
    run_keys = {plan.job_key(r["arm"], r["seed"]) for r in records}
    reuse.tally(records, reused=len(run_keys & set(result.reused)))
    return runner.finish(parent, records, runs_root, recording, reuse)


def delete_tuning_studies(loaded: LoadedContract, parent: runner.ParentRun, url: str) -> None:
    import optuna

    from gates.execution import _tuning as tuning

    for arm in loaded.contract.tuning.tuned_arms(loaded.contract.arms):
        try:
            optuna.delete_study(
                study_name=tuning.study_name(loaded, arm, parent.prov.code_sha256), storage=url
            )
        except KeyError:
            pass


# ---------------------------------------------------------------------------------- worker
@dataclass
class StudyContext:
    """What a worker needs to run one study's jobs: the contract (from the text the coordinator
    stored), and the parent MLflow run."""

    name: str
    study_id: int
    parent: runner.ParentRun


class Heartbeat:
    """Records Optuna heartbeats for one trial from a thread while the job runs, and at each beat
    fails the study's stale trials (re-enqueueing them), so a dead worker's job goes back to the queue
    within about grace + interval even when every living worker is busy."""

    def __init__(self, storage, trial_id: int, interval: int, study=None):
        self.storage, self.trial_id, self.interval, self.study = storage, trial_id, interval, study
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._beat, daemon=True, name=f"heartbeat-{trial_id}")

    def _beat(self):
        import optuna

        while not self.stop.wait(self.interval):
            try:
                self.storage.record_heartbeat(self.trial_id)
                if self.study is not None:
                    optuna.storages.fail_stale_trials(self.study)
            except Exception:  # a database hiccup: the next beat tries again (grace > interval)
                pass

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()
        return False


class Worker:
    """Claims and runs jobs from every gates study in an Optuna storage."""

    def __init__(
        self,
        storage_url: str,
        tracking_uri: str | None = None,
        *,
        heartbeat: int = HEARTBEAT_SECONDS,
        poll: float = POLL_SECONDS,
        log: Callable[[str], None] | None = None,
    ):
        self.storage = open_storage(storage_url, heartbeat)
        self.tracking_uri = tracking_uri
        self.heartbeat = heartbeat
        self.poll = poll
        self.log = log or (lambda line: None)
        self.id = f"{socket.gethostname()}:{os.getpid()}"
        self.contexts: dict[
            str, StudyContext | None
        ] = {}  # None: this worker cannot run that study
        self.trackers: dict[str, object] = {}
        self.tmp = Path(tempfile.mkdtemp(prefix="gates-worker-"))

    # -- the loop
    def serve(self, max_jobs: int | None = None, idle_exit: float | None = None) -> int:
        """Run jobs until `max_jobs` are done or nothing was claimable for `idle_exit` seconds."""
        done, idle_since = 0, time.monotonic()
        while max_jobs is None or done < max_jobs:
            if self.run_next():
                done += 1
                idle_since = time.monotonic()
            elif idle_exit is not None and time.monotonic() - idle_since >= idle_exit:
                self.log(f"idle for {idle_exit:g} s: exiting after {done} job(s)")
                break
            else:
                time.sleep(self.poll)
        return done

    def run_next(self) -> bool:
        """Claim and run one job; False when no study has a claimable one."""
        import optuna
        from optuna.trial import TrialState

        for frozen in self.storage.get_all_studies():
            if ATTR not in frozen.user_attrs:
                continue
            study_id = self.storage.get_study_id_from_name(frozen.study_name)
            open_trials = self.storage.get_all_trials(
                study_id, deepcopy=False, states=(TrialState.WAITING, TrialState.RUNNING)
            )
            if not open_trials:
                continue
            study = optuna.load_study(study_name=frozen.study_name, storage=self.storage)
            if any(t.state == TrialState.RUNNING for t in open_trials):
                optuna.storages.fail_stale_trials(
                    study
                )  # a dead worker's job goes back to the queue
            waiting = self.storage.get_all_trials(
                study_id, deepcopy=False, states=(TrialState.WAITING,)
            )
            if not waiting:
                continue
            ctx = self._context(frozen.study_name, study_id, frozen.user_attrs)
            if ctx is None:
                continue
            table = read_jobs(self.storage, study_id)
            # re-enqueued jobs first (others may wait on them), then in enqueue (single-process) order
            for trial in sorted(
                waiting, key=lambda t: ("failed_trial" not in t.system_attrs, t.number)
            ):
                job = trial.user_attrs.get("job")
                if job is None or trial.user_attrs.get("kind") not in JOB_KINDS:
                    continue
                if any(dep not in table.records for dep in trial.user_attrs.get("after", [])):
                    continue  # a relatively judged job waits for the jobs it is compared with
                trial_id = self.storage.get_trial_id_from_study_id_trial_number(
                    study_id, trial.number
                )
                if not self._claim(trial_id):
                    continue  # another worker claimed it first
                if (
                    job in table.records
                ):  # a duplicate (two coordinators enqueued at once): close it
                    self.storage.set_trial_system_attr(
                        trial_id, "gates.duplicate_of", table.trials[job]
                    )
                    self.storage.set_trial_state_values(trial_id, TrialState.FAIL)
                    continue
                self._run_claimed(study, ctx, trial, trial_id, table)
                return True
        return False

    def _claim(self, trial_id: int) -> bool:
        """WAITING -> RUNNING under the trial row's lock (what study.ask() does), then a first
        heartbeat at once: Optuna never counts a trial without any heartbeat as stale."""
        from optuna.exceptions import UpdateFinishedTrialError
        from optuna.trial import TrialState

        try:
            if not self.storage.set_trial_state_values(trial_id, state=TrialState.RUNNING):
                return False
        except UpdateFinishedTrialError:
            return False
        self.storage.record_heartbeat(trial_id)
        return True

    # -- one job
    def _run_claimed(self, study, ctx: StudyContext, trial, trial_id: int, table: JobTable) -> None:
        from optuna.exceptions import UpdateFinishedTrialError
        from optuna.trial import TrialState

        attrs = trial.user_attrs
        token = uuid.uuid4().hex
        for key, value in {
            "gates.claim": token,
            "gates.worker": self.id,
            "gates.claimed_at": time.time(),
        }.items():
            self.storage.set_trial_system_attr(trial_id, key, value)
        retry_of = trial.system_attrs.get("failed_trial")
        self.log(
            f"claimed {ctx.name} {attrs['job']} (trial {trial.number}"
            + (
                f", re-claim of trial {trial.system_attrs['retry_history'][-1]}"
                if retry_of is not None
                else ""
            )
            + ")"
        )
        previous = attrs.get("mlflow_run_id")
        if previous:  # the dead attempt's child run: closed, its partial result void
            self._close_run(ctx.parent.tracker, previous)
        started: list[str] = []

        def on_start(run_id: str) -> None:
            started.append(run_id)
            try:
                self.storage.set_trial_user_attr(trial_id, "mlflow_run_id", run_id)
            except UpdateFinishedTrialError:
                raise Superseded() from None

        try:
            with Heartbeat(self.storage, trial_id, self.heartbeat, study):
                record = JOB_KINDS[attrs["kind"]](ctx, attrs, table, on_start)
        except Superseded:
            self._void(ctx, attrs, started)
            return
        except KeyboardInterrupt:  # SIGTERM / Ctrl-C: hand the job back at once, then stop
            self._give_back(study, trial_id, "interrupted")
            self.log(f"interrupted: {attrs['job']} handed back to the queue")
            raise
        except Exception as e:  # infrastructure (MLflow, database): hand the job back, keep serving
            for run_id in started:
                self._close_run(ctx.parent.tracker, run_id)
            self._give_back(study, trial_id, f"{type(e).__name__}: {e}")
            self.log(
                f"error in {attrs['job']}: {type(e).__name__}: {e}; handed back\n{traceback.format_exc(limit=6)}"
            )
            return
        try:
            self.storage.set_trial_user_attr(trial_id, "record", {**record, "claim": token})
            # COMPLETE under the row lock; refused (UpdateFinishedTrialError) if the trial was failed as
            # stale meanwhile, in which case its re-enqueued copy is the job's only live attempt.
            self.storage.set_trial_state_values(trial_id, TrialState.COMPLETE, values=[0.0])
        except UpdateFinishedTrialError:
            self._void(ctx, attrs, started)
            return
        if attrs["kind"] == KIND_RUN:
            what = (
                f"{record['status']}"
                + (f" ({record['halt_reason']})" if record.get("halt_reason") else "")
                + f" in {record['seconds']:.2f} s"
            )
        else:
            what = json.dumps(record.get("tuning_trial"))[:200]
        self.log(f"done {ctx.name} {attrs['job']}: {what}")

    def _void(self, ctx: StudyContext, attrs: dict, started: list[str]) -> None:
        for run_id in started:
            self._close_run(ctx.parent.tracker, run_id)
        self.log(
            f"{attrs['job']}: this attempt was failed as stale and re-enqueued; its result is not recorded"
        )

    def _give_back(self, study, trial_id: int, why: str) -> None:
        """Fail the trial and enqueue a copy through the storage's retry callback (as a stale one)."""
        from optuna.exceptions import UpdateFinishedTrialError
        from optuna.trial import TrialState

        try:
            self.storage.set_trial_system_attr(trial_id, "gates.given_back", why[:500])
            if not self.storage.set_trial_state_values(trial_id, TrialState.FAIL):
                return
        except UpdateFinishedTrialError:
            return  # already failed as stale: the retry exists
        callback = self.storage.get_heartbeat_stale_trial_callback()
        if callback is not None:
            callback(study, self.storage.get_trial(trial_id))

    @staticmethod
    def _close_run(tracker, run_id: str) -> None:
        try:
            if tracker.client.get_run(run_id).info.status != "KILLED":
                tracker.kill(run_id)
        except Exception:
            pass  # the run was never created, or the store is unreachable: the coordinator closes leftovers

    # -- studies
    def _context(self, name: str, study_id: int, attrs: dict) -> StudyContext | None:
        if name in self.contexts:
            return self.contexts[name]
        ctx = None
        try:
            ctx = self._load_context(name, study_id, attrs)
        except Exception as e:
            self.log(f"skipping {name}: {e}")
        self.contexts[name] = ctx
        return ctx

    def _load_context(self, name: str, study_id: int, attrs: dict) -> StudyContext:
        return load_context(
            name, study_id, attrs, self.tmp / str(study_id), self.tracking_uri, self.trackers
        )


def load_context(
    name: str,
    study_id: int,
    attrs: dict,
    folder: Path,
    tracking_uri: str | None = None,
    trackers: dict | None = None,
) -> StudyContext:
    """A worker's context for a job study from its `queue_info` (the contract written to `folder` and
    loaded), refused (RuntimeError) when the contract or this machine's code is not the coordinator's,
    or an arm cannot run here. `tracking_uri`: the store as seen from here (default: the coordinator's);
    `trackers`: this process's open stores, by URI."""
    from gates.contract import load_contract
    from gates.errors import UserErrors
    from gates.record import Tracker, code_sha256

    trackers = {} if trackers is None else trackers
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / attrs["gates.contract_name"]
    path.write_text(attrs["gates.contract_yaml"], encoding="utf-8")
    try:
        loaded = load_contract(path)
    except (UserError, UserErrors) as e:
        raise RuntimeError(
            f"its contract does not load here: {e.render().splitlines()[0]}"
        ) from None
    if loaded.sha256 != attrs[ATTR]:
        raise RuntimeError(
            f"its contract hashes to {loaded.sha256[:16]} here, {attrs[ATTR][:16]} at enqueue"
        )
    code = code_sha256(type(loaded.study).__module__)
    if code != attrs["gates.code_sha256"]:
        raise RuntimeError(
            f"this worker's code (sha256 {code[:12]}) differs from the coordinator's "
            f"({attrs['gates.code_sha256'][:12]}): install the same commit"
        )
    for arm, cfg in loaded.arm_configs.items():
        why = loaded.study.why_not_ready(cfg)
        if why:
            raise RuntimeError(f"arm {arm!r} cannot run here: {why}")
    uri = tracking_uri or attrs["gates.tracking_uri"]
    if uri not in trackers:
        trackers[uri] = Tracker(uri)
    parent = runner.ParentRun(
        loaded,
        uri,
        trackers[uri],
        attrs["gates.experiment_id"],
        attrs["gates.parent_run_id"],
        dict(attrs["gates.base_tags"]),
    )
    return StudyContext(name, study_id, parent)


def _run_arm_seed(ctx: StudyContext, attrs: dict, table: JobTable, on_start) -> dict:
    """Job kind "run": one arm x seed under the contract's stop rules, as a child of the parent run."""
    parent = ctx.parent
    arm = attrs["arm"]
    if (
        getattr(parent.loaded.contract, "tuning", None) is not None
        and attrs.get("config") is not None
    ):
        loaded = copy.copy(
            parent.loaded
        )  # the tuned config the coordinator chose (the contract's otherwise)
        loaded.arm_configs = {
            **loaded.arm_configs,
            arm: loaded.study.Config.model_validate(attrs["config"]),
        }
        parent = dataclasses.replace(parent, loaded=loaded)
    seed = int(attrs["seed"])
    failing = plan.failing_streak(
        parent.loaded, _earlier_runs(parent.loaded, table, arm, seed), arm
    )
    if (
        failing
    ):  # its arm failed on the seeds just before this one: not run, as a single process would not
        return runner.skipped_record(arm, seed, failing)
    reference = plan.reference_metrics(parent.loaded)
    others = {}
    for dep in attrs.get(
        "after", []
    ):  # the arms before this one on its seed, as a single process has them
        record = table.records[dep]
        others[record["arm"]] = {
            m: parent.tracker.history(record["mlflow_run_id"], m) for m in reference
        }
    record, _ = runner.run_job(parent, arm, seed, others=others, on_start=on_start)
    return record


def _earlier_runs(loaded: LoadedContract, table: JobTable, arm: str, seed: int) -> list[dict]:
    """The arm's records of the seeds just before `seed` (in the contract's order), back to the first seed
    without a record yet: what a single process would have seen when it came to this seed."""
    seeds = list(loaded.contract.seeds)
    earlier = []
    for s in reversed(seeds[: seeds.index(seed)] if seed in seeds else []):
        record = table.records.get(plan.job_key(arm, s))
        if record is None:
            break
        earlier.append(record)
    return earlier[::-1]


def _run_tuning_trial(ctx: StudyContext, attrs: dict, table: JobTable, on_start) -> dict:
    """Job kind "tune": one pre-registered tuning trial of an arm (gates.execution._tuning.run_tuning_trial, which
    does nothing once the arm's budget is spent); its MLflow run is nested under the parent run."""
    from gates.execution import _tuning as tuning

    parent = ctx.parent
    trial = tuning.run_tuning_trial(
        parent.loaded,
        attrs["arm"],
        attrs["tuning_storage"],
        parent.tracking_uri,
        parent_run_id=parent.parent_id,
        experiment_id=parent.experiment_id,
        # the fingerprint the run started with, checked when this process took its first job: one
        # measured now would file the trial under another study after a file changed mid-run
        prov=parent.prov,
        index=attrs.get("index"),
    )
    return {
        "kind": KIND_TUNE,
        "arm": attrs["arm"],
        "tuning_trial": trial,
        "mlflow_run_id": (trial or {}).get("mlflow_run_id"),
    }


# kind -> function(StudyContext, trial user attrs, JobTable, on_start(mlflow_run_id)) -> record (JSON-able)
JOB_KINDS: dict[str, Callable[[StudyContext, dict, JobTable, Callable[[str], None]], dict]] = {
    KIND_RUN: _run_arm_seed,
    KIND_TUNE: _run_tuning_trial,
}


def describe(enqueued: Enqueued) -> str:
    return json.dumps(
        {
            "study": enqueued.study_name,
            "storage": enqueued.storage,
            "enqueued": len(enqueued.enqueued),
            "reused": len(enqueued.reused),
            "already_queued": len(enqueued.present),
        }
    )
