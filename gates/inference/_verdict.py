"""Verdicts: per-seed final metrics + a contract's decision -> supported, refuted, inconclusive or invalid.

`decide(decision, runs, metrics)` is pure and deterministic, because `gates verify` re-derives every
verdict from the recorded metrics and compares it with the one recorded. Choices, fixed here once
(README "What a verdict means" says the same in plain words, with the simulation table):

* Only runs with status "completed" give values; non-finite values are dropped (and said so).
* Every condition reduces to effects theta = const + sum(coef * centre(term)), oriented so that
  theta > 0 means the condition holds, on the condition's scale: the metrics' own values (`linear`),
  or their logs when every metric it reads is declared `log` (positive, right-skewed: losses, KLs,
  latencies) and the condition is multiplicative (a threshold, a compare with a relative margin or
  none, a trend). Threshold: one term. Compare: two terms, an absolute margin in const, a relative
  margin r as log(1 + r) / log(1 - r) on the log scale (or in the other term's coefficient on the
  linear scale). Trend: one compare-like effect per consecutive pair, margin 0. Each condition
  records what it estimates (`estimand`): a mean, a geometric mean, a median, a ratio.
* Each effect is tested one-sided, H0: theta <= 0 (p_hold) and H0: theta >= 0 (p_fail), by one of:
  - the t-test (one-sample / Welch / paired) on the condition's scale, which assumes roughly normal
    per-seed values there. Used only where nothing in what the test reads contradicts that: no term
    (for a paired test: the paired differences) without spread, no repeated value, no value at the
    metric's declared bound. A t-test on raw right-skewed values does not keep its level (lognormal
    per-seed losses, true mean at the bar: 22-24% false support for a 5% test, benchmarks/verdict_levels.py):
    such metrics are declared `log`.
  - otherwise an exact test, whose smallest p-value is what the seeds can give: the sign test for
    one term or paired differences (estimand: the median; it assumes nothing about the shape, where
    the sign-flip test it replaces assumed symmetry and gave 10-18% on skewed values; smallest p =
    2^-n), permutation of the two samples for an unpaired compare (it assumes the two arms' values
    are exchangeable when the condition sits at its bar; smallest p = 1 / C(n1+n2, n1)). Exact
    enumeration up to 2^16 arrangements, beyond that Monte Carlo with a fixed seed and
    p = (k + 1) / (B + 1). Ties count against the condition.
  - `interval: bootstrap`: the percentile bootstrap's own p-value does not hold its level at few
    seeds, so its p-values come from the exact test; the bootstrap gives the interval only.
* A trend holds iff every pair holds (intersection-union: p_hold = max pair p_hold) and fails iff
  some pair fails (p_fail = min(1, pairs * min pair p_fail), Bonferroni within the trend).
* Families. A claim is supported only if ALL its supported_if conditions hold: an intersection-union
  test, so each is tested at alpha with no correction (false support stays at most alpha: it needs
  every one of them to hold falsely, and one false null is enough to bound it). The claim is refuted
  if ANY refuted_if condition holds or ANY supported_if condition fails: that disjunction is one
  family, Holm-corrected at alpha. Controls must all hold (intersection-union at alpha); a control
  fails in its own Holm family. refuted_if conditions failing (which decides nothing) are shown with
  Holm across the refuted_if list.
* Intervals (t and bootstrap) are two-sided at level 1 - 2 alpha, so each end is a one-sided alpha
  bound; an exactly tested effect shows the per-seed range of the effect instead.
* A term with fewer than MIN_VERDICT_SEEDS (3) values leaves its effect undetermined (p = 1 both
  ways): two seeds never reach a verdict.
* Lost runs never vanish: a seed (of those the contract, or a sequential look, expects) with no
  finite value of an (arm, metric) that a supported_if condition or a control reads (failed,
  skipped, killed, diverged, over budget, halted on a comparator, non-finite, never recorded) keeps
  that condition from holding, so the verdict cannot be supported on the survivors; refutation by
  the survivors stays possible. A futility halt refutes only when it halts an arm under test.
* The experiment did not run as designed, and the verdict is invalid, when an arm the decision or a
  control reads has no completed run (every run failed, was skipped, killed or diverged), naming the
  arm, the counts and the first error; or when a condition's bar lies beyond the ceiling measured for
  it (what the best possible arm reaches: the condition tests nothing).
* seeds_needed: per arm, for 80% power at the level the condition is tested at (alpha to hold for a
  supported_if, Holm's strictest alpha / m to fail or to refute) at the observed effect and spread
  (noncentral t), and at least the seeds at which the exact test could reach that level; an
  estimate from the observed effect, not a promise.
* evaluation "exact" (deterministic studies): no statistics. Per-seed effects on the metrics' own
  scale (threshold, paired compare, trend pairs on the seeds every item has) hold iff they hold on
  every seed and fail iff they fail on every seed; an unpaired compare is judged on the means.

Here: `decide` (each condition evaluated, the families, the controls, the verdict) and `predictions`.
The engine's other parts: `_effects` (a condition as effects: estimand, scale, test), `_statistics`
(the tests), `_results` (the verdict as recorded, and its wording), `_validity` (lost values, arms not
run as designed, ceilings) and `_reachability` (whether the seeds can reach a verdict at all).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from gates.contract import (
    CeilingRef,
    Decision,
    Threshold,
    Trend,
    arms_under_test,
    condition_terms,
)
from gates.entities import (
    ConditionRecord,
    FirstSignalRecord,
    HaltRecord,
    LostValueRecord,
    RunRecord,
    Verdict,
)
from gates.inference._effects import (
    _describe,
    _effects,
    _estimand,
    condition_estimand,
    condition_scale,
    condition_test,
)
from gates.inference._results import ENGINE_VERSION, _join, _line, _settle_line
from gates.inference._statistics import _exact, _interval, _Stat, holm, seeds_for_power
from gates.inference._validity import (
    _beyond_ceiling,
    _is_futility,
    _lost_values,
    _not_run,
    _run_notes,
    _withhold,
)
from gates.study import Metric

CORRECTION = "iut+holm"  # supported_if and controls: intersection-union; the refutation: Holm


# ---------------------------------------------------------------------------------- one condition
def _samples(
    runs: list[RunRecord],
) -> tuple[dict[tuple[str, str], dict[int, float]], list[str]]:
    """(arm, metric) -> {seed: value} from completed runs; plus notes on dropped values."""
    samples: dict[tuple[str, str], dict[int, float]] = {}
    dropped = []
    for run in runs:
        if run.status != "completed":
            continue
        for metric, value in run.metrics.items():
            value = float(value) if value is not None else math.nan
            if math.isfinite(value):
                samples.setdefault((run.arm, metric), {})[run.seed] = value
            else:
                dropped.append(f"{run.arm}.{metric} seed {run.seed}")
    return samples, dropped


def _evaluate(
    list_name: str,
    index: int,
    c,
    samples,
    alpha: float,
    exact: bool,
    metrics: Mapping[str, Metric],
    control: str | None = None,
) -> tuple[ConditionRecord, list[_Stat]]:
    """One condition's result (outcome still open under interval evaluation) and its effects' stats."""
    terms = list(dict.fromkeys(condition_terms(c)))
    estimand = condition_estimand(c, metrics)
    kind = None if exact else condition_test(c, metrics)
    # paired tests, exact trends (judged seed by seed) and the tests of per-seed effects (the bounded
    # mean, the median, a share of seeds: an unpaired compare paired by seed, which is valid whatever
    # the arms' correlation) use the seeds every term has
    by_seed = (
        getattr(c, "test", None) == "paired"
        or (exact and isinstance(c, Trend))
        or kind in ("bounded", "sign", "binomial")
    )
    per_term = {t: samples.get(t, {}) for t in terms}
    counts = {f"{a}.{m}": len(v) for (a, m), v in per_term.items()}
    if by_seed:
        common = set.intersection(*(set(v) for v in per_term.values()))
        per_term = {t: {s: v[s] for s in common} for t, v in per_term.items()}
    columns = {t: np.array([v[s] for s in sorted(v)], dtype=float) for t, v in per_term.items()}
    log = not exact and condition_scale(c, metrics) == "log"
    bootstrap = c.interval == "bootstrap"
    pair_stats = []
    for effect in _effects(c, log):
        cols = [columns[(t.arm, t.metric)] for t in effect.terms]
        pair_stats.append(
            _exact(effect, cols, by_seed, counts)
            if exact
            else _interval(effect, cols, by_seed, alpha, bootstrap, metrics, counts, kind, c.share)
        )
    known = [s for s in pair_stats if s.theta is not None]
    weakest = min(known, key=lambda s: s.theta) if known else _Stat(theta=None)
    notes = list(dict.fromkeys(s.note for s in pair_stats if s.note))
    if exact:
        outcomes = [s.outcome for s in pair_stats]
        outcome = (
            "fails"
            if "fails" in outcomes
            else "holds"
            if all(o == "holds" for o in outcomes)
            else "undetermined"
        )
        p_hold = p_fail = None
        test, reason = (
            "exact",
            "evaluation: exact (a deterministic study): judged seed by seed, no statistics",
        )
    else:
        outcome = "undetermined"  # settled after the families are corrected, across conditions
        p_hold = max(s.p_hold for s in pair_stats)
        p_fail = min(1.0, len(pair_stats) * min(s.p_fail for s in pair_stats))
        tests = list(dict.fromkeys(s.test for s in pair_stats if s.test))
        reasons = list(dict.fromkeys(s.test_reason for s in pair_stats if s.test_reason))
        test = " + ".join(tests) or (
            "paired t" if by_seed else "one-sample t" if isinstance(c, Threshold) else "welch t"
        )
        reason = "; ".join(reasons)
    # every field given, in the record's order: evidence.json has had each key of a condition, in
    # this order, since the first engine (a field the engine settles later is "" or None until then)
    result = ConditionRecord(
        list_name=list_name,
        index=index,
        kind=c.kind,
        description=_describe(c),
        estimate=weakest.theta,
        ci_low=weakest.ci_low,
        ci_high=weakest.ci_high,
        ci_level=weakest.ci_level,
        p_hold=p_hold,
        p_fail=p_fail,
        p_hold_adj=None,
        p_fail_adj=None,
        test=test,
        n={f"{a}.{m}": len(col) for (a, m), col in columns.items()},
        values={f"{a}.{m}": [float(v) for v in col] for (a, m), col in columns.items()},
        outcome=outcome,
        note="; ".join(notes),
        seeds_needed=None,
        test_reason=reason,
        control=control,
        estimand=_estimand(c, estimand, by_seed) + (" (on the log scale)" if log else ""),
        scale="log" if log else "linear",
        adjustment="",
    )
    return result, pair_stats


def _trend_seeds_needed(stats_: list[_Stat], level: float) -> int | None:
    # all pairs must hold for the trend to hold; one failing pair is enough for it to fail
    if any(s.theta is None for s in stats_):
        return None
    weakest = min(stats_, key=lambda s: s.theta)
    if weakest.theta <= 0:
        return weakest.needed(level)
    needed = [s.needed(level) for s in stats_ if s.p_hold > 0]
    return None if any(n is None for n in needed) else max(needed, default=None)


# ---------------------------------------------------------------------------------- families
def _apply_families(
    results: list[ConditionRecord], alpha: float
) -> tuple[list[ConditionRecord], dict[str, float]]:
    """Each outcome from the families: a supported_if condition holds at alpha (intersection-union: all
    must hold); the ways to refute (a refuted_if holding, a supported_if failing) are one Holm family;
    refuted_if failing, shown only, is Holm across the refuted_if list. Returns the results so settled
    and each condition's level for planning seeds (label -> the alpha its undecided side is tested at)."""
    supported = [r for r in results if r.list_name == "supported_if"]
    refuted = [r for r in results if r.list_name == "refuted_if"]
    refute = holm([r.p_hold for r in refuted] + [r.p_fail for r in supported])
    m = len(refute)
    # label -> (p_hold_adj, p_fail_adj)
    adjusted = {
        r.label: (hold, fail)
        for r, hold, fail in zip(refuted, refute[: len(refuted)], holm([r.p_fail for r in refuted]))
    } | {r.label: (r.p_hold, fail) for r, fail in zip(supported, refute[len(refuted) :])}
    levels, settled = {}, []
    for r in results:
        p_hold_adj, p_fail_adj = adjusted[r.label]
        outcome = _outcome(p_hold_adj, p_fail_adj, alpha)
        ways = f"Holm over the {m} ways to refute (a refuted_if holding, a supported_if failing)"
        if r.list_name == "supported_if":
            adjustment = f"p(hold): intersection-union, at alpha unadjusted; p(fail): {ways}"
            levels[r.label] = alpha if (r.estimate or 0) > 0 else alpha / m
            raw, adj = r.p_fail, p_fail_adj
        else:
            adjustment = (
                f"p(hold): {ways}; p(fail): Holm over the {len(refuted)} refuted_if conditions"
            )
            levels[r.label] = alpha / m if (r.estimate or 0) > 0 else alpha / len(refuted)
            raw, adj = r.p_hold, p_hold_adj
        note = r.note
        if outcome == "undetermined" and raw <= alpha < adj:
            note = _join(
                note,
                f"significant alone, p = {raw:.3g}, but not after Holm over the {m} ways to refute",
            )
        settled.append(
            r.revised(
                p_hold_adj=p_hold_adj,
                p_fail_adj=p_fail_adj,
                outcome=outcome,
                note=note,
                adjustment=adjustment,
            )
        )
    return settled, levels


def _outcome(p_hold_adj: float, p_fail_adj: float, alpha: float) -> str:
    return "holds" if p_hold_adj <= alpha else "fails" if p_fail_adj <= alpha else "undetermined"


def _evaluate_controls(
    controls, samples, alpha: float, exact: bool, metrics
) -> list[ConditionRecord]:
    """Each control as a condition that must hold: all must hold (intersection-union at alpha); a control
    fails in the controls' own Holm family."""
    evaluated = [
        (*_evaluate("controls", i, c, samples, alpha, exact, metrics, c.control), c)
        for i, c in enumerate(controls)
    ]
    out = [r for r, _, _ in evaluated]
    if not out or exact:
        return out
    settled = []
    for (r, pair_stats, c), adj in zip(evaluated, holm([r.p_fail for r in out])):
        outcome = _outcome(r.p_hold, adj, alpha)
        settled.append(
            r.revised(
                p_hold_adj=r.p_hold,
                p_fail_adj=adj,
                outcome=outcome,
                adjustment=(
                    f"p(hold): intersection-union (every control must hold), at alpha unadjusted; "
                    f"p(fail): Holm over the {len(out)} controls"
                ),
                # it must hold: seeds for power at alpha
                seeds_needed=_seeds_needed(c, pair_stats, alpha)
                if outcome == "undetermined"
                else None,
            )
        )
    return settled


def _seeds_needed(c, pair_stats: list[_Stat], level: float) -> int | None:
    return (
        _trend_seeds_needed(pair_stats, level)
        if isinstance(c, Trend)
        else pair_stats[0].needed(level)
    )


# ---------------------------------------------------------------------------------- the verdict
def decide(
    decision: Decision,
    runs: list[RunRecord],
    metrics: Mapping[str, Metric] | None = None,
    *,
    alpha: float | None = None,
    control_alpha: float | None = None,
    controls=(),
    seeds: list[int] | None = None,
    ceilings: Mapping[str, CeilingRef | dict] | None = None,
    edges: Mapping[str, str] | None = None,
) -> Verdict:
    """The verdict the decision rules give on these runs (the records evidence.json stores).

    `metrics` is the study's metric declarations (scales, ranges); without it every metric is linear and
    no value counts as being at a bound. `alpha` replaces the decision's (a sequential look spends part
    of it, a claim's family leaves it less). `controls` must all hold, else the verdict is invalid; they are
    judged at `control_alpha` (default: the decision's alpha, or `alpha` when given). `seeds`: the seeds the runs should
    cover (default: those any run has): a seed without a value is lost. A completed run recorded with
    `converged: false`, or a tuned arm whose search stopped at an edge (`edges`), leaves every decision
    condition reading its arm undetermined. `ceilings` (label -> a `CeilingRef`, or its data: {why, value |
    metric | arm}): a bar the best possible arm does not reach makes the verdict invalid."""
    metrics = metrics or {}
    alpha = decision.alpha if alpha is None else alpha
    exact = decision.evaluation == "exact"
    samples, dropped = _samples(runs)
    listed = decision.conditions()
    evaluated = [_evaluate(name, i, c, samples, alpha, exact, metrics) for name, i, c in listed]
    results = [r for r, _ in evaluated]
    if not exact:
        results, levels = _apply_families(results, alpha)
        results = [
            r.revised(seeds_needed=_seeds_needed(c, pair_stats, levels[r.label]))
            if r.outcome == "undetermined"
            else r
            for r, (_, pair_stats), (_, _, c) in zip(results, evaluated, listed)
        ]

    under_test = arms_under_test(decision)
    halts = [
        HaltRecord(arm=r.arm, seed=r.seed, reason=r.halt_reason)
        for r in runs
        if r.status == "halted"
    ]
    futile = [h for h in halts if h.arm in under_test and _is_futility(h.reason)]
    checked = _evaluate_controls(
        controls, samples, alpha if control_alpha is None else control_alpha, exact, metrics
    )
    read = [t for _, _, c in listed for t in condition_terms(c)] + [
        t for c in controls for t in condition_terms(c)
    ]
    lost = _lost_values(read, runs, samples, seeds)
    results = [_unless_lost(r, c, lost) for r, (_, _, c) in zip(results, listed)]
    checked = [_unless_lost(r, c, lost) for r, c in zip(checked, controls)]
    results, stalled = _withhold(results, listed, runs, edges or {})
    not_run = _not_run(list(dict.fromkeys(a for a, _ in read)), runs, seeds, under_test)
    beyond = _beyond_ceiling(results, listed, ceilings or {}, samples, metrics)

    supported = [r for r in results if r.list_name == "supported_if"]
    refuted = [r for r in results if r.list_name == "refuted_if"]
    reasons: list[str] = []
    broken = [r for r in checked if r.outcome != "holds"]
    if broken or not_run or beyond:
        verdict = "invalid"
        reasons += [f"arm {x.arm} did not run as designed: {x.text}" for x in not_run]
        reasons += [x.text for x in beyond]
        reasons += [
            f"{r.label} ({r.control} control) {'fails' if r.outcome == 'fails' else 'cannot be settled'}: "
            f"{_line(r)}"
            for r in broken
        ]
        if not_run:
            reasons.append(
                "an arm the decision reads has no completed run: the experiment did not run as designed, "
                "so the claim is neither supported nor refuted (failed runs are never results)"
            )
        if beyond:
            reasons.append(
                "a bar beyond what the best possible arm reaches tests nothing: the claim is neither "
                "supported nor refuted"
            )
        if broken:
            reasons.append(
                "a control that does not hold means the setup cannot be trusted to show the effect or its "
                "absence: the claim is neither supported nor refuted"
            )
    elif (
        any(r.outcome == "holds" for r in refuted)
        or any(r.outcome == "fails" for r in supported)
        or futile
    ):
        verdict = "refuted"
        reasons += [f"{r.label} holds: {_line(r)}" for r in refuted if r.outcome == "holds"]
        reasons += [f"{r.label} fails: {_line(r)}" for r in supported if r.outcome == "fails"]
        reasons += [
            f"arm {h.arm} seed {h.seed} was halted for futility (an arm under test was hopeless)"
            for h in futile
        ]
    elif all(r.outcome == "holds" for r in supported):
        verdict = "supported"
        reasons += [f"{r.label} holds: {_line(r)}" for r in supported]
        reasons.append("no refuted_if condition holds")
    else:
        verdict = "inconclusive"
        reasons.append("not every supported_if condition holds, and nothing refutes the claim")
        reasons += [f"{r.label} holds: {_line(r)}" for r in supported if r.outcome == "holds"]
        reasons += [
            f"{r.label} undetermined: {_line(r)}" for r in results if r.outcome == "undetermined"
        ]
    reasons += _run_notes(runs, read, under_test, seeds, not_run)
    if dropped:
        reasons.append("non-finite values dropped: " + ", ".join(dropped))
    if verdict == "inconclusive":
        settle = [
            _settle_line(r, stalled.get(r.label)) for r in results if r.outcome == "undetermined"
        ]
    elif verdict == "invalid":
        settle = (
            [f"arm {x.arm}: {x.settle}" for x in not_run]
            + [x.settle for x in beyond]
            + [_settle_line(r) for r in broken if r.outcome == "undetermined"]
        )
    else:
        settle = []
    return Verdict(
        verdict=verdict,
        reasons=reasons,
        conditions=results,
        alpha=alpha,
        evaluation=decision.evaluation,
        correction="none" if exact else CORRECTION,
        settle=settle,
        halts=halts,
        lost=lost,
        controls=checked,
        not_run=not_run,
        beyond_ceiling=beyond,
        tuning_edges=dict(edges or {}),
        engine_version=ENGINE_VERSION,
    )


def _unless_lost(r: ConditionRecord, c, lost: list[LostValueRecord]) -> ConditionRecord:
    """A condition that must hold (supported_if, a control) cannot while values it reads are lost."""
    missing = [x for x in lost if (x.arm, x.metric) in condition_terms(c)]
    if r.list_name not in ("supported_if", "controls") or not missing or r.outcome != "holds":
        return r
    return r.revised(
        outcome="undetermined",
        note=_join(
            r.note,
            "cannot hold while runs it reads are lost: "
            + ", ".join(f"{x.arm}.{x.metric} seed {x.seed} ({x.why})" for x in missing),
        ),
    )


# ---------------------------------------------------------------------------------- the gates, measured
def predictions(contract, runs: list[RunRecord], first_signals: list[FirstSignalRecord]) -> dict:
    """Gate 3's predicted ablation and gate 5's falsifiable point compared with what was measured.

    Gate 3 came true when the measured mean difference (oriented by its direction) is at least the
    predicted size; gate 5 when the falsifiable threshold was met by `by_step` on every seed. Both are
    reported, never used by the verdict (the decision's conditions are)."""
    pa = contract.preflight.predicted_ablation
    samples, _ = _samples(runs)
    a, b = samples.get((pa.arm, pa.metric), {}), samples.get((pa.versus, pa.metric), {})
    measured = None
    if a and b:
        diff = float(np.mean(list(a.values())) - np.mean(list(b.values())))
        measured = diff if pa.direction == "higher" else -diff
    # a supported_if condition is tested at alpha itself (intersection-union)
    power = (
        seeds_for_power(pa.size, pa.sd, contract.decision.alpha)
        if pa.sd is not None and pa.size > 0
        else None
    )
    met = [bool(r.met) for r in first_signals]
    return {
        "predicted_ablation": {
            "arm": pa.arm,
            "versus": pa.versus,
            "metric": pa.metric,
            "direction": pa.direction,
            "predicted_size": pa.size,
            "measured_size": measured,
            "came_true": None if measured is None else bool(measured >= pa.size),
            "n": {pa.arm: len(a), pa.versus: len(b)},
            "sd": pa.sd,
            "seeds_for_80pct_power": power,
        },
        "falsifiable_point": {
            "met_on": sum(met),
            "of": len(met),
            "came_true": bool(met) and all(met),
        },
    }
