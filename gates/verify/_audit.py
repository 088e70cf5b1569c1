"""Spot-check audits (`gates verify --audit-seconds S`): re-run a few recorded runs and compare.

Re-deriving a verdict from the recorded per-seed values cannot see those values edited consistently
with everything derived from them. An audit re-runs randomly chosen completed (arm, seed) runs of
the claims that CI does not replay (contracts without `replay: {ci: true}`), each bare: the study's
`run(config, seed, reporter)` with a reporter that records nothing and applies no stop rule (a run
recorded as completed met none), no MLflow. Every recorded metric except the study's machine
metrics must come out within the contract's replay tolerance (`Replay()`'s defaults when it has
none), compared as `gates verify --replay` compares.

Which runs: all candidates in a fixed order, shuffled by an RNG seeded from the current git commit
(so successive commits' CI runs cover different runs; `seed` fixes it), then taken in that order
while their recorded seconds (plus a small overhead) fit in the budget. Runs that cannot run here
(a corpus not fetched) or would first need a long setup their recorded seconds do not include
(`Study.setup_missing`: a teacher not yet trained on this machine) are left out and named.
"""

from __future__ import annotations

import math
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gates.contract import load_contract_cached
from gates.record import EVIDENCE, Evidence, RunRecord, as_evidence, evidence_dir, read_evidence
from gates.verify._claim import AUDIT

OVERHEAD_S = 0.5  # per run beyond its recorded seconds: building the config and the study's setup


@dataclass(frozen=True)
class Candidate:
    contract_id: str
    arm: str
    seed: int
    seconds: float  # as recorded

    @property
    def name(self) -> str:
        return f"{self.contract_id} {self.arm}/seed {self.seed}"

    @property
    def cost(self) -> float:
        return self.seconds + OVERHEAD_S


def within_tolerance(a, b, abs_tol: float, rel_tol: float) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if not (math.isfinite(a) and math.isfinite(b)):
        return a == b or (math.isnan(a) and math.isnan(b))
    return abs(a - b) <= abs_tol + rel_tol * abs(b)


def commit_seed() -> tuple[int, str]:
    """(seed, where it came from): the current git commit, else random."""
    from gates.record import git

    commit = git("rev-parse", "HEAD")
    if commit:
        return int(commit[:16], 16), f"from commit {commit[:12]}"
    return int.from_bytes(os.urandom(8), "big"), "random: not a git checkout"


def choose(candidates: list[Candidate], seconds: float, seed: int) -> list[Candidate]:
    """Shuffle the candidates (in a fixed order first) with `seed`, then take each one whose cost
    still fits in the remaining budget."""
    order = sorted(candidates, key=lambda c: (c.contract_id, c.arm, c.seed))
    random.Random(seed).shuffle(order)
    chosen, left = [], float(seconds)
    for c in order:
        if c.cost <= left:
            chosen.append(c)
            left -= c.cost
    return chosen


def rerun(loaded, evidence: Evidence | dict, arm: str, seed: int) -> dict[str, float | None]:
    """Train one arm x seed bare (no MLflow, no stop rules) with the config that ran: the contract's,
    or for a tuned arm the one the evidence records (checked against the tuning by `gates verify`), on
    the CPU thread count the run recorded. `evidence`: an Evidence, or its JSON data (checked)."""
    from gates.study import Budget, NullReporter, cpu_threads

    evidence = as_evidence(evidence)
    config = _config(loaded, evidence, arm)
    budget = Budget(loaded.contract.budget.steps, loaded.contract.budget.eval_every)
    with cpu_threads(run_threads(evidence, arm, seed)):
        final = loaded.study.run(config, seed, NullReporter(budget))
    out = {}
    for name, value in dict(final).items():
        value = float(value)
        out[name] = value if math.isfinite(value) else None  # as evidence stores it
    return out


def run_threads(evidence: Evidence, arm: str, seed: int) -> int | None:
    """The CPU thread count the evidence records for one arm x seed run (None: not recorded)."""
    from gates.study import recorded_threads

    run = next((r for r in evidence.runs if r.arm == arm and r.seed == seed), None)
    return recorded_threads(run.environment if run is not None else None)


def _config(loaded, evidence: Evidence, arm: str):
    tuning = loaded.contract.tuning
    if tuning is not None and arm in tuning.tuned_arms(loaded.contract.arms):
        return loaded.study.Config.model_validate(evidence.settings.arm_configs[arm])
    return loaded.arm_configs[arm]


def tolerance(loaded, default: tuple[float, float] | None = None):
    """The contract's replay tolerance; for a contract without a `replay` section, `default`
    (abs, rel) when given, else `Replay()`'s."""
    from gates.contract import Replay

    if loaded.contract.replay is not None:
        return loaded.contract.replay
    if default is not None:
        return Replay(abs_tolerance=default[0], rel_tolerance=default[1])
    return Replay()


def compare(
    loaded, recorded: RunRecord, metrics: dict, default: tuple[float, float] | None = None
) -> list[str]:
    """Problems: each recorded metric (machine metrics aside) that the re-run does not reproduce
    within the contract's replay tolerance (see `tolerance`)."""

    tol = tolerance(loaded, default)
    problems = []
    for name, value in recorded.metrics.items():
        if name in loaded.study.machine_metrics:
            continue
        new = metrics.get(name)
        if not within_tolerance(new, value, tol.abs_tolerance, tol.rel_tolerance):
            problems.append(
                f"{recorded.arm}/seed {recorded.seed} does not reproduce: {name} re-runs as "
                f"{new}, recorded {value} (tolerance abs {tol.abs_tolerance:g}, rel {tol.rel_tolerance:g})"
            )
    return problems


def audit(
    checks: list,
    runs_root: Path,
    contracts: dict[str, Path],
    seconds: float,
    *,
    seed: int | None = None,
    log: Callable[[str], None] | None = None,
    default_tolerance: tuple[float, float] | None = None,
) -> list[Candidate]:
    """Choose and re-run runs of the claims in `checks` (gates.verify.ClaimCheck) that hold their
    evidence and are not replayed in CI; a run that does not reproduce loses its claim. Runs are
    chosen by their recorded seconds; on a slower machine, no run starts once `seconds` have passed
    (the ones left are named). `default_tolerance`: (abs, rel) for contracts without a `replay`
    section (default: `Replay()`'s). Returns the runs re-run."""

    say = log or (lambda line: None)
    by_id = {c.contract_id: c for c in checks}
    found, cannot = [], {}
    sources = {}
    for check in checks:
        if check.status != "ok" or check.contract_id not in contracts:
            continue
        loaded = load_contract_cached(Path(contracts[check.contract_id]))
        try:  # an ok claim's evidence reads; one changed since is left out
            ev = read_evidence(evidence_dir(runs_root, check.contract_id) / EVIDENCE)
        except ValueError:
            ev = None
        if (
            loaded is None
            or ev is None
            or (loaded.contract.replay is not None and loaded.contract.replay.ci)
        ):
            continue
        sources[check.contract_id] = (loaded, ev)
        for run in ev.runs:
            if run.status != "completed" or run.seconds is None:
                continue
            why = not_ready(loaded, ev, run.arm)
            if why:
                cannot.setdefault(why, set()).add(check.contract_id)
                continue
            found.append(Candidate(check.contract_id, run.arm, run.seed, float(run.seconds)))
    if seed is None:
        seed, origin = commit_seed()
    else:
        origin = "given"
    chosen = choose(found, seconds, seed)
    say(
        f"audit: seed {seed} ({origin}), budget {seconds:g} s: {len(chosen)} of {len(found)} completed runs of "
        f"{len({c.contract_id for c in found})} claims not replayed in CI, recorded "
        f"{sum(c.seconds for c in chosen):.1f} s"
    )
    for why, ids in sorted(cannot.items()):
        say(f"audit: cannot run here ({why}): runs of {', '.join(sorted(ids))} left out")
    for c in chosen:
        threads = run_threads(sources[c.contract_id][1], c.arm, c.seed)
        on = f", {threads} thread{'s' if threads > 1 else ''}" if threads else ""
        say(f"audit: chose {c.name} (recorded {c.seconds:.1f} s{on})")
    started = time.perf_counter()
    done = []
    for i, c in enumerate(chosen):
        if time.perf_counter() - started >= seconds:
            left = chosen[i:]
            say(
                f"audit: budget spent ({time.perf_counter() - started:.1f} s, this machine runs slower than the "
                f"recording one): {len(left)} chosen runs not started: {', '.join(x.name for x in left)}"
            )
            break
        done.append(c)
        loaded, ev = sources[c.contract_id]
        recorded = next(r for r in ev.runs if r.arm == c.arm and r.seed == c.seed)
        t0 = time.perf_counter()
        try:
            metrics = rerun(loaded, ev, c.arm, c.seed)
            problems = [
                f"audit: {p}" for p in compare(loaded, recorded, metrics, default_tolerance)
            ]
        except (
            Exception
        ) as e:  # a study that crashes on re-run does not reproduce its record either
            problems = [
                f"audit: {c.arm}/seed {c.seed}: the re-run failed: {type(e).__name__}: {str(e)[:300]}"
            ]
        took = time.perf_counter() - t0
        check = by_id[c.contract_id]
        outcome = "reproduces" if not problems else "DOES NOT reproduce"
        check.audited.append(
            f"{c.arm}/seed {c.seed}: {outcome} ({took:.1f} s, recorded {c.seconds:.1f} s)"
        )
        say(f"audit: {c.name}: {outcome} ({took:.1f} s)")
        check.lose(AUDIT, problems)
    for check in checks:
        if check.stale and AUDIT in check.codes:
            from gates.record import describe_stale

            check.add(
                AUDIT,
                f"audit: note that its code changed since the evidence "
                f"({describe_stale(check.stale_files, shown=3)}): a difference may come from "
                f"the code rather than the record",
            )
    say(f"audit: {len(done)} runs re-run in {time.perf_counter() - started:.1f} s")
    return done


def not_ready(loaded, ev: Evidence, arm: str) -> str | None:
    try:
        config = _config(loaded, ev, arm)
        return loaded.study.why_not_ready(config) or loaded.study.setup_missing(config)
    except Exception as e:  # a recorded config that no longer validates
        return f"{type(e).__name__}: {str(e)[:120]}"
