"""The entities a contract's plan travels as, from where its jobs are made (gates/execution/_plan.py,
gates/execution/_jobs.py) to where they run (gates/execution/_tasks.py's driver, a local process of
gates/execution/_processes.py, a Ray task of gates/execution/_ray.py): one `Job` each, and the
`ContextInfo` a task rebuilds the contract's parent run from.

Both are frozen dataclasses of plain values, so they pickle to a process pool or a Ray task as they
are and a job's `after` is fixed when it is made; nothing here imports the rest of the platform, which
keeps what a task unpickles first small.
"""

from __future__ import annotations

from dataclasses import dataclass, field

KIND_RUN = "run"  # one arm x seed
KIND_TUNE = "tune"  # one pre-registered tuning trial of an arm


@dataclass(frozen=True)
class Job:
    """One job of a contract's plan."""

    kind: str  # KIND_RUN | KIND_TUNE
    key: str  # its name in the plan (and the key of its record): `arm/seedN`, `tune:arm:i`
    arm: str
    seed: int | None = None  # run
    index: int | None = None  # tune: the trial's place in the arm's budget
    after: tuple[str, ...] = field(default=())  # keys of the jobs whose records it needs first
    # run: the arm's config as JSON (the tuned one after tuning), None for the contract's own
    config: dict | None = None
    tuning_storage: str | None = None  # tune: the Optuna storage its trial is filed in


@dataclass(frozen=True)
class ContextInfo:
    """What the driver ships with each task for a process elsewhere to rebuild the job's context
    (gates.execution._jobs.load_context): the contract's text and hash, the driver's code fingerprint,
    the MLflow parent run the job's run is nested under."""

    contract_id: str
    contract_name: str  # the contract file's name, as it is written again in the task's folder
    contract_yaml: str
    contract_sha256: str  # a process whose contract hashes otherwise refuses the job
    code_sha256: str  # ... and so does one on other code
    tracking_uri: str  # the store as a task opens it (gates.execution._tasks.task_url)
    experiment_id: str
    parent_run_id: str
    base_tags: dict[str, str]  # the parent run's tags every child run carries

    @property
    def key(self) -> str:
        """The contract and parent run a task process keeps one context for."""
        return f"{self.contract_sha256}:{self.parent_run_id}"
