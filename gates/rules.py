"""Stop rules: halt runs that are hopeless (futility) or broken (divergence, budget).

Rules only ever stop a run. Nothing is declared supported early: a verdict is computed once, from
final values, because repeated looks at a success criterion would inflate false positives.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping

from gates.contract import FutilityRule, StopRules
from gates.study import Direction, Halt, Metric


class StopRuleEngine:
    """Asks a contract's stop rules about one arm x seed run after each report."""

    def __init__(self, rules: StopRules, arm: str, metrics: Mapping[str, Metric | Direction], clock=time.monotonic,
                 others: dict[str, dict[str, list[tuple[int, float]]]] | None = None):
        """`metrics`: the study's metrics (`Study.metrics`) or plain better directions by name; stop
        rules may read a metric of any role. `others`: the histories (arm -> metric -> [(step, value)])
        of the other arms already run on this seed, the reference for `behind_best_other_by` rules."""
        self.rules = rules
        self.others = others or {}
        self.directions: dict[str, Direction] = {
            name: m.direction if isinstance(m, Metric) else m for name, m in metrics.items()}
        self.futility = [r for r in rules.futility if r.arms is None or arm in r.arms]
        self.looked: set[int] = set()  # futility rules look once, at the first report at/after at_step
        self.clock = clock
        self.started = clock()

    def check(self, step: int, metrics: dict[str, float], history: dict[str, list[tuple[int, float]]]) -> Halt | None:
        return (self._divergence(step, metrics) or self._budget(step) or self._futility(step, history))

    def _divergence(self, step, metrics) -> Halt | None:
        rule = self.rules.divergence
        if not rule.enabled:
            return None
        watched = rule.metrics or list(metrics)
        for name in watched:
            if name in metrics and not math.isfinite(metrics[name]):
                return Halt("divergence", step, f"{name} = {metrics[name]} is not finite")
        return None

    def _budget(self, step) -> Halt | None:
        budget = self.rules.budget
        if budget is None:
            return None
        elapsed = self.clock() - self.started
        if elapsed > budget.max_seconds:
            return Halt("budget", step, f"{elapsed:.1f} s exceeds the budget of {budget.max_seconds:g} s")
        return None

    def _futility(self, step, history) -> Halt | None:
        for i, rule in enumerate(self.futility):
            if i in self.looked or step < rule.at_step or not history.get(rule.metric):
                continue
            self.looked.add(i)
            bar = rule.worse_than
            if rule.behind_best_other_by is not None:
                bar = relative_bar(rule, self.directions[rule.metric], self.others, step)
                if bar is None:  # no other arm has a value by this step: nothing to be behind
                    continue
            halt = futility_halt(rule, self.directions[rule.metric], history[rule.metric], step, bar)
            if halt:
                return halt
        return None


def relative_bar(rule: FutilityRule, direction: Direction, others: dict, step: int) -> float | None:
    """The best other arm's value at `step` (its latest at or before it), moved by the margin."""
    values = []
    for arm, histories in others.items():
        seen = [v for s, v in histories.get(rule.metric, []) if s <= step and math.isfinite(v)]
        if seen and arm not in (rule.arms or []):
            values.append(seen[-1])
    if not values:
        return None
    if direction == "higher":
        return max(values) - rule.behind_best_other_by
    return min(values) + rule.behind_best_other_by


def futility_halt(rule: FutilityRule, direction: Direction, series: list[tuple[int, float]], step: int,
                  bar: float) -> Halt | None:
    """Halt when the metric is worse than `bar` and improved by less than `min_rel_improvement`
    (relative) over the last `window` steps."""
    current = series[-1][1]
    worse = current < bar if direction == "higher" else current > bar
    if not worse:
        return None
    # the value `window` steps ago: the latest one recorded at or before step - window. Without one
    # there is no trend to judge, so no halt (contracts are checked so that one exists).
    earlier = [v for s, v in series if s <= step - rule.window]
    if not earlier:
        return None
    before = earlier[-1]
    gain = (current - before) if direction == "higher" else (before - current)
    relative = gain / max(abs(before), 1e-12)
    if relative >= rule.min_rel_improvement:
        return None
    return Halt("futility", step,
                f"{rule.metric} = {current:.4g} is worse than {bar:.4g}{_bar_origin(rule)} at step {step} and improved "
                f"{relative:+.2%} over the last {rule.window} steps (< {rule.min_rel_improvement:.2%})")


def _bar_origin(rule: FutilityRule) -> str:
    if rule.behind_best_other_by is None:
        return ""
    return f" (the best other arm moved by {rule.behind_best_other_by:g})"
