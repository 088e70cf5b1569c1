"""Local processes for real (`gates run --jobs N`): the small C05 contract `dist_contract` (12
jobs, a relatively judged arm that must run after the others of its seed) in two processes gives the
single-process evidence; Ctrl-C stops the processes' runs (closed as KILLED, none left RUNNING) and
keeps the finished ones, which the next run reuses; --jobs with another executor is one line;
`gates verify --replay --jobs 2` replays in processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from gates.contract import load_contract
from gates.execution import run_plan
from gates.execution._processes import threads_per_job
from gates.verify import verify
from tests.conftest import (
    JOB_ENV,
    ROOT,
    comparable,
    dist_contract,
    interrupt_missed,
    sigint_as_in_a_terminal,
    write_contract,
)
from tests.helpers import run_contract
from tests.test_ray import children

pytestmark = pytest.mark.usefixtures("one_thread")
CONTRACT = "contracts/c05-dist.yaml"


def gates_run(workdir, *flags: str, **kwargs):
    return subprocess.Popen(
        [sys.executable, "-m", "gates", "run", CONTRACT, "--json", *flags],
        cwd=workdir,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **JOB_ENV},
        **kwargs,
    )


def test_two_processes_match_a_single_process(reference, workdir):
    """`gates run --jobs 2`: the evidence is the single-process run's (same per-seed metrics, halts
    and verdict: the judged arm ran after the arms it is compared with), stdout stays JSON lines, and
    each run computed on the cores shared out (one thread each on a 2-core machine, at least one)."""
    write_contract(workdir / "contracts", dist_contract(), "c05-dist.yaml")
    proc = gates_run(workdir, "--jobs", "2")
    out, errors = proc.communicate(timeout=300)
    assert proc.returncode == 0, errors[-3000:]
    lines = [json.loads(line) for line in out.splitlines()]
    assert lines[-1]["event"] == "verdict" and lines[-1]["verdict"] == reference["verdict"]
    assert sum(line["event"] == "run" for line in lines) == 12
    evidence = json.loads((workdir / "runs" / "c05-dist" / "evidence.json").read_text())
    assert comparable(evidence) == comparable(reference)
    threads = str(threads_per_job(2))
    assert {r["environment"]["threads"] for r in evidence["runs"]} == {threads}
    uri = f"sqlite:///{workdir / 'mlflow.db'}"
    finished = [r for r in children(uri, "c05-dist") if r.info.status == "FINISHED"]
    assert sorted(r.info.run_id for r in finished) == sorted(
        r["mlflow_run_id"] for r in evidence["runs"]
    )


def test_ctrl_c_stops_the_processes_and_keeps_finished_runs(workdir):
    """SIGINT to the whole process group of `gates run --jobs 2` once its first run finished (as a
    terminal's Ctrl-C): exit 130, no run left RUNNING, no evidence; the next run reuses the finished
    runs."""
    # two at a time: the eleven jobs left when the first finishes cannot all end before the SIGINT
    data = dist_contract()
    write_contract(workdir / "contracts", data, "c05-dist.yaml")
    proc = gates_run(
        workdir,
        "--jobs",
        "2",
        "--threads",
        "1",
        start_new_session=True,
        preexec_fn=sigint_as_in_a_terminal,
    )
    try:
        for line in proc.stdout:
            if json.loads(line).get("event") == "run":
                break
        os.killpg(proc.pid, signal.SIGINT)
        rest, errors = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, interrupt_missed(rest, errors)
    assert "interrupted" in errors and "Traceback" not in errors
    assert not (workdir / "runs" / "c05-dist" / "evidence.json").exists()
    uri = f"sqlite:///{workdir / 'mlflow.db'}"
    runs = children(uri, "c05-dist")
    finished = {r.info.run_id for r in runs if r.info.status == "FINISHED"}
    assert 0 < len(finished) < 12 and not [r for r in runs if r.info.status == "RUNNING"]
    outcome = run_plan(load_contract(CONTRACT), uri, workdir / "runs", jobs=2)
    assert outcome.reuse.reused == len(finished) and outcome.reuse.trained == 12 - len(finished)
    assert finished <= {r.mlflow_run_id for r in outcome.evidence.runs}


def test_a_run_record_crosses_a_process_boundary_key_for_key():
    """A run ends as a RunRecord, which a task process sends the driver pickled (local processes, Ray):
    it arrives the same record, its keys in their order, a metric that is not finite null as the
    evidence and `gates run --json` say it."""
    import pickle

    from gates.execution._study_run import run_record

    data = {
        "arm": "a",
        "seed": 3,
        "status": "halted",
        "halt_reason": "divergence",
        "halt_detail": "train_loss is nan",
        "metrics": {"train_loss": float("nan"), "acc": 0.5, "steps": 2},
        "seconds": 1.5,
        "first_signal": {"step": 2, "value": 0.1, "met": False},
        "mlflow_run_id": "r1",
        "environment": {"device": "cpu", "threads": "2"},
    }
    record = run_record(data)
    back = pickle.loads(pickle.dumps(record))
    assert back == record and back.metrics == {"train_loss": None, "acc": 0.5, "steps": 2}
    assert json.dumps(back.as_dict()) == json.dumps({**data, "metrics": back.metrics})
    assert back.revised(status="failed").as_dict() == {**back.as_dict(), "status": "failed"}


def test_jobs_with_another_executor_is_one_line(workdir):
    write_contract(workdir / "contracts", dist_contract(), "c05-dist.yaml")
    proc = gates_run(workdir, "--jobs", "2", "--executor", "ray")
    _, errors = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "--jobs" in errors and "Traceback" not in errors


def test_verify_replays_in_processes(workdir):
    """`gates verify --replay --jobs 2` re-runs a contract marked for replay in two processes: its
    record holds; a recorded number the replay does not reproduce is named."""
    data = dist_contract()
    data["replay"] = {"ci": True, "abs_tolerance": 1e-6, "rel_tolerance": 1e-6}
    write_contract(workdir / "contracts", data, "c05-dist.yaml")
    uri = f"sqlite:///{workdir / 'mlflow.db'}"
    run_contract(load_contract(CONTRACT), uri, workdir / "runs")
    (check,) = verify(workdir / "runs", workdir / "contracts", replay=True, jobs=2)
    assert check.replayed and check.status == "ok", check.problems
    path = workdir / "runs" / "c05-dist" / "evidence.json"
    doctored = json.loads(path.read_text())
    doctored["runs"][0]["metrics"]["mean_rank"] += 1.0
    path.write_text(json.dumps(doctored))
    (check,) = verify(workdir / "runs", workdir / "contracts", replay=True, jobs=2)
    assert check.status == "lost" and any("mean_rank replays as" in p for p in check.problems)


def test_a_replay_in_processes_computes_on_the_recorded_count_else_on_the_shared_cores():
    """Runs recorded without a thread count (older evidence) replay in N processes on the cores shared
    out, not N x every core (which made CI's replays many times slower); a recorded count decides
    whatever the processes; in one process the count is left as it is."""
    from gates.execution import job_threads
    from gates.record import as_evidence

    data = json.loads(
        (ROOT / "tests/fixtures/claims/runs/c05-baseline-control/evidence.json").read_text()
    )
    for run in data["runs"]:
        (run.get("environment") or {}).pop("threads", None)
    unrecorded = as_evidence(data).runs
    assert job_threads(unrecorded, 2) == threads_per_job(2) and job_threads(unrecorded) is None
    for run in data["runs"]:
        run["environment"] = {**(run.get("environment") or {}), "threads": "3"}
    recorded = as_evidence(data).runs
    assert job_threads(recorded, 2) == job_threads(recorded) == 3
    assert job_threads(None, 2) == threads_per_job(2) and job_threads(None) is None


def test_a_tuned_contract_on_a_new_store_in_processes_is_a_single_processs(workdir):
    """Tuning trials as tasks on a new store (no optuna.db yet: the driver creates it, as tasks starting
    together raced to and one failed on alembic_version): the same trials, best configs and evidence
    as one process."""
    from tests.test_tuning import tuned_c05

    path = write_contract(workdir / "contracts", tuned_c05(), "c05-tuned-small.yaml")
    # absolute store paths: MLflow keeps one store per URI string in a process, whatever the folder
    uri = f"sqlite:///{workdir / 'mlflow.db'}"
    tasks = run_plan(load_contract(path), uri, workdir / "runs", jobs=2).evidence
    single = workdir / "single"
    (single / "contracts").mkdir(parents=True)
    alone_path = write_contract(single / "contracts", tuned_c05(), "c05-tuned-small.yaml")
    os.chdir(single)
    alone = run_contract(
        load_contract(alone_path), f"sqlite:///{single / 'mlflow.db'}", single / "runs"
    )
    assert comparable(tasks.as_dict()) == comparable(alone.as_dict())

    def trials(ev):
        return {
            a: [(t["params"], t["value"]) for t in r["trials"]]
            for a, r in ev.tuning.as_dict()["arms"].items()
        }

    assert trials(tasks) == trials(alone)
