"""`gates certify`: check a recorded claim against today's code by re-running its runs.

A claim is stale when the code its evidence was computed with has changed since: a refactor that
moves files changes no number but makes every claim stale. Certifying re-runs the claim's completed
runs (all, or a seeded sample) under today's code, each bare and on the CPU thread count it recorded
(as the audit does), and compares every recorded metric within the contract's replay tolerance. Only
when every re-run reproduces is a `certified` entry appended to the claims history, with today's code
fingerprint, which runs were re-run and what each re-run gave (`reran_runs`: `gates verify` checks
them against the recorded runs, and the fingerprint against the code committed with the entry, in
gates.record's `check_certifications`); staleness is then measured from that code. So "stale" means
"not checked against today's code", never "a file was touched". Nothing is written otherwise.

A run computed on other CPU kernels or torch (`other_machine`) that re-runs off its record cannot tell
rounding from a change. It is re-run once more under the code the claim stands on (`standing_code`:
its certification's or its evidence's commit), in a clean checkout and a process of its own
(gates.verify._isolation); the same values there mean the difference is the machine's, not the
code's: the run is listed with that commit (`reran_elsewhere`) instead of `reran_runs`, whose count
`reran` gives (`gates verify` checks those against the record; these it cannot, short of re-running).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gates.contract import LoadedContract
from gates.errors import UserError, storage_error
from gates.record import (
    EVIDENCE,
    PROJECT_ROOT,
    IndexEntry,
    current_provenance,
    evidence_dir,
    read_evidence,
    record_entry,
    refuse_uncommitted,
    standing_code,
)
from gates.study import study_module
from gates.verify._audit import (
    compare,
    differences,
    fresh_seed,
    judged_metrics,
    not_ready,
    other_machine,
    rerun,
    run_config,
    run_threads,
    tolerance,
)


@dataclass
class Certification:
    contract_id: str
    reran: list[str] = field(default_factory=list)  # "arm/seed N" of each run re-run
    completed: int = 0  # completed runs the evidence records
    problems: list[str] = field(default_factory=list)  # what did not reproduce
    entry: IndexEntry | None = None  # the `certified` entry appended (None: nothing written)

    @property
    def certified(self) -> bool:
        return self.entry is not None


def certify(
    loaded: LoadedContract,
    runs_root: Path,
    reason: str,
    *,
    sample: int | None = None,
    seed: int | None = None,
    default_tolerance: tuple[float, float] | None = None,
    log: Callable[[str], None] | None = None,
) -> Certification:
    """Re-run the completed runs of `loaded`'s recorded claim (a seeded sample of `sample` of them
    when given; `seed` fixes it, else a fresh random one, printed) and append a `certified` entry with today's code
    fingerprint when every one reproduces its recorded metrics within the contract's replay tolerance
    (`default_tolerance` (abs, rel) for a contract without a `replay` section, else `Replay()`'s)."""
    say = log or (lambda line: None)
    if not reason.strip():
        raise UserError("give a reason: it is recorded in the claims index", field="--reason")
    path = evidence_dir(Path(runs_root), loaded.id) / EVIDENCE
    try:
        ev = read_evidence(path)
    except ValueError as e:
        raise UserError(
            f"no readable evidence at {path} ({e}); expected a recorded claim (run the contract "
            f"first)",
            field="contract",
        ) from None
    if ev.contract_sha256 != loaded.sha256:
        raise UserError(
            f"{loaded.path} is not the contract its evidence recorded (sha256 {loaded.sha256[:16]} != "
            f"{ev.contract_sha256[:16]}); expected the recorded contract",
            field="contract",
        )
    refuse_uncommitted(loaded.path, study_module(loaded.contract.study), "certify")
    runs = [r for r in ev.runs if r.status == "completed"]
    result = Certification(loaded.id, completed=len(runs))
    if not runs:
        raise UserError(
            f"{loaded.id} records no completed run: nothing to re-run", field="contract"
        )
    order = sorted(runs, key=lambda r: (r.arm, r.seed))
    wanted = len(order)
    if sample is not None and sample < len(order):
        if seed is None:
            seed, origin = fresh_seed()
        else:
            origin = "given"
        order, wanted = random.Random(seed).sample(order, len(order)), sample  # the first `sample`
        say(f"certify {loaded.id}: {sample} of {len(runs)} completed runs, seed {seed} ({origin})")
    else:
        say(f"certify {loaded.id}: all {len(runs)} completed runs")
    unready = {arm: why for arm in {r.arm for r in order} if (why := not_ready(loaded, ev, arm))}
    if unready:  # e.g. a teacher to train first: minutes to hours that the recorded seconds omit
        result.problems += [
            f"{arm}: cannot run here: {why}" for arm, why in sorted(unready.items())
        ]
        return result
    values, elsewhere, standing = [], [], None
    for run in order:
        if len(result.reran) >= wanted:
            break
        name = f"{run.arm}/seed {run.seed}"
        started = time.perf_counter()
        metrics, problems = _rerun_here(loaded, ev, run, default_tolerance)
        # off its record on other kernels: the record cannot tell rounding from a change, the code
        # the claim stands on can
        why = other_machine([run]) if metrics is not None and problems else None
        if why is not None:
            if standing is None:
                standing = standing_code(Path(runs_root), loaded.id, ev)
            problems = _against_standing_code(loaded, ev, run, metrics, standing, default_tolerance)
            if not problems:
                elsewhere.append(_values(loaded, run, metrics) | {"commit": standing[0]})
                result.reran.append(name)
                say(
                    f"certify {loaded.id}: {name}: not confirmable by its record here ({why}); "
                    f"re-runs as the code of commit {standing[0][:12]} does here "
                    f"({time.perf_counter() - started:.1f} s)"
                )
                continue
            problems.insert(0, f"{name}: not confirmable by its record here: {why}")
        result.reran.append(name)
        result.problems += problems
        if not problems:
            values.append(_values(loaded, run, metrics))
        outcome = "reproduces" if not problems else "DOES NOT reproduce"
        say(f"certify {loaded.id}: {name}: {outcome} ({time.perf_counter() - started:.1f} s)")
    if result.problems:
        return result
    prov = current_provenance(study_module(loaded.contract.study))
    used = tolerance(loaded, default_tolerance)
    result.entry = record_entry(
        Path(runs_root),
        path,
        "certified",
        reason.strip(),
        extra={
            "code_sha256": prov.code_sha256,
            "code_files": prov.code_files,
            "reran": f"{len(values)} of {len(runs)} completed runs",
            "tolerance": {"abs": used.abs_tolerance, "rel": used.rel_tolerance},
            "reran_runs": values,  # empty where every run was judged by the code it stands on
            **({"reran_elsewhere": elsewhere} if elsewhere else {}),
        },
    )
    return result


def _values(loaded: LoadedContract, run, metrics: dict) -> dict:
    """What a re-run gave, as a certified entry lists it: the recorded metrics, machine metrics aside."""
    compared = judged_metrics(loaded, run)
    return {"arm": run.arm, "seed": run.seed, "metrics": {m: metrics.get(m) for m in compared}}


def _rerun_here(loaded, ev, run, default_tolerance) -> tuple[dict | None, list[str]]:
    """(metrics, problems) of one re-run under today's code against its record; metrics None where
    the re-run failed (a study that crashes on a re-run does not reproduce its record)."""
    try:
        metrics = rerun(loaded, ev, run.arm, run.seed)
    except Exception as e:
        if storage_error(e) is not None:  # but a full disk says nothing of the record: stop
            raise
        name = f"{run.arm}/seed {run.seed}"
        return None, [f"{name}: the re-run failed: {type(e).__name__}: {str(e)[:300]}"]
    return metrics, compare(loaded, run, metrics, default_tolerance)


def _against_standing_code(loaded, ev, run, metrics, standing, default_tolerance) -> list[str]:
    """Problems of today's re-run (`metrics`) of a run recorded on another machine, judged against a
    re-run here under the code the claim stands on (`standing`: (commit, code) from `standing_code`,
    or why there is none), in a clean checkout of that commit: every recorded metric (machine metrics
    aside) within the contract's replay tolerance. Same values: the difference from the record is the
    machine's, not today's code's."""
    from gates.verify._isolation import rerun_at

    name = f"{run.arm}/seed {run.seed}"
    if isinstance(standing, str):
        return [f"{name}: no code of the claim to re-run here and compare with: {standing}"]
    commit = standing[0]
    config = run_config(loaded, ev, run.arm).model_dump(mode="json", exclude_unset=True)
    budget = loaded.contract.budget
    try:
        then = rerun_at(
            PROJECT_ROOT,
            commit,
            loaded.contract.study,
            config,
            run.seed,
            budget.steps,
            budget.eval_every,
            run_threads(ev, run.arm, run.seed),
        )
    except (RuntimeError, OSError, ValueError) as e:
        return [f"{name}: the re-run under commit {commit[:12]} failed: {str(e)[-300:]}"]
    tol = tolerance(loaded, default_tolerance)
    return [
        f"{name}: today's code re-runs {m} as {now}, the code of commit {commit[:12]} as {before} "
        f"here (tolerance abs {tol.abs_tolerance:g}, rel {tol.rel_tolerance:g})"
        for m, now, before in differences(loaded, run, metrics, then, tol)
    ]
