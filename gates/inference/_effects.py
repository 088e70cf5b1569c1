"""A condition as effects: theta = const + sum(coef * centre(term)), oriented so that theta > 0 means the
condition holds, on the condition's scale. What a condition estimates (`condition_estimand`), on which
scale (`condition_scale`) and by which test (`condition_test`) follow from the contract and the metrics'
declarations, before any data; `_describe` and `_estimand` say the condition in words.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from gates.contract import Compare, Threshold, condition_terms
from gates.study import Metric


# ---------------------------------------------------------------------------------- effects
@dataclass(frozen=True)
class _Term:
    arm: str
    metric: str
    coef: float

    @property
    def key(self) -> str:
        return f"{self.arm}.{self.metric}"


@dataclass(frozen=True)
class _Effect:
    """theta = const + sum(coef * centre(term)) on the condition's scale (`log`: of the terms' log values);
    strict: theta == 0 does not count as holding."""

    terms: tuple[_Term, ...]
    const: float
    strict: bool = False
    log: bool = False


ESTIMANDS = ("mean", "geometric_mean", "median", "proportion")


# each estimand's test, chosen from the contract and the metrics' declarations before any data
TESTS = {
    "t": "the t-test on its scale",
    "bounded": "the bounded-mean test",
    "sign": "the sign test",
    "binomial": "the binomial test",
}


def _multiplicative(c) -> bool:
    """A threshold above 0, a compare with a relative margin or none, a trend: conditions that a ratio
    (the log scale) can state."""
    if isinstance(c, Threshold):
        return c.value > 0
    if isinstance(c, Compare):
        return not c.margin
    return True


def log_able(c, metrics: Mapping[str, Metric]) -> bool:
    """Whether the condition can be judged on the log scale: every metric it reads is positive
    (declared low >= 0) and the condition is multiplicative."""
    terms = condition_terms(c)
    return (
        bool(terms)
        and _multiplicative(c)
        and all(metrics.get(m) is not None and metrics[m].nonnegative for _, m in terms)
    )


def condition_estimand(c, metrics: Mapping[str, Metric]) -> str:
    """What the condition estimates: its declared `estimand`, else the default its metrics' declarations
    give when they agree (`Metric.default_estimand`: the geometric mean on the log scale, the median of a
    metric bounded on both sides, else the mean; a geometric mean only where the condition is a ratio),
    else the mean. Never the data."""
    declared = getattr(c, "estimand", None)
    if declared:
        return declared
    defaults = {
        metrics[m].default_estimand if metrics.get(m) is not None else "mean"
        for _, m in condition_terms(c)
    }
    default = defaults.pop() if len(defaults) == 1 else "mean"
    return "mean" if default == "geometric_mean" and not _multiplicative(c) else default


def condition_scale(c, metrics: Mapping[str, Metric]) -> str:
    """'log' when the condition estimates a geometric mean (its terms' logs), else 'linear'."""
    return (
        "log"
        if condition_estimand(c, metrics) == "geometric_mean" and log_able(c, metrics)
        else "linear"
    )


def bounded(metric: Metric | None) -> bool:
    return metric is not None and metric.low is not None and metric.high is not None


def condition_test(c, metrics: Mapping[str, Metric]) -> str:
    """The test of the condition's estimand (a key of TESTS): the median by the sign test, a proportion
    by the binomial test, a mean whose every term has a declared range by the bounded-mean test (valid
    with ties, values at the bounds and collapsed seeds, where no t-test is), any other mean or
    geometric mean by the t-test on its scale."""
    estimand = condition_estimand(c, metrics)
    if estimand == "median":
        return "sign"
    if estimand == "proportion":
        return "binomial"
    if estimand == "mean" and all(bounded(metrics.get(m)) for _, m in condition_terms(c)):
        return "bounded"
    return "t"


def _effects(c, log: bool = False) -> list[_Effect]:
    if isinstance(c, Threshold):
        sign = 1.0 if c.direction == "higher" else -1.0
        return [
            _Effect(
                (_Term(c.arm, c.metric, sign),),
                -sign * (math.log(c.value) if log else c.value),
                log=log,
            )
        ]
    if isinstance(c, Compare):
        other_metric = c.other_metric or c.metric
        r, margin = c.relative_margin, c.margin or 0.0
        if log:  # higher: log A - log B - log(1+r); lower: log B + log(1-r) - log A
            sign_a = 1.0 if c.direction == "higher" else -1.0
            const = -math.log1p(r or 0.0) if c.direction == "higher" else math.log1p(-(r or 0.0))
            return [
                _Effect(
                    (_Term(c.arm, c.metric, sign_a), _Term(c.other, other_metric, -sign_a)),
                    const,
                    log=True,
                )
            ]
        if c.direction == "higher":  # A - B - m  or  A - (1+r) B
            sign_a, coef_b = 1.0, (-(1 + r) if r is not None else -1.0)
        else:  # B - A - m  or  (1-r) B - A
            sign_a, coef_b = -1.0, ((1 - r) if r is not None else 1.0)
        const = 0.0 if r is not None else -margin
        return [
            _Effect((_Term(c.arm, c.metric, sign_a), _Term(c.other, other_metric, coef_b)), const)
        ]
    items = c.items()
    sign = 1.0 if c.direction == "higher" else -1.0  # lower: theta_k = mu_{k-1} - mu_k
    return [
        _Effect((_Term(*items[k - 1], -sign), _Term(*items[k], sign)), 0.0, strict=True, log=log)
        for k in range(1, len(items))
    ]


def _estimand(c, estimand: str, by_seed: bool) -> str:
    """What the condition's estimate estimates, in words: its estimand (declared, or its metrics'
    default) over the seeds, per seed (`by_seed`: paired differences or ratios) or per arm."""
    ratio = estimand == "geometric_mean"
    centre = {"mean": "mean", "geometric_mean": "geometric mean", "median": "median"}.get(estimand)

    def pair(a: str, b: str) -> str:
        if estimand == "proportion":
            return f"share of seeds whose {a} {'/' if ratio else '-'} {b} clears the bar"
        if by_seed:
            return f"{centre} of the per-seed {'ratios' if ratio else 'differences'} {a} {'/' if ratio else '-'} {b}"
        return (
            f"ratio of the geometric means {a} / {b}"
            if ratio
            else f"difference of the {centre}s {a} - {b}"
        )

    if isinstance(c, Threshold):
        if estimand == "proportion":
            return f"share of seeds with {_describe(c)}"
        return f"{centre} of {c.arm}.{c.metric} across seeds"
    if isinstance(c, Compare):
        return pair(f"{c.arm}.{c.metric}", f"{c.other}.{c.other_metric or c.metric}")
    return "each consecutive pair: " + pair("item k", "item k-1")


def _describe(c) -> str:
    if isinstance(c, Threshold):
        return f"{c.arm}.{c.metric} {'>=' if c.direction == 'higher' else '<='} {c.value:g}"
    if isinstance(c, Compare):
        a, b = f"{c.arm}.{c.metric}", f"{c.other}.{c.other_metric or c.metric}"
        op, sign = (">=", "+") if c.direction == "higher" else ("<=", "-")
        if c.relative_margin is not None:
            r = c.relative_margin
            if r < 0:  # non-inferiority: the bound lies on the other side of b
                sign = "-" if sign == "+" else "+"
            return f"{a} {op} {b} * (1 {sign} {abs(r):g})"
        offset = (c.margin or 0.0) * (1 if c.direction == "higher" else -1)
        return (
            f"{a} {op} {b} {'+' if offset > 0 else '-'} {abs(offset):g}"
            if offset
            else f"{a} {op} {b}"
        )
    op = " > " if c.direction == "lower" else " < "
    return f"trend {c.direction}: " + op.join(f"{a}.{m}" for a, m in c.items())
