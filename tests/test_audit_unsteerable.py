"""Audits that cannot be steered (issue #28 items 2 and 10): which runs an audit re-runs depends on the
seed alone, never on anything the evidence records. A forged run recorded as taking a million seconds
is still re-run and caught; a run whose real cost exceeds the time left is stopped at a report by its
projection and named unaudited (a failure only with --audit-strict); a contract marked for CI replay
is audited when verify does not replay it. Real re-runs of the small C05 claims of tests/test_audit.py.
"""

from __future__ import annotations

import json
import time

import pytest
from typer.testing import CliRunner

from gates.cli import app
from gates.record import render_report
from gates.verify import AUDIT, REPLAY, choose, verify
from gates.verify._audit import Candidate
from tests.conftest import regenerate_history
from tests.test_audit import audited, recorded  # noqa: F401  (a fixture: `project` copies it)

pytestmark = pytest.mark.usefixtures("one_thread")

FORGED = ("c05-small", "subheap_kernel", 1)


def forge(project, claim: str, arm: str, seed: int, seconds: float | None = None) -> None:
    """Edit one run's train_loss (read by no condition: re-deriving cannot see it), and its recorded
    seconds, then everything that would give it away without a re-run: verdict.md re-rendered and the
    claims history written anew over the edited bytes (as tests/test_audit.py's `tamper`)."""
    runs = project / "runs"
    ev = json.loads((runs / claim / "evidence.json").read_text())
    run = next(r for r in ev["runs"] if r["arm"] == arm and r["seed"] == seed)
    run["metrics"]["train_loss"] += 0.004
    if seconds is not None:
        run["seconds"] = seconds
    (runs / claim / "evidence.json").write_text(json.dumps(ev, indent=2) + "\n")
    (runs / claim / "verdict.md").write_text(render_report(ev))
    regenerate_history(runs)


def gates_verify(*args: str):
    return CliRunner().invoke(app, ["verify", *args])


def by_id(checks) -> dict:
    return {c.contract_id: c for c in checks}


def test_a_forged_run_recorded_as_slow_is_still_re_run_and_caught(project, monkeypatch):
    monkeypatch.chdir(project)
    forge(project, *FORGED, seconds=1e6)
    assert all(c.status == "ok" for c in verify(project / "runs", project / "contracts"))

    # a budget that covers every run's real cost, never the forged run's recorded million seconds
    result = gates_verify("--audit-seconds", "60", "--audit-seed", "5")
    assert result.exit_code == 1, result.output
    assert "LOST c05-small" in result.output
    assert (
        "audit: subheap_kernel/seed 1 does not reproduce: train_loss re-runs as " in result.output
    )
    assert (
        "audit: re-running c05-small subheap_kernel/seed 1 (recorded 1000000.0 s" in result.output
    )

    # and a seed that walks to it first finds it within a budget of one run
    from gates.verify import MIN_LEFT_S

    found = [
        Candidate(cid, r["arm"], r["seed"], r["seconds"])
        for cid in ("c05-small", "c05-ci")
        for r in json.loads((project / "runs" / cid / "evidence.json").read_text())["runs"]
    ]
    seed = next(
        s for s in range(1000) if choose(found, s)[0].name == "c05-small subheap_kernel/seed 1"
    )
    small = by_id(
        verify(
            project / "runs", project / "contracts", audit_seconds=MIN_LEFT_S + 5, audit_seed=seed
        )
    )["c05-small"]
    assert small.status == "lost" and AUDIT in small.codes
    assert small.audited[0].startswith("subheap_kernel/seed 1: DOES NOT reproduce")


# per evaluation interval: a run of 3 intervals costs at least 3.6 s. Generous margins on a busy CI
# machine: the budget below starts one run with 1 s to spare and leaves too little for a second
SLEEP_S = 1.2


class _Slow:
    """Wraps the audit's reporter: each report comes SLEEP_S later, as in a study whose steps cost
    that much."""

    def __init__(self, inner):
        self.inner, self.budget = inner, inner.budget

    def report(self, step, metrics):
        time.sleep(SLEEP_S)
        self.inner.report(step, metrics)

    def attach(self, name, text):
        self.inner.attach(name, text)


def test_a_run_too_costly_for_the_time_left_is_stopped_early_and_named_unaudited(
    project, monkeypatch
):
    from gates.study import get_study
    from gates.verify import MIN_LEFT_S, UNAUDITED

    monkeypatch.chdir(project)
    # the class of the instance the audit runs (the registry's), whatever module object it came from
    study_cls = type(get_study("c05_probe"))
    run = study_cls.run
    slowed = []

    def slow_run(self, config, seed, reporter):
        slowed.append(seed)
        return run(self, config, seed, _Slow(reporter))

    monkeypatch.setattr(study_cls, "run", slow_run)
    budget = MIN_LEFT_S + 1.0  # enough to start one run, never to finish one (>= 3.6 s)
    checks, lines = audited(project, budget)
    stopped = [line for line in lines if ": UNAUDITED (" in line]
    shadowed = sorted(vars(get_study("c05_probe")))  # an instance patch an earlier test left behind
    assert slowed, (
        f"the audit never ran the slowed {study_cls!r} (instance attributes {shadowed}):\n"
        + "\n".join(lines)
    )
    assert len(stopped) == 1, "\n".join(lines)
    # stopped at its first report, by the projection (>= 3 x 1.2 s against 1.5 s), not at the end
    assert "(stopped at step 20 of 60 after " in stopped[0] and "would need about " in stopped[0]
    (claim,) = [c for c in checks if UNAUDITED in c.codes]
    assert claim.status == "ok" and claim.audited == [] and all(c.status == "ok" for c in checks)
    summary = [line for line in lines if line.startswith("audit: ")][-1]
    assert summary.startswith("audit: 1 runs started in ")
    assert summary.endswith(
        ": 0 compared, 1 unaudited; 23 runs not reached; other audits cover others"
    )

    args = ("--audit-seconds", str(budget), "--audit-seed", "5")
    result = gates_verify(*args)
    assert result.exit_code == 0, result.output
    assert " unaudited: stopped at step 20 of 60 after " in result.output
    result = gates_verify(*args, "--audit-strict")
    assert result.exit_code == 1, result.output


def test_a_contract_marked_for_ci_replay_is_audited_when_verify_does_not_replay_it(
    project, monkeypatch
):
    monkeypatch.chdir(project)
    forge(project, "c05-ci", "flat_address", 0)
    checks = by_id(verify(project / "runs", project / "contracts", audit_seconds=60, audit_seed=5))
    ci = checks["c05-ci"]
    assert ci.status == "lost" and AUDIT in ci.codes and not ci.replayed and len(ci.audited) == 12
    assert checks["c05-small"].status == "ok" and len(checks["c05-small"].audited) == 12

    # with --replay, the replay re-runs it whole (and catches the edit); the audit leaves it alone
    lines = []
    checks = by_id(
        verify(
            project / "runs",
            project / "contracts",
            replay=True,
            audit_seconds=60,
            audit_seed=5,
            log=lines.append,
        )
    )
    ci = checks["c05-ci"]
    assert ci.replayed and ci.audited == [] and REPLAY in ci.codes and AUDIT not in ci.codes
    assert len(checks["c05-small"].audited) == 12 and "audit: left to the replay: c05-ci" in lines
