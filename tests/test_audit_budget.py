"""The audit within its budget (issue #39, item 10): it never starts a run it cannot finish, judged
from the run's recorded seconds x SAFETY_FACTOR before the run starts (a run can be stopped only at a
report: a translator run started with 2.3 s of 100 left ran on for minutes); a run that no longer fits
is named with why. And a claim decided on a machine metric, which no re-run can re-check, is said to be
so. Real re-runs of the small C05 claims of tests/test_audit.py; what is asserted is what the audit
started (its study's runs, counted on the study's class) and what it said."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from gates.cli import app
from gates.record import render_report
from gates.verify import MACHINE_BOUND, SAFETY_FACTOR, UNAUDITED, estimate, verify
from tests.conftest import regenerate_history
from tests.test_audit import recorded  # noqa: F401  (a fixture: `project` copies it)
from tests.test_audit_unsteerable import SLEEP_S, _Slow

pytestmark = pytest.mark.usefixtures("one_thread")


def record_seconds(project, claim: str, arm: str, seconds: float) -> None:
    """Set the recorded seconds of every run of one arm (an honestly slow arm, as a translator's), and
    enter the evidence as it now is in the claims history."""
    runs = project / "runs"
    ev = json.loads((runs / claim / "evidence.json").read_text())
    for run in ev["runs"]:
        if run["arm"] == arm:
            run["seconds"] = seconds
    (runs / claim / "evidence.json").write_text(json.dumps(ev, indent=2) + "\n")
    (runs / claim / "verdict.md").write_text(render_report(ev))
    regenerate_history(runs)


def count_runs(monkeypatch, slow: bool = False) -> list[int]:
    """The seeds of every run the audit starts (on the class of the registry's study instance: an
    instance patch would outlive the test); `slow`: each report SLEEP_S later."""
    from gates.study import get_study

    study_cls = type(get_study("c05_probe"))
    run, seeds = study_cls.run, []

    def counted(self, config, seed, reporter):
        seeds.append(seed)
        return run(self, config, seed, _Slow(reporter) if slow else reporter)

    monkeypatch.setattr(study_cls, "run", counted)
    return seeds


def test_the_estimate_is_the_smaller_of_the_runs_and_its_arms_seconds():
    assert estimate(30.0, [30.0, 30.0]) == SAFETY_FACTOR * 30.0
    # one run recorded as slow (forged, or the first run's warm-up) is judged as its siblings are
    assert estimate(1e6, [0.1, 1e6]) == SAFETY_FACTOR * 0.1
    assert estimate(2.2, [0.09, 2.2, 0.1]) == SAFETY_FACTOR * 0.1
    assert estimate(None, [3.0]) == SAFETY_FACTOR * 3.0
    assert estimate(None, []) is None  # nothing recorded: started (the reporter stops it)


def test_a_run_longer_than_the_budget_is_never_started_and_named(project, monkeypatch):
    """c05-small's path_only runs recorded at 30 s each: x 2 is more than a 20 s budget could ever
    give them. They are not started (on main they were, to be stopped at a report that a translator
    run reaches only minutes later) and the claim says which and why; every other run is audited."""
    monkeypatch.chdir(project)
    record_seconds(project, "c05-small", "path_only", 30.0)
    started = count_runs(monkeypatch)
    lines = []
    checks = {
        c.contract_id: c
        for c in verify(
            project / "runs",
            project / "contracts",
            audit_seconds=20,
            audit_seed=5,
            log=lines.append,
        )
    }
    log = "\n".join(lines)
    assert "audit: re-running c05-small path_only/" not in log, log
    small = checks["c05-small"]
    assert small.status == "ok" and len(small.audited) == 9, log
    assert len(checks["c05-ci"].audited) == 12 and len(started) == 21, log
    (problem,) = small.problems
    assert problem.code == UNAUDITED
    assert (
        problem.startswith(
            "audit: 3 runs not started: judged to need more than the audit's budget of 20 s "
            "(recorded seconds x 2): path_only/seed "
        )
        and problem.count("(about 60.0 s)") == 3
    ), problem
    summary = [line for line in lines if line.startswith("audit: ")][-1]
    assert ": 21 compared, 0 unaudited; 3 too long for the budget" in summary, summary

    # the command says it under the claim, and fails on it only with --audit-strict
    args = ["verify", "--audit-seconds", "20", "--audit-seed", "5"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "    audit: 3 runs not started: judged to need more than the audit's budget" in (
        result.output
    )
    assert CliRunner().invoke(app, [*args, "--audit-strict"]).exit_code == 1


def test_a_run_that_no_longer_fits_the_time_left_is_not_started(project, monkeypatch):
    """Every c05-small run recorded at 4 s (x 2: 8 s) and really taking 3 x SLEEP_S (3.6 s) or more;
    a 10 s budget starts the first, after which less than 8 s are left, however fast the machine:
    the other eleven are passed over and listed with why, none started (on main the next one started
    with about 6 s left)."""
    monkeypatch.chdir(project)
    for arm in ("flat_address", "path_only", "subheap_kernel", "path_subheap_kernel"):
        record_seconds(project, "c05-small", arm, 4.0)
    started = count_runs(monkeypatch, slow=True)
    lines = []
    (small,) = verify(
        project / "runs",
        project / "contracts",
        [project / "contracts" / "c05-small.yaml"],
        audit_seconds=10,
        audit_seed=5,
        log=lines.append,
    )
    log = "\n".join(lines)
    assert len(started) == 1, log
    assert small.status == "ok" and len(small.audited) == 1 and UNAUDITED not in small.codes, log
    (passed,) = [line for line in lines if "judged to need more than the time left" in line]
    assert passed.startswith(
        "audit: c05-small: 11 runs not started: judged to need more than the time left "
        "(recorded seconds x 2): "
    ) and passed.endswith(" and 8 more"), passed
    assert "(about 8.0 s, " in passed
    summary = [line for line in lines if line.startswith("audit: ")][-1]
    assert summary.startswith("audit: 1 runs started in "), summary
    assert summary.endswith(": 1 compared, 0 unaudited; 11 not started (no longer fitting)")
    assert SLEEP_S * 3 > 10 - SAFETY_FACTOR * 4.0  # what makes the second run not fit


def test_a_claim_decided_on_a_machine_metric_is_named_not_re_checkable(project, monkeypatch):
    """A machine metric (wall-clock speed, memory) is never compared by a replay or an audit, so a
    claim whose conditions read one (spr096-read-cost-v2's latency_ms against dense_latency_ms) is
    not re-checked by any re-run: verify says so under the claim (code machine_bound), without
    losing it. Here c05's decision metric is declared a machine metric."""
    from gates.contract import load_contract, metric_locs
    from gates.models.c05_probe import C05ProbeStudy

    monkeypatch.chdir(project)
    loaded = load_contract(project / "contracts" / "c05-small.yaml")
    read = sorted({m for _, _, c in loaded.contract.conditions() for _, m in metric_locs(c)})
    monkeypatch.setattr(C05ProbeStudy, "machine_metrics", frozenset(read[:1]))
    checks = {c.contract_id: c for c in verify(project / "runs", project / "contracts")}
    small = checks["c05-small"]
    assert small.status == "ok" and small.codes == [MACHINE_BOUND], small.problems
    assert small.problems[0] == (
        f"not re-checkable by a re-run: its conditions read {read[0]}, machine metrics of study "
        f"'c05_probe' (they measure the machine that ran it); replays and audits compare its "
        f"other metrics only"
    )
    assert checks["c05-ci"].codes == [MACHINE_BOUND]  # the same decision
    result = CliRunner().invoke(app, ["verify"])
    assert result.exit_code == 0, result.output
    assert f"    not re-checkable by a re-run: its conditions read {read[0]}," in result.output

    monkeypatch.setattr(C05ProbeStudy, "machine_metrics", frozenset({"train_loss"}))  # read by none
    assert all(not c.problems for c in verify(project / "runs", project / "contracts"))
