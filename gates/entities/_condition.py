"""A condition as evidence.json records it (`ConditionRecord`): a decision condition or a control,
its statistics and outcome."""

from __future__ import annotations

from typing import Literal

from gates.entities._record import Number, Record


class ConditionRecord(Record):
    """A decision condition or a control as judged: its statistics and outcome."""

    list_name: Literal["supported_if", "refuted_if", "controls"]
    index: int
    kind: str | None = None
    description: str
    estimate: Number = None
    ci_low: Number = None
    ci_high: Number = None
    ci_level: Number = None
    p_hold: Number = None
    p_fail: Number = None
    p_hold_adj: Number = None
    p_fail_adj: Number = None
    test: str
    n: dict[str, int] = {}
    values: dict[str, list[Number]] = {}
    outcome: Literal["holds", "fails", "undetermined"]
    note: str | None = None
    seeds_needed: int | None = None
    test_reason: str | None = None
    control: str | None = None  # a control's kind: positive or negative
    estimand: str | None = None  # what the estimate estimates, on which scale (engine 3)
    scale: str | None = None
    adjustment: str | None = None

    @property
    def label(self) -> str:
        """Where the contract lists it: `supported_if[0]`, `controls[1]`."""
        return f"{self.list_name}[{self.index}]"
