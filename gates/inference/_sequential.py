"""Sequential seeds: decide after each look, spending the decision's alpha across the looks.

A contract with `sequential: {looks: [3, 6, 10], spending: obrien-fleming}` lists its maximum set
of seeds in `seeds` and is judged after the first 3 seeds, then after 6, then after all 10, stopping
at the first look whose verdict is decided (supported, refuted, or invalid by a control that fails;
a control not yet settled at an earlier look waits for more seeds). Undetermined at the last look is
inconclusive.

Alpha spending (Lan-DeMets). Look k sits at information fraction t_k = looks[k] / looks[-1]. A
spending function alpha(t) says how much of the decision's alpha may have been used by fraction t:

* O'Brien-Fleming type: alpha(t) = 2 * (1 - Phi(z_{1-alpha/2} / sqrt(t))): almost nothing early,
  nearly all of alpha at the last look (early stops need overwhelming evidence);
* Pocock type: alpha(t) = alpha * ln(1 + (e - 1) t): spread more evenly over the looks.

Both reach alpha at t = 1. Look k is judged by `verdict.decide` on the runs of the first looks[k]
seeds at alpha_k = alpha(t_k) - alpha(t_{k-1}), the part of alpha spent at that look, with the same
families as at a single look (each supported_if and each control at that level, the ways to refute
Holm-corrected at that level).

Why this holds the error rate: a false support needs some look to support falsely; the chance of
that is at most the sum over looks of the chance at each look (the union bound), and each look's is
at most its alpha_k, so in total at most alpha, whatever the correlation between looks (they share
seeds, so they are strongly correlated). It is conservative: the classic group-sequential boundaries
use that correlation to allow larger per-look levels; the union bound gives that away in exchange
for needing no assumption on the test statistics (exact randomization tests, Holm, controls and
halts all keep working unchanged). The same holds for refutation.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from scipy import special

from gates.entities import LookRecord, RunRecord, json_safe
from gates.inference import _verdict as v
from gates.study import Metric

DECIDED = ("supported", "refuted", "invalid")


def stops(result, last_look: bool) -> bool:
    """Whether a judged look ends the sequence: it supports or refutes, or it is invalid. At a look
    before the last, an invalid verdict stops only when a control fails, an arm did not run as designed
    or a bar lies beyond its ceiling; a control that cannot be settled yet (the look's share of alpha is
    small: 0.0003 at 3 of 10 seeds under O'Brien-Fleming) waits for the next look's seeds instead of
    ending a working experiment as invalid."""
    if result.verdict == "invalid" and not last_look:
        return (
            any(c.outcome == "fails" for c in result.controls)
            or bool(result.not_run)
            or bool(result.beyond_ceiling)
        )
    return result.verdict in DECIDED


# ---------------------------------------------------------------------------------- spending
def obrien_fleming(t: float, alpha: float) -> float:
    """Cumulative alpha spent by information fraction t (O'Brien-Fleming type)."""
    if t <= 0:
        return 0.0
    # the standard normal's cdf and quantile as scipy.stats.norm computes them (the same ufuncs, the
    # same floats), without importing scipy.stats (about a second, paid by `gates check` for nothing)
    return float(
        2.0 * (1.0 - special.ndtr(special.ndtri(1.0 - alpha / 2.0) / math.sqrt(min(t, 1.0))))
    )


def pocock(t: float, alpha: float) -> float:
    """Cumulative alpha spent by information fraction t (Pocock type)."""
    if t <= 0:
        return 0.0
    return float(alpha * math.log(1.0 + (math.e - 1.0) * min(t, 1.0)))


SPENDING = {"obrien-fleming": obrien_fleming, "pocock": pocock}


def spent(spending: str, looks: list[int], alpha: float) -> list[tuple[float, float]]:
    """Per look: (cumulative alpha spent, alpha spent at that look)."""
    f = SPENDING[spending]
    out, before = [], 0.0
    for n in looks:
        cum = alpha if n == looks[-1] else f(n / looks[-1], alpha)  # exactly alpha at the end
        out.append((cum, cum - before))
        before = cum
    return out


# ---------------------------------------------------------------------------------- judging
def _levels(seq, alpha: float) -> list[tuple[float, float]]:
    """(spent so far, spent at the look) for each look; none at all when the family left no alpha."""
    return spent(seq.spending, seq.looks, alpha) if alpha > 0 else [(0.0, 0.0)] * len(seq.looks)


def _look_runs(runs: list[RunRecord], seeds: list[int]) -> list[RunRecord]:
    keep = set(seeds)
    return [r for r in runs if r.seed in keep]


def judge_sequential(
    contract,
    runs: list[RunRecord],
    metrics: Mapping[str, Metric] | None = None,
    *,
    ceilings=None,
    edges=None,
    level: float | None = None,
):
    """The verdict of a sequential contract on its runs: its looks in order over the runs present,
    stopping at the first decided look; the Verdict of the look it stopped at, with `looks` filled.
    `level`: the alpha the looks spend in all (what the claim's family leaves; default the decision's).

    Look k > 0 is judged when any run of a seed it adds is present (the runner records whole looks;
    a partial look is judged with the missing runs lost, so it cannot support)."""
    seq, seeds = contract.sequential, list(contract.seeds)
    alpha = contract.decision.alpha if level is None else level
    present = {r.seed for r in runs}
    levels, setup = _levels(seq, alpha), _levels(seq, contract.decision.alpha)
    looks: list[LookRecord] = []
    result = None
    for k, n in enumerate(seq.looks):
        before = seq.looks[k - 1] if k else 0
        if k and not present & set(seeds[before:n]):
            break
        cum, at_look = levels[k]
        result = v.decide(
            contract.decision,
            _look_runs(runs, seeds[:n]),
            metrics,
            alpha=at_look,
            control_alpha=setup[k][1],
            controls=contract.controls,
            seeds=seeds[:n],
            ceilings=ceilings,
            edges=edges,
        )
        looks.append(
            LookRecord(
                look=k + 1,
                seeds=seeds[:n],
                alpha_spent=json_safe(cum),
                alpha_look=json_safe(at_look),
                verdict=result.verdict,
                outcomes={r.label: r.outcome for r in result.conditions + result.controls},
            )
        )
        if stops(result, k == len(seq.looks) - 1):
            break
    k = len(looks) - 1
    total = len(seq.looks)
    head = (
        f"sequential look {k + 1} of {total} ({len(looks[-1].seeds)} seeds, {seq.spending} spending): "
        f"judged at alpha {looks[-1].alpha_look:.3g} spent at this look, {looks[-1].alpha_spent:.3g} "
        f"of {alpha:g} spent so far"
    )
    result.reasons = [head] + result.reasons
    if result.verdict == "inconclusive" or not stops(result, k + 1 == total):
        if k + 1 < total:
            nxt = seq.looks[k + 1]
            result.settle = [
                f"continue to look {k + 2} ({nxt} seeds): `gates run` runs seeds "
                f"{seeds[seq.looks[k] : nxt]} and judges again"
            ] + result.settle
        else:
            result.settle = [
                f"every look was spent ({seq.looks[-1]} seeds, alpha {alpha:g}): more seeds are a new "
                f"version of the claim, with its own looks (the last line says on which seeds and at "
                f"which alpha; the estimates below say roughly how many)"
            ] + result.settle
    result.looks = looks
    return result


def next_look(
    contract,
    runs: list[RunRecord],
    metrics: Mapping[str, Metric] | None = None,
    *,
    ceilings=None,
    edges=None,
    level: float | None = None,
) -> list[int] | None:
    """The seeds to run next: those of the first look that some arm lacks a run for, once every
    earlier look was judged undetermined; None when a look decided or every look has run."""
    seq, seeds, arms = contract.sequential, list(contract.seeds), list(contract.arms)
    have = {(r.arm, r.seed) for r in runs}
    alpha = contract.decision.alpha if level is None else level
    levels, setup = _levels(seq, alpha), _levels(seq, contract.decision.alpha)
    for k, n in enumerate(seq.looks):
        lacking = [s for s in seeds[:n] if any((a, s) not in have for a in arms)]
        if lacking:
            return lacking
        result = v.decide(
            contract.decision,
            _look_runs(runs, seeds[:n]),
            metrics,
            alpha=levels[k][1],
            control_alpha=setup[k][1],
            controls=contract.controls,
            seeds=seeds[:n],
            ceilings=ceilings,
            edges=edges,
        )
        if stops(result, k == len(seq.looks) - 1):
            return None
    return None


def stopping_seeds(
    contract, runs: list[RunRecord], metrics: Mapping[str, Metric] | None = None, **inputs
) -> list[int]:
    """The seeds of the look the sequence stops at on these runs (what the evidence must hold); `inputs`:
    the ceilings and tuning edges (`gates.inference._judging.claim_inputs`)."""
    result = judge_sequential(contract, runs, metrics, **inputs)
    return list(result.looks[-1].seeds)
