"""Stop rules: futility (worse than X and no trend over a window), divergence, wall-clock budget."""

from __future__ import annotations

import math

import pytest

from gates.contract import StopRules
from gates.execution import PlatformReporter, StopRuleEngine
from gates.study import Budget, Halt

DIRECTIONS = {"acc": "higher", "loss": "lower"}


def engine(rules: dict, arm="a", clock=None):
    kwargs = {"clock": clock} if clock else {}
    return StopRuleEngine(StopRules.model_validate(rules), arm, DIRECTIONS, **kwargs)


def feed(eng, series: list[tuple[int, dict]]):
    reporter = PlatformReporter(Budget(1000, 10), eng)
    for step, metrics in series:
        reporter.report(step, metrics)
    return reporter


FUTILITY = {
    "futility": [
        {
            "metric": "acc",
            "at_step": 100,
            "worse_than": 0.5,
            "window": 50,
            "min_rel_improvement": 0.01,
        }
    ]
}


def test_futility_halts_a_flat_hopeless_run():
    with pytest.raises(Halt) as info:
        feed(engine(FUTILITY), [(s, {"acc": 0.30}) for s in range(10, 110, 10)])
    assert info.value.reason == "futility" and info.value.step == 100
    assert "0.3" in info.value.detail and "over the last 50 steps" in info.value.detail


def test_futility_spares_a_run_that_is_still_improving():
    series = [
        (s, {"acc": 0.1 + 0.003 * s}) for s in range(10, 160, 10)
    ]  # 0.4 at 100, +60% over 50 steps
    feed(engine(FUTILITY), series)


def test_futility_spares_a_run_that_is_good_enough():
    feed(engine(FUTILITY), [(s, {"acc": 0.9}) for s in range(10, 200, 10)])


def test_futility_looks_once_at_its_step():
    # fine at step 100 (improving), flat afterwards: a single look means no halt later
    series = [(s, {"acc": 0.004 * s}) for s in range(10, 110, 10)] + [
        (s, {"acc": 0.4}) for s in range(110, 300, 10)
    ]
    feed(engine(FUTILITY), series)


def test_futility_for_lower_is_better_metric():
    rules = {
        "futility": [
            {
                "metric": "loss",
                "at_step": 20,
                "worse_than": 1.0,
                "window": 10,
                "min_rel_improvement": 0.05,
            }
        ]
    }
    with pytest.raises(Halt):
        feed(engine(rules), [(10, {"loss": 2.0}), (20, {"loss": 1.99})])
    feed(engine(rules), [(10, {"loss": 2.0}), (20, {"loss": 1.5})])  # 25% better: a trend


def test_futility_only_for_named_arms():
    rules = {"futility": [{**FUTILITY["futility"][0], "arms": ["treatment"]}]}
    feed(engine(rules, arm="baseline"), [(s, {"acc": 0.1}) for s in range(10, 200, 10)])
    with pytest.raises(Halt):
        feed(engine(rules, arm="treatment"), [(s, {"acc": 0.1}) for s in range(10, 200, 10)])


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_divergence_halts_on_non_finite(bad):
    with pytest.raises(Halt) as info:
        feed(engine({}), [(10, {"loss": 1.0}), (20, {"loss": bad})])
    assert info.value.reason == "divergence" and info.value.step == 20


def test_divergence_can_watch_only_some_metrics_or_be_disabled():
    feed(engine({"divergence": {"metrics": ["loss"]}}), [(10, {"loss": 1.0, "acc": math.nan})])
    feed(engine({"divergence": {"enabled": False}}), [(10, {"loss": math.nan})])


def test_budget_halts_on_wall_clock():
    now = [0.0]
    eng = engine({"budget": {"max_seconds": 5}}, clock=lambda: now[0])
    reporter = PlatformReporter(Budget(100, 10), eng)
    reporter.report(10, {"loss": 1.0})
    now[0] = 6.0
    with pytest.raises(Halt) as info:
        reporter.report(20, {"loss": 0.9})
    assert info.value.reason == "budget"


def test_reporter_rejects_non_numbers():
    with pytest.raises(TypeError, match="metric 'loss' must be a number"):
        feed(engine({}), [(10, {"loss": "low"})])


RELATIVE = {
    "futility": [
        {
            "metric": "loss",
            "at_step": 100,
            "behind_best_other_by": 3.0,
            "window": 50,
            "min_rel_improvement": 0.01,
            "arms": ["treatment"],
        }
    ]
}


def test_relative_futility_halts_an_arm_far_behind_the_best_other_arm():
    others = {"baseline": {"loss": [(50, 12.0), (100, 10.0)]}, "ablation": {"loss": [(100, 11.0)]}}
    with pytest.raises(Halt) as info:
        feed(
            engine_with(RELATIVE, "treatment", others),
            [(50, {"loss": 13.05}), (100, {"loss": 13.01})],
        )
    assert "worse than 13" in info.value.detail and "best other arm" in info.value.detail


def test_relative_futility_spares_an_arm_within_the_margin_or_still_improving():
    others = {"baseline": {"loss": [(100, 10.0)]}}
    feed(
        engine_with(RELATIVE, "treatment", others), [(50, {"loss": 12.9}), (100, {"loss": 12.9})]
    )  # within 3
    feed(
        engine_with(RELATIVE, "treatment", others), [(50, {"loss": 20.0}), (100, {"loss": 14.0})]
    )  # -30%: trend


def test_relative_futility_without_reference_does_not_halt():
    feed(engine_with(RELATIVE, "treatment", {}), [(50, {"loss": 99.0}), (100, {"loss": 99.0})])


def test_relative_futility_needs_arms_and_exactly_one_bar():
    from pydantic import ValidationError

    rule = dict(RELATIVE["futility"][0])
    with pytest.raises(ValidationError, match="needs `arms`"):
        StopRules.model_validate({"futility": [{**rule, "arms": None}]})
    with pytest.raises(ValidationError, match="exactly one of"):
        StopRules.model_validate({"futility": [{**rule, "worse_than": 1.0}]})


def engine_with(rules: dict, arm: str, others: dict):
    return StopRuleEngine(StopRules.model_validate(rules), arm, DIRECTIONS, others=others)


def test_futility_without_a_full_window_of_history_does_not_halt():
    # one evaluation only: no earlier value to measure a trend against
    feed(engine(FUTILITY), [(100, {"acc": 0.1})])
