"""Stop rules: halt runs that are hopeless (futility) or broken (divergence, budget).

Rules only ever stop a run. Nothing is declared supported early: a verdict is computed once, from
final values, because repeated looks at a success criterion would inflate false positives.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping

from gates.contract import Convergence, FutilityRule, StopRules
from gates.entities import ConvergenceRecord
from gates.record import is_converged
from gates.study import Direction, Halt, Metric


class StopRuleEngine:
    """Asks a contract's stop rules about one arm x seed run after each report."""

    def __init__(
        self,
        rules: StopRules,
        arm: str,
        metrics: Mapping[str, Metric | Direction],
        clock=time.monotonic,
        others: dict[str, dict[str, list[tuple[int, float]]]] | None = None,
    ):
        """`metrics`: the study's metrics (`Study.metrics`) or plain better directions by name; stop
        rules may read a metric of any role. `others`: the histories (arm -> metric -> [(step, value)])
        of the other arms already run on this seed, the reference for `behind_best_other_by` rules."""
        self.rules = rules
        self.others = others or {}
        self.directions: dict[str, Direction] = {
            name: m.direction if isinstance(m, Metric) else m for name, m in metrics.items()
        }
        self.futility = [r for r in rules.futility if r.arms is None or arm in r.arms]
        self.looked: set[int] = (
            set()
        )  # futility rules look once, at the first report at/after at_step
        self.clock = clock
        self.started = clock()

    def check(
        self, step: int, metrics: dict[str, float], history: dict[str, list[tuple[int, float]]]
    ) -> Halt | None:
        return (
            self._divergence(step, metrics) or self._budget(step) or self._futility(step, history)
        )

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
            return Halt(
                "budget", step, f"{elapsed:.1f} s exceeds the budget of {budget.max_seconds:g} s"
            )
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
            halt = futility_halt(
                rule, self.directions[rule.metric], history[rule.metric], step, bar
            )
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


def futility_halt(
    rule: FutilityRule, direction: Direction, series: list[tuple[int, float]], step: int, bar: float
) -> Halt | None:
    """Halt when the metric is worse than `bar` and improved by less than `min_rel_improvement`
    (relative) over the last `window` steps."""
    current = series[-1][1]
    worse = current < bar if direction == "higher" else current > bar
    if not worse:
        return None
    # Without a value `window` steps back there is no trend to judge, so no halt (contracts are
    # checked so that one exists).
    trend = relative_improvement(series, direction, step, rule.window)
    if trend is None:
        return None
    relative = trend[2]
    if relative >= rule.min_rel_improvement:
        return None
    return Halt(
        "futility",
        step,
        f"{rule.metric} = {current:.4g} is worse than {bar:.4g}{_bar_origin(rule)} at step {step} and improved "
        f"{relative:+.2%} over the last {rule.window} steps (< {rule.min_rel_improvement:.2%})",
    )


def relative_improvement(
    series: list[tuple[int, float]], direction: Direction, step: int, window: int
) -> tuple[int, float, float] | None:
    """(earlier step, its value, relative improvement) of the series' latest value against the value
    `window` steps before `step` (the latest one recorded at or before step - window), in the metric's
    better direction: > 0 is better. None when nothing was recorded that far back."""
    current = series[-1][1]
    earlier = [(s, v) for s, v in series if s <= step - window]
    if not earlier:
        return None
    before_step, before = earlier[-1]
    gain = (current - before) if direction == "higher" else (before - current)
    return before_step, before, gain / max(abs(before), 1e-12)


def convergence(rule: Convergence, direction: Direction, series: list[tuple[int, float]]) -> dict:
    """A completed run's convergence on `rule.metric` from its reported `series`: `converged` (False
    when it improved by more than `max_rel_improvement` over the last `window` steps, or when the trend
    cannot be measured or is not finite: nothing shows it had stopped learning) and the numbers behind it."""
    record = {
        "metric": rule.metric,
        "window": rule.window,
        "first_step": None,
        "last_step": None,
        "first_value": None,
        "last_value": None,
        "rel_improvement": None,
    }
    if not series:
        return {"converged": False, "convergence": record}
    last_step, last_value = series[-1]
    record.update(last_step=last_step, last_value=_finite(last_value))
    trend = relative_improvement(series, direction, last_step, rule.window)
    if trend is not None:
        record.update(
            first_step=trend[0], first_value=_finite(trend[1]), rel_improvement=_finite(trend[2])
        )
    return {"converged": is_converged(rule, ConvergenceRecord(**record)), "convergence": record}


def preflight_convergence(loaded, refuse) -> list[str]:
    """Preflight for a contract's convergence rule (the loader checks the window's bounds): the metric is a
    train or validation metric (those are reported at every evaluation, and the test split must not decide
    whether an arm trained enough), and an evaluation lies `window` steps before the last. `refuse(loc,
    msg)` records an error; returns the note `gates check` prints."""
    c, study = loaded.contract, loaded.study
    conv = c.convergence
    spec = study.metrics.get(conv.metric)
    if spec is None:
        return []  # the loader refused it
    if spec.role not in ("train", "validation"):
        refuse(
            ("convergence", "metric"),
            f"{conv.metric!r} is a {spec.role} metric of study {study.name!r}; expected a train or validation "
            f"metric, reported at every evaluation (the test split must not decide whether an arm trained enough)",
        )
        return []
    # The evaluations of `Budget.is_eval_step` (every eval_every steps, and the last step) computed,
    # not listed: listing a budget's steps one by one hung `gates check` on a huge budget (issue #28).
    # The first is at eval_every (the loader checked eval_every <= steps), the last at steps; the one
    # the window starts from is the latest multiple of eval_every at or before steps - window.
    every, last = c.budget.eval_every, c.budget.steps
    earlier = (last - conv.window) // every * every
    if earlier < every:
        refuse(
            ("convergence", "window"),
            f"no evaluation lies {conv.window} steps before the last (step {last}) with eval_every "
            f"{every}; expected window <= {last - every}",
        )
        return []
    return [
        f"convergence: {conv.metric} ({spec.direction} is better) from the evaluation at step {earlier} to "
        f"the last at step {last} (window {conv.window} steps, eval every {every}); a completed run "
        f"that improved it by more than {conv.max_rel_improvement:.2%} (relative) is not converged, and every "
        f"decision condition reading its arm is undetermined (halted runs are not judged)"
    ]


def _finite(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def _bar_origin(rule: FutilityRule) -> str:
    if rule.behind_best_other_by is None:
        return ""
    return f" (the best other arm moved by {rule.behind_best_other_by:g})"
