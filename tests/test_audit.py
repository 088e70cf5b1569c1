"""Spot-check audits (`gates verify --audit-seconds`): the seeded choice within a budget, and a real
re-run of recorded C05 runs: honest evidence reproduces; a per-seed value edited consistently with
everything derived from it (verdict.md re-rendered, the index told) is caught and named."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from gates.contract import load_contract
from gates.execution import run_contract
from gates.record import record_entry, render_report
from gates.verify import Candidate, choose, commit_seed, verify
from tests.conftest import small_c05, write_contract

pytestmark = pytest.mark.usefixtures("one_thread")


def candidates() -> list[Candidate]:
    return [Candidate(f"claim-{i % 3}", f"arm{i % 4}", i, float(i % 9)) for i in range(60)]


def test_choice_is_seeded_fills_the_budget_and_moves_with_the_seed():
    found = candidates()
    chosen = choose(found, 30, seed=1)
    assert chosen == choose(
        list(reversed(found)), 30, seed=1
    )  # the same runs whatever order they come in
    spent = sum(c.cost for c in chosen)
    assert spent <= 30
    assert all(
        c.cost > 30 - spent for c in found if c not in chosen
    )  # nothing left out would still fit
    others = [choose(found, 30, seed=s) for s in range(2, 7)]
    assert all(set(o) != set(chosen) for o in others)  # another commit, other runs
    assert choose(found, 0.1, seed=1) == []
    assert all(c.cost <= 5 for c in choose(found, 5, seed=3))


def test_the_seed_comes_from_the_commit():
    seed, origin = commit_seed()
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode == 0:
        assert (
            seed == int(head.stdout.strip()[:16], 16)
            and origin == f"from commit {head.stdout.strip()[:12]}"
        )


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """Two small C05 contracts run into a temp project: c05-small (audited) and c05-ci (replayed in CI,
    so never audited)."""
    root = tmp_path_factory.mktemp("project")
    (root / "contracts").mkdir()
    write_contract(root / "contracts", small_c05(), "c05-small.yaml")
    write_contract(root / "contracts", small_c05(id="c05-ci", replay={"ci": True}), "c05-ci.yaml")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    cwd = os.getcwd()
    os.chdir(root)
    try:
        for name in ("c05-small", "c05-ci"):
            run_contract(load_contract(f"contracts/{name}.yaml"), uri, root / "runs")
    finally:
        os.chdir(cwd)
    return root


@pytest.fixture
def project(recorded, tmp_path):
    copy = tmp_path / "p"
    shutil.copytree(recorded, copy)
    return copy


def test_honest_runs_reproduce_and_the_plan_is_printed(project):
    result = subprocess.run(
        [sys.executable, "-m", "gates", "verify", "--audit-seconds", "600", "--audit-seed", "5"],
        cwd=project,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert (
        "audit: seed 5 (given), budget 600 s: 8 of 8 completed runs of 1 claims not replayed in CI"
        in out
    )
    chosen = [line for line in out.splitlines() if line.startswith("audit: chose ")]
    assert len(chosen) == 8 and all(
        "c05-small " in line for line in chosen
    )  # c05-ci is replayed in CI instead
    assert out.count(": reproduces (") == 8 and "DOES NOT" not in out
    assert "ok c05-small: " in out and "(audited 8 runs)" in out


def tamper(project, arm: str, seed: int, metric: str, delta: float) -> None:
    """Edit one recorded per-seed value and everything that would give it away without a re-run."""
    folder = project / "runs" / "c05-small"
    ev = json.loads((folder / "evidence.json").read_text())
    run = next(r for r in ev["runs"] if r["arm"] == arm and r["seed"] == seed)
    run["metrics"][metric] += delta
    (folder / "evidence.json").write_text(json.dumps(ev, indent=2) + "\n")
    (folder / "verdict.md").write_text(render_report(ev))
    record_entry(project / "runs", folder / "evidence.json", "rederived", "a quiet edit")


def test_a_consistently_edited_value_is_caught_by_the_audit_only(project, monkeypatch):
    monkeypatch.chdir(project)
    # train_loss is read by no condition: re-deriving the verdict cannot see the edit
    tamper(project, "subheap_kernel", 1, "train_loss", 0.004)
    checks = {c.contract_id: c for c in verify(project / "runs", project / "contracts")}
    assert checks["c05-small"].status == "ok", checks["c05-small"].problems

    lines = []
    checks = {
        c.contract_id: c
        for c in verify(
            project / "runs",
            project / "contracts",
            audit_seconds=600,
            audit_seed=5,
            log=lines.append,
        )
    }
    small = checks["c05-small"]
    assert small.status == "lost" and len(small.audited) == 8
    (problem,) = small.problems
    assert problem.startswith(
        "audit: subheap_kernel/seed 1 does not reproduce: train_loss re-runs as "
    )
    assert "tolerance abs 1e-06, rel 1e-06" in problem
    assert "audit: c05-small subheap_kernel/seed 1: DOES NOT reproduce" in "\n".join(lines)
    assert checks["c05-ci"].status == "ok" and checks["c05-ci"].audited == []

    # a tolerance for contracts without a replay section, as wide as the edit, lets it through
    checks = {
        c.contract_id: c
        for c in verify(
            project / "runs",
            project / "contracts",
            audit_seconds=600,
            audit_seed=5,
            audit_tolerance=(0.01, 0.0),
        )
    }
    assert checks["c05-small"].status == "ok"


def test_machine_metrics_are_not_audited(project, monkeypatch):
    from gates.models.c05_probe import C05ProbeStudy

    monkeypatch.chdir(project)
    tamper(project, "flat_address", 0, "train_loss", 0.5)
    monkeypatch.setattr(C05ProbeStudy, "machine_metrics", frozenset({"train_loss"}))
    (small,) = [
        c
        for c in verify(project / "runs", project / "contracts", audit_seconds=600, audit_seed=5)
        if c.contract_id == "c05-small"
    ]
    assert small.status == "ok" and len(small.audited) == 8


def test_a_small_budget_chooses_few_runs(project):
    from gates.verify import OVERHEAD_S

    ev = json.loads((project / "runs" / "c05-small" / "evidence.json").read_text())
    costs = sorted(r["seconds"] + OVERHEAD_S for r in ev["runs"])
    budget = round(costs[0] + costs[1], 3)  # room for two of the cheapest runs, never for all eight
    lines = []
    checks = verify(
        project / "runs",
        project / "contracts",
        audit_seconds=budget,
        audit_seed=5,
        log=lines.append,
    )
    small = next(c for c in checks if c.contract_id == "c05-small")
    plan = lines[0]
    chosen = [line for line in lines if line.startswith("audit: chose ")]
    assert (
        plan.startswith(f"audit: seed 5 (given), budget {budget:g} s: ") and 1 <= len(chosen) <= 2
    )
    assert len(small.audited) <= len(chosen) and small.status == "ok"


def test_a_run_is_re_run_on_the_thread_count_it_recorded(project, monkeypatch):
    """A CPU run's sums depend on how many threads split them (an sfe_v10 seed recorded on 1 thread
    re-ran 4% off on CI's 2): the audit re-runs each run on its recorded count and restores the
    process's count afterwards; a run recorded without a count runs on the current one."""
    import torch

    from gates.study import cpu_threads, recorded_threads
    from gates.verify import rerun

    monkeypatch.chdir(project)
    loaded = load_contract("contracts/c05-small.yaml")
    ev = json.loads((project / "runs" / "c05-small" / "evidence.json").read_text())
    run = ev["runs"][0]
    seen = []
    # what is checked is the audit's thread handling, so the training is replaced by a thread probe
    monkeypatch.setattr(
        loaded.study,
        "run",
        lambda config, seed, reporter: seen.append(torch.get_num_threads()) or {},
    )
    with cpu_threads(1):
        run["environment"] = {"device": "cpu", "threads": "3"}
        rerun(loaded, ev, run["arm"], run["seed"])
        assert seen == [3] and torch.get_num_threads() == 1
        run.pop("environment")
        rerun(loaded, ev, run["arm"], run["seed"])
        assert seen == [3, 1]
    assert recorded_threads({"threads": "2"}) == 2
    assert recorded_threads(None) is None and recorded_threads({"threads": "0"}) is None
    assert recorded_threads({"device": "cpu"}) is None
