"""A verdict as the engine words it: the engine's version (`ENGINE_VERSION`), the signature of the
settings a verdict was reached under (`verdict_signature`), and its reason and settle lines. The
verdict itself and its conditions are entities (gates.entities: `Verdict`, `ConditionRecord`).
"""

from __future__ import annotations

from gates.contract import MIN_VERDICT_SEEDS
from gates.entities import ConditionRecord, Verdict
from gates.inference._statistics import BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED, MAX_SEEDS_SEARCHED

# Bumped whenever a change can change a recorded verdict; the claims index records it.
# 3: intersection-union for supported_if and controls, log scale, sign test, arms not run as designed,
#    ceilings, tuning edges, lost seeds of a look
# 4: the estimand is declared (or given by the metrics' declarations), never chosen by the data: no
#    switch to the sign or permutation test on ties or bounds; a bounded metric's mean by the
#    bounded-mean betting test; the median by the sign test; a share of seeds by the binomial test
# 5: claim families: a version is judged at the alpha the versions before it left (its controls at its
#    own), and an inconclusive verdict says what its family leaves a re-try
# 6: two completed seeds never reach a verdict: an effect needs 3 values of each term
ENGINE_VERSION = "6"


# ---------------------------------------------------------------------------------- results
def verdict_signature(verdict: Verdict) -> str:
    """The statistical settings a verdict was reached under, compact, for comparing records."""
    tests = ",".join(sorted({c.test for c in verdict.conditions}))
    boot = (
        f"|bootstrap={BOOTSTRAP_RESAMPLES}@{BOOTSTRAP_SEED}"
        if any("bootstrap" in c.test_reason for c in verdict.conditions)
        else ""
    )
    return (
        f"engine={verdict.engine_version}|alpha={verdict.alpha:g}|eval={verdict.evaluation}"
        f"|correction={verdict.correction}{boot}|tests={tests}"
    )


# ---------------------------------------------------------------------------------- wording
def _join(a: str, b: str) -> str:
    return f"{a}; {b}" if a else b


def _num(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.4g}"


def _line(r: ConditionRecord) -> str:
    """One plain line: the condition, its estimate, its interval and p-values, and any note."""
    parts = [
        r.description,
        f"estimate {_num(r.estimate)}" + (" (log scale)" if r.scale == "log" else ""),
    ]
    if r.ci_level is not None and r.ci_low is not None:
        parts.append(f"{r.ci_level:.0%} CI [{_num(r.ci_low)}, {_num(r.ci_high)}]")
    elif r.ci_low is not None:  # exact evaluation, or an exact test
        parts.append(f"per-seed range [{_num(r.ci_low)}, {_num(r.ci_high)}]")
    if r.p_hold_adj is not None:
        parts.append(f"{r.test}, p(hold) {r.p_hold_adj:.3g}, p(fail) {r.p_fail_adj:.3g}")
    return ", ".join(parts) + (f" ({r.note})" if r.note else "")


def _settle_line(r: ConditionRecord, withheld: dict | None = None) -> str:
    head = f"{r.label} {r.description}"
    still, at_edge = (withheld or {}).get("still"), (withheld or {}).get("edges")
    if still:  # arms it reads were still improving when training stopped (`convergence`)
        arms = ", ".join(still)
        runs = "; ".join(
            f"{a} seed{'s' if len(v) > 1 else ''} {', '.join(map(str, v))}"
            for a, v in still.items()
        )
        return (
            f"{head}: more steps for arm{'s' if len(still) > 1 else ''} {arms} (still improving at the end of "
            f"training: {runs}); a new version of the contract with a longer budget"
        )
    if at_edge:
        return (
            f"{head}: a new version whose tuning searches beyond the edge its best trial sits at "
            f"({'; '.join(at_edge)}), with the same budget for every arm"
        )
    need = 1 if r.test == "exact" else MIN_VERDICT_SEEDS
    if any(n < need for n in r.n.values()):
        short = ", ".join(f"{k} has {n}" for k, n in r.n.items() if n < need)
        return f"{head}: needs completed seeds ({short}; at least {need} each)"
    if r.test == "exact":
        return f"{head}: {r.note}; a deterministic study should agree across seeds - check its determinism"
    if r.seeds_needed is not None:
        which = "hold" if r.estimate > 0 else "fail"
        current = max(r.n.values())
        return (
            f"{head}: about {r.seeds_needed} seeds per arm for 80% power at the level it is tested at (it would "
            f"{which}; an estimate from the observed effect and spread, now {current} seeds)"
        )
    if r.estimate == 0:
        return f"{head}: the observed effect is 0; more seeds alone are unlikely to settle it"
    return (
        f"{head}: more than {MAX_SEEDS_SEARCHED} seeds per arm at the observed spread; "
        f"the effect is too small against the seed-to-seed spread to settle"
    )
