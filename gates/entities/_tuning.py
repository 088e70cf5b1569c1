"""A tuned contract's tuning record as evidence.json holds it (`TuningRecord`): per tuned arm its
trials (`TrialRecord`) and the best one; the verdict engine reads it (the arms whose search stopped at
an edge), the runner writes it, verify re-derives its best."""

from __future__ import annotations

from gates.entities._record import Number, Record


class TrialRecord(Record):
    """One tuning trial: its number, the params it sampled, how it ended (completed, pruned, failed)
    and its objective value; `arm` only as a trial's end is reported (the record files it by arm)."""

    number: int
    params: dict
    state: str
    value: Number = None
    halt_reason: str | None = None
    mlflow_run_id: str | None = None
    arm: str | None = None


class BestTrialRecord(Record):
    number: int
    params: dict


class TunedArmRecord(Record):
    trials: list[TrialRecord]
    best: BestTrialRecord | None = None


class TuningRecord(Record):
    arms: dict[str, TunedArmRecord] = {}
