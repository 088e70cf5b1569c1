"""The reporter: a study's only channel to the platform (like Optuna's `trial.report`).

Each report goes to a metric sink (MLflow, batched) and to the stop rules; a halt raises inside
the study's loop. The reporter keeps the history the rules and the final record need.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from gates.execution._stop_rules import StopRuleEngine
from gates.study import Budget


class MetricSink(Protocol):
    def add(self, step: int, metrics: dict[str, float]) -> None: ...
    def flush(self) -> None: ...
    def attach(self, name: str, text: str) -> None: ...


class PlatformReporter:
    def __init__(
        self,
        budget: Budget,
        rules: StopRuleEngine,
        sink: MetricSink | None = None,
        on_report: Callable[[int, dict[str, float]], None] | None = None,
    ):
        self.budget = budget
        self.rules = rules
        self.sink = sink
        self.on_report = on_report
        self.history: dict[str, list[tuple[int, float]]] = {}
        self.last: dict[str, float] = {}
        self.last_step = 0

    def report(self, step: int, metrics: dict[str, float]) -> None:
        values = {name: _number(name, v) for name, v in metrics.items()}
        for name, v in values.items():
            self.history.setdefault(name, []).append((step, v))
        self.last.update(values)
        self.last_step = step
        if self.sink is not None:
            self.sink.add(step, values)
        if self.on_report is not None:
            self.on_report(step, values)
        halt = self.rules.check(step, values, self.history)
        if halt is not None:
            raise halt

    def attach(self, name: str, text: str) -> None:
        attach = getattr(self.sink, "attach", None)  # a sink that keeps no texts drops them
        if attach is not None:
            attach(name, text)


def _number(name: str, value) -> float:
    try:
        return float(value)  # accepts python numbers, numpy scalars and 0-d tensors
    except (TypeError, ValueError):
        raise TypeError(f"metric {name!r} must be a number, got {type(value).__name__}") from None
