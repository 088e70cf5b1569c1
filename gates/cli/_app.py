"""The `gates` command line: new, check, run, worker, verify, status, withdraw, render, rederive,
dashboard, report, schema, studies, data.

Commands that only list (`--help`, `status`, `studies`) import no study and no verdict engine: they
answer in a fraction of a second (benchmarks/cli_latency.py).

Exit codes: 0 success; 1 a claim lost its evidence (verify), a run was interrupted, or a full disk or
an unwritable file or store (one line naming it: gates.errors.storage_error); 2 bad input (a one-line
error naming file:line: field: what is expected, never a traceback). Under --json an error is also one
JSON object on stdout ({"error": {"code", "message", ...}}, main()).
"""

from __future__ import annotations

import json
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.table import Table

from gates.errors import UserError, UserErrors
from gates.record import describe_stale

if TYPE_CHECKING:
    from gates.record import Evidence

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},  # inherited by every command
    help="Falsification-gated experiments: a hypothesis contract fixes, before any training step, what "
    "result would support or refute a claim; `gates run` trains its arms x seeds into MLflow, halts "
    "hopeless runs and writes an honest verdict with its evidence to runs/<id>/.",
)
out = Console(soft_wrap=True)  # long lines (signatures, paths) stay whole for copy and grep
err = Console(stderr=True, highlight=False, soft_wrap=True)

from gates.cli._data import data_app  # noqa: E402  (no heavy imports: stdlib + typer)

app.add_typer(data_app, name="data")
from gates.cli._ci import ci_app  # noqa: E402  (no heavy imports: stdlib + typer)

app.add_typer(ci_app, name="ci")


def _print_version(asked: bool) -> None:
    if asked:
        from gates import __version__

        print(f"gates {__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    version: bool = typer.Option(
        False,
        "--version",
        is_eager=True,
        callback=_print_version,
        help="Print the version (gates X.Y.Z) and exit.",
    ),
):
    # no docstring: the app's help is the Typer's `help=`, which a callback's docstring would replace
    pass


RUNS_DIR = typer.Option(
    Path("runs"), "--runs-dir", help="Where evidence is written and read (committed)."
)
CONTRACTS_DIR = typer.Option(
    Path("contracts"), "--contracts-dir", help="Where contracts are looked up."
)
JOBS = typer.Option(
    1,
    "--jobs",
    min=1,
    help="Run the arm x seed jobs (and tuning trials) in this many local processes; each computes on "
    "--threads (default: the machine's cores divided among the jobs; reproducing: the recorded "
    "count), so every run's numbers are a single-process run's.",
)
THREADS = typer.Option(
    None,
    "--threads",
    min=1,
    help="CPU threads torch computes with (default: torch's own, "
    "one per core; reproducing a recorded claim: the count its runs recorded). Each run records "
    "its count; an audit or replay re-runs it on that count, as its sums depend on it.",
)


def _sigterm_as_interrupt(*_):
    raise KeyboardInterrupt


@app.command()
def new(
    contract_id: str = typer.Argument(
        ...,
        metavar="ID",
        help="Id of the new contract (lowercase letters, "
        "digits, '-'); the file is contracts/ID.yaml.",
    ),
    study: str = typer.Option(
        ..., "--study", help="Registered study the contract runs (see `gates studies`)."
    ),
    contracts_dir: Path = CONTRACTS_DIR,
):
    """Write a contract skeleton contracts/ID.yaml for a study: every required field, two arms with the
    study's default config, the five preflight gates as prompts, and "TODO: ..." wherever you decide.
    `gates check` refuses it, naming each placeholder, until every one is replaced. Never overwrites."""
    from gates.contract import write

    path = write(contracts_dir, contract_id, study)
    out.print(
        f'wrote {path}: replace each "TODO: ..." value, then `gates check {path}`',
        markup=False,
        highlight=False,
    )


@app.command()
def check(
    contract: Path = typer.Argument(..., help="Contract YAML file."),
    runs_dir: Path = RUNS_DIR,
    contracts_dir: Path = CONTRACTS_DIR,
    as_json: bool = typer.Option(
        False,
        "--json",
        help="Print the report as one JSON object: id, sha256, claim, study, arms, seeds, budget, "
        "preflight (per arm: params, flops and their ratios to the baseline; notes), gates, "
        "seeds_for_80pct_power, decision, sequential, tuning, controls, notes, family, rule_flags, "
        "errors (the preflight's refusals, as error objects) and ready; exit 2 when not ready.",
    ),
    tracking_uri: str | None = typer.Option(
        None,
        "--tracking-uri",
        help="MLflow store whose pilot runs of the contract are listed (default: $MLFLOW_TRACKING_URI, "
        "else sqlite:///mlflow.db when it exists).",
    ),
):
    """Validate a contract and print its preflight report (parameter counts, FLOPs, the five gates, whether
    each condition can reach significance with its seeds), without training anything. A contract with
    evidence recorded under older rules is shown with the rules it predates instead of refused; a
    contract outside the contracts folder is refused, as `gates run` refuses it."""
    from gates.design import rule_flags
    from gates.execution import check_contract
    from gates.inference import estimand_notes, predictions

    # the checks `gates run` and `gates verify` apply too (gates.execution.check_contract)
    loaded, report = check_contract(contract, runs_dir, contracts_dir)
    c = loaded.contract
    power = predictions(c, [], [])["predicted_ablation"]["seeds_for_80pct_power"]
    notes = estimand_notes(c.decision, len(c.seeds), loaded.study.metrics)
    flags = rule_flags(loaded)
    pilots = _pilots(loaded, tracking_uri if isinstance(tracking_uri, str) else None)
    if as_json:
        check_json = _check_json(loaded, report, power, notes, flags)
        check_json["pilots"] = [p.as_dict() for p in pilots]
        print(json.dumps(check_json, indent=2))
        if report.errors:
            raise _ReportedErrors(report.errors)
        return
    _print_check(loaded, report, power, notes, flags)
    if pilots:
        from gates.record import pilot_lines

        out.print("pilots (what was known before):", markup=False)
        for line in pilot_lines(pilots, loaded.sha256):
            out.print(f"  {line}", markup=False)
    if report.errors:
        raise UserErrors(report.errors)
    out.print("[green]ready to run[/]")


def _pilots(loaded, tracking_uri: str | None) -> list:
    """The contract's pilot runs (`gates pilot`) in the store `tracking_uri` (default: $MLFLOW_TRACKING_URI,
    else sqlite:///mlflow.db); none where that store does not exist (a check never creates one)."""
    from gates.record import pilot_runs, resolve_uri

    return pilot_runs(resolve_uri(tracking_uri), loaded.contract.id, loaded.path)


class _ReportedErrors(UserErrors):
    """Errors a command's --json output already holds: main() says them on stderr only (and exits 2),
    so that stdout stays one JSON document."""


def _looks(c, metrics) -> list[dict]:
    """A sequential contract's looks: seeds, the alpha each spends and in all, and whether the look could
    stop the claim supported ("yes", "no": the tests of its estimands cannot reach that alpha there)."""
    from gates.inference import spent, supportable

    looks = []
    for n, (cum, here) in zip(
        c.sequential.looks, spent(c.sequential.spending, c.sequential.looks, c.decision.alpha)
    ):
        stop = "yes" if supportable(c.decision, n, here, metrics) else "no"
        looks.append({"seeds": n, "alpha": here, "alpha_spent": cum, "could_stop_supported": stop})
    return looks


def _check_json(loaded, report, power, notes: list[str], flags: list[str]) -> dict:
    from gates.inference import json_safe

    c = loaded.contract
    return json_safe(
        {
            "id": c.id,
            "sha256": loaded.sha256,
            "claim": c.claim,
            "study": c.study,
            "arms": list(c.arms),
            "seeds": list(c.seeds),
            "budget": {"steps": c.budget.steps, "eval_every": c.budget.eval_every},
            "preflight": report.as_dict(),  # measured: per arm params, flops, ratios; notes
            "gates": c.preflight.model_dump(mode="json"),  # declared: the five gates
            "seeds_for_80pct_power": power,
            "decision": {
                "alpha": c.decision.alpha,
                "alpha_explicit": "alpha" in c.decision.model_fields_set,
                "evaluation": c.decision.evaluation,
                "supported_if": len(c.decision.supported_if),
                "refuted_if": len(c.decision.refuted_if),
                "ways_to_refute": len(c.conditions()),
            },
            "sequential": None
            if c.sequential is None
            else {"spending": c.sequential.spending, "looks": _looks(c, loaded.study.metrics)},
            "tuning": None if c.tuning is None else c.tuning.model_dump(mode="json"),
            "controls": [ctl.control for ctl in c.controls],
            "notes": notes,
            "family": loaded.family.as_record(c.decision.alpha) if loaded.family else None,
            "rule_flags": flags,
            "errors": [e.as_dict() for e in report.errors],
            "ready": not report.errors,
        }
    )


def _print_check(loaded, report, power, notes: list[str], flags: list[str]) -> None:
    c = loaded.contract
    out.print(f"[bold]{c.id}[/]  sha256 {loaded.sha256}")
    out.print(f"claim: {c.claim}", markup=False)
    out.print(
        f"study: {c.study}; arms: {', '.join(c.arms)}; seeds: {c.seeds}; "
        f"budget: {c.budget.steps} steps, eval every {c.budget.eval_every}"
    )
    if loaded.family is not None:
        out.print(f"claim family: {loaded.family.describe(c.decision.alpha)}", markup=False)
    table = Table("arm", "trainable params", "params ratio", "FLOPs/example", "FLOPs ratio")
    for arm, m in report.arms.items():
        table.add_row(
            arm,
            str(m["params"]),
            f"{m['params_ratio']:.3g}",
            str(m["flops"] or "-"),
            f"{m['flops_ratio']:.3g}" if m["flops_ratio"] is not None else "-",
        )
    out.print(table)
    gates_text = c.preflight
    out.print(
        f"gate 1 compute cost: every arm within {gates_text.compute_cost.max_ratio:g}x "
        f"{gates_text.compute_cost.baseline_arm!r}: {gates_text.compute_cost.rationale}",
        markup=False,
    )
    out.print(f"gate 2 preconditions: {gates_text.preconditions}", markup=False)
    pa = gates_text.predicted_ablation
    out.print(
        f"gate 3 predicted ablation: {pa.arm} {pa.direction} than {pa.versus} on {pa.metric} by "
        f"{pa.size:g}: {pa.statement}",
        markup=False,
    )
    if pa.sd is not None:
        out.print(
            f"  with sd {pa.sd:g} per seed: {power or 'more than 1000'} seeds per arm for 80% power at "
            f"alpha {c.decision.alpha:g} (a supported_if is tested at alpha); the contract has {len(c.seeds)}",
            markup=False,
        )
    out.print(f"gate 4 task fit: {gates_text.task_fit}", markup=False)
    fp = gates_text.falsifiable_point
    out.print(
        f"gate 5 falsifiable point: {fp.arm}.{fp.metric} {'>=' if fp.direction == 'higher' else '<='} "
        f"{fp.threshold:g} by step {fp.by_step}: {fp.statement}",
        markup=False,
    )
    for note in report.notes:
        out.print(note, markup=False)
    if c.tuning is not None:
        t = c.tuning
        space = "; ".join(
            f"{k} {p.type} "
            + (
                f"{p.choices}"
                if p.type == "categorical"
                else f"[{p.low:g}, {p.high:g}]{' log' if p.log else ''}"
            )
            for k, p in t.space.items()
        )
        out.print(
            f"tuning: {t.trials_per_arm} trials for each of {', '.join(t.tuned_arms(c.arms))}; space: {space}; "
            f"objective {t.objective.metric} ({t.objective.direction}) on tuning seeds {t.seeds}; "
            f"{t.sampler.kind} sampler, seed {t.sampler.seed}",
            markup=False,
        )
    out.print(
        f"decision: alpha {c.decision.alpha:g} "
        f"({'explicit' if 'alpha' in c.decision.model_fields_set else 'default'}), "
        f"{c.decision.evaluation} evaluation; {len(c.decision.supported_if)} supported_if (all must hold: each "
        f"tested at alpha), {len(c.decision.refuted_if)} refuted_if; "
        f"{ways_to_refute(len(c.decision.supported_if), len(c.decision.refuted_if))}",
        markup=False,
    )
    if c.sequential is not None:
        out.print(
            f"sequential: {len(c.sequential.looks)} looks, {c.sequential.spending} spending (Lan-DeMets; "
            f"each look tested at the alpha it spends, union bound over looks)",
            markup=False,
        )
        for k, look in enumerate(_looks(c, loaded.study.metrics)):
            stop = look["could_stop_supported"]
            out.print(
                f"  look {k + 1}: {look['seeds']} seeds, alpha {look['alpha']:.4g} here "
                f"({look['alpha_spent']:.4g} spent in all); could stop supported here: "
                f"{stop}",
                markup=False,
            )
    for i, ctl in enumerate(c.controls):
        out.print(
            f"control {i} ({ctl.control}): must hold (tested at alpha), else the verdict is invalid",
            markup=False,
        )
    for note in notes:
        out.print(note, markup=False)
    for flag in flags:
        out.print(f"recorded under older rules: {flag}", markup=False)


@app.command()
def pilot(
    contract: Path = typer.Argument(
        ..., help="Contract YAML file (a draft: it need not be registered)."
    ),
    arm: list[str] | None = typer.Option(
        None, "--arm", help="An arm to pilot (repeat for more; default: every arm)."
    ),
    steps: int | None = typer.Option(
        None, "--steps", min=1, help="Steps per run (default: the contract's budget; at most it)."
    ),
    seeds: int = typer.Option(
        1, "--seeds", min=1, max=10, help="Pilot seeds per arm (2**31, 2**31 + 1, ...)."
    ),
    tracking_uri: str | None = typer.Option(
        None,
        "--tracking-uri",
        help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db).",
    ),
    threads: int | None = THREADS,
):
    """Pilot a contract before registering it: train its arms (or --arm) for --steps on seeds no contract
    or tuning can use (2**31 and up), recorded in the contract's MLflow experiment as pilots. Nothing is
    written under runs/; `gates check` and the verdict list every pilot of the contract's id with when it
    ran, on which version of the contract and what it measured (what was known before)."""
    from gates.execution import load_checked, run_pilot
    from gates.record import pilot_lines, resolve_uri
    from gates.study import cpu_threads

    loaded = load_checked(contract)
    with cpu_threads(threads):
        pilots = run_pilot(
            loaded, resolve_uri(tracking_uri), arms=arm or None, steps=steps, seeds=seeds
        )
    for line in pilot_lines(pilots, loaded.sha256):
        out.print(line, markup=False)
    out.print(
        "pilots stay on the record: `gates check` and the verdict list them beside the contract",
        markup=False,
    )


def ways_to_refute(supported: int, refuted: int) -> str:
    """The claim's ways to refute, counted and named: each refuted_if holding, each supported_if
    failing (one Holm family at alpha; a single way is tested at alpha as it is)."""
    named = ((refuted, "refuted_if", "holding"), (supported, "supported_if", "failing"))
    m = supported + refuted
    if m == 1:
        name, verb = next((name, verb) for n, name, verb in named if n)
        return f"one way to refute (the {name} {verb}), tested at alpha"
    ways = ", ".join(f"{n} {name} {verb}" for n, name, verb in named if n)
    return f"{m} ways to refute ({ways}), Holm-corrected at alpha"


@app.command()
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
    storage: str | None = typer.Option(
        None,
        "--storage",
        help="Distributed: an Optuna RDB storage URL "
        "(postgresql://user:pw@host/db, or sqlite:///optuna.db on one machine) "
        "to enqueue the arm x seed jobs in for `gates worker`s; waits for them, "
        "then decides the verdict here. Re-running re-attaches.",
    ),
    no_wait: bool = typer.Option(
        False,
        "--no-wait",
        help="With --storage: enqueue only; re-run without it to wait and write the evidence.",
    ),
    heartbeat: int = typer.Option(
        10,
        "--heartbeat",
        help="With --storage: Optuna heartbeat interval in seconds; "
        "a job silent for 3x this long is failed and re-enqueued.",
    ),
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
    from gates.execution import admit, execute, retain_freed_memory, run_processes
    from gates.record import REPRODUCE, plan_recording, resolve_uri
    from gates.study import cpu_threads

    _check_executor(executor, ray_address, storage, jobs)
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
    if no_wait and storage is None:
        raise UserError(
            "--no-wait only applies with --storage URL (a distributed run)", field="--no-wait"
        )
    if fetch:
        _fetch_corpora(loaded, err if as_json else out)  # under --json, stdout stays JSON lines
    progress = _JsonProgress(loaded) if as_json else _RichProgress(loaded)
    signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    try:
        with progress, cpu_threads(threads):
            if storage is not None:
                outcome = _run_distributed(
                    loaded,
                    uri,
                    runs_dir,
                    storage,
                    fresh,
                    no_wait,
                    heartbeat,
                    progress,
                    as_json,
                    optuna_storage,
                    recording,
                )
                if outcome is None:
                    return
            elif executor == "ray":
                outcome = _run_ray(
                    loaded, uri, runs_dir, ray_address, fresh, progress, optuna_storage, recording
                )
            elif jobs > 1:
                outcome = _run_tasks(
                    progress,
                    run_processes,
                    loaded,
                    uri,
                    runs_dir,
                    jobs,
                    fresh=fresh,
                    progress=progress,
                    optuna_storage=optuna_storage,
                    recording=recording,
                )
            else:
                outcome = execute(
                    loaded,
                    uri,
                    runs_dir,
                    fresh=fresh,
                    progress=progress,
                    optuna_storage=optuna_storage,
                    record=record,
                    reason=reason,
                )
    except KeyboardInterrupt:
        err.print(
            "interrupted: finished runs are kept in MLflow and are reused by the next `gates run`; "
            "no evidence was written"
            + ("; queued jobs stay queued for the workers" if storage else "")
            + ("; the Ray tasks still running were cancelled" if executor == "ray" else "")
            + ("; the running jobs' processes were stopped" if jobs > 1 else "")
        )
        raise typer.Exit(130) from None
    evidence = outcome.evidence
    if as_json:
        print(
            json.dumps({"event": "reuse", **outcome.reuse.as_dict(), "line": outcome.reuse.line()})
        )
        print(
            json.dumps(
                {
                    "event": "verdict",
                    "mode": outcome.recording.mode,
                    "attempt": outcome.recording.number,
                    "recorded": outcome.recorded,
                    "contract_id": evidence.contract_id,
                    "contract_sha256": evidence.contract_sha256,
                    "verdict": evidence.verdict,
                    "reasons": evidence.reasons,
                    "settle": evidence.settle,
                    "conditions": [c.as_dict() for c in evidence.conditions],  # as recorded
                    "git_commit": evidence.git_commit,
                    **(
                        {"reproduction": outcome.reproduction.as_dict()}
                        if outcome.reproduction
                        else {}
                    ),
                }
            )
        )
    else:
        _print_verdict(evidence, runs_dir, outcome, contract=loaded.path)
        if outcome.reproduction is not None and outcome.reproduction.reproduces:
            _print_stale_hint(loaded.path, runs_dir, contracts_dir)
        out.print(
            f"MLflow: {uri} (experiment {evidence.contract_id!r}); "
            f"open with `mlflow ui --backend-store-uri {uri}`",
            markup=False,
            highlight=False,
        )
        if outcome.mlflow_note:  # the supersession is recorded; only its MLflow view is missing
            out.print(outcome.mlflow_note, markup=False, highlight=False)
    if outcome.reproduction is not None and not outcome.reproduction.reproduces:
        raise typer.Exit(1)


EXECUTORS = ("local", "ray")


def _check_executor(
    executor: str, ray_address: str | None, storage: str | None, jobs: int = 1
) -> None:
    """--executor and its flags, before the contract is read: one line each (exit 2)."""
    from gates.errors import did_you_mean

    if executor not in EXECUTORS:
        raise UserError(
            f"{executor!r}{did_you_mean(executor, EXECUTORS)}; expected one of {', '.join(EXECUTORS)}",
            field="--executor",
        )
    if ray_address is not None and executor != "ray":
        raise UserError("applies only with --executor ray", field="--ray-address")
    if jobs > 1 and (executor != "local" or storage is not None):
        raise UserError(
            "--jobs runs the jobs in local processes, --storage on `gates worker`s, --executor ray "
            "as Ray tasks: expected one of them",
            field="--jobs",
        )
    if executor == "ray":
        if storage is not None:
            raise UserError(
                "--storage runs the jobs on `gates worker`s, --executor ray as Ray tasks: expected "
                "one of them",
                field="--executor",
            )
        from gates.execution import import_ray

        import_ray()  # not installed: one line naming the extra


def _run_ray(loaded, uri, runs_dir, address, fresh, progress, optuna_storage, recording):
    from gates.execution import run_ray

    return _run_tasks(
        progress,
        run_ray,
        loaded,
        uri,
        runs_dir,
        address=address,
        fresh=fresh,
        progress=progress,
        optuna_storage=optuna_storage,
        recording=recording,
    )


def _run_tasks(display, run, *args, **kwargs):
    """`run(*args, **kwargs)` (run_ray, run_processes): the platform's own error in a task is said in
    one line, exit 1."""
    from gates.execution import TaskError

    try:
        return run(*args, **kwargs)
    except TaskError as e:
        if isinstance(display, _JsonProgress):
            print(json.dumps({"error": {"code": e.code, "message": str(e)}}), flush=True)
        err.print(f"error: {e}", markup=False, highlight=False)
        raise typer.Exit(1) from None


def _fetch_corpora(loaded, console) -> None:
    """`gates run --fetch`: fetch each registered corpus an arm needs and lacks (gates.data_cli), printing
    what `gates data fetch` prints, license included; the preflight then checks the arms again."""
    from gates.cli._data import corpora_to_fetch, fetch_and_describe

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


def _run_distributed(
    loaded,
    uri,
    runs_dir,
    storage,
    fresh,
    no_wait,
    heartbeat,
    progress,
    as_json,
    optuna_storage,
    recording,
):
    from gates.execution import DeadJobs, describe_enqueued, run_distributed

    def announce(enqueued):
        if as_json:
            print(
                json.dumps({"event": "enqueued", **json.loads(describe_enqueued(enqueued))}),
                flush=True,
            )
        else:
            err.print(
                f"study {enqueued.study_name!r} on {enqueued.storage}: {len(enqueued.enqueued)} job(s) enqueued, "
                f"{len(enqueued.reused)} reused from MLflow, {len(enqueued.present)} already queued or done; "
                f"workers: gates worker --storage URL",
                markup=False,
                highlight=False,
            )
        if uri.startswith(("sqlite:", "file:")) or "://" not in uri:
            err.print(
                f"note: MLflow store {uri} is local to this machine; workers elsewhere need a shared "
                f"tracking server (--tracking-uri http://HOST:PORT)",
                markup=False,
                highlight=False,
            )

    try:
        result = run_distributed(
            loaded,
            uri,
            runs_dir,
            storage,
            fresh=fresh,
            wait=not no_wait,
            progress=progress,
            heartbeat=heartbeat,
            on_enqueued=announce,
            optuna_storage=optuna_storage,
            recording=recording,
        )
    except DeadJobs as e:
        err.print(f"error: {e}", markup=False, highlight=False)
        raise typer.Exit(1) from None
    if no_wait:
        err.print(
            f"not waiting: `gates run {loaded.path} --storage URL` re-attaches, waits and writes the evidence",
            markup=False,
            highlight=False,
        )
        return None
    return result


@app.command()
def worker(
    storage: str = typer.Option(
        ..., "--storage", help="The Optuna RDB storage URL the coordinator enqueued into."
    ),
    tracking_uri: str | None = typer.Option(
        None,
        "--tracking-uri",
        help="MLflow tracking URI as seen from this "
        "machine (default: the one the coordinator used).",
    ),
    max_jobs: int | None = typer.Option(
        None, "--max-jobs", min=1, help="Exit after this many jobs."
    ),
    idle_exit: float | None = typer.Option(
        None,
        "--idle-exit",
        min=0,
        help="Exit after this many seconds without a claimable job (default: serve forever).",
    ),
    heartbeat: int = typer.Option(
        10,
        "--heartbeat",
        help="Optuna heartbeat interval in seconds (use the coordinator's value).",
    ),
    threads: int | None = THREADS,
):
    """Claim arm x seed jobs enqueued by `gates run CONTRACT --storage URL` (any contract in that storage),
    run them under the same stop rules into the shared MLflow store, and record each result; a job whose
    worker dies is failed by heartbeat and re-enqueued. Run any number of these, on any machines."""
    import shutil
    import time as _time

    from gates.execution import Worker, retain_freed_memory
    from gates.study import cpu_threads

    retain_freed_memory()  # this process trains: keep its large buffers between steps

    def log(line: str) -> None:
        print(f"{_time.strftime('%H:%M:%S')} {line}", flush=True)

    signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    w = Worker(storage, tracking_uri, heartbeat=heartbeat, log=log)
    log(f"worker {w.id} on {storage.split('@')[-1]}")
    try:
        with cpu_threads(threads):
            w.serve(max_jobs=max_jobs, idle_exit=idle_exit)
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    finally:
        shutil.rmtree(w.tmp, ignore_errors=True)


@app.command()
def verify(
    contracts: list[Path] | None = typer.Argument(
        None, help="Only these contracts (default: every claim in runs/)."
    ),
    replay: bool = typer.Option(
        False, "--replay", help="Also re-run contracts marked `replay: {ci: true}`."
    ),
    runs_dir: Path = RUNS_DIR,
    contracts_dir: Path = CONTRACTS_DIR,
    as_json: bool = typer.Option(False, "--json", help="Print the checks as JSON."),
    strict_code: bool = typer.Option(
        False,
        "--strict-code",
        help="Also fail on stale standing claims (not superseded or withdrawn): the code their "
        "evidence was computed with (the study's modules) changed since and no certification "
        "covers it; each names the `gates certify` that clears it (without it, stale claims are only "
        "reported).",
    ),
    audit_seconds: float | None = typer.Option(
        None,
        "--audit-seconds",
        min=0,
        help="Spot-check audit: re-run "
        "completed arm x seed runs of the contracts this verify does not "
        "replay, in an order seeded from the git commit (printed) that "
        "nothing recorded steers, for this many seconds; a run whose metrics "
        "do not reproduce within the contract's replay tolerance loses its "
        "claim; a run whose recorded seconds x 2 exceed the budget is not "
        "started and named unaudited, one that no longer fits the time left "
        "is passed over and listed, one that overruns its projection is "
        "stopped early and named unaudited; the runs not reached are counted.",
    ),
    audit_strict: bool = typer.Option(
        False,
        "--audit-strict",
        help="Also fail when the audit left runs "
        "unaudited for lack of time: too long for the budget, or stopped "
        "(without it, only reported).",
    ),
    audit_seed: int | None = typer.Option(
        None,
        "--audit-seed",
        help="Seed of the audit's choice (default: "
        "a fresh random one, printed), e.g. to repeat a CI run's audit.",
    ),
    audit_tolerance: str | None = typer.Option(
        None,
        "--audit-tolerance",
        metavar="ABS,REL",
        help="Tolerance "
        "of the audit for contracts without a `replay` section (default: "
        "replay's defaults, 1e-6,1e-6: the same machine); a declared one "
        "is always used as declared.",
    ),
    jobs: int = typer.Option(
        1,
        "--jobs",
        min=1,
        help="With --replay: run the replays' arm x seed runs in this many local processes (each "
        "on the thread count its runs recorded; where none was recorded, the cores divided among "
        "the processes).",
    ),
):
    """Fail (exit 1) when a claim lost its evidence: contract edited after the fact, evidence missing or
    malformed, a verdict that no longer reproduces (from its metrics, by replay or by audit), or a claims
    history (runs/INDEX.jsonl) that was rewritten or does not vouch for the evidence (changed or gone
    without an entry). Withdrawn claims pass as withdrawn; stale claims are reported (--strict-code: fail),
    as are runs the audit stopped for lack of time (--audit-strict: fail)."""
    from gates.verify import UNAUDITED
    from gates.verify import verify as verify_claims

    def log(
        line: str,
    ) -> None:  # the audit's plan and results, as they happen (stderr under --json)
        (err if as_json else out).print(line, markup=False, highlight=False)

    tolerance = _tolerance(audit_tolerance, "--audit-tolerance")
    if replay or audit_seconds:
        from gates.execution import retain_freed_memory

        retain_freed_memory()  # this process trains: keep its large buffers between steps
    checks = verify_claims(
        runs_dir,
        contracts_dir,
        contracts or None,
        replay=replay,
        strict_code=strict_code,
        audit_seconds=audit_seconds,
        audit_seed=audit_seed,
        audit_tolerance=tolerance,
        jobs=jobs,
        log=log,
    )
    lost = [c for c in checks if c.status == "lost"]
    broken = [c for c in checks if c.status == "broken"]
    unaudited = [c for c in checks if UNAUDITED in c.codes]
    if as_json:
        print(json.dumps([c.as_dict() for c in checks], indent=2))
    else:
        for c in checks:
            mark = {
                "ok": "[green]ok[/]",
                "lost": "[red]LOST[/]",
                "pending": "[yellow]pending[/]",
                "broken": "[red]BROKEN[/]",
                "withdrawn": "[magenta]withdrawn[/]",
            }[c.status]
            n = len(c.audited)
            extra = (" (replayed)" if c.replayed else "") + (
                f" (audited {n} run{'s' * (n != 1)})" if n else ""
            )
            shown = c.verdict or ("does not check" if c.status == "broken" else "-")
            out.print(f"{mark} {c.contract_id}: {shown}{extra}", highlight=False)
            for p in c.problems:
                out.print(f"    {p}", markup=False, highlight=False)
            notes = _claim_notes(c, lambda files: describe_stale(files, shown=3), short=True)
            for note in (
                notes if not strict_code else [n for n in notes if not n.startswith("stale")]
            ):
                out.print(f"    note: {note}", markup=False, highlight=False)
        out.print(_verify_summary(checks, unaudited), markup=False, highlight=False)
    if lost or broken or (audit_strict and unaudited):
        raise typer.Exit(1)


def _verify_summary(checks, unaudited) -> str:
    """`gates verify`'s last line: how many claims with evidence hold it (pending contracts, without
    evidence, and withdrawn claims are counted apart), then the lost claims and broken contracts."""
    by_status: dict[str, list[str]] = {}
    for c in checks:
        by_status.setdefault(c.status, []).append(c.contract_id)
    held, lost = by_status.get("ok", []), by_status.get("lost", [])
    pending, broken = by_status.get("pending", []), by_status.get("broken", [])
    withdrawn = by_status.get("withdrawn", [])
    return (
        f"{len(held)} of {len(held) + len(lost)} claims hold their evidence"
        + (f"; {len(pending)} pending (no evidence yet)" if pending else "")
        + (f"; {len(withdrawn)} withdrawn" if withdrawn else "")
        + (f"; lost: {', '.join(lost)}" if lost else "")
        + (
            f"; {len(broken)} contract{'s do' if len(broken) > 1 else ' does'} not check: "
            f"{', '.join(broken)}"
            if broken
            else ""
        )
        + (
            f"; unaudited runs in: {', '.join(c.contract_id for c in unaudited)}"
            if unaudited
            else ""
        )
    )


def _tolerance(text: str | None, option: str) -> tuple[float, float] | None:
    """ABS,REL of a tolerance option (None when not given)."""
    if text is None:
        return None
    try:
        tolerance = tuple(float(x) for x in text.split(","))
    except ValueError:
        tolerance = ()
    if len(tolerance) != 2 or not all(0 <= x < float("inf") for x in tolerance):
        raise UserError(
            f"{text!r} is not ABS,REL: expected two finite numbers >= 0 (e.g. 0.01,0.01)",
            field=option,
        )
    return tolerance


def _claim_notes(c, describe_stale, short: bool = False) -> list[str]:
    """What a reader of a claim should know beyond pass/fail: withdrawal, supersedes chain, stale
    code, rules the recorded contract predates (`short`: each rule by its name only)."""
    notes = []
    if c.attempts > 1:
        notes.append(f"attempt {c.attempts}; earlier: {'; '.join(c.earlier)}")
    if c.withdrawn:
        notes.append(f"withdrawn: {c.withdrawal}")
    if c.superseded_by:
        notes.append(f"superseded by {', '.join(c.superseded_by)}")
    if c.regime_left:
        notes.append(f"regime left: {c.regime_left.note}")
    if c.shared_runs:
        from gates.record import describe_shared

        notes.append(describe_shared(c.shared_runs))
    if c.supersedes:
        notes.append(f"supersedes {c.supersedes}")
    if c.family:
        notes.append(c.family)
    if c.certified:
        notes.append(f"certified {c.certified}")
    if c.stale:
        since = "its certification" if c.certified else "its evidence"
        notes.append(
            f"stale: code changed since {since}: {describe_stale(c.stale_files)}"
            + (f" ({c.stale_note})" if c.stale_note else "")
        )
    if c.rule_flags:
        import re

        flags = (
            [
                m.group(1) if (m := re.search(r"\(rule: ([^)]*)\)", f)) else f[:80]
                for f in c.rule_flags
            ]
            if short
            else c.rule_flags
        )
        notes.append(f"recorded under older rules: {'; '.join(dict.fromkeys(flags))}")
    return notes


@app.command()
def rederive(
    contracts: list[Path] = typer.Argument(
        ..., help="Contract YAML files whose evidence to re-derive."
    ),
    reason: str = typer.Option(..., "--reason", help="Why (recorded in runs/INDEX.jsonl)."),
    runs_dir: Path = RUNS_DIR,
):
    """Re-derive recorded verdicts with today's verdict engine from their recorded per-seed values (no
    training), after a correction of the statistics: rewrites evidence.json and verdict.md where anything
    changed and appends a `rederived` entry with the reason to the claims index."""
    from gates.contract import load_contract
    from gates.execution import rederive as rederive_claim

    if not reason.strip():
        raise UserError("give a reason: it is recorded in the claims index", field="--reason")
    for path in contracts:
        loaded = load_contract(path)
        changed = rederive_claim(loaded, runs_dir, reason.strip())
        if changed is None:
            out.print(f"{loaded.id}: unchanged", markup=False)
        else:
            old, new = changed
            moved = [
                f"{c.list_name}[{c.index}] {o.outcome} -> {c.outcome}"
                for o, c in zip(old.conditions, new.conditions)
                if o.outcome != c.outcome
            ]
            out.print(
                f"{loaded.id}: {old.verdict} -> {new.verdict}"
                + (f" ({'; '.join(moved)})" if moved else ""),
                markup=False,
            )


@app.command()
def certify(
    contracts: list[Path] = typer.Argument(..., help="Contract YAML files of recorded claims."),
    reason: str = typer.Option(
        ..., "--reason", help="Why (recorded in runs/INDEX.jsonl), e.g. the refactor it follows."
    ),
    sample: int | None = typer.Option(
        None,
        "--sample",
        min=1,
        help="Re-run this many of each claim's completed runs, chosen at random (a fresh seed, "
        "printed, or --seed), instead of all of them.",
    ),
    seed: int | None = typer.Option(None, "--seed", help="Seed of the --sample choice."),
    tolerance: str | None = typer.Option(
        None,
        "--tolerance",
        metavar="ABS,REL",
        help="Tolerance for contracts without a `replay` section (default: replay's defaults, "
        "1e-6,1e-6: the same machine; CI's audit uses 0.01,0.01 across machines); a declared one "
        "is always used as declared. Recorded in the certified entry.",
    ),
    runs_dir: Path = RUNS_DIR,
    contracts_dir: Path = CONTRACTS_DIR,
):
    """Check recorded claims against today's code: re-run their completed runs (each bare, on the
    CPU thread count it recorded) and compare every recorded metric within the contract's replay
    tolerance. When all reproduce, a `certified` entry with today's code fingerprint and the runs
    re-run is appended to the claims history, and the claim is no longer stale (stale means: not
    checked against today's code). Exit 1 when any run does not reproduce; nothing is written then."""
    from gates.execution import load_checked, require_in_contracts
    from gates.verify import certify as certify_claim

    if not reason.strip():
        raise UserError("give a reason: it is recorded in the claims index", field="--reason")
    default_tolerance = _tolerance(tolerance, "--tolerance")
    failed = []
    for path in contracts:
        loaded = load_checked(path)
        require_in_contracts(loaded, contracts_dir)
        done = certify_claim(
            loaded,
            runs_dir,
            reason,
            sample=sample,
            seed=seed,
            default_tolerance=default_tolerance,
            log=lambda line: out.print(line, markup=False, highlight=False),
        )
        if done.certified:
            out.print(
                f"{loaded.id}: certified ({done.entry['reran']} reproduce under code "
                f"{done.entry['code_sha256'][:12]})",
                markup=False,
            )
        else:
            failed.append(loaded.id)
            for problem in done.problems:
                err.print(f"{loaded.id}: {problem}", markup=False, highlight=False)
    if failed:
        err.print(
            f"not certified: {', '.join(failed)} (runs that do not reproduce under today's code; "
            f"nothing written)",
            markup=False,
        )
        raise typer.Exit(1)


@app.command()
def status(
    ids: list[str] | None = typer.Argument(
        None,
        metavar="[ID-or-glob...]",
        help="Only these claims: ids, or shell-style patterns (quoted: 'c05-*').",
    ),
    details: bool = typer.Option(
        False,
        "--details",
        "-v",
        help="Each claim with its hash check, code (stale files), notes and problems (a table on a "
        "terminal of 120 columns or more, else a block per claim), not one line.",
    ),
    runs_dir: Path = RUNS_DIR,
    contracts_dir: Path = CONTRACTS_DIR,
    as_json: bool = typer.Option(
        False,
        "--json",
        help="Print a JSON list, per claim: id, verdict, status, "
        "hash_ok, stale, stale_files, withdrawn, superseded_by, supersedes, family (its claim "
        "family and the alpha it was judged at), rule_flags, attempts, earlier_attempts, problems "
        "and their codes (problem_codes).",
    ),
    full: bool = typer.Option(
        False,
        "--full",
        help="Check every claim as `gates verify` does (re-derive "
        "each verdict, apply today's rules to each contract: imports every study; "
        "seconds instead of a fraction of one).",
    ),
):
    """Every claim (or those named) in one line: its id, verdict (withdrawn, superseded), date and
    state (ok, lost, pending, withdrawn; stale: its code changed since). With --details (-v): whether
    its hash still matches its evidence, the stale files, notes, rules it predates and problems (narrower
    than 120 columns: one block per claim, its id whole, each line cut to the width). Read from
    runs/*/evidence.json, the contracts' hashes and the claims history (runs/INDEX.jsonl), without
    importing any study: rules a contract predates are those its evidence recorded, and the
    re-derivation of each verdict is `gates verify`'s (or `--full`)."""
    if full:
        from gates.verify import verify as verify_claims

        checks = verify_claims(runs_dir, contracts_dir)
    else:
        from gates.verify import claims

        checks = claims(runs_dir, contracts_dir)
    if ids:
        checks = _named_claims(checks, ids)
    if as_json:
        print(
            json.dumps(
                [
                    {
                        "id": c.contract_id,
                        "verdict": c.verdict,
                        "status": c.status,
                        "hash_ok": c.hash_ok,
                        "stale": c.stale,
                        "stale_files": c.stale_files,
                        "stale_note": c.stale_note,
                        "withdrawn": c.withdrawn,
                        "withdrawal": c.withdrawal,
                        "superseded_by": c.superseded_by,
                        "supersedes": c.supersedes,
                        "family": c.family,
                        "rule_flags": c.rule_flags,
                        "recorded": c.created_at,
                        "attempts": c.attempts,
                        "earlier_attempts": c.earlier,
                        "shared_runs": c.shared_runs,
                        "regime_left": c.regime_left.as_dict() if c.regime_left else None,
                        "problems": c.problems,
                        "problem_codes": c.codes,
                        "certified": c.certified,
                    }
                    for c in checks
                ],
                indent=2,
            )
        )
        return
    rows = [_status_row(c) for c in checks]
    if not details:
        _print_status_lines(rows, out.width)
    elif out.width >= WIDE_STATUS:
        table = Table("contract", "verdict", "recorded", "hash ok", "code", "notes and problems")
        for row in rows:
            code = f"stale: {row.stale_files}" if row.code == "stale" else row.code
            table.add_row(row.id, row.shown, row.recorded, row.hash_ok, code, "; ".join(row.notes))
        out.print(table)
    else:
        _print_status_blocks(rows, out.width)
    if not full:
        out.print(
            ("" if details else "`gates status -v [ID...]`: hash, code, notes and problems; ")
            + "from the evidence, contract hashes and claims history; `gates verify` also re-derives "
            "every verdict, `gates check` applies today's rules",
            markup=False,
            highlight=False,
            style="dim",
            soft_wrap=False,  # prose: wrapped at the terminal's width
        )


def _named_claims(checks: list, patterns: list[str]) -> list:
    """The claims whose id is one of `patterns` or matches it as a shell-style pattern (fnmatch), in
    their order; a pattern no claim matches is bad input (exit 2)."""
    from fnmatch import fnmatchcase

    from gates.errors import did_you_mean

    ids = [c.contract_id for c in checks]
    for pattern in patterns:
        if not any(fnmatchcase(i, pattern) for i in ids):
            raise UserError(
                f"no claim matches {pattern!r}{did_you_mean(pattern, ids)}; expected a claim's id or "
                f"a pattern such as 'c05-*' (`gates status` lists them)",
                field="ids",
            )
    return [c for c in checks if any(fnmatchcase(c.contract_id, p) for p in patterns)]


def _print_status_lines(rows: list[_StatusRow], width: int) -> None:
    """One line per claim, in columns: id, verdict, date, state (ok, lost, pending, broken; "stale"
    where its code changed since; nothing for a withdrawn claim, which its verdict names); a line
    that does not fit the width drops the padding, then is cut (the id first, whole)."""
    from rich.text import Text

    if not rows:
        return
    id_w = max(len(r.id) for r in rows)
    shown_w = max(len(r.shown) for r in rows)
    for row in rows:
        # a withdrawn claim says so in its verdict column; whether its code changed since is moot
        state = "" if row.status == "withdrawn" else row.status
        state += " stale" if row.code == "stale" and state else ""
        parts = (row.id, row.shown, row.recorded, state)
        line = f"{row.id:<{id_w}}  {row.shown:<{shown_w}}  {row.recorded:<10}  {state}".rstrip()
        if len(line) > width:
            line = "  ".join(p for p in parts if p)
        if len(line) > width:
            line = line[: max(width - 3, len(row.id))] + "..."
        style = {"lost": "red", "broken": "red", "pending": "yellow"}.get(row.status, "")
        text = Text(line)
        text.stylize("bold", 0, len(row.id))
        at = line.rfind(state)
        if style and at > len(row.id):
            text.stylize(style, at, at + len(state))
        out.print(text, highlight=False, soft_wrap=False, overflow="ignore", crop=False)


# `gates status` below this many columns: one block per claim, as a table's six columns wrap into a
# line per word there and cut the ids (c05-struct…)
WIDE_STATUS = 120


@dataclass
class _StatusRow:
    id: str
    shown: str  # the verdict, withdrawn or superseded
    recorded: str  # its date
    hash_ok: str
    code: str  # "current", "stale" or "-"
    stale_files: str  # which files changed, when stale
    notes: list[str]  # notes, then the first problem
    status: str = "ok"  # the check's: ok, lost, pending, withdrawn, broken


def _status_row(c) -> _StatusRow:
    shown = c.verdict or c.status  # evidence that cannot be read is "lost", never "pending"
    if c.withdrawn:
        shown = f"withdrawn ({c.verdict or '-'})"
    elif c.superseded_by:
        shown = f"{shown} (superseded)"
    notes = [n for n in _claim_notes(c, describe_stale, short=True) if not n.startswith("stale")]
    if c.problems:
        more = f" (+{len(c.problems) - 1} more)" if len(c.problems) > 1 else ""
        notes.append(c.problems[0][:100] + ("..." if len(c.problems[0]) > 100 else "") + more)
    return _StatusRow(
        c.contract_id,
        shown,
        (c.created_at or "-")[:10],
        {True: "yes", False: "no", None: "-"}[c.hash_ok],  # None: not compared (no evidence)
        "stale" if c.stale else ("current" if c.created_at else "-"),
        describe_stale(c.stale_files, shown=0) if c.stale else "",
        notes,
        c.status,
    )


def _print_status_blocks(rows: list[_StatusRow], width: int) -> None:
    """One block per claim for a narrow terminal: its id whole, then verdict, date, hash and code on the
    same line where they fit (else on the next), then one indented line per stale files, note and
    problem, each cut to the width (`gates status --json` has them whole)."""
    from rich.text import Text

    def fit(text: str) -> str:
        return text if len(text) <= width else text[: max(width - 3, 0)] + "..."

    for row in rows:
        facts = f"{row.shown}  {row.recorded}  hash {row.hash_ok}  code {row.code}"
        if len(row.id) + 2 + len(facts) <= width:
            out.print(Text.assemble((row.id, "bold"), f"  {facts}"), highlight=False)
        else:
            out.print(Text(row.id, style="bold"), highlight=False)
            out.print(fit(f"    {facts}"), markup=False, highlight=False)
        details = ([f"stale: {row.stale_files}"] if row.code == "stale" else []) + row.notes
        for line in details:
            out.print(fit(f"    {line}"), markup=False, highlight=False)


@app.command()
def withdraw(
    contract_id: str = typer.Argument(..., help="Id of the recorded claim to withdraw."),
    reason: str = typer.Option(
        ..., "--reason", help="Why it is withdrawn (recorded in the index)."
    ),
    runs_dir: Path = RUNS_DIR,
    tracking_uri: str | None = typer.Option(
        None,
        "--tracking-uri",
        help="MLflow store whose parent run of the claim is tagged withdrawn (default: "
        "$MLFLOW_TRACKING_URI, else sqlite:///mlflow.db); never the store the evidence names.",
    ),
):
    """Withdraw a recorded claim: append a `withdrawn` entry with the reason to runs/INDEX.jsonl. Its
    evidence and contract stay (they may be removed afterwards); status, the dashboard and verify show
    it as withdrawn, never as lost. Running the contract again records it anew. Its MLflow parent run
    is tagged withdrawn (`gates.verdict = withdrawn`) in your store (`--tracking-uri`, else
    $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db) when it can be reached; the store the evidence
    recorded is never connected to."""
    from gates.record import (
        EVIDENCE,
        INDEX,
        evidence_dir,
        index_path,
        is_withdrawn,
        latest_entries,
        record_entry,
        require_index_file,
        resolve_uri,
        withdraw_claim_run,
    )

    if not reason.strip():
        raise UserError("--reason is empty; expected why the claim is withdrawn", field="--reason")
    try:
        require_index_file(runs_dir)
    except ValueError as e:
        raise UserError(str(e), field="--runs-dir") from None
    latest = latest_entries(runs_dir).get(contract_id)
    evidence = evidence_dir(runs_dir, contract_id) / EVIDENCE
    if latest is None and not evidence.is_file():
        raise UserError(
            f"no recorded claim {contract_id!r} in {runs_dir} (no evidence, no index entry); "
            f"expected the id of a claim with evidence",
            field="contract_id",
        )
    if is_withdrawn(latest):
        raise UserError(
            f"{contract_id} is already withdrawn ({INDEX} line {latest['_line']}, "
            f"{latest.get('time')}: {latest.get('reason')})",
            field="contract_id",
        )
    try:
        record_entry(runs_dir, evidence, "withdrawn", reason.strip())
    except (OSError, ValueError) as e:
        raise UserError(
            f"cannot append to {index_path(runs_dir)}: {e}", field="--runs-dir"
        ) from None
    out.print(
        f"withdrawn {contract_id}: {reason.strip()} ({index_path(runs_dir)})",
        markup=False,
        highlight=False,
    )
    # after the entry: the claims history is the record, the MLflow parent run's tags only a view
    note = withdraw_claim_run(evidence, reason.strip(), resolve_uri(tracking_uri))
    if note:
        out.print(f"{note}; the withdrawal stands", markup=False, highlight=False)


@app.command()
def render(
    ids: list[str] | None = typer.Argument(
        None, help="Contract ids (default: every runs/*/evidence.json)."
    ),
    runs_dir: Path = RUNS_DIR,
):
    """Rewrite runs/<id>/verdict.md from runs/<id>/evidence.json (after a change of the report renderer;
    `gates verify` requires verdict.md to be exactly the rendering of the evidence). The evidence is
    not changed."""
    import re

    from gates.contract import SLUG
    from gates.record import EVIDENCE, evidence_dir, write_report

    for i in ids or []:
        if not re.fullmatch(SLUG.strip("^$"), i):
            raise UserError(
                f"{i!r} is not a contract id; expected an id like c05-structural-probe", field="ids"
            )
    folders = (
        [evidence_dir(runs_dir, i) for i in ids]
        if ids
        else sorted(p.parent for p in runs_dir.glob(f"*/{EVIDENCE}"))
    )
    for folder in folders:
        try:
            written = write_report(folder)
        except ValueError as e:
            raise UserError(
                f"{e}; expected valid evidence (restore it from git, or run the contract again)",
                file=str(folder / EVIDENCE),
            ) from None
        out.print(f"rendered {written}", markup=False, highlight=False)


TRACKING_URI = typer.Option(
    None,
    "--tracking-uri",
    help="MLflow store for the learning curves (default: "
    "$MLFLOW_TRACKING_URI, else sqlite:///mlflow.db); a missing store only hides the curves.",
)
MLFLOW_UI = typer.Option(
    "http://127.0.0.1:5000", "--mlflow-ui", help="MLflow UI address the run links point to."
)


@app.command()
def dashboard(
    runs_dir: Path = RUNS_DIR,
    contracts_dir: Path = CONTRACTS_DIR,
    tracking_uri: str | None = TRACKING_URI,
    mlflow_ui: str = MLFLOW_UI,
    host: str = typer.Option(
        "127.0.0.1", "--host", help="Address to listen on (local only by default)."
    ),
    port: int = typer.Option(8765, "--port", help="Port to listen on (0: any free port)."),
):
    """Serve the claims dashboard (read-only): every contract's verdict and hash check, and per contract its
    conditions' intervals, learning curves with stop rules and halts, per-seed metrics, provenance."""
    from gates.dashboard.server import serve
    from gates.dashboard.site import Site
    from gates.record import resolve_uri

    serve(Site(runs_dir, contracts_dir, resolve_uri(tracking_uri), mlflow_ui), host, port)


@app.command()
def report(
    html: Path = typer.Option(
        ..., "--html", help="Folder to write index.html and contract/<id>.html into."
    ),
    runs_dir: Path = RUNS_DIR,
    contracts_dir: Path = CONTRACTS_DIR,
    tracking_uri: str | None = TRACKING_URI,
    mlflow_ui: str = MLFLOW_UI,
):
    """Write the dashboard's pages as static HTML files with relative links (for CI artifacts)."""
    from gates.dashboard.site import Site
    from gates.record import resolve_uri

    try:
        written = Site(runs_dir, contracts_dir, resolve_uri(tracking_uri), mlflow_ui).write_static(
            html
        )
    except OSError as e:  # e.g. a folder that cannot be created or written
        raise UserError(
            f"cannot write the report into {html}: {e.strerror or e}; expected a writable folder",
            field="--html",
        ) from None
    out.print(f"wrote {len(written)} pages: {written[0]}", markup=False, highlight=False)


@app.command()
def schema(
    study: str | None = typer.Option(
        None, "--study", help="Print this study's arm config schema instead."
    ),
):
    """Print the JSON Schema of a contract (for editors), or of one study's arm configuration."""
    from gates.contract import Contract
    from gates.errors import did_you_mean
    from gates.study import get_study, study_names

    if study is None:
        print(json.dumps(Contract.model_json_schema(), indent=2))
        return
    try:
        print(json.dumps(get_study(study).Config.model_json_schema(), indent=2))
    except KeyError:
        raise UserError(
            f"unknown study {study!r}{did_you_mean(study, study_names())}; "
            f"registered: {', '.join(study_names())}",
            field="--study",
        ) from None


@app.command()
def studies(
    names: list[str] | None = typer.Argument(
        None, help="Show these studies' metrics (imports them)."
    ),
    metrics: bool = typer.Option(
        False, "--metrics", help="Show every study's metrics (imports each study, and so torch)."
    ),
    as_json: bool = typer.Option(
        False,
        "--json",
        help="Print a JSON list, per study: name, class, module, distribution, and with names or "
        "--metrics its doc and metrics (name -> direction, role, low, high, scale, chance, unit; "
        "null without: nothing imported); a study that cannot be used has an `error` object.",
    ),
):
    """List the registered studies: name, class and the installed distribution that registers it (from the
    entry-point metadata, nothing imported). With names or --metrics: each study's metrics (name: better
    direction, role, range). A decision may read only `test` and `cost` metrics; stop rules may read any role."""
    from dataclasses import asdict

    from gates.errors import did_you_mean
    from gates.study import StudyError, get_study, study_entries

    entries = {e.name: e for e in study_entries()}
    for name in names or []:
        if name not in entries:
            raise UserError(
                f"unknown study {name!r}{did_you_mean(name, entries)}; registered: "
                f"{', '.join(entries) or 'none'}",
                field="NAME",
            )
    shown = names or list(entries)
    rows = [
        {
            "name": e.name,
            "class": e.value,
            "module": e.value.split(":", 1)[0].strip(),
            "distribution": e.distribution,
            "doc": None,
            "metrics": None,
        }
        for e in (entries[n] for n in shown)
    ]
    broken = []
    if names or metrics:  # only then a study is imported
        for row in rows:
            try:
                s = get_study(row["name"])
            except StudyError as e:
                broken.append(e)
                row["error"] = e.as_dict()
                continue
            doc = (s.__doc__ or "").strip().splitlines()
            row["doc"] = doc[0] if doc else ""
            row["metrics"] = {
                m: {**asdict(metric), "estimand": metric.default_estimand}
                for m, metric in s.metrics.items()
            }
    if as_json:
        print(json.dumps(rows, indent=2))
        if broken:
            raise _ReportedErrors(broken)
        return
    if not names and not metrics:
        for e in entries.values():
            out.print(
                f"{e.name}: {e.value}" + (f" ({e.distribution})" if e.distribution else ""),
                markup=False,
                highlight=False,
            )
        out.print(
            "metrics: `gates studies NAME` or `gates studies --metrics`; arm config: `gates schema --study NAME`",
            markup=False,
            highlight=False,
            style="dim",
        )
        return
    for row in rows:
        if "error" in row:  # could not be used: said after the others
            continue
        out.print(f"[bold]{row['name']}[/]: {row['doc']}", highlight=False)
        out.print(
            f"  class: {row['class']}"
            + (f" ({row['distribution']})" if row["distribution"] else ""),
            markup=False,
            highlight=False,
        )
        out.print("  metrics:", markup=False)
        for m, metric in get_study(row["name"]).metrics.items():
            out.print(f"    {m}: {metric.describe()}", markup=False)
    if broken:
        raise UserErrors(broken)


# ---------------------------------------------------------------------------------- output
def _print_stale_hint(contract: Path, runs_dir: Path, contracts_dir: Path) -> None:
    """After a reproduction that reproduces: where the claim is stale (its code changed since its
    evidence or certification, as `gates status` says), the command that clears it."""
    from gates.verify import claims

    for check in claims(runs_dir, contracts_dir, [contract]):
        if not check.stale:
            continue
        out.print(
            f"the claim is stale: code changed since its evidence ({describe_stale(check.stale_files)}); "
            f"`gates certify {contract} --reason TEXT` re-runs its runs under today's code and, when they "
            f"reproduce, records that (the claim is then current)",
            markup=False,
            highlight=False,
        )


def _print_verdict(
    ev: Evidence, runs_dir: Path, outcome=None, contract: Path | None = None
) -> None:
    from gates.record import condition_label, condition_rows, signature

    colour = {
        "supported": "green",
        "refuted": "red",
        "inconclusive": "yellow",
        "invalid": "magenta",
    }[ev.verdict]
    out.print(f"\n[bold {colour}]{ev.verdict.upper()}[/]  {ev.contract_id}", highlight=False)
    out.print(ev.claim, markup=False, highlight=False)
    for row in condition_rows(list(ev.conditions), list(ev.settings.arm_configs)):
        c = row.first
        # coloured by what the result means for the claim, never by holds/fails alone
        mark = {"supports": "green", "refutes": "red"}.get(row.meaning, "yellow")
        names = " + ".join(condition_label(r) for r in row.records)
        outcomes = ", ".join(r.outcome for r in row.records)
        out.print(
            f"  [{mark}]{row.meaning:<12}[/] {c.description}  ({names}: {outcomes})",
            highlight=False,
        )
        observed = "; ".join(
            f"{term} = {', '.join(f'{v:.4g}' for v in values)}" for term, values in c.values.items()
        )
        stats = ""
        if c.estimate is not None:
            stats = f"margin {c.estimate:+.4g}"
            if c.ci_low is not None:
                stats += f" [{c.ci_low:.4g}, {c.ci_high:.4g}]"
            if c.p_hold_adj is not None:
                stats += f", p(holds) {c.p_hold_adj:.3g}, p(fails) {c.p_fail_adj:.3g}"
        out.print(f"               {observed}; {stats} ({c.test})", markup=False, highlight=False)
    out.print("why:", highlight=False)
    for r in ev.reasons:
        out.print(f"  - {r}", markup=False, highlight=False)
    for s in ev.settle:
        out.print(f"  to settle: {s}", markup=False, highlight=False)
    out.print(signature(ev), markup=False, highlight=False)
    if outcome is None:
        return
    out.print(outcome.reuse.line(), markup=False, highlight=False)
    path = runs_dir / ev.contract_id / "evidence.json"
    if outcome.recorded:
        earlier = len(outcome.recording.earlier)
        out.print(
            f"recorded attempt {outcome.recording.number}"
            + (f" (earlier attempts: {earlier}, kept on the record)" if earlier else "")
            + f": {path} and {runs_dir / 'INDEX.jsonl'}",
            markup=False,
            highlight=False,
        )
        return
    for line in outcome.reproduction.lines():
        out.print(line, markup=False, highlight=False)
    out.print(
        f"nothing was written under {runs_dir}/ (the record: {path}); to record this run as attempt "
        f"{outcome.recording.number + 1}: gates run {contract or 'CONTRACT'} --record --reason TEXT",
        markup=False,
        highlight=False,
    )


class _Overall:
    """The whole run's progress, said after each run: runs done of those planned (arms x seeds; a
    sequential contract may stop at an earlier look: "of at most N"), reused or not run, the time
    elapsed and about how long is left: the runs left x the pace of the runs trained so far (time since
    the first started / runs trained, so that on several workers it is their joint pace)."""

    def __init__(self, loaded):
        c = loaded.contract
        self.planned = len(loaded.arm_configs) * len(c.seeds)
        self.at_most = c.sequential is not None
        self.done = self.reused = self.not_run = 0
        self.began = time.monotonic()
        self.first_trained: float | None = None  # when the first run that trains began
        self.skipped: set[tuple[str, int]] = set()  # runs taken from MLflow or not run

    def start(self, arm, seed, skipped=None) -> None:
        if skipped is not None:
            self.skipped.add((arm, seed))
        elif self.first_trained is None:
            self.first_trained = time.monotonic()

    def end(self, record) -> None:
        self.done += 1
        if (record["arm"], record["seed"]) in self.skipped:
            if record["status"] == "skipped":  # its arm kept failing (stop_rules.failures)
                self.not_run += 1
            else:
                self.reused += 1

    def eta_s(self) -> float | None:
        trained = self.done - self.reused - self.not_run
        if not trained or self.first_trained is None:
            return None  # no pace yet
        pace = (time.monotonic() - self.first_trained) / trained
        return pace * max(self.planned - self.done, 0)

    def as_dict(self) -> dict:
        eta = self.eta_s()
        return {
            "done": self.done,
            "planned": self.planned,
            "at_most": self.at_most,
            "reused": self.reused,
            "not_run": self.not_run,
            "elapsed_s": round(time.monotonic() - self.began, 3),
            "eta_s": None if eta is None else round(eta, 3),
        }

    def line(self) -> str:
        counts = ", ".join(
            [f"{self.reused} reused"] * bool(self.reused)
            + [f"{self.not_run} not run"] * bool(self.not_run)
        )
        text = f"run {self.done} of {'at most ' * self.at_most}{self.planned} done"
        text += f" ({counts})" if counts else ""
        text += f"; {_duration(time.monotonic() - self.began)} elapsed"
        eta = self.eta_s()
        if eta is not None and self.done < self.planned:
            text += f"; about {_duration(eta)} left"
        return text


def _duration(seconds: float) -> str:
    """45s, 1m 20s, 2h 05m."""
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    return f"{s // 3600}h {s % 3600 // 60:02d}m"


class _RichProgress:
    """One progress bar per arm x seed with the live value of the contract's falsifiable metric, and the
    whole run's progress (_Overall): a line after each run, or the first bar on a terminal."""

    def __init__(self, loaded):
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        self.metric = loaded.contract.preflight.falsifiable_point.metric
        self.bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[live]}"),
            console=out,
            disable=not out.is_terminal,
        )
        self.tasks = {}
        self.overall = _Overall(loaded)
        self.all_runs = self.bar.add_task(
            "all runs", total=self.overall.planned, live=self.overall.line()
        )

    def __enter__(self):
        self.bar.__enter__()
        return self

    def __exit__(self, *exc):
        return self.bar.__exit__(*exc)

    def start(self, arm, seed, steps, skipped=None):
        self.overall.start(arm, seed, skipped)
        self.tasks[(arm, seed)] = self.bar.add_task(f"{arm} seed {seed}", total=steps, live="")
        if skipped:
            self.bar.update(self.tasks[(arm, seed)], completed=steps, live="reused")

    def update(self, arm, seed, step, metrics):
        live = f"{self.metric}={metrics[self.metric]:.4g}" if self.metric in metrics else ""
        self.bar.update(self.tasks[(arm, seed)], completed=step, live=live)

    def end(self, record):
        value = record["metrics"].get(self.metric)
        shown = f"{self.metric}={value:.4g}" if isinstance(value, float) else ""
        halt = f" ({record['halt_reason']})" if record.get("halt_reason") else ""
        if record["status"] == "failed" and record.get(
            "halt_detail"
        ):  # what the study did, by name
            halt += f": {record['halt_detail'].splitlines()[0][:300]}"
        line = f"{record['arm']} seed {record['seed']}: {record['status']}{halt} {shown}"
        self.overall.end(record)
        if self.bar.disable:
            out.print(line, markup=False, highlight=False)
            out.print(self.overall.line(), markup=False, highlight=False)
        else:
            self.bar.update(
                self.tasks[(record["arm"], record["seed"])],
                live=f"{record['status']}{halt} {shown}",
            )
            self.bar.update(self.all_runs, completed=self.overall.done, live=self.overall.line())

    def tuning_trial(self, record):
        value = f" {record['value']:.4g}" if record.get("value") is not None else ""
        halt = f" ({record['halt_reason']})" if record.get("halt_reason") else ""
        params = ", ".join(
            f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
            for k, v in record["params"].items()
        )
        out.print(
            f"tuning {record['arm']} trial {record['number']}: {params}: {record['state']}{halt}{value}",
            markup=False,
            highlight=False,
        )


class _JsonProgress:
    """JSON lines on stdout: a `run` event per run, each followed by a `progress` event (_Overall)."""

    def __init__(self, loaded):
        self.overall = _Overall(loaded)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def start(self, arm, seed, steps, skipped=None):
        self.overall.start(arm, seed, skipped)

    def update(self, arm, seed, step, metrics):
        pass

    def end(self, record):
        print(
            json.dumps(
                {
                    "event": "run",
                    **{
                        k: record.get(k)
                        for k in (
                            "arm",
                            "seed",
                            "status",
                            "halt_reason",
                            "metrics",
                            "mlflow_run_id",
                        )
                    },
                }
            ),
            flush=True,
        )
        self.overall.end(record)
        print(json.dumps({"event": "progress", **self.overall.as_dict()}), flush=True)

    def tuning_trial(self, record):
        print(
            json.dumps(
                {
                    "event": "tuning_trial",
                    **{
                        k: record.get(k)
                        for k in (
                            "arm",
                            "number",
                            "params",
                            "state",
                            "value",
                            "halt_reason",
                            "mlflow_run_id",
                        )
                    },
                }
            ),
            flush=True,
        )


def main() -> None:
    """The console script. No error shows a traceback: a user error (a UserError, or the command line
    itself) is one line per error on stderr and exit 2; a full disk or an unwritable file or store one
    line and exit 1. Under --json (of a command that has it) the error is also one JSON object on
    stdout, its last line, so that a program reading stdout reads JSON either way: {"error": {"code",
    "message", ...}} (gates.errors: UserError.as_dict, StorageError.as_dict; code "usage_error" for the
    command line)."""
    from typer.main import get_command

    from gates.errors import USAGE_ERROR, storage_error

    args = sys.argv[1:]
    command = get_command(app)
    as_json = _asks_json(command, args)
    try:
        code = command.main(args=args, standalone_mode=False)
    except UserError as e:  # (errors the command's JSON already holds are not printed twice)
        _fail(e.render(), e.as_dict(), 2, as_json and not isinstance(e, _ReportedErrors))
    except _CLICK_ERROR as e:  # an unknown option, a missing argument, no command
        if as_json:
            param = getattr(e, "param", None)
            field = param.opts[0] if getattr(param, "opts", None) else getattr(param, "name", None)
            error = {"code": USAGE_ERROR, "message": e.format_message(), "field": field}
            print(json.dumps({"error": error}), flush=True)
        e.show()  # usage and message, as click prints them
        sys.exit(e.exit_code)
    except typer.Abort:
        sys.stderr.write("Aborted!\n")
        sys.exit(1)
    except Exception as e:  # a full disk or an unwritable store, wherever it struck: exit 1
        found = storage_error(e)
        if found is None:
            raise
        _fail(found.render(), found.as_dict(), 1, as_json)
    sys.exit(code if isinstance(code, int) else 0)  # typer.Exit(n) comes back as n


# click's exceptions as this typer raises them: newer typer vendors click (its exceptions derive from
# typer.TyperException), older typer raises click's own
try:
    _CLICK_ERROR = typer.TyperException
except AttributeError:
    from click import ClickException as _CLICK_ERROR


def _asks_json(command, args: list[str]) -> bool:
    """Whether the command line runs, with --json, a command that has --json (its errors are then JSON
    too). The command is found as click finds it: the first words that name commands (the app's own
    options take no value); a `--` ends the options."""
    words = args[: args.index("--")] if "--" in args else args
    for word in words:
        sub = getattr(command, "commands", {}).get(word)
        if sub is not None:
            command = sub
        elif not word.startswith("-"):
            break
    return "--json" in words and any("--json" in getattr(p, "opts", ()) for p in command.params)


def _fail(text: str, error: dict, code: int, as_json: bool) -> None:
    if as_json:
        print(json.dumps({"error": error}), flush=True)
    for line in text.splitlines():  # plain writes: one line per error, never wrapped
        sys.stderr.write(f"error: {line}\n")
    sys.exit(code)
