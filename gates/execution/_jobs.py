"""One job of a contract's plan, wherever it runs: in the driver's own process (the inline backend of
a plain `gates run`), in a local process (`--jobs N`) or as a Ray task (`--executor ray`).

A job is a `Job` (gates/execution/_job.py; `run_jobs`, `tune_jobs`: its kind, key, arm, seed or trial
place, the jobs it comes `after`, the config it runs), and runs as `JOB_KINDS[job.kind](context, job,
records, progress)`, which returns its record. The context (`JobContext`) is the parent MLflow run the
job's run is nested under: the driver's own in this process; elsewhere rebuilt (`load_context`) from
what the driver ships with each task (`job_info`, a `ContextInfo`: the contract's text, the driver's
code fingerprint, the parent run), and refused on other code. `records`: the records of the jobs it comes after (a
relatively judged arm reads their metric histories). gates/execution/_tasks.py drives the jobs.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gates.contract import LoadedContract
from gates.entities import RunRecord, TrialRecord
from gates.errors import UserError
from gates.execution import _plan as plan
from gates.execution import _runner as runner
from gates.execution._job import KIND_RUN, KIND_TUNE, ContextInfo, Job

# what a job returns: a run job its run's RunRecord, as the evidence will list it; a tuning job its
# trial's TrialRecord (None when the arm's budget was spent already)
JobRecord = RunRecord | TrialRecord | None


@dataclass
class JobContext:
    """What a job needs besides its description: the contract's parent run (its contract, store and
    tags), and, in the driver's own process, the metric histories of the runs it trained (run id ->
    metric -> [(step, value)]), which a relatively judged arm reads as they were reported rather
    than back from MLflow: exactly what a single process compared before there were backends."""

    parent: runner.ParentRun
    histories: dict[str, dict] | None = None


# ---------------------------------------------------------------------------------- descriptions
def job_info(parent: runner.ParentRun, tracking_uri: str) -> ContextInfo:
    """What a process elsewhere needs to run a parent run's jobs (`load_context` rebuilds it): the
    contract's text, the driver's code fingerprint, the MLflow parent run in the store at
    `tracking_uri` (the parent's store as a task opens it)."""
    loaded = parent.loaded
    return ContextInfo(
        contract_id=loaded.id,
        contract_name=loaded.path.name,
        contract_yaml=loaded.path.read_text(encoding="utf-8"),
        contract_sha256=loaded.sha256,
        code_sha256=parent.prov.code_sha256,
        tracking_uri=tracking_uri,
        experiment_id=parent.experiment_id,
        parent_run_id=parent.parent_id,
        base_tags=parent.base_tags,
    )


def run_jobs(parent: runner.ParentRun, seeds: list[int] | None = None) -> list[Job]:
    """The plan's arm x seed jobs (kind "run") of these seeds (default: all); a relatively judged job
    lists the jobs it is compared with in `after`. Each carries the arm config it runs (the tuned one
    after tuning)."""
    loaded = parent.loaded
    seeds = list(loaded.contract.seeds) if seeds is None else seeds
    return [
        dataclasses.replace(j, config=loaded.arm_configs[j.arm].model_dump(mode="json"))
        for j in plan.run_jobs(loaded, seeds)
    ]


def tune_jobs(loaded: LoadedContract, tuning_storage: str) -> list[Job]:
    """The plan's tuning trials (kind "tune"), one per pre-registered trial of every tuned arm, each
    filed in `tuning_storage`."""
    return [dataclasses.replace(j, tuning_storage=tuning_storage) for j in plan.tuning_jobs(loaded)]


def failing_before(
    loaded: LoadedContract, records: dict[str, JobRecord], job: Job
) -> list[RunRecord]:
    """The failing streak (plan.failing_streak) of a run job's arm on the seeds just before its own, in
    the contract's order, back to the first of them without a record yet: what a single process saw
    when it came to this seed. Non-empty: the job is not run."""
    arm, seed = job.arm, job.seed
    seeds = list(loaded.contract.seeds)
    earlier = []
    for s in reversed(seeds[: seeds.index(seed)] if seed in seeds else []):
        record = records.get(plan.job_key(arm, s))
        if record is None:
            break
        earlier.append(record)
    return plan.failing_streak(loaded, earlier[::-1], arm)


# ---------------------------------------------------------------------------------- contexts
def load_context(info: ContextInfo, folder: Path, trackers: dict | None = None) -> JobContext:
    """A job's context from the driver's `job_info` (the contract written to `folder` and loaded),
    refused (RuntimeError) when the contract or this machine's code is not the driver's, or an arm
    cannot run here. `trackers`: this process's open stores, by URI."""
    from gates.contract import load_contract
    from gates.errors import UserErrors
    from gates.record import Tracker, code_sha256

    trackers = {} if trackers is None else trackers
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / info.contract_name
    path.write_text(info.contract_yaml, encoding="utf-8")
    try:
        loaded = load_contract(path)
    except (UserError, UserErrors) as e:
        raise RuntimeError(
            f"its contract does not load here: {e.render().splitlines()[0]}"
        ) from None
    if loaded.sha256 != info.contract_sha256:
        raise RuntimeError(
            f"its contract hashes to {loaded.sha256[:16]} here, "
            f"{info.contract_sha256[:16]} at the driver"
        )
    code = code_sha256(type(loaded.study).__module__)
    if code != info.code_sha256:
        raise RuntimeError(
            f"this process's code (sha256 {code[:12]}) differs from the driver's "
            f"({info.code_sha256[:12]}): install the same commit"
        )
    for arm, cfg in loaded.arm_configs.items():
        why = loaded.study.why_not_ready(cfg)
        if why:
            raise RuntimeError(f"arm {arm!r} cannot run here: {why}")
    uri = info.tracking_uri
    if uri not in trackers:
        trackers[uri] = Tracker(uri)
    parent = runner.ParentRun(
        loaded, uri, trackers[uri], info.experiment_id, info.parent_run_id, dict(info.base_tags)
    )
    return JobContext(parent)


_CONTEXTS: dict[str, JobContext] = {}  # per task process: contexts by contract and parent run
_TRACKERS: dict[str, object] = {}
_FOLDER: list[Path] = []


def run_task(info: ContextInfo, job: Job, records: dict[str, JobRecord], threads: int) -> JobRecord:
    """One job in a task process (a local process, a Ray worker), on the context rebuilt from the
    driver's `job_info` (kept for the process's next tasks), on exactly `threads` CPU threads: the
    driver's, so its sums are a single process's."""
    from gates.study import cpu_threads

    key = info.key
    if key not in _CONTEXTS:
        if not _FOLDER:
            _FOLDER.append(Path(tempfile.mkdtemp(prefix="gates-task-")))
        _CONTEXTS[key] = load_context(info, _FOLDER[0] / str(len(_CONTEXTS)), _TRACKERS)
    with cpu_threads(threads):
        return JOB_KINDS[job.kind](_CONTEXTS[key], job, records, runner.SilentProgress())


# ---------------------------------------------------------------------------------- the kinds
def _run_arm_seed(ctx: JobContext, job: Job, records: dict[str, JobRecord], progress) -> RunRecord:
    """Job kind "run": one arm x seed under the contract's stop rules, as a child of the parent run."""
    parent = ctx.parent
    arm, config = job.arm, job.config
    if (
        parent.loaded.contract.tuning is not None
        and config is not None
        and config != parent.loaded.arm_configs[arm].model_dump(mode="json")
    ):  # the tuned config the driver chose (a task process loaded the contract's own)
        loaded = parent.loaded.replace(
            arm_configs={
                **parent.loaded.arm_configs,
                arm: parent.loaded.study.Config.model_validate(config),
            }
        )
        parent = dataclasses.replace(parent, loaded=loaded)
    reference = plan.reference_metrics(parent.loaded)
    others = {}  # the arms before this one on its seed (a run not run has no history)
    for dep in job.after:
        record = records[dep]
        run_id = record.mlflow_run_id
        if run_id is None:
            continue
        if ctx.histories is not None and run_id in ctx.histories:
            others[record.arm] = ctx.histories[run_id]
        else:
            others[record.arm] = {m: parent.tracker.history(run_id, m) for m in reference}
    record, history = runner.run_job(parent, arm, job.seed, progress, others=others)
    if ctx.histories is not None and record.mlflow_run_id:
        ctx.histories[record.mlflow_run_id] = history
    return record


def _run_tuning_trial(
    ctx: JobContext, job: Job, records: dict[str, JobRecord], progress
) -> TrialRecord | None:
    """Job kind "tune": one pre-registered tuning trial of an arm (gates.execution._tuning
    .run_tuning_trial, which does nothing once the arm's budget is spent); its MLflow run is nested
    under the parent run."""
    from gates.execution import _tuning as tuning

    parent = ctx.parent
    return tuning.run_tuning_trial(
        parent.loaded,
        job.arm,
        job.tuning_storage,
        parent.tracking_uri,
        parent_run_id=parent.parent_id,
        experiment_id=parent.experiment_id,
        # the fingerprint the run started with, checked when this process took its first job: one
        # measured now would file the trial under another study after a file changed mid-run
        prov=parent.prov,
        index=job.index,
    )


# kind -> function(JobContext, job, records it may read, progress) -> its record
JOB_KINDS: dict[
    str, Callable[[JobContext, Job, dict[str, JobRecord], runner.Progress], JobRecord]
] = {
    KIND_RUN: _run_arm_seed,
    KIND_TUNE: _run_tuning_trial,
}


# ---------------------------------------------------------------------------------- the driver's side
def show_record(
    progress: runner.Progress, job: Job, record: JobRecord, steps: int, *, live: bool = False
) -> None:
    """A job's record as it arrives: a run's end (after its final metrics when it ran in a task
    elsewhere; `live`: its task fed the display as it ran, in this process), or a tuning trial."""
    if job.kind == KIND_RUN:
        if not live:
            progress.update(job.arm, job.seed, steps, record.metrics)
        progress.end(record)
    elif record is not None and hasattr(progress, "tuning_trial"):
        progress.tuning_trial(record)


def close_leftovers(parent: runner.ParentRun, records: list[RunRecord]) -> list[str]:
    """Close (KILLED) arm x seed child runs left RUNNING by dead tasks that are not in the records."""
    kept = {r.mlflow_run_id for r in records}
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


def delete_tuning_studies(loaded: LoadedContract, parent: runner.ParentRun, url: str) -> None:
    """`--fresh`: each tuned arm's Optuna study of this code deleted, so its trials run again."""
    import optuna

    from gates.execution import _tuning as tuning

    for arm in loaded.contract.tuning.tuned_arms(loaded.contract.arms):
        try:
            optuna.delete_study(
                study_name=tuning.study_name(loaded, arm, parent.prov.code_sha256), storage=url
            )
        except KeyError:
            pass
