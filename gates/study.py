"""The narrow interface between the platform and a study (a family of models plus a protocol).

A study is to `gates` what an objective is to Optuna: it trains and measures, and talks to the
platform only through `reporter.report(step, metrics)`, which may raise `Halt` when a stop rule
fires. Studies are registered under the entry-point group `gates.studies` and found by name.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import ClassVar, Literal, Protocol

from pydantic import BaseModel, ConfigDict

Direction = Literal["higher", "lower"]
# What a metric measures, which decides who may read it: a decision reads only held-out `test`
# metrics and `cost` metrics (of the model: parameters, FLOPs, visited nodes, latency); stop rules
# and tuning may read any (tuning reads `validation`).
Role = Literal["train", "validation", "test", "cost", "diagnostic"]
ROLES: tuple[str, ...] = ("train", "validation", "test", "cost", "diagnostic")
DECISION_ROLES: tuple[str, ...] = ("test", "cost")


@dataclass(frozen=True)
class Metric:
    """One metric a study reports: its better direction, its role and, where one exists, its range.

    The range is what the metric can take at all (accuracy in [0, 1], an NLL >= 0), not what is
    typical: the contract loader uses it to refuse conditions that hold, or cannot hold, whatever
    the data (`test_acc >= -1`), relative margins on metrics that can be negative, and the verdict
    engine uses it to see values sitting at a bound (where a t-test's normality cannot hold).
    """

    direction: Direction
    role: Role
    low: float | None = None
    high: float | None = None

    def __post_init__(self):
        if self.direction not in ("higher", "lower"):
            raise ValueError(f"direction must be 'higher' or 'lower', got {self.direction!r}")
        if self.role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}, got {self.role!r}")
        if self.low is not None and self.high is not None and not self.low < self.high:
            raise ValueError(f"range low {self.low} must be below high {self.high}")

    @property
    def nonnegative(self) -> bool:
        return self.low is not None and self.low >= 0

    def at_bound(self, value: float) -> bool:
        return value == self.low or value == self.high

    def describe(self) -> str:
        lo = "-inf" if self.low is None else f"{self.low:g}"
        hi = "inf" if self.high is None else f"{self.high:g}"
        span = "" if self.low is None and self.high is None else f", range [{lo}, {hi}]"
        return f"{self.direction}, {self.role}{span}"


def proportion(direction: Direction, role: Role) -> Metric:
    """A share or rate in [0, 1] (accuracy, recall, hit rate)."""
    return Metric(direction, role, 0.0, 1.0)


def nonnegative(direction: Direction, role: Role) -> Metric:
    """A loss, divergence, error, count, latency or size: >= 0, no upper bound."""
    return Metric(direction, role, 0.0, None)


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


Device = Literal["auto", "cpu", "cuda"]


class DeviceConfig(StudyConfig):
    """An arm configuration for a study that honours `device`: `auto` (the default) runs on CUDA when
    torch sees a GPU, else on the CPU; `cpu` or `cuda` pins it (a contract may pin its arms)."""

    device: Device = "auto"


def resolve_device(choice: str) -> str:
    """`auto` -> "cuda" when torch sees a GPU, else "cpu"; `cpu` and `cuda` as they are."""
    import torch  # only here: gates never imports torch at module level

    if choice == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return choice


def device_unavailable(config: StudyConfig) -> str | None:
    """Why the arm's pinned device cannot be used here, else None."""
    if getattr(config, "device", None) != "cuda":
        return None
    import torch

    if not torch.cuda.is_available():
        return (f"the arm pins device cuda but torch {torch.__version__} sees no CUDA GPU here "
                f"(CUDA build: {torch.version.cuda or 'none'}); run it on a GPU machine or set device: auto")
    return None


def device_environment(config: StudyConfig) -> dict[str, str]:
    """What a run on this arm's device is computed with: device, torch and CUDA versions, GPU name and
    CPU threads. Recorded per run in the evidence and as MLflow params; {} for a study without `device`."""
    choice = getattr(config, "device", None)
    if choice is None:
        return {}
    import torch

    device = resolve_device(choice)
    env = {"device": device, "torch": torch.__version__, "cuda": torch.version.cuda or "none",
           "threads": str(torch.get_num_threads())}
    if device == "cuda":
        env["gpu"] = torch.cuda.get_device_name(0)
    return env


def recorded_threads(environment: dict | None) -> int | None:
    """The CPU thread count a recorded run's `environment` names, else None (recorded before it was)."""
    value = (environment or {}).get("threads")
    return int(value) if value is not None and str(value).isdigit() and int(value) > 0 else None


@contextlib.contextmanager
def cpu_threads(threads: int | None):
    """Run the block with torch on `threads` CPU threads (None: leave the count as it is), then restore it.
    How a CPU run's sums are split between threads changes their rounding, and training amplifies it:
    a re-run reproduces a recorded run only on the thread count it recorded (an sfe_v10 seed recorded
    on 1 thread ends alpha_cos 0.764 there and 0.731 on 2)."""
    if threads is None:
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class Study:
    """Base class for studies. Subclasses set `name`, `Config`, `metrics` and implement `run`."""

    name: ClassVar[str]
    Config: ClassVar[type[StudyConfig]]
    # metric name -> its declaration (better direction, role, range); every metric a contract may
    # name is listed here
    metrics: ClassVar[dict[str, Metric]]
    # a study whose metrics do not depend on random draws may let contracts use exact evaluation
    deterministic: ClassVar[bool] = False
    # metrics that measure the machine rather than the model (wall-clock speed, resident memory):
    # recorded, but a replay on another machine is not expected to reproduce them
    machine_metrics: ClassVar[frozenset[str]] = frozenset()

    def param_count(self, config: StudyConfig) -> int:
        """Trainable parameters of the model an arm builds (measured, not declared)."""
        raise NotImplementedError

    def parameter_parts(self, config: StudyConfig) -> dict[str, int]:
        """Trainable parameters by part (e.g. embeddings, encoder_reader, decoder), measured, for a
        capacity match of the parts being compared rather than of totals; {} when the study has none."""
        return {}

    def flops(self, config: StudyConfig) -> int | None:
        """Forward FLOPs per example where the study can count them, else None."""
        return None

    def check_ready(self, config: StudyConfig) -> str | None:
        """None when the arm can run here, else why not and how to fix it (e.g. a fetch command)."""
        return None

    def why_not_ready(self, config: StudyConfig) -> str | None:
        """What the platform asks before running an arm: its pinned device, then the study's own check."""
        return device_unavailable(config) or self.check_ready(config)

    def setup_missing(self, config: StudyConfig) -> str | None:
        """What re-running this arm here would first have to build that a run's recorded seconds do not
        include (e.g. a cached teacher to train, minutes), else None. Audits choose runs by their recorded
        seconds, so they leave such runs out and name why; `gates run` builds it."""
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
