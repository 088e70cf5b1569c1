"""One arm x seed run as a nested MLflow run (`_run_one`): the study called under the reporter and the
stop rules, what its run() returned checked against its declared metrics (`returned_metrics`), where
in the study's own code a failure happened (`study_error`), convergence judged, gate 5 measured
(`first_signal`). The run ends as a `RunRecord` (`run_record`), what the rest of execution passes on.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
import traceback
from pathlib import Path

from gates.entities import RunRecord, json_safe
from gates.errors import storage_error
from gates.execution._reporter import PlatformReporter
from gates.execution._stop_rules import StopRuleEngine, convergence
from gates.record import MLflowMetricSink, Tracker, close_after_interrupt, flatten_params
from gates.study import Halt, device_environment


def _run_one(
    loaded,
    tracker: Tracker,
    experiment_id,
    parent_id,
    base_tags,
    arm,
    cfg,
    seed,
    budget,
    progress,
    others: dict,
) -> tuple[RunRecord, dict]:
    """Train one arm x seed as a nested MLflow run; (its record, its metric histories)."""
    c, study = loaded.contract, loaded.study
    environment = device_environment(
        cfg
    )  # where it runs: recorded with it, and in the verdict's signature
    params = {
        **flatten_params(cfg.model_dump(mode="json")),
        "seed": str(seed),
        "contract_sha256": loaded.sha256,
        **{f"env.{k}": v for k, v in environment.items()},
    }
    env_tag = {"gates.environment": json.dumps(environment)} if environment else {}
    run_id = tracker.start_child(
        experiment_id,
        parent_id,
        f"{arm}/seed{seed}",
        params,
        {**base_tags, "gates.arm": arm, "gates.seed": str(seed), **env_tag},
    )
    sink = MLflowMetricSink(tracker.client, run_id)
    reporter = PlatformReporter(
        budget,
        StopRuleEngine(c.stop_rules, arm, study.metrics, others=others),
        sink,
        on_report=lambda step, m: progress.update(arm, seed, step, m),
    )
    status, halt_reason, halt_detail, error = "completed", None, None, None
    started = time.perf_counter()
    try:
        final = returned_metrics(c.study, study, study.run(cfg, seed, reporter), cfg)
    except Halt as halt:
        status, halt_reason, halt_detail, final = (
            "halted",
            halt.reason,
            str(halt),
            dict(reporter.last),
        )
    except KeyboardInterrupt:
        close_after_interrupt(sink.flush)
        close_after_interrupt(lambda: tracker.kill(run_id))
        raise
    except StudyInterfaceError as e:  # run returned what the study does not declare: failed, named
        status, halt_reason, halt_detail, final = "failed", "error", str(e), dict(reporter.last)
        error = {
            "type": "StudyInterfaceError",
            "message": str(e),
            "where": code_location(*_source_of(study.run)),
        }
    except Exception as e:  # a study crashed: record it, keep going with the other runs
        if storage_error(e) is not None:
            # a full disk or a read-only store (the metrics this run logs, a file the study writes) is
            # no failure of the study: the whole run stops, and its runs so far are reused next time
            raise
        status, halt_reason, final = "failed", "error", dict(reporter.last)
        error = study_error(e, study)  # where in the study's own code, not in torch's
        halt_detail = (
            f"study {c.study!r} raised {type(e).__name__} at {error['where']} in run(): {e}\n"
            f"{traceback.format_exc(limit=-8)}"
        )
    final = {k: float(v) for k, v in final.items()}
    seconds = round(time.perf_counter() - started, 3)
    point = c.preflight.falsifiable_point
    signal = (
        first_signal(point, reporter.history.get(point.metric, [])) if arm == point.arm else None
    )
    # at the last reported step: only what the reports did not log there (a metric measured once,
    # at the end) is new; the sink drops the points already logged
    sink.add(reporter.last_step, final)
    sink.flush()
    # Convergence: only a completed run is judged (a halted or failed one did not train to its end).
    judged = {}
    if c.convergence is not None and status == "completed":
        conv = c.convergence
        judged = convergence(
            conv, study.metrics[conv.metric].direction, reporter.history.get(conv.metric, [])
        )
    record = run_record(
        {
            "arm": arm,
            "seed": seed,
            "status": status,
            "halt_reason": halt_reason,
            "halt_detail": halt_detail,
            "metrics": final,
            "seconds": seconds,
            "first_signal": signal,
            "mlflow_run_id": run_id,
            **({"environment": environment} if environment else {}),
            **({"error": error} if error else {}),
            **judged,
        }
    )
    # the tags go on before the run is closed, so a finished run read back when resuming always has them
    if record.converged is not None:
        tracker.client.set_tag(run_id, "gates.converged", "true" if record.converged else "false")
        tracker.client.set_tag(
            run_id, "gates.convergence", json.dumps(record.convergence.as_dict())
        )
    tracker.finish_child(run_id, status, halt_reason, halt_detail, final, seconds, signal)
    return record, reporter.history


def run_record(data: dict) -> RunRecord:
    """A run's record from its JSON-like data (as it ends, or as MLflow holds it): a metric that is not
    finite is null, as evidence.json writes it, so the record is what the evidence will say."""
    return RunRecord.model_validate(json_safe(data))


class StudyInterfaceError(Exception):
    """A study's run() returned something other than its declared metrics (the run is failed)."""


def returned_metrics(name: str, study, returned, config=None) -> dict[str, float]:
    """What run() returned as {declared metric: float}: only declared metrics, numbers, inside their declared
    ranges, and (given the arm's `config`) every metric the study says the arm reports; a StudyInterfaceError
    naming the study otherwise."""
    if not hasattr(returned, "items"):
        raise StudyInterfaceError(
            f"study {name!r}: run() returned {type(returned).__name__}; expected a dict "
            f"of its final metrics (metric name -> number)"
        )
    final = {}
    for key, value in returned.items():
        if key not in study.metrics:
            raise StudyInterfaceError(
                f"study {name!r}: run() returned metric {key!r}, which the study does not "
                f"declare; expected only metrics of {type(study).__name__}.metrics "
                f"({', '.join(study.metrics)})"
            )
        try:
            final[key] = float(value)
        except (TypeError, ValueError):
            raise StudyInterfaceError(
                f"study {name!r}: run() returned {key} = {str(value)[:60]!r}, not a number"
            ) from None
        spec = study.metrics[key]
        if math.isfinite(final[key]) and not spec.contains(
            final[key]
        ):  # non-finite: the divergence rule's
            raise StudyInterfaceError(
                f"study {name!r}: run() returned {key} = {final[key]:.6g}, outside its declared "
                f"range ({spec.describe()})"
            )
    missing = sorted(study.reported_metrics(config) - set(final)) if config is not None else []
    if missing:
        raise StudyInterfaceError(
            f"study {name!r}: run() did not return {', '.join(missing)}, which the study says "
            f"this arm reports (reported_metrics); expected every one of them"
        )
    return final


def code_location(filename: str, line: int | None) -> str:
    """`path:line` of a source file as a reader finds it: relative to the innermost import root or the
    current folder that holds it (site-packages/my_study/study.py -> my_study/study.py)."""
    import sys

    path = Path(filename).resolve()
    roots = sorted(
        {Path.cwd().resolve(), *(Path(p).resolve() for p in sys.path if p)},
        key=lambda r: -len(r.parts),
    )
    for root in roots:
        try:
            shown = path.relative_to(root).as_posix()
            break
        except ValueError:
            continue
    else:
        shown = path.name
    return f"{shown}:{line}" if line else shown


def study_error(e: BaseException, study) -> dict:
    """A study's exception as the evidence records it: its type, its message in a line, and `where`:
    the innermost frame of the traceback in the study's own code (its package's folder, or its module
    when it is a top-level one), else the innermost outside the installed libraries, the standard
    library and the platform, else the innermost; a shape error raised deep in torch is said at the
    study's line that called torch. The whole traceback is the caller's to keep."""
    frames = traceback.extract_tb(e.__traceback__)
    own, foreign = _own_code(study), _library_roots()

    def under(filename: str, roots) -> bool:
        path = _resolved(filename)
        return any(path == root or root in path.parents for root in roots)

    frame = (
        next((f for f in reversed(frames) if under(f.filename, own)), None)
        or next((f for f in reversed(frames) if not under(f.filename, foreign)), None)
        or (frames[-1] if frames else None)
    )
    return {
        "type": type(e).__name__,
        "message": _one_line(e),
        "where": code_location(frame.filename, frame.lineno) if frame else "?",
    }


def _resolved(filename: str) -> Path:
    try:
        return Path(filename).resolve()
    except (OSError, RuntimeError):
        return Path(filename)


def _own_code(study) -> list[Path]:
    """The study's own source: the folder of the package its class's module is in, or that module's
    file when it is a top-level module (whose folder may be site-packages itself)."""
    import sys

    module = type(study).__module__
    package = module.rpartition(".")[0]
    found = sys.modules.get(package) if package else None
    if found is not None and getattr(found, "__file__", None):
        return [_resolved(found.__file__).parent]
    mine = getattr(sys.modules.get(module), "__file__", None)
    return [_resolved(mine)] if mine else []


def _library_roots() -> list[Path]:
    """Where code that is not a study's lives: the standard library, the installed packages and the
    platform (gates/)."""
    import site
    import sysconfig

    paths = {sysconfig.get_path(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    with contextlib.suppress(AttributeError):
        paths |= set(site.getsitepackages()) | {site.getusersitepackages()}
    roots = [_resolved(p) for p in paths if p]
    return roots + [Path(__file__).resolve().parents[1]]


def _source_of(function) -> tuple[str, int | None]:
    import inspect

    try:
        return inspect.getsourcefile(function) or "?", inspect.getsourcelines(function)[1]
    except (OSError, TypeError):
        return "?", None


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return text[:300] or "(no message)"


def first_signal(point, series: list[tuple[int, float]]) -> dict:
    """Gate 5 as measured: the falsifiable metric's last value at or before `by_step`, and whether it
    had reached the declared threshold by then (informational: the verdict comes from `decision`)."""
    seen = [(step, value) for step, value in series if step <= point.by_step]
    if not seen:
        return {"step": None, "value": None, "met": False}
    step, value = seen[-1]
    met = value >= point.threshold if point.direction == "higher" else value <= point.threshold
    return {"step": step, "value": value if math.isfinite(value) else None, "met": bool(met)}
