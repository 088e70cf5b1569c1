"""`gates verify` checks evidence instead of trusting it (issue #17, section 1).

Every test copies frozen committed evidence (tests/fixtures/claims, brought to today's verdict engine by
tests.conftest.copy_claims) into a temporary project, tampers with it the way a careful forger would
(every field derived from the per-seed values recomputed and verdict.md re-rendered, so that only the
check under test can notice) and runs the real `gates verify`.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from gates.cli import app
from gates.contract import load_contract
from gates.inference import decide
from gates.record import EVIDENCE, REPORT, render_report
from gates.record._derive import run_records
from gates.verify import check_claim, find_contracts

C05 = "c05-structural-probe"
TUNED = "c05-structural-probe-tuned"


def settle(project: Path, contract_id: str, ev: dict, *, rederive: bool = True) -> None:
    """Write `ev` as runs/<id>/evidence.json with what today's code derives from its runs (verdict,
    conditions, reasons, ...) and verdict.md rendered from it, as `gates run` would have written it."""
    if rederive:
        loaded = load_contract(project / "contracts" / f"{contract_id}.yaml")
        again = decide(loaded.contract.decision, run_records(ev["runs"]), loaded.study.metrics)
        derived = again.to_dict()
        ev["verdict"] = again.verdict
        ev["settings"]["correction"] = again.correction
        for key in ("conditions", "reasons", "settle", "halts", "lost"):
            if key in derived:
                ev[key] = derived[key]
    folder = project / "runs" / contract_id
    (folder / EVIDENCE).write_text(json.dumps(ev, indent=2))
    (folder / REPORT).write_text(render_report(ev))


def evidence(project: Path, contract_id: str = C05) -> dict:
    return json.loads((project / "runs" / contract_id / EVIDENCE).read_text())


@pytest.fixture
def project(make_project) -> Path:
    """contracts/ and runs/ holding copies of two committed claims (one with tuning), as today's code
    records them (copy_claims re-derives them with today's engine and indexes them)."""
    return make_project(claims=(C05, TUNED))


def check(project: Path, contract_id: str = C05):
    """gates.verify's check of one claim's evidence (the claims history, runs/INDEX.jsonl, is checked
    apart from it by verify(): here the forger is assumed to have indexed the forged evidence too)."""
    evidence_path = project / "runs" / contract_id / EVIDENCE
    return check_claim(evidence_path, find_contracts(project / "contracts"), replay=False)


def lost_with(project: Path, needle: str, contract_id: str = C05) -> str:
    result = check(project, contract_id)
    assert result.status == "lost", result.problems
    assert any(needle in p for p in result.problems), result.problems
    return next(p for p in result.problems if needle in p)


def test_copied_claims_hold_their_evidence(project):
    for contract_id in (C05, TUNED):
        result = check(project, contract_id)
        assert result.status == "ok" and result.hash_ok is True, result.problems


def test_evidence_is_checked_against_the_repositorys_contract_not_the_path_it_names(
    project, tmp_path
):
    # another file with the same id and a lower bar, outside contracts/, named by the evidence
    other = yaml.safe_load((project / "contracts" / f"{C05}.yaml").read_text())
    other["decision"]["supported_if"][0]["value"] = 0.5
    forged = tmp_path / "elsewhere" / f"{C05}.yaml"
    forged.parent.mkdir()
    forged.write_text(yaml.safe_dump(other, sort_keys=False))
    ev = evidence(project)
    ev["contract_path"] = str(forged)
    ev["contract_sha256"] = load_contract(forged).sha256
    settle(project, C05, ev)
    problem = lost_with(project, "was edited after its evidence")
    assert str(forged) in problem and str(project / "contracts" / f"{C05}.yaml") in problem
    assert check(project).hash_ok is False

    # the dashboard shows the same: the repository's contract, edited after the evidence
    from gates.dashboard.data import HASH_EDITED, Claims, Store

    claims = Claims(
        project / "runs", project / "contracts", Store(f"sqlite:///{tmp_path / 'none.db'}")
    )
    assert claims.all()[C05].hash_status == HASH_EDITED
    assert claims.view(C05).contract is None  # thresholds are not drawn from either file

    # the same file inside contracts/: two contracts claim the id, and neither is taken on trust
    shutil.copy(forged, project / "contracts" / "zz-other.yaml")
    ev["contract_path"] = str(project / "contracts" / "zz-other.yaml")
    settle(project, C05, ev)
    assert "zz-other.yaml" in lost_with(project, f"all have id '{C05}'")


def test_a_deleted_run_is_lost(project):
    ev = evidence(project)
    del ev["runs"][4]
    settle(project, C05, ev)
    assert "the contract's 4 arms x 3 seeds are 12" in lost_with(project, "runs lack")


def test_a_run_with_a_seed_the_contract_does_not_list_is_lost(project):
    ev = evidence(project)
    ev["runs"].append({**ev["runs"][0], "seed": 7})
    settle(project, C05, ev)
    assert "seed 7" in lost_with(project, "which the contract does not list")


def test_a_duplicate_arm_seed_with_other_metrics_is_lost(project):
    ev = evidence(project)
    twin = json.loads(json.dumps(ev["runs"][0]))
    twin["metrics"] = {k: v * 0.5 for k, v in twin["metrics"].items()}
    ev["runs"].append(twin)
    settle(project, C05, ev)
    lost_with(project, "more than once")


def test_no_runs_and_an_inconclusive_verdict_is_lost(project):
    ev = evidence(project)
    ev["runs"] = []
    ev["falsifiable_point"]["runs"] = []
    settle(project, C05, ev)
    assert evidence(project)["verdict"] == "inconclusive"  # consistent with no runs at all
    assert "the evidence has 0 runs" in lost_with(project, "runs lack")


@pytest.mark.parametrize(
    "edit, needle",
    [
        (
            lambda ev: ev["settings"].update(alpha=0.1),
            "settings.alpha 0.1 is not the contract's 0.05",
        ),
        (lambda ev: ev["settings"].update(seeds=[0, 1, 2, 3]), "settings.seeds"),
        (lambda ev: ev["settings"]["budget"].update(steps=3000), "settings.budget.steps 3000"),
        (
            lambda ev: ev["settings"]["arm_configs"]["subheap_kernel"].update(lr=0.5),
            "settings.arm_configs.subheap_kernel.lr",
        ),
        (
            lambda ev: ev["settings"]["arm_configs"].pop("path_only"),
            "settings.arm_configs covers arms",
        ),
        (
            lambda ev: ev.update(claim="A much stronger claim."),
            "the recorded claim is not the contract's",
        ),
        (lambda ev: ev["falsifiable_point"].update(threshold=0.1), "falsifiable_point.threshold"),
    ],
)
def test_settings_and_claim_text_must_be_the_contracts(project, edit, needle):
    ev = evidence(project)
    edit(ev)
    settle(project, C05, ev)
    lost_with(project, needle)


def test_a_tuned_arms_recorded_config_is_checked_too(project):
    ev = evidence(project, TUNED)
    ev["settings"]["arm_configs"]["flat_address"]["lr"] = 0.001  # not the best trial's lr
    settle(project, TUNED, ev)
    lost_with(project, "not its declared one with the best trial's params", TUNED)


@pytest.mark.parametrize("field, value", [("estimate", 0.5), ("p_hold_adj", 1e-9), ("ci_low", 0.4)])
def test_condition_statistics_must_be_what_the_runs_give(project, field, value):
    ev = evidence(project)
    ev["conditions"][2][field] = value
    settle(project, C05, ev, rederive=False)  # verdict.md renders the doctored numbers
    assert f"recorded {field} {value!r}" in lost_with(project, "the recorded runs give")


def test_condition_values_must_be_the_recorded_per_seed_values(project):
    ev = evidence(project)
    term = next(iter(ev["conditions"][2]["values"]))
    ev["conditions"][2]["values"][term] = [0.0] * len(ev["conditions"][2]["values"][term])
    settle(project, C05, ev, rederive=False)
    lost_with(project, "recorded values")


def test_reasons_must_be_what_the_runs_give(project):
    ev = evidence(project)
    ev["reasons"] = ["every condition holds with a wide margin"]
    settle(project, C05, ev, rederive=False)
    lost_with(project, "the recorded reasons are not what the runs give")


def test_floats_within_rounding_are_the_same(project):
    ev = evidence(project)
    ev["conditions"][2]["estimate"] *= 1 + 1e-12
    settle(project, C05, ev, rederive=False)
    assert check(project).status == "ok"


def test_an_edited_verdict_md_is_lost_and_gates_render_rewrites_it(project):
    report = project / "runs" / C05 / REPORT
    recorded = evidence(project)["verdict"].upper()
    other = "REFUTED" if recorded != "REFUTED" else "SUPPORTED"
    text = report.read_text()
    assert f"**{recorded}**" in text
    report.write_text(text.replace(f"**{recorded}**", f"**{other}**"))
    lost_with(project, "is not the rendering of its evidence.json")
    runner = CliRunner()
    done = runner.invoke(
        app,
        [
            "verify",
            "--runs-dir",
            str(project / "runs"),
            "--contracts-dir",
            str(project / "contracts"),
        ],
    )
    assert done.exit_code == 1
    assert f"LOST {C05}" in done.output and f"`gates render {C05}` rewrites it" in done.output
    done = runner.invoke(app, ["render", C05, "--runs-dir", str(project / "runs")])
    assert done.exit_code == 0 and "rendered" in done.output
    assert report.read_text() == render_report(evidence(project))
    assert check(project).status == "ok"


def test_a_missing_verdict_md_is_lost(project):
    (project / "runs" / C05 / REPORT).unlink()
    lost_with(project, "cannot be read")


def test_the_dashboard_sees_an_edited_verdict_md(project, tmp_path):
    from gates.dashboard.data import Claims, Store

    claims = Claims(
        project / "runs", project / "contracts", Store(f"sqlite:///{tmp_path / 'none.db'}")
    )
    assert all("is not the rendering" not in p for p in claims.all()[C05].problems)
    report = project / "runs" / C05 / REPORT
    report.write_text(report.read_text() + "\nReviewed: beyond doubt.\n")
    assert any(
        "is not the rendering" in p for p in claims.all()[C05].problems
    )  # not a stale cached check
