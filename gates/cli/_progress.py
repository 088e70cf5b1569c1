"""The one display of a run's progress (gates.execution's `Progress` protocol: start, update, end,
tuning_trial), in two faces: `RichProgress` for people (a bar per arm x seed, or a line per run off a
terminal) and `JsonProgress` for machines (`gates run --json`: JSON lines on stdout). Both say the
whole run's progress the same way (`Overall`); `progress_display` picks the face. A run's end comes
as its `RunRecord` (gates.entities); a tuning trial as its `TrialRecord`."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING

from gates.cli._common import out

if TYPE_CHECKING:
    from gates.entities import RunRecord


def progress_display(loaded, as_json: bool) -> RichProgress | JsonProgress:
    return JsonProgress(loaded) if as_json else RichProgress(loaded)


class Overall:
    """The whole run's progress, said after each run: runs done of those planned (arms x seeds; a
    sequential contract may stop at an earlier look: "of at most N"), reused or not run, the time
    elapsed and about how long is left: the runs left x the pace of the runs trained so far (time since
    the first started / runs trained, so that on several workers it is their joint pace)."""

    def __init__(self, loaded):
        c = loaded.contract
        self.planned = len(loaded.arm_configs) * len(c.seeds)
        self.at_most = c.sequential is not None
        self.done = self.reused = self.not_run = 0
        self.began = time.monotonic()
        self.first_trained: float | None = None  # when the first run that trains began
        self.skipped: set[tuple[str, int]] = set()  # runs taken from MLflow or not run

    def start(self, arm, seed, skipped=None) -> None:
        if skipped is not None:
            self.skipped.add((arm, seed))
        elif self.first_trained is None:
            self.first_trained = time.monotonic()

    def end(self, record: RunRecord) -> None:
        self.done += 1
        if (record.arm, record.seed) in self.skipped:
            if record.status == "skipped":  # its arm kept failing (stop_rules.failures)
                self.not_run += 1
            else:
                self.reused += 1

    def eta_s(self) -> float | None:
        trained = self.done - self.reused - self.not_run
        if not trained or self.first_trained is None:
            return None  # no pace yet
        pace = (time.monotonic() - self.first_trained) / trained
        return pace * max(self.planned - self.done, 0)

    def as_dict(self) -> dict:
        eta = self.eta_s()
        return {
            "done": self.done,
            "planned": self.planned,
            "at_most": self.at_most,
            "reused": self.reused,
            "not_run": self.not_run,
            "elapsed_s": round(time.monotonic() - self.began, 3),
            "eta_s": None if eta is None else round(eta, 3),
        }

    def line(self) -> str:
        counts = ", ".join(
            [f"{self.reused} reused"] * bool(self.reused)
            + [f"{self.not_run} not run"] * bool(self.not_run)
        )
        text = f"run {self.done} of {'at most ' * self.at_most}{self.planned} done"
        text += f" ({counts})" if counts else ""
        text += f"; {duration(time.monotonic() - self.began)} elapsed"
        eta = self.eta_s()
        if eta is not None and self.done < self.planned:
            text += f"; about {duration(eta)} left"
        return text


def duration(seconds: float) -> str:
    """45s, 1m 20s, 2h 05m."""
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    return f"{s // 3600}h {s % 3600 // 60:02d}m"


class RichProgress:
    """One progress bar per arm x seed with the live value of the contract's falsifiable metric, and the
    whole run's progress (Overall): a line after each run, or the first bar on a terminal."""

    def __init__(self, loaded):
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        self.metric = loaded.contract.preflight.falsifiable_point.metric
        self.bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[live]}"),
            console=out,
            disable=not out.is_terminal,
        )
        self.tasks = {}
        self.overall = Overall(loaded)
        self.all_runs = self.bar.add_task(
            "all runs", total=self.overall.planned, live=self.overall.line()
        )

    def __enter__(self):
        self.bar.__enter__()
        return self

    def __exit__(self, *exc):
        return self.bar.__exit__(*exc)

    def start(self, arm, seed, steps, skipped=None):
        self.overall.start(arm, seed, skipped)
        self.tasks[(arm, seed)] = self.bar.add_task(f"{arm} seed {seed}", total=steps, live="")
        if skipped is not None:
            self.bar.update(self.tasks[(arm, seed)], completed=steps, live="reused")

    def update(self, arm, seed, step, metrics):
        value = metrics.get(self.metric)  # (a record's final metrics: None where not finite)
        live = f"{self.metric}={value:.4g}" if value is not None else ""
        self.bar.update(self.tasks[(arm, seed)], completed=step, live=live)

    def end(self, record: RunRecord):
        value = record.metrics.get(self.metric)
        shown = f"{self.metric}={value:.4g}" if isinstance(value, float) else ""
        halt = f" ({record.halt_reason})" if record.halt_reason else ""
        if record.status == "failed" and record.halt_detail:  # what the study did, by name
            halt += f": {record.halt_detail.splitlines()[0][:300]}"
        line = f"{record.arm} seed {record.seed}: {record.status}{halt} {shown}"
        self.overall.end(record)
        if self.bar.disable:
            out.print(line, markup=False, highlight=False)
            out.print(self.overall.line(), markup=False, highlight=False)
        else:
            self.bar.update(
                self.tasks[(record.arm, record.seed)], live=f"{record.status}{halt} {shown}"
            )
            self.bar.update(self.all_runs, completed=self.overall.done, live=self.overall.line())

    def tuning_trial(self, trial):
        value = f" {trial.value:.4g}" if trial.value is not None else ""
        halt = f" ({trial.halt_reason})" if trial.halt_reason else ""
        params = ", ".join(
            f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in trial.params.items()
        )
        out.print(
            f"tuning {trial.arm} trial {trial.number}: {params}: {trial.state}{halt}{value}",
            markup=False,
            highlight=False,
        )

    def error(self, code: str, message: str) -> None:
        """A task's error: people read it in the one line on stderr the command prints."""


class JsonProgress:
    """JSON lines on stdout: a `run` event per run, each followed by a `progress` event (Overall)."""

    RUN = ("arm", "seed", "status", "halt_reason", "metrics", "mlflow_run_id")
    TRIAL = ("arm", "number", "params", "state", "value", "halt_reason", "mlflow_run_id")

    def __init__(self, loaded):
        self.overall = Overall(loaded)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def start(self, arm, seed, steps, skipped=None):
        self.overall.start(arm, seed, skipped)

    def update(self, arm, seed, step, metrics):
        pass

    def end(self, record: RunRecord):
        fields = record.as_dict()  # the record as JSON: a metric that is not finite is null
        _event({"event": "run", **{k: fields.get(k) for k in self.RUN}})
        self.overall.end(record)
        _event({"event": "progress", **self.overall.as_dict()})

    def tuning_trial(self, trial):
        _event({"event": "tuning_trial", **{k: getattr(trial, k) for k in self.TRIAL}})

    def error(self, code: str, message: str) -> None:
        """A task's error, as an error object in the stream (a program reads JSON either way)."""
        _event({"error": {"code": code, "message": message}})


def _event(obj: dict) -> None:
    print(json.dumps(obj), flush=True)
