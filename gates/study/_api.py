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


Scale = Literal["linear", "log"]
SCALES: tuple[str, ...] = ("linear", "log")
Estimand = Literal["mean", "geometric_mean", "median", "proportion"]
ESTIMANDS: tuple[str, ...] = ("mean", "geometric_mean", "median", "proportion")
# controls ask whether an arm works where it can (held-out data of its own distribution included): they
# may read validation metrics too, never a train metric (memorisation) or a diagnostic
CONTROL_ROLES: tuple[str, ...] = ("test", "cost", "validation")


@dataclass(frozen=True)
class Metric:
    """One metric a study reports: its better direction, its role, its range, its scale and what
    chance gives.

    The range is what the metric can take at all (accuracy in [0, 1], an NLL >= 0), not what is
    typical: the contract loader uses it to refuse conditions that hold, or cannot hold, whatever
    the data (`test_acc >= -1`), relative margins on metrics that can be negative, and the verdict
    engine uses it to see values sitting at a bound (where a t-test's normality cannot hold). A study
    that knows a tighter range for an arm (a rank is at most the node count) says so in
    `Study.metric_range`.

    The scale says how its per-seed values vary and so what a verdict estimates: `linear` (the
    default) for metrics whose seed-to-seed spread is roughly symmetric (accuracies away from their
    bounds, BLEU, NLLs, differences): conditions are about the mean. `log` for positive metrics whose
    spread is multiplicative and right-skewed (losses that shrink towards 0, perplexities, KLs, MSEs,
    errors, latencies): conditions are evaluated on the log values, i.e. about the geometric mean
    (a threshold) and ratios of geometric means (a compare, with a relative margin). A t-test on the
    raw values of a right-skewed metric does not keep its level (the README's simulation table).

    `chance` is what an arm that learned nothing scores (majority class, uniform guessing), where the
    study knows it; conditions that an arm at chance would pass are refused. `unit` names what the
    values measure (e.g. "nats"): a condition may compare two different metrics only when they share
    a unit (or, paired, come from the same runs).
    """

    direction: Direction
    role: Role
    low: float | None = None
    high: float | None = None
    scale: Scale = "linear"
    chance: float | None = None
    unit: str | None = None
    # why a metric that is positive, unbounded above and better lower (a loss, an error, a latency) stays
    # linear: the design rules refuse conditions reading such a metric without it (`scales`)
    linear_reason: str | None = None
    # what a condition on this metric estimates unless it declares its own `estimand` (default_estimand)
    estimand: Estimand | None = None

    def __post_init__(self):
        if self.direction not in ("higher", "lower"):
            raise ValueError(f"direction must be 'higher' or 'lower', got {self.direction!r}")
        if self.role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}, got {self.role!r}")
        if self.low is not None and self.high is not None and not self.low < self.high:
            raise ValueError(f"range low {self.low} must be below high {self.high}")
        if self.scale not in SCALES:
            raise ValueError(f"scale must be one of {', '.join(SCALES)}, got {self.scale!r}")
        if self.scale == "log" and (self.low is None or self.low < 0):
            raise ValueError(
                "a log-scale metric is positive: declare low = 0 (its values must be > 0)"
            )
        if (
            self.estimand is not None
            and self.estimand not in ESTIMANDS
            or self.estimand == "proportion"
        ):
            raise ValueError(
                f"estimand must be one of mean, geometric_mean, median (a proportion needs a "
                f"condition's share), got {self.estimand!r}"
            )
        if self.chance is not None and not self.contains(self.chance):
            raise ValueError(f"chance {self.chance} lies outside the range {self.describe()}")

    @property
    def default_estimand(self) -> str:
        """What a condition on this metric estimates unless it declares otherwise: the declared
        `estimand`, else the geometric mean on the log scale, the median of a metric bounded on both
        sides (an accuracy, a share, BLEU: at 3-10 seeds no test of such a mean has power, since a seed
        that may collapse to the bound cannot be ruled out), else the mean."""
        if self.estimand:
            return self.estimand
        if self.scale == "log":
            return "geometric_mean"
        return "median" if self.low is not None and self.high is not None else "mean"

    @property
    def skewed_linear(self) -> bool:
        """Positive, unbounded above, better lower, declared linear with no reason given: what a loss,
        an error or a latency looks like, whose right-skewed per-seed values a t-test on the linear
        scale does not judge at its level."""
        return (
            self.scale == "linear"
            and self.direction == "lower"
            and self.nonnegative
            and self.high is None
            and not self.linear_reason
        )

    @property
    def nonnegative(self) -> bool:
        return self.low is not None and self.low >= 0

    def contains(self, value: float) -> bool:
        """Whether a value lies in the declared range (a value outside it is not a measurement of this metric),
        up to float rounding at the bound (sacrebleu's BLEU of a perfect match is 100.00000000000004)."""

        def slack(bound: float) -> float:
            return 1e-9 * max(1.0, abs(bound))

        return (self.low is None or value >= self.low - slack(self.low)) and (
            self.high is None or value <= self.high + slack(self.high)
        )

    def at_bound(self, value: float) -> bool:
        return value == self.low or value == self.high

    def describe(self) -> str:
        lo = "-inf" if self.low is None else f"{self.low:g}"
        hi = "inf" if self.high is None else f"{self.high:g}"
        span = "" if self.low is None and self.high is None else f", range [{lo}, {hi}]"
        extra = "".join(
            [
                ", log scale" if self.scale == "log" else "",
                f", chance {self.chance:g}" if self.chance is not None else "",
                f", unit {self.unit}" if self.unit else "",
            ]
        )
        return f"{self.direction}, {self.role}{span}{extra}"


def proportion(
    direction: Direction, role: Role, chance: float | None = None, unit: str | None = None
) -> Metric:
    """A share or rate in [0, 1] (accuracy, recall, hit rate); `chance`: what guessing scores; `unit`:
    a share of what (two metrics compared with each other must be shares of the same thing)."""
    return Metric(direction, role, 0.0, 1.0, chance=chance, unit=unit)


def nonnegative(direction: Direction, role: Role, linear_reason: str | None = None) -> Metric:
    """A count, size or score >= 0 with no upper bound whose per-seed spread is roughly symmetric (it
    may be exactly 0). A right-skewed positive metric (a loss, error, KL or latency) is `positive`; one
    better lower that stays linear says why (`linear_reason`)."""
    return Metric(direction, role, 0.0, None, linear_reason=linear_reason)


def positive(direction: Direction, role: Role, unit: str | None = None) -> Metric:
    """A positive, right-skewed metric on the log scale (a loss shrinking towards 0, a perplexity, KL,
    MSE, error or latency): conditions are about its geometric mean and ratios (relative margins)."""
    return Metric(direction, role, 0.0, None, scale="log", unit=unit)


@dataclass(frozen=True)
class Ceiling:
    """The best any arm can do on a metric: a `value` known before the run, or a `metric` each run
    reports (its per-seed values are the ceiling of that seed), with why."""

    why: str
    value: float | None = None
    metric: str | None = None

    def __post_init__(self):
        if (self.value is None) == (self.metric is None):
            raise ValueError(
                "a ceiling is either a value known before the run or a metric the runs report"
            )


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
        return (
            f"the arm pins device cuda but torch {torch.__version__} sees no CUDA GPU here "
            f"(CUDA build: {torch.version.cuda or 'none'}); run it on a GPU machine or set device: auto"
        )
    return None


def device_environment(config: StudyConfig) -> dict[str, str]:
    """What a run on this arm's device is computed with: device, torch and CUDA versions, GPU name, CPU
    threads and the CPU kernels torch dispatches to (`cpu`: ATen's capability, AVX2, AVX512, ...:
    their rounding differs, and a chaotic run diverges between them). Recorded per run in the evidence
    and as MLflow params; {} for a study without `device`."""
    choice = getattr(config, "device", None)
    if choice is None:
        return {}
    import torch

    device = resolve_device(choice)
    env = {
        "device": device,
        "torch": torch.__version__,
        "cuda": torch.version.cuda or "none",
        "threads": str(torch.get_num_threads()),
        "cpu": torch.backends.cpu.get_cpu_capability(),
    }
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
    # arm config fields a contract's `tuning` may search (learning rates, regularisation): what an arm
    # is (its model, its kernel) is what a contract compares, never something a search picks
    hyperparameters: ClassVar[frozenset[str]] = frozenset()
    # arm config fields that set the data and training regime several contracts share (the teacher, its
    # layer): contracts with the same values are siblings, and when one is superseded because of its
    # regime the others are flagged until they are superseded or withdrawn too
    regime_fields: ClassVar[tuple[str, ...]] = ()
    # whether arms train: a new contract on a training study declares a convergence rule (or why not)
    trains: ClassVar[bool] = True

    def param_count(self, config: StudyConfig) -> int:
        """Trainable parameters of the model an arm builds (measured, not declared)."""
        raise NotImplementedError

    def parameter_parts(self, config: StudyConfig) -> dict[str, int]:
        """Trainable parameters by part (e.g. embeddings, encoder_reader, decoder), measured, for a
        capacity match of the parts being compared rather than of totals; {} when the study has none."""
        return {}

    def metric_range(self, metric: str, config: StudyConfig) -> tuple[float | None, float | None]:
        """The range an arm can reach on `metric` (default: the declared one); a study that knows a
        tighter one for an arm's config says so (a mean rank is at most the tree's node count)."""
        spec = self.metrics[metric]
        return spec.low, spec.high

    def chance(self, metric: str, config: StudyConfig) -> float | None:
        """What an arm that learned nothing scores on `metric` (default: the declared `chance`)."""
        return self.metrics[metric].chance

    def reported_metrics(self, config: StudyConfig) -> frozenset[str]:
        """The metrics an arm with this config reports (default: every declared one); a condition on a
        metric the arm cannot report is refused, and a completed run that lacks one has failed."""
        return frozenset(self.metrics)

    def ceiling(self, metric: str, config: StudyConfig) -> Ceiling | None:
        """What the best possible arm reaches on `metric`, where the study knows it: a value known before
        the run (the accuracy label noise allows), or another metric each run reports (the mass the best
        leaves hold). A bar beyond it tests nothing: `gates check` refuses it, or the verdict is invalid."""
        return None

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
        include (e.g. a cached teacher to train, minutes), else None. Audits stop a re-run at its reports
        when their time cannot finish it, which cannot stop a setup before the first report, so they
        leave such runs out and name why, unless `setup_seconds` says their time covers it; `gates run`
        builds it."""
        return None

    def setup_seconds(self, config: StudyConfig) -> float | None:
        """About how long `setup` takes here (one core like the recording machine's); None: unknown, and
        an audit never builds it. An audit builds a missing setup only when its time left covers this
        and the run, both times its safety factor."""
        return None

    def setup(self, config: StudyConfig) -> None:
        """Build what `setup_missing` names (e.g. train and cache a teacher); the default has none."""

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
