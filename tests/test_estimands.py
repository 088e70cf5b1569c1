"""Issue #38 part 2 and 3: what a condition estimates is declared (or given by its metrics' declarations)
before any data, and its test follows from that alone: ties, values at a bound and collapsed seeds never
switch a claim about a mean to the median; the mean of a bounded metric is judged by a test valid for any
distribution in its range; a positive right-skewed metric is judged on its declared scale; and the
claim's words bind what its conditions estimate."""

from __future__ import annotations

import numpy as np
import pytest

from gates.contract import Decision
from gates.design._rules import check_rules
from gates.inference import decide
from gates.inference._effects import condition_test
from gates.study import Metric, get_study, positive, proportion
from tests.conftest import c05_current, write_contract
from tests.test_verdict import cond, decision, runs, thr

ACC = {"x": proportion("higher", "test")}


def _verdict(values, **kw):
    d = decision([thr("a", "x", "higher", 0.85, **kw)], [thr("a", "x", "lower", 0.85, **kw)])
    return decide(d, runs("a", x=list(values)), ACC)


def test_ties_and_bounds_never_switch_what_is_estimated():
    """The issue's reproduction: seven seeds at 1.0 and one collapsed at 0.3 were judged on the median
    (the sign test), the same claim on untied values on the mean (the t-test). Now one declaration gives
    one estimand and one test for both: an accuracy's default, the median (printed by `gates check`),
    holds on both; the mean, when declared, is judged by the bounded-mean test on both, and neither
    supports a mean of 0.91 at a bar of 0.85 with 8 seeds."""
    tied, untied = [1, 1, 1, 1, 1, 1, 1, 0.3], [0.99, 0.98, 0.97, 0.96, 0.95, 0.94, 0.93, 0.3]
    for values in (tied, untied):
        c = cond(_verdict(values), "supported_if[0]")
        assert c.test == "sign (exact)" and c.estimand == "median of a.x across seeds"
        assert c.p_hold == pytest.approx(9 / 256) and c.outcome == "holds"
        v = _verdict(values, estimand="mean")
        c = cond(v, "supported_if[0]")
        assert c.test == "bounded mean (betting)" and c.estimand == "mean of a.x across seeds"
        assert v.verdict != "supported"


@pytest.mark.parametrize("n", [5, 8, 10])
def test_collapsed_seeds_at_the_mean_bar_keep_the_level(n):
    """Accuracies that mostly sit near 1 but collapse to 0.3 one time in ten, with the true mean exactly
    at the bar: false support at most alpha (the sign test switched in gave 33-50% here)."""
    rng = np.random.default_rng(n)
    draws, supported = 400, 0
    for _ in range(draws):
        values = np.where(
            rng.random(n) < 0.1, 0.3, np.clip(rng.normal(0.995, 0.004, n), 0, 1)
        ).round(3)
        bar = 0.1 * 0.3 + 0.9 * 0.995  # the true mean
        d = decision(
            [thr("a", "x", "higher", bar, estimand="mean")],
            [thr("a", "x", "lower", bar, estimand="mean")],
        )
        supported += decide(d, runs("a", x=list(values)), ACC).verdict == "supported"
    assert supported / draws <= 0.05 + 3 * np.sqrt(0.05 * 0.95 / draws)


def test_the_bounded_mean_test_holds_where_the_data_allow_it_and_its_interval_covers():
    v = _verdict(
        [1.0] * 30, estimand="mean"
    )  # 30 seeds at 1.0 against 0.85: 1 / 0.85^30 is large enough
    c = cond(v, "supported_if[0]")
    assert c.outcome == "holds" and c.p_hold < 0.05
    assert c.ci_low <= c.estimate <= c.ci_high and c.ci_low > 0
    # a paired compare of two bounded arms: the per-seed differences in [-1, 1]
    cmp_ = {
        "kind": "compare",
        "arm": "a",
        "metric": "x",
        "other": "b",
        "direction": "higher",
        "margin": 0.05,
        "estimand": "mean",
    }
    d = Decision.model_validate({"supported_if": [cmp_], "refuted_if": [thr("a", "x", "lower", 0)]})
    v = decide(d, runs("a", x=[0.95] * 40) + runs("b", x=[0.5] * 40), ACC)
    c = cond(v, "supported_if[0]")
    assert c.test == "bounded mean (betting)" and c.outcome == "holds"


def test_a_share_of_seeds_is_judged_by_the_binomial_test():
    v = _verdict([0.9] * 9 + [0.1], estimand="proportion", share=0.5)
    c = cond(v, "supported_if[0]")
    assert c.test == "binomial (exact)" and c.p_hold == pytest.approx(11 / 1024)
    assert c.estimate == pytest.approx(0.9 - 0.5) and c.ci_low < c.estimate < c.ci_high


def test_share_goes_with_proportion_only():
    for bad in ({"estimand": "proportion"}, {"share": 0.5}, {"estimand": "median", "share": 0.5}):
        with pytest.raises(ValueError, match="share"):
            decision([thr("a", "x", "higher", 0.5, **bad)])


def test_each_metric_declaration_gives_its_default_estimand():
    """The geometric mean on a log-scale metric, the median of a metric bounded on both sides, else the
    mean; a study may declare another default for a metric."""
    assert positive("lower", "test").default_estimand == "geometric_mean"
    assert proportion("higher", "test").default_estimand == "median"
    assert Metric("higher", "test").default_estimand == "mean"
    assert Metric("higher", "test", 0.0, 1.0, estimand="mean").default_estimand == "mean"
    with pytest.raises(ValueError, match="estimand"):
        Metric("higher", "test", estimand="proportion")
    metrics = {"loss": positive("lower", "test"), "d": Metric("higher", "test")}
    assert (
        condition_test(
            Decision.model_validate(
                {
                    "supported_if": [thr("a", "loss", "lower", 1.0)],
                    "refuted_if": [thr("a", "d", "lower", 0)],
                }
            ).supported_if[0],
            metrics,
        )
        == "t"
    )
    v = decide(
        decision([thr("a", "loss", "lower", 1.0)]), runs("a", loss=[0.5, 0.6, 0.55]), metrics
    )
    assert cond(v, "supported_if[0]").scale == "log"
    assert "geometric mean" in cond(v, "supported_if[0]").estimand


# ---------------------------------------------------------------------------------- the design rules
def _rules(data) -> list[str]:
    from gates.contract import Contract

    contract = Contract.model_validate(data)
    study = get_study(contract.study)
    configs = {a: study.Config.model_validate(c) for a, c in contract.arms.items()}
    return [e.message for e in check_rules(contract, study, configs, lambda loc, m: _Err(loc, m))]


class _Err(Exception):
    def __init__(self, loc, message):
        self.loc, self.message = loc, message


def _c05(mutate) -> list[str]:
    data = c05_current()
    mutate(data)
    return _rules(data)


def test_words_that_speak_of_a_mean_bind_the_estimand():
    def median_of_a_mean(d):
        d["claim"] = d["claim"] + " On average over seeds."
        for c in d["decision"]["supported_if"] + d["decision"]["refuted_if"]:
            c["estimand"] = "median"

    errors = [m for m in _c05(median_of_a_mean) if "claim's words" in m]
    assert len(errors) == 8 and "speak of the mean" in errors[0]
    assert "(rule: each condition estimates" in errors[0]

    def with_reason(d):
        median_of_a_mean(d)
        for c in d["decision"]["supported_if"] + d["decision"]["refuted_if"]:
            c["estimand_reason"] = "the typical seed is what the author's figure shows"

    assert not [m for m in _c05(with_reason) if "claim's words" in m]


def test_an_estimand_without_a_valid_test_is_refused():
    def mean_of_a_loss(d):
        d["decision"]["supported_if"][0]["estimand"] = "mean"  # test_loss: positive, log scale

    assert any("arithmetic mean of 'test_loss'" in m for m in _c05(mean_of_a_loss))

    def geometric_mean_with_a_margin(d):
        d["decision"]["supported_if"][0] = {
            "kind": "compare",
            "arm": "subheap_kernel",
            "metric": "test_acc",
            "other": "flat_address",
            "direction": "higher",
            "margin": 0.5,
            "estimand": "geometric_mean",
        }

    assert any(
        "a geometric mean needs positive metrics" in m for m in _c05(geometric_mean_with_a_margin)
    )


def test_a_loss_declared_linear_without_a_reason_is_refused(monkeypatch):
    study = type(get_study("c05_probe"))
    metrics = dict(study.metrics)
    metrics["test_loss"] = Metric("lower", "test", 0.0, None, unit="nats")
    monkeypatch.setattr(study, "metrics", metrics)
    errors = _c05(lambda d: None)
    assert any("'test_loss' is positive, unbounded above and better lower" in m for m in errors)
    metrics["test_loss"] = Metric("lower", "test", 0.0, None, unit="nats", linear_reason="why")
    assert not any("unbounded above and better lower" in m for m in _c05(lambda d: None))


def test_no_shipped_decision_metric_is_a_loss_declared_linear_without_a_reason():
    from gates.study import study_names

    for name in study_names():
        for metric, spec in get_study(name).metrics.items():
            if spec.role in ("test", "cost"):
                assert not spec.skewed_linear, f"{name}.{metric}"


def test_gates_check_prints_each_condition_s_estimand(tmp_path, capsys):
    from gates.cli import check

    data = c05_current()
    data["id"] = "c05-estimands"
    path = write_contract(tmp_path, data)
    check(path, runs_dir=tmp_path / "runs", contracts_dir=path.parent, as_json=False)
    out = capsys.readouterr().out
    assert "supported_if[0] estimates the geometric mean of subheap_kernel.test_loss" in out
