"""The narrow interface between the platform and a study (a family of models plus a protocol).

A study is to `gates` what an objective is to Optuna: it trains and measures, and talks to the
platform only through `reporter.report(step, metrics)`, which may raise `Halt` when a stop rule
fires. Studies are registered under the entry-point group `gates.studies` and found by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal, Protocol

from pydantic import BaseModel, ConfigDict

Direction = Literal["higher", "lower"]


class Halt(Exception):
    """Raised inside a study's loop by the reporter when a stop rule halts the run."""

    def __init__(self, reason: str, step: int, detail: str):
        self.reason = reason  # "futility" | "divergence" | "budget"
        self.step = step
        self.detail = detail
        super().__init__(f"{reason} at step {step}: {detail}")


@dataclass(frozen=True)
class Budget:
    """What a run may spend: training steps and how often to evaluate (both from the contract)."""

    steps: int
    eval_every: int

    def is_eval_step(self, step: int) -> bool:
        """Evaluate every `eval_every` steps and always at the last step."""
        return step % self.eval_every == 0 or step == self.steps


class Reporter(Protocol):
    """The only channel from a study to the platform."""

    budget: Budget

    def report(self, step: int, metrics: dict[str, float]) -> None:
        """Record metrics at `step` and ask the stop rules; raises `Halt` to stop the run."""

    def attach(self, name: str, text: str) -> None:
        """Keep a text for people to read beside the run (e.g. sample translations)."""


class StudyConfig(BaseModel):
    """Base for a study's arm configuration: strict, frozen, unknown fields rejected."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Study:
    """Base class for studies. Subclasses set `name`, `Config`, `metrics` and implement `run`."""

    name: ClassVar[str]
    Config: ClassVar[type[StudyConfig]]
    # metric name -> which direction is better; every metric a contract may name is listed here
    metrics: ClassVar[dict[str, Direction]]
    # a study whose metrics do not depend on random draws may let contracts use exact evaluation
    deterministic: ClassVar[bool] = False
    # metrics that measure the machine rather than the model (wall-clock speed, resident memory):
    # recorded, but a replay on another machine is not expected to reproduce them
    machine_metrics: ClassVar[frozenset[str]] = frozenset()

    def param_count(self, config: StudyConfig) -> int:
        """Trainable parameters of the model an arm builds (measured, not declared)."""
        raise NotImplementedError

    def flops(self, config: StudyConfig) -> int | None:
        """Forward FLOPs per example where the study can count them, else None."""
        return None

    def check_ready(self, config: StudyConfig) -> str | None:
        """None when the arm can run here, else why not and how to fix it (e.g. a fetch command)."""
        return None

    def run(self, config: StudyConfig, seed: int, reporter: Reporter) -> dict[str, float]:
        """Train and measure one arm for one seed; return the final metrics."""
        raise NotImplementedError


class NullReporter:
    """A reporter that records nothing: runs a study bare (benchmarks, quick experiments)."""

    def __init__(self, budget: Budget):
        self.budget = budget
        self.history: list[tuple[int, dict[str, float]]] = []
        self.attached: dict[str, str] = {}

    def report(self, step: int, metrics: dict[str, float]) -> None:
        self.history.append((step, dict(metrics)))

    def attach(self, name: str, text: str) -> None:
        self.attached[name] = text
