"""MLflow glue: one parent run per contract, one nested run per arm x seed, metrics in batches.

The default store is the embedded SQLite database `sqlite:///mlflow.db` (open it with
`mlflow ui --backend-store-uri sqlite:///mlflow.db`); `--tracking-uri` or MLFLOW_TRACKING_URI
point elsewhere (a shared `mlflow server`, say).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gates.entities import RunRecord, json_safe

DEFAULT_URI = "sqlite:///mlflow.db"
BATCH = 1000  # MLflow accepts at most 1000 metrics per log_batch call
FLUSH_SECONDS = 5.0  # so the MLflow UI shows a long run's curves while it trains
# MLflow 3's UI opens an experiment in the view of its declared kind, and one without the tag in its
# GenAI view (traces, no runs table): gates' experiments are model training. The key and value are
# MLflow's (its UI's ExperimentKind, set by its "Experiment type" choice: "Machine learning").
EXPERIMENT_KIND = ("mlflow.experimentKind", "custom_model_development")
# MLflow 3's UI opens a view shared by URL (`#/experiments/<id>/runs?viewStateShareKey=KEY`) from the
# experiment tag `mlflow.sharedViewState.KEY`: JSON of its search facets and UI state (charts,
# grouping). Other chart choices live in the browser only. gates writes one per contract: the arms'
# view (`arms_view`, docs/mlflow.md).
SHARED_VIEW_PREFIX = "mlflow.sharedViewState."
ARMS_VIEW = "gates-arms"
MAX_TAG = 20000  # MLflow's longest experiment tag value (MAX_EXPERIMENT_TAG_VAL_LENGTH in 3.x)
# What `gates withdraw` sets on a claim's parent run; a new attempt recorded on that run clears them
WITHDRAWAL_TAGS = ("gates.withdrawn", "gates.withdrawal_reason", "gates.recorded_verdict")


def resolve_uri(uri: str | None) -> str:
    return uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_URI


def open_client(uri: str, *, create: bool = True):
    """An MlflowClient for `uri`. A SQLite store is checked first (gates/record/_store.py): a missing one is
    built all-or-nothing (unless not `create`: the read-only dashboard), a damaged one is a one-line
    StoreError naming the file and the fix."""
    # MLflow is imported lazily: `gates check` and `gates verify` need no tracking store.
    # a tracking server makes MLflow print "View run ... at: URL" on stdout for every closed run (after
    # one more request per run): that would break `--json` output and slow many workers down
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
    from mlflow import MlflowClient

    # after the import, which configures MLflow's loggers: keep its INFO chatter out of our output
    for name in ("mlflow", "alembic"):
        logging.getLogger(name).setLevel(logging.WARNING)

    from gates.record import _store as store

    _name_storage_errors()
    store.ensure(uri, create=create)
    return MlflowClient(tracking_uri=uri)


_named: list[bool] = []  # _name_storage_errors has run in this process


def _name_storage_errors() -> None:
    """A full or read-only database (SQLITE_FULL, SQLITE_READONLY) is one line naming its file
    (gates.errors.storage_error), not a traceback: SQLAlchemy's errors do not say which database
    failed, so each is given its engine's file; and MLflow's logged traceback of such an error, or of
    a busy one (it logs one per failed session before raising), is dropped, the error itself still
    raised: gates says what it means (a busy store after Ctrl-C: `close_after_interrupt`)."""
    if _named:
        return
    import sqlalchemy
    from sqlalchemy import event

    from gates.errors import DATABASE_ATTR, storage_error, store_busy

    def name(context) -> None:
        if context.engine is not None and context.engine.url.database:
            with contextlib.suppress(AttributeError, TypeError):  # a DBAPI error without a __dict__
                setattr(context.original_exception, DATABASE_ATTR, context.engine.url.database)

    def keep(record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return error is None or (storage_error(error) is None and not store_busy(error))

    event.listen(sqlalchemy.engine.Engine, "handle_error", name)
    logging.getLogger("mlflow.store.db.utils").addFilter(keep)
    _named.append(True)


def flatten_params(config: dict, prefix: str = "") -> dict[str, str]:
    """Nested config -> {"a.b": "value"}; lists as JSON so they read back unambiguously."""
    flat = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten_params(value, name + "."))
        else:
            flat[name] = json.dumps(value) if isinstance(value, (list, tuple)) else str(value)
    return flat


def base_tags(loaded, prov) -> dict[str, str]:
    """The tags every MLflow run of a contract carries (its parent run, arm x seed runs, tuning
    trials): what `gates run` finds its runs by, and what the MLflow UI filters and groups them by.
    `loaded`: a LoadedContract; `prov`: the Provenance measured at the start of the run."""
    return {
        "gates.contract": loaded.contract.id,
        "gates.contract_sha256": loaded.sha256,
        "gates.code_sha256": prov.code_sha256,
        "gates.git_commit": prov.git_commit,
        "gates.git_dirty": prov.git_dirty,
        "gates.study": loaded.contract.study,
    }


def arms_view(contract) -> str:
    """The shared view a reviewer lands on: the arm x seed runs alone (no parent, no tuning trials),
    grouped by arm (mean, with the range of seeds), one line chart over steps per metric a reviewer
    needs to see move (`plotted_metrics`: the decision's first), in a section of its own."""
    from gates.record._plots import plotted_metrics

    section = "gates-decision"
    charts = [
        {
            "uuid": f"gates-chart-{i}",
            "type": "LINE",
            "runsCountToCompare": 100,
            "metricSectionId": section,
            "deleted": False,
            "isGenerated": False,
            "displayName": metric,
            "metricKey": metric,
            "selectedMetricKeys": [metric],
            "lineSmoothness": 0,
            "xAxisKey": "step",
            "xAxisScaleType": "linear",
            "scaleType": "linear",
            "range": {},
            "selectedXAxisMetricKey": "",
            "yAxisKey": "metric",
            "yAxisExpressions": [],
            "ignoreOutliers": False,
            "useGlobalXaxisKey": False,
            "useGlobalLineSmoothing": False,
        }
        for i, metric in enumerate(plotted_metrics(contract))
    ]
    view = {
        "searchFilter": "tags.`gates.role` = 'run'",
        "orderByKey": "attributes.start_time",
        "orderByAsc": False,
        "groupBy": {
            "aggregateFunction": "average",
            "groupByKeys": [{"mode": "tag", "groupByData": "gates.arm"}],
        },
        "useGroupedValuesInCharts": True,
        "runListHidden": True,  # the charts get the page's width; one click shows the runs
        "compareRunCharts": charts,
        "compareRunSections": [
            {
                "uuid": section,
                "name": f"{contract.id}: what the decision reads",
                "display": True,
                "isReordered": False,
                "deleted": False,
                "isGenerated": False,
            }
        ],
    }
    # an experiment tag holds at most MAX_TAG characters: the last charts (the decision's come first)
    # give way rather than the run failing on a contract that names many metrics
    while len(json.dumps(view)) > MAX_TAG and len(charts) > 1:
        charts.pop()
    return json.dumps(view)


class MLflowMetricSink:
    """Buffers metric points and writes them with log_batch, not one database call per value. Each
    (metric, step) is written once: a point already written at that step (the last report, then the
    run's returned metrics at the same step) is dropped, so MLflow's history has no doubled step."""

    def __init__(self, client, run_id: str):
        self.client = client
        self.run_id = run_id
        self.buffer: list = []
        self.last_flush = time.monotonic()
        self.logged: set[tuple[str, int]] = set()

    def add(self, step: int, metrics: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        fresh = {name: v for name, v in metrics.items() if (name, step) not in self.logged}
        self.logged.update((name, step) for name in fresh)
        self.buffer.extend(Metric(name, value, now, step) for name, value in fresh.items())
        if len(self.buffer) >= BATCH or time.monotonic() - self.last_flush > FLUSH_SECONDS:
            self.flush()

    def attach(self, name: str, text: str) -> None:
        """A text artifact of the run (e.g. sample translations), shown in the MLflow UI."""
        self.client.log_text(self.run_id, text, name)

    def flush(self) -> None:
        # a batch leaves the buffer once logged, so that a failed flush can be tried again
        while self.buffer:
            self.client.log_batch(self.run_id, metrics=self.buffer[:BATCH])
            self.buffer = self.buffer[BATCH:]
        self.last_flush = time.monotonic()


class Tracker:
    """The MLflow side of one `gates run`."""

    def __init__(self, uri: str):
        self.uri = uri
        self.client = open_client(uri)

    def experiment_id(self, contract_id: str) -> str:
        """The contract's experiment, created or restored, declared a training experiment (an
        experiment created by an older gates gets the kind on first use; a kind chosen in the UI is
        kept)."""
        key, kind = EXPERIMENT_KIND
        found = self.client.get_experiment_by_name(contract_id)
        if found is None:
            return self.client.create_experiment(
                contract_id, tags={"gates.contract": contract_id, key: kind}
            )
        if found.lifecycle_stage == "deleted":
            self.client.restore_experiment(found.experiment_id)
        if key not in found.tags:
            self.client.set_experiment_tag(found.experiment_id, key, kind)
        return found.experiment_id

    def open_parent(self, loaded, prov, fresh: bool = False) -> tuple[str, str, dict[str, str]]:
        """(experiment id, parent run id, base tags) of a contract: its parent run found (same
        contract hash and code, unless `fresh`) or created, as `gates run` and tuning both need."""
        tags = base_tags(loaded, prov)
        experiment_id = self.experiment_id(loaded.contract.id)
        self.client.set_experiment_tag(
            experiment_id, SHARED_VIEW_PREFIX + ARMS_VIEW, arms_view(loaded.contract)
        )
        parent_id, _ = self.parent_run(
            experiment_id,
            {
                **tags,
                "gates.claim": loaded.contract.claim[:5000],
                "mlflow.source.git.commit": prov.git_commit,
            },
            fresh,
        )
        return experiment_id, parent_id, tags

    def parent_run(self, experiment_id: str, tags: dict[str, str], fresh: bool) -> tuple[str, bool]:
        """Reuse the parent run of the same contract hash and code, unless `fresh`; (run_id, reused)."""
        if not fresh:
            found = self.client.search_runs(
                [experiment_id],
                filter_string=(
                    f"tags.`gates.role` = 'contract' and "
                    f"tags.`gates.contract_sha256` = '{tags['gates.contract_sha256']}' and "
                    f"tags.`gates.code_sha256` = '{tags['gates.code_sha256']}'"
                ),
                order_by=["attributes.start_time DESC"],
                max_results=1,
            )
            if found:
                run_id = found[0].info.run_id
                self.client.update_run(run_id, status="RUNNING")
                return run_id, True
        run = self.client.create_run(
            experiment_id,
            tags={**tags, "gates.role": "contract"},
            run_name=f"{tags['gates.contract']}@{tags['gates.contract_sha256'][:8]}",
        )
        return run.info.run_id, False

    def child_runs(self, experiment_id: str, parent_id: str) -> list:
        return list(
            self.client.search_runs(
                [experiment_id],
                filter_string=f"tags.mlflow.parentRunId = '{parent_id}'",
                max_results=10000,
            )
        )

    def start_child(
        self,
        experiment_id: str,
        parent_id: str,
        name: str,
        params: dict[str, str],
        tags: dict[str, str],
    ) -> str:
        from mlflow.entities import Param, RunTag

        run = self.client.create_run(
            experiment_id,
            tags={
                **tags,
                "mlflow.parentRunId": parent_id,
                "gates.role": "run",
                "gates.status": "running",
            },
            run_name=name,
        )
        self.client.log_batch(
            run.info.run_id,
            params=[Param(k, v[:6000]) for k, v in params.items()],
            tags=[RunTag(k, v) for k, v in tags.items()],
        )
        return run.info.run_id

    def finish_child(
        self,
        run_id: str,
        status: str,
        halt_reason: str | None,
        halt_detail: str | None,
        final_metrics: dict[str, float],
        seconds: float,
        first_signal: dict | None,
    ) -> None:
        """Tag and close an arm x seed run. Its final metrics are logged through its sink (each
        (metric, step) once); the tag keeps them as the run returned them, for resuming."""
        from mlflow.entities import RunTag

        tags = {
            "gates.status": status,
            "gates.halt_reason": halt_reason or "",
            "gates.final_metrics": json.dumps(final_metrics),
            "gates.seconds": str(seconds),
            "gates.first_signal": json.dumps(first_signal),
        }
        if halt_detail:
            tags["gates.halt_detail"] = halt_detail[:5000]
        self.client.log_batch(run_id, tags=[RunTag(k, v) for k, v in tags.items()])
        mlflow_status = {"completed": "FINISHED", "halted": "FINISHED", "failed": "FAILED"}.get(
            status, "KILLED"
        )
        self.client.set_terminated(run_id, status=mlflow_status)

    def finish_parent(
        self,
        run_id: str,
        tags: dict[str, str],
        metrics: dict[str, float],
        artifacts: list[str],
        status: str = "FINISHED",
        clear: tuple[str, ...] = (),
    ) -> None:
        """Log the contract's outcome on its parent run and close it; the `clear` tags are removed
        (a parent run is reused by the next attempt of the same contract and code, which must not
        inherit an earlier attempt's withdrawal)."""
        from mlflow.entities import Metric, RunTag

        now = int(time.time() * 1000)
        self.client.log_batch(
            run_id,
            metrics=[Metric(k, v, now, 0) for k, v in metrics.items()],
            tags=[RunTag(k, v) for k, v in tags.items()],
        )
        if clear:
            for key in set(clear) & set(self.client.get_run(run_id).data.tags):
                self.client.delete_tag(run_id, key)
        for path in artifacts:
            self.client.log_artifact(run_id, path)
        self.client.set_terminated(run_id, status=status)

    def history(self, run_id: str, metric: str) -> list[tuple[int, float]]:
        """A metric's (step, value) series as logged, in step order."""
        return sorted((m.step, m.value) for m in self.client.get_metric_history(run_id, metric))

    def kill(self, run_id: str) -> None:
        from mlflow.entities import RunTag

        self.client.log_batch(run_id, tags=[RunTag("gates.status", "killed")])
        self.client.set_terminated(run_id, status="KILLED")


def close_after_interrupt(close: Callable[[], Any], attempts: int = 2, wait: float = 0.5) -> None:
    """`close` (closing runs after Ctrl-C), tried again while the store is busy: an interrupted driver
    and its cancelled tasks close their runs at the same moment, and SQLite lets one write at a time.
    One more try, not several: each try already waits out MLflow's busy timeout (20 s) for the lock,
    so that more tries would only keep the user waiting after an interrupt.
    Left undone when the store stays busy or cannot be written: the next `gates run` closes what stayed
    RUNNING, as after a kill. The interrupt is what the user sees, never this; any other error is
    raised."""
    from gates.errors import storage_error, store_busy

    for attempt in range(attempts):
        try:
            close()
            return
        except Exception as e:
            busy = store_busy(e)
            if not busy and storage_error(e) is None:
                raise
            if not busy or attempt == attempts - 1:
                return
            time.sleep(wait)


# a child run's statuses (its `gates.status` tag) whose record a later `gates run` reuses
FINISHED = ("completed", "halted")


def finished_record(run: Any) -> RunRecord | None:
    """The record of a finished (completed or halted) child run, read back from its MLflow tags (for
    resuming: what verify re-derives the verdict from), keys in evidence.json's order; None for a run
    that did not finish (a killed one's tags may lack fields)."""
    tags = run.data.tags
    if tags.get("gates.status") not in FINISHED or run.info.status != "FINISHED":
        return None
    record = {
        "arm": tags.get("gates.arm"),
        "seed": int(tags.get("gates.seed", "-1")),
        "status": tags.get("gates.status"),
        "halt_reason": tags.get("gates.halt_reason") or None,
        "halt_detail": tags.get("gates.halt_detail") or None,
        "metrics": json.loads(tags.get("gates.final_metrics", "{}")),
        "seconds": float(tags.get("gates.seconds", "nan")),
        "first_signal": json.loads(tags.get("gates.first_signal", "null")),
        "mlflow_run_id": run.info.run_id,
    }
    converged = {"true": True, "false": False}.get(tags.get("gates.converged", ""))
    if converged is not None:  # judged for convergence (a completed run under a convergence rule)
        record.update(
            converged=converged, convergence=json.loads(tags.get("gates.convergence", "null"))
        )
    if tags.get("gates.environment"):  # where it ran; absent for a study without a device
        environment = json.loads(tags["gates.environment"])
        if environment:
            record["environment"] = environment
    # a metric that is not finite is null, as evidence.json writes it
    return RunRecord.model_validate(json_safe(record))


def pilot_runs(uri: str, contract_id: str, contract_path: Path | None = None) -> list:
    """The pilot runs of contract `contract_id` in the store `uri` (`gates pilot`), oldest first, as
    PilotRecords; [] when the store has no experiment of that id. `contract_path`: the contract file,
    whose first commit says which pilots ran before the contract was registered."""
    from gates.record._store import COMPLETE, inspect, sqlite_path

    path = sqlite_path(uri)
    found = None
    if path is not None:
        if not path.is_file():
            return []  # no store yet
        found = _sqlite_pilots(path, contract_id)
        if found is None and inspect(path).state != COMPLETE:
            return []  # a store MLflow cannot read as it is: `gates run` says why
    if found is None:  # another store, or a schema the queries do not know: MLflow reads it
        client = open_client(uri, create=False)
        experiment = client.get_experiment_by_name(contract_id)
        if experiment is None:
            return []
        found = [
            (run.info.run_id, run.info.start_time, run.data.tags)
            for run in client.search_runs(
                [experiment.experiment_id],
                filter_string="tags.`gates.pilot` = 'true' and tags.`gates.role` = 'run'",
                order_by=["attributes.start_time ASC"],
                max_results=10000,
            )
        ]
    registered = _first_commit_time(contract_path) if contract_path is not None else None
    return [_pilot_record(*run, registered) for run in found]


def _pilot_record(run_id: str, start_ms: int, tags: dict[str, str], registered: float | None):
    """One pilot run as a PilotRecord, from its tags (what `gates pilot` wrote on it)."""
    from datetime import datetime, timezone

    from gates.record._evidence import PilotRecord

    started = start_ms / 1000.0
    metrics = json.loads(tags.get("gates.final_metrics", "{}"))
    return PilotRecord(
        arm=tags.get("gates.arm"),
        seed=int(tags.get("gates.seed", "-1")),
        steps=int(tags.get("gates.pilot_steps", "0")),
        status=tags.get("gates.status") or "running",
        metrics={k: v for k, v in metrics.items() if _finite(v)},
        started=datetime.fromtimestamp(started, timezone.utc).isoformat(timespec="seconds"),
        contract_sha256=tags.get("gates.contract_sha256", ""),
        git_commit=tags.get("gates.git_commit", ""),
        mlflow_run_id=run_id,
        before_registration=None if registered is None else started < registered,
    )


def _sqlite_pilots(path: Path, contract_id: str) -> list | None:
    """(run id, start ms, tags) of the active pilot runs of `contract_id` in the SQLite store at
    `path`, oldest first, read with read-only queries: `gates check` then does not pay MLflow's
    import and store start (seconds) for a list of pilots. None for a schema the queries do not
    know: MLflow itself reads the store then."""
    import sqlite3

    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
            runs = db.execute(
                "SELECT r.run_uuid, r.start_time FROM experiments e "
                "JOIN runs r ON r.experiment_id = e.experiment_id "
                "JOIN tags p ON p.run_uuid = r.run_uuid AND p.key = 'gates.pilot' AND p.value = 'true' "
                "JOIN tags o ON o.run_uuid = r.run_uuid AND o.key = 'gates.role' AND o.value = 'run' "
                "WHERE e.name = ? AND r.lifecycle_stage = 'active' ORDER BY r.start_time",
                (contract_id,),
            ).fetchall()
            tags: dict[str, dict[str, str]] = {run_id: {} for run_id, _ in runs}
            for run_id, key, value in db.execute(
                "SELECT t.run_uuid, t.key, t.value FROM experiments e "
                "JOIN runs r ON r.experiment_id = e.experiment_id "
                "JOIN tags t ON t.run_uuid = r.run_uuid WHERE e.name = ? AND t.key LIKE 'gates.%'",
                (contract_id,),
            ):
                if run_id in tags:
                    tags[run_id][key] = value
    except sqlite3.Error:
        return None
    return [(run_id, start_ms, tags[run_id]) for run_id, start_ms in runs]


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and value == value and abs(value) != float("inf")


def _first_commit_time(path: Path) -> float | None:
    """When `path` was first committed (its repository's history; epoch seconds), or None."""
    from gates.record._provenance import git

    path = Path(path).resolve()
    out = git("log", "--diff-filter=A", "--format=%ct", "--", path.name, root=path.parent)
    return float(out.splitlines()[-1]) if out else None


# ---------------------------------------------------------------------------------- a claim's run
# A server that does not answer gets one short try, not MLflow's retries with backoff (minutes): the
# tags are a view of the claims history, and a withdrawal or a finished run must not wait on them
_IMPATIENT = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}


def withdraw_claim_run(evidence: Path, reason: str, uri: str) -> str | None:
    """Say on a withdrawn claim's parent run, in the store `uri`, that it is withdrawn:
    `gates.verdict = withdrawn`, the verdict its evidence records kept as `gates.recorded_verdict`.
    None, or why not (tag_claim_run)."""
    return tag_claim_run(
        evidence,
        lambda recorded: {
            "gates.withdrawn": "true",
            "gates.withdrawal_reason": reason[:5000],
            "gates.verdict": "withdrawn",
            "gates.recorded_verdict": str(recorded.get("verdict") or ""),
        },
        uri,
    )


def supersede_claim_run(evidence: Path, new_id: str, uri: str) -> str | None:
    """Tag the parent run of the claim a newly recorded contract supersedes with the new id, in `uri`."""
    return tag_claim_run(evidence, lambda recorded: {"gates.superseded_by": new_id}, uri)


def tag_claim_run(evidence: Path, tags: Callable[[dict], dict[str, str]], uri: str) -> str | None:
    """Set tags (`tags` of the evidence as plain JSON) on the MLflow parent run of the claim whose
    evidence.json is `evidence` (its `mlflow.parent_run_id`), in the store `uri`: the user's (the
    command's `--tracking-uri`, else $MLFLOW_TRACKING_URI, else the default: `resolve_uri`). The
    store the evidence recorded (`mlflow.tracking_uri`) is never connected to: evidence is data anyone
    can edit, and must not decide where the platform sends requests.

    The claims history is the record and MLflow a view of it: a store that cannot be reached (a
    missing file, a server that does not answer) or that lacks the run is no error. Returns None once
    the tags are set, else one line saying why they were not. Never creates a store."""
    from urllib.parse import urlparse

    from gates.errors import UserError
    from gates.record._files import MAX_EVIDENCE_BYTES, read_json_object
    from gates.record._store import sqlite_path

    recorded = read_json_object(evidence, MAX_EVIDENCE_BYTES)
    if recorded is None:
        return f"MLflow tags not updated: {evidence} is missing or unreadable (it names the run)"
    where = recorded.get("mlflow") if isinstance(recorded.get("mlflow"), dict) else {}
    run_id = where.get("parent_run_id")
    if not (isinstance(run_id, str) and run_id):
        return f"MLflow tags not updated: {evidence} names no MLflow parent run"
    parsed = urlparse(uri)
    # a store file or folder that is not here (recorded on another machine, or from another folder:
    # a relative path) is not opened; a file store would even be built where it is opened
    local = sqlite_path(uri)
    if parsed.scheme in ("", "file"):
        local = Path(parsed.path or uri)
    if local is not None and not local.exists():
        return f"MLflow tags not updated: store {uri} not found (no {os.path.abspath(local)})"
    from mlflow.entities import RunTag

    saved = {k: os.environ.get(k) for k in _IMPATIENT}
    os.environ.update({k: v for k, v in _IMPATIENT.items() if saved[k] is None})
    try:
        client = open_client(uri, create=False)
        client.log_batch(run_id, tags=[RunTag(k, v) for k, v in tags(recorded).items()])
    except Exception as e:  # MLflow is a view: whatever keeps it from being updated, say it
        why = e.render() if isinstance(e, UserError) else f"{type(e).__name__}: {e}"
        return f"MLflow tags not updated (store {uri}, run {run_id}): {' '.join(why.split())[:300]}"
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
    return None
