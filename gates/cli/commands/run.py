"""`gates run CONTRACT`: admit a contract, train its arm x seed runs on an executor and decide the
verdict, through gates.execution's one entry point, `run_plan` (this process, --jobs N local
processes, or --executor ray). The PostgreSQL queue of `gates worker`s (--storage, --no-wait,
--heartbeat) is retired: Ray runs the jobs on a cluster."""

from __future__ import annotations

import signal
from pathlib import Path

import typer

from gates.cli._common import (
    CONTRACTS_DIR,
    JOBS,
    RUNS_DIR,
    THREADS,
    Retired,
    err,
    out,
    sigterm_as_interrupt,
)
from gates.cli._printers import print_outcome
from gates.cli._progress import progress_display

# where running on a cluster is described (the retirement lines point there)
CLUSTER_DOC = "docs/distributed.md"
ON_RAY = "gates run CONTRACT --executor ray --ray-address HOST:6379"


def run(
    contract: Path = typer.Argument(
        ..., help="Contract YAML file, in the project's contracts folder."
    ),
    tracking_uri: str | None = typer.Option(
        None,
        "--tracking-uri",
        help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db).",
    ),
    runs_dir: Path = RUNS_DIR,
    contracts_dir: Path = CONTRACTS_DIR,
    fresh: bool = typer.Option(
        False, "--fresh", help="Redo arm x seeds already finished for this contract and code."
    ),
    record: bool = typer.Option(
        False,
        "--record",
        help="For a contract that already has evidence: record this run "
        "as a new attempt (needs --reason) instead of reproducing and comparing the record.",
    ),
    reason: str | None = typer.Option(
        None,
        "--reason",
        help="With --record: why another attempt is recorded "
        "(kept in the claims history and shown beside the verdict).",
    ),
    as_json: bool = typer.Option(
        False,
        "--json",
        help="Print JSON lines for machines: per run a `run` event and a `progress` event (done, "
        "planned, reused, not_run, elapsed_s, eta_s), then what was reused, then the verdict.",
    ),
    optuna_storage: str | None = typer.Option(
        None,
        "--optuna-storage",
        help="Optuna storage URL for contracts "
        "with `tuning` (default: optuna.db beside an SQLite MLflow store, "
        "else sqlite:///optuna.db).",
    ),
    # retired with `gates worker`: kept only to say so in one line (hidden from --help)
    storage: str | None = typer.Option(None, "--storage", hidden=True),
    no_wait: bool = typer.Option(False, "--no-wait", hidden=True),
    heartbeat: int | None = typer.Option(None, "--heartbeat", hidden=True),
    executor: str = typer.Option(
        "local",
        "--executor",
        help="Where the jobs run: `local` (this process, one at a time) or `ray` (Ray tasks on a "
        "local Ray instance, or on the cluster at --ray-address; pip install 'treeheap-gates[ray]').",
    ),
    ray_address: str | None = typer.Option(
        None,
        "--ray-address",
        help="With --executor ray: the cluster to use (`auto`, HOST:6379, ray://HOST:10001); "
        "default: a new local Ray instance on this machine's cores.",
    ),
    jobs: int = JOBS,
    fetch: bool = typer.Option(
        False,
        "--fetch",
        help="Fetch the registered corpora the arms need and lack "
        "first, as `gates data fetch NAME` does (printing each license).",
    ),
    threads: int | None = THREADS,
):
    """Preflight, train every arm x seed into MLflow under the stop rules and decide the verdict. A contract
    without evidence records it (attempt 1) in runs/<id>/evidence.json, verdict.md and runs/INDEX.jsonl; a
    contract with evidence is reproduced and compared with its record, writing nothing under runs/, unless
    --record --reason TEXT records another attempt. Finished runs of the same contract and code are reused
    (never runs recorded under other code). A contract with `tuning` first searches each tuned arm's config
    (Optuna trials, same budget per arm); the best config per arm then runs over the seeds."""
    from gates.execution import admit, check_executor, redeliver_interrupts, retain_freed_memory
    from gates.record import REPRODUCE, plan_recording, resolve_uri
    from gates.study import cpu_threads

    _refuse_queue(storage, no_wait, heartbeat)
    check_executor(executor, jobs, ray_address)
    loaded = admit(
        contract, runs_dir, contracts_dir
    )  # what `gates check` checks before its preflight
    recording = plan_recording(
        loaded, runs_dir, record=record, reason=reason
    )  # bad flags: exit 2 before any step
    if threads is None:  # reproducing: the count the record's runs were computed on
        from gates.execution import job_threads

        reproduced = recording.recorded.runs if recording.mode == REPRODUCE else None
        threads = job_threads(reproduced, jobs)
    retain_freed_memory()  # this process trains: keep its large buffers between steps
    uri = resolve_uri(tracking_uri)
    if fetch:
        _fetch_corpora(loaded, err if as_json else out)  # under --json, stdout stays JSON lines
    progress = progress_display(loaded, as_json)
    signal.signal(signal.SIGTERM, sigterm_as_interrupt)
    redeliver_interrupts(signal.SIGINT)  # a Ctrl-C landing in a finalizer is not lost
    try:
        with progress, cpu_threads(threads):
            outcome = _execute(
                loaded,
                uri,
                runs_dir,
                progress,
                recording=recording,
                executor=executor,
                jobs=jobs,
                ray_address=ray_address,
                fresh=fresh,
                optuna_storage=optuna_storage,
            )
    except KeyboardInterrupt:
        err.print(
            "interrupted: finished runs are kept in MLflow and are reused by the next `gates run`; "
            "no evidence was written"
            + ("; the Ray tasks still running were cancelled" if executor == "ray" else "")
            + ("; the running jobs' processes were stopped" if jobs > 1 else "")
        )
        raise typer.Exit(130) from None
    print_outcome(outcome, loaded, uri, runs_dir, contracts_dir, as_json)
    if outcome.reproduction is not None and not outcome.reproduction.reproduces:
        raise typer.Exit(1)


def _execute(loaded, uri, runs_dir, progress, **options):
    """`run_plan` on the executor asked for; a platform error in a task (TaskError) said in one line,
    exit 1 (also as an error object under --json)."""
    from gates.execution import TaskError, run_plan

    try:
        return run_plan(loaded, uri, runs_dir, progress=progress, **options)
    except TaskError as e:
        progress.error(e.code, str(e))
        err.print(f"error: {e}", markup=False, highlight=False)
        raise typer.Exit(1) from None


def _refuse_queue(storage: str | None, no_wait: bool, heartbeat: int | None) -> None:
    """The retired queue's flags: one line naming the way that replaced it (exit 2)."""
    used = [
        name
        for name, given in (
            ("--storage", storage is not None),
            ("--no-wait", no_wait),
            ("--heartbeat", heartbeat is not None),
        )
        if given
    ]
    if used:
        raise Retired(
            "storage_retired",
            "the queue of `gates worker`s is retired; expected --executor ray to run the jobs on a "
            f"Ray cluster: `{ON_RAY}` (see {CLUSTER_DOC})",
            field=used[0],
        )


def _fetch_corpora(loaded, console) -> None:
    """`gates run --fetch`: fetch each registered corpus an arm needs and lacks (`gates data`), printing
    what `gates data fetch` prints, license included; the preflight then checks the arms again."""
    from gates.cli.commands.data import corpora_to_fetch, fetch_and_describe

    wanted: list[str] = []
    for cfg in loaded.arm_configs.values():
        why = loaded.study.check_ready(cfg)
        if why:
            wanted += [
                n for n in corpora_to_fetch(cfg.model_dump(mode="json"), why) if n not in wanted
            ]
    for name in wanted:
        console.print(f"fetching corpus {name} (gates run --fetch)", markup=False, highlight=False)
        fetch_and_describe(
            name, say=lambda line: console.print(line, markup=False, highlight=False)
        )
