"""Hypothesis contracts: what result would support or refute a claim, fixed before any step.

A contract is a YAML file validated into frozen pydantic models. Its identity is the sha256 of the
canonical JSON of what the file states (comments, key order and formatting do not change it).
Every validation error names the file, the line, the field path and what is expected.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from gates.contract._yaml import load_yaml
from gates.errors import UserError, UserErrors, did_you_mean
from gates.study import Direction, Study

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


# ---------------------------------------------------------------------------------- preflight
class ComputeCost(Strict):
    """Gate 1: how much more the arms cost than the baseline arm, declared before the run."""

    baseline_arm: str
    max_ratio: float = Field(
        gt=0, description="Bound on every arm's params (and FLOPs) / baseline's"
    )
    rationale: str = Field(min_length=1)


class PredictedAblation(Strict):
    """Gate 3: the effect predicted in advance, with its direction and size."""

    metric: str
    arm: str
    versus: str = Field(description="the ablated or baseline arm")
    direction: Direction
    size: float = Field(ge=0, description="predicted absolute difference in the metric")
    sd: float | None = Field(
        default=None,
        gt=0,
        description="expected seed-to-seed standard deviation of the "
        "metric; with it, `gates check` prints the seeds needed for 80% power",
    )
    statement: str = Field(min_length=1)


class FalsifiablePoint(Strict):
    """Gate 5: where the hypothesis would first fail, how that is measured, and by when."""

    metric: str
    arm: str
    direction: Direction = Field(description="the direction the metric must move to pass")
    threshold: float
    by_step: int = Field(gt=0, le=MAX_STEPS)
    statement: str = Field(min_length=1)


class CapacityMatch(Strict):
    """Arms whose trainable parameter counts (all of them, or one named part) must agree within a
    relative tolerance."""

    arms: list[str] = Field(min_length=2, max_length=MAX_ITEMS)
    tolerance: float = Field(gt=0, lt=1, description="relative, e.g. 0.02 for 2%")
    part: str | None = Field(
        default=None,
        min_length=1,
        description="compare this part of each arm's parameters (the study's "
        "parameter_parts, e.g. encoder_reader) instead of the total",
    )


class Preflight(Strict):
    compute_cost: ComputeCost
    preconditions: str = Field(
        min_length=1, description="Gate 2: why earlier successes' conditions hold here"
    )
    predicted_ablation: PredictedAblation
    task_fit: str = Field(
        min_length=1, description="Gate 4: why the task needs what the hypothesis offers"
    )
    falsifiable_point: FalsifiablePoint
    capacity_match: CapacityMatch | None = None


# ---------------------------------------------------------------------------------- budget & rules
class BudgetSpec(Strict):
    steps: int = Field(gt=0, le=MAX_STEPS, description="training steps per arm x seed")
    eval_every: int = Field(
        gt=0, le=MAX_STEPS, description="evaluate (and report) every this many steps"
    )

    @model_validator(mode="after")
    def _eval_within_steps(self):
        if self.eval_every > self.steps:
            raise ValueError(f"eval_every ({self.eval_every}) must not exceed steps ({self.steps})")
        if self.evaluations > MAX_EVALUATIONS:
            raise ValueError(
                f"steps {self.steps} with eval_every {self.eval_every} make {self.evaluations} "
                f"evaluations per run; expected at most {MAX_EVALUATIONS} (eval_every >= "
                f"{-(-self.steps // MAX_EVALUATIONS)})"
            )
        return self

    @property
    def evaluations(self) -> int:
        """Evaluations per run: every `eval_every` steps and at the last step (`Budget.is_eval_step`)."""
        return -(-self.steps // self.eval_every)


class FutilityRule(Strict):
    """Halt an arm that is hopeless: at `at_step`, worse than a bar and not converging.

    The bar is a constant (`worse_than`) or relative to the other arms of the same seed at the same
    step (`behind_best_other_by`: worse than the best other arm by more than this margin).
    """

    metric: str
    at_step: int = Field(gt=0, le=MAX_STEPS)
    worse_than: float | None = None
    behind_best_other_by: float | None = Field(default=None, ge=0)
    window: int = Field(
        gt=0, le=MAX_STEPS, description="steps over which the convergence trend is measured"
    )
    min_rel_improvement: float = Field(
        ge=0, description="relative improvement over the window below which there is no trend"
    )
    arms: list[str] | None = Field(
        default=None, max_length=MAX_ITEMS, description="arms the rule applies to (default: all)"
    )

    @model_validator(mode="after")
    def _one_bar(self):
        if (self.worse_than is None) == (self.behind_best_other_by is None):
            raise ValueError(
                "give exactly one of worse_than (a constant) or behind_best_other_by (a margin)"
            )
        if self.behind_best_other_by is not None and not self.arms:
            raise ValueError(
                "behind_best_other_by needs `arms`: the arms it halts (the others are the reference)"
            )
        return self


class DivergenceRule(Strict):
    """Halt on a non-finite value of any reported metric (or of `metrics`, when given)."""

    enabled: bool = True
    metrics: list[str] | None = Field(default=None, max_length=MAX_ITEMS)


class BudgetRule(Strict):
    """Halt a run that exceeds its wall-clock budget."""

    max_seconds: float = Field(gt=0)


class FailureRule(Strict):
    """Stop running an arm whose runs keep failing: a study that raises, or returns what it does not
    declare, on this many seeds in a row is broken, and its remaining seeds are not run (recorded as
    `skipped`, naming the first error). Failed runs are never results: a decision arm without a
    completed run makes the verdict invalid."""

    max_consecutive: int = Field(
        default=3,
        ge=1,
        le=MAX_SEEDS,
        description="failed runs of one arm in a row after which its remaining seeds are not run",
    )


class StopRules(Strict):
    futility: list[FutilityRule] = Field(default_factory=list, max_length=MAX_ITEMS)
    divergence: DivergenceRule = Field(default_factory=DivergenceRule)
    budget: BudgetRule | None = None
    failures: FailureRule = Field(default_factory=FailureRule)


# ---------------------------------------------------------------------------------- decision
class CeilingRef(Strict):
    """What the best possible arm reaches on a condition's metric, declared by the contract (a study may
    declare it too, `Study.ceiling`): a value known before the run, a metric the condition's arm reports
    in every run (its per-seed ceiling), or an oracle arm of the contract (its values of the same
    metric). A bar beyond a known ceiling is refused by `gates check`; a bar beyond the measured one
    makes the verdict invalid: the condition tests nothing."""

    why: str = Field(
        min_length=1, description="what reaches the ceiling, and why nothing can do better"
    )
    value: float | None = None
    metric: str | None = None
    arm: str | None = None

    @model_validator(mode="after")
    def _one_source(self):
        if sum(x is not None for x in (self.value, self.metric, self.arm)) != 1:
            raise ValueError(
                "give exactly one of value (known before the run), metric (reported by the arm's "
                "runs) or arm (an oracle arm)"
            )
        return self


class _Condition(Strict):
    # One alpha for the whole family (decision.alpha): a per-condition alpha compared with p-values
    # computed at the family's alpha is not a valid test, so there is none.
    interval: Literal["t", "bootstrap"] = Field(
        default="t",
        description="the interval shown: t (the test's own) or bootstrap (percentile "
        "bootstrap); the p-values always come from the estimand's test",
    )
    ceiling: CeilingRef | None = Field(
        default=None,
        description="what the best possible arm reaches on this "
        "condition's metric (threshold and compare conditions)",
    )
    # What the condition is about, fixed before the data: the test follows from it and from the metrics'
    # declarations, never from the values (gates.inference: the estimands and their tests)
    estimand: Literal["mean", "geometric_mean", "median", "proportion"] | None = Field(
        default=None,
        description="what the condition estimates: the mean (default on a linear metric), the "
        "geometric_mean (default on a log-scale metric), the median, or the proportion of seeds "
        "on the condition's side (with `share`)",
    )
    share: float | None = Field(
        default=None,
        gt=0,
        lt=1,
        description="estimand proportion: the condition holds when more than this share of seeds "
        "fall on its side of the bar",
    )
    estimand_reason: str | None = Field(
        default=None,
        min_length=1,
        description="why the condition estimates another quantity than the claim's words name "
        "(a claim about a mean judged on the median, say)",
    )
    refutes: str | None = Field(
        default=None,
        min_length=1,
        description="a refuted_if condition that reads none of the supported_if conditions' (arm, "
        "metric) terms: what else it refutes (a premise the claim rests on: the baseline it was "
        "measured against, the mechanism it names)",
    )

    @model_validator(mode="after")
    def _share_with_proportion(self):
        if (self.estimand == "proportion") != (self.share is not None):
            raise ValueError(
                "estimand proportion takes a share (0 < share < 1), and share goes only with "
                "estimand proportion"
            )
        return self


class Threshold(_Condition):
    """arm's metric vs a constant: `higher` means metric >= value, `lower` means metric <= value."""

    kind: Literal["threshold"]
    arm: str
    metric: str
    direction: Direction
    value: float


class Compare(_Condition):
    """arm vs other arm (or another metric), with an absolute or relative margin.

    `higher`: arm >= other + margin (absolute) or arm >= other * (1 + relative_margin).
    `lower`:  arm <= other - margin (absolute) or arm <= other * (1 - relative_margin).
    A negative absolute margin states non-inferiority ("no more than 0.05 above": lower, -0.05).
    """

    kind: Literal["compare"]
    arm: str
    metric: str
    other: str
    other_metric: str | None = Field(default=None, description="defaults to metric")
    direction: Direction
    margin: float | None = Field(
        default=None,
        description="absolute; negative for non-inferiority: "
        "`lower` with margin -0.05 reads arm <= other + 0.05",
    )
    relative_margin: float | None = Field(default=None, ge=0, lt=1)
    test: Literal["welch", "paired"] = "welch"

    @model_validator(mode="after")
    def _one_margin(self):
        if self.margin is not None and self.relative_margin is not None:
            raise ValueError("give either margin (absolute) or relative_margin, not both")
        return self


class Trend(_Condition):
    """Monotone along an ordered list: over `arms` for one `metric`, or over `metrics` in one `arm`.

    `lower` means each item is below the one before it (strictly, statistically); `higher` above.
    """

    kind: Literal["trend"]
    direction: Direction
    metric: str | None = None
    arms: list[str] | None = Field(default=None, max_length=MAX_ITEMS)
    arm: str | None = None
    metrics: list[str] | None = Field(default=None, max_length=MAX_ITEMS)
    test: Literal["welch", "paired"] = "welch"

    @model_validator(mode="after")
    def _one_axis(self):
        over_arms = self.metric is not None and self.arms is not None
        over_metrics = self.arm is not None and self.metrics is not None
        if over_arms == over_metrics or (self.arms is not None and self.metrics is not None):
            raise ValueError("give either (metric + arms) or (arm + metrics)")
        items = self.arms if over_arms else self.metrics
        if len(items) < 2:
            raise ValueError("a trend needs at least 2 items")
        return self

    def items(self) -> list[tuple[str, str]]:
        """The ordered (arm, metric) terms the trend runs over."""
        if self.arms is not None:
            return [(a, self.metric) for a in self.arms]
        return [(self.arm, m) for m in self.metrics]


Condition = Annotated[Threshold | Compare | Trend, Field(discriminator="kind")]


MAX_ALPHA = 0.1


class Decision(Strict):
    alpha: float = Field(
        default=DEFAULT_ALPHA,
        gt=0,
        le=MAX_ALPHA,
        description="family-wise error rate of the Holm-corrected conditions, at most 0.1 "
        "(above 0.5 the 1 - 2 alpha intervals would invert)",
    )
    family_alpha: float | None = Field(
        default=None,
        gt=0,
        le=MAX_ALPHA,
        description="the alpha of the claim's whole family (this version and every later version that "
        "supersedes it), declared on its first version only; default: `alpha`, which leaves a later "
        "version none. Each version is tested at its own `alpha`, and the versions' alphas add up to at "
        "most this (a re-try is not a fresh test at full alpha)",
    )
    evaluation: Literal["interval", "exact"] = Field(
        default="interval",
        description="exact: no intervals; a condition holds when it holds on every seed "
        "(only for studies that declare themselves deterministic)",
    )
    smallest_effects: dict[str, Annotated[float, Field(gt=0, allow_inf_nan=False)]] = Field(
        default_factory=dict,
        max_length=MAX_ITEMS,
        description="metric -> the smallest difference in it that matters (absolute, in the metric's "
        "declared unit and scale), fixed before the run; a non-inferiority margin on the metric is at "
        "most this, and at most the predicted effect on it",
    )
    supported_if: list[Condition] = Field(min_length=1, max_length=MAX_ITEMS)
    refuted_if: list[Condition] = Field(
        min_length=1, max_length=MAX_ITEMS, description="a contract must be refutable"
    )

    def conditions(self) -> list[tuple[str, int, Any]]:
        """Every condition as (list name, index, condition): the Holm family, in order."""
        return [("supported_if", i, c) for i, c in enumerate(self.supported_if)] + [
            ("refuted_if", i, c) for i, c in enumerate(self.refuted_if)
        ]


# ---------------------------------------------------------------------------------- design guards
ControlRole = Literal["positive", "negative"]


class _Control:
    """A condition that must hold for the experiment to be interpretable. `positive`: the setup can
    detect an effect (the baseline beats a no-source arm); `negative`: what must not pass does not (a
    random topology fails the criterion). A control that fails or cannot be settled makes the verdict
    `invalid`."""


class ThresholdControl(Threshold, _Control):
    control: ControlRole


class CompareControl(Compare, _Control):
    control: ControlRole


class TrendControl(Trend, _Control):
    control: ControlRole


Control = Annotated[ThresholdControl | CompareControl | TrendControl, Field(discriminator="kind")]


class Convergence(Strict):
    """An arm still improving at the end of its run is not converged: every condition reading it is
    undetermined ("still improving: needs more steps"), so no verdict rests on undertrained arms."""

    metric: str = Field(description="a training or validation metric reported at every evaluation")
    window: int = Field(
        gt=0,
        le=MAX_STEPS,
        description="steps at the end of the run over which improvement is measured",
    )
    max_rel_improvement: float = Field(
        ge=0,
        description="relative improvement over the window above which the arm is still learning",
    )


class Sequential(Strict):
    """Group-sequential seeds: decide after the first `looks[0]` seeds, stop at the first look that
    decides, else continue; alpha is spent across looks (Lan-DeMets)."""

    looks: list[Annotated[int, Field(le=MAX_SEEDS)]] = Field(
        min_length=2,
        max_length=MAX_LOOKS,
        description="cumulative seed counts at which to decide, "
        "increasing; the last equals len(seeds)",
    )
    spending: Literal["obrien-fleming", "pocock"] = "obrien-fleming"

    @field_validator("looks")
    @classmethod
    def _increasing(cls, looks):
        if any(b <= a for a, b in zip(looks, looks[1:])) or looks[0] < MIN_VERDICT_SEEDS:
            raise ValueError(
                f"looks must increase and start at {MIN_VERDICT_SEEDS} seeds or more (fewer never "
                f"reach a verdict), got {looks}"
            )
        return looks


class Replay(Strict):
    ci: bool = False
    abs_tolerance: float = Field(default=1e-6, ge=0)
    rel_tolerance: float = Field(default=1e-6, ge=0)


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


# ---------------------------------------------------------------------------------- tuning
VALIDATION_PREFIXES = ("val_", "valid_", "validation_")


def is_validation_metric(name: str) -> bool:
    """Metrics measured on a validation split are named val_*, valid_* or validation_*."""
    return name.startswith(VALIDATION_PREFIXES)


class SpaceParam(Strict):
    """One searched arm-config field: a float or int range (optionally log-scaled) or a choice."""

    type: Literal["float", "int", "categorical"]
    low: float | None = Field(default=None, description="float/int: smallest value searched")
    high: float | None = Field(default=None, description="float/int: largest value searched")
    log: bool = Field(default=False, description="float/int: sample on a log scale (low > 0)")
    step: float | None = Field(
        default=None, gt=0, description="float/int: grid step (int default 1)"
    )
    choices: list[bool | int | float | str] | None = Field(
        default=None, max_length=MAX_ITEMS, description="categorical: the values"
    )
    hard: list[Literal["low", "high"]] = Field(
        default_factory=list,
        description="float/int: ends of the range that "
        "are hard limits (dropout cannot go below 0): a best trial at that "
        "edge is not flagged as a search stopped short",
    )

    @model_validator(mode="after")
    def _consistent(self):
        if self.type == "categorical":
            if self.choices is None or len(self.choices) < 2:
                raise ValueError("a categorical parameter needs `choices` with at least 2 values")
            if len({canonical_json(c) for c in self.choices}) != len(self.choices):
                raise ValueError(f"choices must be distinct, got {self.choices}")
            if (
                any(getattr(self, f) not in (None, False) for f in ("low", "high", "log", "step"))
                or self.hard
            ):
                raise ValueError(
                    "a categorical parameter takes only `choices` (no low, high, log, step, hard)"
                )
            return self
        if self.choices is not None:
            raise ValueError(f"a {self.type} range takes low/high, not `choices`")
        if self.low is None or self.high is None:
            raise ValueError(f"a {self.type} range needs both `low` and `high`")
        if not self.low < self.high:
            raise ValueError(f"low ({self.low:g}) must be below high ({self.high:g})")
        if self.log and self.low <= 0:
            raise ValueError(f"a log range needs low > 0, got {self.low:g}")
        if self.type == "int":
            if not all(float(v).is_integer() for v in (self.low, self.high, self.step or 1)):
                raise ValueError("an int range needs integer low, high and step")
            if self.log and (self.step or 1) != 1:
                raise ValueError("an int log range takes no step (other than 1)")
        elif self.log and self.step is not None:
            raise ValueError("a float range is either log-scaled or stepped, not both")
        return self

    def bounds(self) -> list[tuple[str | int, Any]]:
        """(where in the YAML, value) of every extreme value a trial can take, for checking."""
        if self.type == "categorical":
            return [(("choices", i), c) for i, c in enumerate(self.choices)]
        cast = int if self.type == "int" else float
        return [(("low",), cast(self.low)), (("high",), cast(self.high))]


class TuningObjective(Strict):
    metric: str = Field(
        description="a validation metric (val_*, valid_*, validation_*) that the decision never reads"
    )
    direction: Direction = Field(description="must be the study's better direction for the metric")


class TuningSampler(Strict):
    kind: Literal["tpe", "random"] = "tpe"
    seed: Seed = Field(description="sampler seed (trial n of every arm samples from seed, n)")


class Tuning(Strict):
    """Search each tuned arm's config on a validation split with the same budget, then run the best
    configuration over the contract's seeds (gates/execution/_tuning.py)."""

    space: dict[str, SpaceParam] = Field(
        min_length=1, max_length=MAX_ITEMS, description="arm config field -> its range or choices"
    )
    trials: int | dict[str, int] = Field(
        description="trials per tuned arm: a number (every arm), or arm -> number (those arms; all equal)"
    )
    objective: TuningObjective
    seeds: Seeds = Field(
        min_length=1, description="seeds of the tuning runs (disjoint from the contract's)"
    )
    sampler: TuningSampler

    @field_validator("trials", mode="before")
    @classmethod
    def _equal_budgets(cls, trials):
        def counts(n):
            return isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= MAX_TRIALS

        if isinstance(trials, dict):
            if not 1 <= len(trials) <= MAX_ITEMS or not all(counts(n) for n in trials.values()):
                raise ValueError(
                    f"expected arm -> a positive number of trials, at most {MAX_TRIALS} (for at "
                    f"most {MAX_ITEMS} arms), got {trials}"
                )
            if len(set(trials.values())) > 1:
                shown = ", ".join(f"{a}: {n}" for a, n in trials.items())
                raise ValueError(
                    f"tuning budgets differ across arms ({shown}); expected the same number of "
                    f"trials for every tuned arm (the budget is pre-registered: an arm searched "
                    f"longer would win by search effort alone)"
                )
        elif not counts(trials):
            raise ValueError(
                f"expected a positive number of trials per arm, at most {MAX_TRIALS} (or arm -> "
                f"number), got {trials!r}"
            )
        return trials

    def tuned_arms(self, arms) -> list[str]:
        """The tuned arms, in the contract's arm order."""
        return [a for a in arms if not isinstance(self.trials, dict) or a in self.trials]

    @property
    def trials_per_arm(self) -> int:
        return self.trials if isinstance(self.trials, int) else next(iter(self.trials.values()))


# ---------------------------------------------------------------------------------- contract
class Contract(Strict):
    id: str = Field(pattern=SLUG, max_length=80)
    claim: str = Field(min_length=1)
    source: str = Field(min_length=1)
    study: str
    arms: dict[str, dict[str, Any]] = Field(min_length=1, max_length=MAX_ITEMS)
    seeds: Seeds = Field(min_length=1)
    budget: BudgetSpec
    preflight: Preflight
    stop_rules: StopRules = Field(default_factory=StopRules)
    decision: Decision
    replay: Replay | None = None
    tuning: Tuning | None = None
    controls: list[Control] = Field(
        default_factory=list,
        max_length=MAX_ITEMS,
        description="conditions that must hold for the "
        "experiment to be interpretable; one failing or unsettled: verdict invalid",
    )
    convergence: Convergence | None = None
    sequential: Sequential | None = None
    supersedes: str | None = Field(
        default=None,
        pattern=SLUG,
        max_length=80,
        description="id of the earlier contract this version replaces (its "
        "evidence stays, shown as superseded)",
    )
    factor: list[str] | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_ITEMS,
        description="the arm config fields under test: "
        "arms a condition compares may differ only in these (and in `differences`)",
    )
    differences: dict[str, str] = Field(
        default_factory=dict,
        max_length=MAX_ITEMS,
        description="other arm config fields in which "
        "compared arms differ, each with why (printed beside the verdict)",
    )
    blind: dict[str, str] = Field(
        default_factory=dict,
        max_length=MAX_ITEMS,
        description="arm -> why it fails by construction (it "
        "cannot see what the task needs): a condition asserting it fails needs no "
        "positive control; printed beside the verdict",
    )
    no_convergence: str | None = Field(
        default=None,
        min_length=1,
        description="why this contract's runs cannot "
        "be judged for convergence (a contract of a training study declares a "
        "`convergence` rule, or this); printed beside the verdict",
    )

    @field_validator("seeds", mode="before")
    @classmethod
    def _seeds_from_count(cls, value):
        return _seed_list(value)

    @field_validator("arms")
    @classmethod
    def _arm_names(cls, arms):
        longest = 64  # an arm names MLflow runs (`<arm>/seed<n>`) and tags: a short slug, one line
        for name in arms:
            if not isinstance(name, str) or not re.fullmatch(
                rf"[A-Za-z0-9_][A-Za-z0-9_.-]{{0,{longest - 1}}}", name, re.ASCII
            ):
                raise ValueError(
                    f"arm name {name!r} must be 1-{longest} letters, digits, '_', '.', '-' "
                    f"(starting with a letter, digit or '_')"
                )
        return arms

    def conditions(self) -> list[tuple[str, int, Any]]:
        """Every decision condition as (list name, index, condition)."""
        return self.decision.conditions()

    def arms_named_by_decision(self) -> set[str]:
        named = set()
        for _, _, c in self.conditions():
            named |= {arm for arm, _ in condition_terms(c)}
        return named


def arms_under_test(decision: Decision) -> set[str]:
    """Arms a claim is about: a threshold's arm, a compare's `arm`, every arm of a trend. The other
    arms a decision names (a compare's `other` only) are comparators."""
    under = set()
    for _, _, c in decision.conditions():
        under |= {c.arm} if isinstance(c, (Threshold, Compare)) else {a for a, _ in c.items()}
    return under


def condition_terms(c) -> list[tuple[str, str]]:
    """The (arm, metric) pairs a condition reads."""
    if isinstance(c, Threshold):
        return [(c.arm, c.metric)]
    if isinstance(c, Compare):
        return [(c.arm, c.metric), (c.other, c.other_metric or c.metric)]
    return c.items()


def canonical_json(data: Any) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


class LoadedContract:
    """A validated contract with where it came from, its study and its hash."""

    def __init__(
        self,
        contract: Contract,
        path: Path,
        study: Study,
        arm_configs: dict,
        sha256: str,
        lines: dict[tuple, int],
    ):
        self.contract = contract
        self.path = path
        self.study = study
        self.arm_configs = arm_configs  # arm name -> study.Config instance (defaults filled in)
        self.sha256 = sha256
        self.lines = lines  # field path -> line in the YAML file
        # the tuning record of the run being judged (gates.execution._tuning: a tuned arm's search may have stopped at
        # an edge); set by the runner after tuning and by verify from the evidence
        self.tuning_record: dict | None = None
        # its claim family (gates.record.family_of: the alpha its verdict is judged at); set by whoever
        # reads it with the record (admit, verify, rederive); None: judged at its own alpha
        self.family = None

    def ceilings(self) -> dict[str, dict]:
        """condition label -> its ceiling ({why, value | metric | arm}): the contract's `ceiling`, else what
        the study knows for the condition's arm and metric (`Study.ceiling`); threshold and compare only."""
        out = {}
        for name, i, c in self.contract.conditions():
            if isinstance(c, Trend):
                continue
            if c.ceiling is not None:
                out[f"{name}[{i}]"] = c.ceiling.model_dump(exclude_none=True)
                continue
            config = self.arm_configs.get(c.arm)
            known = self.study.ceiling(c.metric, config) if config is not None else None
            if known is not None:
                out[f"{name}[{i}]"] = {
                    k: v
                    for k, v in (
                        ("why", known.why),
                        ("value", known.value),
                        ("metric", known.metric),
                    )
                    if v is not None
                }
        return out

    def recorded_in(self, runs_root: Path) -> bool:
        """Whether runs_root holds evidence recorded for exactly this contract (same sha256)."""
        evidence = Path(runs_root) / self.contract.id / "evidence.json"
        try:
            return (
                json.loads(evidence.read_text(encoding="utf-8")).get("contract_sha256")
                == self.sha256
            )
        except (OSError, ValueError, AttributeError):
            return False

    def error(self, loc: tuple, msg: str) -> UserError:
        """A UserError pointing at the file, line and field `loc` of this contract."""
        return UserError(
            msg, file=str(self.path), line=_line_for(self.lines, loc), field=_dotted(loc)
        )

    @property
    def id(self) -> str:
        return self.contract.id


MAX_CONTRACT_BYTES = 256 * 1024


def load_contract(path: str | Path) -> LoadedContract:
    """Load, validate and hash a contract; raise UserError(s) that point at file:line:field."""
    from gates.study import get_study, study_names

    path = Path(path)
    shown = str(path)
    data, lines = load_yaml(path, max_bytes=MAX_CONTRACT_BYTES)
    if not isinstance(data, dict):
        raise UserError(
            "a contract is a mapping of fields (id, claim, study, arms, ...)", file=shown, line=1
        )

    def err(loc: tuple, msg: str) -> UserError:
        return UserError(msg, file=shown, line=_line_for(lines, loc), field=_dotted(loc))

    try:
        contract = Contract.model_validate(data)
    except ValidationError as e:
        raise UserErrors(
            [err(tuple(x["loc"]), _explain(x, Contract)) for x in e.errors()]
        ) from None

    try:
        study = get_study(contract.study)
    except KeyError:
        raise err(
            ("study",),
            f"unknown study {contract.study!r}{did_you_mean(contract.study, study_names())};"
            f" registered: {', '.join(study_names()) or 'none'}",
        ) from None

    errors: list[UserError] = []
    arm_configs = {}
    for arm, raw in contract.arms.items():
        try:
            arm_configs[arm] = study.Config.model_validate(raw)
        except ValidationError as e:
            errors += [
                err(("arms", arm) + tuple(x["loc"]), _explain(x, study.Config)) for x in e.errors()
            ]
    errors += _check_references(contract, study, err)
    if contract.tuning is not None:
        errors += _check_tuning(contract, study, err)
    if errors:
        raise UserErrors(errors)

    canonical = contract.model_dump(mode="json", exclude_unset=True)
    canonical["arms"] = {
        a: c.model_dump(mode="json", exclude_unset=True) for a, c in arm_configs.items()
    }
    sha = hashlib.sha256(canonical_json(canonical).encode()).hexdigest()
    loaded = LoadedContract(contract, path, study, arm_configs, sha, lines)
    return loaded


def _check_references(contract: Contract, study: Study, err) -> list[UserError]:
    """Arms and metrics named anywhere must exist; the contract must be refutable and consistent."""
    errors = []
    arms = list(contract.arms)
    metrics = list(study.metrics)

    def arm_ref(loc, name):
        if name not in contract.arms:
            errors.append(
                err(
                    loc, f"no arm named {name!r}{did_you_mean(name, arms)}; arms: {', '.join(arms)}"
                )
            )

    def metric_ref(loc, name):
        if name not in study.metrics:
            errors.append(
                err(
                    loc,
                    f"study {study.name!r} reports no metric {name!r}"
                    f"{did_you_mean(name, metrics)}; metrics: {', '.join(metrics)}",
                )
            )

    pf = contract.preflight
    arm_ref(("preflight", "compute_cost", "baseline_arm"), pf.compute_cost.baseline_arm)
    for f in ("arm", "versus"):
        arm_ref(("preflight", "predicted_ablation", f), getattr(pf.predicted_ablation, f))
    metric_ref(("preflight", "predicted_ablation", "metric"), pf.predicted_ablation.metric)
    arm_ref(("preflight", "falsifiable_point", "arm"), pf.falsifiable_point.arm)
    metric_ref(("preflight", "falsifiable_point", "metric"), pf.falsifiable_point.metric)
    if pf.falsifiable_point.by_step > contract.budget.steps:
        errors.append(
            err(
                ("preflight", "falsifiable_point", "by_step"),
                f"by_step {pf.falsifiable_point.by_step} is past the budget of "
                f"{contract.budget.steps} steps; expected <= budget.steps",
            )
        )
    if pf.capacity_match:
        for i, a in enumerate(pf.capacity_match.arms):
            arm_ref(("preflight", "capacity_match", "arms", i), a)
    for i, rule in enumerate(contract.stop_rules.futility):
        metric_ref(("stop_rules", "futility", i, "metric"), rule.metric)
        for j, a in enumerate(rule.arms or []):
            arm_ref(("stop_rules", "futility", i, "arms", j), a)
        if rule.at_step > contract.budget.steps:
            errors.append(
                err(
                    ("stop_rules", "futility", i, "at_step"),
                    f"at_step {rule.at_step} is past the budget of {contract.budget.steps} steps",
                )
            )
        elif rule.at_step - rule.window < contract.budget.eval_every:
            errors.append(
                err(
                    ("stop_rules", "futility", i, "window"),
                    f"window {rule.window} reaches back before the first evaluation (step "
                    f"{contract.budget.eval_every}) from at_step {rule.at_step}; expected "
                    f"at_step - window >= budget.eval_every, so the trend can be measured",
                )
            )
    for j, m in enumerate(contract.stop_rules.divergence.metrics or []):
        metric_ref(("stop_rules", "divergence", "metrics", j), m)

    located = [(("decision", list_name, i), c) for list_name, i, c in contract.conditions()] + [
        (("controls", i), c) for i, c in enumerate(contract.controls)
    ]
    for base, c in located:
        if isinstance(c, Threshold):
            arm_ref(base + ("arm",), c.arm)
            metric_ref(base + ("metric",), c.metric)
        elif isinstance(c, Compare):
            arm_ref(base + ("arm",), c.arm)
            arm_ref(base + ("other",), c.other)
            metric_ref(base + ("metric",), c.metric)
            if c.other_metric is not None:
                metric_ref(base + ("other_metric",), c.other_metric)
            if c.arm == c.other and (c.other_metric or c.metric) == c.metric:
                errors.append(
                    err(base, "compares a term with itself; expected two different arms or metrics")
                )
        else:
            for j, a in enumerate(c.arms or []):
                arm_ref(base + ("arms", j), a)
            if c.arm is not None:
                arm_ref(base + ("arm",), c.arm)
            for j, m in enumerate(c.metrics or []):
                metric_ref(base + ("metrics", j), m)
            if c.metric is not None:
                metric_ref(base + ("metric",), c.metric)
    if contract.convergence is not None:
        conv = contract.convergence
        metric_ref(("convergence", "metric"), conv.metric)
        if conv.window > contract.budget.steps - contract.budget.eval_every:
            errors.append(
                err(
                    ("convergence", "window"),
                    f"window {conv.window} cannot be measured: the first evaluation is at step "
                    f"{contract.budget.eval_every} and the run ends at {contract.budget.steps}; expected "
                    f"window <= steps - eval_every ({contract.budget.steps - contract.budget.eval_every})",
                )
            )
        elif conv.window < contract.budget.eval_every:
            errors.append(
                err(
                    ("convergence", "window"),
                    f"window {conv.window} is shorter than eval_every {contract.budget.eval_every}: it "
                    f"would hold no two evaluations; expected window >= budget.eval_every",
                )
            )
    if contract.sequential is not None and contract.sequential.looks[-1] != len(contract.seeds):
        errors.append(
            err(
                ("sequential", "looks"),
                f"the last look ({contract.sequential.looks[-1]} seeds) must use every seed listed "
                f"({len(contract.seeds)}); expected looks ending at len(seeds)",
            )
        )
    if contract.decision.evaluation == "exact" and not study.deterministic:
        errors.append(
            err(
                ("decision", "evaluation"),
                f"study {study.name!r} is not deterministic across seeds; expected 'interval'",
            )
        )
    family_alpha = contract.decision.family_alpha
    if family_alpha is not None and contract.supersedes is not None:
        errors.append(
            err(
                ("decision", "family_alpha"),
                f"a later version spends its family's alpha, declared by the first version; expected "
                f"no family_alpha here (this contract supersedes {contract.supersedes!r})",
            )
        )
    elif family_alpha is not None and family_alpha < contract.decision.alpha:
        errors.append(
            err(
                ("decision", "family_alpha"),
                f"family_alpha {family_alpha:g} is below this version's alpha "
                f"{contract.decision.alpha:g}; expected family_alpha >= alpha (the family includes "
                f"this version)",
            )
        )
    if contract.decision.evaluation == "interval" and len(contract.seeds) < MIN_VERDICT_SEEDS:
        errors.append(
            err(
                ("seeds",),
                f"{len(contract.seeds)} seed(s) never reach a verdict; expected at least "
                f"{MIN_VERDICT_SEEDS} for interval evaluation (seeds: {MIN_VERDICT_SEEDS})",
            )
        )
    return errors


def _check_tuning(contract: Contract, study: Study, err) -> list[UserError]:
    """A tuning section must search real fields within what every tuned arm accepts, and keep the
    decision fair: it reads no metric of the validation split tuning selected on, and compares no
    tuned arm with an untuned one."""
    t = contract.tuning
    errors = []
    fields = list(study.Config.model_fields)
    tuned = t.tuned_arms(contract.arms)
    if isinstance(t.trials, dict):
        for arm in t.trials:
            if arm not in contract.arms:
                errors.append(
                    err(
                        ("tuning", "trials", arm),
                        f"no arm named {arm!r}{did_you_mean(arm, list(contract.arms))}; "
                        f"arms: {', '.join(contract.arms)}",
                    )
                )
    for key, param in t.space.items():
        if key not in study.Config.model_fields:
            errors.append(
                err(
                    ("tuning", "space", key),
                    f"not a field of study {study.name!r}'s arm config"
                    f"{did_you_mean(key, fields)}; fields: {', '.join(fields)}",
                )
            )
            continue
        for where, value in param.bounds():
            for arm in tuned:
                try:
                    study.Config.model_validate({**contract.arms[arm], key: value})
                except ValidationError as e:
                    why = "; ".join(_explain(x, study.Config) for x in e.errors())
                    errors.append(
                        err(
                            ("tuning", "space", key) + where,
                            f"{key} = {value!r} is outside what arm {arm!r} accepts ({why}); "
                            f"expected a range within the field's validation",
                        )
                    )
                    break
    obj = t.objective
    if obj.metric not in study.metrics:
        errors.append(
            err(
                ("tuning", "objective", "metric"),
                f"study {study.name!r} reports no metric {obj.metric!r}"
                f"{did_you_mean(obj.metric, list(study.metrics))}; "
                f"metrics: {', '.join(study.metrics)}",
            )
        )
    else:
        if not is_validation_metric(obj.metric):
            val = [m for m in study.metrics if is_validation_metric(m)]
            errors.append(
                err(
                    ("tuning", "objective", "metric"),
                    f"{obj.metric!r} is not a validation metric; expected one measured on a split the "
                    f"decision never sees, named val_*, valid_* or validation_* (study {study.name!r} "
                    f"has: {', '.join(val) or 'none'})",
                )
            )
        better = study.metrics[obj.metric].direction
        if obj.direction != better:
            errors.append(
                err(
                    ("tuning", "objective", "direction"),
                    f"{obj.metric!r} is better when {better} in study {study.name!r}; "
                    f"expected direction {better!r}",
                )
            )
    overlap = sorted(set(t.seeds) & set(contract.seeds))
    if overlap:
        errors.append(
            err(
                ("tuning", "seeds"),
                f"tuning seeds {overlap} are also the contract's seeds; expected "
                f"seeds disjoint from {contract.seeds}, so no verdict run is a tuning run",
            )
        )
    for list_name, i, c in contract.conditions():
        base = ("decision", list_name, i)
        for loc, metric in metric_locs(c):
            if metric == obj.metric or is_validation_metric(metric):
                what = (
                    "is the tuning objective"
                    if metric == obj.metric
                    else "is measured on the validation split"
                )
                errors.append(
                    err(
                        base + loc,
                        f"{metric!r} {what}: tuning selected every arm's config on that "
                        f"split, so a decision on it would be biased; expected a metric from "
                        f"a split tuning never saw (e.g. test_*)",
                    )
                )
        if not isinstance(c, Threshold):
            arms = {arm for arm, _ in condition_terms(c)}
            if arms & set(tuned) and arms - set(tuned):
                errors.append(
                    err(
                        base,
                        f"compares tuned arm(s) {sorted(arms & set(tuned))} with untuned "
                        f"{sorted(arms - set(tuned))}; expected both sides tuned with the same "
                        f"budget, or neither",
                    )
                )
    return errors


def metric_locs(c) -> list[tuple[tuple, str]]:
    """(field path within the condition, metric) of every metric a condition reads."""
    if isinstance(c, Threshold):
        return [(("metric",), c.metric)]
    if isinstance(c, Compare):
        return [(("metric",), c.metric)] + (
            [(("other_metric",), c.other_metric)] if c.other_metric else []
        )
    if c.metrics is not None:
        return [(("metrics", j), m) for j, m in enumerate(c.metrics)]
    return [(("metric",), c.metric)]


# ---------------------------------------------------------------------------------- error helpers
def _dotted(loc: tuple) -> str:
    # pydantic's validator and union-tag steps are not fields of the YAML
    return ".".join(
        str(p)
        for p in loc
        if not str(p).startswith(("function-after", "tagged-union"))
        and (not isinstance(p, str) or _keep(p))
    )


def _line_for(lines: dict[tuple, int], loc: tuple) -> int | None:
    """The line of the deepest part of `loc` that the YAML file has (a missing field: its parent)."""
    loc = tuple(p for p in loc if not isinstance(p, str) or p in _keep(p))
    for n in range(len(loc), -1, -1):
        if loc[:n] in lines:
            return lines[loc[:n]]
    return None


def _keep(p: str) -> str:
    # pydantic puts union tags ('threshold', 'compare', 'trend') into error locations; the YAML does not
    return p if p not in ("threshold", "compare", "trend") else ""


def _explain(error: dict, root: type[BaseModel]) -> str:
    kind, msg, loc = error["type"], error["msg"], tuple(error["loc"])
    if kind == "extra_forbidden":
        known = _fields_at(root, loc[:-1])
        hint = did_you_mean(loc[-1], known) if known else ""
        expected = f"; expected one of: {', '.join(known)}" if known and not hint else ""
        return f"unknown field{hint}{expected}"
    if kind == "missing":
        return "required field is missing"
    if kind == "union_tag_invalid":
        return "unknown condition kind; expected one of: threshold, compare, trend"
    if kind == "union_tag_not_found":
        return "a condition needs a 'kind': threshold, compare or trend"
    if kind == "literal_error":
        return f"{msg}, got {error.get('input')!r}"
    got = error.get("input")
    if kind == "value_error" and isinstance(got, (dict, list)) and msg:
        # our own check of a whole section or list: its message names the values; "got dict" adds nothing
        return msg[0].lower() + msg[1:]
    shown = repr(got) if not isinstance(got, (dict, list)) else type(got).__name__
    return f"{msg[0].lower() + msg[1:]}, got {shown}" if msg else f"invalid value {shown}"


def _fields_at(model: type[BaseModel], loc: tuple) -> list[str]:
    """The field names of the model found at `loc` under `model` (best effort, for hints)."""
    import typing

    current: Any = model
    for part in loc:
        if isinstance(current, type) and issubclass(current, BaseModel):
            if part in current.model_fields:
                current = current.model_fields[part].annotation
            elif part in ("threshold", "compare", "trend"):
                current = {"threshold": Threshold, "compare": Compare, "trend": Trend}[part]
            else:
                return []
        else:
            args = [a for a in typing.get_args(current) if a is not type(None)]
            models = [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]
            if models:
                current = models[0]
                if part in current.model_fields:
                    current = current.model_fields[part].annotation
            elif args:
                current = args[-1]
    while not (isinstance(current, type) and issubclass(current, BaseModel)):
        args = [a for a in typing.get_args(current) if a is not type(None)]
        models = [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]
        if not args:
            return []
        current = models[0] if models else args[-1]
    return list(current.model_fields)


_LOADED: dict[tuple, LoadedContract | None] = {}  # (path, mtime, size) -> the contract it loaded to


def load_contract_cached(path: Path) -> LoadedContract | None:
    try:
        st = path.stat()
    except OSError:
        return None
    key = (str(path.resolve()), st.st_mtime_ns, st.st_size)
    if key not in _LOADED:
        try:
            _LOADED[key] = load_contract(path)
        except UserError:
            _LOADED[key] = None
    return _LOADED[key]
