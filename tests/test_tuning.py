"""Tuning with Optuna, fair by construction: schema checks, the stop-rule pruner, a tuned contract end to
end (trials in MLflow and in the Optuna storage, the best config over the seeds), and resume."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import optuna
import pytest
from mlflow import MlflowClient
from optuna.trial import TrialState

from gates.cli import main as cli_main
from gates.contract import Contract, FutilityRule, StopRules, load_contract
from gates.errors import UserError
from gates.execution import (
    PlatformReporter,
    StopRuleEngine,
    StopRulePruner,
    distributions,
    run_tuning_trial,
    tune,
    tuned_config,
)
from gates.execution._tuning import TrialRules, default_storage, open_study
from gates.record import current_provenance
from gates.study import Budget, Halt
from gates.verify import check_claim
from tests.conftest import small_c05, write_contract
from tests.helpers import run_contract

pytestmark = pytest.mark.usefixtures("one_thread")

ARMS = ["flat_address", "path_only", "subheap_kernel", "path_subheap_kernel"]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """One MLflow store (and the Optuna storage beside it) for this module: creating a store costs
    seconds; every test uses its own contract id, so its experiment and studies are its own."""
    folder = tmp_path_factory.mktemp("stores")
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    return uri, default_storage(uri)


def tuned_c05(trials=2, id="c05-tuned-small", **tuning_overrides) -> dict:
    """The small C05 contract with every arm's lr tuned on val_acc (2 random trials per arm)."""
    data = small_c05(id=id)
    for cfg in data["arms"].values():
        cfg["val_trees"] = 60
    data["tuning"] = {
        "space": {"lr": {"type": "float", "low": 0.003, "high": 0.03, "log": True}},
        "trials": trials,
        "objective": {"metric": "val_acc", "direction": "higher"},
        "seeds": [7],
        "sampler": {"kind": "random", "seed": 0},
        **tuning_overrides,
    }
    return data


def error_of(tmp_path, data: dict) -> str:
    with pytest.raises(UserError) as info:
        load_contract(write_contract(tmp_path, data))
    return info.value.render()


# ---------------------------------------------------------------------------------- schema
def test_cli_rejects_unequal_budgets_with_exit_2(tmp_path):
    data = tuned_c05(trials={"subheap_kernel": 3, "flat_address": 2})
    path = write_contract(tmp_path, data)
    done = subprocess.run(
        [sys.executable, "-m", "gates", "check", str(path)], capture_output=True, text=True
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    line = path.read_text().splitlines().index("  trials:") + 1
    assert (
        f"contract.yaml:{line}: tuning.trials: value error, tuning budgets differ across arms "
        f"(subheap_kernel: 3, flat_address: 2); expected the same number of trials for every tuned arm"
    ) in done.stderr


def cli_error(tmp_path, data, monkeypatch, capsys) -> str:
    """`gates check` through the CLI's own entry point (error rendering and exit code), in process."""
    monkeypatch.setattr(sys, "argv", ["gates", "check", str(write_contract(tmp_path, data))])
    with pytest.raises(SystemExit) as info:
        cli_main()
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Traceback" not in err
    return err


def test_cli_rejects_a_space_key_that_is_no_config_field(tmp_path, monkeypatch, capsys):
    data = tuned_c05()
    data["tuning"]["space"]["hiden"] = {"type": "int", "low": 8, "high": 64}
    err = cli_error(tmp_path, data, monkeypatch, capsys)
    assert (
        "tuning.space.hiden: not a field of study 'c05_probe''s arm config (did you mean 'hidden'?)"
        in err
    )


def test_cli_rejects_a_decision_on_the_tuning_metric(tmp_path, monkeypatch, capsys):
    data = tuned_c05()
    data["decision"]["refuted_if"].append(
        {
            "kind": "compare",
            "arm": "subheap_kernel",
            "metric": "test_acc",
            "other": "flat_address",
            "other_metric": "val_acc",
            "direction": "lower",
        }
    )
    err = cli_error(tmp_path, data, monkeypatch, capsys)
    assert "decision.refuted_if.4.other_metric: 'val_acc' is the tuning objective" in err
    assert err.count("error: ") == 1  # test_acc elsewhere is fine


@pytest.mark.parametrize(
    "change, expected",
    [
        (
            lambda t: t["space"]["lr"].update(low=0.0, log=False),
            "tuning.space.lr.low: lr = 0.0 is outside what arm "
            "'flat_address' accepts (input should be greater than 0",
        ),
        (
            lambda t: t["space"].update(
                features={"type": "categorical", "choices": ["path_only", "tree"]}
            ),
            "tuning.space.features.choices.1: features = 'tree' is outside what arm",
        ),
        (
            lambda t: t["space"].update(hidden={"type": "int", "low": 4.5, "high": 8}),
            "an int range needs integer low",
        ),
        (
            lambda t: t.update(seeds=[1, 7]),
            "tuning.seeds: tuning seeds [1] are also the contract's seeds",
        ),
        (
            lambda t: t.update(objective={"metric": "test_acc", "direction": "higher"}),
            "tuning.objective.metric: 'test_acc' is not a validation metric",
        ),
        (
            lambda t: t.update(objective={"metric": "val_loss", "direction": "higher"}),
            "tuning.objective.direction: 'val_loss' is better when lower",
        ),
        (
            lambda t: t.update(trials={"subheap_kernel": 2, "flat_adress": 2}),
            "tuning.trials.flat_adress: no arm named",
        ),
        (lambda t: t.update(trials=0), "expected a positive number of trials"),
        (lambda t: t.update(sampler={"kind": "random"}), "a random sampler needs a `seed`"),
        (
            lambda t: t.update(sampler={"kind": "listed", "seed": 0, "candidates": [{"lr": 0.01}]}),
            "a listed sampler draws nothing: it takes `candidates`, not a `seed`",
        ),
        (
            lambda t: t.update(sampler={"kind": "listed"}),
            "a listed sampler needs `candidates`: one configuration per trial",
        ),
        (
            lambda t: t.update(sampler={"kind": "listed", "candidates": [{"lr": 0.01}]}),
            "tuning.sampler.candidates: 1 candidates for 2 trials per arm; expected one candidate "
            "per trial",
        ),
        (
            lambda t: t.update(
                sampler={"kind": "listed", "candidates": [{"lr": 0.01}, {"lr": 0.05}]}
            ),
            "tuning.sampler.candidates.1.lr: lr = 0.05 is outside [0.003, 0.03]; expected a value "
            "of tuning.space.lr",
        ),
        (
            lambda t: t.update(
                sampler={"kind": "listed", "candidates": [{"lr": 0.01}, {"lr": 0.01, "hidden": 8}]}
            ),
            "tuning.sampler.candidates.1: fields ['hidden', 'lr']; expected exactly the searched "
            "fields ['lr']",
        ),
    ],
)
def test_tuning_section_errors(tmp_path, change, expected):
    data = tuned_c05()
    change(data["tuning"])
    assert expected in error_of(tmp_path, data)


def test_a_tuned_arm_is_not_compared_with_an_untuned_one(tmp_path):
    data = tuned_c05(trials={"subheap_kernel": 2})
    data["decision"]["refuted_if"].append(
        {
            "kind": "compare",
            "arm": "subheap_kernel",
            "metric": "test_acc",
            "other": "flat_address",
            "direction": "lower",
        }
    )
    msg = error_of(tmp_path, data)
    assert (
        "decision.refuted_if.4: compares tuned arm(s) ['subheap_kernel'] with untuned ['flat_address']; "
        "expected both sides tuned with the same budget, or neither"
    ) in msg
    data["decision"]["refuted_if"].pop()
    assert load_contract(write_contract(tmp_path, data)).contract.tuning.tuned_arms(
        data["arms"]
    ) == ["subheap_kernel"]


def test_schema_shows_tuning_and_the_hash_covers_it(tmp_path):
    schema = json.dumps(Contract.model_json_schema())
    assert '"tuning"' in schema and "SpaceParam" in schema and "trials per tuned arm" in schema
    one = load_contract(write_contract(tmp_path, tuned_c05(), "a.yaml")).sha256
    assert load_contract(write_contract(tmp_path, tuned_c05(trials=3), "b.yaml")).sha256 != one


def test_storage_sits_beside_the_mlflow_store():
    assert default_storage("sqlite:///mlflow.db") == "sqlite:///optuna.db"
    assert default_storage("sqlite:////tmp/x/tune-mlflow.db") == "sqlite:////tmp/x/tune-optuna.db"
    assert default_storage("sqlite:////tmp/x/store.db") == "sqlite:////tmp/x/store-optuna.db"
    assert default_storage("http://mlflow:5000") == "sqlite:///optuna.db"


# ---------------------------------------------------------------------------------- pruner
def test_pruner_prunes_exactly_where_the_stop_rule_halts():
    rules = StopRules(
        futility=[
            FutilityRule(
                metric="train_acc", at_step=40, worse_than=0.5, window=20, min_rel_improvement=0.05
            )
        ]
    )
    directions = {"train_acc": "higher", "val_acc": "higher"}
    series = {20: 0.30, 40: 0.31, 60: 0.9}  # step 40: below 0.5 and +3% over 20 steps: futile

    def reports(target):
        for step, acc in series.items():
            target.report(step, {"train_acc": acc, "val_acc": acc})

    plain = PlatformReporter(Budget(60, 20), StopRuleEngine(rules, "a", directions))
    with pytest.raises(Halt) as halted:
        reports(plain)

    pruner = StopRulePruner()
    study = optuna.create_study(direction="maximize", pruner=pruner)
    trial = study.ask()
    pruner.watch(trial.number, StopRuleEngine(rules, "a", directions))
    reporter = PlatformReporter(Budget(60, 20), TrialRules(trial, pruner, "val_acc"))
    with pytest.raises(Halt) as pruned:
        reports(reporter)
    frozen = study.tell(trial, state=TrialState.PRUNED)
    assert (
        (pruned.value.reason, pruned.value.step, str(pruned.value))
        == (halted.value.reason, halted.value.step, str(halted.value))
        == ("futility", 40, str(halted.value))
    )
    assert frozen.state == TrialState.PRUNED and frozen.intermediate_values == {20: 0.30, 40: 0.31}
    assert trial.should_prune()  # asked again for the same report: the same answer, no second look

    series[40] = 0.6  # above the bar: neither halts
    reports(PlatformReporter(Budget(60, 20), StopRuleEngine(rules, "a", directions)))
    trial = study.ask()
    pruner.watch(trial.number, StopRuleEngine(rules, "a", directions))
    reports(PlatformReporter(Budget(60, 20), TrialRules(trial, pruner, "val_acc")))
    assert not trial.should_prune()


def test_a_hopeless_trial_is_pruned_at_the_runs_halt_step(workdir, store):
    data = tuned_c05(trials={"subheap_kernel": 1}, id="c05-tuned-hopeless")
    data["tuning"]["space"]["lr"] = {
        "type": "float",
        "low": 1e-7,
        "high": 2e-7,
    }  # learns nothing in 60 steps
    loaded = load_contract(write_contract(workdir / "contracts", data))
    uri, storage = store
    prov = current_provenance(
        "gates.models.c05_probe"
    )  # once: studies are named by the code's fingerprint
    record = run_tuning_trial(loaded, "subheap_kernel", storage, uri, prov=prov)
    assert (
        run_tuning_trial(loaded, "subheap_kernel", storage, uri, prov=prov) is None
    )  # budget spent

    cfg = tuned_config(loaded, "subheap_kernel", record.params)
    plain = PlatformReporter(
        Budget(60, 20),
        StopRuleEngine(loaded.contract.stop_rules, "subheap_kernel", loaded.study.metrics),
    )
    with pytest.raises(Halt) as halted:
        loaded.study.run(cfg, 7, plain)
    assert record.state == "pruned" and record.halt_reason == halted.value.reason == "futility"
    assert record.last_step == halted.value.step == 40 and record.value is None
    run = MlflowClient(uri).get_run(record.mlflow_run_id)
    assert (
        run.data.tags["gates.tuning_state"] == "pruned"
        and run.data.tags["gates.halt_reason"] == "futility"
    )


def test_a_tuning_job_files_its_trial_under_the_code_its_run_started_with(workdir, store):
    """A tuning job of a run in processes or on Ray (`JOB_KINDS["tune"]`) tunes in the Optuna study
    named by the fingerprint its run started with, not one measured when the job runs: files edited
    during a `--jobs 2` run once scattered one contract's trials over four studies, each arm's budget
    and best then read from one of them."""
    from dataclasses import replace
    from types import SimpleNamespace

    from gates.execution import _jobs as jobs
    from gates.execution._job import Job
    from gates.execution._tuning import study_name
    from gates.record import Tracker

    data = tuned_c05(trials={"subheap_kernel": 1}, id="c05-tuned-start")
    loaded = load_contract(write_contract(workdir / "contracts", data))
    uri, storage = store
    # the start's fingerprint, as if a file had changed since (today's measure differs from it)
    started = replace(current_provenance("gates.models.c05_probe"), code_sha256="0" * 64)
    experiment_id, parent_id, _ = Tracker(uri).open_parent(loaded, started)
    parent = SimpleNamespace(
        loaded=loaded,
        tracking_uri=uri,
        parent_id=parent_id,
        experiment_id=experiment_id,
        prov=started,
    )
    job = Job(
        jobs.KIND_TUNE, "tune:subheap_kernel:0", "subheap_kernel", index=0, tuning_storage=storage
    )
    record = jobs.JOB_KINDS[jobs.KIND_TUNE](SimpleNamespace(parent=parent), job, {}, None)
    assert record.state == "completed"
    names = {s.study_name for s in optuna.get_all_study_summaries(storage)}
    assert study_name(loaded, "subheap_kernel", "0" * 64) in names
    assert not any(name.startswith("c05-tuned-start@") and "0" * 12 not in name for name in names)


def test_the_plan_makes_each_tuning_job_after_the_arm_s_trial_before_it(tmp_path):
    """A tuned arm's trial n waits for its trial n - 1 (so each samples with the trials before it
    finished), fixed where the plan makes the jobs; the jobs, frozen, pickle as they are for a
    process pool or a Ray task."""
    import dataclasses
    import pickle

    from gates.execution import _jobs as jobs

    loaded = load_contract(write_contract(tmp_path, tuned_c05(trials=3)))
    trials = jobs.tune_jobs(loaded, "sqlite:///optuna.db")
    for arm in ARMS:
        keys = [j.key for j in trials if j.arm == arm]
        assert [j.after for j in trials if j.arm == arm] == [(), *[(k,) for k in keys[:-1]]]
        assert [j.index for j in trials if j.arm == arm] == [0, 1, 2]
    assert {j.tuning_storage for j in trials} == {"sqlite:///optuna.db"}
    assert pickle.loads(pickle.dumps(trials)) == trials
    with pytest.raises(dataclasses.FrozenInstanceError):
        trials[1].after = ()


# ---------------------------------------------------------------------------------- end to end
def test_tuned_contract_end_to_end_and_resume(workdir, store):
    loaded = load_contract(
        write_contract(workdir / "contracts", tuned_c05(), "c05-tuned-small.yaml")
    )
    uri, storage = store
    ev = run_contract(loaded, uri, workdir / "runs")

    rec = ev.tuning.as_dict()  # the tuning record as evidence.json holds it
    assert (
        rec["storage"] == storage and storage.endswith("/optuna.db") and rec["trials_per_arm"] == 2
    )
    for arm in ARMS:
        trials = rec["arms"][arm]["trials"]
        assert [t["number"] for t in trials] == [0, 1] and all(
            t["state"] == "completed" for t in trials
        )
        best = max(trials, key=lambda t: (t["value"], -t["number"]))
        assert rec["arms"][arm]["best"] == {k: best[k] for k in ("number", "params", "value")}
        assert ev.settings.arm_configs[arm]["lr"] == best["params"]["lr"]  # the best ran the seeds
    # trial n of every arm sampled the same candidate (random sampler, seed (0, n))
    assert len({json.dumps([t["params"] for t in rec["arms"][arm]["trials"]]) for arm in ARMS}) == 1
    assert {(r.arm, r.seed) for r in ev.runs} == {(a, s) for a in ARMS for s in (0, 1, 2)}

    # MLflow: one nested run per trial with its params and objective; the seed runs use the best lr
    client = MlflowClient(uri)
    parent = ev.mlflow.parent_run_id
    trial_runs = client.search_runs(
        [ev.mlflow.experiment_id],
        f"tags.mlflow.parentRunId = '{parent}' and tags.`gates.role` = 'tuning_trial'",
    )
    assert len(trial_runs) == 8
    by_id = {r.info.run_id: r for r in trial_runs}
    for arm in ARMS:
        for t in rec["arms"][arm]["trials"]:
            run = by_id[t["mlflow_run_id"]]
            assert run.data.tags["gates.arm"] == arm and run.data.tags["gates.tuning_trial"] == str(
                t["number"]
            )
            assert float(run.data.params["lr"]) == t["params"]["lr"]
            assert math.isclose(run.data.metrics["objective"], t["value"])
    seed_run = client.get_run(ev.runs[0].mlflow_run_id)
    assert float(seed_run.data.params["lr"]) == ev.settings.arm_configs[ev.runs[0].arm]["lr"]

    # Optuna: one study per arm in the storage, 2 finished trials each
    names = {
        s.study_name: s
        for s in optuna.get_all_study_summaries(storage)
        if s.study_name.startswith("c05-tuned-small@")
    }
    assert set(names) == {r["study_name"] for r in rec["arms"].values()} and len(names) == 4
    assert all(s.n_trials == 2 for s in names.values())

    # verify re-derives the tuning; a tampered best is caught
    evidence_path = workdir / "runs" / "c05-tuned-small" / "evidence.json"
    assert check_claim(evidence_path, {"c05-tuned-small": loaded.path}, replay=False).status == "ok"
    tampered = json.loads(evidence_path.read_text())
    other = next(
        t
        for t in tampered["tuning"]["arms"]["subheap_kernel"]["trials"]
        if t["number"] != tampered["tuning"]["arms"]["subheap_kernel"]["best"]["number"]
    )
    tampered["tuning"]["arms"]["subheap_kernel"]["best"]["number"] = other["number"]
    evidence_path.write_text(json.dumps(tampered))
    problems = check_claim(evidence_path, {"c05-tuned-small": loaded.path}, replay=False).problems
    assert any("recorded best trial" in p for p in problems)

    # resume: nothing is redone, the same trials and the same verdict
    again = run_contract(loaded, uri, workdir / "runs")
    assert again.tuning.as_dict()["arms"] == rec["arms"] and again.runs == ev.runs
    assert all(
        s.n_trials == 2 for s in optuna.get_all_study_summaries(storage) if s.study_name in names
    )


def test_resume_keeps_finished_trials_and_redoes_an_interrupted_one(workdir, store):
    data = tuned_c05(trials={"subheap_kernel": 3}, id="c05-tuned-resume")
    loaded = load_contract(write_contract(workdir / "contracts", data))
    uri, storage = store
    prov = current_provenance(
        "gates.models.c05_probe"
    )  # once: studies are named by the code's fingerprint
    first = run_tuning_trial(
        loaded, "subheap_kernel", storage, uri, prov=prov
    )  # a worker's single trial
    study = open_study(loaded, "subheap_kernel", storage, prov.code_sha256)
    study.ask(distributions(loaded.contract.tuning.space))  # a trial left RUNNING by a kill

    record = tune(loaded, uri, storage_url=storage, prov=prov)
    trials = record["arms"]["subheap_kernel"]["trials"]
    assert [t["number"] for t in trials] == [
        0,
        2,
        3,
    ]  # trial 1 was interrupted: failed, not counted
    reported = {k: v for k, v in first.as_dict().items() if k != "arm"}
    assert {k: trials[0][k] for k in reported} == reported
    states = [
        t.state
        for t in optuna.load_study(
            study_name=record["arms"]["subheap_kernel"]["study_name"], storage=storage
        ).trials
    ]
    assert states == [
        TrialState.COMPLETE,
        TrialState.FAIL,
        TrialState.COMPLETE,
        TrialState.COMPLETE,
    ]
    # trial n samples from (sampler seed, its place n in the budget): the same candidates as an
    # uninterrupted run
    # (another contract id: its own studies, same space and sampler seed)
    other = load_contract(
        write_contract(workdir / "contracts", {**data, "id": "c05-tuned-resume-b"}, "b.yaml")
    )
    fresh = tune(other, uri, storage_url=storage, prov=prov)
    assert [t["params"] for t in fresh["arms"]["subheap_kernel"]["trials"]] == [
        t["params"] for t in trials
    ]
    assert (
        tune(loaded, uri, storage_url=storage, prov=prov)["arms"] == record["arms"]
    )  # nothing left to do


def test_two_workers_on_one_arm_sample_two_places_of_its_budget(workdir, store):
    """Distributed jobs of one arm run at once (and in any order): each samples its own place's candidate,
    the ones a single process samples first and second, not one candidate twice (two workers once both
    saw 0 trials spent and tried the same lr); a place a counted trial holds is not run again."""
    data = tuned_c05(trials={"subheap_kernel": 2}, id="c05-tuned-places")
    loaded = load_contract(write_contract(workdir / "contracts", data))
    uri, storage = store
    prov = current_provenance("gates.models.c05_probe")
    second = run_tuning_trial(
        loaded, "subheap_kernel", storage, uri, prov=prov, index=1
    )  # first to start
    assert (
        run_tuning_trial(loaded, "subheap_kernel", storage, uri, prov=prov, index=1) is None
    )  # held
    first = run_tuning_trial(loaded, "subheap_kernel", storage, uri, prov=prov, index=0)
    assert first.params != second.params
    assert run_tuning_trial(loaded, "subheap_kernel", storage, uri, prov=prov, index=0) is None

    other = load_contract(
        write_contract(workdir / "contracts", {**data, "id": "c05-tuned-places-b"}, "b.yaml")
    )
    in_order = tune(other, uri, storage_url=storage, prov=prov)["arms"]["subheap_kernel"]["trials"]
    assert [t["params"] for t in in_order] == [first.params, second.params]


def test_a_listed_sampler_tries_its_candidates_in_order_for_every_arm(workdir, store):
    """A designed search: trial n of every tuned arm tries candidate n, exactly as listed (nothing is
    drawn), and `gates check` states them."""
    candidates = [{"lr": 0.02}, {"lr": 0.005}]
    data = tuned_c05(id="c05-tuned-listed", sampler={"kind": "listed", "candidates": candidates})
    path = write_contract(workdir / "contracts", data)
    loaded = load_contract(path)
    uri, storage = store
    prov = current_provenance("gates.models.c05_probe")
    record = tune(loaded, uri, storage_url=storage, prov=prov)
    for arm in ARMS:
        assert [t["params"] for t in record["arms"][arm]["trials"]] == candidates
    assert record["sampler"] == {"kind": "listed", "candidates": candidates}
    done = subprocess.run(
        [sys.executable, "-m", "gates", "check", str(path)], capture_output=True, text=True
    )
    assert "listed candidates (lr 0.02), (lr 0.005)" in done.stdout, done.stdout + done.stderr
