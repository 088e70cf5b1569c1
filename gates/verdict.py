"""Verdicts: per-seed final metrics + a contract's decision -> supported, refuted or inconclusive.

`decide(decision, runs, metrics)` is pure and deterministic, because `gates verify` re-derives every
verdict from the recorded metrics and compares it with the one recorded. Choices, fixed here once
(README "What a verdict means" says the same in plain words):

* Only runs with status "completed" give values; non-finite values are dropped (and said so).
* Every condition reduces to effects theta = const + sum(coef * mean(term)), oriented so that
  theta > 0 means the condition holds. Threshold: one term. Compare: two terms, an absolute margin
  goes into const, a relative margin r into the other term's coefficient (-(1+r) or (1-r)).
  Trend: one Compare-like effect per consecutive pair, margin 0.
* Each effect is tested one-sided, H0: theta <= 0 (p_hold) and H0: theta >= 0 (p_fail), by one of:
  - the t-test (one-sample / Welch / paired), which assumes roughly normal per-seed values. It is
    used only where nothing in the data contradicts that: no term without spread, no repeated
    value (a metric that takes a few discrete values), no value at the metric's declared bound.
  - otherwise an exact randomization test, whose smallest p-value is what the seeds can give:
    sign-flip for one term or paired differences (smallest p = 2^-n, 1/8 at 3 seeds), permutation
    of the two samples for an unpaired compare (smallest p = 1 / C(n1+n2, n1), 1/20 at 3 + 3).
    Exact enumeration up to 2^16 arrangements, beyond that Monte Carlo with a fixed seed and
    p = (k + 1) / (B + 1). Ties count against the condition (p includes the observed arrangement).
  - `interval: bootstrap`: the percentile bootstrap's own p-value does not hold its level at few
    seeds (false support 24% at 2 seeds, 13% at 3 with the true mean at the bar), so its p-values
    come from the exact randomization test; the bootstrap gives the interval only.
* A trend holds iff every pair holds (intersection-union: p_hold = max pair p_hold) and fails iff
  some pair fails (p_fail = min(1, pairs * min pair p_fail), Bonferroni within the trend); its
  estimate and interval are those of the weakest pair.
* Intervals (t and bootstrap) are two-sided at level 1 - 2 alpha, so each end is a one-sided alpha
  bound; a randomization-tested effect shows the per-seed range of the effect instead.
* Holm across all conditions of the decision (supported_if and refuted_if together), separately for
  the p_hold family and the p_fail family, at the decision's alpha (one alpha for the family).
* A term with < 2 values leaves its effect undetermined (p = 1 both ways).
* Lost runs never vanish: a seed with no finite value of an (arm, metric) that a supported_if
  condition reads (failed, killed, diverged, over budget, halted on a comparator, non-finite) keeps
  that condition from holding, so the verdict cannot be supported on the survivors; refutation by
  the survivors stays possible. A futility halt refutes only when it halts an arm under test (not a
  comparator: a hopeless baseline is evidence against the baseline, not against the claim).
* seeds_needed: per arm, for 80% power at the strictest Holm level alpha / m at the observed effect
  and spread (noncentral t), and at least the seeds at which the exact test could reach that level;
  an estimate from the observed effect, not a promise.
* evaluation "exact" (deterministic studies): no statistics. Per-seed effects (threshold, paired
  compare, trend pairs on the seeds every item has) hold iff they hold on every seed and fail iff
  they fail on every seed; an unpaired compare is judged on the means.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass, field
from typing import Mapping

import numpy as np
from scipy import stats

from gates.contract import Compare, Decision, Threshold, Trend, arms_under_test, condition_terms
from gates.study import Metric

# Bumped whenever a change can change a recorded verdict; the claims index records it.
ENGINE_VERSION = "2"
BOOTSTRAP_RESAMPLES = 10_000
BOOTSTRAP_SEED = 20240601
RANDOMIZATION_EXACT_LIMIT = 1 << 16  # arrangements enumerated exactly; beyond, Monte Carlo
RANDOMIZATION_DRAWS = 20_000
RANDOMIZATION_SEED = 20261130
MAX_SEEDS_SEARCHED = 1000
POWER = 0.8

T_TEST_REASON = "per-seed values taken as roughly normal: every term has spread, no repeated value, none at a bound"
BOOTSTRAP_REASON = ("interval: bootstrap; its own p-value does not hold its level at few seeds, so p comes "
                    "from the exact randomization test and the bootstrap gives the interval")


# ---------------------------------------------------------------------------------- results
@dataclass
class ConditionResult:
    list_name: str  # "supported_if" | "refuted_if"
    index: int
    kind: str
    description: str
    estimate: float | None  # theta: > 0 means the condition holds (trend: the weakest pair)
    ci_low: float | None
    ci_high: float | None
    ci_level: float | None
    p_hold: float | None  # raw one-sided p-values
    p_fail: float | None
    p_hold_adj: float | None  # Holm-adjusted across every condition of the decision
    p_fail_adj: float | None
    test: str
    n: dict[str, int]
    values: dict[str, list[float]]
    outcome: str  # "holds" | "fails" | "undetermined"
    note: str = ""
    seeds_needed: int | None = None
    test_reason: str = ""  # why this test: the t-test's assumption, or what in the data rules it out
    control: str | None = None  # "positive" | "negative" for a control

    @property
    def label(self) -> str:
        return f"{self.list_name}[{self.index}]"

    def to_dict(self) -> dict:
        return json_safe(asdict(self))


@dataclass
class Verdict:
    verdict: str  # "supported" | "refuted" | "inconclusive" | "invalid" (a control does not hold)
    reasons: list[str]
    conditions: list[ConditionResult]
    alpha: float
    evaluation: str
    correction: str
    settle: list[str] = field(default_factory=list)
    halts: list[dict] = field(default_factory=list)
    lost: list[dict] = field(default_factory=list)  # (arm, metric, seed, why) a condition reads but lacks
    engine_version: str = ENGINE_VERSION
    controls: list[ConditionResult] = field(default_factory=list)
    looks: list[dict] = field(default_factory=list)  # a sequential contract's looks (gates.sequential)

    def signature(self) -> str:
        """The statistical settings the verdict was reached under, compact, for comparing records."""
        tests = ",".join(sorted({c.test for c in self.conditions}))
        boot = (f"|bootstrap={BOOTSTRAP_RESAMPLES}@{BOOTSTRAP_SEED}"
                if any(c.ci_level and "t" not in c.test.split() for c in self.conditions) else "")
        return (f"engine={self.engine_version}|alpha={self.alpha:g}|eval={self.evaluation}"
                f"|correction={self.correction}{boot}|tests={tests}")

    def to_dict(self) -> dict:
        return json_safe(asdict(self))


def json_safe(x):
    """NaN and infinities are not JSON; numpy scalars are not JSON-able either."""
    if isinstance(x, dict):
        return {str(k): json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    if isinstance(x, (int, np.integer)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        return float(x) if math.isfinite(x) else None
    return x


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
    """theta = const + sum(coef * mean(term)); strict: theta == 0 does not count as holding."""

    terms: tuple[_Term, ...]
    const: float
    strict: bool = False


def _effects(c) -> list[_Effect]:
    if isinstance(c, Threshold):
        sign = 1.0 if c.direction == "higher" else -1.0
        return [_Effect((_Term(c.arm, c.metric, sign),), -sign * c.value)]
    if isinstance(c, Compare):
        other_metric = c.other_metric or c.metric
        r, margin = c.relative_margin, c.margin or 0.0
        if c.direction == "higher":  # A - B - m  or  A - (1+r) B
            sign_a, coef_b = 1.0, (-(1 + r) if r is not None else -1.0)
        else:  # B - A - m  or  (1-r) B - A
            sign_a, coef_b = -1.0, ((1 - r) if r is not None else 1.0)
        const = 0.0 if r is not None else -margin
        return [_Effect((_Term(c.arm, c.metric, sign_a), _Term(c.other, other_metric, coef_b)), const)]
    items = c.items()
    sign = 1.0 if c.direction == "higher" else -1.0  # lower: theta_k = mu_{k-1} - mu_k
    return [_Effect((_Term(*items[k - 1], -sign), _Term(*items[k], sign)), 0.0, strict=True)
            for k in range(1, len(items))]


def _describe(c) -> str:
    if isinstance(c, Threshold):
        return f"{c.arm}.{c.metric} {'>=' if c.direction == 'higher' else '<='} {c.value:g}"
    if isinstance(c, Compare):
        a, b = f"{c.arm}.{c.metric}", f"{c.other}.{c.other_metric or c.metric}"
        op, sign = (">=", "+") if c.direction == "higher" else ("<=", "-")
        if c.relative_margin is not None:
            return f"{a} {op} {b} * (1 {sign} {c.relative_margin:g})"
        offset = (c.margin or 0.0) * (1 if c.direction == "higher" else -1)
        return f"{a} {op} {b} {'+' if offset > 0 else '-'} {abs(offset):g}" if offset else f"{a} {op} {b}"
    op = " > " if c.direction == "lower" else " < "
    return f"trend {c.direction}: " + op.join(f"{a}.{m}" for a, m in c.items())


# ---------------------------------------------------------------------------------- statistics
@dataclass
class _Stat:
    """One effect's estimate: p-values and seeds_needed under interval evaluation, outcome under exact."""

    theta: float | None
    ci_low: float | None = None
    ci_high: float | None = None
    p_hold: float = 1.0
    p_fail: float = 1.0
    outcome: str = "undetermined"  # exact evaluation only
    note: str = ""
    test: str = ""
    test_reason: str = ""
    ci_level: float | None = None
    plan: tuple | None = None  # (spread_parts, one_sample, sizes): seeds_needed, computed when asked

    def needed(self, level: float) -> int | None:
        if self.plan is None or self.theta is None:
            return None
        spread_parts, one_sample, sizes = self.plan
        return _seeds_needed(self.theta, spread_parts, level, one_sample, sizes)


def _mean(x: np.ndarray) -> float:
    # equal values give that value exactly (a float sum could drift and fake a nonzero theta)
    return float(x[0]) if np.all(x == x[0]) else float(x.mean())


def _var(x: np.ndarray) -> float:
    return 0.0 if np.all(x == x[0]) else float(x.var(ddof=1))


def _lacking(effect: _Effect, columns: list[np.ndarray], need: int, paired: bool) -> str:
    """Why an effect cannot be judged: which terms have fewer than `need` values."""
    where = " among the seeds every term has" if paired else ""
    return "; ".join(f"only {len(col)} completed seed{'' if len(col) == 1 else 's'} of arm {t.arm} "
                     f"({t.key}){where}" for t, col in zip(effect.terms, columns) if len(col) < need)


def _t_unfit(effect: _Effect, columns: list[np.ndarray], d: np.ndarray | None,
             metrics: Mapping[str, Metric]) -> str:
    """Why the t-test's normality cannot hold for these values ('' when nothing contradicts it)."""
    for t, col in zip(effect.terms, columns):
        if np.all(col == col[0]):
            return f"{t.key} has no spread across seeds"
        if len(np.unique(col)) < len(col):
            return f"{t.key} repeats a value across seeds (a few discrete values)"
        spec = metrics.get(t.metric)
        if spec is not None and any(spec.at_bound(float(v)) for v in col):
            return f"{t.key} has a value at its bound ({spec.low if np.any(col == spec.low) else spec.high:g})"
    if d is not None:
        if np.all(d == d[0]):
            return "the paired differences have no spread"
        if len(np.unique(d)) < len(d):
            return "the paired differences repeat a value"
    return ""


def _interval(effect: _Effect, columns: list[np.ndarray], paired: bool, alpha: float, bootstrap: bool,
              metrics: Mapping[str, Metric]) -> _Stat:
    note = _lacking(effect, columns, 2, paired)
    if note:
        return _Stat(theta=None, note=note)
    one_sample = paired or len(columns) == 1
    d = effect.const + sum(t.coef * col for t, col in zip(effect.terms, columns)) if one_sample else None
    if one_sample:
        theta, n = _mean(d), len(d)
        spread_parts = [_var(d)]
    else:
        theta = effect.const + sum(t.coef * _mean(col) for t, col in zip(effect.terms, columns))
        spread_parts = [t.coef ** 2 * _var(col) for t, col in zip(effect.terms, columns)]
    plan = (spread_parts, one_sample, [len(d)] if one_sample else [len(c) for c in columns])
    unfit = _t_unfit(effect, columns, d if paired else None, metrics)
    if bootstrap or unfit:
        stat = _randomization(effect, columns, d)
        stat.test_reason = BOOTSTRAP_REASON if bootstrap else f"{unfit}: the t-test's normality cannot hold"
        if bootstrap:
            draws = _bootstrap(effect, columns, d)
            stat.ci_low, stat.ci_high = (float(q) for q in np.quantile(draws, [alpha, 1 - alpha]))
            stat.ci_level = 1 - 2 * alpha
        stat.plan = plan
        return stat
    if one_sample:
        se, df = math.sqrt(spread_parts[0] / n), n - 1.0
    else:
        parts = [s / len(col) for s, col in zip(spread_parts, columns)]
        se = math.sqrt(sum(parts))
        df = sum(parts) ** 2 / sum(p ** 2 / (len(col) - 1) for p, col in zip(parts, columns))  # Welch
    t_obs = theta / se
    half = float(stats.t.ppf(1 - alpha, df)) * se
    test = "paired t" if paired else "one-sample t" if one_sample else "welch t"
    return _Stat(theta, theta - half, theta + half, float(stats.t.sf(t_obs, df)), float(stats.t.cdf(t_obs, df)),
                 test=test, test_reason=T_TEST_REASON, ci_level=1 - 2 * alpha, plan=plan)


def _randomization(effect: _Effect, columns: list[np.ndarray], d: np.ndarray | None) -> _Stat:
    """Exact sign-flip (one term, or paired differences) or two-sample permutation test of theta."""
    if d is not None:
        stats_, exact = _sign_flip_means(d)
        observed, test = _mean(d), "sign-flip"
        low, high = float(d.min()), float(d.max())
    else:
        # theta = mean(x) - mean(y) with x = coef_a * a and y = -(const + coef_b * b)
        (ta, a), (tb, b) = zip(effect.terms, columns)
        x, y = ta.coef * a, -(effect.const + tb.coef * b)
        stats_, exact = _permutation_diffs(x, y)
        observed, test = _mean(x) - _mean(y), "permutation"
        low = high = None
    # ties count against the condition: a tolerance keeps float noise from breaking exact ties
    tol = 1e-12 * max(1.0, float(np.max(np.abs(stats_))))
    k_hold, k_fail = int(np.sum(stats_ >= observed - tol)), int(np.sum(stats_ <= observed + tol))
    if exact:
        total = len(stats_)
        p_hold, p_fail = k_hold / total, k_fail / total
    else:  # Monte Carlo: the observed arrangement counts as one draw
        total = len(stats_) + 1
        p_hold, p_fail = (k_hold + 1) / total, (k_fail + 1) / total
    note = (f"exact {test} test over {total} arrangements" if exact
            else f"{test} test, {RANDOMIZATION_DRAWS} random arrangements (seed {RANDOMIZATION_SEED})")
    return _Stat(observed, low, high, min(1.0, p_hold), min(1.0, p_fail),
                 test=f"{test} (exact)" if exact else f"{test} (Monte Carlo)", note=note)


def _sign_flip_means(d: np.ndarray) -> tuple[np.ndarray, bool]:
    n = len(d)
    if 2 ** n <= RANDOMIZATION_EXACT_LIMIT:
        signs = 1 - 2 * ((np.arange(2 ** n)[:, None] >> np.arange(n)) & 1)
        return (signs * d).mean(axis=1), True
    rng = np.random.default_rng(RANDOMIZATION_SEED)
    signs = rng.choice([-1.0, 1.0], size=(RANDOMIZATION_DRAWS, n))
    return (signs * d).mean(axis=1), False


def _permutation_diffs(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, bool]:
    pooled, n1 = np.concatenate([x, y]), len(x)
    total = len(pooled)
    if math.comb(total, n1) <= RANDOMIZATION_EXACT_LIMIT:
        masks = np.zeros((math.comb(total, n1), total), dtype=bool)
        for row, chosen in enumerate(itertools.combinations(range(total), n1)):
            masks[row, list(chosen)] = True
    else:
        rng = np.random.default_rng(RANDOMIZATION_SEED)
        order = np.argsort(rng.random((RANDOMIZATION_DRAWS, total)), axis=1)
        masks = np.zeros((RANDOMIZATION_DRAWS, total), dtype=bool)
        np.put_along_axis(masks, order[:, :n1], True, axis=1)
    sums = masks.astype(float) @ pooled
    diffs = sums / n1 - (pooled.sum() - sums) / (total - n1)
    return diffs, math.comb(total, n1) <= RANDOMIZATION_EXACT_LIMIT


def smallest_p(paired_or_one_term: bool, sizes: list[int]) -> float:
    """The smallest p-value the exact randomization test can give with these numbers of seeds."""
    if paired_or_one_term:
        return 2.0 ** -min(sizes)
    return math.exp(-math.log(math.comb(sum(sizes), sizes[0])))  # huge counts: 0.0, not an overflow


def _bootstrap(effect: _Effect, columns: list[np.ndarray], d: np.ndarray | None) -> np.ndarray:
    # a fresh fixed-seed generator per effect: results do not depend on condition order
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    B = BOOTSTRAP_RESAMPLES
    if d is not None:
        return d[rng.integers(0, len(d), size=(B, len(d)))].mean(axis=1)
    draws = np.full(B, effect.const)
    for t, col in zip(effect.terms, columns):
        draws += t.coef * col[rng.integers(0, len(col), size=(B, len(col)))].mean(axis=1)
    return draws


def _seeds_needed(theta: float, spread_parts: list[float], level: float, one_sample: bool,
                  sizes: list[int]) -> int | None:
    """Seeds per arm for 80% power at `level` at the observed effect and spread (noncentral t), and
    at least as many as the exact test needs to reach `level` at all (zero spread: if every further
    seed agrees). None when the observed effect is 0 or more than MAX_SEEDS_SEARCHED would be needed."""
    if theta == 0 or not math.isfinite(theta):
        return None
    floor = next(k for k in range(2, MAX_SEEDS_SEARCHED + 1) if smallest_p(one_sample, [k] * len(sizes)) <= level)
    s2 = sum(spread_parts)
    if s2 <= 0:
        return floor

    def powered(n: int) -> bool:
        # Welch df with n per term: (n-1) (sum a)^2 / sum a^2; one term or paired: n - 1
        df = (n - 1.0) if one_sample else (n - 1.0) * s2 ** 2 / sum(a ** 2 for a in spread_parts)
        return stats.nct.sf(stats.t.ppf(1 - level, df), df, abs(theta) / math.sqrt(s2 / n)) >= POWER

    if not powered(MAX_SEEDS_SEARCHED):
        return None
    low, high = 1, MAX_SEEDS_SEARCHED  # power grows with n: bisect for the smallest powered n
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if powered(mid) else (mid, high)
    return max(high, floor)


def seeds_for_power(size: float, sd: float, level: float) -> int | None:
    """Seeds per arm for 80% power to detect a difference `size` between two arms whose per-seed
    values spread with standard deviation `sd` (Welch, equal spreads), at `level`."""
    return _seeds_needed(size, [sd ** 2, sd ** 2], level, False, [2, 2])


def _exact(effect: _Effect, columns: list[np.ndarray], by_seed: bool) -> _Stat:
    note = _lacking(effect, columns, 1, by_seed)
    if note:
        return _Stat(theta=None, note=note)
    ok = (lambda v: v > 0) if effect.strict else (lambda v: v >= 0)
    if not by_seed and len(columns) > 1:  # unpaired compare: judged on the means
        theta = effect.const + sum(t.coef * _mean(col) for t, col in zip(effect.terms, columns))
        return _Stat(theta, outcome="holds" if ok(theta) else "fails", note="judged on the means")
    d = effect.const + sum(t.coef * col for t, col in zip(effect.terms, columns))
    held = int(np.sum(ok(d)))
    outcome = "holds" if held == len(d) else "fails" if held == 0 else "undetermined"
    note = "" if outcome != "undetermined" else f"seeds disagree: holds on {held} of {len(d)} seeds"
    return _Stat(_mean(d), float(d.min()), float(d.max()), outcome=outcome, note=note)


def holm(p_values: list[float]) -> list[float]:
    """Holm step-down adjusted p-values: running max of (m - rank) * p over ascending p, capped at 1."""
    m = len(p_values)
    adjusted, running = [1.0] * m, 0.0
    for rank, i in enumerate(sorted(range(m), key=lambda i: (p_values[i], i))):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


# ---------------------------------------------------------------------------------- one condition
def _samples(runs: list[dict]) -> tuple[dict[tuple[str, str], dict[int, float]], list[str]]:
    """(arm, metric) -> {seed: value} from completed runs; plus notes on dropped values."""
    samples: dict[tuple[str, str], dict[int, float]] = {}
    dropped = []
    for run in runs:
        if run.get("status") != "completed":
            continue
        for metric, value in (run.get("metrics") or {}).items():
            value = float(value) if value is not None else math.nan
            if math.isfinite(value):
                samples.setdefault((run["arm"], metric), {})[run["seed"]] = value
            else:
                dropped.append(f"{run['arm']}.{metric} seed {run['seed']}")
    return samples, dropped


def _evaluate(list_name: str, index: int, c, samples, alpha: float, exact: bool,
              metrics: Mapping[str, Metric]) -> tuple[ConditionResult, list[_Stat]]:
    """One condition's result (outcome still open under interval evaluation) and its effects' stats."""
    terms = list(dict.fromkeys(condition_terms(c)))
    # paired tests (and exact trends, judged seed by seed) use the seeds every term has
    by_seed = getattr(c, "test", None) == "paired" or (exact and isinstance(c, Trend))
    per_term = {t: samples.get(t, {}) for t in terms}
    if by_seed:
        common = set.intersection(*(set(v) for v in per_term.values()))
        per_term = {t: {s: v[s] for s in common} for t, v in per_term.items()}
    columns = {t: np.array([v[s] for s in sorted(v)], dtype=float) for t, v in per_term.items()}
    bootstrap = c.interval == "bootstrap"
    pair_stats = []
    for effect in _effects(c):
        cols = [columns[(t.arm, t.metric)] for t in effect.terms]
        pair_stats.append(_exact(effect, cols, by_seed) if exact
                          else _interval(effect, cols, by_seed, alpha, bootstrap, metrics))
    known = [s for s in pair_stats if s.theta is not None]
    weakest = min(known, key=lambda s: s.theta) if known else _Stat(theta=None)
    notes = list(dict.fromkeys(s.note for s in pair_stats if s.note))
    if exact:
        outcomes = [s.outcome for s in pair_stats]
        outcome = ("fails" if "fails" in outcomes else "holds" if all(o == "holds" for o in outcomes)
                   else "undetermined")
        p_hold = p_fail = None
        test, reason = "exact", "evaluation: exact (a deterministic study): judged seed by seed, no statistics"
    else:
        outcome = "undetermined"  # settled after the Holm correction, across conditions
        p_hold = max(s.p_hold for s in pair_stats)
        p_fail = min(1.0, len(pair_stats) * min(s.p_fail for s in pair_stats))
        tests = list(dict.fromkeys(s.test for s in pair_stats if s.test))
        reasons = list(dict.fromkeys(s.test_reason for s in pair_stats if s.test_reason))
        test = " + ".join(tests) or ("paired t" if by_seed else "one-sample t" if isinstance(c, Threshold)
                                     else "welch t")
        reason = "; ".join(reasons)
    result = ConditionResult(
        list_name=list_name, index=index, kind=c.kind, description=_describe(c),
        estimate=weakest.theta, ci_low=weakest.ci_low, ci_high=weakest.ci_high, ci_level=weakest.ci_level,
        p_hold=p_hold, p_fail=p_fail, p_hold_adj=None, p_fail_adj=None, test=test,
        n={f"{a}.{m}": len(col) for (a, m), col in columns.items()},
        values={f"{a}.{m}": [float(v) for v in col] for (a, m), col in columns.items()},
        outcome=outcome, note="; ".join(notes), test_reason=reason)
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


# ---------------------------------------------------------------------------------- the verdict
def judge(contract, runs: list[dict], metrics: Mapping[str, Metric] | None = None) -> Verdict:
    """A contract's verdict on its runs: its decision with its controls, and for a sequential contract
    look by look (gates.sequential). Every caller (a run, verify, rederive) goes through here."""
    if getattr(contract, "sequential", None) is not None:
        from gates.sequential import judge_sequential

        return judge_sequential(contract, runs, metrics)
    return decide(contract.decision, runs, metrics, controls=contract.controls)


def decide(decision: Decision, runs: list[dict], metrics: Mapping[str, Metric] | None = None, *,
           alpha: float | None = None, controls=()) -> Verdict:
    """The verdict the decision rules give on these runs (plain dicts, as stored in evidence.json).

    `metrics` is the study's metric declarations (ranges show values at a bound); without it no
    value counts as being at a bound. `alpha` replaces the decision's (a sequential look spends part
    of it). `controls` must all hold, in their own Holm family at the same alpha, else the verdict is
    invalid. A completed run recorded with `converged: false` leaves every decision condition that
    reads its arm undetermined."""
    metrics = metrics or {}
    alpha = decision.alpha if alpha is None else alpha
    exact = decision.evaluation == "exact"
    samples, dropped = _samples(runs)
    listed = decision.conditions()
    level = alpha / len(listed)  # Holm's strictest step, for planning seeds
    evaluated = [_evaluate(name, i, c, samples, alpha, exact, metrics) for name, i, c in listed]
    results = [r for r, _ in evaluated]
    if not exact:
        _apply_holm(results, alpha)
        for (r, pair_stats), (_, _, c) in zip(evaluated, listed):
            if r.outcome == "undetermined":
                r.seeds_needed = (_trend_seeds_needed(pair_stats, level) if isinstance(c, Trend)
                                  else pair_stats[0].needed(level))

    under_test = arms_under_test(decision)
    halts = [{"arm": r["arm"], "seed": r["seed"], "reason": r.get("halt_reason")}
             for r in runs if r.get("status") == "halted"]
    futile = [h for h in halts if h["arm"] in under_test and _is_futility(h["reason"])]
    checked = _evaluate_controls(controls, samples, alpha, exact, metrics)
    read = [t for _, _, c in listed for t in condition_terms(c)] + [t for c in controls for t in condition_terms(c)]
    lost = _lost_values(read, runs, samples)
    for r, c in zip(results + checked, [c for _, _, c in listed] + list(controls)):
        missing = [x for x in lost if (x["arm"], x["metric"]) in condition_terms(c)]
        if r.list_name in ("supported_if", "controls") and missing and r.outcome == "holds":
            r.outcome = "undetermined"
            r.note = _join(r.note, "cannot hold while runs it reads are lost: "
                                   + ", ".join(f"{x['arm']}.{x['metric']} seed {x['seed']} ({x['why']})"
                                               for x in missing))
    unconverged = _unconverged(runs)
    stalled: dict[str, dict[str, list[int]]] = {}  # condition label -> arm -> seeds still improving
    for r, (_, _, c) in zip(results, listed):
        still = {a: unconverged[a] for a, _ in condition_terms(c) if a in unconverged}
        if still:
            stalled[r.label] = still
            r.outcome = "undetermined"
            r.note = _join(r.note, "still improving at the end of training: "
                                   + "; ".join(f"{a} seed{'s' if len(v) > 1 else ''} {', '.join(map(str, v))}"
                                               for a, v in still.items()) + "; needs more steps")

    supported = [r for r in results if r.list_name == "supported_if"]
    refuted = [r for r in results if r.list_name == "refuted_if"]
    reasons: list[str] = []
    broken = [r for r in checked if r.outcome != "holds"]
    if broken:
        verdict = "invalid"
        reasons += [f"{r.label} ({r.control} control) {'fails' if r.outcome == 'fails' else 'cannot be settled'}: "
                    f"{_line(r)}" for r in broken]
        reasons.append("a control that does not hold means the setup cannot be trusted to show the effect or its "
                       "absence: the claim is neither supported nor refuted")
    elif (any(r.outcome == "holds" for r in refuted) or any(r.outcome == "fails" for r in supported)
            or futile):
        verdict = "refuted"
        reasons += [f"{r.label} holds: {_line(r)}" for r in refuted if r.outcome == "holds"]
        reasons += [f"{r.label} fails: {_line(r)}" for r in supported if r.outcome == "fails"]
        reasons += [f"arm {h['arm']} seed {h['seed']} was halted for futility (an arm under test was hopeless)"
                    for h in futile]
    elif all(r.outcome == "holds" for r in supported):
        verdict = "supported"
        reasons += [f"{r.label} holds: {_line(r)}" for r in supported]
        reasons.append("no refuted_if condition holds")
    else:
        verdict = "inconclusive"
        reasons.append("not every supported_if condition holds, and nothing refutes the claim")
        reasons += [f"{r.label} holds: {_line(r)}" for r in supported if r.outcome == "holds"]
        reasons += [f"{r.label} undetermined: {_line(r)}" for r in results if r.outcome == "undetermined"]
    lost_runs = [r for r in runs if r["arm"] in {a for _, _, c in listed for a, _ in condition_terms(c)}
                 and r.get("status") in ("failed", "killed", "halted")]
    reasons += [f"arm {r['arm']} seed {r['seed']} did not complete ({r.get('status')}"
                f"{': ' + str(r['halt_reason']) if r.get('halt_reason') else ''}); its values are missing"
                for r in lost_runs if not (r["arm"] in under_test and _is_futility(r.get("halt_reason")))]
    if dropped:
        reasons.append("non-finite values dropped: " + ", ".join(dropped))
    settle = ([_settle_line(r, stalled.get(r.label)) for r in results if r.outcome == "undetermined"]
              if verdict == "inconclusive"
              else [_settle_line(r) for r in broken if r.outcome == "undetermined"] if verdict == "invalid" else [])
    return Verdict(verdict=verdict, reasons=reasons, conditions=results, alpha=alpha,
                   evaluation=decision.evaluation, correction="none" if exact else "holm",
                   settle=settle, halts=halts, lost=lost, controls=checked)


def _evaluate_controls(controls, samples, alpha: float, exact: bool, metrics) -> list[ConditionResult]:
    """Each control as a condition that must hold; Holm within the controls' own family."""
    out = []
    for i, c in enumerate(controls):
        result, _ = _evaluate("controls", i, c, samples, alpha, exact, metrics)
        result.control = c.control
        out.append(result)
    if out and not exact:
        _apply_holm(out, alpha)
    return out


def _unconverged(runs: list[dict]) -> dict[str, list[int]]:
    """arm -> seeds of completed runs recorded as still improving at their end."""
    still: dict[str, list[int]] = {}
    for r in runs:
        if r.get("status") == "completed" and r.get("converged") is False:
            still.setdefault(r["arm"], []).append(r["seed"])
    return still


def _lost_values(read: list[tuple[str, str]], runs: list[dict], samples) -> list[dict]:
    """Every (arm, metric, seed) among `read` that the runs do not give a finite value for: the
    seeds are those any run was recorded with."""
    seeds = sorted({r["seed"] for r in runs})
    by_key = {(r["arm"], r["seed"]): r for r in runs}
    lost = []
    for arm, metric in dict.fromkeys(read):
        for seed in seeds:
            if seed in samples.get((arm, metric), {}):
                continue
            run = by_key.get((arm, seed))
            if run is None:
                why = "no run recorded"
            elif run.get("status") != "completed":
                why = run.get("status") + (f": {run['halt_reason']}" if run.get("halt_reason") else "")
            else:
                why = "no finite value"
            lost.append({"arm": arm, "metric": metric, "seed": seed, "why": why})
    return lost


def _apply_holm(results: list[ConditionResult], alpha: float) -> None:
    """Holm over every condition, once for p_hold and once for p_fail; then each outcome."""
    hold_adj, fail_adj = holm([r.p_hold for r in results]), holm([r.p_fail for r in results])
    for r, h, f in zip(results, hold_adj, fail_adj):
        r.p_hold_adj, r.p_fail_adj = h, f
        r.outcome = "holds" if h <= alpha else "fails" if f <= alpha else "undetermined"
        raw = min(r.p_hold, r.p_fail)
        if r.outcome == "undetermined" and raw <= alpha:
            r.note = _join(r.note, f"significant alone, p = {raw:.3g}, but not after Holm "
                                   f"across {len(results)} conditions")


def _is_futility(halt_reason) -> bool:
    return str(halt_reason or "").startswith("futility")


# ---------------------------------------------------------------------------------- wording
def _join(a: str, b: str) -> str:
    return f"{a}; {b}" if a else b


def _num(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.4g}"


def _line(r: ConditionResult) -> str:
    """One plain line: the condition, its estimate, its interval and p-values, and any note."""
    parts = [r.description, f"estimate {_num(r.estimate)}"]
    if r.ci_level is not None and r.ci_low is not None:
        parts.append(f"{r.ci_level:.0%} CI [{_num(r.ci_low)}, {_num(r.ci_high)}]")
    elif r.ci_low is not None:  # exact evaluation, or an exact randomization test
        parts.append(f"per-seed range [{_num(r.ci_low)}, {_num(r.ci_high)}]")
    if r.p_hold_adj is not None:
        parts.append(f"{r.test}, Holm p(hold) {r.p_hold_adj:.3g}, p(fail) {r.p_fail_adj:.3g}")
    return ", ".join(parts) + (f" ({r.note})" if r.note else "")


def _settle_line(r: ConditionResult, still: dict[str, list[int]] | None = None) -> str:
    head = f"{r.label} {r.description}"
    if still:  # arms it reads were still improving when training stopped (`convergence`)
        arms = ", ".join(still)
        runs = "; ".join(f"{a} seed{'s' if len(v) > 1 else ''} {', '.join(map(str, v))}" for a, v in still.items())
        return (f"{head}: more steps for arm{'s' if len(still) > 1 else ''} {arms} (still improving at the end of "
                f"training: {runs}); a new version of the contract with a longer budget")
    if any(n < (1 if r.test == "exact" else 2) for n in r.n.values()):
        need = 1 if r.test == "exact" else 2
        short = ", ".join(f"{k} has {n}" for k, n in r.n.items() if n < need)
        return f"{head}: needs completed seeds ({short}; at least {need} each)"
    if r.test == "exact":
        return f"{head}: {r.note}; a deterministic study should agree across seeds - check its determinism"
    if r.seeds_needed is not None:
        which = "hold" if r.estimate > 0 else "fail"
        current = max(r.n.values())
        return (f"{head}: about {r.seeds_needed} seeds per arm for 80% power at the strictest Holm level "
                f"(it would {which}; an estimate from the observed effect and spread, now {current} seeds)")
    if r.estimate == 0:
        return f"{head}: the observed effect is 0; more seeds alone are unlikely to settle it"
    return (f"{head}: more than {MAX_SEEDS_SEARCHED} seeds per arm at the observed spread; "
            f"the effect is too small against the seed-to-seed spread to settle")


# ---------------------------------------------------------------------------------- preflight
# Can this contract reach a verdict at all? Under Holm, the supported_if conditions that must hold
# together take the first ranks, so the j-th smallest p among them is multiplied by m - j + 1; a
# condition tested exactly cannot go below the smallest p its seeds can give.
def _sign_flip_shape(c) -> bool:
    return isinstance(c, Threshold) or getattr(c, "test", None) == "paired"


def _p_floor(c, n_seeds: int, exact_everywhere: bool) -> float:
    if c.interval == "t" and not exact_everywhere:
        return 0.0  # a t-test can give any p (where its assumption holds)
    one = _sign_flip_shape(c)
    return smallest_p(one, [n_seeds] * (1 if one else 2))


def _holm_offenders(floors: list[float], m: int, alpha: float) -> list[tuple[int, float, int]]:
    """(index, floor, multiplier) of the conditions that could not all hold together, best case."""
    order = sorted(range(len(floors)), key=lambda i: floors[i])
    return [(i, floors[i], m - rank) for rank, i in enumerate(order) if (m - rank) * floors[i] > alpha]


def _unreachable_at(decision: Decision, n_seeds: int, exact_everywhere: bool) -> list[tuple[str, int, float, int]]:
    listed = decision.conditions()
    m, out = len(listed), []
    for name in ("supported_if", "refuted_if"):
        conds = [(i, c) for lname, i, c in listed if lname == name]
        floors = [_p_floor(c, n_seeds, exact_everywhere) for _, c in conds]
        if name == "supported_if":  # all must hold together
            out += [(name, conds[k][0], q, mult) for k, q, mult in _holm_offenders(floors, m, decision.alpha)]
        else:  # any one suffices; the others may rank ahead of it
            out += [(name, i, q, m - len(conds) + 1) for (i, _), q in zip(conds, floors)
                    if (m - len(conds) + 1) * q > decision.alpha]
    return out


def _seeds_to_reach(decision: Decision, exact_everywhere: bool, start: int) -> int | None:
    for n in range(start, 65):
        if not _unreachable_at(decision, n, exact_everywhere):
            return n
    return None


def supportable(decision: Decision, n_seeds: int, alpha: float, exact_everywhere: bool) -> bool:
    """Whether every supported_if condition could hold together with `n_seeds` seeds at `alpha` (a
    sequential look's share), best case, with the exact test everywhere or only where declared."""
    at = decision.model_copy(update={"alpha": alpha})
    return not any(name == "supported_if" for name, *_ in _unreachable_at(at, n_seeds, exact_everywhere))


def unreachable(decision: Decision, n_seeds: int) -> list[tuple[str, int, str]]:
    """(list, index, why) for each condition that can never hold at the decision's alpha with
    `n_seeds` seeds, because its test cannot give a small enough p-value after Holm."""
    m, out = len(decision.conditions()), []
    enough = _seeds_to_reach(decision, False, n_seeds)
    for name, i, q, mult in _unreachable_at(decision, n_seeds, False):
        out.append((name, i, f"with {n_seeds} seeds and {m} conditions under Holm, {name}[{i}] cannot hold at "
                             f"alpha {decision.alpha:g}: the smallest p its exact randomization test can give is "
                             f"{q:.3g}, {min(1.0, mult * q):.3g} after Holm; expected at least "
                             f"{enough or 'more than 64'} seeds, or the t-test (interval: t)"))
    return out


def exact_fallback_note(decision: Decision, n_seeds: int, metrics: Mapping[str, Metric]) -> str | None:
    """A warning for `gates check`: if the per-seed values tie or sit at a bound (likely for bounded or
    discrete metrics), the exact test takes over; could the claim still be supported then?"""
    if decision.evaluation != "interval":
        return None
    bounded = sorted({m for c in decision.supported_if for _, m in condition_terms(c)
                      if m in metrics and (metrics[m].low is not None or metrics[m].high is not None)})
    if not bounded or not any(name == "supported_if" for name, *_ in _unreachable_at(decision, n_seeds, True)):
        return None
    enough = _seeds_to_reach(decision, True, n_seeds)
    return (f"note: if the per-seed values of {', '.join(bounded)} tie or reach their bound, the exact "
            f"randomization test replaces the t-test, and with {n_seeds} seeds the supported_if conditions "
            f"could not all hold after Holm; {enough or 'more than 64'} seeds could")


# ---------------------------------------------------------------------------------- the gates, measured
def predictions(contract, runs: list[dict], first_signals: list[dict]) -> dict:
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
    m = len(contract.decision.supported_if) + len(contract.decision.refuted_if)
    power = (seeds_for_power(pa.size, pa.sd, contract.decision.alpha / m)
             if pa.sd is not None and pa.size > 0 else None)
    met = [bool(r.get("met")) for r in first_signals]
    return {
        "predicted_ablation": {"arm": pa.arm, "versus": pa.versus, "metric": pa.metric, "direction": pa.direction,
                               "predicted_size": pa.size, "measured_size": measured,
                               "came_true": None if measured is None else bool(measured >= pa.size),
                               "n": {pa.arm: len(a), pa.versus: len(b)}, "sd": pa.sd,
                               "seeds_for_80pct_power": power},
        "falsifiable_point": {"met_on": sum(met), "of": len(met), "came_true": bool(met) and all(met)},
    }
