"""Hypothesis contracts: what result would support or refute a claim, fixed before any step.

A contract is a YAML file validated into frozen pydantic models. Its identity is the sha256 of the
canonical JSON of what the file states (comments, key order and formatting do not change it).
Every validation error names the file, the line, the field path and what is expected.

Here: the sections (preflight's gates, budget, stop rules, convergence, sequential looks, replay) and
the `Contract` that holds them; its decision is in `_conditions`, its tuning in `_tuning`, what every
section is held to in `_bounds`, loading in `_load`.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from gates.contract._bounds import (
    MAX_EVALUATIONS,
    MAX_ITEMS,
    MAX_LOOKS,
    MAX_SEEDS,
    MAX_STEPS,
    MIN_VERDICT_SEEDS,
    SLUG,
    Seeds,
    Strict,
    _seed_list,
)
from gates.contract._conditions import Control, Decision, condition_terms
from gates.contract._tuning import Tuning
from gates.study import Direction


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
