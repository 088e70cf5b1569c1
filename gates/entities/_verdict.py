"""The verdict entity (`Verdict`): what the verdict engine (gates.inference) reaches, and what a
run, `gates rederive` and `gates verify` write or compare as evidence; and its parts as evidence.json
records them (`HaltRecord`, `LostValueRecord`, `NotRunRecord`, `BeyondCeilingRecord`, `LookRecord`):
the engine builds them, evidence holds them, every reader reads their attributes."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from gates.entities._condition import ConditionRecord
from gates.entities._json import json_safe
from gates.entities._record import Real, Record


class HaltRecord(Record):
    """A run a stop rule halted: its arm, seed and the rule's reason (futility, divergence, budget)."""

    arm: str
    seed: int
    reason: str | None = None


class LostValueRecord(Record):
    """A value a condition reads that the runs do not give: (arm, metric, seed) and why."""

    arm: str
    metric: str
    seed: int
    why: str


class NotRunRecord(Record):
    """An arm the decision or a control reads with no completed run: the experiment did not run as
    designed (the verdict is invalid)."""

    arm: str
    runs: int
    completed: int
    statuses: dict[str, int] = {}
    first_error: str | None = None
    text: str
    settle: str = ""


class BeyondCeilingRecord(Record):
    """A condition whose bar lies beyond what the best possible arm reaches (its ceiling): it tests
    nothing (the verdict is invalid)."""

    condition: str
    description: str = ""
    ceiling: Real
    min: Real
    max: Real
    source: str = ""
    why: str = ""
    text: str
    settle: str = ""


class LookRecord(Record):
    """One look of a sequential contract: the seeds judged, the alpha spent so far and at this look,
    the verdict and each condition's outcome there."""

    look: int
    seeds: list[int]
    alpha_spent: Real
    alpha_look: Real
    verdict: str
    outcomes: dict[str, str] = {}


@dataclass
class Verdict:
    """A claim's verdict as the verdict engine reaches it: the verdict and why, its conditions and
    controls as judged, what would settle it, and what kept it from standing on its runs (halts,
    lost values, arms not run, bars beyond the ceiling, tuning edges). `to_dict` is the JSON the
    evidence records; a sequential contract's looks are set by the engine after the last look."""

    verdict: str  # "supported" | "refuted" | "inconclusive" | "invalid"
    reasons: list[str]
    conditions: list[ConditionRecord]
    alpha: float
    evaluation: str
    correction: str
    settle: list[str] = field(default_factory=list)
    halts: list[HaltRecord] = field(default_factory=list)
    # (arm, metric, seed, why) a condition reads but lacks
    lost: list[LostValueRecord] = field(default_factory=list)
    # the engine that reached it (gates.inference.ENGINE_VERSION): given by the engine, never defaulted
    engine_version: str = field(kw_only=True)
    controls: list[ConditionRecord] = field(default_factory=list)
    # a sequential contract's looks (gates.inference._sequential)
    looks: list[LookRecord] = field(default_factory=list)
    not_run: list[NotRunRecord] = field(default_factory=list)  # arms read without a completed run
    # conditions whose bar the best arm cannot reach
    beyond_ceiling: list[BeyondCeilingRecord] = field(default_factory=list)
    # tuned arm -> why its search stopped at an edge
    tuning_edges: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict:
        """The verdict as JSON data: each record (a condition, a halt, a lost value, ...) as it writes
        itself (`as_dict`)."""
        return json_safe({f.name: as_json(getattr(self, f.name)) for f in fields(self)})


def as_json(value):
    """A verdict's part as JSON data: a record or a list of records as each writes itself (`as_dict`),
    NaN and infinities as null; any other value as JSON can hold it (`json_safe`)."""
    if isinstance(value, Record):
        value = value.as_dict()
    elif isinstance(value, list):
        value = [x.as_dict() if isinstance(x, Record) else x for x in value]
    return json_safe(value)
