"""What verify asks of the runner: a replay (a contract re-run into a throwaway store, compared with
its evidence) and the refusals of `gates check` for a contract with no evidence yet.

The only module of gates.verify that imports gates.execution (tests/test_architecture.py holds it
to that): a replay is a `gates run`, by the runner's own plan, in one process or in local processes,
and a contract verify passes must be one that `gates check` accepts and `gates run` runs (one
implementation of those checks, gates.execution._check). Re-deriving a verdict needs neither: it
goes through gates.record.derive, below both.
"""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path

from gates.contract import LoadedContract
from gates.record import Evidence
from gates.verify import _audit as audit


def replay_pool(jobs: int):
    """The local processes a verify's replays run their arm x seed runs in (started once for all of
    them; `with` gives the backend, or None for one process when `jobs` is 1)."""
    if jobs <= 1:
        return contextlib.nullcontext()
    from gates.execution import ProcessBackend

    return ProcessBackend(jobs)


def replay_problems(loaded: LoadedContract, ev: Evidence, processes=None) -> list[str]:
    """Re-run the contract into a throwaway store and compare with the evidence, on the CPU thread count
    its runs recorded (when they all recorded the same one); its runs in `processes` where given (on
    the cores shared out among them when no count is recorded)."""
    from gates.execution import job_threads, run_plan
    from gates.study import cpu_threads

    tol = loaded.contract.replay
    with (
        tempfile.TemporaryDirectory(prefix="gates-replay-") as tmp,
        cpu_threads(job_threads(ev.runs, processes.jobs if processes is not None else 1)),
    ):
        store, runs = f"sqlite:///{Path(tmp) / 'mlflow.db'}", Path(tmp) / "runs"
        jobs = processes.jobs if processes is not None else 1
        fresh = run_plan(loaded, store, runs, fresh=True, jobs=jobs, processes=processes).evidence
    problems = []
    if fresh.verdict != ev.verdict:
        problems.append(f"replay gives verdict {fresh.verdict!r}, evidence says {ev.verdict!r}")
    recorded = {(r.arm, r.seed): r for r in ev.runs}
    for run in fresh.runs:
        old = recorded.get((run.arm, run.seed))
        if old is None:
            problems.append(f"replay ran {run.arm}/seed {run.seed}, which the evidence lacks")
            continue
        if run.status != old.status:
            problems.append(
                f"{run.arm}/seed {run.seed}: replay status {run.status}, recorded {old.status}"
            )
        problems += [
            f"{run.arm}/seed {run.seed}: {name} replays as {new}, recorded {value} "
            f"(tolerance abs {tol.abs_tolerance:g}, rel {tol.rel_tolerance:g})"
            for name, new, value in audit.differences(loaded, old, run.metrics, old.metrics, tol)
        ]
    return problems


def check_refusals(path: Path, runs_root: Path, contracts_root: Path) -> list[str]:
    """What `gates check` refuses in the contract at `path`, a line each (file:line: field: ...)."""
    from gates.execution import contract_errors

    return [
        line
        for e in contract_errors(path, Path(runs_root), Path(contracts_root))
        for line in e.render().splitlines()
    ]
