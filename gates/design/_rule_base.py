"""What every design rule reads: the contract, its study and arm configs, each condition and control
with its location (`_RuleBase`), the metric's declaration, the range an arm can reach and its value
at chance, and the errors said at a field's line; and what several rules share (`failing_arms`,
`config_differences`).
"""

from __future__ import annotations

from gates.contract import Compare, Contract, Threshold
from gates.errors import UserError
from gates.study import Study


class _RuleBase:
    """The contract and study the rules read, and the errors they add, each at a field of the file."""

    def __init__(self, contract: Contract, study: Study, arm_configs: dict, err):
        self.c, self.study, self.configs, self.err = contract, study, arm_configs, err
        self.errors: list[UserError] = []
        self.current = ""  # the rule being checked (its short name)
        self.located = [(("decision", name, i), c) for name, i, c in contract.conditions()] + [
            (("controls", i), c) for i, c in enumerate(contract.controls)
        ]

    def add(self, loc: tuple, msg: str, at: tuple | None = None) -> None:
        """An error at field `loc`; `at`: the field whose line it is said at, when `loc` may be absent
        from the file (a missing `differences`: the line of the arm's value that needs it)."""
        if "(rule: " not in msg:
            msg = f"{msg} (rule: {self.current})"
        error = self.err(loc, msg)
        if at is not None:
            error.line = self.err(at, msg).line
        self.errors.append(error)

    # ------------------------------------------------------------------ what a metric is
    def spec(self, metric: str):
        return self.study.metrics.get(metric)

    def span(self, arm: str, metric: str) -> tuple[float | None, float | None]:
        """The range `arm` can reach on `metric`: the study's tighter one for the arm's config, else declared."""
        if self.spec(metric) is None:
            return None, None
        config = self.configs.get(arm)
        return (
            self.study.metric_range(metric, config)
            if config is not None
            else (self.spec(metric).low, self.spec(metric).high)
        )

    def chance(self, arm: str, metric: str) -> float | None:
        config = self.configs.get(arm)
        return (
            self.study.chance(metric, config) if config is not None and self.spec(metric) else None
        )

    def better(self, c) -> bool:
        """Whether a threshold or compare asserts its `arm` is good (the metric's better direction)."""
        spec = self.spec(c.metric)
        return spec is not None and c.direction == spec.direction


# ---------------------------------------------------------------------------------- helpers
def failing_arms(c, spec) -> list[str]:
    """The arms a threshold or compare asserts fail: a threshold in its metric's worse direction, the
    worse side of a compare (not a non-inferiority bound; trends compare arms that each must work, and
    assert no failure)."""
    if isinstance(c, Threshold):
        metric = spec(c.metric)
        return [c.arm] if metric is not None and c.direction != metric.direction else []
    if isinstance(c, Compare) and c.other != c.arm:
        metric = spec(c.metric)
        if metric is None or c.non_inferiority:  # a non-inferiority bound asserts that no arm fails
            return []
        return [c.other] if c.direction == metric.direction else [c.arm]
    return []


_SIGN = {"higher": ">=", "lower": "<="}  # what a threshold in each direction asserts


def _beyond(a: float, b: float, direction: str) -> bool:
    """Whether `a` lies strictly beyond `b` in `direction` (higher: a > b; lower: a < b)."""
    return a > b if direction == "higher" else a < b


def config_differences(a, b) -> dict[str, tuple]:
    """field -> (a's value, b's value) for every arm config field in which two arms differ."""
    x, y = a.model_dump(mode="json"), b.model_dump(mode="json")
    return {
        k: (x.get(k), y.get(k)) for k in dict.fromkeys(list(x) + list(y)) if x.get(k) != y.get(k)
    }


def _diff_span(low_a, high_a, low_b, high_b):
    """The range of a - b given the ranges of a and b (None: unbounded on that side)."""
    lo = None if low_a is None or high_b is None else low_a - high_b
    hi = None if high_a is None or low_b is None else high_a - low_b
    return lo, hi
