"""A run as evidence.json records it: one arm x seed (`RunRecord`), with its first signal, its
convergence trend and a failed run's error."""

from __future__ import annotations

from gates.entities._record import Number, Record


class FirstSignalRecord(Record):
    step: int | None = None
    value: Number = None
    met: bool


class ConvergenceRecord(Record):
    """The trend a completed run was judged on under the contract's convergence rule."""

    metric: str
    window: int
    first_step: int | None = None
    last_step: int | None = None
    first_value: Number = None
    last_value: Number = None
    rel_improvement: Number = None


class RunErrorRecord(Record):
    """What a failed run raised or returned: its type, message and where (the innermost frame, file:line)."""

    type: str
    message: str = ""
    where: str | None = None


class RunRecord(Record):
    """One arm x seed run: its status, final metrics and where it ran."""

    arm: str
    seed: int
    status: str
    halt_reason: str | None = None
    halt_detail: str | None = None
    metrics: dict[str, Number]
    seconds: Number = None
    first_signal: FirstSignalRecord | None = None
    mlflow_run_id: str | None = None
    converged: bool | None = None  # only on completed runs of a contract with a convergence rule
    convergence: ConvergenceRecord | None = None
    environment: dict[str, str] | None = (
        None  # device, torch, cuda, gpu, threads (studies with a device)
    )
    error: RunErrorRecord | None = None  # a failed run's error
