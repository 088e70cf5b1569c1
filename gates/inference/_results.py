"""A verdict as evidence.json records it: the `Verdict`, its conditions and controls as judged
(`ConditionRecord`s, the entity evidence.json is read back as), with the signature of the settings
it was reached under, the engine's version (`ENGINE_VERSION`), `json_safe` for what JSON cannot
hold, and the verdict's wording (its reason and settle lines).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

import numpy as np

from gates.contract import MIN_VERDICT_SEEDS
from gates.entities import ConditionRecord
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
@dataclass
class Verdict:
    verdict: str  # "supported" | "refuted" | "inconclusive" | "invalid"
    reasons: list[str]
    conditions: list[ConditionRecord]
    alpha: float
    evaluation: str
    correction: str
    settle: list[str] = field(default_factory=list)
    halts: list[dict] = field(default_factory=list)
    lost: list[dict] = field(
        default_factory=list
    )  # (arm, metric, seed, why) a condition reads but lacks
    engine_version: str = ENGINE_VERSION
    controls: list[ConditionRecord] = field(default_factory=list)
    looks: list[dict] = field(
        default_factory=list
    )  # a sequential contract's looks (gates.inference._sequential)
    not_run: list[dict] = field(default_factory=list)  # arms read without a completed run (invalid)
    beyond_ceiling: list[dict] = field(
        default_factory=list
    )  # conditions whose bar the best arm cannot reach
    tuning_edges: dict[str, str] = field(
        default_factory=dict
    )  # tuned arm -> why its search stopped at an edge

    def signature(self) -> str:
        """The statistical settings the verdict was reached under, compact, for comparing records."""
        tests = ",".join(sorted({c.test for c in self.conditions}))
        boot = (
            f"|bootstrap={BOOTSTRAP_RESAMPLES}@{BOOTSTRAP_SEED}"
            if any("bootstrap" in c.test_reason for c in self.conditions)
            else ""
        )
        return (
            f"engine={self.engine_version}|alpha={self.alpha:g}|eval={self.evaluation}"
            f"|correction={self.correction}{boot}|tests={tests}"
        )

    def to_dict(self) -> dict:
        """The verdict as JSON data: each condition as its record writes it (`as_dict`)."""
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data["conditions"] = [c.as_dict() for c in self.conditions]
        data["controls"] = [c.as_dict() for c in self.controls]
        return json_safe(data)


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
