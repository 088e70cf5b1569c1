"""Distributed runs for real: an Optuna RDB storage as the queue (SQLite here; PostgreSQL with an
`mlflow server` on it below), `gates worker` processes that are paused or killed mid-job, and the
evidence compared with a single-process run of the same contract.

PostgreSQL: `$GATES_TEST_PG_URL` (a user that may create databases; `.ci/run` starts one), else a
throwaway cluster started here with the machine's `initdb`/`pg_ctl`. Without either the PostgreSQL
test is skipped, unless `$GATES_REQUIRE_SERVICES` is set (CI), where it fails.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

import pytest
from mlflow import MlflowClient

from gates.contract import load_contract
from gates.execution import Worker, grace_seconds, open_storage, run_contract, run_distributed
from tests.conftest import small_c05, write_contract

pytestmark = pytest.mark.usefixtures("one_thread")
HEARTBEAT = 1  # seconds; a silent job is stale after distributed.grace_seconds(1) = 3 s
JOB_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def dist_contract(contract_id: str = "c05-dist", seeds=(0, 1, 2), steps: int = 400) -> dict:
    """Small C05 (12 jobs of about a second each), with a relative futility rule: `path_only` is judged
    against the best other arm of its seed, so it must run after them (and halts: it is far behind)."""
    data = small_c05(id=contract_id)
    for cfg in data["arms"].values():
        cfg.update(train_trees=400, test_trees=60)
    data["seeds"] = list(seeds)
    data["budget"] = {"steps": steps, "eval_every": 20}
    data["preflight"]["falsifiable_point"]["by_step"] = steps
    data["stop_rules"]["futility"].append(
        {
            "metric": "test_acc",
            "at_step": 200,
            "behind_best_other_by": 0.5,
            "window": 100,
            "min_rel_improvement": 0.5,
            "arms": ["path_only"],
        }
    )
    return data


def comparable(evidence: dict) -> dict:
    """What must agree between a distributed and a single-process run of the same contract."""
    return {
        "verdict": evidence["verdict"],
        "contract_sha256": evidence["contract_sha256"],
        "conditions": [
            (c["list_name"], c["index"], c["outcome"], c["values"]) for c in evidence["conditions"]
        ],
        "runs": [
            (r["arm"], r["seed"], r["status"], r["halt_reason"], r["metrics"], r["first_signal"])
            for r in evidence["runs"]
        ],
    }


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The contract run by a single process (`gates run` without --storage)."""
    root = tmp_path_factory.mktemp("reference")
    path = write_contract(root, dist_contract(), "c05-dist.yaml")
    cwd = os.getcwd()
    os.chdir(root)
    try:
        evidence = run_contract(
            load_contract(path), f"sqlite:///{root / 'mlflow.db'}", root / "runs"
        ).as_dict()  # as evidence.json holds it: compared with what the workers' runs write
    finally:
        os.chdir(cwd)
    halted = {(r["arm"], r["seed"]) for r in evidence["runs"] if r["status"] == "halted"}
    assert halted == {
        ("path_only", 0),
        ("path_only", 1),
        ("path_only", 2),
    }  # the relative rule needs the other arms first
    return evidence


# ---------------------------------------------------------------------------------- processes
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_worker(
    storage: str, folder: Path, name: str, *extra: str
) -> tuple[subprocess.Popen, Path]:
    log = folder / f"{name}.log"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gates",
            "worker",
            "--storage",
            storage,
            "--heartbeat",
            str(HEARTBEAT),
            "--idle-exit",
            "30",
            *extra,
        ],
        cwd=folder,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        env={**os.environ, **JOB_ENV},
    )
    return proc, log


def trials(storage, name: str) -> list:
    return sorted(
        storage.get_all_trials(storage.get_study_id_from_name(name), deepcopy=False),
        key=lambda t: t.number,
    )


def wait_for(condition, timeout: float, what: str, poll: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


def running_job(storage, name: str, workers: dict[int, subprocess.Popen]):
    """A trial that a worker is running, whose MLflow child run has started: (trial, worker pid)."""
    from optuna.trial import TrialState

    for t in trials(storage, name):
        worker = t.system_attrs.get("gates.worker", "")
        pid = int(worker.rsplit(":", 1)[-1]) if ":" in worker else None
        if t.state == TrialState.RUNNING and pid in workers and t.user_attrs.get("mlflow_run_id"):
            return t, pid
    return None


def stop_all(procs):
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGCONT)
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()


def check_queue(storage, name: str, evidence: dict):
    """Exactly one completed trial per job, its record the one in the evidence."""
    from optuna.trial import TrialState

    complete = [t for t in trials(storage, name) if t.state == TrialState.COMPLETE]
    assert sorted(t.user_attrs["job"] for t in complete) == sorted(
        f"{r['arm']}/seed{r['seed']}" for r in evidence["runs"]
    )
    by_job = {t.user_attrs["job"]: t.user_attrs["record"]["mlflow_run_id"] for t in complete}
    assert {f"{r['arm']}/seed{r['seed']}": r["mlflow_run_id"] for r in evidence["runs"]} == by_job


def check_mlflow(uri: str, evidence: dict, killed_run: str):
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(evidence["contract_id"])
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    parents = [r for r in runs if r.data.tags.get("gates.role") == "contract"]
    assert len(parents) == 1 and parents[0].info.run_id == evidence["mlflow"]["parent_run_id"]
    assert parents[0].data.tags["gates.verdict"] == evidence["verdict"]
    assert {"evidence.json", "verdict.md", "learning_curves.png", "conditions.png"} <= {
        a.path for a in client.list_artifacts(parents[0].info.run_id)
    }
    children = [r for r in runs if r.data.tags.get("gates.role") == "run"]
    finished = sorted(r.info.run_id for r in children if r.info.status == "FINISHED")
    assert finished == sorted(
        r["mlflow_run_id"] for r in evidence["runs"]
    )  # one finished child per job
    dead = client.get_run(killed_run)
    assert dead.info.status == "KILLED" and dead.data.tags["gates.status"] == "killed"
    assert killed_run not in finished


# ---------------------------------------------------------------------------------- SQLite
def test_sqlite_queue_paused_worker_loses_its_job_and_records_nothing(reference, workdir):
    """Two workers on an SQLite storage. One is frozen (SIGSTOP) mid-job: its heartbeats stop, the job
    is failed as stale and re-claimed by the other worker, which finishes it. Thawed, the first worker
    completes its training but may not record it (the trial is no longer its own): the job ran to
    completion once as far as the evidence goes, which equals the single-process evidence."""
    from optuna.trial import TrialState

    write_contract(workdir / "contracts", dist_contract(), "c05-dist.yaml")
    storage_url, uri = f"sqlite:///{workdir / 'optuna.db'}", f"sqlite:///{workdir / 'mlflow.db'}"
    loaded = load_contract("contracts/c05-dist.yaml")
    queued = run_distributed(
        loaded, uri, workdir / "runs", storage_url, wait=False, heartbeat=HEARTBEAT
    )
    assert len(queued.enqueued) == 12 and not queued.present
    judged = [
        t.user_attrs
        for t in trials(open_storage(storage_url, HEARTBEAT), queued.study_name)
        if t.user_attrs["arm"] == "path_only"
    ]
    assert [a["after"] for a in judged] == [
        [f"{a}/seed{s}" for a in ("flat_address", "subheap_kernel", "path_subheap_kernel")]
        for s in (0, 1, 2)
    ]
    storage = open_storage(storage_url, HEARTBEAT)
    (a, log_a), (b, log_b) = (
        start_worker(storage_url, workdir, "a"),
        start_worker(storage_url, workdir, "b"),
    )
    procs = {a.pid: a, b.pid: b}
    try:
        trial, pid = wait_for(
            lambda: running_job(storage, queued.study_name, procs), 90, "a running job"
        )
        os.kill(pid, signal.SIGSTOP)
        _, other = procs[pid], procs[b.pid if pid == a.pid else a.pid]
        job = trial.user_attrs["job"]

        def finished_by_other():
            return [
                t
                for t in trials(storage, queued.study_name)
                if t.user_attrs.get("job") == job and t.state == TrialState.COMPLETE
            ]

        done = wait_for(finished_by_other, 60, f"{job} re-claimed and completed")[0]
        assert done.system_attrs["retry_history"] == [trial.number]
        assert done.system_attrs["gates.worker"].endswith(f":{other.pid}")
        assert storage.get_trial(trial._trial_id).state == TrialState.FAIL
        os.kill(pid, signal.SIGCONT)
        log = log_a if pid == a.pid else log_b
        wait_for(
            lambda: "its result is not recorded" in log.read_text(),
            60,
            "the thawed worker to void its result",
        )
        assert storage.get_trial(trial._trial_id).state == TrialState.FAIL
        outcome = run_distributed(loaded, uri, workdir / "runs", storage_url, heartbeat=HEARTBEAT)
        assert (
            outcome.recorded and outcome.recording.number == 1
        )  # the first attempt, recorded like a single run
        evidence = outcome.evidence.as_dict()
    finally:
        stop_all(procs.values())
    assert comparable(evidence) == comparable(reference)
    assert (
        json.loads((workdir / "runs" / "c05-dist" / "evidence.json").read_text())["verdict"]
        == reference["verdict"]
    )
    check_queue(storage, queued.study_name, evidence)
    check_mlflow(uri, evidence, trial.user_attrs["mlflow_run_id"])
    # re-attaching enqueues nothing twice
    again = run_distributed(
        loaded, uri, workdir / "runs", storage_url, wait=False, heartbeat=HEARTBEAT
    )
    assert again.study_name == queued.study_name and not again.enqueued and len(again.present) == 12


def test_worker_skips_study_of_other_code_and_bad_storage_is_user_error(workdir):
    from gates.errors import UserError

    with pytest.raises(UserError, match="expected an SQLAlchemy URL"):
        open_storage("nonsense://x")
    path = write_contract(workdir / "contracts", dist_contract("c05-other"), "c05-other.yaml")
    r = subprocess.run(
        [sys.executable, "-m", "gates", "run", str(path), "--no-wait"],
        cwd=workdir,
        capture_output=True,
        text=True,
    )
    assert (
        r.returncode == 2
        and "--no-wait only applies with --storage" in r.stderr
        and "Traceback" not in r.stderr
    )
    # a study enqueued by different code is not taken up by this worker
    storage_url = f"sqlite:///{workdir / 'optuna.db'}"
    loaded = load_contract(path)
    queued = run_distributed(
        loaded,
        f"sqlite:///{workdir / 'mlflow.db'}",
        workdir / "runs",
        storage_url,
        wait=False,
        heartbeat=HEARTBEAT,
    )
    storage = open_storage(storage_url, HEARTBEAT)
    study_id = storage.get_study_id_from_name(queued.study_name)
    storage.set_study_user_attr(study_id, "gates.code_sha256", "0" * 64)
    lines = []
    worker = Worker(storage_url, heartbeat=HEARTBEAT, log=lines.append)
    try:
        assert worker.run_next() is False
    finally:
        shutil.rmtree(worker.tmp, ignore_errors=True)
    assert any("differs from the coordinator's" in line for line in lines)


# ---------------------------------------------------------------------------------- PostgreSQL
def _postgres_bin() -> Path | None:
    found = shutil.which("initdb")
    if found:
        return Path(os.path.realpath(found)).parent
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return Path(versions[-1]).parent if versions else None


def _unavailable(why: str):
    if os.environ.get("GATES_REQUIRE_SERVICES"):
        pytest.fail(f"PostgreSQL is required here (GATES_REQUIRE_SERVICES is set): {why}")
    pytest.skip(why)


@contextmanager
def postgres_server():
    """An admin URL of a PostgreSQL server: $GATES_TEST_PG_URL, or a throwaway cluster started here
    (as the postgres user when root: initdb refuses root)."""
    if os.environ.get("GATES_TEST_PG_URL"):
        yield os.environ["GATES_TEST_PG_URL"]
        return
    bindir = _postgres_bin()
    if bindir is None:
        raise RuntimeError(
            "no PostgreSQL server binaries (Debian package `postgresql`) and no GATES_TEST_PG_URL"
        )
    folder = Path(tempfile.mkdtemp(prefix="gates-pg-"))
    as_user: list[str] = []
    if os.geteuid() == 0:
        shutil.chown(folder, "postgres", "postgres")
        as_user = ["runuser", "-u", "postgres", "--"]
    data, port = folder / "data", free_port()
    try:
        subprocess.run(
            as_user
            + [
                str(bindir / "initdb"),
                "-D",
                str(data),
                "-U",
                "gates",
                "--auth=trust",
                "-E",
                "UTF8",
            ],
            check=True,
            capture_output=True,
        )
        subprocess.run(
            as_user
            + [
                str(bindir / "pg_ctl"),
                "-D",
                str(data),
                "-l",
                str(folder / "log"),
                "-w",
                "-o",
                f"-p {port} -k {folder} -c listen_addresses=127.0.0.1 -c fsync=off",
                "start",
            ],
            check=True,
            capture_output=True,
        )
        yield f"postgresql://gates@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(
            as_user + [str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"],
            capture_output=True,
        )
        shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def databases(admin_url: str, *names: str):
    """Fresh databases on the server (dropped afterwards); their URLs."""
    import sqlalchemy
    from sqlalchemy.engine import make_url

    suffix = uuid.uuid4().hex[:8]
    dbs = [f"gates_{n}_{suffix}" for n in names]
    engine = sqlalchemy.create_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            for db in dbs:
                conn.exec_driver_sql(f'CREATE DATABASE "{db}"')
        base = make_url(admin_url)
        yield [base.set(database=db).render_as_string(hide_password=False) for db in dbs]
    finally:
        with engine.connect() as conn:
            for db in dbs:
                conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
        engine.dispose()


@contextmanager
def mlflow_server(backend_uri: str, artifacts: Path):
    """`mlflow server` on the given backend store; its http URI once it answers /health."""
    port = free_port()
    log = (artifacts.parent / "mlflow-server.log").open("w")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mlflow",
            "server",
            "--backend-store-uri",
            backend_uri,
            "--artifacts-destination",
            str(artifacts),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
    )  # no GenAI job runners needed
    uri = f"http://127.0.0.1:{port}"

    def healthy():
        if proc.poll() is not None:
            raise AssertionError(
                f"mlflow server exited: {(artifacts.parent / 'mlflow-server.log').read_text()[-2000:]}"
            )
        try:
            with urllib.request.urlopen(f"{uri}/health", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    try:
        wait_for(healthy, 120, "mlflow server", poll=0.3)
        yield uri
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=20)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()


@pytest.fixture(scope="module")
def pg_admin():
    from sqlalchemy.engine import make_url

    try:
        make_url("postgresql://x@localhost/x").get_dialect().import_dbapi()
    except ImportError as e:
        _unavailable(f"no PostgreSQL driver for SQLAlchemy ({e}; pip install -e '.[dev]')")
    try:
        with postgres_server() as url:
            yield url
    except (RuntimeError, subprocess.CalledProcessError) as e:
        _unavailable(f"no PostgreSQL server: {e}")


def test_postgres_and_mlflow_server_killed_worker_job_is_reclaimed(reference, workdir, pg_admin):
    """The deployment the README describes, on one machine: PostgreSQL, an `mlflow server` on it,
    `gates run --no-wait`, two `gates worker`s, one SIGKILLed mid-job; `gates run` re-attaches and
    writes evidence equal to the single-process run's."""
    from optuna.trial import TrialState

    write_contract(workdir / "contracts", dist_contract(), "c05-dist.yaml")
    with (
        databases(pg_admin, "optuna", "mlflow") as (storage_url, mlflow_db),
        mlflow_server(mlflow_db, workdir / "artifacts") as uri,
    ):
        cli = [
            sys.executable,
            "-m",
            "gates",
            "run",
            "contracts/c05-dist.yaml",
            "--storage",
            storage_url,
            "--tracking-uri",
            uri,
            "--heartbeat",
            str(HEARTBEAT),
            "--json",
        ]
        enq = subprocess.run(
            cli + ["--no-wait"],
            cwd=workdir,
            capture_output=True,
            text=True,
            env={**os.environ, **JOB_ENV},
        )
        assert enq.returncode == 0, enq.stderr
        event = json.loads(enq.stdout.splitlines()[0])
        assert event["event"] == "enqueued" and event["enqueued"] == 12
        name = event["study"]
        storage = open_storage(storage_url, HEARTBEAT)
        (a, _), (b, _) = (
            start_worker(storage_url, workdir, "a"),
            start_worker(storage_url, workdir, "b"),
        )
        procs = {a.pid: a, b.pid: b}
        coordinator = None
        try:
            trial, pid = wait_for(lambda: running_job(storage, name, procs), 90, "a running job")
            os.kill(pid, signal.SIGKILL)
            killed_at, killed_clock = time.time(), datetime.now()
            procs[pid].wait()
            coordinator = subprocess.Popen(
                cli,
                cwd=workdir,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env={**os.environ, **JOB_ENV},
            )
            out, errors = coordinator.communicate(timeout=240)
            assert coordinator.returncode == 0, errors[-3000:]
        finally:
            stop_all(procs.values())
            if coordinator is not None and coordinator.poll() is None:
                coordinator.kill()
        lines = [json.loads(line) for line in out.splitlines()]
        assert lines[-1]["event"] == "verdict" and lines[-1]["verdict"] == reference["verdict"]
        evidence = json.loads((workdir / "runs" / "c05-dist" / "evidence.json").read_text())
        assert comparable(evidence) == comparable(reference)
        assert evidence["mlflow"]["tracking_uri"] == uri
        job = trial.user_attrs["job"]
        retry = [
            t
            for t in trials(storage, name)
            if t.user_attrs.get("job") == job and t.state == TrialState.COMPLETE
        ]
        assert len(retry) == 1 and retry[0].system_attrs["retry_history"] == [trial.number]
        assert retry[0].system_attrs["gates.worker"] != trial.system_attrs["gates.worker"]
        assert storage.get_trial(trial._trial_id).state == TrialState.FAIL
        stale = (
            storage.get_trial(trial._trial_id).datetime_complete - killed_clock
        ).total_seconds()
        delay = retry[0].system_attrs["gates.claimed_at"] - killed_at
        print(
            f"\nkill -> failed as stale and re-enqueued: {stale:.2f} s; kill -> re-claimed: {delay:.2f} s "
            f"(heartbeat {HEARTBEAT} s, grace {grace_seconds(HEARTBEAT)} s)"
        )
        assert grace_seconds(HEARTBEAT) - HEARTBEAT <= stale <= delay < 60
        check_queue(storage, name, evidence)
        check_mlflow(uri, evidence, trial.user_attrs["mlflow_run_id"])


# ---------------------------------------------------------------------------------- tuning
def test_tuning_trials_are_jobs_then_the_tuned_seeds(workdir, tmp_path):
    """A contract with `tuning` (gates/execution/_tuning.py): its tuning trials run as jobs (kind "tune") on a
    worker, then the arm x seed jobs with the best configs; same tuning choices, verdict and metrics as
    a single-process run (one worker: trial n samples from the seed (sampler seed, n) either way)."""
    from tests.test_tuning import tuned_c05

    data = tuned_c05(id="c05-tuned-dist")
    single_root = tmp_path / "single"
    single_root.mkdir()
    single = run_contract(
        load_contract(write_contract(single_root, data, "c.yaml")),
        f"sqlite:///{single_root / 'mlflow.db'}",
        single_root / "runs",
    ).as_dict()

    write_contract(workdir / "contracts", data, "c05-tuned-dist.yaml")
    storage_url, uri = f"sqlite:///{workdir / 'optuna.db'}", f"sqlite:///{workdir / 'mlflow.db'}"
    loaded = load_contract("contracts/c05-tuned-dist.yaml")
    queued = run_distributed(
        loaded, uri, workdir / "runs", storage_url, wait=False, heartbeat=HEARTBEAT
    )
    assert sorted(queued.enqueued) == sorted(
        f"tune:{a}:{i}" for a in data["arms"] for i in range(2)
    )
    worker, log = start_worker(storage_url, workdir, "w")
    try:
        outcome = run_distributed(loaded, uri, workdir / "runs", storage_url, heartbeat=HEARTBEAT)
        assert (
            outcome.recorded and outcome.recording.number == 1
        )  # the first attempt, recorded like a single run
        evidence = outcome.evidence.as_dict()
    finally:
        stop_all([worker])
    assert comparable(evidence) == comparable(single)
    best = {a: r["best"] for a, r in evidence["tuning"]["arms"].items()}
    assert best == {a: r["best"] for a, r in single["tuning"]["arms"].items()}
    assert evidence["settings"]["arm_configs"] == single["settings"]["arm_configs"]
    storage = open_storage(storage_url, HEARTBEAT)
    kinds = [
        t.user_attrs["kind"] for t in trials(storage, queued.study_name) if "job" in t.user_attrs
    ]
    assert kinds.count("tune") == 8 and kinds.count("run") == 12
