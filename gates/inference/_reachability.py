"""Whether a contract can reach a verdict at all with its seeds, before any run (`gates check`, a
sequential look's share of alpha): the smallest p the test of each condition's estimand can give
(`supportable`, `unreachable`), and what each condition estimates, by which test (`estimand_notes`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from gates.contract import Decision
from gates.inference._effects import TESTS, _effects, _estimand, condition_estimand, condition_test
from gates.inference._statistics import MAX_SEEDS_SEARCHED, _bet_p, effect_range
from gates.study import Metric


# ---------------------------------------------------------------------------------- preflight
# Can this contract reach a verdict at all? Every supported_if condition is tested at alpha itself
# (intersection-union); a refuted_if condition, in the Holm family of the m ways to refute, needs at
# best m * p <= alpha. The tests of the median, of a share of seeds and of a bounded mean have a
# smallest p their seeds can give; the t-test has none.
def _p_at(c, n_seeds: int, metrics: Mapping[str, Metric], against: int = 0) -> float:
    """The p-value (to hold) of the condition's test with `n_seeds` seeds, all but `against` of them at
    the best value the condition can see and those at the worst: its smallest p with against = 0."""
    kind = condition_test(c, metrics)
    if kind == "t":
        return 0.0
    if kind in ("sign", "binomial"):
        # P(Binomial(n, q) >= n - against), summed exactly: scipy.stats would cost `gates check` a second
        share, n = (0.5 if kind == "sign" else c.share), n_seeds
        return math.fsum(
            math.comb(n, k) * share**k * (1 - share) ** (n - k) for k in range(n - against, n + 1)
        )
    worst = 0.0
    for effect in _effects(c, False):
        low, high = effect_range(effect, metrics)
        if not high > low:
            return 1.0
        x = np.ones(n_seeds)
        x[:against] = 0.0
        worst = max(worst, _bet_p(x, min(1.0, max(0.0, -low / (high - low)))))
    return worst


def _unreachable_at(
    decision: Decision, n_seeds: int, metrics: Mapping[str, Metric]
) -> list[tuple[str, int, float, float]]:
    """(list, index, the smallest p its test can give, the level it must reach) of each condition that
    cannot reach its level with `n_seeds` seeds."""
    m = len(decision.conditions())
    levels = {"supported_if": decision.alpha, "refuted_if": decision.alpha / m}
    return [
        (name, i, q, levels[name])
        for name, i, c in decision.conditions()
        if (q := _p_at(c, n_seeds, metrics)) > levels[name]
    ]


def _seeds_to_reach(decision: Decision, metrics: Mapping[str, Metric], start: int) -> int | None:
    for n in range(start, MAX_SEEDS_SEARCHED + 1):
        if not _unreachable_at(decision, n, metrics):
            return n
    return None


def supportable(
    decision: Decision, n_seeds: int, alpha: float, metrics: Mapping[str, Metric]
) -> bool:
    """Whether every supported_if condition could hold with `n_seeds` seeds at `alpha` (a sequential
    look's share), best case."""
    at = decision.model_copy(update={"alpha": alpha})
    return not any(name == "supported_if" for name, *_ in _unreachable_at(at, n_seeds, metrics))


def unreachable(
    decision: Decision, n_seeds: int, metrics: Mapping[str, Metric]
) -> list[tuple[str, int, str]]:
    """(list, index, why) for each condition that can never hold at the decision's alpha with
    `n_seeds` seeds, because the test of its estimand cannot give a small enough p-value."""
    out = []
    enough = _seeds_to_reach(decision, metrics, n_seeds)
    listed = {(name, i): c for name, i, c in decision.conditions()}
    for name, i, q, level in _unreachable_at(decision, n_seeds, metrics):
        how = (
            "each supported_if is tested at alpha"
            if name == "supported_if"
            else f"a refuted_if is in the Holm family of the {len(decision.conditions())} ways to refute"
        )
        test = TESTS[condition_test(listed[(name, i)], metrics)]
        why = (
            f"with {n_seeds} seeds, {name}[{i}] cannot hold at alpha {decision.alpha:g} ({how}): the smallest p "
            f"{test} can give is {q:.3g}, above {level:.3g}; expected at least "
            f"{enough or f'more than {MAX_SEEDS_SEARCHED}'} seeds"
        )
        out.append((name, i, why))
    return out


def estimand_notes(decision: Decision, n_seeds: int, metrics: Mapping[str, Metric]) -> list[str]:
    """For `gates check`: what each condition estimates and by which test (declared, or its metrics'
    default), and each supported_if that could hold only if every seed agrees."""
    if decision.evaluation != "interval":
        return []
    notes = []
    for name, i, c in decision.conditions():
        estimand, kind = condition_estimand(c, metrics), condition_test(c, metrics)
        by_seed = getattr(c, "test", None) == "paired" or kind != "t"
        how = "declared" if getattr(c, "estimand", None) else "its metrics' default"
        notes.append(
            f"note: {name}[{i}] estimates the {_estimand(c, estimand, by_seed)} ({how}), by "
            f"{TESTS[kind]}"
        )
        if name != "supported_if" or kind == "t" or _p_at(c, n_seeds, metrics) > decision.alpha:
            continue  # a condition that cannot hold at all is the `reachable` rule's error
        if _p_at(c, n_seeds, metrics, against=1) > decision.alpha:
            notes.append(
                f"note: {name}[{i}]: with {n_seeds} seeds it could hold only if every seed sits at the best "
                f"value it can see (one seed at the worst gives p "
                f"{_p_at(c, n_seeds, metrics, against=1):.3g} > alpha {decision.alpha:g})"
            )
    return notes
