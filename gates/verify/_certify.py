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
    IndexEntry,
    current_provenance,
    evidence_dir,
    read_evidence,
    record_entry,
    refuse_uncommitted,
)
from gates.study import study_module
from gates.verify._audit import compare, fresh_seed, not_ready, rerun, tolerance


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
    chosen = sorted(runs, key=lambda r: (r.arm, r.seed))
    if sample is not None and sample < len(chosen):
        if seed is None:
            seed, origin = fresh_seed()
        else:
            origin = "given"
        chosen = sorted(random.Random(seed).sample(chosen, sample), key=lambda r: (r.arm, r.seed))
        say(f"certify {loaded.id}: {sample} of {len(runs)} completed runs, seed {seed} ({origin})")
    else:
        say(f"certify {loaded.id}: all {len(runs)} completed runs")
    unready = {arm: why for arm in {r.arm for r in chosen} if (why := not_ready(loaded, ev, arm))}
    if unready:  # e.g. a teacher to train first: minutes to hours that the recorded seconds omit
        result.problems += [
            f"{arm}: cannot run here: {why}" for arm, why in sorted(unready.items())
        ]
        return result
    values = []  # what the re-runs gave, per run: the entry carries it (what only a re-run produces)
    for run in chosen:
        name = f"{run.arm}/seed {run.seed}"
        started = time.perf_counter()
        try:
            metrics = rerun(loaded, ev, run.arm, run.seed)
            problems = compare(loaded, run, metrics, default_tolerance)
            compared = [m for m in run.metrics if m not in loaded.study.machine_metrics]
            values.append(
                {"arm": run.arm, "seed": run.seed, "metrics": {m: metrics.get(m) for m in compared}}
            )
        except Exception as e:  # a study that crashes on a re-run does not reproduce its record
            if storage_error(e) is not None:  # but a full disk says nothing of the record: stop
                raise
            problems = [f"{name}: the re-run failed: {type(e).__name__}: {str(e)[:300]}"]
        result.reran.append(name)
        result.problems += problems
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
            "reran": f"{len(chosen)} of {len(runs)} completed runs",
            "tolerance": {"abs": used.abs_tolerance, "rel": used.rel_tolerance},
            "reran_runs": values,
        },
    )
    return result
