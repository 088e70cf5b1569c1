"""The Ray executor for real (`gates run --executor ray`): a local Ray instance, the small C05 contract
of tests/conftest.py's `dist_contract` (12 jobs, a relatively judged arm that must run after the others
of its seed), compared with a single-process run of it (the `reference` fixture); a task
whose worker process dies is retried; Ctrl-C cancels the tasks and keeps the finished runs, which the
next run reuses; without Ray the flag is one line. The rule for stores only this machine reaches.

One Ray instance serves the module (its start-up takes seconds); its workers run a setup hook that can
kill one run's worker process (`kill_once_hook`). Without Ray installed the tests that need it are
skipped, unless `$GATES_REQUIRE_SERVICES` is set (CI installs the dev extra, which has Ray).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
from types import SimpleNamespace

import pytest
from mlflow import MlflowClient

from gates.contract import load_contract
from gates.errors import UserError
from gates.execution import run_plan
from gates.execution._ray import LocalStoreRefused, check_nodes, local_only, refuse_local_store
from tests.conftest import (
    JOB_ENV,
    ROOT,
    comparable,
    dist_contract,
    interrupt_missed,
    sigint_as_in_a_terminal,
    write_contract,
)

pytestmark = pytest.mark.usefixtures("one_thread")
KILL_FLAG = "GATES_TEST_RAY_KILL_ONCE"  # a file: the first run that removes it kills its worker
CONTRACT = "contracts/c05-dist.yaml"


def kill_once_hook() -> None:
    """Set up each worker process of the module's Ray instance: the C05 study's run() kills its worker
    (os._exit, as a lost process or node) when it is the first to remove the flag file."""
    from gates.models.c05_probe import C05ProbeStudy

    run = C05ProbeStudy.run

    def run_or_die(self, config, seed, reporter):
        try:
            os.unlink(os.environ[KILL_FLAG])
        except (KeyError, FileNotFoundError):
            return run(self, config, seed, reporter)
        os._exit(1)

    C05ProbeStudy.run = run_or_die


@pytest.fixture(scope="module")
def ray_module():
    try:
        import ray
    except ImportError:
        if os.environ.get("GATES_REQUIRE_SERVICES"):
            pytest.fail(
                "Ray is required here (GATES_REQUIRE_SERVICES is set): pip install -e '.[dev]'"
            )
        pytest.skip("Ray is not installed (pip install -e '.[ray]')")
    return ray


@pytest.fixture(scope="module")
def ray_instance(ray_module, tmp_path_factory):
    ray = ray_module
    flag = tmp_path_factory.mktemp("ray") / "kill-once"
    from gates.execution import starting_local_instance

    with starting_local_instance():  # as `gates run --executor ray` starts its own
        ray.init(
            address="local",
            num_cpus=2,
            include_dashboard=False,
            log_to_driver=False,
            logging_level=logging.ERROR,
            runtime_env={
                # the hook is imported before a worker adds the driver's folder to its path
                "env_vars": {KILL_FLAG: str(flag), "PYTHONPATH": str(ROOT), **JOB_ENV},
                "worker_process_setup_hook": "tests.test_ray.kill_once_hook",
            },
        )
    try:
        yield SimpleNamespace(ray=ray, address=ray.get_runtime_context().gcs_address, flag=flag)
    finally:
        ray.shutdown()


def children(uri: str, contract_id: str) -> list:
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(contract_id)
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    return [r for r in runs if r.data.tags.get("gates.role") == "run"]


def test_cli_on_a_local_ray_instance_matches_single_process(ray_module, reference, workdir):
    """`gates run --executor ray` without an address starts its own local Ray instance: the evidence
    is the single-process run's (same per-seed metrics and verdict), the judged arm ran after the arms
    it is compared with, and each run computed on the thread count asked for."""
    write_contract(workdir / "contracts", dist_contract(), "c05-dist.yaml")
    r = subprocess.run(
        [sys.executable, "-m", "gates", "run", CONTRACT, "--executor", "ray", "--json"]
        + ["--threads", "1"],
        cwd=workdir,
        capture_output=True,
        text=True,
        env={**os.environ, **JOB_ENV},
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    lines = [json.loads(line) for line in r.stdout.splitlines()]  # stdout stays JSON lines
    assert lines[-1]["event"] == "verdict" and lines[-1]["verdict"] == reference["verdict"]
    assert sum(line["event"] == "run" for line in lines) == 12
    evidence = json.loads((workdir / "runs" / "c05-dist" / "evidence.json").read_text())
    assert comparable(evidence) == comparable(reference)
    assert {r["environment"]["threads"] for r in evidence["runs"]} == {"1"}
    assert evidence["mlflow"]["tracking_uri"] == "sqlite:///mlflow.db"  # as given, not the tasks'
    uri = f"sqlite:///{workdir / 'mlflow.db'}"  # (MLflow keeps a store per URI in this process)
    finished = [r for r in children(uri, "c05-dist") if r.info.status == "FINISHED"]
    assert sorted(r.info.run_id for r in finished) == sorted(
        r["mlflow_run_id"] for r in evidence["runs"]
    )


def test_a_task_whose_worker_dies_is_retried_and_the_verdict_holds(
    ray_instance, reference, workdir
):
    """The first run to start kills its Ray worker process (os._exit): Ray runs the task again on
    another worker, the evidence equals the single-process run's, and the dead attempt's MLflow run is
    closed as KILLED."""
    write_contract(workdir / "contracts", dist_contract(), "c05-dist.yaml")
    ray_instance.flag.write_text("")
    uri = f"sqlite:///{workdir / 'mlflow.db'}"
    outcome = run_plan(load_contract(CONTRACT), uri, workdir / "runs", executor="ray")
    assert not ray_instance.flag.exists()  # the kill happened
    evidence = outcome.evidence.as_dict()
    assert outcome.recorded and comparable(evidence) == comparable(reference)
    runs = children(uri, "c05-dist")
    killed = [r for r in runs if r.info.status == "KILLED"]
    assert len(killed) == 1 and killed[0].data.tags["gates.status"] == "killed"
    assert sorted(r.info.run_id for r in runs if r.info.status == "FINISHED") == sorted(
        r["mlflow_run_id"] for r in evidence["runs"]
    )
    arm, seed = killed[0].data.tags["gates.arm"], int(killed[0].data.tags["gates.seed"])
    assert any(r["arm"] == arm and r["seed"] == seed for r in evidence["runs"])  # redone
    assert outcome.reuse.trained == 12


# jobs of a few seconds each: the seven left when the first finishes cannot all end before the SIGINT
# lands, even on a busy machine (at 400 steps they took about 3.5 s together and once did)
CTRL_C_STEPS = 1200


def test_ctrl_c_cancels_the_tasks_and_keeps_finished_runs(ray_instance, workdir, monkeypatch):
    """SIGINT to `gates run --executor ray --ray-address ...` once its first run finished: exit 130,
    the running tasks are cancelled (their MLflow runs closed as KILLED), no evidence; the next run
    reuses the finished runs and gives the single-process evidence."""
    data = dist_contract(steps=CTRL_C_STEPS)
    write_contract(workdir / "contracts", data, "c05-dist.yaml")
    proc = subprocess.Popen(
        [sys.executable, "-m", "gates", "run", CONTRACT, "--executor", "ray", "--json"]
        + ["--ray-address", ray_instance.address, "--threads", "1"],
        cwd=workdir,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **JOB_ENV},
        preexec_fn=sigint_as_in_a_terminal,
    )
    try:
        for line in proc.stdout:
            if json.loads(line).get("event") == "run":
                break
        proc.send_signal(signal.SIGINT)
        rest, errors = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, interrupt_missed(rest, errors)
    assert "interrupted" in errors and "Ray tasks still running were cancelled" in errors
    assert "Traceback" not in errors
    assert not (workdir / "runs" / "c05-dist" / "evidence.json").exists()
    uri = f"sqlite:///{workdir / 'mlflow.db'}"  # the file the command wrote
    runs = children(uri, "c05-dist")
    finished = {r.info.run_id for r in runs if r.info.status == "FINISHED"}
    assert 0 < len(finished) < 12 and not [r for r in runs if r.info.status == "RUNNING"]
    outcome = run_plan(load_contract(CONTRACT), uri, workdir / "runs", executor="ray")
    assert outcome.reuse.reused == len(finished) and outcome.reuse.trained == 12 - len(finished)
    assert finished <= {r.mlflow_run_id for r in outcome.evidence.runs}
    single = workdir / "single"
    single.mkdir()
    path = write_contract(single, data, "c05-dist.yaml")
    monkeypatch.chdir(single)
    alone = run_plan(
        load_contract(path), f"sqlite:///{single / 'mlflow.db'}", single / "runs"
    ).evidence
    assert comparable(outcome.evidence.as_dict()) == comparable(alone.as_dict())


def test_threads_beyond_every_node_are_refused(ray_instance, workdir):
    import torch

    write_contract(workdir / "contracts", dist_contract(), "c05-dist.yaml")
    torch.set_num_threads(3)  # the module's instance has 2 CPUs
    try:
        with pytest.raises(UserError, match="no node of the Ray cluster has 3 CPUs"):
            run_plan(
                load_contract(CONTRACT),
                f"sqlite:///{workdir / 'mlflow.db'}",
                workdir / "runs",
                executor="ray",
            )
    finally:
        torch.set_num_threads(1)


def test_without_ray_the_flag_is_one_line(workdir):
    """Ray not importable (an import blocker): `--executor ray` is one line naming the extra, exit 2,
    before the contract is read; under --json also the error object with its code."""
    blocked = (
        "import sys; sys.modules['ray'] = None; from gates.cli import main; "
        "sys.argv = ['gates', *sys.argv[1:]]; main()"
    )
    for extra in ([], ["--json"]):
        r = subprocess.run(
            [
                sys.executable,
                "-c",
                blocked,
                "run",
                "contracts/none.yaml",
                "--executor",
                "ray",
                *extra,
            ],
            cwd=workdir,
            capture_output=True,
            text=True,
        )
        assert r.returncode == 2, r.stderr
        assert r.stderr.splitlines() == [
            "error: --executor: the Ray executor needs Ray, which is not installed here: "
            "pip install 'treeheap-gates[ray]'"
        ]
        if extra:
            assert json.loads(r.stdout)["error"]["code"] == "ray_unavailable"


def test_a_store_only_this_machine_reaches_is_refused_for_a_cluster_elsewhere():
    """The rule: a file store, or a server or database on a loopback host, only with every node on this
    machine (no address, `local`, `auto` then checked by node, or an address of this machine)."""
    ray = SimpleNamespace(util=SimpleNamespace(get_node_ip_address=lambda: "192.0.2.2"))
    for url in (
        "sqlite:///mlflow.db",
        "file:./mlruns",
        "mlruns",
        "http://127.0.0.1:5000",
        "postgresql://gates@localhost/gates",
    ):
        assert local_only(url), url
        for here in (
            None,
            "local",
            "auto",
            "127.0.0.1:6379",
            "localhost:6379",
            "192.0.2.2:6379",
            "ray://127.0.0.1:10001",
        ):
            refuse_local_store(ray, {"--tracking-uri": url}, here)
        for elsewhere in ("ray-head.example:6379", "ray://ray-head.example:10001"):
            with pytest.raises(LocalStoreRefused, match="reachable only from this machine") as e:
                refuse_local_store(ray, {"--tracking-uri": url}, elsewhere)
            assert e.value.code == "local_store" and e.value.field == "--tracking-uri"
    for url in ("http://mlflow.example:5000", "postgresql://gates@db.example/gates"):
        assert not local_only(url)
        refuse_local_store(ray, {"--tracking-uri": url}, "ray-head.example:6379")
    # a tuned contract's Optuna storage counts too
    with pytest.raises(LocalStoreRefused) as e:
        refuse_local_store(
            ray,
            {"--tracking-uri": "http://mlflow.example:5000", "--optuna-storage": "sqlite:///o.db"},
            "ray-head.example:6379",
        )
    assert e.value.field == "--optuna-storage"
    # connected (`auto`): a node elsewhere refuses a local store
    node = {"Alive": True, "NodeID": "a", "NodeManagerAddress": "192.0.2.2"}
    cluster = SimpleNamespace(
        nodes=lambda: [node, {**node, "NodeID": "b", "NodeManagerAddress": "198.51.100.7"}],
        get_runtime_context=lambda: SimpleNamespace(get_node_id=lambda: "a"),
    )
    with pytest.raises(LocalStoreRefused, match="has nodes elsewhere .198.51.100.7"):
        check_nodes(cluster, {"--tracking-uri": "sqlite:///mlflow.db"}, "auto")
    check_nodes(cluster, {"--tracking-uri": "http://mlflow.example:5000"}, "auto")


def test_an_arm_on_cuda_holds_a_gpu():
    """`device: cuda` holds one GPU; `auto` one where the cluster has GPUs (so it means the same device
    on every node); `cpu` and studies without a device none."""
    from gates.execution._ray import gpus

    def arm(device=None):
        return SimpleNamespace(device=device) if device else SimpleNamespace()

    assert [gpus(arm(d), False) for d in ("cuda", "auto", "cpu", None)] == [1, 0, 0, 0]
    assert [gpus(arm(d), True) for d in ("cuda", "auto", "cpu", None)] == [1, 1, 0, 0]


def test_a_local_instances_workers_run_at_normal_priority(ray_instance):
    """The workers of a local instance run at the driver's priority, not at Ray's default niceness 15,
    which starves them on a loaded machine (issue #41)."""
    ray = ray_instance.ray

    @ray.remote
    def niceness():
        return os.nice(0)

    assert ray.get(niceness.remote()) == os.nice(0)


def test_a_local_instance_listens_on_loopback_only(ray_instance):
    """The tests' local instance (started as `gates run --executor ray` starts its own, after
    conftest.py set LOOPBACK_ONLY) has 127.0.0.1 as its node address, and its GCS and raylet listen
    there only: no test traffic leaves loopback."""
    import psutil  # Ray's own copy (ray/thirdparty_files), on the path once Ray is imported

    ray = ray_instance.ray
    assert {n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]} == {"127.0.0.1"}
    assert ray_instance.address.startswith("127.0.0.1:")

    @ray.remote
    def node_address():
        import ray

        return ray.util.get_node_ip_address()

    assert ray.get(node_address.remote()) == "127.0.0.1"
    servers = [
        p for p in psutil.Process().children(recursive=True) if p.name() in ("gcs_server", "raylet")
    ]
    assert {p.name() for p in servers} == {"gcs_server", "raylet"}
    listening = {
        c.laddr.ip
        for p in servers
        for c in p.net_connections(kind="tcp")
        if c.status == psutil.CONN_LISTEN
    }
    assert listening and listening <= {"127.0.0.1", "::ffff:127.0.0.1"}, listening
