"""A contract's `tuning` section: the search space of each tuned arm (`SpaceParam`), its objective on
a validation metric, its sampler, trials and seeds.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from gates.contract._bounds import MAX_ITEMS, MAX_TRIALS, Seed, Seeds, Strict, canonical_json
from gates.study import Direction

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

    def outside(self, value) -> str | None:
        """Why `value` is not a value this parameter's search can take (None: it can): off the choices,
        the range, the int or step grid."""
        if self.type == "categorical":
            return None if value in self.choices else f"not one of the choices {self.choices}"
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"not a number ({value!r})"
        if not self.low <= value <= self.high:
            return f"outside [{self.low:g}, {self.high:g}]"
        step = self.step or (1 if self.type == "int" else None)
        if step is not None:
            k = (value - self.low) / step
            if abs(k - round(k)) > 1e-9:
                return f"off the grid {self.low:g} + k * {step:g}"
        return None

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
    kind: Literal["tpe", "random", "listed"] = "tpe"
    seed: Seed | None = Field(
        default=None,
        description="tpe / random: sampler seed (trial n of every arm samples from seed, n)",
    )
    candidates: list[dict[str, bool | int | float | str]] | None = Field(
        default=None,
        max_length=MAX_TRIALS,
        description="listed: the configurations trial 0, 1, ... of every arm tries, one per trial "
        "(a designed search, e.g. one that brackets the expected optimum in every field)",
    )

    def summary(self) -> str:
        """One line: `random sampler, seed 0` or `listed candidates (lr 0.001, dropout 0.3), ...`."""
        if self.kind != "listed":
            return f"{self.kind} sampler, seed {self.seed}"
        return "listed candidates " + ", ".join(
            "(" + ", ".join(f"{k} {v}" for k, v in c.items()) + ")" for c in self.candidates
        )

    @model_validator(mode="after")
    def _seed_or_candidates(self):
        if self.kind == "listed":
            if not self.candidates:
                raise ValueError("a listed sampler needs `candidates`: one configuration per trial")
            if self.seed is not None:
                raise ValueError(
                    "a listed sampler draws nothing: it takes `candidates`, not a `seed`"
                )
            if len({canonical_json(c) for c in self.candidates}) != len(self.candidates):
                raise ValueError(f"candidates must be distinct, got {self.candidates}")
        else:
            if self.seed is None:
                raise ValueError(f"a {self.kind} sampler needs a `seed`")
            if self.candidates is not None:
                raise ValueError(
                    f"a {self.kind} sampler draws its candidates; `candidates` is for kind: listed"
                )
        return self


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
