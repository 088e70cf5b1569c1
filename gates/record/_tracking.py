"""MLflow glue: one parent run per contract, one nested run per arm x seed, metrics in batches.

The default store is the embedded SQLite database `sqlite:///mlflow.db` (open it with
`mlflow ui --backend-store-uri sqlite:///mlflow.db`); `--tracking-uri` or MLFLOW_TRACKING_URI
point elsewhere (a shared `mlflow server`, say).
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any

DEFAULT_URI = "sqlite:///mlflow.db"
BATCH = 1000  # MLflow accepts at most 1000 metrics per log_batch call
FLUSH_SECONDS = 5.0  # so the MLflow UI shows a long run's curves while it trains


def resolve_uri(uri: str | None) -> str:
    return uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_URI


def open_client(uri: str, *, create: bool = True):
    """An MlflowClient for `uri`. A SQLite store is checked first (gates/store.py): a missing one is
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

    store.ensure(uri, create=create)
    return MlflowClient(tracking_uri=uri)


def flatten(config: dict, prefix: str = "") -> dict[str, str]:
    """Nested config -> {"a.b": "value"}; lists as JSON so they read back unambiguously."""
    flat = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, name + "."))
        else:
            flat[name] = json.dumps(value) if isinstance(value, (list, tuple)) else str(value)
    return flat


class MLflowMetricSink:
    """Buffers metric points and writes them with log_batch, not one database call per value."""

    def __init__(self, client, run_id: str):
        self.client = client
        self.run_id = run_id
        self.buffer: list = []
        self.last_flush = time.monotonic()

    def add(self, step: int, metrics: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.buffer.extend(Metric(name, value, now, step) for name, value in metrics.items())
        if len(self.buffer) >= BATCH or time.monotonic() - self.last_flush > FLUSH_SECONDS:
            self.flush()

    def attach(self, name: str, text: str) -> None:
        """A text artifact of the run (e.g. sample translations), shown in the MLflow UI."""
        self.client.log_text(self.run_id, text, name)

    def flush(self) -> None:
        while self.buffer:
            chunk, self.buffer = self.buffer[:BATCH], self.buffer[BATCH:]
            self.client.log_batch(self.run_id, metrics=chunk)
        self.last_flush = time.monotonic()


class Tracker:
    """The MLflow side of one `gates run`."""

    def __init__(self, uri: str):
        self.uri = uri
        self.client = open_client(uri)

    def experiment_id(self, contract_id: str) -> str:
        found = self.client.get_experiment_by_name(contract_id)
        if found is not None:
            if found.lifecycle_stage == "deleted":
                self.client.restore_experiment(found.experiment_id)
            return found.experiment_id
        return self.client.create_experiment(contract_id, tags={"gates.contract": contract_id})

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
        final_step: int,
        seconds: float,
        first_signal: dict | None,
    ) -> None:
        from mlflow.entities import Metric, RunTag

        tags = {
            "gates.status": status,
            "gates.halt_reason": halt_reason or "",
            "gates.final_metrics": json.dumps(final_metrics),
            "gates.seconds": str(seconds),
            "gates.first_signal": json.dumps(first_signal),
        }
        if halt_detail:
            tags["gates.halt_detail"] = halt_detail[:5000]
        now = int(time.time() * 1000)
        self.client.log_batch(
            run_id,
            metrics=[Metric(k, v, now, final_step) for k, v in final_metrics.items()],
            tags=[RunTag(k, v) for k, v in tags.items()],
        )
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
    ) -> None:
        from mlflow.entities import Metric, RunTag

        now = int(time.time() * 1000)
        self.client.log_batch(
            run_id,
            metrics=[Metric(k, v, now, 0) for k, v in metrics.items()],
            tags=[RunTag(k, v) for k, v in tags.items()],
        )
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


def run_summary(run: Any) -> dict:
    """What a finished child run recorded, read back from MLflow (for resuming)."""
    tags = run.data.tags
    return {
        "arm": tags.get("gates.arm"),
        "seed": int(tags.get("gates.seed", "-1")),
        "status": tags.get("gates.status"),
        "halt_reason": tags.get("gates.halt_reason") or None,
        "halt_detail": tags.get("gates.halt_detail") or None,
        "metrics": json.loads(tags.get("gates.final_metrics", "{}")),
        "seconds": float(tags.get("gates.seconds", "nan")),
        "first_signal": json.loads(tags.get("gates.first_signal", "null")),
        "mlflow_run_id": run.info.run_id,
        "mlflow_status": run.info.status,
        # set only on a completed run judged under a convergence rule
        "converged": {"true": True, "false": False}.get(tags.get("gates.converged", "")),
        "convergence": json.loads(tags["gates.convergence"])
        if "gates.convergence" in tags
        else None,
        # where it ran (device, torch, CUDA, GPU, threads); absent for a study without a device
        "environment": json.loads(tags["gates.environment"])
        if "gates.environment" in tags
        else None,
    }
