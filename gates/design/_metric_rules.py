"""The design rules on what a condition asserts of a metric: it reads a metric of its role (`roles`),
its bar lies inside the arm's range and beyond chance (`ranges_and_chance`), compared metrics share a
scale and unit (`scales`), and it estimates what the claim's words name (`estimands`).
"""

from __future__ import annotations

import re

from gates.contract import Compare, Threshold, condition_terms, metric_locs
from gates.design._rule_base import _diff_span, _RuleBase
from gates.study import CONTROL_ROLES, DECISION_ROLES

# what a claim's words name: a mean (arithmetic or geometric: the metric's scale decides which), a
# median, a share of seeds
ESTIMAND_WORDS = {
    "mean": re.compile(r"\b(?:mean|average|averaged|on average)\b", re.IGNORECASE),
    "median": re.compile(r"\bmedians?\b", re.IGNORECASE),
    "proportion": re.compile(
        r"\b(?:share|proportion|fraction|majority)\s+of\s+(?:the\s+)?seeds\b", re.IGNORECASE
    ),
}


class _MetricRules(_RuleBase):
    """Rules `roles`, `ranges_and_chance`, `scales`, `estimands`."""

    def roles(self) -> None:
        """Decisions read only held-out test and cost metrics; controls may also read validation metrics
        (an arm works where it can: held-out data of its own distribution), never a train metric."""
        for base, c in self.located:
            allowed, who = (
                (CONTROL_ROLES, "a control")
                if base[0] == "controls"
                else (DECISION_ROLES, "the decision")
            )
            for loc, metric in metric_locs(c):
                spec = self.spec(metric)
                if spec is not None and spec.role not in allowed:
                    self.add(
                        base + loc,
                        f"{who} reads {metric!r}, a {spec.role} metric of study {self.study.name!r}; "
                        f"expected a {' or '.join(allowed)} metric",
                    )

    def ranges_and_chance(self) -> None:
        """No condition (or control) holds, or cannot hold, for every value its arm can reach; none that
        asserts an arm is good is cleared by an arm at chance."""
        exact = self.c.decision.evaluation == "exact"
        for base, c in self.located:
            vacuous = self.vacuous(c, exact)
            for loc, msg in vacuous:
                self.add(base + loc, msg)
            if isinstance(c, Threshold) and self.better(c) and not vacuous:  # one line per bar
                level = self.chance(c.arm, c.metric)
                passes = level is not None and (
                    level >= c.value if c.direction == "higher" else level <= c.value
                )
                if passes:
                    self.add(
                        base + ("value",),
                        f"an arm that learned nothing ({c.metric} at chance, {level:.4g}) "
                        f"already satisfies {c.metric} {'>=' if c.direction == 'higher' else '<='} "
                        f"{c.value:g}: the condition tests nothing; expected a bar beyond chance",
                    )

    def vacuous(self, c, inclusive: bool) -> list[tuple[tuple, str]]:
        """(field, why) when a condition holds, or cannot hold, for every value its arms can reach. A
        statistical test needs the bar strictly inside the range (theta = 0 is no evidence); exact
        evaluation (`inclusive`) holds at the bar itself, so there a bar at the range's end can hold."""

        def beyond(x, end):  # the bar leaves no value on the condition's side
            return end is not None and (x > end if inclusive else x >= end)

        if isinstance(c, Threshold):
            low, high = self.span(c.arm, c.metric)
            if c.direction == "lower":  # metric <= value
                always, never = (
                    high is not None and c.value >= high,
                    beyond(-c.value, None if low is None else -low),
                )
            else:
                always, never = low is not None and c.value <= low, beyond(c.value, high)
            what, shown = (
                f"{c.metric} {'<=' if c.direction == 'lower' else '>='} {c.value:g}",
                self.shown(c.arm, c.metric),
            )
        elif isinstance(c, Compare) and c.relative_margin is None:
            (low_a, high_a), (low_b, high_b) = (
                self.span(c.arm, c.metric),
                self.span(c.other, c.other_metric or c.metric),
            )
            m = c.margin or 0.0
            if c.direction == "higher":  # arm - other - m >= 0
                lo, hi = _diff_span(low_a, high_a, low_b, high_b)
            else:  # other - arm - m >= 0
                lo, hi = _diff_span(low_b, high_b, low_a, high_a)
            always, never = lo is not None and lo - m >= 0, beyond(m, hi)
            what, shown = f"margin {m:g}", self.shown(c.arm, c.metric)
        else:
            return []
        field = ("value",) if isinstance(c, Threshold) else ("margin",)
        if always:
            return [
                (
                    field,
                    f"{what} holds for every value the metric can take ({shown}): the condition tests "
                    f"nothing; expected a bar inside the metric's range",
                )
            ]
        if never:
            return [
                (
                    field,
                    f"{what} cannot hold for any value the metric can take ({shown}): a condition that can "
                    f"never hold (a statistical test needs the bar strictly inside the range)",
                )
            ]
        return []

    def shown(self, arm: str, metric: str) -> str:
        spec = self.spec(metric)
        if spec is None:
            return "?"
        low, high = self.span(arm, metric)
        if (low, high) != (spec.low, spec.high):
            return (
                f"{spec.describe()}; for arm {arm}: [{'-inf' if low is None else f'{low:g}'}, "
                f"{'inf' if high is None else f'{high:g}'}]"
            )
        return spec.describe()

    def scales(self) -> None:
        """A relative margin scales non-negative metrics only; a log-scale metric compares by ratio (a
        relative margin, or none); two different metrics are compared only on one declared unit, or
        paired within the same runs."""
        for base, c in self.located:
            if isinstance(c, Compare) and c.relative_margin is not None:
                for _, metric in metric_locs(c):
                    spec = self.spec(metric)
                    if spec is not None and not spec.nonnegative:
                        self.add(
                            base + ("relative_margin",),
                            f"a relative margin scales {metric!r}, which study {self.study.name!r} does not "
                            f"declare non-negative: with negative values a worse arm would hold; expected an "
                            f"absolute `margin`",
                        )
            if isinstance(c, Compare) and c.margin:
                logs = [m for _, m in metric_locs(c) if getattr(self.spec(m), "scale", "") == "log"]
                if logs:
                    self.add(
                        base + ("margin",),
                        f"{logs[0]!r} is a log-scale metric of study {self.study.name!r} "
                        f"(positive, right-skewed: judged by ratios of geometric means); "
                        f"expected a `relative_margin` instead of an absolute margin",
                    )
            for loc, metric in metric_locs(c):
                spec = self.spec(metric)
                if spec is not None and spec.skewed_linear:
                    self.add(
                        base + loc,
                        f"{metric!r} is positive, unbounded above and better lower (a loss, an error, a "
                        f"latency), but study {self.study.name!r} declares it linear without saying why: a "
                        f"t-test on right-skewed values does not keep its level (lognormal at the bar: "
                        f"20-24% false support); expected `positive(...)` (the log scale) or a "
                        f"`linear_reason` in the study's declaration",
                    )
            metrics = list(dict.fromkeys(m for _, m in condition_terms(c)))
            if len(metrics) > 1:
                units = {getattr(self.spec(m), "unit", None) for m in metrics}
                same_runs = (
                    getattr(c, "test", None) == "paired"
                    and len({a for a, _ in condition_terms(c)}) == 1
                )
                if not same_runs and (None in units or len(units) > 1):
                    self.add(
                        base,
                        f"compares different metrics ({', '.join(metrics)}) that study {self.study.name!r} "
                        f"does not declare on one unit; expected metrics with the same `unit`, or a paired "
                        f"test within one arm (the same runs)",
                    )

    def estimands(self) -> None:
        """Each condition's estimand has a test that keeps its level on its metrics (a geometric mean
        needs positive metrics and a ratio; no arithmetic mean of a right-skewed metric unbounded
        above), and a decision condition estimates what the claim's words (the claim, gates 3 and 5)
        name, or says why not (`estimand_reason`)."""
        from gates.inference import condition_estimand, log_able

        metrics = self.study.metrics
        pf = self.c.preflight
        words = " ".join(
            [self.c.claim, pf.predicted_ablation.statement, pf.falsifiable_point.statement]
        )
        named = {e for e, pattern in ESTIMAND_WORDS.items() if pattern.search(words)}
        for base, c in self.located:
            estimand = condition_estimand(c, metrics)
            if estimand == "geometric_mean" and not log_able(c, metrics):
                self.add(
                    base + ("estimand",),
                    "a geometric mean needs positive metrics (declared low >= 0) and a ratio (a "
                    "threshold above 0, a compare with a relative margin or none, a trend); expected "
                    "estimand mean or median",
                )
            skewed = [
                m
                for _, m in condition_terms(c)
                if (spec := metrics.get(m)) is not None
                and spec.scale == "log"
                and spec.high is None
            ]
            if c.estimand == "mean" and skewed:
                self.add(
                    base + ("estimand",),
                    f"the arithmetic mean of {skewed[0]!r}, a positive right-skewed metric unbounded "
                    f"above, has no test that keeps its level at a few seeds; expected estimand "
                    f"geometric_mean (its default) or median",
                )
            family = {"geometric_mean": "mean"}.get(estimand, estimand)
            if base[0] == "decision" and named and family not in named and not c.estimand_reason:
                self.add(
                    base + ("estimand",),
                    f"the claim's words speak of the {' or '.join(sorted(named))}, but this condition "
                    f"estimates the {estimand.replace('_', ' ')}; expected estimand "
                    f"{' or '.join(sorted(named))}, or an `estimand_reason` saying why it differs",
                )
