"""End to end: a real (small) C05 contract run into a temp SQLite MLflow store, read back through
the MLflow client; resume, --fresh, halts, preflight refusals; `gates verify` catching lost evidence."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml
from mlflow import MlflowClient

from gates.contract import load_contract
from gates.errors import UserError, UserErrors
from gates.execution import run_plan
from gates.verify import CONTRACT_EDITED, HISTORY, VERDICT, verify
from tests.conftest import small_c05, write_contract
from tests.helpers import run_contract


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """One small C05 run shared by the read-back and verify tests (about 10 s)."""
    root = tmp_path_factory.mktemp("project")
    (root / "contracts").mkdir()
    path = write_contract(root / "contracts", small_c05(), "c05-small.yaml")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    import os

    cwd = os.getcwd()
    os.chdir(root)
    try:
        evidence = run_contract(load_contract("contracts/c05-small.yaml"), uri, root / "runs")
    finally:
        os.chdir(cwd)
    return root, path, uri, evidence


def test_evidence_has_every_run_and_condition(finished):
    root, _, _, evidence = finished
    on_disk = json.loads((root / "runs" / "c05-small" / "evidence.json").read_text())
    # test_acc 1.0 / 0.0 on both seeds sits at its bound: the exact sign test, p 1/4 at best; the positive
    # controls (the subheap arms' val_loss, log scale) hold, and the test losses (subheap arms about 0.002,
    # blind arms about 6) clear their bars by far even at 2 seeds: supported
    assert on_disk["verdict"] == evidence.verdict == "supported"
    assert {(r["arm"], r["seed"]) for r in on_disk["runs"]} == {
        (a, s)
        for a in ("flat_address", "path_only", "subheap_kernel", "path_subheap_kernel")
        for s in (0, 1, 2)
    }
    assert len(on_disk["conditions"]) == 8
    for c in on_disk["conditions"]:
        assert {"p_hold_adj", "p_fail_adj", "ci_low", "ci_high", "outcome", "values"} <= set(c)
    point = on_disk["falsifiable_point"]  # gate 5 as measured on the arm it names
    assert point["arm"] == "subheap_kernel" and [r["seed"] for r in point["runs"]] == [0, 1, 2]
    assert all(r["step"] == 60 and r["met"] == (r["value"] >= 0.95) for r in point["runs"])
    report = (root / "runs" / "c05-small" / "verdict.md").read_text()
    assert (
        all(c["outcome"] == "holds" for c in on_disk["controls"]) and len(on_disk["controls"]) == 2
    )
    assert on_disk["attempt"] == {"number": 1, "reason": "", "earlier": []}
    assert "one-sample t" in report and "Why each test" in report
    assert "SUPPORTED" in report and f"sha256:{evidence.contract_sha256[:16]}" in report


def test_mlflow_holds_nested_runs_with_tags_params_and_histories(finished):
    _, _, uri, evidence = finished
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("c05-small")
    runs = client.search_runs([exp.experiment_id])
    parent = [r for r in runs if r.data.tags.get("gates.role") == "contract"]
    children = [r for r in runs if r.data.tags.get("gates.role") == "run"]
    assert len(parent) == 1 and len(children) == 12
    parent = parent[0]
    assert parent.data.tags["gates.verdict"] == "supported"
    assert parent.data.tags["gates.condition.supported_if.0"] == "holds"
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"evidence.json", "verdict.md", "learning_curves.png", "conditions.png"} <= artifacts
    for child in children:
        tags, params = child.data.tags, child.data.params
        assert tags["mlflow.parentRunId"] == parent.info.run_id
        assert tags["gates.contract"] == "c05-small"
        assert tags["gates.status"] == "completed" and tags["gates.halt_reason"] == ""
        assert tags["gates.arm"] in (
            "flat_address",
            "path_only",
            "subheap_kernel",
            "path_subheap_kernel",
        )
        assert params["seed"] == tags["gates.seed"]
        assert params["contract_sha256"] == evidence.contract_sha256
        assert params["features"] == tags["gates.arm"] and params["train_trees"] == "120"
        assert "gates.git_commit" in tags and "gates.git_dirty" in tags
        # where it ran: params and the tag a resumed run reads back (tests run on the CPU)
        assert params["device"] == "auto" and params["env.device"] == "cpu" and params["env.torch"]
        assert json.loads(tags["gates.environment"])["device"] == "cpu"
        history = client.get_metric_history(child.info.run_id, "test_acc")
        assert sorted({m.step for m in history}) == [20, 40, 60]


def test_rerun_reuses_finished_runs_and_fresh_redoes_them(finished, monkeypatch):
    root, _, uri, evidence = finished
    monkeypatch.chdir(root)
    loaded = load_contract("contracts/c05-small.yaml")
    recorded = {p: p.read_bytes() for p in (root / "runs").rglob("*") if p.is_file()}
    # a contract with evidence is reproduced and compared with its record, writing nothing under runs/
    outcome = run_plan(loaded, uri, root / "runs")
    assert (
        not outcome.recorded
        and outcome.reproduction.reproduces
        and outcome.reproduction.max_rel_diff == 0
    )
    assert (outcome.reuse.reused, outcome.reuse.trained) == (12, 0)
    again = outcome.evidence
    assert [r.mlflow_run_id for r in again.runs] == [r.mlflow_run_id for r in evidence.runs]
    assert [r.environment for r in again.runs] == [r.environment for r in evidence.runs]
    assert [r.metrics for r in again.runs] == [r.metrics for r in evidence.runs]  # deterministic
    fresh = run_contract(loaded, uri, root / "runs", fresh=True)
    assert not {r.mlflow_run_id for r in fresh.runs} & {r.mlflow_run_id for r in evidence.runs}
    assert [r.metrics for r in fresh.runs] == [r.metrics for r in evidence.runs]
    assert {p: p.read_bytes() for p in (root / "runs").rglob("*") if p.is_file()} == recorded


def test_verify_accepts_comment_edit_and_catches_threshold_edit_and_forgery(finished, tmp_path):
    import shutil

    root, path, _, _ = finished
    project = tmp_path / "p"
    shutil.copytree(root / "contracts", project / "contracts")
    shutil.copytree(root / "runs", project / "runs")
    contract = project / "contracts" / "c05-small.yaml"
    evidence_path = project / "runs" / "c05-small" / "evidence.json"

    def check():
        import os

        cwd = os.getcwd()
        os.chdir(project)
        try:
            return verify(project / "runs", project / "contracts")[0]
        finally:
            os.chdir(cwd)

    assert check().status == "ok"
    original = contract.read_text()
    contract.write_text("# a comment changes nothing\n" + original)
    assert check().status == "ok"

    data = yaml.safe_load(original)
    data["decision"]["supported_if"][0]["value"] = 0.4
    write_contract(contract.parent, data, contract.name)
    result = check()
    assert result.status == "lost" and result.codes[0] == CONTRACT_EDITED
    assert "edited after its evidence" in result.problems[0]
    contract.write_text(original)

    forged = json.loads(evidence_path.read_text())
    forged["verdict"] = "refuted"
    evidence_path.write_text(json.dumps(forged))
    result = check()
    assert result.status == "lost" and VERDICT in result.codes
    assert any("does not reproduce" in p for p in result.problems)

    forged["verdict"] = "supported"
    for r in forged["runs"]:
        if r["arm"] == "subheap_kernel":
            r["metrics"]["test_loss"] = 5.0  # doctored numbers no longer support the verdict
    evidence_path.write_text(json.dumps(forged))
    assert check().status == "lost"

    evidence_path.unlink()  # indexed evidence gone without a withdrawal (runs/INDEX.jsonl) is lost, not pending
    result = check()
    assert result.status == "lost" and result.codes == [HISTORY]
    assert "disappeared without a withdrawal" in result.problems[0]


def test_verify_cli_exit_codes(finished, tmp_path):
    import shutil

    root, _, _, _ = finished
    project = tmp_path / "p"
    shutil.copytree(root / "contracts", project / "contracts")
    shutil.copytree(root / "runs", project / "runs")
    gates = [sys.executable, "-m", "gates"]
    ok = subprocess.run(gates + ["verify"], cwd=project, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    (project / "runs" / "c05-small" / "evidence.json").unlink()
    lost = subprocess.run(
        gates + ["verify", "contracts/c05-small.yaml"], cwd=project, capture_output=True, text=True
    )
    assert lost.returncode == 1 and "evidence missing" in lost.stdout
    bad = subprocess.run(
        gates + ["verify", "contracts/nope.yaml"], cwd=project, capture_output=True, text=True
    )
    assert bad.returncode == 2 and "Traceback" not in bad.stderr


def test_edited_contract_with_evidence_refuses_to_run(finished, tmp_path):
    root, _, uri, _ = finished
    data = small_c05()
    data["decision"]["alpha"] = 0.01
    path = write_contract(tmp_path, data)
    with pytest.raises(UserError, match="edited after its evidence"):
        run_contract(load_contract(path), uri, root / "runs")


def test_futility_halt_is_recorded_and_refutes(workdir):
    data = small_c05(id="c05-futile")
    # the contract names path_only in its decision; a futility rule it cannot pass halts it
    data["stop_rules"]["futility"] = [
        {
            "metric": "test_acc",
            "at_step": 40,
            "worse_than": 0.99,
            "window": 20,
            "min_rel_improvement": 0.5,
            "arms": ["path_only"],
        }
    ]
    path = write_contract(workdir / "contracts", data)
    uri = f"sqlite:///{workdir / 'mlflow.db'}"
    evidence = run_contract(load_contract(path), uri, workdir / "runs")
    halted = [r for r in evidence.runs if r.status == "halted"]
    assert {(r.arm, r.halt_reason) for r in halted} == {("path_only", "futility")}
    assert evidence.verdict == "refuted"
    client = MlflowClient(uri)
    run = client.get_run(halted[0].mlflow_run_id)
    assert (
        run.data.tags["gates.status"] == "halted"
        and run.data.tags["gates.halt_reason"] == "futility"
    )
    assert max(m.step for m in client.get_metric_history(run.info.run_id, "test_acc")) == 40


def test_preflight_refuses_capacity_mismatch_and_cost_overrun(workdir):
    data = small_c05(id="c05-capacity")
    data["preflight"]["capacity_match"] = {
        "arms": ["flat_address", "subheap_kernel"],
        "tolerance": 0.02,
    }
    data["preflight"]["compute_cost"]["max_ratio"] = 2
    path = write_contract(workdir / "contracts", data)
    with pytest.raises(UserErrors) as info:
        run_contract(load_contract(path), f"sqlite:///{workdir / 'mlflow.db'}", workdir / "runs")
    text = info.value.render()
    assert "preflight.capacity_match.tolerance: trainable parameters differ" in text
    assert (
        "preflight.compute_cost.max_ratio: arm 'path_subheap_kernel' measures flops ratio" in text
    )
    assert not (workdir / "mlflow.db").exists()  # refused before any step or store


def test_capacity_match_of_a_named_part(workdir, monkeypatch):
    """capacity_match.part compares the study's parameter_parts (the parts being compared, not totals):
    a part the study does not have is refused by name, a matched part passes although totals differ."""
    from gates.execution import preflight
    from gates.models.c05_probe import C05ProbeStudy

    data = small_c05(id="c05-part")
    data["preflight"]["capacity_match"] = {
        "arms": ["flat_address", "subheap_kernel"],
        "tolerance": 0.05,
        "part": "reader",
    }
    path = write_contract(workdir / "contracts", data)
    report = preflight(load_contract(path))
    assert len(report.errors) == 1
    assert (
        "preflight.capacity_match.part: study 'c05_probe' has no parameter part 'reader' for arm "
        "'flat_address'; expected one of: none"
    ) in report.errors[0].render()

    readers = {"flat_address": 1000, "subheap_kernel": 1040}
    monkeypatch.setattr(
        C05ProbeStudy,
        "parameter_parts",
        lambda self, cfg: {"reader": readers[cfg.features], "rest": 7},
    )
    report = preflight(load_contract(path))
    assert not report.errors
    assert (
        "capacity match (reader): flat_address=1000, subheap_kernel=1040 within 4.00% (tolerance 5.00%)"
        in report.notes
    )
    readers["subheap_kernel"] = 1100
    report = preflight(load_contract(path))
    assert "'reader' parameters differ by 10.00%" in report.errors[0].render()


def test_kill_mid_run_loses_no_finished_run(workdir):
    """SIGKILL `gates run` mid-contract: finished runs survive in MLflow, no evidence is half-written,
    and the next run reuses them and marks the killed one."""
    import os
    import signal

    data = small_c05(id="c05-kill")
    data["budget"] = {"steps": 60, "eval_every": 20}
    path = write_contract(workdir / "contracts", data)
    uri = f"sqlite:///{workdir / 'mlflow.db'}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "gates", "run", str(path), "--tracking-uri", uri, "--json"],
        cwd=workdir,
        stdout=subprocess.PIPE,
        text=True,
    )
    finished_ids = []
    for line in proc.stdout:  # wait for two finished runs, then kill without warning
        event = json.loads(line)
        if event["event"] != "run":  # a progress event follows each run's
            continue
        finished_ids.append(event["mlflow_run_id"])
        if len(finished_ids) == 2:
            os.kill(proc.pid, signal.SIGKILL)
            break
    proc.wait()
    assert not (workdir / "runs" / "c05-kill" / "evidence.json").exists()
    evidence = run_contract(load_contract(path), uri, workdir / "runs")
    reused = [r.mlflow_run_id for r in evidence.runs][:2]
    assert reused == finished_ids
    assert evidence.verdict == "supported" and len(evidence.runs) == 12


def test_replay_compares_model_metrics_but_not_machine_metrics(tmp_path, monkeypatch):
    """`verify --replay` re-runs the contract: a recorded number the replay does not reproduce is
    lost evidence, except the study's machine metrics (speed, memory), which belong to the machine."""
    from gates.models.c05_probe import C05ProbeStudy
    from gates.verify import MACHINE_BOUND

    data = small_c05(replay={"ci": True, "abs_tolerance": 1e-6, "rel_tolerance": 1e-6})
    (tmp_path / "contracts").mkdir()
    write_contract(tmp_path / "contracts", data, "c05-small.yaml")
    monkeypatch.chdir(tmp_path)
    run_contract(
        load_contract("contracts/c05-small.yaml"),
        f"sqlite:///{tmp_path / 'mlflow.db'}",
        tmp_path / "runs",
    )
    evidence_path = tmp_path / "runs" / "c05-small" / "evidence.json"
    doctored = json.loads(evidence_path.read_text())
    for r in doctored["runs"]:
        r["metrics"]["hit_at_3"] += 1.0  # declared a machine metric below: not compared
        r["metrics"]["mean_rank"] += 1.0  # a model metric: must replay
    evidence_path.write_text(json.dumps(doctored))
    monkeypatch.setattr(C05ProbeStudy, "machine_metrics", frozenset({"hit_at_3"}))
    (check,) = verify(tmp_path / "runs", tmp_path / "contracts", replay=True)
    assert check.replayed and check.status == "lost"
    assert any("mean_rank replays as" in p for p in check.problems)
    assert not any("hit_at_3" in p for p in check.problems)
    assert MACHINE_BOUND not in check.codes  # the decision reads no machine metric here
