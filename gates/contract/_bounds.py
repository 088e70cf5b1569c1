"""What every section of a contract is held to: the strict, frozen base model (`Strict`), the bounds
on every number and list it declares (refused at load, before anything sizes a loop, a list or a run
by them), the fewest seeds a verdict needs (`MIN_VERDICT_SEEDS`), and its seeds (`Seeds`: distinct
integers in range, derived from a count); and `canonical_json`, the one form in which declared
values are compared and a contract is hashed.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

SLUG = r"^[a-z0-9][a-z0-9-]*$"
DEFAULT_ALPHA = 0.05


class Strict(BaseModel):
    # .nan and .inf are refused everywhere: a NaN threshold would make Holm return 1 for every other
    # condition, an infinite margin would make a condition hold or fail whatever the data
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


# ---------------------------------------------------------------------------------- bounds
# Every number and list a contract declares is bounded by what one machine can honour, so that
# validation (a pydantic error: the loader names file, line and field) refuses it before anything
# sizes a loop, a list or a run by it: an unbounded `budget.steps: 2**63 - 1` made `gates check` walk
# every step (issue #28). Each bound sits far above every contract registered so far.
MAX_STEPS = 100_000_000  # steps per arm x seed (and any step a rule names): at 1 ms a step, over a


# day per run; 25,000x the largest budget registered (4,000)
MAX_EVALUATIONS = 100_000  # evaluations per run (steps / eval_every): each one is a point kept in


# the run's history (memory, evidence, plots) and scanned by the stop rules; the most so far is 40
MAX_SEEDS = 1_000  # seeds of a contract or of its tuning, and seed counts (looks, failures): as far


# as the power search of gates.inference looks (MAX_SEEDS_SEARCHED); the most so far is 18
MAX_LOOKS = 20  # sequential looks: each re-judges the whole decision, and past a handful the alpha


# spent at each look is too small to stop early; the most so far is 3
MAX_TRIALS = 1_000  # tuning trials per tuned arm: each is a training run on every tuning seed, and


# the TPE sampler refits on all past trials at each one; the most so far is 4
# Fewer seeds than this never reach a verdict: at 2 seeds a t-test has one degree of freedom (its
# spread is a guess: one seed far off decides) and no exact test can reach 0.05 (its smallest p is
# 1/4). So an interval contract lists at least this many seeds, a sequential design looks first at
# this many, and the verdict judges no effect with fewer completed seeds of a term.
MIN_VERDICT_SEEDS = 3


MAX_ITEMS = 100  # items of any other list or mapping (arms, conditions, controls, rules, names,
# choices): what gates check and the verdict do per item (Holm over the conditions, pairs of a
# trend, an arm's preflight) stays instant; the most so far is 7


def _distinct(seeds: list[int]) -> list[int]:
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds must be distinct, got {seeds}")
    return seeds


# Exclusive. numpy's legacy seeding (np.random.seed) takes 0 <= seed < 2**32; the upper half of that,
# 2**31 and up, is `gates pilot`'s (PILOT_SEED_BASE): no contract or tuning seed is ever a pilot's.
MAX_SEED = 2**31


PILOT_SEED_BASE = MAX_SEED


def _seed_list(value):
    """`seeds: 5` (seeds 0-4), `seeds: {count: 5, start: 10}` (10-14), or a list (contiguous, or a recorded
    contract's): the platform derives the seeds from a count, so a hand-picked list cannot be registered."""
    if isinstance(value, bool):
        return value  # refused by the list's own validation
    if isinstance(value, int):
        if not 1 <= value <= MAX_SEEDS:  # before listing them: `seeds: 10**12` would fill memory
            raise ValueError(
                f"seeds: {value} is not a count from 1 to {MAX_SEEDS}; expected seeds: N (runs seeds "
                f"0..N-1)"
            )
        return list(range(value))
    if isinstance(value, dict):
        extra = set(value) - {"count", "start"}
        count, start = value.get("count"), value.get("start", 0)
        if (
            extra
            or not isinstance(count, int)
            or isinstance(count, bool)
            or not 1 <= count <= MAX_SEEDS
            or not isinstance(start, int)
            or isinstance(start, bool)
            # one error for the range, not one per seed past 2**31
            or not 0 <= start <= MAX_SEED - count
        ):
            raise ValueError(
                f"expected seeds: {{count: N, start: S}} with 1 <= N <= {MAX_SEEDS} and "
                f"0 <= S <= 2**31 - N (every seed below 2**31; pilots use those above), got {value}"
            )
        return list(range(start, start + count))
    if not isinstance(value, (list, tuple)):  # `seeds: '5'`, `seeds: 5.0`: none of the forms
        raise ValueError(
            "expected a count (seeds: 5 runs seeds 0..4), {count: N, start: S} or a list of distinct "
            "ints (seeds: [0, 1, 2])"
        )
    return value


def is_contiguous(seeds: list[int]) -> bool:
    """Seeds the platform could have derived from a count: start, start + 1, ..., in that order."""
    return list(seeds) == list(range(seeds[0], seeds[0] + len(seeds))) if seeds else True


def _seed_range(seed: int) -> int:
    if not 0 <= seed < MAX_SEED:
        raise ValueError(
            f"seed {seed} is outside 0 <= seed < 2**31; expected a seed every study can use (those "
            f"above are pilots')"
        )
    return seed


# a seed is an integer (never true, 1.0 or "1"), checked at load so a bad one is refused before any training
Seed = Annotated[int, Field(strict=True), AfterValidator(_seed_range)]


# a non-empty list is asked by each Field
Seeds = Annotated[list[Seed], Field(max_length=MAX_SEEDS), AfterValidator(_distinct)]


def canonical_json(data: Any) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
