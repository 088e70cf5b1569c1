"""What the MLflow UI shows of a contract (issue #27): a training experiment (not MLflow 3's GenAI
view), each (metric, step) of an arm x seed run logged once, and a claim's withdrawal or supersession
on its parent run's tags. Real runs into a real SQLite store, read back with MlflowClient."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import pytest
import yaml
from mlflow import MlflowClient

from gates.contract import condition_terms, load_contract
from gates.execution import run_plan
from gates.record import MLflowMetricSink, withdraw_claim_run
from tests.conftest import write_contract
from tests.helpers import gates
from tests.test_tracking_store import tiny_contract

pytestmark = pytest.mark.usefixtures("one_thread")

OLD, NEW = "c05-view", "c05-view-v2"


def record(project: Path, contract: Path):
    """`gates run` of `contract` in `project` (its cwd), into the project's store."""
    cwd = os.getcwd()
    os.chdir(project)
    try:
        return run_plan(load_contract(contract), store_uri(project), project / "runs")
    finally:
        os.chdir(cwd)


def store_uri(project: Path) -> str:
    return f"sqlite:///{project / 'mlflow.db'}"


def parent_tags(project: Path, contract_id: str) -> dict[str, str]:
    """The tags of the parent run a claim's evidence names."""
    evidence = json.loads((project / "runs" / contract_id / "evidence.json").read_text())
    client = MlflowClient(evidence["mlflow"]["tracking_uri"])
    return client.get_run(evidence["mlflow"]["parent_run_id"]).data.tags


@pytest.fixture(scope="module")
def project(make_project):
    """A recorded tiny C05 claim, then a new version of it (`supersedes`) recorded beside it."""
    root = make_project(name="view")
    old = tiny_contract(root / "contracts", OLD)
    record(root, old)
    data = {**yaml.safe_load(old.read_text()), "id": NEW, "supersedes": OLD}
    record(root, write_contract(root / "contracts", data, f"{NEW}.yaml"))
    return root


def test_experiment_opens_in_the_training_view(project):
    client = MlflowClient(store_uri(project))
    for contract_id in (OLD, NEW):
        tags = client.get_experiment_by_name(contract_id).tags
        assert tags["mlflow.experimentKind"] == "custom_model_development", tags


# The keys MLflow 3.17's UI reads from a shared view (its bundle: the runs page's search facets, then
# its UI state); a key outside them would be ignored without a word
SHARED_VIEW_KEYS = {
    "searchFilter", "orderByKey", "orderByAsc", "startTime", "lifecycleFilter",
    "modelVersionFilter", "datasetsFilter", "selectedColumns", "columnOrder", "columnWidths",
    "compareRunCharts", "compareRunSections", "viewMaximized", "runListHidden",
    "isAccordionReordered", "groupBy", "groupsExpanded", "useGroupedValuesInCharts",
    "hideEmptyCharts", "globalLineChartConfig", "chartsSearchFilter",
}  # fmt: skip


def test_experiment_carries_the_arms_view_charting_what_the_decision_reads(project):
    """The view the dashboard links to: its filter finds exactly the arm x seed runs, and it charts
    each metric the decision reads, grouped by arm."""
    client = MlflowClient(store_uri(project))
    experiment = client.get_experiment_by_name(OLD)
    view = json.loads(experiment.tags["mlflow.sharedViewState.gates-arms"])
    assert set(view) <= SHARED_VIEW_KEYS
    found = client.search_runs([experiment.experiment_id], view["searchFilter"])
    assert len(found) == 12 and {r.data.tags["gates.role"] for r in found} == {"run"}
    assert view["groupBy"]["groupByKeys"] == [{"mode": "tag", "groupByData": "gates.arm"}]
    charted = [chart["metricKey"] for chart in view["compareRunCharts"]]
    contract = load_contract(project / "contracts" / f"{OLD}.yaml").contract
    decided = {metric for _, _, c in contract.conditions() for _, metric in condition_terms(c)}
    assert decided and decided <= set(charted)
    assert all(metric in found[0].data.metrics for metric in charted)
    assert {chart["metricSectionId"] for chart in view["compareRunCharts"]} == {
        section["uuid"] for section in view["compareRunSections"]
    }


def test_each_metric_step_is_logged_once_per_run(project):
    client = MlflowClient(store_uri(project))
    experiment = client.get_experiment_by_name(OLD).experiment_id
    children = client.search_runs([experiment], "tags.gates.role = 'run'")
    assert len(children) == 12
    for run in children:
        assert {"gates.arm", "gates.seed", "gates.contract"} <= set(run.data.tags)  # grouped by
        for metric in run.data.metrics:
            steps = Counter(m.step for m in client.get_metric_history(run.info.run_id, metric))
            assert max(steps.values()) == 1, (run.info.run_name, metric, steps)
            assert sorted(steps) == [10, 20]  # the last step is still there, once


def test_a_metric_returned_only_at_the_end_is_logged_at_the_last_step(project):
    """The sink drops a point already logged at its step, keeps one that is new there."""
    client = MlflowClient(store_uri(project))
    run = client.create_run(client.get_experiment_by_name(OLD).experiment_id, run_name="sink")
    sink = MLflowMetricSink(client, run.info.run_id)
    sink.add(10, {"loss": 2.0})
    sink.add(20, {"loss": 1.0})
    sink.flush()  # the last report already written when the final metrics come
    sink.add(20, {"loss": 1.0, "test_acc": 0.5})
    sink.flush()
    history = {
        k: [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, k)]
        for k in ("loss", "test_acc")
    }
    assert history == {"loss": [(10, 2.0), (20, 1.0)], "test_acc": [(20, 0.5)]}
    client.delete_run(run.info.run_id)


def test_a_superseding_claim_tags_the_old_parent_run(project):
    old = parent_tags(project, OLD)
    assert old["gates.superseded_by"] == NEW
    assert "gates.superseded_by" not in parent_tags(project, NEW)


def test_withdraw_tags_the_parent_run_and_a_new_attempt_clears_it(project):
    verdict = parent_tags(project, NEW)["gates.verdict"]
    done = gates(project, "withdraw", NEW, "--reason", "the probe saw its labels")
    assert done.returncode == 0, done.stderr
    assert "not updated" not in done.stdout
    tags = parent_tags(project, NEW)
    assert tags["gates.withdrawn"] == "true" and tags["gates.verdict"] == "withdrawn"
    assert tags["gates.withdrawal_reason"] == "the probe saw its labels"
    assert tags["gates.recorded_verdict"] == verdict
    # running it again records it anew on the same parent run (same contract and code): standing
    again = record(project, project / "contracts" / f"{NEW}.yaml")
    assert again.recorded and again.reuse.trained == 0
    tags = parent_tags(project, NEW)
    assert tags["gates.verdict"] == verdict
    assert not {"gates.withdrawn", "gates.withdrawal_reason", "gates.recorded_verdict"} & set(tags)


@pytest.mark.parametrize(
    "uri",
    [
        "sqlite:///mlflow.db",  # relative: run elsewhere
        "sqlite:////nonexistent-host-path/mlflow.db",  # another machine's path
        "file:///nonexistent-host-path/mlruns",
        "http://127.0.0.1:9",  # a server that does not answer (the discard port)
    ],
)
def test_withdrawal_with_an_unreachable_store_says_so_in_one_line(tmp_path, uri):
    evidence = tmp_path / "runs" / "c" / "evidence.json"
    evidence.parent.mkdir(parents=True)
    mlflow = {"tracking_uri": uri, "experiment_id": "1", "parent_run_id": "0" * 32}
    evidence.write_text(json.dumps({"verdict": "supported", "mlflow": mlflow}))
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        note = withdraw_claim_run(evidence, "wrong corpus", uri)
    finally:
        os.chdir(cwd)
    assert note.startswith("MLflow tags not updated") and "\n" not in note, note
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"]  # no store created


def test_gates_withdraw_succeeds_without_its_store(tmp_path):
    """A committed claim whose store (`sqlite:///mlflow.db`) is not in this project: withdrawn, in
    the claims history, with one line saying the MLflow tags were not updated."""
    from tests.conftest import copy_claims

    root = copy_claims(tmp_path, "c05-structural-probe")
    done = gates(root, "withdraw", "c05-structural-probe", "--reason", "wrong corpus")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("withdrawn c05-structural-probe: wrong corpus")
    assert len(lines) == 2 and lines[1].startswith("MLflow tags not updated"), done.stdout
    assert not (root / "mlflow.db").exists()
    assert '"kind": "withdrawn"' in (root / "runs" / "INDEX.jsonl").read_text()


def test_withdraw_never_connects_to_the_store_the_evidence_names(tmp_path):
    """Evidence is data anyone can edit: its `mlflow.tracking_uri` pointed at a server must not make
    `gates withdraw` send it anything. The user's store (here the default, absent) is the one used."""
    import socket

    from tests.conftest import copy_claims

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    try:
        root = copy_claims(tmp_path, "c05-structural-probe")
        evidence = root / "runs" / "c05-structural-probe" / "evidence.json"
        ev = json.loads(evidence.read_text())
        ev["mlflow"]["tracking_uri"] = f"http://127.0.0.1:{listener.getsockname()[1]}"
        evidence.write_text(json.dumps(ev))
        done = gates(
            root,
            "withdraw",
            "c05-structural-probe",
            "--reason",
            "x",
            env={"MLFLOW_TRACKING_URI": ""},
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        assert "sqlite:///mlflow.db" in done.stdout  # the user's store, not found: one line
        listener.setblocking(False)
        with pytest.raises(BlockingIOError):  # no connection was ever made to the recorded one
            listener.accept()
    finally:
        listener.close()


def test_the_arms_view_of_a_contract_naming_many_metrics_fits_an_experiment_tag(monkeypatch):
    """MLflow refuses a tag past 20,000 characters: the last charts give way, the decision's stay."""
    from types import SimpleNamespace

    from gates.record import _plots, _tracking

    names = [f"metric_{i:03d}" for i in range(80)]
    monkeypatch.setattr(_plots, "plotted_metrics", lambda contract: names)
    view = _tracking.arms_view(SimpleNamespace(id="many"))
    charted = [chart["metricKey"] for chart in json.loads(view)["compareRunCharts"]]
    assert len(view) <= 20000 and 1 < len(charted) < 80 and charted == names[: len(charted)]
