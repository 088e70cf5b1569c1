"""Verdict integrity (issue #10): each hole a careful statistician found, shown closed.

Level claims are simulations through `decide` itself: the true mean sits exactly at the bar, so
every "supported" is a false one, and its rate must stay at or under alpha (plus Monte Carlo slack:
2,000 draws give a standard error of about 0.005 at 0.05).
"""

from __future__ import annotations

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from gates.cli import app, check
from gates.contract import Decision, load_contract
from gates.design import require_current_rules, rule_flags
from gates.errors import UserError
from gates.inference import decide, unreachable
from gates.study import Metric, get_study, proportion
from tests.conftest import C05, c05_current, small_c05, write_contract
from tests.test_verdict import decision, runs, thr

DRAWS = 2000
SLACK = 3 * np.sqrt(0.05 * 0.95 / DRAWS)
ACC = {"acc": proportion("higher", "test")}


def compare(arm, other, direction="higher", **kw):
    return {
        "kind": "compare",
        "arm": arm,
        "metric": "acc",
        "other": other,
        "direction": direction,
        **kw,
    }


# ---------------------------------------------------------------------------------- 1. zero spread
def test_agreeing_seeds_get_the_p_their_number_can_give():
    v = decide(decision([thr("a", "acc", "higher", 0.95)]), runs("a", acc=[1.0, 1.0, 1.0]), ACC)
    c = v.conditions[0]
    assert c.p_hold == 1 / 8 and c.test == "sign (exact)" and v.verdict != "supported"


def test_the_sign_test_counts_seeds_above_the_bar_and_estimates_the_median():
    """An accuracy is bounded, so its default estimand is the median, by the sign test: p(hold) =
    P(Binomial(n, 1/2) >= seeds strictly above the bar), the estimate is the median effect."""
    from scipy import stats

    x = [1.0, 1.0, 1.0, 1.0, 0.9, 1.0]  # at accuracy's bound, one seed below the bar
    c = decide(decision([thr("a", "acc", "higher", 0.95)]), runs("a", acc=x), ACC).conditions[0]
    assert c.test == "sign (exact)" and "the median" in c.test_reason
    assert c.p_hold == pytest.approx(stats.binom.sf(5 - 1, 6, 0.5)) == pytest.approx(7 / 64)
    assert c.p_fail == pytest.approx(stats.binom.sf(1 - 1, 6, 0.5))
    assert c.estimate == pytest.approx(
        np.median(np.array(x) - 0.95)
    ) and c.estimate == pytest.approx(0.05)
    assert (c.ci_low, c.ci_high) == (
        pytest.approx(-0.05),
        pytest.approx(0.05),
    )  # the per-seed range
    assert c.estimand == "median of a.acc across seeds" and c.outcome == "undetermined"
    # a seed exactly at the bar is a tie: it counts for neither side
    tie = decide(
        decision([thr("a", "acc", "higher", 0.95)]), runs("a", acc=[1.0, 1.0, 1.0, 0.95]), ACC
    )
    assert tie.conditions[0].p_hold == pytest.approx(stats.binom.sf(3 - 1, 4, 0.5))


def test_a_declared_mean_of_paired_accuracies_is_judged_by_the_bounded_mean_test_whatever_the_ties():
    """The mean of the paired differences of two bounded arms: the bounded-mean test, with or without ties
    (engine 3 took the t-test, then the sign test when the differences repeated a value)."""
    a, b = [1.0, 0.9, 0.95, 1.0], [0.5, 0.45, 0.52, 0.41]
    b_tied = [0.5, 0.4, 0.45, 0.5]  # differences 0.5, 0.5, 0.5, 0.5
    for other in (b, b_tied):
        c = decide(
            decision([compare("a", "b", test="paired", estimand="mean")]),
            runs("a", acc=a) + runs("b", acc=other),
            ACC,
        ).conditions[0]
        assert (
            c.test == "bounded mean (betting)" and "mean of the per-seed differences" in c.estimand
        )
        assert c.ci_low <= c.estimate <= c.ci_high


def test_two_paired_seeds_cannot_support():
    d = decision([compare("a", "b", test="paired")])
    v = decide(d, runs("a", acc=[0.75, 0.5]) + runs("b", acc=[0.5, 0.25]), ACC)
    # engine 6: two seeds never reach a verdict (the sign test's 1/4 could not either)
    assert v.conditions[0].p_hold == 1.0 and v.verdict == "inconclusive"
    assert "only 2 seeds have completed values of every term" in v.conditions[0].note
    unpaired = decide(
        decision([compare("a", "b")]), runs("a", acc=[0.75, 0.5]) + runs("b", acc=[0.5, 0.25]), ACC
    )
    assert unpaired.verdict == "inconclusive"


def test_a_value_at_the_bound_is_tested_like_any_other():
    """[1, 1, 1] and [1, 1, 1 - 1e-12] must not differ: the sign test counts every seed above the bar."""
    d = decision([thr("a", "acc", "higher", 0.95)])
    flat, nudged = (
        decide(d, runs("a", acc=x), ACC).conditions[0]
        for x in ([1.0, 1.0, 1.0], [1.0, 1.0, 1 - 1e-12])
    )
    assert flat.p_hold == nudged.p_hold == 0.125
    assert flat.test == nudged.test == "sign (exact)"
    assert nudged.outcome == flat.outcome == "undetermined"


def test_the_t_test_is_the_mean_s_test_on_a_metric_without_a_range():
    c = decide(
        decision([thr("a", "d", "higher", 0.5)]),
        runs("a", d=[0.81, 0.86, 0.83]),
        {"d": Metric("higher", "test")},
    ).conditions[0]
    assert c.test == "one-sample t" and "roughly normal" in c.test_reason


def test_exact_test_holds_its_level_on_discrete_accuracies():
    """Accuracies over 8 test items (a few discrete values, often 1.0) with true mean at the bar."""
    rng = np.random.default_rng(1)
    d = decision([thr("a", "acc", "higher", 0.875)])
    false_support = sum(
        decide(d, runs("a", acc=list(rng.binomial(8, 0.875, size=5) / 8)), ACC).verdict
        == "supported"
        for _ in range(DRAWS)
    )
    assert false_support / DRAWS <= 0.05 + SLACK


def test_t_test_holds_its_level_at_three_seeds():
    rng = np.random.default_rng(2)
    d = decision([thr("a", "nll", "lower", 3.0)])
    false_support = sum(
        decide(d, runs("a", nll=list(rng.normal(3.0, 0.05, size=3)))).verdict == "supported"
        for _ in range(DRAWS)
    )
    assert false_support / DRAWS <= 0.05 + SLACK


# ---------------------------------------------------------------------------------- 2. bootstrap
@pytest.mark.parametrize("n", [2, 3, 5])
def test_bootstrap_conditions_hold_their_level_at_few_seeds(n):
    """The percentile bootstrap's own p gave 24% false support at 2 seeds, 13% at 3."""
    rng = np.random.default_rng(n)
    d = decision([thr("a", "nll", "lower", 3.0, interval="bootstrap")])
    false_support = sum(
        decide(d, runs("a", nll=list(rng.normal(3.0, 0.05, size=n)))).verdict == "supported"
        for _ in range(DRAWS)
    )
    assert false_support / DRAWS <= 0.05 + SLACK


# ---------------------------------------------------------------------------------- 3-5. the contract
def c05_with(tmp_path, mutate) -> str:
    """`gates check`'s errors for the C05 contract as today's design rules want it, changed by `mutate`."""
    data = c05_current()
    data["id"] = "c05-loophole"
    mutate(data)
    path = write_contract(tmp_path, data)
    with pytest.raises(UserError) as info:  # `gates` prints it as one line per error and exits 2
        check(path, runs_dir=tmp_path / "runs", contracts_dir=path.parent, as_json=False)
    return info.value.render()


def test_the_test_contracts_follow_todays_design_rules(tmp_path):
    """c05_with and small_c05 start from contracts a new claim could register (each test changes one thing)."""
    for data in (c05_current(), small_c05()):
        loaded = load_contract(write_contract(tmp_path, data))
        assert rule_flags(loaded) == []
        require_current_rules(
            loaded, tmp_path / "runs"
        )  # no evidence here: refused if it broke a rule
    assert any(
        "blind" in f or "positive control" in f for f in rule_flags(load_contract(C05))
    )  # as recorded


def test_a_per_condition_alpha_is_refused(tmp_path):
    out = c05_with(tmp_path, lambda d: d["decision"]["supported_if"][0].update(alpha=0.9))
    assert "contract.yaml:" in out and "supported_if.0.alpha" in out and "unknown field" in out


@pytest.mark.parametrize("alpha", [0.9, 0.999, 0.5, 0.11])
def test_a_decision_alpha_above_0_1_is_refused(tmp_path, alpha):
    out = c05_with(tmp_path, lambda d: d["decision"].update(alpha=alpha))
    assert "decision.alpha" in out and "0.1" in out


@pytest.mark.parametrize("field,value", [("value", float("nan")), ("value", float("inf"))])
def test_non_finite_numbers_are_refused(tmp_path, field, value):
    out = c05_with(tmp_path, lambda d: d["decision"]["supported_if"][0].update({field: value}))
    assert "supported_if.0.value" in out and "finite" in out


@pytest.mark.parametrize(
    "value,word",
    [
        (-1.0, "holds for every value"),
        (0.0, "holds for every value"),
        (2.0, "cannot hold"),
        (1.0, "cannot hold"),
    ],
)
def test_vacuous_thresholds_are_refused(tmp_path, value, word):
    def mutate(d):  # an accuracy bar (range [0, 1])
        d["decision"]["supported_if"][0].update(metric="test_acc", direction="higher", value=value)

    out = c05_with(tmp_path, mutate)
    assert "supported_if.0.value" in out and word in out


def test_a_margin_wider_than_the_range_is_refused(tmp_path):
    wide = {
        "kind": "compare",
        "arm": "subheap_kernel",
        "metric": "test_acc",
        "other": "flat_address",
        "direction": "lower",
        "margin": -1e9,
    }
    out = c05_with(tmp_path, lambda d: d["decision"]["supported_if"].append(wide))
    assert "supported_if.4.margin" in out and "holds for every value" in out


def test_decisions_read_only_test_and_cost_metrics(tmp_path):
    out = c05_with(tmp_path, lambda d: d["decision"]["supported_if"][0].update(metric="val_acc"))
    assert "supported_if.0.metric" in out and "validation metric" in out
    out = c05_with(tmp_path, lambda d: d["decision"]["supported_if"][0].update(metric="train_acc"))
    assert "a train metric" in out


def test_a_relative_margin_on_a_metric_that_can_be_negative_is_refused():
    from gates.contract import Compare, Contract
    from gates.design._rules import check_rules
    from gates.study import Study, StudyConfig

    class Signed(Study):
        name = "signed"
        Config = StudyConfig
        metrics = {"gain": Metric("higher", "test"), "loss": Metric("lower", "test", 0.0)}

    def err(loc, msg):
        return UserError(msg, field=".".join(map(str, loc)))

    data = c05_current()
    data["decision"]["supported_if"] = [
        {
            "kind": "compare",
            "arm": "subheap_kernel",
            "metric": "gain",
            "other": "flat_address",
            "direction": "higher",
            "relative_margin": 0.1,
        }
    ]
    data["decision"]["refuted_if"] = [
        {
            "kind": "compare",
            "arm": "subheap_kernel",
            "metric": "loss",
            "other": "flat_address",
            "direction": "higher",
            "relative_margin": 0.1,
        }
    ]
    data["stop_rules"]["futility"] = []
    errors = [
        e
        for e in check_rules(Contract.model_validate(data), Signed(), {}, err)
        if "relative" in e.field
    ]
    assert [e.field for e in errors] == ["decision.supported_if.0.relative_margin"]
    assert "non-negative" in errors[0].message
    # with negative values a clearly worse arm "held": -1.1 >= -1 * (1 + 0.1)
    assert isinstance(Contract.model_validate(data).decision.supported_if[0], Compare)


# ---------------------------------------------------------------------------------- 8. survivorship
def test_survivors_alone_cannot_support():
    """2 of 5 seeds diverge, the other 3 pass: not supported, and the lost seeds are named."""
    d = decision([thr("a", "nll", "lower", 3.0)])
    rs = runs("a", nll=[2.51, 2.49, 2.53]) + runs(
        "a", seeds=[3, 4], status="halted", halt_reason="divergence"
    )
    v = decide(d, rs)
    assert v.verdict == "inconclusive" and v.conditions[0].outcome == "undetermined"
    assert "cannot hold while runs it reads are lost" in v.conditions[0].note
    lost = [(x.seed, x.why) for x in v.lost if x.metric == "nll"]
    assert lost == [(3, "halted: divergence"), (4, "halted: divergence")]
    # a non-finite value of a completed run is lost the same way
    nan = runs("a", nll=[2.51, 2.49, 2.53, float("nan")])
    assert decide(d, nan).verdict == "inconclusive"


def test_survivors_can_still_refute():
    d = decision([thr("a", "nll", "lower", 3.0)])
    rs = runs("a", nll=[3.51, 3.49, 3.53]) + runs("a", seeds=[3], status="failed")
    assert decide(d, rs).verdict == "refuted"


# ---------------------------------------------------------------------------------- 9. futility
def test_a_futility_halt_on_a_comparator_does_not_refute():
    d = decision([compare("a", "b")])
    rs = (
        runs("a", acc=[0.91, 0.93, 0.92])
        + runs("b", acc=[0.51, 0.53])
        + runs("b", seeds=[2], status="halted", halt_reason="futility: hopeless")
    )
    v = decide(d, rs, ACC)
    assert v.verdict == "inconclusive" and "did not complete (halted" in " ".join(v.reasons)
    # on the arm under test it refutes, as pre-registered
    rs_a = (
        runs("a", acc=[0.91, 0.93])
        + runs("a", seeds=[2], status="halted", halt_reason="futility")
        + runs("b", acc=[0.51, 0.53, 0.52])
    )
    assert decide(d, rs_a, ACC).verdict == "refuted"


def test_futility_rules_on_comparators_are_refused(tmp_path):
    def mutate(d):
        d["decision"]["supported_if"].append(
            {
                "kind": "compare",
                "arm": "subheap_kernel",
                "metric": "test_acc",
                "other": "flat_address",
                "direction": "higher",
            }
        )
        d["decision"]["supported_if"] = [
            c
            for c in d["decision"]["supported_if"]
            if c.get("arm") not in ("flat_address", "path_only")
        ]
        d["decision"]["refuted_if"] = [
            c for c in d["decision"]["refuted_if"] if c.get("arm") != "flat_address"
        ]
        d["stop_rules"]["futility"][0]["arms"] = ["subheap_kernel", "flat_address"]

    out = c05_with(tmp_path, mutate)
    assert "stop_rules.futility.0.arms" in out and "comparator" in out and "flat_address" in out


# ---------------------------------------------------------------------------------- preflight
def test_a_condition_that_can_never_hold_is_refused_before_any_run(tmp_path):
    def mutate(d):
        for c in d["decision"]["supported_if"] + d["decision"]["refuted_if"]:
            c["estimand"] = "median"

    out = c05_with(tmp_path, mutate)
    first = out.splitlines()[0]
    assert "contract.yaml:" in first and "decision.supported_if.0.interval:" in first
    # a supported_if is tested at alpha itself (intersection-union), a refuted_if at alpha / m (Holm over the
    # 8 ways to refute); the sign test's smallest p with 3 seeds is 1/8
    assert (
        "with 3 seeds, supported_if[0] cannot hold at alpha 0.05 (each supported_if is tested at alpha): the "
        "smallest p the sign test can give is 0.125, above 0.05; expected at least 8 seeds"
    ) in first
    refuted = next(line for line in out.splitlines() if "decision.refuted_if.0.interval:" in line)
    assert "in the Holm family of the 8 ways to refute" in refuted and "above 0.00625" in refuted
    d = Decision.model_validate({**yaml.safe_load(C05.read_text())["decision"]})
    assert unreachable(d, 3, {}) == []  # undeclared metrics: the t-test of a mean reaches any p
    # the study's declarations: test_acc is bounded, so its default estimand is the median (the sign
    # test); with 5 seeds every supported_if could hold (2^-5 <= 0.05), no refuted_if could (> 0.05 / 8)
    metrics = get_study("c05_probe").metrics
    assert {name for name, _, _ in unreachable(d, 5, metrics)} == {"refuted_if"}
    assert unreachable(d, 8, metrics) == []
    # the mean of a bounded metric by the bounded-mean test: all 10 seeds at 1.0 cannot show a mean above
    # 0.95 (1.0 with probability 0.95, else 0, gives ten 1.0s 60% of the time)
    mean = Decision.model_validate(
        {
            **d.model_dump(),
            "supported_if": [{**c.model_dump(), "estimand": "mean"} for c in d.supported_if],
        }
    )
    assert "bounded-mean test" in unreachable(mean, 10, metrics)[0][2]


def test_check_prints_seeds_for_power_and_what_each_condition_estimates(tmp_path):
    data = small_c05(seeds=5)
    data["preflight"]["predicted_ablation"]["sd"] = 0.2
    for c in data["decision"]["supported_if"]:
        c["estimand"] = "median"
    where = ["--runs-dir", str(tmp_path), "--contracts-dir", str(tmp_path)]
    result = CliRunner().invoke(app, ["check", str(write_contract(tmp_path, data)), *where])
    assert result.exit_code == 0, result.output
    assert "with sd 0.2 per seed:" in result.output and "80% power" in result.output
    assert (
        "supported_if[0] estimates the median of subheap_kernel.test_loss across seeds (declared), by "
        "the sign test" in result.output
    )
    assert "refuted_if[0] estimates the geometric mean" in result.output
    # 5 seeds give 2^-5, one seed the other way 6/32 > 0.05
    assert (
        "with 5 seeds it could hold only if every seed sits at the best value it can see (one seed at "
        "the worst gives p 0.188 > alpha 0.05)" in result.output
    )
    assert "ready to run" in result.output


def test_a_recorded_contract_under_older_rules_loads_and_is_flagged(tmp_path):
    """bif-fam's decision reads a validation metric: recorded before the rule, flagged, not refused."""
    loaded = load_contract(C05.parent / "bif-fam.yaml")
    assert any("validation metric" in f for f in rule_flags(loaded))
    require_current_rules(loaded, C05.parent.parent / "runs")  # recorded: passes
    with pytest.raises(UserError, match="validation metric"):
        require_current_rules(
            loaded, tmp_path
        )  # no evidence here: a new contract must follow the rule


def test_gates_3_and_5_are_compared_with_what_was_measured():
    from gates.contract import Contract
    from gates.entities import FirstSignalRecord
    from gates.inference import predictions

    data = yaml.safe_load(C05.read_text())
    data["preflight"]["predicted_ablation"]["sd"] = 0.1
    contract = Contract.model_validate(
        data
    )  # subheap_kernel above flat_address by >= 0.7 on test_acc
    rs = runs("subheap_kernel", test_acc=[1.0, 0.98, 0.99]) + runs(
        "flat_address", test_acc=[0.02, 0.0, 0.01]
    )
    met = [FirstSignalRecord(seed=s, met=m) for s, m in ((0, True), (1, True), (2, False))]
    got = predictions(contract, rs, met)
    assert got["predicted_ablation"]["measured_size"] == pytest.approx(0.98)
    # a 7-sd effect is powered at 2 seeds by the t-test (a supported_if is tested at alpha itself), but
    # two seeds never reach a verdict (engine 6): the advice is the floor, 3
    assert (
        got["predicted_ablation"]["came_true"] is True
        and got["predicted_ablation"]["seeds_for_80pct_power"] == 3
    )
    assert got["falsifiable_point"] == {"met_on": 2, "of": 3, "came_true": False}
    short = runs("subheap_kernel", test_acc=[0.6, 0.61, 0.62]) + runs(
        "flat_address", test_acc=[0.02, 0.0, 0.01]
    )
    assert predictions(contract, short, met)["predicted_ablation"]["came_true"] is False
