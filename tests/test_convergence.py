"""Convergence (issue #11): a completed run whose metric still improved by more than the bar over the
last `window` steps is not converged; the evidence, MLflow, verdict.md, verify and preflight know it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from mlflow import MlflowClient

from gates.contract import Convergence, load_contract
from gates.entities import ConvergenceRecord
from gates.errors import UserError, UserErrors
from gates.execution import convergence, is_converged, preflight
from gates.record import Evidence, read_evidence, render_report
from gates.verify import check_claim, find_contracts
from gates.verify._verify import _check_convergence
from tests.conftest import copy_claims, frozen_evidence, small_c05, write_contract
from tests.helpers import run_contract

pytestmark = pytest.mark.usefixtures("one_thread")

RULE = {"metric": "train_loss", "window": 20, "max_rel_improvement": 0.01}


def _run(root: Path, data: dict) -> Evidence:
    (root / "contracts").mkdir(exist_ok=True)
    write_contract(root / "contracts", data, f"{data['id']}.yaml")
    cwd = os.getcwd()
    os.chdir(root)
    try:
        return run_contract(
            load_contract(f"contracts/{data['id']}.yaml"),
            f"sqlite:///{root / 'mlflow.db'}",
            root / "runs",
        )
    finally:
        os.chdir(cwd)


@pytest.fixture(scope="module")
def still_improving(tmp_path_factory):
    """Small C05 on 60 steps: the subheap kernels' train_loss still falls steeply at the end."""
    root = tmp_path_factory.mktemp("conv")
    return root, _run(root, small_c05(id="c05-conv", convergence=RULE))


# ------------------------------------------------------------------------------ the trend
def test_the_trend_is_measured_in_the_metrics_better_direction():
    rule = Convergence(metric="loss", window=20, max_rel_improvement=0.01)
    falling = [(10, 2.0), (20, 1.0), (30, 0.8), (40, 0.5)]
    judged = convergence(rule, "lower", falling)
    assert judged["converged"] is False
    assert judged["convergence"] == {
        "metric": "loss",
        "window": 20,
        "first_step": 20,
        "last_step": 40,
        "first_value": 1.0,
        "last_value": 0.5,
        "rel_improvement": 0.5,
    }
    flat = [(10, 2.0), (20, 1.0), (30, 1.0), (40, 0.999)]
    assert convergence(rule, "lower", flat)["converged"] is True
    # a rising accuracy is an improvement; a rising loss is not
    assert convergence(rule, "higher", [(20, 0.5), (40, 0.9)])["converged"] is False
    assert convergence(rule, "lower", [(20, 0.5), (40, 0.9)])["converged"] is True


def test_a_trend_that_cannot_be_measured_is_not_converged():
    rule = Convergence(metric="loss", window=20, max_rel_improvement=0.01)
    assert convergence(rule, "lower", [])["converged"] is False
    assert (
        convergence(rule, "lower", [(30, 1.0), (40, 1.0)])["converged"] is False
    )  # nothing 20 steps back
    judged = convergence(rule, "lower", [(20, 1.0), (40, float("nan"))])
    assert judged["converged"] is False and judged["convergence"]["last_value"] is None


# ------------------------------------------------------------------------------ end to end
def test_a_run_still_improving_is_marked_not_converged_and_the_verdict_says_so(still_improving):
    root, ev = still_improving
    assert all(
        isinstance(r.converged, bool) and r.convergence.metric == "train_loss" for r in ev.runs
    )
    subheap = [r for r in ev.runs if r.arm == "subheap_kernel"]
    assert all(r.converged is False and r.convergence.rel_improvement > 0.01 for r in subheap)
    assert ev.verdict == "inconclusive"
    assert any("still improving at the end of training: subheap_kernel" in r for r in ev.reasons)
    assert any("more steps for arm subheap_kernel" in s for s in ev.settle)
    report = (root / "runs" / "c05-conv" / "verdict.md").read_text()
    assert "| converged |" in report and "still improving: arm subheap_kernel seed 0 (+" in report
    tags = (
        MlflowClient(f"sqlite:///{root / 'mlflow.db'}").get_run(subheap[0].mlflow_run_id).data.tags
    )
    assert tags["gates.converged"] == "false"
    assert json.loads(tags["gates.convergence"]) == subheap[0].convergence.as_dict()


def test_resuming_reads_convergence_back_from_mlflow(still_improving):
    root, ev = still_improving
    again = _run(
        root, small_c05(id="c05-conv", convergence=RULE)
    )  # every run finished: none is redone
    assert [r.mlflow_run_id for r in again.runs] == [r.mlflow_run_id for r in ev.runs]
    assert [(r.converged, r.convergence) for r in again.runs] == [
        (r.converged, r.convergence) for r in ev.runs
    ]
    assert again.verdict == ev.verdict and again.settle == ev.settle


def test_verify_passes_and_catches_a_flipped_converged_flag(still_improving):
    root, _ = still_improving
    path = root / "runs" / "c05-conv" / "evidence.json"
    contract = root / "contracts" / "c05-conv.yaml"
    assert check_claim(path, {"c05-conv": contract}, replay=False).problems == []
    forged = json.loads(path.read_text())
    run = next(r for r in forged["runs"] if r["arm"] == "subheap_kernel")
    run["converged"] = True
    path.write_text(json.dumps(forged))
    problems = check_claim(path, {"c05-conv": contract}, replay=False).problems
    assert any("records converged=true, but its trend" in p for p in problems)
    # the engine re-derives the outcomes from the flag: the recorded ones are no longer what the runs give
    assert any("converged=true" not in p for p in problems), problems


def test_a_converged_run_is_marked_converged_and_a_halted_run_is_not_judged(workdir):
    data = small_c05(id="c05-conv-loose", convergence={**RULE, "max_rel_improvement": 1000.0})
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
    ev = _run(workdir, data)
    halted = [r for r in ev.runs if r.status == "halted"]
    completed = [r for r in ev.runs if r.status == "completed"]
    assert halted and not any(r.has("converged") or r.has("convergence") for r in halted)
    assert completed and all(r.converged is True for r in completed)
    tags = (
        MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")
        .get_run(halted[0].mlflow_run_id)
        .data.tags
    )
    assert "gates.converged" not in tags
    assert not any("still improving" in r for r in ev.reasons)


# ------------------------------------------------------------------------------ recorded claims
def test_evidence_without_convergence_is_unchanged(tmp_path):
    """A recorded contract without the rule (a copy of the frozen claim, brought to today's engine): no
    run carries convergence, verify asks for none, and verdict.md renders exactly as written, with no
    converged column, as the recorded one has none."""
    project = copy_claims(tmp_path, "c05-structural-probe-v2")
    folder = project / "runs" / "c05-structural-probe-v2"
    ev = read_evidence(folder / "evidence.json")
    loaded = load_contract(project / "contracts" / "c05-structural-probe-v2.yaml")
    assert loaded.contract.convergence is None
    assert not any(r.has("converged") or r.has("convergence") for r in ev.runs)
    assert not any(
        "converged" in r or "convergence" in r
        for r in frozen_evidence("c05-structural-probe-v2")["runs"]
    )
    assert _check_convergence(loaded, ev) == []
    assert render_report(ev) == (folder / "verdict.md").read_text()
    assert "converged" not in (folder / "verdict.md").read_text()
    assert (
        check_claim(
            folder / "evidence.json", find_contracts(project / "contracts"), replay=False
        ).status
        == "ok"
    )
    stored = ev.as_dict()
    forged = Evidence.of(
        {**stored, "runs": [{**stored["runs"][0], "converged": False}] + stored["runs"][1:]}
    )
    assert "the contract has no convergence rule" in _check_convergence(loaded, forged)[0]


def test_the_committed_example_is_inconclusive_for_want_of_steps(tmp_path):
    recorded = frozen_evidence(
        "c05-not-converged"
    )  # as recorded: the subheap kernel still improving
    assert any(r["arm"] == "subheap_kernel" and r["converged"] is False for r in recorded["runs"])
    project = copy_claims(tmp_path, "c05-not-converged")  # under today's engine
    ev = read_evidence(project / "runs" / "c05-not-converged" / "evidence.json")
    assert ev.verdict == "inconclusive"
    assert [r.converged for r in ev.runs if r.has("converged")] == [
        r["converged"] for r in recorded["runs"] if "converged" in r
    ]
    assert any("more steps for arm subheap_kernel" in s for s in ev.settle)


# ------------------------------------------------------------------------------ the window
@pytest.mark.parametrize(
    "window, message",
    [
        (
            50,
            "window 50 cannot be measured: the first evaluation is at step 20 and the run ends at 60",
        ),
        (10, "window 10 is shorter than eval_every 20"),
    ],
)
def test_window_validation_messages(workdir, window, message):
    path = write_contract(workdir / "contracts", small_c05(convergence={**RULE, "window": window}))
    with pytest.raises((UserError, UserErrors)) as caught:
        load_contract(path)
    assert message in caught.value.render()


def test_preflight_prints_the_rule_and_refuses_a_test_metric(workdir):
    ok = preflight(
        load_contract(write_contract(workdir / "contracts", small_c05(convergence=RULE)))
    )
    assert not ok.errors
    assert any(
        n.startswith(
            "convergence: train_loss (lower is better) from the evaluation at step 40 to the last "
            "at step 60"
        )
        for n in ok.notes
    )
    bad = preflight(
        load_contract(
            write_contract(
                workdir / "contracts",
                small_c05(convergence={**RULE, "metric": "test_acc"}),
                "t.yaml",
            )
        )
    )
    assert any("'test_acc' is a test metric" in e.render() for e in bad.errors)
    trend = ConvergenceRecord(metric="train_loss", window=RULE["window"], rel_improvement=None)
    assert is_converged(Convergence(**RULE), trend) is False
