"""Tuning with Optuna, fair by construction.

A contract's optional `tuning` section pre-registers a search: the space (arm config fields), the
same number of trials for every tuned arm, the objective (a validation metric the decision never
reads, checked in gates/contract/_schema.py), the tuning seeds (disjoint from the contract's) and the
sampler seed. Here:

- each tuned arm is one Optuna study, named `<id>@<contract sha256[:16]>.<code sha256[:12]>/<arm>`,
  in an RDB storage beside the MLflow store (`sqlite:///optuna.db` next to `sqlite:///mlflow.db`);
- a trial trains the arm with the sampled params on every tuning seed under the contract's stop rules,
  fed to Optuna through `trial.report` / `trial.should_prune` and decided by `StopRulePruner`, whose
  answer is the contract's `StopRuleEngine`: a halt prunes the trial exactly where it would halt a run.
  Its value is the objective's final value, averaged over the tuning seeds;
- trial n of every arm (its place n in the arm's budget, `budget_index`) samples from the seed
  (sampler.seed, n), or tries the listed sampler's candidate n: with the random and the listed
  sampler every arm tries the same candidates, a resumed study
  samples what the interrupted one would have, and workers running two trials of one arm at once
  (distributed jobs carry n) sample two candidates, not the same one twice;
- every trial is one MLflow run nested under the contract's parent run (our own small glue, batched
  like the arm x seed runs);
- trials already finished in the storage (completed, pruned, or failed by the study) count toward the
  budget and are never redone; a trial left running by a kill is marked failed and does not count;
- the best completed trial per arm (ties: the earliest) gives the config that runs over the contract's
  seeds; an arm with no completed trial keeps its declared config. The evidence records it all.

`run_tuning_trial` runs one trial of one arm (the unit a distributed worker can take); `tune` runs
every arm's remaining budget; `tune_and_apply` is the runner's hook.
"""

from __future__ import annotations

import json
import math
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import optuna
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState

from gates.contract import LoadedContract, SpaceParam
from gates.entities import TrialRecord, TuningRecord
from gates.errors import UserErrors, storage_error
from gates.execution._preflight import preflight
from gates.execution._reporter import PlatformReporter
from gates.execution._stop_rules import StopRuleEngine
from gates.record import (
    MLflowMetricSink,
    Provenance,
    Tracker,
    base_tags,
    best_trial,
    close_after_interrupt,
    current_provenance,
    flatten_params,
    tuned_config,
)
from gates.study import Budget, Halt

DEFAULT_STORAGE = "sqlite:///optuna.db"

optuna.logging.set_verbosity(optuna.logging.WARNING)


# ---------------------------------------------------------------------------------- storage
def default_storage(tracking_uri: str) -> str:
    """The Optuna storage beside an SQLite MLflow store: `.../mlflow.db` -> `.../optuna.db`,
    `.../x-mlflow.db` -> `.../x-optuna.db`, `.../x.db` -> `.../x-optuna.db`; else `sqlite:///optuna.db`."""
    prefix = "sqlite:///"
    if not tracking_uri.startswith(prefix):
        return DEFAULT_STORAGE
    path = Path(tracking_uri[len(prefix) :])
    name = (
        path.name.replace("mlflow", "optuna")
        if "mlflow" in path.name
        else f"{path.stem}-optuna{path.suffix}"
    )
    return prefix + str(path.with_name(name))


_STORAGES: dict[str, Any] = {}


def _storage(url: str):
    if url not in _STORAGES:
        _STORAGES[url] = optuna.storages.RDBStorage(url)
    return _STORAGES[url]


def study_name(loaded: LoadedContract, arm: str, code_sha256: str) -> str:
    return f"{loaded.id}@{loaded.sha256[:16]}.{code_sha256[:12]}/{arm}"


def distributions(space: dict[str, SpaceParam]) -> dict[str, Any]:
    """The contract's search space as Optuna distributions."""
    out = {}
    for key, p in space.items():
        if p.type == "categorical":
            out[key] = CategoricalDistribution(list(p.choices))
        elif p.type == "int":
            out[key] = IntDistribution(int(p.low), int(p.high), log=p.log, step=int(p.step or 1))
        else:
            out[key] = FloatDistribution(p.low, p.high, log=p.log, step=p.step)
    return out


def _sampler(spec, index: int):
    """Trial `index` samples from seed (spec.seed, index): independent of how many runs resumed. A
    listed sampler's trial `index` tries candidate `index`, every field fixed (nothing is drawn)."""
    if spec.kind == "listed":
        with warnings.catch_warnings():  # stable since Optuna 2.4, still marked experimental
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.samplers.PartialFixedSampler(
                spec.candidates[index], optuna.samplers.RandomSampler(seed=0)
            )
    seed = int(np.random.SeedSequence([spec.seed, index]).generate_state(1)[0])
    if spec.kind == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed)  # Optuna's default: the first 10 trials are random


# ---------------------------------------------------------------------------------- the pruner adapter
class StopRulePruner(optuna.pruners.BasePruner):
    """An Optuna pruner whose decision is the contract's stop rules.

    The trial's reporter first hands the pruner what the engine needs (`observe`: step, all metrics,
    their history), then calls `trial.report(objective, step)` and `trial.should_prune()`, which asks
    `prune`: the engine of that trial's current run checks the report once (its futility rules look
    once), and a `Halt` it returns prunes the trial (`halt(number)` says why).
    """

    def __init__(self):
        self._runs: dict[int, dict] = {}

    def watch(self, number: int, engine: StopRuleEngine) -> None:
        """Trial `number` starts a run (one tuning seed) judged by `engine`."""
        self._runs[number] = {"engine": engine, "pending": None, "halt": None}

    def observe(self, number: int, step: int, metrics: dict[str, float], history: dict) -> None:
        self._runs[number]["pending"] = (step, metrics, history)

    def prune(self, study, trial) -> bool:
        run = self._runs.get(trial.number)
        if run is None:
            return False
        if run["pending"] is not None:
            step, metrics, history = run["pending"]
            run["pending"] = None
            run["halt"] = run["engine"].check(step, metrics, history)
        return run["halt"] is not None

    def halt(self, number: int) -> Halt | None:
        run = self._runs.get(number)
        return run and run["halt"]

    def release(self, number: int) -> None:
        self._runs.pop(number, None)


class TrialRules:
    """What `PlatformReporter` calls its rules, for a tuning run: every report goes to Optuna
    (`trial.report` of the objective at `offset + step`, then `trial.should_prune`)."""

    def __init__(self, trial, pruner: StopRulePruner, objective: str, offset: int = 0):
        self.trial, self.pruner, self.objective, self.offset = trial, pruner, objective, offset

    def check(self, step: int, metrics: dict[str, float], history: dict) -> Halt | None:
        self.pruner.observe(self.trial.number, step, metrics, history)
        value = metrics.get(self.objective)
        if value is not None and math.isfinite(value):
            self.trial.report(value, self.offset + step)
        if self.trial.should_prune():
            return self.pruner.halt(self.trial.number)
        return None


# ---------------------------------------------------------------------------------- studies
def open_study(loaded: LoadedContract, arm: str, storage_url: str, code_sha256: str):
    """The arm's Optuna study (created on first use), with the stop-rule pruner."""
    t = loaded.contract.tuning
    return optuna.create_study(
        study_name=study_name(loaded, arm, code_sha256),
        storage=_storage(storage_url),
        load_if_exists=True,
        direction="maximize" if t.objective.direction == "higher" else "minimize",
        pruner=StopRulePruner(),
    )


def counted(study) -> list:
    """The trials that spent budget, by number: completed, pruned, or failed in the study itself (a
    trial that ran to its end has `seconds`; one closed after a kill has not, and is not counted)."""
    out = []
    for tr in study.get_trials(deepcopy=False):
        if tr.state in (TrialState.COMPLETE, TrialState.PRUNED) or (
            tr.state == TrialState.FAIL and "seconds" in tr.user_attrs
        ):
            out.append(tr)
    return sorted(out, key=lambda tr: tr.number)


def budget_places(trials: list) -> set[int]:
    """The places in the arm's budget that counted trials hold (a trial recorded before places were
    recorded holds its position among them, as it was sampled)."""
    return {int(tr.user_attrs.get("budget_index", i)) for i, tr in enumerate(trials)}


def reap_interrupted(
    loaded: LoadedContract,
    arm: str,
    storage_url: str,
    tracker: Tracker | None = None,
    code_sha256: str | None = None,
) -> int:
    """Close the arm's trials left RUNNING by a kill (failed, not counted; their MLflow runs killed).
    Only for a single local runner: a distributed worker's running trial would be closed too."""
    code = code_sha256 or current_provenance(type(loaded.study).__module__).code_sha256
    study = open_study(loaded, arm, storage_url, code)
    n = 0
    for tr in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        study.tell(tr.number, state=TrialState.FAIL)
        run_id = tr.user_attrs.get("mlflow_run_id")
        if tracker is not None and run_id:
            _close_mlflow_run(tracker, run_id, "killed", None, {}, "KILLED")
        n += 1
    return n


def _close_mlflow_run(
    tracker: Tracker,
    run_id: str,
    state: str,
    value: float | None,
    extra: dict,
    mlflow_status: str,
    seed_values: dict | None = None,
) -> None:
    from mlflow.entities import Metric, RunTag

    now = int(time.time() * 1000)
    metrics = [Metric("objective", value, now, 0)] if value is not None else []
    metrics += [
        Metric(f"objective.seed{s}", v, now, 0)
        for s, v in (seed_values or {}).items()
        if math.isfinite(v)
    ]
    tags = [RunTag("gates.tuning_state", state)] + [
        RunTag(k, str(v)[:5000]) for k, v in extra.items() if v
    ]
    tracker.client.log_batch(run_id, metrics=metrics, tags=tags)
    tracker.client.set_terminated(run_id, status=mlflow_status)


# ---------------------------------------------------------------------------------- one trial
def run_tuning_trial(
    loaded: LoadedContract,
    arm: str,
    storage_url: str,
    tracking_uri: str,
    *,
    parent_run_id: str | None = None,
    experiment_id: str | None = None,
    prov: Provenance | None = None,
    index: int | None = None,
) -> dict | None:
    """Run one tuning trial of `arm` (all tuning seeds) if its budget is not spent; its record, or None.

    `index`: the trial's place in the arm's budget, which fixes what it samples (a distributed job
    carries it; None: the first free place). A place a counted trial already holds is not run again.
    Safe to call from several processes on a shared storage: each asks Optuna for a new trial; the
    evidence keeps the first `trials` finished ones by number, so the budget stays the same per arm.
    `prov` (default: measured now) names the study by the code's fingerprint: pass the one measured at
    the start of a run, so that an edit during the run does not move its trials to another study.
    """
    c, study_def = loaded.contract, loaded.study
    t = c.tuning
    prov = prov or current_provenance(type(study_def).__module__)
    study = open_study(loaded, arm, storage_url, prov.code_sha256)
    done = counted(study)
    taken = budget_places(done)
    if len(done) >= t.trials_per_arm:
        return None
    if index is None:
        index = min(set(range(t.trials_per_arm)) - taken)
    elif index in taken:
        return None
    study.sampler = _sampler(t.sampler, index)
    pruner: StopRulePruner = study.pruner
    trial = study.ask(distributions(t.space))
    trial.set_user_attr("budget_index", index)
    params = dict(trial.params)

    tracker = Tracker(tracking_uri)
    if parent_run_id is None or experiment_id is None:  # the contract's, as `gates run` opens it
        experiment_id, parent_run_id, _ = tracker.open_parent(loaded, prov)
    tags = {
        **base_tags(loaded, prov),
        "gates.arm": arm,
        "gates.tuning_trial": str(trial.number),
        "gates.role": "tuning_trial",
        "gates.tuning_state": "running",
        "gates.optuna_study": study.study_name,
        "mlflow.parentRunId": parent_run_id,
    }
    run = tracker.client.create_run(experiment_id, tags=tags, run_name=f"{arm}/trial{trial.number}")
    run_id = run.info.run_id
    from mlflow.entities import Param

    tracker.client.log_batch(
        run_id,
        params=[
            Param(k, v[:6000])
            for k, v in {
                **flatten_params(params),
                "tuning_seeds": json.dumps(list(t.seeds)),
                "contract_sha256": loaded.sha256,
            }.items()
        ],
    )
    trial.set_user_attr("mlflow_run_id", run_id)

    budget = Budget(c.budget.steps, c.budget.eval_every)
    sink = MLflowMetricSink(tracker.client, run_id)
    state, halt, detail, seed_values = "completed", None, None, {}
    started = time.perf_counter()
    try:
        cfg = study_def.Config.model_validate({**c.arms[arm], **params})
        for i, seed in enumerate(t.seeds):
            offset = i * budget.steps  # one trial, several runs: Optuna's steps keep increasing
            pruner.watch(trial.number, StopRuleEngine(c.stop_rules, arm, study_def.metrics))
            shifted = _ShiftedSink(sink, offset)
            reporter = PlatformReporter(
                budget, TrialRules(trial, pruner, t.objective.metric, offset), shifted
            )
            final = dict(study_def.run(cfg, seed, reporter))
            seed_values[seed] = float(final.get(t.objective.metric, math.nan))
    except Halt as h:
        state, halt, detail = "pruned", h, str(h)
    except KeyboardInterrupt:
        close_after_interrupt(sink.flush)
        # without `seconds`: not counted, redone next time
        close_after_interrupt(lambda: study.tell(trial, state=TrialState.FAIL))
        close_after_interrupt(
            lambda: _close_mlflow_run(tracker, run_id, "killed", None, {}, "KILLED")
        )
        raise
    except (
        Exception
    ) as e:  # a study crash (or an invalid sampled config): the trial failed, budget spent
        if storage_error(e) is not None:  # a full disk is no failed trial: the run stops
            raise
        state, detail = "failed", f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=8)}"
    finally:
        pruner.release(trial.number)
    value = None
    if state == "completed":
        value = float(np.mean(list(seed_values.values())))
        if not math.isfinite(value):
            state, detail, value = (
                "failed",
                f"objective {t.objective.metric} is not finite: {seed_values}",
                None,
            )
    seconds = round(time.perf_counter() - started, 3)
    sink.flush()
    trial.set_user_attr("seed_values", {str(s): v for s, v in seed_values.items()})
    trial.set_user_attr("halt_reason", halt.reason if halt else None)
    trial.set_user_attr("detail", (detail or "")[:2000] or None)
    trial.set_user_attr("seconds", seconds)
    optuna_state = {"completed": TrialState.COMPLETE, "pruned": TrialState.PRUNED}.get(
        state, TrialState.FAIL
    )
    frozen = study.tell(trial, value if state == "completed" else None, state=optuna_state)
    _close_mlflow_run(
        tracker,
        run_id,
        state,
        value,
        {"gates.halt_reason": halt.reason if halt else "", "gates.halt_detail": detail or ""},
        "FAILED" if state == "failed" else "FINISHED",
        seed_values,
    )
    return TrialRecord.model_validate({"arm": arm, **_trial_record(frozen)})


class _ShiftedSink:
    """Logs a tuning run's metrics at offset steps, so a trial's seeds follow one another in MLflow."""

    def __init__(self, sink: MLflowMetricSink, offset: int):
        self.sink, self.offset = sink, offset

    def add(self, step: int, metrics: dict[str, float]) -> None:
        self.sink.add(self.offset + step, metrics)

    def flush(self) -> None:
        self.sink.flush()


def _trial_record(tr) -> dict:
    state = {TrialState.COMPLETE: "completed", TrialState.PRUNED: "pruned"}.get(tr.state, "failed")
    value = tr.value if tr.state == TrialState.COMPLETE else None
    return {
        "number": tr.number,
        "params": dict(tr.params),
        "state": state,
        "value": value,
        "last_step": tr.last_step,
        "last_reported": tr.intermediate_values.get(tr.last_step),
        "seed_values": tr.user_attrs.get("seed_values", {}),
        "halt_reason": tr.user_attrs.get("halt_reason"),
        "detail": tr.user_attrs.get("detail"),
        "seconds": tr.user_attrs.get("seconds"),
        "mlflow_run_id": tr.user_attrs.get("mlflow_run_id"),
    }


# ---------------------------------------------------------------------------------- all arms
def tune(
    loaded: LoadedContract,
    tracking_uri: str,
    *,
    storage_url: str | None = None,
    parent_run_id: str | None = None,
    experiment_id: str | None = None,
    fresh: bool = False,
    progress=None,
    prov: Provenance | None = None,
) -> dict:
    """Spend every tuned arm's remaining budget; the tuning record (for the evidence). `prov`: the
    provenance the run started with (default: measured now)."""
    c = loaded.contract
    t = c.tuning
    storage_url = storage_url or default_storage(tracking_uri)
    prov = prov or current_provenance(type(loaded.study).__module__)
    code = prov.code_sha256
    tracker = Tracker(tracking_uri)
    notify = getattr(progress, "tuning_trial", None)
    arms = {}
    for arm in t.tuned_arms(c.arms):
        name = study_name(loaded, arm, code)
        if fresh:
            try:
                optuna.delete_study(study_name=name, storage=_storage(storage_url))
            except KeyError:
                pass
        reap_interrupted(loaded, arm, storage_url, tracker, code)
        while (
            record := run_tuning_trial(
                loaded,
                arm,
                storage_url,
                tracking_uri,
                parent_run_id=parent_run_id,
                experiment_id=experiment_id,
                prov=prov,
            )
        ) is not None:
            if notify:
                notify(record)
        study = open_study(loaded, arm, storage_url, code)
        trials = [_trial_record(tr) for tr in counted(study)[: t.trials_per_arm]]
        best = best_trial([TrialRecord.model_validate(t) for t in trials], t.objective.direction)
        arms[arm] = {
            "study_name": name,
            "trials": trials,
            "best": None
            if best is None
            else {"number": best.number, "params": best.params, "value": best.value},
            "note": None if best else "no trial completed: the declared config runs over the seeds",
        }
    return {
        "storage": storage_url,
        "space": {k: p.model_dump(mode="json", exclude_defaults=True) for k, p in t.space.items()},
        "trials_per_arm": t.trials_per_arm,
        "objective": t.objective.model_dump(),
        "seeds": list(t.seeds),
        "sampler": t.sampler.model_dump(exclude_none=True),
        "code_sha256": code,
        "arms": arms,
    }


def apply(loaded: LoadedContract, record: dict) -> LoadedContract:
    """A copy of `loaded` whose tuned arms run their best trial's params (`record`: the tuning record
    as evidence.json will hold it)."""
    configs = dict(loaded.arm_configs)
    for arm, r in TuningRecord.model_validate(record).arms.items():
        if r.best is not None:
            configs[arm] = tuned_config(loaded, arm, r.best.params)
    return loaded.replace(arm_configs=configs)


def tune_and_apply(
    loaded: LoadedContract,
    tracking_uri: str,
    *,
    parent_run_id: str,
    experiment_id: str,
    storage_url: str | None = None,
    fresh: bool = False,
    progress=None,
    prov: Provenance | None = None,
) -> tuple[LoadedContract, dict]:
    """The runner's hook: tune, then the contract with each tuned arm's best config (preflight again:
    the tuned configs must pass the same compute and capacity gates)."""
    record = tune(
        loaded,
        tracking_uri,
        storage_url=storage_url,
        parent_run_id=parent_run_id,
        experiment_id=experiment_id,
        fresh=fresh,
        progress=progress,
        prov=prov,
    )
    tuned = apply(loaded, record).replace(tuning_record=record)
    pre = preflight(tuned)
    if pre.errors:
        raise UserErrors(
            [
                loaded.error(("tuning",), f"the tuned configs fail preflight: {e.message}")
                for e in pre.errors
            ]
        )
    return tuned, record
