"""Verdicts from constructed per-seed values whose answers are known (by hand or by scipy)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from gates.contract import Decision
from gates.entities import ConditionRecord, RunRecord, Verdict
from gates.inference import BOOTSTRAP_RESAMPLES, decide, holm
from gates.inference._results import verdict_signature

ROOT = Path(__file__).resolve().parents[1]
NEVER = {"kind": "threshold", "arm": "a", "metric": "acc", "direction": "lower", "value": -1e9}


def decision(supported, refuted=None, **kw) -> Decision:
    return Decision.model_validate(
        {"supported_if": supported, "refuted_if": refuted or [NEVER], **kw}
    )


def runs(
    arm: str, seeds=None, status="completed", halt_reason=None, **metrics: list[float]
) -> list[RunRecord]:
    """One run per seed for `arm`, with each metric's per-seed values (seeds 0.. by default), as the
    verdict engine reads runs (records)."""
    n = len(next(iter(metrics.values()))) if metrics else len(seeds)
    seeds = list(range(n)) if seeds is None else seeds
    return [
        RunRecord(
            arm=arm,
            seed=s,
            status=status,
            halt_reason=halt_reason,
            metrics={m: v[i] for m, v in metrics.items()} if status == "completed" else {},
        )
        for i, s in enumerate(seeds)
    ]


def thr(arm, metric, direction, value, **kw):
    return {
        "kind": "threshold",
        "arm": arm,
        "metric": metric,
        "direction": direction,
        "value": value,
        **kw,
    }


def cond(v: Verdict, label: str):
    return next(c for c in v.conditions if f"{c.list_name}[{c.index}]" == label)


# ---------------------------------------------------------------------------------- threshold
def test_threshold_clearly_held_matches_one_sample_t():
    x = [0.96, 0.97, 0.98, 0.965, 0.975]  # no repeated value, none at a bound: the t-test applies
    v = decide(decision([thr("a", "acc", "higher", 0.9)]), runs("a", acc=x))
    c = cond(v, "supported_if[0]")
    assert v.verdict == "supported" and c.outcome == "holds"
    assert c.test == "one-sample t" and c.description == "a.acc >= 0.9"
    p = stats.ttest_1samp(x, 0.9, alternative="greater").pvalue
    assert c.p_hold == pytest.approx(p, rel=1e-9)
    # engine 3: a supported_if is an intersection-union test at alpha, its p(hold) unadjusted; its p(fail)
    # is Holm over the 2 ways to refute (refuted_if[0] holding, supported_if[0] failing)
    assert c.p_hold_adj == c.p_hold
    assert c.p_fail_adj == pytest.approx(
        holm([cond(v, "refuted_if[0]").p_hold, c.p_fail])[1], rel=1e-12
    )
    assert "intersection-union" in c.adjustment and "Holm over the 2 ways to refute" in c.adjustment
    assert (c.scale, c.estimand) == ("linear", "mean of a.acc across seeds")
    assert c.estimate == pytest.approx(np.mean(x) - 0.9)
    assert c.ci_level == pytest.approx(0.9)
    assert c.n == {"a.acc": 5} and c.values == {"a.acc": x}
    assert any("supported_if[0] holds" in r for r in v.reasons)


def test_threshold_clearly_failed_refutes():
    v = decide(decision([thr("a", "acc", "higher", 0.9)]), runs("a", acc=[0.5, 0.55, 0.52]))
    c = cond(v, "supported_if[0]")
    assert c.outcome == "fails" and c.estimate < 0 and c.p_fail < 0.01
    assert v.verdict == "refuted" and any("supported_if[0] fails" in r for r in v.reasons)


def test_threshold_in_the_undetermined_zone_says_how_many_seeds():
    x = [0.88, 0.93, 0.90]
    v = decide(decision([thr("a", "acc", "higher", 0.9)]), runs("a", acc=x))
    c = cond(v, "supported_if[0]")
    assert c.outcome == "undetermined" and v.verdict == "inconclusive"
    # smallest n with 80% power at the level the condition would hold at: a supported_if with a positive
    # estimate is tested at alpha itself (intersection-union), by hand
    theta, s = np.mean(x) - 0.9, np.std(x, ddof=1)
    assert theta > 0
    power = lambda n: stats.nct.sf(stats.t.ppf(1 - 0.05, n - 1), n - 1, theta / (s / math.sqrt(n)))  # noqa: E731
    assert c.seeds_needed is not None and power(c.seeds_needed) >= 0.8 > power(c.seeds_needed - 1)
    assert any(
        line.startswith("supported_if[0]")
        and f"about {c.seeds_needed} seeds" in line
        and "80% power" in line
        for line in v.settle
    )


def test_zero_spread_is_no_evidence_about_a_mean_and_the_declared_median_gets_the_sign_test():
    """Three seeds that agree are three observations, never p = 0 (engine 4): with no declared range the
    t-test of the mean is undefined without spread (undetermined); with estimand median the sign test
    gives 1/8; nothing switches between the two on the data."""
    d = decision(
        [
            thr("a", "acc", "higher", 0.95),
            thr("b", "acc", "lower", 0.25),
            thr("c", "acc", "higher", 0.95),
        ],
        [thr("a", "acc", "lower", 0.5)],
    )
    rs = runs("a", acc=[1.0] * 3) + runs("b", acc=[0.0] * 3) + runs("c", acc=[0.95] * 3)
    v = decide(d, rs)
    for label in ("supported_if[0]", "supported_if[1]"):
        c = cond(v, label)
        assert (c.p_hold, c.p_fail) == (1.0, 1.0) and c.test == "one-sample t"
        assert "no spread" in c.note and c.outcome == "undetermined"
        assert c.estimand == f"mean of {c.description.split()[0]} across seeds"
    assert v.verdict == "inconclusive"
    json.dumps(v.to_dict(), allow_nan=False)

    median = decision(
        [
            thr("a", "acc", "higher", 0.95, estimand="median"),
            thr("b", "acc", "lower", 0.25, estimand="median"),
            thr("c", "acc", "higher", 0.95, estimand="median"),
        ],
        [thr("a", "acc", "lower", 0.5, estimand="median")],
    )
    v = decide(median, rs)
    for label in ("supported_if[0]", "supported_if[1]"):
        c = cond(v, label)
        assert (c.p_hold, c.p_fail) == (1 / 8, 1.0) and c.test == "sign (exact)"
        assert c.ci_low == c.ci_high == c.estimate  # the per-seed range of the effect
        assert c.estimand == f"median of {c.description.split()[0]} across seeds"
    tie = cond(v, "supported_if[2]")  # exactly at the bar: no evidence either way
    assert tie.estimate == 0.0 and (tie.p_hold, tie.p_fail) == (1.0, 1.0)
    r = cond(v, "refuted_if[0]")
    assert (r.p_hold, r.p_fail) == (1.0, 1 / 8) and r.outcome == "undetermined"
    json.dumps(v.to_dict(), allow_nan=False)


# ---------------------------------------------------------------------------------- compare
A = [0.81, 0.84, 0.79, 0.86, 0.83]
B = [0.74, 0.78, 0.77, 0.72, 0.79, 0.75]


def test_welch_compare_matches_scipy_ttest_ind():
    c_higher = {"kind": "compare", "arm": "a", "metric": "acc", "other": "b", "direction": "higher"}
    c_lower = {
        "kind": "compare",
        "arm": "b",
        "metric": "acc",
        "other": "a",
        "direction": "lower",
        "margin": 0.02,
    }
    v = decide(decision([c_higher, c_lower]), runs("a", acc=A) + runs("b", acc=B))
    hi, lo = cond(v, "supported_if[0]"), cond(v, "supported_if[1]")
    assert hi.test == "welch t" and hi.description == "a.acc >= b.acc"
    res = stats.ttest_ind(A, B, equal_var=False, alternative="greater")
    assert hi.p_hold == pytest.approx(res.pvalue, rel=1e-9)
    assert hi.p_fail == pytest.approx(
        stats.ttest_ind(A, B, equal_var=False, alternative="less").pvalue, rel=1e-9
    )
    assert hi.ci_low == pytest.approx(
        res.confidence_interval(0.95).low, rel=1e-9
    )  # one-sided alpha bound
    # lower with margin: b <= a - 0.02  <=>  theta = mean(a) - mean(b) - 0.02
    shifted = stats.ttest_ind(np.array(A) - 0.02, B, equal_var=False, alternative="greater")
    assert lo.description == "b.acc <= a.acc - 0.02"
    assert lo.estimate == pytest.approx(np.mean(A) - np.mean(B) - 0.02)
    assert lo.p_hold == pytest.approx(shifted.pvalue, rel=1e-9)


def test_paired_compare_matches_scipy_ttest_rel_on_common_seeds():
    a = [0.50, 0.55, 0.61, 0.58, 0.52]
    b = [0.47, 0.50, 0.60, 0.52, 0.505]
    c = {
        "kind": "compare",
        "arm": "a",
        "metric": "acc",
        "other": "b",
        "direction": "higher",
        "test": "paired",
    }
    # b has an extra seed (9) that a lacks: pairing must drop it
    rs = runs("a", acc=a) + runs("b", seeds=[0, 1, 2, 3, 4, 9], acc=b + [0.99])
    r = cond(decide(decision([c]), rs), "supported_if[0]")
    assert r.test == "paired t" and r.n == {"a.acc": 5, "b.acc": 5}
    assert r.p_hold == pytest.approx(stats.ttest_rel(a, b, alternative="greater").pvalue, rel=1e-9)
    assert r.p_fail == pytest.approx(stats.ttest_rel(a, b, alternative="less").pvalue, rel=1e-9)


def test_relative_margin_scales_the_other_term():
    m8 = [
        0.30,
        0.34,
        0.28,
        0.33,
        0.31,
    ]  # every arm has every seed (a missing one would be a lost run)
    single = [0.61, 0.58, 0.66, 0.63, 0.60]
    c = {
        "kind": "compare",
        "arm": "m8",
        "metric": "closure_error",
        "other": "single_key",
        "direction": "lower",
        "relative_margin": 0.3,
    }
    v = decide(
        decision([c]), runs("m8", closure_error=m8) + runs("single_key", closure_error=single)
    )
    r = cond(v, "supported_if[0]")
    assert r.description == "m8.closure_error <= single_key.closure_error * (1 - 0.3)"
    # theta = 0.7 mean(single) - mean(m8); scaling a sample by 0.7 scales its variance by 0.49
    expected = stats.ttest_ind(
        0.7 * np.array(single), m8, equal_var=False, alternative="greater"
    ).pvalue
    assert r.estimate == pytest.approx(0.7 * np.mean(single) - np.mean(m8))
    assert r.p_hold == pytest.approx(expected, rel=1e-9)
    assert r.outcome == "holds"


# ---------------------------------------------------------------------------------- trend
def test_trend_over_arms_intersection_union_and_bonferroni():
    x = {
        "a": [0.90, 0.92, 0.91, 0.93],
        "b": [0.70, 0.72, 0.69, 0.74],
        "c": [0.50, 0.53, 0.48, 0.52],
    }
    holds = {"kind": "trend", "direction": "lower", "metric": "err", "arms": ["a", "b", "c"]}
    fails = {"kind": "trend", "direction": "lower", "metric": "err", "arms": ["a", "c", "b"]}
    rs = [r for arm, v in x.items() for r in runs(arm, err=v)]
    v = decide(decision([holds], [fails]), rs)
    h, f = cond(v, "supported_if[0]"), cond(v, "refuted_if[0]")
    assert h.description == "trend lower: a.err > b.err > c.err"
    pair_p = [
        stats.ttest_ind(x[p], x[q], equal_var=False, alternative="greater").pvalue
        for p, q in (("a", "b"), ("b", "c"))
    ]
    assert h.p_hold == pytest.approx(max(pair_p), rel=1e-9)
    assert h.estimate == pytest.approx(
        min(np.mean(x["a"]) - np.mean(x["b"]), np.mean(x["b"]) - np.mean(x["c"]))
    )
    assert h.outcome == "holds"
    # a > c holds, c > b is clearly violated: the trend fails, p_fail Bonferroni over 2 pairs
    p_fail_cb = stats.ttest_ind(x["c"], x["b"], equal_var=False, alternative="less").pvalue
    assert f.p_fail == pytest.approx(min(1.0, 2 * p_fail_cb), rel=1e-9)
    assert f.estimate == pytest.approx(np.mean(x["c"]) - np.mean(x["b"]))
    assert f.outcome == "fails" and v.verdict == "supported"


def test_trend_over_metrics_in_one_arm_paired():
    m = {
        "l1": [1.0, 1.2, 1.1, 1.3, 1.15],
        "l2": [1.4, 1.5, 1.45, 1.62, 1.53],
        "l3": [1.9, 2.1, 1.96, 2.2, 2.0],
    }
    t = {
        "kind": "trend",
        "direction": "higher",
        "arm": "a",
        "metrics": ["l1", "l2", "l3"],
        "test": "paired",
    }
    r = cond(decide(decision([t]), runs("a", **m)), "supported_if[0]")
    assert r.test == "paired t" and r.description == "trend higher: a.l1 < a.l2 < a.l3"
    pair_p = [
        stats.ttest_rel(m["l2"], m["l1"], alternative="greater").pvalue,
        stats.ttest_rel(m["l3"], m["l2"], alternative="greater").pvalue,
    ]
    assert r.p_hold == pytest.approx(max(pair_p), rel=1e-9)
    assert r.outcome == "holds"


def test_trend_tie_at_zero_spread_is_not_a_strict_trend():
    t = {"kind": "trend", "direction": "lower", "metric": "err", "arms": ["a", "b"]}
    v = decide(decision([t]), runs("a", err=[0.5] * 3) + runs("b", err=[0.5] * 3))
    c = cond(v, "supported_if[0]")
    assert c.test == "welch t" and (c.p_hold, c.p_fail) == (1.0, 1.0) and "no spread" in c.note
    assert c.outcome == "undetermined" and v.verdict == "inconclusive"


# ---------------------------------------------------------------------------------- Holm
def test_holm_function_on_a_known_vector():
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.9, 0.8]) == pytest.approx([1.0, 1.0])


def _bars(x: np.ndarray, targets: list[float], direction: str) -> list[float]:
    """Bars whose one-sample t-test on x gives exactly these one-sided p(hold)."""
    se = x.std(ddof=1) / math.sqrt(len(x))
    sign = -1.0 if direction == "higher" else 1.0
    return [float(x.mean() + sign * se * stats.t.isf(p, len(x) - 1)) for p in targets]


def test_supported_if_conditions_are_an_intersection_union_test_at_alpha():
    """Engine 3: every supported_if must hold, so each is tested at alpha unadjusted (engine 2's Holm
    would have dropped the largest raw pass, 4 * 0.04 > 0.05)."""
    x = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    targets = [0.005, 0.01, 0.04]  # all pass alone at 0.05
    supported = [thr("a", f"m{i}", "higher", v) for i, v in enumerate(_bars(x, targets, "higher"))]
    v = decide(
        decision(supported, [thr("a", "m0", "lower", -100.0)]),
        runs("a", m0=list(x), m1=list(x), m2=list(x)),
    )
    raw = [cond(v, f"supported_if[{i}]").p_hold for i in range(3)]
    assert raw == pytest.approx(targets, rel=1e-6)
    assert [cond(v, f"supported_if[{i}]").p_hold_adj for i in range(3)] == raw
    assert [cond(v, f"supported_if[{i}]").outcome for i in range(3)] == ["holds"] * 3
    assert v.verdict == "supported" and v.correction == "iut+holm"
    # one just above alpha is not carried by the others
    above = supported[:2] + [thr("a", "m2", "higher", _bars(x, [0.06], "higher")[0])]
    v = decide(
        decision(above, [thr("a", "m0", "lower", -100.0)]),
        runs("a", m0=list(x), m1=list(x), m2=list(x)),
    )
    assert cond(v, "supported_if[2]").p_hold_adj == pytest.approx(0.06, rel=1e-6)
    assert cond(v, "supported_if[2]").outcome == "undetermined" and v.verdict == "inconclusive"
    assert any(line.startswith("supported_if[2]") for line in v.settle)


def test_holm_across_the_ways_to_refute_drops_the_largest_raw_pass():
    """The claim is refuted when any refuted_if holds or any supported_if fails: those ways to refute are one
    Holm family (refuted_if p(hold) and supported_if p(fail)); refuted_if p(fail) is Holm within refuted_if."""
    x = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    targets = [0.005, 0.01, 0.04]  # all refute alone at 0.05
    refuted = [thr("a", f"m{i}", "lower", v) for i, v in enumerate(_bars(x, targets, "lower"))]
    supported = [thr("a", "m0", "higher", float(x.mean()) - 3.0)]
    v = decide(decision(supported, refuted), runs("a", m0=list(x), m1=list(x), m2=list(x)))
    raw = [cond(v, f"refuted_if[{i}]").p_hold for i in range(3)]
    assert raw == pytest.approx(targets, rel=1e-6) and max(raw) <= 0.05
    # by hand: m = 4 (the supported_if condition's failing is in the family); ascending (m - rank) * p, running max
    s = cond(v, "supported_if[0]")
    hand = [4 * raw[0], max(4 * raw[0], 3 * raw[1]), max(4 * raw[0], 3 * raw[1], 2 * raw[2])]
    assert [cond(v, f"refuted_if[{i}]").p_hold_adj for i in range(3)] == pytest.approx(hand)
    assert s.p_fail_adj == pytest.approx(min(1.0, max(hand[2], s.p_fail)))
    assert s.p_hold_adj == s.p_hold and s.outcome == "holds"
    # refuted_if failing decides nothing and is shown with Holm across the refuted_if list only (m = 3)
    assert [cond(v, f"refuted_if[{i}]").p_fail_adj for i in range(3)] == pytest.approx(
        holm([cond(v, f"refuted_if[{i}]").p_fail for i in range(3)])
    )
    assert [cond(v, f"refuted_if[{i}]").outcome for i in range(3)] == [
        "holds",
        "holds",
        "undetermined",
    ]
    assert v.verdict == "refuted"
    assert "not after Holm over the 4 ways to refute" in cond(v, "refuted_if[2]").note
    assert sum("refuted_if[" in r and " holds" in r for r in v.reasons) == 2


def test_a_condition_cannot_carry_its_own_alpha():
    """Holm p-values are computed at the family's alpha; a per-condition alpha compared with them is no test."""
    with pytest.raises(Exception, match="alpha"):
        decision([thr("a", "acc", "higher", 0.85, alpha=0.9)])


# ---------------------------------------------------------------------------------- incomplete runs
def test_futility_halt_on_a_named_arm_refutes():
    d = decision([thr("a", "acc", "higher", 0.5)])
    ok = runs("a", acc=[0.9, 0.92, 0.91])
    v = decide(d, ok + runs("a", seeds=[7], status="halted", halt_reason="futility"))
    assert v.verdict == "refuted"
    assert [h.as_dict() for h in v.halts] == [{"arm": "a", "seed": 7, "reason": "futility"}]
    assert any("futility" in r for r in v.reasons)
    # a futile arm no condition names does not refute
    assert (
        decide(d, ok + runs("zzz", seeds=[1], status="halted", halt_reason="futility")).verdict
        == "supported"
    )


def test_failed_runs_leave_a_condition_undetermined():
    c = {"kind": "compare", "arm": "a", "metric": "acc", "other": "b", "direction": "higher"}
    rs = (
        runs("a", acc=[0.9, 0.91, 0.92])
        + runs("b", acc=[0.5])
        + runs("b", seeds=[1, 2], status="failed")
    )
    v = decide(decision([c]), rs)
    r = cond(v, "supported_if[0]")
    assert r.outcome == "undetermined" and (r.p_hold, r.p_fail) == (1.0, 1.0)
    assert "only 1 completed seed of arm b" in r.note and r.seeds_needed is None
    assert v.verdict == "inconclusive"
    assert any("b.acc has 1" in line for line in v.settle)
    assert sum("did not complete (failed)" in line for line in v.reasons) == 2
    json.dumps(v.to_dict(), allow_nan=False)


# ---------------------------------------------------------------------------------- exact
def test_exact_evaluation_judges_every_seed():
    paired_lower = {
        "kind": "compare",
        "arm": "a",
        "metric": "err",
        "other": "b",
        "direction": "lower",
        "test": "paired",
    }
    d = decision(
        [thr("a", "acc", "higher", 0.95), paired_lower],
        [thr("a", "acc", "lower", 0.2)],
        evaluation="exact",
    )
    rs = runs("a", acc=[1.0, 0.96, 1.0], err=[0.1, 0.3, 0.1]) + runs("b", err=[0.2, 0.2, 0.2])
    v = decide(d, rs)
    t, c, r = cond(v, "supported_if[0]"), cond(v, "supported_if[1]"), cond(v, "refuted_if[0]")
    assert (t.outcome, t.test, t.p_hold, t.p_hold_adj) == ("holds", "exact", None, None)
    assert c.outcome == "undetermined" and "holds on 2 of 3 seeds" in c.note
    assert r.outcome == "fails"
    assert v.verdict == "inconclusive" and v.correction == "none"
    # fails on every seed -> fails -> refuted
    rs_bad = runs("a", acc=[1.0] * 3, err=[0.3] * 3) + runs("b", err=[0.2] * 3)
    assert decide(d, rs_bad).verdict == "refuted"
    rs_good = runs("a", acc=[1.0] * 3, err=[0.1] * 3) + runs("b", err=[0.2] * 3)
    assert decide(d, rs_good).verdict == "supported"


# ---------------------------------------------------------------------------------- determinism & JSON
def test_bootstrap_is_deterministic_and_order_free():
    c = {
        "kind": "compare",
        "arm": "a",
        "metric": "acc",
        "other": "b",
        "direction": "higher",
        "interval": "bootstrap",
    }
    d = decision([c])
    rs = runs("a", acc=A) + runs("b", acc=B)
    first, second = decide(d, rs).to_dict(), decide(d, list(reversed(rs))).to_dict()
    assert first == second
    r = first["conditions"][0]
    # p from the estimand's test (the mean, no declared range: Welch), the interval from the bootstrap
    assert r["test"] == "welch t" and "bootstrap" in r["test_reason"]
    assert r["p_hold"] < 0.05 and r["ci_low"] < r["estimate"] < r["ci_high"]
    assert r["ci_level"] == pytest.approx(0.9) and BOOTSTRAP_RESAMPLES == 10_000
    assert "bootstrap" in verdict_signature(decide(d, rs))


def test_to_dict_is_strict_json_with_nan_metrics_and_missing_terms():
    rs = runs("a", acc=[0.9, float("nan"), 0.8]) + runs("b", acc=[float("inf")])
    c = {"kind": "compare", "arm": "a", "metric": "acc", "other": "b", "direction": "higher"}
    v = decide(decision([c]), rs)
    text = json.dumps(v.to_dict(), allow_nan=False)
    back = json.loads(text)
    assert back["verdict"] == "inconclusive" and back["conditions"][0]["values"]["a.acc"] == [
        0.9,
        0.8,
    ]
    assert any("non-finite" in r for r in back["reasons"])


def test_the_engine_judges_conditions_as_the_records_evidence_is_read_back_as():
    """One schema for a condition: the verdict engine builds the ConditionRecords evidence.json is
    read back as, each written with every key, in the record's order, whatever is still unset."""
    v = decide(decision([thr("a", "acc", "higher", 0.5)]), runs("a", acc=[0.9, 0.91, 0.92]))
    c = v.conditions[0]
    assert all(isinstance(x, ConditionRecord) for x in v.conditions)
    assert c.label == "supported_if[0]"
    written = v.to_dict()["conditions"][0]
    assert list(written) == list(ConditionRecord.model_fields)
    assert ConditionRecord.model_validate(written) == c


def test_signature_names_the_settings():
    v = decide(decision([thr("a", "acc", "higher", 0.5)]), runs("a", acc=[0.9, 0.91]))
    assert (
        verdict_signature(v)
        == "engine=6|alpha=0.05|eval=interval|correction=iut+holm|tests=one-sample t"
    )


def test_verdict_module_never_imports_torch():
    code = "import sys, gates.inference as i; i.judge_claim, i.decide; assert 'torch' not in sys.modules"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env
    )
    assert done.returncode == 0, done.stderr


def test_a_negative_margin_states_non_inferiority():
    """`lower` with margin -0.05 reads arm <= other + 0.05 ("no more than 0.05 above")."""
    c = {
        "kind": "compare",
        "arm": "a",
        "metric": "nll",
        "other": "b",
        "direction": "lower",
        "margin": -0.05,
    }
    slightly_above = runs("a", nll=[1.02, 1.021, 1.019]) + runs("b", nll=[1.0, 1.001, 0.999])
    v = decide(decision([c]), slightly_above)
    assert cond(v, "supported_if[0]").description == "a.nll <= b.nll + 0.05"
    assert cond(v, "supported_if[0]").estimate == pytest.approx(0.05 - 0.02)
    assert v.verdict == "supported"
    far_above = runs("a", nll=[1.2, 1.21, 1.19]) + runs("b", nll=[1.0, 1.001, 0.999])
    assert cond(decide(decision([c]), far_above), "supported_if[0]").outcome == "fails"


# ---------------------------------------------------------------------------------- engine 3
def test_a_log_scale_metric_is_judged_on_its_logs():
    """A `positive(...)` metric (right-skewed, > 0): a threshold is about the geometric mean, a compare with a
    relative margin about the ratio of geometric means, each tested on the log values."""
    from gates.study import positive

    metrics = {"loss": positive("lower", "test")}
    a, b = [0.5, 0.6, 0.7, 0.4, 0.55], [1.1, 0.9, 1.3, 1.0, 1.2]
    threshold = thr("a", "loss", "lower", 1.0)
    ratio = {
        "kind": "compare",
        "arm": "a",
        "metric": "loss",
        "other": "b",
        "direction": "lower",
        "relative_margin": 0.1,
    }
    v = decide(
        decision([threshold, ratio], [thr("a", "loss", "higher", 100.0)]),
        runs("a", loss=a) + runs("b", loss=b),
        metrics,
    )
    t, c = cond(v, "supported_if[0]"), cond(v, "supported_if[1]")
    assert (t.scale, c.scale) == ("log", "log") and t.test == "one-sample t" and c.test == "welch t"
    assert t.estimand == "geometric mean of a.loss across seeds (on the log scale)"
    assert c.estimand == "ratio of the geometric means a.loss / b.loss (on the log scale)"
    assert t.estimate == pytest.approx(math.log(1.0) - np.mean(np.log(a)))
    assert t.p_hold == pytest.approx(
        stats.ttest_1samp(np.log(a), 0.0, alternative="less").pvalue, rel=1e-9
    )
    # a <= 0.9 b  <=>  log(0.9) + log b - log a >= 0
    assert c.estimate == pytest.approx(math.log(0.9) + np.mean(np.log(b)) - np.mean(np.log(a)))
    welch = stats.ttest_ind(
        np.log(b) + math.log(0.9), np.log(a), equal_var=False, alternative="greater"
    )
    assert c.p_hold == pytest.approx(welch.pvalue, rel=1e-9)
    # without the declaration the same values are judged on the linear scale (about the mean)
    linear = cond(decide(decision([threshold]), runs("a", loss=a)), "supported_if[0]")
    assert linear.scale == "linear" and linear.estimate == pytest.approx(1.0 - np.mean(a))


def test_an_arm_with_no_completed_run_makes_the_verdict_invalid():
    """Failed runs are never results: an arm the decision reads without a completed run means the experiment
    did not run as designed, naming the arm, the counts and the first error's last frame."""
    c = {"kind": "compare", "arm": "a", "metric": "acc", "other": "b", "direction": "higher"}
    broken = [
        r.revised(
            error={"type": "RuntimeError", "message": "boom", "where": "my_study/study.py:12"}
        )
        for r in runs("b", seeds=[0, 1, 2], status="failed")
    ]
    v = decide(decision([c]), runs("a", acc=[0.9, 0.91, 0.92]) + broken)
    assert v.verdict == "invalid"
    assert v.reasons[0] == (
        "arm b did not run as designed: 0 of 3 runs completed (3 failed); first error: "
        "my_study/study.py:12: RuntimeError: boom"
    )
    assert [(x.arm, x.completed, x.runs) for x in v.not_run] == [("b", 0, 3)]
    assert "--record --reason" in v.settle[0]
    # one completed run of b is a result again (too few to decide, but not invalid)
    some = decide(
        decision([c]), runs("a", acc=[0.9, 0.91, 0.92]) + runs("b", acc=[0.5]) + broken[1:]
    )
    assert some.verdict == "inconclusive" and some.not_run == []


def test_seeds_the_contract_expects_without_a_run_are_lost():
    d = decision([thr("a", "acc", "higher", 0.9)])
    rs = runs("a", acc=[0.96, 0.97, 0.98])
    assert decide(d, rs).verdict == "supported"
    v = decide(d, rs, seeds=[0, 1, 2, 3])
    assert [(x.seed, x.why) for x in v.lost if x.arm == "a"] == [(3, "no run recorded")]
    assert (
        v.verdict == "inconclusive"
        and "cannot hold while runs it reads are lost" in v.conditions[0].note
    )


def test_a_bar_beyond_the_ceiling_makes_the_verdict_invalid():
    from gates.study import proportion

    d = decision([thr("a", "acc", "higher", 0.95, estimand="median")])
    rs = runs("a", acc=[0.96, 0.97, 0.98, 0.975, 0.965])
    metrics = {"acc": proportion("higher", "test")}
    ceiling = {"supported_if[0]": {"why": "10% label noise", "value": 0.9}}
    v = decide(d, rs, metrics, ceilings=ceiling)
    assert v.verdict == "invalid" and [x.condition for x in v.beyond_ceiling] == ["supported_if[0]"]
    assert (
        "the best possible arm reaches 0.9 (known before the run: 10% label noise)" in v.reasons[0]
    )
    assert (
        decide(
            d, rs, metrics, ceilings={"supported_if[0]": {"why": "no noise", "value": 1.0}}
        ).verdict
        == "supported"
    )


def test_estimand_notes_name_each_condition_s_estimand_and_test():
    from gates.inference import estimand_notes
    from gates.study import positive, proportion

    d = decision(
        [
            thr("a", "acc", "higher", 0.5),
            thr("a", "loss", "lower", 1.0),
            thr("a", "acc", "higher", 0.5, estimand="mean"),
        ]
    )
    metrics = {"acc": proportion("higher", "test"), "loss": positive("lower", "test")}
    notes = estimand_notes(d, 5, metrics)
    assert notes[0] == (
        "note: supported_if[0] estimates the median of a.acc across seeds (its metrics' default), "
        "by the sign test"
    )
    assert "geometric mean of a.loss" in notes[2] and "the t-test" in notes[2]
    assert "mean of a.acc" in notes[3] and "(declared), by the bounded-mean test" in notes[3]
    # 5 seeds: the sign test reaches 1/32 only if every seed agrees
    assert "could hold only if every seed" in notes[1] and "supported_if[0]" in notes[1]


def test_two_seeds_never_reach_a_verdict():
    """Issue #38: at 2 seeds a one-sample t-test has one degree of freedom and can still reach 0.05 (here
    p about 0.005): a verdict would rest on a spread two seeds only guess. Engine 6 judges no effect
    with fewer than 3 completed values; the settle line asks for the third."""
    x = [0.960, 0.961]
    assert stats.ttest_1samp(x, 0.9, alternative="greater").pvalue < 0.05
    v = decide(decision([thr("a", "acc", "higher", 0.9)]), runs("a", acc=x))
    c = cond(v, "supported_if[0]")
    assert v.verdict == "inconclusive" and c.outcome == "undetermined"
    assert "only 2 completed seeds of arm a" in c.note
    assert any("at least 3 each" in line for line in v.settle)
    three = decide(decision([thr("a", "acc", "higher", 0.9)]), runs("a", acc=x + [0.962]))
    assert three.verdict == "supported"


def test_the_verdicts_parts_are_records_written_in_their_order_and_read_back_as_the_same():
    """Halts, lost values, arms not run and bars beyond the ceiling are entities the engine builds and
    evidence holds (one schema each): `to_dict` writes each key for key in the order evidence.json has
    always listed it, and the record read back from that JSON is the one the engine built."""
    from gates.contract import CeilingRef
    from gates.entities import BeyondCeilingRecord, HaltRecord, LostValueRecord, NotRunRecord
    from gates.record._evidence import Evidence
    from gates.study import proportion

    c = {"kind": "compare", "arm": "a", "metric": "acc", "other": "b", "direction": "higher"}
    halted = runs("a", seeds=[3], status="halted", halt_reason="divergence")
    v = decide(
        decision([c, thr("a", "acc", "higher", 0.95)]),
        runs("a", acc=[0.96, 0.97, 0.98]) + halted + runs("b", seeds=[0, 1, 2, 3], status="failed"),
        {"acc": proportion("higher", "test")},
        ceilings={"supported_if[1]": CeilingRef(why="label noise", value=0.9)},
    )
    assert v.verdict == "invalid"
    assert [type(x) for x in (v.halts[0], v.lost[0], v.not_run[0], v.beyond_ceiling[0])] == [
        HaltRecord,
        LostValueRecord,
        NotRunRecord,
        BeyondCeilingRecord,
    ]
    written = v.to_dict()
    assert [list(x) for x in (written["halts"][0], written["lost"][0])] == [
        ["arm", "seed", "reason"],
        ["arm", "metric", "seed", "why"],
    ]
    assert list(written["not_run"][0]) == [
        "arm",
        "runs",
        "completed",
        "statuses",
        "first_error",
        "text",
        "settle",
    ]
    assert list(written["beyond_ceiling"][0]) == [
        "condition",
        "description",
        "ceiling",
        "min",
        "max",
        "source",
        "why",
        "text",
        "settle",
    ]
    assert v.beyond_ceiling[0].why == "label noise" and v.halts[0].reason == "divergence"
    # evidence reads each part back as the record the engine built (the same class)
    for name in ("halts", "lost", "not_run", "beyond_ceiling"):
        field = Evidence.model_fields[name].annotation
        read = [field.__args__[0].model_validate(x) for x in written[name]]
        assert read == getattr(v, name)
        assert [x.as_dict() for x in read] == written[name]
    # a ceiling given as data (a study's, through LoadedContract.ceilings) is read the same way
    as_data = decide(
        decision([thr("a", "acc", "higher", 0.95)]),
        runs("a", acc=[0.96, 0.97, 0.98]),
        {"acc": proportion("higher", "test")},
        ceilings={"supported_if[0]": {"why": "label noise", "value": 0.9}},
    )
    assert as_data.beyond_ceiling[0].text.startswith("supported_if[0]")
