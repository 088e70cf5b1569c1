"""Spot-check audits (`gates verify --audit-seconds`): the seeded order over every run, and a real
re-run of recorded C05 runs: honest evidence reproduces; a per-seed value edited consistently with
everything derived from it (verdict.md re-rendered, the index told) is caught and named. What a forger
cannot steer (recorded seconds, the CI-replay mark): tests/test_audit_unsteerable.py."""

from __future__ import annotations

import json

import pytest

from gates.contract import load_contract
from gates.record import render_report
from gates.verify import choose, verify
from gates.verify._audit import Candidate, fresh_seed
from tests.conftest import regenerate_history, small_c05
from tests.helpers import gates

pytestmark = pytest.mark.usefixtures("one_thread")


def candidates() -> list[Candidate]:
    return [Candidate(f"claim-{i % 3}", f"arm{i % 4}", i, float(i % 9)) for i in range(60)]


def test_the_order_is_seeded_covers_every_run_and_moves_with_the_seed():
    found = candidates()
    order = choose(found, seed=1)
    assert sorted(order, key=found.index) == found  # every run, none filtered
    assert order == choose(list(reversed(found)), seed=1)  # whatever order they come in
    others = [choose(found, seed=s) for s in range(2, 7)]
    assert all(o[:5] != order[:5] for o in others)  # another commit, other runs first
    # what a run records does not move it
    slow = [Candidate(c.contract_id, c.arm, c.seed, 1e6 if c.seed % 2 else None) for c in found]
    assert [(c.contract_id, c.arm, c.seed) for c in choose(slow, seed=1)] == [
        (c.contract_id, c.arm, c.seed) for c in order
    ]


def test_the_seed_is_drawn_afresh_not_taken_from_anything_a_forger_commits():
    """Whoever forges evidence makes the commits too: a seed from the commit could be ground until the
    forged run falls far down the order. Each audit draws its own."""
    drawn = {fresh_seed() for _ in range(5)}
    assert len(drawn) == 5 and {origin for _, origin in drawn} == {"random"}


@pytest.fixture(scope="module")
def recorded(make_project):
    """Two small C05 contracts run into a temp project: c05-small (audited) and c05-ci (replayed in CI,
    so never audited)."""
    return make_project(small_c05(), small_c05(id="c05-ci", replay={"ci": True}))


def audited(project, seconds: float, **kwargs) -> tuple[list, list[str]]:
    """`verify` of a project with an audit of `seconds` at seed 5: (its checks, the lines it logs)."""
    lines: list[str] = []
    checks = verify(
        project / "runs",
        project / "contracts",
        audit_seconds=seconds,
        audit_seed=5,
        log=lines.append,
        **kwargs,
    )
    return checks, lines


def test_honest_runs_reproduce_and_the_plan_is_printed(project):
    result = gates(project, "verify", "--audit-seconds", "600", "--audit-seed", "5")
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert (
        "audit: seed 5 (given), budget 600 s: 24 completed runs of 2 claims in a seeded order"
        in out
    )
    started = [line for line in out.splitlines() if line.startswith("audit: re-running ")]
    # without --replay, c05-ci (marked for CI replay) is audited like c05-small
    assert len(started) == 24 and all("(recorded " in line for line in started)
    assert out.count(": reproduces (") == 24 and "DOES NOT" not in out and "UNAUDITED" not in out
    assert "audit: 24 runs started in " in out and "not reached" not in out
    assert "ok c05-small: " in out and "ok c05-ci: " in out and out.count("(audited 12 runs)") == 2


def tamper(project, arm: str, seed: int, metric: str, delta: float) -> None:
    """Edit one recorded per-seed value and everything that would give it away without a re-run."""
    folder = project / "runs" / "c05-small"
    ev = json.loads((folder / "evidence.json").read_text())
    run = next(r for r in ev["runs"] if r["arm"] == arm and r["seed"] == seed)
    run["metrics"][metric] += delta
    (folder / "evidence.json").write_text(json.dumps(ev, indent=2) + "\n")
    (folder / "verdict.md").write_text(render_report(ev))
    regenerate_history(project / "runs")  # a `rederived` entry would not vouch for new values


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
    assert small.status == "lost" and len(small.audited) == 12
    (problem,) = small.problems
    assert problem.startswith(
        "audit: subheap_kernel/seed 1 does not reproduce: train_loss re-runs as "
    )
    assert "tolerance abs 1e-06, rel 1e-06" in problem
    assert "audit: c05-small subheap_kernel/seed 1: DOES NOT reproduce" in "\n".join(lines)
    assert checks["c05-ci"].status == "ok" and len(checks["c05-ci"].audited) == 12

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
    assert small.status == "ok" and len(small.audited) == 12


def test_a_small_budget_re_runs_few_runs_and_counts_the_rest(project):
    from gates.verify import MIN_LEFT_S

    budget = MIN_LEFT_S + 0.3  # room for a run or a few of ~0.1 s each, never for all sixteen
    checks, lines = audited(project, budget)
    lines = [line for line in lines if line.startswith("audit: ")]  # the audit's own lines
    plan, summary = lines[0], lines[-1]
    started = [line for line in lines if line.startswith("audit: re-running ")]
    assert plan.startswith(f"audit: seed 5 (given), budget {budget:g} s: 24 completed runs ")
    assert 1 <= len(started) < 24
    assert summary.startswith(f"audit: {len(started)} runs started in ")
    assert summary.endswith(f"; {24 - len(started)} runs not reached; other audits cover others")
    # every run started is compared or named unaudited
    compared = sum(len(c.audited) for c in checks)
    unaudited = sum(c.codes.count("unaudited") for c in checks)
    assert compared + unaudited == len(started) and all(c.status == "ok" for c in checks)


def test_a_run_is_re_run_on_the_thread_count_it_recorded(project, monkeypatch):
    """A CPU run's sums depend on how many threads split them (an sfe_v10 seed recorded on 1 thread
    re-ran 4% off on CI's 2): the audit re-runs each run on its recorded count and restores the
    process's count afterwards; a run recorded without a count runs on the current one."""
    import torch

    from gates.study import cpu_threads, recorded_threads
    from gates.verify._audit import rerun

    monkeypatch.chdir(project)
    loaded = load_contract("contracts/c05-small.yaml")
    ev = json.loads((project / "runs" / "c05-small" / "evidence.json").read_text())
    run = ev["runs"][0]
    seen = []
    # what is checked is the audit's thread handling, so the training is replaced by a thread probe;
    # on the class: the instance is the registry's, shared by later tests, and pytest < 9.2 undoes an
    # instance patch by leaving the original bound method in the instance (shadowing class patches)
    monkeypatch.setattr(
        type(loaded.study),
        "run",
        lambda self, config, seed, reporter: seen.append(torch.get_num_threads()) or {},
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


def test_a_missing_setup_is_built_when_the_time_left_covers_it(project, monkeypatch):
    """A run whose study lacks a setup here (a teacher to train) is left out when its setup takes an
    unknown time or more than the budget; when `Study.setup_seconds` fits the time left, the audit
    builds it once, before the first such run, and audits the runs after it."""
    from gates.models.c05_probe import C05ProbeStudy

    built = []
    monkeypatch.setattr(
        C05ProbeStudy, "setup_missing", lambda self, config: None if built else "a cache to build"
    )
    monkeypatch.setattr(C05ProbeStudy, "setup", lambda self, config: built.append(config))

    def audit(budget):
        checks, lines = audited(project, budget)
        return {c.contract_id: c for c in checks}, "\n".join(lines)

    # unknown setup time: cannot run here, named
    checks, out = audit(600)
    assert "audit: cannot run here (a cache to build): runs of c05-ci, c05-small left out" in out
    assert not built and not checks["c05-small"].audited
    # a setup judged longer than the whole budget: never started, named with what it would take
    monkeypatch.setattr(C05ProbeStudy, "setup_seconds", lambda self, config: 1000.0)
    checks, out = audit(600)
    assert not built and "with 2000 s to build its setup first" in out
    assert checks["c05-small"].codes.count("unaudited") == 1
    # one that fits: built once, then every run is audited
    monkeypatch.setattr(C05ProbeStudy, "setup_seconds", lambda self, config: 1.0)
    checks, out = audit(600)
    assert len(built) == 1 and "audit: building what c05-" in out and "audit: built in " in out
    assert len(checks["c05-small"].audited) == 12 and checks["c05-small"].status == "ok"


def test_a_difference_names_other_cpu_kernels_or_torch_than_the_runs_were_computed_with():
    """A run records the CPU kernels torch dispatched to and torch's version; re-runs that differ from
    runs computed on other kernels (or before runs named them) or another torch say so, and say
    nothing when both are this machine's."""
    from types import SimpleNamespace

    import torch

    from gates.verify._audit import other_machine

    here = torch.backends.cpu.get_cpu_capability()

    def run(cpu, version=torch.__version__):
        env = {"threads": "1", "torch": version, **({"cpu": cpu} if cpu else {})}
        return SimpleNamespace(environment=env)

    assert other_machine([run(here), run(here)]) is None
    other = "AVX2" if here != "AVX2" else "AVX512"
    assert f"computed with {other} CPU kernels and re-run here with {here}" in other_machine(
        [run(other)]
    )
    assert "before runs named their CPU kernels" in other_machine([run(None)])
    assert "(some runs before they were named)" in other_machine([run(None), run(other)])
    assert f"torch 1.0, re-run with {torch.__version__}" in other_machine([run(here, "1.0")])


def computed_elsewhere(project, contract_id: str, arm: str, seed: int, metric: str) -> None:
    """Edit one recorded value, everything that would give it away without a re-run, and the run's
    record of the CPU kernels it was computed with: as a run of another machine that rounds otherwise."""
    folder = project / "runs" / contract_id
    ev = json.loads((folder / "evidence.json").read_text())
    run = next(r for r in ev["runs"] if r["arm"] == arm and r["seed"] == seed)
    run["metrics"][metric] += 0.004
    run["environment"]["cpu"] = "OTHER"
    (folder / "evidence.json").write_text(json.dumps(ev, indent=2) + "\n")
    (folder / "verdict.md").write_text(render_report(ev))
    regenerate_history(project / "runs")


def test_runs_of_other_cpu_kernels_that_do_not_reproduce_are_unconfirmed_not_lost(project):
    """On a machine whose kernels round otherwise a chaotic run diverges with nothing changed: a
    difference from a run computed on other kernels is named (code `unconfirmed`, with why) and fails
    only `--audit-strict`; by audit and by replay alike. The same difference from a run of this
    machine's kernels loses the claim (the test above)."""
    computed_elsewhere(project, "c05-small", "subheap_kernel", 1, "train_loss")
    computed_elsewhere(project, "c05-ci", "subheap_kernel", 1, "train_loss")
    result = gates(project, "verify", "--replay", "--audit-seconds", "600", "--audit-seed", "5")
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "ok c05-small: " in out and "ok c05-ci: " in out and "(replayed)" in out
    assert "subheap_kernel/seed 1 does not reproduce: train_loss re-runs as " in out
    assert "subheap_kernel/seed 1: train_loss replays as " in out
    assert "not confirmable on this machine: the runs were computed with OTHER CPU kernels" in out
    assert out.rstrip().endswith(
        "not confirmable on this machine (runs computed on other CPU kernels or torch): "
        "c05-ci, c05-small"
    )
    checks = {
        c.contract_id: c for c in verify(project / "runs", project / "contracts", replay=True)
    }
    assert checks["c05-ci"].status == "ok" and set(checks["c05-ci"].codes) == {"unconfirmed"}
    strict = gates(project, "verify", "--replay", "--audit-seconds", "0", "--audit-strict")
    assert strict.returncode == 1, strict.stdout + strict.stderr
