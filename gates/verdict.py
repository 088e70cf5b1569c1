"""Verdicts: per-seed final metrics + a contract's decision -> supported, refuted or inconclusive.

`decide(decision, runs)` is pure and deterministic, because `gates verify` re-derives every verdict
from the recorded metrics and compares it with the one recorded. Choices, fixed here once:

* Only runs with status "completed" give values; non-finite values are dropped (and said so).
* Every condition reduces to effects theta = const + sum(coef * mean(term)), oriented so that
  theta > 0 means the condition holds. Threshold: one term. Compare: two terms, an absolute margin
  goes into const, a relative margin r into the other term's coefficient (-(1+r) or (1-r)).
  Trend: one Compare-like effect per consecutive pair, margin 0.
* Tests are one-sided t tests: p_hold = t.sf(theta/se, df), p_fail = t.cdf(theta/se, df).
  welch: se^2 = sum(coef^2 var/n), Welch-Satterthwaite df (one term: the one-sample t).
  paired: seeds present in every term of the condition, d_i = per-seed theta, one-sample t on d.
  `interval: bootstrap`: 10,000 resamples (numpy default_rng, fixed seed) of each term (welch) or
  of d (paired); p_hold = share of theta* <= 0, p_fail = share of theta* >= 0, floored at 1/(B+1).
* Zero spread (every value of every term equal, compared exactly so that float noise in a mean
  cannot fake a spread) is decided by the sign of theta: the inequalities are inclusive, so
  theta == 0 holds -- except for trend pairs, which are strict ("a > b > c") and fail on a tie.
* A trend holds iff every pair holds (intersection-union: p_hold = max pair p_hold) and fails iff
  some pair fails (p_fail = min(1, pairs * min pair p_fail), Bonferroni within the trend); its
  estimate and interval are those of the weakest pair.
* Intervals are two-sided at level 1 - 2 alpha, so each end is a one-sided alpha bound.
* Holm across all conditions of the decision (supported_if and refuted_if together), separately for
  the p_hold family and the p_fail family; each condition compares with its own alpha.
* A term with < 2 values leaves its effect undetermined (p = 1 both ways).
* seeds_needed: smallest n in 2..1000 per arm with |theta| / (s_eff / sqrt(n)) > t.ppf(1 - alpha, df)
  at the observed effect and spread, before the Holm correction (a planning figure, not a promise).
* evaluation "exact" (deterministic studies): no statistics. Per-seed effects (threshold, paired
  compare, trend pairs on the seeds every item has) hold iff they hold on every seed and fail iff
  they fail on every seed; an unpaired compare is judged on the means.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np
from scipy import stats

from gates.contract import Compare, Decision, Threshold, Trend, condition_terms

BOOTSTRAP_RESAMPLES = 10_000
BOOTSTRAP_SEED = 20240601
MAX_SEEDS_SEARCHED = 1000


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

    @property
    def label(self) -> str:
        return f"{self.list_name}[{self.index}]"

    def to_dict(self) -> dict:
        return json_safe(asdict(self))


@dataclass
class Verdict:
    verdict: str  # "supported" | "refuted" | "inconclusive"
    reasons: list[str]
    conditions: list[ConditionResult]
    alpha: float
    evaluation: str
    correction: str
    settle: list[str] = field(default_factory=list)
    halts: list[dict] = field(default_factory=list)

    def signature(self) -> str:
        """The statistical settings the verdict was reached under, compact, for comparing records."""
        tests = ",".join(sorted({c.test for c in self.conditions}))
        boot = f"|bootstrap={BOOTSTRAP_RESAMPLES}@{BOOTSTRAP_SEED}" if "bootstrap" in tests else ""
        return (f"alpha={self.alpha:g}|eval={self.evaluation}|correction={self.correction}"
                f"{boot}|tests={tests}")

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
    seeds_needed: int | None = None
    outcome: str = "undetermined"  # exact evaluation only
    note: str = ""


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


def _interval(effect: _Effect, columns: list[np.ndarray], paired: bool, alpha: float,
              bootstrap: bool) -> _Stat:
    note = _lacking(effect, columns, 2, paired)
    if note:
        return _Stat(theta=None, note=note)
    if paired:  # columns are aligned on the same seeds
        d = effect.const + sum(t.coef * col for t, col in zip(effect.terms, columns))
        theta, n = _mean(d), len(d)
        spread_parts, se = [_var(d)], math.sqrt(_var(d) / n)
        df = n - 1.0
    else:
        theta = effect.const + sum(t.coef * _mean(col) for t, col in zip(effect.terms, columns))
        spread_parts = [t.coef ** 2 * _var(col) for t, col in zip(effect.terms, columns)]
        parts = [s / len(col) for s, col in zip(spread_parts, columns)]
        se = math.sqrt(sum(parts))
        # Welch-Satterthwaite; undefined (and unused) at zero spread
        df = (sum(parts) ** 2 / sum(p ** 2 / (len(col) - 1) for p, col in zip(parts, columns))
              if se else None)
    if se == 0:
        holds = theta > 0 or (theta == 0 and not effect.strict)
        return _Stat(theta, theta, theta, p_hold=0.0 if holds else 1.0, p_fail=1.0 if holds else 0.0,
                     note="no spread across seeds: decided by the sign of the estimate")
    if bootstrap:
        draws = _bootstrap(effect, columns, d if paired else None)
        floor = 1.0 / (BOOTSTRAP_RESAMPLES + 1)
        p_hold, p_fail = max(float(np.mean(draws <= 0)), floor), max(float(np.mean(draws >= 0)), floor)
        low, high = (float(q) for q in np.quantile(draws, [alpha, 1 - alpha]))
    else:
        t_obs = theta / se
        p_hold, p_fail = float(stats.t.sf(t_obs, df)), float(stats.t.cdf(t_obs, df))
        half = float(stats.t.ppf(1 - alpha, df)) * se
        low, high = theta - half, theta + half
    return _Stat(theta, low, high, p_hold, p_fail, _seeds_needed(theta, spread_parts, alpha, paired))


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


def _seeds_needed(theta: float, spread_parts: list[float], alpha: float, paired: bool) -> int | None:
    """Seeds per arm at which the observed effect would be significant at the observed spread."""
    s2 = sum(spread_parts)
    if theta == 0 or not math.isfinite(theta) or s2 <= 0:
        return None
    n = np.arange(2, MAX_SEEDS_SEARCHED + 1)
    # Welch df with n per term: (n-1) (sum a)^2 / sum a^2; one term or paired: n - 1
    df = (n - 1.0) if paired else (n - 1.0) * s2 ** 2 / sum(a ** 2 for a in spread_parts)
    ok = abs(theta) / np.sqrt(s2 / n) > stats.t.ppf(1 - alpha, df)
    return int(n[np.argmax(ok)]) if ok.any() else None


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


def _evaluate(list_name: str, index: int, c, samples, alpha: float,
              exact: bool) -> tuple[ConditionResult, list[_Stat]]:
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
                          else _interval(effect, cols, by_seed, alpha, bootstrap))
    known = [s for s in pair_stats if s.theta is not None]
    weakest = min(known, key=lambda s: s.theta) if known else _Stat(theta=None)
    notes = list(dict.fromkeys(s.note for s in pair_stats if s.note))
    if exact:
        outcomes = [s.outcome for s in pair_stats]
        outcome = ("fails" if "fails" in outcomes else "holds" if all(o == "holds" for o in outcomes)
                   else "undetermined")
        p_hold = p_fail = None
        test, level = "exact", None
    else:
        outcome = "undetermined"  # settled after the Holm correction, across conditions
        p_hold = max(s.p_hold for s in pair_stats)
        p_fail = min(1.0, len(pair_stats) * min(s.p_fail for s in pair_stats))
        test = ("bootstrap percentile" if bootstrap else "paired t" if by_seed
                else "one-sample t" if isinstance(c, Threshold) else "welch t")
        level = 1 - 2 * alpha
    result = ConditionResult(
        list_name=list_name, index=index, kind=c.kind, description=_describe(c),
        estimate=weakest.theta, ci_low=weakest.ci_low, ci_high=weakest.ci_high, ci_level=level,
        p_hold=p_hold, p_fail=p_fail, p_hold_adj=None, p_fail_adj=None, test=test,
        n={f"{a}.{m}": len(col) for (a, m), col in columns.items()},
        values={f"{a}.{m}": [float(v) for v in col] for (a, m), col in columns.items()},
        outcome=outcome, note="; ".join(notes))
    return result, pair_stats


def _trend_seeds_needed(stats_: list[_Stat]) -> int | None:
    # all pairs must hold for the trend to hold; one failing pair is enough for it to fail
    if any(s.theta is None for s in stats_):
        return None
    weakest = min(stats_, key=lambda s: s.theta)
    if weakest.theta <= 0:
        return weakest.seeds_needed
    needed = [s.seeds_needed for s in stats_ if s.p_hold > 0]
    return None if any(n is None for n in needed) else max(needed, default=None)


# ---------------------------------------------------------------------------------- the verdict
def decide(decision: Decision, runs: list[dict]) -> Verdict:
    """The verdict the decision rules give on these runs (plain dicts, as stored in evidence.json)."""
    exact = decision.evaluation == "exact"
    samples, dropped = _samples(runs)
    listed = ([("supported_if", i, c) for i, c in enumerate(decision.supported_if)]
              + [("refuted_if", i, c) for i, c in enumerate(decision.refuted_if)])
    alphas = [c.alpha or decision.alpha for _, _, c in listed]
    evaluated = [_evaluate(name, i, c, samples, a, exact) for (name, i, c), a in zip(listed, alphas)]
    results = [r for r, _ in evaluated]
    if not exact:
        _apply_holm(results, alphas)
        for (r, pair_stats), (_, _, c) in zip(evaluated, listed):
            if r.outcome == "undetermined":
                r.seeds_needed = (_trend_seeds_needed(pair_stats) if isinstance(c, Trend)
                                  else pair_stats[0].seeds_needed)

    named = {arm for _, _, c in listed for arm, _ in condition_terms(c)}
    halts = [{"arm": r["arm"], "seed": r["seed"], "reason": r.get("halt_reason")}
             for r in runs if r.get("status") == "halted"]
    futile = [h for h in halts if h["arm"] in named and _is_futility(h["reason"])]
    lost = [r for r in runs if r["arm"] in named and r.get("status") in ("failed", "killed", "halted")
            and not (r.get("status") == "halted" and _is_futility(r.get("halt_reason")))]

    supported = [r for r in results if r.list_name == "supported_if"]
    refuted = [r for r in results if r.list_name == "refuted_if"]
    reasons: list[str] = []
    if (any(r.outcome == "holds" for r in refuted) or any(r.outcome == "fails" for r in supported)
            or futile):
        verdict = "refuted"
        reasons += [f"{r.label} holds: {_line(r)}" for r in refuted if r.outcome == "holds"]
        reasons += [f"{r.label} fails: {_line(r)}" for r in supported if r.outcome == "fails"]
        reasons += [f"arm {h['arm']} seed {h['seed']} was halted for futility (a named arm was hopeless)"
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
    reasons += [f"arm {r['arm']} seed {r['seed']} did not complete ({r.get('status')}"
                f"{': ' + str(r['halt_reason']) if r.get('halt_reason') else ''}); its values are missing"
                for r in lost]
    if dropped:
        reasons.append("non-finite values dropped: " + ", ".join(dropped))
    settle = ([_settle_line(r) for r in results if r.outcome == "undetermined"]
              if verdict == "inconclusive" else [])
    return Verdict(verdict=verdict, reasons=reasons, conditions=results, alpha=decision.alpha,
                   evaluation=decision.evaluation, correction="none" if exact else "holm",
                   settle=settle, halts=halts)


def _apply_holm(results: list[ConditionResult], alphas: list[float]) -> None:
    """Holm over every condition, once for p_hold and once for p_fail; then each outcome."""
    hold_adj, fail_adj = holm([r.p_hold for r in results]), holm([r.p_fail for r in results])
    for r, alpha, h, f in zip(results, alphas, hold_adj, fail_adj):
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
    elif r.test == "exact" and r.ci_low is not None:
        parts.append(f"per-seed range [{_num(r.ci_low)}, {_num(r.ci_high)}]")
    if r.p_hold_adj is not None:
        parts.append(f"{r.test}, Holm p(hold) {r.p_hold_adj:.3g}, p(fail) {r.p_fail_adj:.3g}")
    return ", ".join(parts) + (f" ({r.note})" if r.note else "")


def _settle_line(r: ConditionResult) -> str:
    head = f"{r.label} {r.description}"
    if any(n < (1 if r.test == "exact" else 2) for n in r.n.values()):
        need = 1 if r.test == "exact" else 2
        short = ", ".join(f"{k} has {n}" for k, n in r.n.items() if n < need)
        return f"{head}: needs completed seeds ({short}; at least {need} each)"
    if r.test == "exact":
        return f"{head}: {r.note}; a deterministic study should agree across seeds - check its determinism"
    if r.seeds_needed is not None:
        which = "hold" if r.estimate > 0 else "fail"
        current = max(r.n.values())
        if r.seeds_needed <= current:
            return (f"{head}: significant alone at {current} seeds but not after the Holm correction;"
                    f" a few more seeds per arm would settle it (it would {which})")
        return f"{head}: about {r.seeds_needed} seeds per arm at the observed spread (it would {which})"
    if r.estimate == 0:
        return f"{head}: the observed effect is 0; more seeds alone are unlikely to settle it"
    return (f"{head}: more than {MAX_SEEDS_SEARCHED} seeds per arm at the observed spread; "
            f"the effect is too small against the seed-to-seed spread to settle")
