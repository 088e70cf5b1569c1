"""The Ray executor, `gates run CONTRACT --executor ray [--ray-address ADDRESS]`: the plan's jobs as
Ray tasks, on a local Ray instance or on a cluster. The driver's side (the plan's order, dependencies,
the verdict written once, here) is gates/execution/_tasks.py's, shared with the inline run and the
local processes of `--jobs N`; this module is Ray's backend for it (`drive_on_ray`).

Resources: `num_cpus` is the run's CPU thread count (`--threads`, else the driver's torch count), and
the task computes on exactly that many threads, so its sums are those of a single-process run;
`num_gpus` is 1 for an arm on CUDA (`device: cuda`, or `auto` on a cluster that has GPUs); no more
tasks at once than the cluster has CPUs for.

Failures: Ray retries a task whose worker process or node died (`max_retries`); the MLflow runs that
dead attempts left RUNNING are closed (KILLED) at the end (gates.execution._jobs.close_leftovers; a tuning
trial's by gates.execution._tuning.reap_interrupted). A run whose study raised is a failed run in its record, as
everywhere, and is not retried. An error of the platform's own in a task (the store unreachable, a
node on other code) stops the run: the other tasks are cancelled, finished runs are kept (RayJobError).

Ctrl-C (KeyboardInterrupt in the driver): outstanding tasks are cancelled (`ray.cancel`: a running one
gets a KeyboardInterrupt and closes its MLflow run as KILLED), the parent run is marked KILLED as a
single process marks it; finished runs stay in MLflow and the next `gates run` reuses them.

Tracking: the tasks write to MLflow themselves, so the store must be reachable from every node. A
store only this machine reaches (`local_only`: a file, or a server or database on a loopback host) is
refused in one line unless every node is this machine (`refuse_local_store`, `check_nodes`); so is a
tuned contract's Optuna storage.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
from pathlib import Path
from urllib.parse import urlsplit

from gates.contract import LoadedContract
from gates.errors import UserError, storage_error
from gates.execution import _jobs as jobs
from gates.execution import _runner as runner
from gates.execution import _tasks as tasks
from gates.execution._job import ContextInfo, Job
from gates.execution._locks import contract_lock
from gates.record import Recording

EXTRA = "pip install 'treeheap-gates[ray]'"
MAX_RETRIES = 3  # attempts after the first whose worker process or node died (then: RayJobError)
CANCEL_WAIT_SECONDS = 10  # how long cancelled tasks get to close their MLflow runs after Ctrl-C
LOCAL_ADDRESSES = (None, "local")  # --ray-address values that start a new Ray instance here
LOOPBACK = ("localhost", "127.0.0.1", "::1", "0.0.0.0", "")


class RayUnavailable(UserError):
    """`--executor ray` without Ray installed."""

    code = "ray_unavailable"


class LocalStoreRefused(UserError):
    """A store only this machine reaches, for a Ray cluster with nodes elsewhere."""

    code = "local_store"


class RayJobError(tasks.TaskError):
    """A job's Ray task raised an error of the platform's own, or its worker died on every attempt."""

    code = "ray_job_failed"


def import_ray(local: bool = False):
    """Ray, or a one-line RayUnavailable naming the extra (exit 2). `local`: for a local instance,
    imported on loopback only (`LOOPBACK_ONLY`, which Ray reads on its first import in a process)."""
    if local:
        for key, value in LOOPBACK_ONLY.items():
            os.environ.setdefault(key, value)
    try:
        import ray
    except ImportError:
        raise RayUnavailable(
            f"the Ray executor needs Ray, which is not installed here: {EXTRA}",
            field="--executor",
        ) from None
    return ray


# ---------------------------------------------------------------------------------- this machine
def _host(address: str) -> str:
    """The host of a store URL or a Ray address (host:port, ray://host:port)."""
    parts = urlsplit(address if "://" in address else f"//{address}")
    return (parts.hostname or "").lower()


def _this_machine(ray) -> set[str]:
    """Names and addresses this machine answers to: its host names, what they resolve to here, and the
    address Ray gives this node (which a `ray start` here listens on)."""
    names = {socket.gethostname(), socket.getfqdn()}
    found = set(names)
    for name in names:
        with contextlib.suppress(OSError):
            found.update(socket.gethostbyname_ex(name)[2])
    with contextlib.suppress(Exception):
        found.add(ray.util.get_node_ip_address())
    return {n.lower() for n in found if n}


def _is_this_machine(ray, host: str) -> bool:
    return host in LOOPBACK or host.startswith("127.") or host in _this_machine(ray)


def local_only(url: str) -> bool:
    """A store that only processes on this machine can reach: a file (`sqlite:///...`, `file:`, a
    path) or a server or database on a loopback host (a node elsewhere reaches its own loopback)."""
    if url.startswith(("sqlite:", "file:")) or "://" not in url:
        return True
    host = _host(url)
    return host in LOOPBACK or host.startswith("127.")


def refuse_local_store(ray, stores: dict[str, str], address: str | None) -> None:
    """The rule, before connecting: a store only this machine reaches (`stores`: flag -> URL) needs
    every Ray node on this machine, so `--ray-address` must start a local instance (absent, `local`),
    find the cluster this machine is a node of (`auto`, checked once connected: `check_nodes`), or name
    this machine (loopback, its host name or one of its addresses). Else one line, exit 2."""
    local = {flag: url for flag, url in stores.items() if local_only(url)}
    if not local or address in LOCAL_ADDRESSES or address == "auto":
        return
    if _is_this_machine(ray, _host(address)):
        return
    flag, url = next(iter(local.items()))
    raise LocalStoreRefused(
        f"{url} is reachable only from this machine, but the Ray cluster at {address} runs tasks on "
        f"other machines: use a tracking server (--tracking-uri http://HOST:5000) or a database every "
        f"node reaches (postgresql://...)",
        field=flag,
    )


def check_nodes(ray, stores: dict[str, str], address: str | None) -> None:
    """The rule, once connected: with a store only this machine reaches, every alive node of the
    cluster must be this machine (a head here may have worker nodes elsewhere)."""
    local = {flag: url for flag, url in stores.items() if local_only(url)}
    if not local:
        return
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    driver = ray.get_runtime_context().get_node_id()
    here = {n["NodeManagerAddress"] for n in nodes if n["NodeID"] == driver}
    elsewhere = sorted({n["NodeManagerAddress"] for n in nodes} - here)
    if elsewhere:
        flag, url = next(iter(local.items()))
        raise LocalStoreRefused(
            f"{url} is reachable only from this machine, but the Ray cluster at {address or 'auto'} "
            f"has nodes elsewhere ({', '.join(elsewhere[:3])}): use a tracking server (--tracking-uri "
            f"http://HOST:5000) or a database every node reaches (postgresql://...)",
            field=flag,
        )


# ---------------------------------------------------------------------------------- connecting
# A local instance (no address, `local`) runs its workers at normal priority: Ray starts them at niceness
# 15, which on a loaded machine starves them (2 of 40 runs in 9 minutes where one process ran all 40 in
# 3.4). The raylet reads the niceness from its environment, which it inherits from the driver.
WORKER_NICENESS = {"RAY_worker_niceness": "0"}
# ... and listens on loopback only: nothing off this machine needs to reach a one-machine instance.
# Ray 2.60 resolves a loopback `_node_ip_address` (and `ray start --node-ip-address 127.0.0.1`) to the
# machine's address (services.resolve_ip_for_localhost), and its GCS and raylet then listen on every
# interface; its single-machine mode (the one it runs on Windows and macOS) takes 127.0.0.1 as the node
# address, where the GCS, raylet and workers listen. Ray reads the switch once, when a process first
# imports it (ray._private.ray_constants): it must be in the environment before then (`import_ray`
# with `local`; tests set it in conftest.py), and the raylet and workers inherit it.
LOOPBACK_ONLY = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


@contextlib.contextmanager
def _environment(values: dict[str, str]):
    """These environment variables set for the block (what a process started in it inherits), then
    restored; one already set by the user is kept."""
    added = {k: v for k, v in values.items() if k not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for key in added:
            os.environ.pop(key, None)


@contextlib.contextmanager
def starting_local_instance():
    """For the block: the environment a local instance's raylet inherits (`WORKER_NICENESS`,
    `LOOPBACK_ONLY`); tests and benchmarks start theirs in it too."""
    with _environment({**WORKER_NICENESS, **LOOPBACK_ONLY}):
        yield


@contextlib.contextmanager
def connected(ray, address: str | None, threads: int = 1):
    """Ray, connected for the block: a process already connected keeps its connection (a test's, a
    notebook's); no address (or `local`) starts a local instance on this machine's cores (at least
    `threads`: a run recorded on more threads than this machine has still reproduces, as in one
    process), shut down afterwards; an address connects to that cluster."""
    if ray.is_initialized():
        yield
        return
    kwargs: dict = {"log_to_driver": False, "logging_level": logging.ERROR}
    # log_to_driver False: stdout is the progress display's (JSON lines under --json); a study's own
    # prints stay in Ray's session logs (/tmp/ray/session_latest/logs), its errors in its records
    if address in LOCAL_ADDRESSES:
        cpus = max(os.cpu_count() or 1, threads)
        kwargs.update(address="local", num_cpus=cpus, include_dashboard=False)
    else:
        kwargs.update(address=address)
    # ray.init installs its own SIGTERM handler (exit); the CLI's turns SIGTERM into Ctrl-C, which
    # cancels the tasks and keeps finished runs: put it back
    sigterm = signal.getsignal(signal.SIGTERM)
    try:
        if address in LOCAL_ADDRESSES:
            with starting_local_instance():
                ray.init(**kwargs)
        else:
            ray.init(**kwargs)
    except (
        ConnectionError,
        ValueError,
        RuntimeError,
        ImportError,
    ) as e:  # (ray:// needs ray[client])
        # Ray's first sentence (the rest names its own flags, not ours)
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0].split(". ")[0]
        if address in LOCAL_ADDRESSES:
            raise UserError(
                f"cannot start a local Ray instance: {reason}", field="--executor"
            ) from None
        raise UserError(
            f"cannot connect to a Ray cluster at {address} ({reason}); expected `auto` (the cluster "
            f"this machine is a node of), HOST:6379 or ray://HOST:10001",
            field="--ray-address",
        ) from None
    finally:
        if sigterm is not None:
            with contextlib.suppress(ValueError):  # not the main thread: nothing was installed
                signal.signal(signal.SIGTERM, sigterm)
    try:
        yield
    finally:
        ray.shutdown()


# ---------------------------------------------------------------------------------- the backend
def gpus(config, cluster_has_gpus: bool) -> int:
    """GPUs a task of this arm holds: one on CUDA (`device: cuda`; `auto` where the cluster has GPUs,
    so that `auto` means the same device on every node it lands on), else none."""
    device = getattr(config, "device", None)
    return int(device == "cuda" or (device == "auto" and cluster_has_gpus))


class RayBackend:
    """Tasks as Ray tasks (gates.execution._tasks.Backend)."""

    live = False

    def __init__(self, ray, parent: runner.ParentRun, threads: int):
        self.ray, self.threads = ray, threads
        self.remote = ray.remote(jobs.run_task)
        has_gpus = ray.cluster_resources().get("GPU", 0) >= 1
        self.gpus = {arm: gpus(cfg, has_gpus) for arm, cfg in parent.loaded.arm_configs.items()}

    def room(self) -> int:
        """As many tasks as the cluster's CPUs hold (at least one)."""
        cpus = self.ray.cluster_resources().get("CPU", 0)
        return max(1, int(cpus // self.threads))

    def submit(self, info: ContextInfo, job: Job, readable: dict, threads: int):
        return self.remote.options(
            num_cpus=threads,
            num_gpus=self.gpus.get(job.arm, 0),
            max_retries=MAX_RETRIES,
            retry_exceptions=False,  # a study's error is a failed run in its record
            name=f"gates {job.key}",
        ).remote(info, job, readable, threads)

    def wait(self, handles: list) -> list:
        return self.ray.wait(handles, num_returns=1)[0]

    def result(self, handle, job: Job) -> jobs.JobRecord:
        exceptions = self.ray.exceptions
        try:
            return self.ray.get(handle)
        except exceptions.RayTaskError as e:
            cause = getattr(e, "cause", None) or e
            found = storage_error(cause)
            if found is not None:  # a full disk or an unwritable store: one line, as in one process
                raise found from None
            if isinstance(cause, KeyboardInterrupt):
                raise KeyboardInterrupt from None
            what = (str(cause).strip().splitlines() or [""])[0]
            raise RayJobError(
                f"job {job.key} failed on a Ray worker: {type(cause).__name__}: {what}; "
                f"finished runs are kept and the next `gates run` reuses them"
            ) from None
        except (exceptions.WorkerCrashedError, exceptions.NodeDiedError) as e:
            raise RayJobError(
                f"job {job.key}: its Ray worker died on all {MAX_RETRIES + 1} attempts "
                f"({type(e).__name__}); finished runs are kept and the next `gates run` reuses them"
            ) from None

    def cancel(self, handles: list) -> None:
        for handle in handles:
            with contextlib.suppress(Exception):
                self.ray.cancel(handle)
        if handles:  # (a second Ctrl-C ends the wait)
            with contextlib.suppress(Exception):
                self.ray.wait(handles, num_returns=len(handles), timeout=CANCEL_WAIT_SECONDS)


# ---------------------------------------------------------------------------------- the run
def drive_on_ray(
    loaded: LoadedContract,
    tracking_uri: str,
    runs_root: Path,
    recording: Recording,
    *,
    address: str | None,
    fresh: bool,
    progress,
    tuning_url: str | None,
    threads: int,
) -> runner.Outcome:
    """The contract's plan as Ray tasks, decided here (gates.execution._tasks.drive), under the
        contract's lock (one driver per contract): on a local instance (no `address`, `local`) or the
        cluster at `address`; a store only this machine reaches is refused for a cluster elsewhere. Each task
    computes on `threads` CPU threads (the driver's) and holds as many of Ray's CPUs."""
    ray = import_ray(local=address in LOCAL_ADDRESSES)
    stores = {"--tracking-uri": tracking_uri}
    if tuning_url is not None:
        stores["--optuna-storage"] = tuning_url
    refuse_local_store(ray, stores, address)
    with contract_lock(runs_root, loaded.id), connected(ray, address, threads):
        check_nodes(ray, stores, address)
        largest = max(
            (n["Resources"].get("CPU", 0) for n in ray.nodes() if n.get("Alive")), default=0
        )
        if largest < threads:
            raise UserError(
                f"the runs compute on {threads} CPU threads, but no node of the Ray cluster has "
                f"{threads} CPUs (the largest has {largest:g}); expected --threads {int(largest)} or "
                f"fewer, or larger nodes",
                field="--threads",
            )
        return tasks.drive(
            lambda parent: RayBackend(ray, parent, threads),
            loaded,
            tracking_uri,
            runs_root,
            recording,
            threads,
            progress,
            tuning_url,
            fresh=fresh,
        )
