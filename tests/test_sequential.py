"""Sequential seeds (gates/sequential.py): the spending functions, a simulation through the engine
showing the false-support rate stays <= alpha with the true mean exactly at the bar (and what looking
after every seed at the full alpha would give), and real sequential C05 runs: an early stop, a run to
the last look, resume after a kill mid-sequence, and `gates verify` on the evidence."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
from scipy.stats import norm

from gates.contract import Decision, Sequential, load_contract
from gates.entities import RunRecord
from gates.inference import decide, judge_sequential, next_look, pocock, spent
from gates.inference._sequential import obrien_fleming
from gates.inference._statistics import _Stat
from gates.record import Evidence
from tests.conftest import small_c05, write_contract

ALPHA = 0.05


# ---------------------------------------------------------------------------------- spending
def test_spending_functions_against_known_values():
    # O'Brien-Fleming: 2 (1 - Phi(1.95996 / sqrt(0.5))) = 2 (1 - Phi(2.77181)) = 0.005575
    assert obrien_fleming(0.5, ALPHA) == pytest.approx(
        2 * (1 - norm.cdf(1.959964 / math.sqrt(0.5))), rel=1e-5
    )
    assert obrien_fleming(0.5, ALPHA) == pytest.approx(0.005575, abs=2e-6)
    assert obrien_fleming(1.0, ALPHA) == pytest.approx(ALPHA)
    # Pocock: alpha ln(1 + (e - 1) t); 0.05 ln(1.859141) = 0.031006 at t = 0.5; alpha at t = 1
    assert pocock(0.5, ALPHA) == pytest.approx(0.05 * math.log(1 + (math.e - 1) / 2))
    assert pocock(0.5, ALPHA) == pytest.approx(0.031006, abs=2e-6)
    assert pocock(1.0, ALPHA) == pytest.approx(ALPHA)
    assert obrien_fleming(0.0, ALPHA) == pocock(0.0, ALPHA) == 0.0
    for kind in ("obrien-fleming", "pocock"):
        levels = spent(kind, [3, 6, 10], ALPHA)
        assert levels[-1][0] == ALPHA
        assert sum(at for _, at in levels) == pytest.approx(ALPHA)
        assert all(at > 0 for _, at in levels)
    # O'Brien-Fleming keeps almost all of alpha for the last look; Pocock spends it early
    assert (
        spent("obrien-fleming", [3, 6, 10], ALPHA)[0][1]
        < 0.001
        < spent("pocock", [3, 6, 10], ALPHA)[0][1]
    )


# ---------------------------------------------------------------------------------- simulation
def _threshold_decision(alpha: float = ALPHA) -> Decision:
    """m >= 0 supports, m <= 0 refutes: with the true mean exactly at 0 any support is false."""
    return Decision.model_validate(
        {
            "alpha": alpha,
            "supported_if": [
                {
                    "kind": "threshold",
                    "arm": "a",
                    "metric": "m",
                    "direction": "higher",
                    "value": 0.0,
                }
            ],
            "refuted_if": [
                {"kind": "threshold", "arm": "a", "metric": "m", "direction": "lower", "value": 0.0}
            ],
        }
    )


def _contract(looks: list[int], spending: str) -> SimpleNamespace:
    return SimpleNamespace(
        decision=_threshold_decision(),
        seeds=list(range(looks[-1])),
        arms={"a": {}},
        controls=[],
        sequential=Sequential(looks=looks, spending=spending),
    )


def _runs(values: np.ndarray) -> list[RunRecord]:
    return [
        RunRecord(arm="a", seed=s, status="completed", metrics={"m": float(x)})
        for s, x in enumerate(values)
    ]


@pytest.fixture
def no_power_planning(monkeypatch):
    """seeds_needed (a noncentral-t search for the settle lines) takes most of decide's time and never
    changes an outcome; the simulation leaves it out."""
    monkeypatch.setattr(_Stat, "needed", lambda self, level: None)


SIMULATED = 2000


@pytest.mark.parametrize(
    "looks,spending",
    [([3, 6, 10], "obrien-fleming"), ([5, 10, 15, 20], "pocock"), ([4, 8, 12], "pocock")],
)
def test_false_support_at_the_bar_stays_within_alpha(looks, spending, no_power_planning):
    """>= 2,000 simulated contracts, continuous normal per-seed values (the t-test), true mean exactly at
    the bar, judged by judge_sequential itself: false support <= alpha + 3 standard errors."""
    rng = np.random.default_rng(20261130 + looks[-1])
    contract = _contract(looks, spending)
    stops = np.zeros(len(looks), dtype=int)
    supported = 0
    for _ in range(SIMULATED):
        result = judge_sequential(contract, _runs(rng.normal(size=looks[-1])))
        supported += result.verdict == "supported"
        stops[len(result.looks) - 1] += 1
    rate = supported / SIMULATED
    se = math.sqrt(ALPHA * (1 - ALPHA) / SIMULATED)
    print(
        f"\nlooks {looks} {spending}: false support {rate:.4f} (alpha {ALPHA}, bound {ALPHA + 3 * se:.4f}); "
        f"stopped at each look: {stops.tolist()}"
    )
    assert rate <= ALPHA + 3 * se


def test_looking_after_every_seed_without_spending_inflates_false_support(no_power_planning):
    """The same data judged after every seed (2..10) at the full alpha, stopping at the first support:
    false support clearly above alpha; the spent sequence on the same data stays within it."""
    rng = np.random.default_rng(7)
    decision, n = _threshold_decision(), 10
    spent_contract = _contract([3, 6, 10], "obrien-fleming")
    naive = spent_ok = 0
    for _ in range(SIMULATED):
        runs = _runs(rng.normal(size=n))
        naive += any(decide(decision, runs[:k]).verdict == "supported" for k in range(2, n + 1))
        spent_ok += judge_sequential(spent_contract, runs).verdict == "supported"
    naive_rate, spent_rate = naive / SIMULATED, spent_ok / SIMULATED
    se = math.sqrt(ALPHA * (1 - ALPHA) / SIMULATED)
    print(
        f"\nafter every seed at full alpha: false support {naive_rate:.4f}; "
        f"spent over looks [3, 6, 10]: {spent_rate:.4f} (alpha {ALPHA})"
    )
    assert naive_rate > ALPHA + 3 * se
    assert spent_rate <= ALPHA + 3 * se


def test_sequence_records_every_look_and_settle_lines(no_power_planning):
    contract = _contract([3, 6, 10], "pocock")
    runs = _runs(np.array([0.1, -0.2, 0.3, -0.1, 0.2, -0.3, 0.05, -0.05, 0.15, -0.15]))
    result = judge_sequential(contract, runs)
    assert result.verdict == "inconclusive" and [x.look for x in result.looks] == [1, 2, 3]
    assert result.looks[-1].alpha_spent == ALPHA
    assert [x.seeds for x in result.looks] == [[0, 1, 2], list(range(6)), list(range(10))]
    assert set(result.looks[0].outcomes) == {"supported_if[0]", "refuted_if[0]"}
    assert result.settle[0].startswith("every look was spent")
    mid = judge_sequential(contract, runs[:6])  # the runs of two looks only
    assert len(mid.looks) == 2 and mid.settle[0].startswith("continue to look 3 (10 seeds)")
    assert next_look(contract, runs[:6]) == [6, 7, 8, 9]
    assert next_look(contract, []) == [0, 1, 2]
    assert next_look(contract, runs) is None
    clear = _runs(np.linspace(5, 6, 10))  # far above the bar: decided at the first look
    early = judge_sequential(contract, clear)
    assert early.verdict == "supported" and len(early.looks) == 1
    assert next_look(contract, clear[:3]) is None


def test_a_control_not_yet_settled_at_an_early_look_waits_for_the_next(no_power_planning):
    """O'Brien-Fleming over [3, 10] spends 0.00035 at 3 seeds: a working control (c clearly above its
    bar) cannot be settled there, so the sequence goes on to 10 seeds, where it holds and the claim is
    supported; a control that fails at the early look stops the sequence as invalid at once."""
    from pydantic import TypeAdapter

    from gates.contract import Control

    control = TypeAdapter(Control).validate_python(
        {
            "kind": "threshold",
            "arm": "a",
            "metric": "c",
            "direction": "higher",
            "value": 0.5,
            "control": "positive",
        }
    )
    contract = _contract([3, 10], "obrien-fleming")
    contract.controls = [control]
    c_values = [1.0, 1.1, 0.9, 1.05, 0.95, 1.0, 1.1, 0.9, 1.02, 0.98]

    def runs(c):
        return [
            RunRecord(
                arm="a", seed=s, status="completed", metrics={"m": 5.0 + 0.1 * (s % 3), "c": c[s]}
            )
            for s in range(10)
        ]

    result = judge_sequential(contract, runs(c_values))
    assert [look.verdict for look in result.looks] == [
        "invalid",
        "supported",
    ] and result.verdict == "supported"
    assert result.looks[0].outcomes["controls[0]"] == "undetermined"
    assert next_look(contract, runs(c_values)[:3]) == list(range(3, 10))

    failing = [0.1, 0.101, 0.099] + c_values[3:]  # clearly below the bar already at 3 seeds
    result = judge_sequential(contract, runs(failing)[:3])
    assert len(result.looks) == 1 and result.verdict == "invalid"
    assert result.looks[0].outcomes["controls[0]"] == "fails"
    assert next_look(contract, runs(failing)[:3]) is None


def test_futility_halt_on_arm_under_test_refutes_at_its_look(no_power_planning):
    contract = _contract([3, 6, 10], "obrien-fleming")
    runs = _runs(np.linspace(-1, 1, 10))
    runs[4] = runs[4].revised(status="halted", halt_reason="futility", metrics={})
    result = judge_sequential(contract, runs)
    assert result.verdict == "refuted" and len(result.looks) == 2


# ---------------------------------------------------------------------------------- real runs
def _sequential_c05(id_: str, seeds: int, looks: list[int], spending: str = "pocock") -> dict:
    """Two arms; flat_address at unseen depths scores about 0 (test patterns sit where training never
    put one), at the metric's bound, so the decision uses the exact sign test (smallest p 2^-n). The
    decision reads flat_address alone, blind by construction: no positive control is needed."""
    data = small_c05(id=id_, seeds=seeds)
    data["arms"] = {a: data["arms"][a] for a in ("flat_address", "subheap_kernel")}
    data["blind"] = {"flat_address": data["blind"]["flat_address"]}
    data["controls"] = []
    data["stop_rules"]["futility"] = []
    data["decision"] = {
        "alpha": 0.1,
        "supported_if": [
            {
                "kind": "threshold",
                "arm": "flat_address",
                "metric": "test_acc",
                "direction": "lower",
                "value": 0.5,
            }
        ],
        "refuted_if": [
            {
                "kind": "threshold",
                "arm": "flat_address",
                "metric": "test_acc",
                "direction": "higher",
                "value": 0.5,
            }
        ],
    }
    data["sequential"] = {"looks": looks, "spending": spending}
    return data


@pytest.mark.usefixtures("one_thread")
def test_stops_early_and_verify_catches_tampered_look(workdir):
    from gates.verify import verify
    from gates.verify._verify import _check_runs
    from tests.helpers import run_contract

    # pocock, alpha 0.1: look 1 (5 of 7 seeds) spends 0.080; 5 seeds below the bar give the sign test's
    # p = 1/32 (engine 3: the supported_if tested at the look's alpha itself, intersection-union)
    path = write_contract(workdir / "contracts", _sequential_c05("c05-seq-early", 7, [5, 7]))
    uri = f"sqlite:///{workdir / 'mlflow.db'}"
    loaded = load_contract(path)
    recorded = run_contract(loaded, uri, workdir / "runs")
    assert recorded.verdict == "supported", recorded.reasons
    assert sorted({r.seed for r in recorded.runs}) == [0, 1, 2, 3, 4] and len(recorded.runs) == 10
    assert len(recorded.looks) == 1 and recorded.looks[0].alpha_look == pytest.approx(
        pocock(5 / 7, 0.1)
    )
    assert verify(workdir / "runs", workdir / "contracts")[0].status == "ok"
    assert _check_runs(loaded, recorded) == []

    # tamper with look 1: a doctored value that no longer lets it stop; the sequence would continue
    ev = recorded.as_dict()  # as evidence.json holds it, to forge
    forged = json.loads(json.dumps(ev))
    forged["runs"][0]["metrics"]["test_acc"] = 0.9
    problems = _check_runs(loaded, Evidence.of(forged))
    assert problems == []  # still the runs of look 1 ... but the verdict no longer reproduces:
    (workdir / "runs" / "c05-seq-early" / "evidence.json").write_text(json.dumps(forged))
    check = verify(workdir / "runs", workdir / "contracts")[0]
    assert check.status == "lost" and any("does not reproduce" in p for p in check.problems)
    # runs beyond the stopping look are not the evidence of this sequence
    extra = json.loads(json.dumps(ev))
    extra["runs"].append({**ev["runs"][-1], "seed": 5})
    assert any("beyond the look" in p for p in _check_runs(loaded, Evidence.of(extra)))
    # a whole later look is accepted: an older engine that decided later ran it (the verdict is look 1's)
    whole = json.loads(json.dumps(ev))
    whole["runs"] += [{**r, "seed": seed} for seed in (5, 6) for r in ev["runs"] if r["seed"] == 4]
    assert _check_runs(loaded, Evidence.of(whole)) == []
    missing = json.loads(json.dumps(ev))
    missing["runs"] = [r for r in ev["runs"] if not (r["seed"] == 4 and r["arm"] == "flat_address")]
    assert any(
        "runs lack flat_address/seed 4" in p for p in _check_runs(loaded, Evidence.of(missing))
    )


@pytest.mark.usefixtures("one_thread")
def test_goes_to_last_look_after_a_kill_mid_sequence(workdir):
    """Look 1 (3 seeds) cannot decide (p 1/8 above the 0.062 Pocock spends there); look 2 (6 seeds) can
    (1/64 within the 0.038 it adds). The first `gates run` is killed in look 2; the next one reuses
    every finished run and ends the sequence at its last look. (Engine 4 judges the bounded test_acc
    on its median: a 3-seed sequence, whose smallest p 1/8 never reaches alpha, is refused before any
    run.)"""
    from gates.verify import verify
    from gates.verify._verify import _check_runs
    from tests.helpers import run_contract

    path = write_contract(workdir / "contracts", _sequential_c05("c05-seq-last", 6, [3, 6]))
    uri = f"sqlite:///{workdir / 'mlflow.db'}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "gates", "run", str(path), "--tracking-uri", uri, "--json"],
        cwd=workdir,
        stdout=subprocess.PIPE,
        text=True,
    )
    finished = []
    for line in proc.stdout:  # look 1 is 6 runs; kill after the first run of look 2
        event = json.loads(line)
        if "mlflow_run_id" in event:
            finished.append((event["arm"], event["seed"], event["mlflow_run_id"]))
        if len(finished) == 7:
            os.kill(proc.pid, signal.SIGKILL)
            break
    proc.wait()
    assert not (workdir / "runs" / "c05-seq-last" / "evidence.json").exists()
    assert {s for _, s, _ in finished} == {0, 1, 2, 3}

    loaded = load_contract(path)
    ev = run_contract(loaded, uri, workdir / "runs")
    ids = {(r.arm, r.seed): r.mlflow_run_id for r in ev.runs}
    assert all(ids[(a, s)] == run_id for a, s, run_id in finished)  # reused, not redone
    assert len(ev.runs) == 12 and ev.verdict == "supported"  # flat_address at about 0 on every seed
    assert [x.look for x in ev.looks] == [1, 2] and ev.looks[-1].alpha_spent == pytest.approx(0.1)
    assert verify(workdir / "runs", workdir / "contracts")[0].status == "ok"

    # drop look 2's runs: re-derived, the sequence stops at look 1 ("continue"), not what was recorded
    cut = ev.as_dict()  # as evidence.json holds it, to forge
    cut["runs"] = [r for r in cut["runs"] if r["seed"] < 3]
    (workdir / "runs" / "c05-seq-last" / "evidence.json").write_text(json.dumps(cut))
    check = verify(workdir / "runs", workdir / "contracts")[0]
    assert check.status == "lost" and any("looks" in p or "settle" in p for p in check.problems), (
        check.problems
    )
    assert _check_runs(loaded, Evidence.of(cut)) == []  # the runs are those of look 1 ...
    assert (
        judge_sequential(loaded.contract, Evidence.of(cut).runs, loaded.study.metrics)
        .settle[0]
        .startswith("continue to look 2")
    )  # ... whose verdict says to continue


@pytest.mark.usefixtures("one_thread")
def test_processes_run_one_look_at_a_time(workdir):
    """The plan driver asks for one look's jobs at a time whatever runs them: in two local processes,
    look 1's runs decide, and the evidence is the single-process one (look 1's runs only)."""
    from gates.execution import run_plan

    path = write_contract(workdir / "contracts", _sequential_c05("c05-seq-dist", 7, [5, 7]))
    loaded = load_contract(path)
    outcome = run_plan(loaded, f"sqlite:///{workdir / 'mlflow.db'}", workdir / "runs", jobs=2)
    assert outcome.recorded and outcome.recording.number == 1  # the first attempt, recorded
    ev = outcome.evidence
    assert ev.verdict == "supported" and len(ev.looks) == 1
    assert sorted({r.seed for r in ev.runs}) == [0, 1, 2, 3, 4]
