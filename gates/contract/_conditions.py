"""A contract's decision: its conditions (`Threshold`, `Compare`, `Trend`, each with an optional
ceiling), the `Decision` that lists them with its alpha and evaluation, the controls that must hold for
a verdict to stand (`Control`), and what a condition reads (`condition_terms`, `metric_locs`,
`arms_under_test`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from gates.contract._bounds import DEFAULT_ALPHA, MAX_ITEMS, Strict
from gates.study import Direction


# ---------------------------------------------------------------------------------- decision
class CeilingRef(Strict):
    """What the best possible arm reaches on a condition's metric, declared by the contract (a study may
    declare it too, `Study.ceiling`): a value known before the run, a metric the condition's arm reports
    in every run (its per-seed ceiling), or an oracle arm of the contract (its values of the same
    metric). A bar beyond a known ceiling is refused by `gates check`; a bar beyond the measured one
    makes the verdict invalid: the condition tests nothing."""

    why: str = Field(
        min_length=1, description="what reaches the ceiling, and why nothing can do better"
    )
    value: float | None = None
    metric: str | None = None
    arm: str | None = None

    @model_validator(mode="after")
    def _one_source(self):
        if sum(x is not None for x in (self.value, self.metric, self.arm)) != 1:
            raise ValueError(
                "give exactly one of value (known before the run), metric (reported by the arm's "
                "runs) or arm (an oracle arm)"
            )
        return self


class _Condition(Strict):
    # One alpha for the whole family (decision.alpha): a per-condition alpha compared with p-values
    # computed at the family's alpha is not a valid test, so there is none.
    interval: Literal["t", "bootstrap"] = Field(
        default="t",
        description="the interval shown: t (the test's own) or bootstrap (percentile "
        "bootstrap); the p-values always come from the estimand's test",
    )
    ceiling: CeilingRef | None = Field(
        default=None,
        description="what the best possible arm reaches on this "
        "condition's metric (threshold and compare conditions)",
    )
    # What the condition is about, fixed before the data: the test follows from it and from the metrics'
    # declarations, never from the values (gates.inference: the estimands and their tests)
    estimand: Literal["mean", "geometric_mean", "median", "proportion"] | None = Field(
        default=None,
        description="what the condition estimates: the mean (default on a linear metric), the "
        "geometric_mean (default on a log-scale metric), the median, or the proportion of seeds "
        "on the condition's side (with `share`)",
    )
    share: float | None = Field(
        default=None,
        gt=0,
        lt=1,
        description="estimand proportion: the condition holds when more than this share of seeds "
        "fall on its side of the bar",
    )
    estimand_reason: str | None = Field(
        default=None,
        min_length=1,
        description="why the condition estimates another quantity than the claim's words name "
        "(a claim about a mean judged on the median, say)",
    )
    refutes: str | None = Field(
        default=None,
        min_length=1,
        description="a refuted_if condition that reads none of the supported_if conditions' (arm, "
        "metric) terms: what else it refutes (a premise the claim rests on: the baseline it was "
        "measured against, the mechanism it names)",
    )

    @model_validator(mode="after")
    def _share_with_proportion(self):
        if (self.estimand == "proportion") != (self.share is not None):
            raise ValueError(
                "estimand proportion takes a share (0 < share < 1), and share goes only with "
                "estimand proportion"
            )
        return self


class Threshold(_Condition):
    """arm's metric vs a constant: `higher` means metric >= value, `lower` means metric <= value."""

    kind: Literal["threshold"]
    arm: str
    metric: str
    direction: Direction
    value: float


class Compare(_Condition):
    """arm vs other arm (or another metric), with an absolute or relative margin.

    `higher`: arm >= other + margin (absolute) or arm >= other * (1 + relative_margin).
    `lower`:  arm <= other - margin (absolute) or arm <= other * (1 - relative_margin).
    A negative margin states non-inferiority ("no more than 0.05 above": lower, -0.05); so does a
    negative relative margin ("no more than 2% above": lower, relative_margin -0.02).
    """

    kind: Literal["compare"]
    arm: str
    metric: str
    other: str
    other_metric: str | None = Field(default=None, description="defaults to metric")
    direction: Direction
    margin: float | None = Field(
        default=None,
        description="absolute; negative for non-inferiority: "
        "`lower` with margin -0.05 reads arm <= other + 0.05",
    )
    relative_margin: float | None = Field(
        default=None,
        gt=-1,
        lt=1,
        description="a share of the other side; negative for non-inferiority: "
        "`lower` with relative_margin -0.02 reads arm <= other * 1.02",
    )
    test: Literal["welch", "paired"] = "welch"

    @model_validator(mode="after")
    def _one_margin(self):
        if self.margin is not None and self.relative_margin is not None:
            raise ValueError("give either margin (absolute) or relative_margin, not both")
        return self

    @property
    def non_inferiority(self) -> bool:
        """A bound of "no worse by more than": a negative margin or relative margin (it asserts no
        direction, and that no arm fails)."""
        return (self.margin or 0) < 0 or (self.relative_margin or 0) < 0


class Trend(_Condition):
    """Monotone along an ordered list: over `arms` for one `metric`, or over `metrics` in one `arm`.

    `lower` means each item is below the one before it (strictly, statistically); `higher` above.
    """

    kind: Literal["trend"]
    direction: Direction
    metric: str | None = None
    arms: list[str] | None = Field(default=None, max_length=MAX_ITEMS)
    arm: str | None = None
    metrics: list[str] | None = Field(default=None, max_length=MAX_ITEMS)
    test: Literal["welch", "paired"] = "welch"

    @model_validator(mode="after")
    def _one_axis(self):
        over_arms = self.metric is not None and self.arms is not None
        over_metrics = self.arm is not None and self.metrics is not None
        if over_arms == over_metrics or (self.arms is not None and self.metrics is not None):
            raise ValueError("give either (metric + arms) or (arm + metrics)")
        items = self.arms if over_arms else self.metrics
        if len(items) < 2:
            raise ValueError("a trend needs at least 2 items")
        return self

    def items(self) -> list[tuple[str, str]]:
        """The ordered (arm, metric) terms the trend runs over."""
        if self.arms is not None:
            return [(a, self.metric) for a in self.arms]
        return [(self.arm, m) for m in self.metrics]


Condition = Annotated[Threshold | Compare | Trend, Field(discriminator="kind")]


MAX_ALPHA = 0.1


class Decision(Strict):
    alpha: float = Field(
        default=DEFAULT_ALPHA,
        gt=0,
        le=MAX_ALPHA,
        description="family-wise error rate of the Holm-corrected conditions, at most 0.1 "
        "(above 0.5 the 1 - 2 alpha intervals would invert)",
    )
    family_alpha: float | None = Field(
        default=None,
        gt=0,
        le=MAX_ALPHA,
        description="the alpha of the claim's whole family (this version and every later version that "
        "supersedes it), declared on its first version only; default: `alpha`, which leaves a later "
        "version none. Each version is tested at its own `alpha`, and the versions' alphas add up to at "
        "most this (a re-try is not a fresh test at full alpha)",
    )
    evaluation: Literal["interval", "exact"] = Field(
        default="interval",
        description="exact: no intervals; a condition holds when it holds on every seed "
        "(only for studies that declare themselves deterministic)",
    )
    smallest_effects: dict[str, Annotated[float, Field(gt=0, allow_inf_nan=False)]] = Field(
        default_factory=dict,
        max_length=MAX_ITEMS,
        description="metric -> the smallest difference in it that matters (absolute, in the metric's "
        "declared unit; on a log-scale metric a share, as its relative margins), fixed before the run; "
        "a non-inferiority margin on the metric is at most this, and (absolute) at most the predicted "
        "effect on it",
    )
    supported_if: list[Condition] = Field(min_length=1, max_length=MAX_ITEMS)
    refuted_if: list[Condition] = Field(
        min_length=1, max_length=MAX_ITEMS, description="a contract must be refutable"
    )

    def conditions(self) -> list[tuple[str, int, Any]]:
        """Every condition as (list name, index, condition): the Holm family, in order."""
        return [("supported_if", i, c) for i, c in enumerate(self.supported_if)] + [
            ("refuted_if", i, c) for i, c in enumerate(self.refuted_if)
        ]


# ---------------------------------------------------------------------------------- design guards
ControlRole = Literal["positive", "negative"]


class _Control:
    """A condition that must hold for the experiment to be interpretable. `positive`: the setup can
    detect an effect (the baseline beats a no-source arm); `negative`: what must not pass does not (a
    random topology fails the criterion). A control that fails or cannot be settled makes the verdict
    `invalid`."""


class ThresholdControl(Threshold, _Control):
    control: ControlRole


class CompareControl(Compare, _Control):
    control: ControlRole


class TrendControl(Trend, _Control):
    control: ControlRole


Control = Annotated[ThresholdControl | CompareControl | TrendControl, Field(discriminator="kind")]


def arms_under_test(decision: Decision) -> set[str]:
    """Arms a claim is about: a threshold's arm, a compare's `arm`, every arm of a trend. The other
    arms a decision names (a compare's `other` only) are comparators."""
    under = set()
    for _, _, c in decision.conditions():
        under |= {c.arm} if isinstance(c, (Threshold, Compare)) else {a for a, _ in c.items()}
    return under


def condition_terms(c) -> list[tuple[str, str]]:
    """The (arm, metric) pairs a condition reads."""
    if isinstance(c, Threshold):
        return [(c.arm, c.metric)]
    if isinstance(c, Compare):
        return [(c.arm, c.metric), (c.other, c.other_metric or c.metric)]
    return c.items()


def metric_locs(c) -> list[tuple[tuple, str]]:
    """(field path within the condition, metric) of every metric a condition reads."""
    if isinstance(c, Threshold):
        return [(("metric",), c.metric)]
    if isinstance(c, Compare):
        return [(("metric",), c.metric)] + (
            [(("other_metric",), c.other_metric)] if c.other_metric else []
        )
    if c.metrics is not None:
        return [(("metrics", j), m) for j, m in enumerate(c.metrics)]
    return [(("metric",), c.metric)]
