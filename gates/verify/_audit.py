"""Spot-check audits (`gates verify --audit-seconds S`): re-run a few recorded runs and compare.

Re-deriving a verdict from the recorded per-seed values cannot see those values edited consistently
with everything derived from them. An audit re-runs randomly chosen completed (arm, seed) runs of
the claims that this verify does not replay (with `--replay`, contracts marked `replay: {ci: true}`
are re-run whole instead; without it, their runs are candidates like any other), each bare: the
study's `run(config, seed, reporter)` with a reporter that records nothing and applies no stop rule
(a run recorded as completed met none), no MLflow. Every recorded metric except the study's machine
metrics must come out within the contract's replay tolerance (`Replay()`'s defaults when it has
none), compared as `gates verify --replay` compares.

Which runs: the audit exists to catch a forged record, so its choice must not depend on anything a
forger can write. Choosing by the recorded seconds did: a forged run recorded as taking a million
seconds was never chosen. So every completed run is a candidate, in an order shuffled by an RNG
with a fresh seed (`fresh_seed`: not the git commit, which a forger also makes; each CI run covers
other runs; `seed` fixes it), never filtered or weighted by what it records.

Within the budget: the audit never starts a run it cannot finish (issue #39: a translator run
started with 2.3 s of 100 left ran on for minutes, because a run can be stopped only at a report). A
run's cost is judged before it starts from the seconds recorded (`RunRecord.seconds`, its wall
time), times SAFETY_FACTOR. A run judged to need more than the whole budget is never started and is
named UNAUDITED with why, one line per claim (that budget can never audit it); the others are walked
in the order, and one judged to need more than the time left is passed over and listed with why
(like a run not reached, a later commit's audit may re-run it), the walk going on to runs that still
fit. So that the recorded seconds still cannot steer the audit away from a forged run, a run's
estimate is the smaller of its own seconds and the lower median of its arm's (same config, same
steps): one run recorded as slow is judged as its siblings are; inflating most of an arm's seconds
makes its runs named, never silently skipped. A run with no recorded seconds (none in this
repository) is started. Once started, its reporter still stops it at a report once the time is spent
or once its projection (elapsed / step x the contract's steps) exceeds the time it had left (a
machine slower than the factor allows), also named UNAUDITED. UNAUDITED is no failure, unless
`gates verify --audit-strict`; the walk goes on while at least MIN_LEFT_S are left, and the runs
never reached are counted (other audits, with other seeds, reach them). Runs that cannot run here (a corpus not
fetched) are left out and named: that depends on the machine, not on the evidence. A run that would
first need a setup this machine lacks (`Study.setup_missing`: a teacher not yet trained here) is
judged with it: `Study.setup_seconds` x SAFETY_FACTOR is added to its need, and the audit builds it
(`Study.setup`) before the first such run whose total fits the time left, since no deadline can stop
a setup; one whose time the study cannot say is left out and named.

Machine metrics (`Study.machine_metrics`: wall-clock speed, memory) measure the machine that ran
them and are never compared. A claim whose conditions read one cannot be re-checked by a re-run at
all: `machine_bound` names those metrics, and `gates verify` lists such a claim (MACHINE_BOUND) with
the reason.
"""

from __future__ import annotations

import math
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from gates.contract import load_contract_cached
from gates.entities import RunRecord
from gates.record import (
    EVIDENCE,
    Evidence,
    as_evidence,
    evidence_dir,
    read_evidence,
    within_tolerance,  # one rule for a re-run value against the record: audit, replay, certify
)
from gates.study import NullReporter
from gates.verify._claim import AUDIT, UNAUDITED, UNCONFIRMED

# no run starts with less time left: building its config and the study's setup before its first
# report take about this long, and a run stopped at its first report audits nothing
MIN_LEFT_S = 0.5
# a run starts only when its recorded seconds x this fit the time left. The re-run is bare (no MLflow
# logging, no stop rules) on the thread count the run recorded, so on a machine like the recording
# one it takes at most its recorded time; 2 lets a machine half as fast (a shared 2-core CI runner
# against a workstation) finish what it starts. A slower machine is caught by the projection at the
# run's first report, as before
SAFETY_FACTOR = 2.0
SHOWN_RUNS = 3  # runs named per claim in a line of runs not started


@dataclass(frozen=True)
class Candidate:
    contract_id: str
    arm: str
    seed: int
    seconds: float | None  # as recorded: printed, never used to choose (the evidence controls it)
    # seconds it is judged to need before it starts (`estimate`); None: unknown, started
    need: float | None = None
    # seconds judged for a setup this machine lacks (`Study.setup_seconds` x SAFETY_FACTOR), built
    # before the run when the time left covers both; None: nothing to build
    setup: float | None = None

    @property
    def total(self) -> float:
        """What it is judged to need in all before it starts (an unknown run counts 0)."""
        return (self.need or 0.0) + (self.setup or 0.0)

    @property
    def name(self) -> str:
        return f"{self.contract_id} {self.arm}/seed {self.seed}"


class _OutOfTime(Exception):
    """Raised from a deadline reporter's `report` to stop a re-run that the audit's time cannot
    finish; it goes up through the study's loop as a stop rule's `Halt` does, and the audit catches
    it."""

    def __init__(self, step: int, steps: int, need: float, left: float):
        super().__init__(f"stopped at step {step} of {steps}")
        self.step, self.steps = step, steps
        self.need = need  # the whole run's projected seconds
        self.left = left  # the seconds left when it started


class _Deadline(NullReporter):
    """A bare reporter that checks the clock at every report: it stops the run once `deadline`
    (time.perf_counter) has passed, or once the run's projection (elapsed / step x the budget's
    steps) exceeds the time it had left when it started. A study reports at its evaluation steps
    only, so a stopped run has cost about one evaluation interval beyond what the check allows."""

    def __init__(self, budget, deadline: float):
        super().__init__(budget)
        self.deadline = deadline
        self.started = time.perf_counter()
        self.left = deadline - self.started

    def report(self, step: int, metrics: dict[str, float]) -> None:
        # nothing recorded: the audit compares only the final metrics
        now = time.perf_counter()
        need = (now - self.started) / max(step, 1) * self.budget.steps
        if now >= self.deadline or need > self.left:
            raise _OutOfTime(step, self.budget.steps, need, self.left)


def fresh_seed() -> tuple[int, str]:
    """(seed, where it came from): drawn from the operating system's entropy at each call. Not the git
    commit: whoever forges evidence also makes commits, and could re-commit until the edited run falls
    far down the order; a fresh draw is known to no one before the audit starts (printed, so that
    `--audit-seed` / `--seed` repeats it)."""
    return int.from_bytes(os.urandom(8), "big"), "random"


def estimate(seconds: float | None, arm_seconds: list[float]) -> float | None:
    """The seconds a run is judged to need before it starts: SAFETY_FACTOR x the smaller of its own
    recorded seconds and the lower median of its arm's completed runs' (`arm_seconds`), so that one
    run recorded as slow does not keep itself from the audit; None when nothing was recorded."""
    known = sorted(arm_seconds)
    typical = known[(len(known) - 1) // 2] if known else None
    base = min((x for x in (seconds, typical) if x is not None), default=None)
    return None if base is None else SAFETY_FACTOR * base


def machine_bound(loaded) -> list[str]:
    """The machine metrics (`Study.machine_metrics`) that a contract's decision or controls read:
    what no re-run on another machine can reproduce, so no replay or audit re-checks them."""
    from gates.contract import metric_locs

    conditions = [c for _, _, c in loaded.contract.conditions()] + list(loaded.contract.controls)
    read = {metric for c in conditions for _, metric in metric_locs(c)}
    return sorted(read & set(loaded.study.machine_metrics))


def choose(candidates: list[Candidate], seed: int) -> list[Candidate]:
    """Every candidate, in the order the audit walks them: a fixed order (by claim, arm, seed)
    shuffled with `seed`. Nothing a run records (its seconds least of all) filters or weights it."""
    order = sorted(candidates, key=lambda c: (c.contract_id, c.arm, c.seed))
    random.Random(seed).shuffle(order)
    return order


def rerun(
    loaded, evidence: Evidence | dict, arm: str, seed: int, *, deadline: float | None = None
) -> dict[str, float | None]:
    """Train one arm x seed bare (no MLflow, no stop rules) with the config that ran: the contract's,
    or for a tuned arm the one the evidence records (checked against the tuning by `gates verify`), on
    the CPU thread count the run recorded. `evidence`: an Evidence, or its JSON data (checked).
    `deadline` (time.perf_counter): the run is stopped at a report (`_OutOfTime`) once it has passed
    or the run's projection overshoots it."""
    from gates.study import Budget, cpu_threads

    evidence = as_evidence(evidence)
    config = run_config(loaded, evidence, arm)
    budget = Budget(loaded.contract.budget.steps, loaded.contract.budget.eval_every)
    reporter = NullReporter(budget) if deadline is None else _Deadline(budget, deadline)
    with cpu_threads(run_threads(evidence, arm, seed)):
        final = loaded.study.run(config, seed, reporter)
    out = {}
    for name, value in dict(final).items():
        value = float(value)
        out[name] = value if math.isfinite(value) else None  # as evidence stores it
    return out


def other_machine(runs) -> str | None:
    """Why re-runs here can differ from these recorded runs with nothing changed: they were computed
    on other CPU kernels (`environment.cpu`, ATen's capability), before runs named them, or with
    another torch. None when every run names this machine's kernels and torch."""
    import torch

    here = torch.backends.cpu.get_cpu_capability()
    envs = [r.environment or {} for r in runs]
    kernels, torches = {e.get("cpu") for e in envs}, {e.get("torch") for e in envs} - {None}
    why = []
    if kernels != {here}:
        named = sorted(c for c in kernels if c)
        was = (
            f"with {', '.join(named)} CPU kernels"
            if named
            else "before runs named their CPU kernels"
        )
        if None in kernels and named:
            was += " (some runs before they were named)"
        why.append(f"computed {was} and re-run here with {here}")
    if torches - {torch.__version__}:
        why.append(
            f"computed with torch {', '.join(sorted(torches))}, re-run with {torch.__version__}"
        )
    if not why:
        return None
    return (
        f"the runs were {'; '.join(why)}: kernels that round differently can make a chaotic run "
        f"diverge (docs/gpu.md#determinism)"
    )


def file_differences(check, code: str, problems: list[str], runs, *, crashed: bool = False) -> None:
    """Put what a re-run (replay: REPLAY, audit: AUDIT) did not reproduce on the claim: it loses the
    claim, unless the runs were computed on another machine's kernels or torch (`other_machine`) and
    the re-run ran to its end. Then nothing here can tell rounding from a changed record: the
    differences are UNCONFIRMED, reported with why (a failure with `gates verify --audit-strict`),
    and the code is vouched for by staleness instead (a standing claim is stale, failing
    `--strict-code`, until `gates certify` re-runs it under today's code)."""
    why = None if crashed or not problems else other_machine(runs)
    if why is None:
        check.lose(code, problems)
        return
    prefix = "audit: " if code == AUDIT else ""
    for problem in problems:
        check.add(UNCONFIRMED, problem)
    note = f"{prefix}not confirmable on this machine: {why}"
    if note not in check.problems:
        check.add(UNCONFIRMED, note)


def run_threads(evidence: Evidence, arm: str, seed: int) -> int | None:
    """The CPU thread count the evidence records for one arm x seed run (None: not recorded)."""
    from gates.study import recorded_threads

    run = next((r for r in evidence.runs if r.arm == arm and r.seed == seed), None)
    return recorded_threads(run.environment if run is not None else None)


def run_config(loaded, evidence: Evidence, arm: str):
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


def judged_metrics(loaded, recorded: RunRecord) -> list[str]:
    """The metrics a re-run of `recorded` is judged by: those it recorded, machine metrics (the speed
    and memory of whichever machine ran it) aside. Every command that re-runs a run uses this."""
    return [m for m in recorded.metrics if m not in loaded.study.machine_metrics]


def differences(
    loaded, recorded: RunRecord, metrics: dict, reference: dict, tol
) -> list[tuple[str, float | None, float | None]]:
    """(name, value in `metrics`, value in `reference`) of each judged metric of `recorded` on which
    the two differ beyond the replay tolerance `tol`."""
    return [
        (name, metrics.get(name), reference.get(name))
        for name in judged_metrics(loaded, recorded)
        if not within_tolerance(
            metrics.get(name), reference.get(name), tol.abs_tolerance, tol.rel_tolerance
        )
    ]


def compare(
    loaded, recorded: RunRecord, metrics: dict, default: tuple[float, float] | None = None
) -> list[str]:
    """Problems: each judged metric that the re-run does not reproduce within the contract's replay
    tolerance (see `tolerance`)."""
    tol = tolerance(loaded, default)
    return [
        f"{recorded.arm}/seed {recorded.seed} does not reproduce: {name} re-runs as {new}, "
        f"recorded {value} (tolerance abs {tol.abs_tolerance:g}, rel {tol.rel_tolerance:g})"
        for name, new, value in differences(loaded, recorded, metrics, recorded.metrics, tol)
    ]


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
    """Re-run runs of the claims in `checks` (gates.verify.ClaimCheck) that hold their evidence and
    were not replayed by this verify (`check.replayed`), in the seeded order of `choose`, within
    `seconds`: a run that does not reproduce loses its claim; a run judged (`estimate`) to need more
    than `seconds` is never started and named under UNAUDITED (no failure), one judged to need more
    than the time left is passed over and listed, one whose projection overshoots is stopped at a
    report and named under UNAUDITED; no run starts with less than MIN_LEFT_S left, and the runs not
    reached are counted. `default_tolerance`: (abs, rel) for contracts without a `replay`
    section (default: `Replay()`'s). Returns the runs compared with their record."""

    say = log or (lambda line: None)
    by_id = {c.contract_id: c for c in checks}
    found, cannot = [], {}
    sources = {}
    for check in checks:
        # a replayed claim was just re-run whole; a contract marked for CI replay is audited like
        # any other when this verify does not replay it (a mark alone checks nothing)
        if check.status != "ok" or check.replayed or check.contract_id not in contracts:
            continue
        loaded = load_contract_cached(Path(contracts[check.contract_id]))
        try:  # an ok claim's evidence reads; one changed since is left out
            ev = read_evidence(evidence_dir(runs_root, check.contract_id) / EVIDENCE)
        except ValueError:
            ev = None
        if loaded is None or ev is None:
            continue
        sources[check.contract_id] = (loaded, ev)
        arm_seconds: dict[str, list[float]] = {}
        for run in ev.runs:
            if run.status == "completed" and run.seconds is not None:
                arm_seconds.setdefault(run.arm, []).append(float(run.seconds))
        for run in ev.runs:
            if run.status != "completed":
                continue
            why, setup = _readiness(loaded, ev, run.arm)
            if why:
                cannot.setdefault(why, set()).add(check.contract_id)
                continue
            recorded = float(run.seconds) if run.seconds is not None else None
            need = estimate(recorded, arm_seconds.get(run.arm, []))
            found.append(Candidate(check.contract_id, run.arm, run.seed, recorded, need, setup))
    if seed is None:
        seed, origin = fresh_seed()
    else:
        origin = "given"
    order = choose(found, seed)
    total = sum(c.seconds or 0.0 for c in found)
    say(
        f"audit: seed {seed} ({origin}), budget {seconds:g} s: {len(found)} completed runs of "
        f"{len({c.contract_id for c in found})} claims in a seeded order; a run starts when its "
        f"recorded seconds x {SAFETY_FACTOR:g} fit the time left (recorded {total:.1f} s in all)"
    )
    replayed = sorted(c.contract_id for c in checks if c.replayed)
    if replayed:
        say(f"audit: left to the replay: {', '.join(replayed)}")
    for why, ids in sorted(cannot.items()):
        say(f"audit: cannot run here ({why}): runs of {', '.join(sorted(ids))} left out")
    # runs that no budget of `seconds` lets finish are named once, up front; the others are walked
    # (filtering after the shuffle keeps their order: what a run records does not move another)
    too_long = [c for c in order if c.total > seconds]
    order = [c for c in order if c.total <= seconds]
    for contract_id, runs in _by_claim(too_long).items():
        # UNAUDITED: the claim's runs that this budget can never re-run (stopped at a report, they
        # would only overrun it)
        why = _listed(
            runs,
            f"not started: judged to need more than the audit's budget of {seconds:g} s "
            f"(recorded seconds x {SAFETY_FACTOR:g})",
            _judged,
        )
        by_id[contract_id].add(UNAUDITED, f"audit: {why}")
        say(f"audit: {contract_id}: UNAUDITED ({why})")
    started = time.perf_counter()
    deadline = started + seconds
    done, stopped, reached = [], 0, 0
    passed_over: list[tuple[Candidate, float]] = []  # reached, but no longer fitting the time left
    for c in order:
        left = deadline - time.perf_counter()
        if left < MIN_LEFT_S:
            break
        reached += 1
        loaded, ev = sources[c.contract_id]
        if c.setup is not None and _readiness(loaded, ev, c.arm) == (None, None):
            c = replace(c, setup=None)  # an earlier run of this walk built it
        if c.total > left:
            # never started: a run is stopped only at a report, and this one would overrun; a later
            # run in the order may still fit
            passed_over.append((c, left))
            continue
        if c.setup is not None:  # no deadline can stop a setup: it starts only when judged to fit
            say(f"audit: building what {c.name} needs first (judged about {c.setup:.0f} s)")
            t0 = time.perf_counter()
            try:
                loaded.study.setup(run_config(loaded, ev, c.arm))
            except Exception as e:  # not a failure of the record: this machine could not build it
                why = f"its setup failed: {type(e).__name__}: {str(e)[:200]}"
                by_id[c.contract_id].add(
                    UNAUDITED, f"audit: {c.arm}/seed {c.seed} unaudited: {why}"
                )
                say(f"audit: {c.name}: UNAUDITED ({why})")
                continue
            say(f"audit: built in {time.perf_counter() - t0:.1f} s")
            left = deadline - time.perf_counter()
        threads = run_threads(ev, c.arm, c.seed)
        on = f", {threads} thread{'s' if threads > 1 else ''}" if threads else ""
        was = f"recorded {c.seconds:.1f} s" if c.seconds is not None else "no recorded seconds"
        say(f"audit: re-running {c.name} ({was}{on}; {left:.1f} s left)")
        recorded_run = next(r for r in ev.runs if r.arm == c.arm and r.seed == c.seed)
        check = by_id[c.contract_id]
        t0, crashed = time.perf_counter(), False
        try:
            metrics = rerun(loaded, ev, c.arm, c.seed, deadline=deadline)
            problems = [
                f"audit: {p}" for p in compare(loaded, recorded_run, metrics, default_tolerance)
            ]
        except _OutOfTime as stop:
            # not a failure of the record: this budget cannot tell; named so that no started run
            # passes silently
            stopped += 1
            why = (
                f"stopped at step {stop.step} of {stop.steps} after "
                f"{time.perf_counter() - t0:.1f} s: would need about {stop.need:.1f} s, "
                f"{stop.left:.1f} s left"
            )
            check.add(UNAUDITED, f"audit: {c.arm}/seed {c.seed} unaudited: {why}")
            say(f"audit: {c.name}: UNAUDITED ({why})")
            continue
        except Exception as e:  # a study that crashes on re-run does not reproduce its record
            crashed, problems = (
                True,
                [
                    f"audit: {c.arm}/seed {c.seed}: the re-run failed: {type(e).__name__}: {str(e)[:300]}"
                ],
            )
        took = time.perf_counter() - t0
        done.append(c)
        outcome = "reproduces" if not problems else "DOES NOT reproduce"
        check.audited.append(f"{c.arm}/seed {c.seed}: {outcome} ({took:.1f} s, {was})")
        say(f"audit: {c.name}: {outcome} ({took:.1f} s)")
        file_differences(check, AUDIT, problems, [recorded_run], crashed=crashed)
    for check in checks:
        source = sources.get(check.contract_id) if AUDIT in check.codes else None
        note = other_machine(source[1].runs) if source is not None else None
        if note:
            check.add(AUDIT, f"audit: note that {note}")
        if check.stale and AUDIT in check.codes:
            from gates.record import describe_stale

            check.add(
                AUDIT,
                f"audit: note that its code changed since the evidence "
                f"({describe_stale(check.stale_files, shown=3)}): a difference may come from "
                f"the code rather than the record",
            )
    left_at = {id(c): left for c, left in passed_over}
    for contract_id, runs in _by_claim([c for c, _ in passed_over]).items():
        # listed, not a problem of the claim: like a run not reached, a later commit's audit (its
        # order, its full budget) may re-run it
        why = _listed(
            runs,
            f"not started: judged to need more than the time left (recorded seconds x "
            f"{SAFETY_FACTOR:g})",
            lambda c: f"{_judged(c)}, {left_at[id(c)]:.1f} s left",
        )
        say(f"audit: {contract_id}: {why}")
    unreached = len(order) - reached
    say(
        f"audit: {reached - len(passed_over)} runs started in {time.perf_counter() - started:.1f} s: "
        f"{len(done)} compared, {stopped} unaudited"
        + (f"; {len(passed_over)} not started (no longer fitting)" if passed_over else "")
        + (f"; {len(too_long)} too long for the budget" if too_long else "")
        + (f"; {unreached} runs not reached; other audits cover others" if unreached else "")
    )
    return done


def _by_claim(runs: list[Candidate]) -> dict[str, list[Candidate]]:
    out: dict[str, list[Candidate]] = {}
    for c in runs:
        out.setdefault(c.contract_id, []).append(c)
    return dict(sorted(out.items()))


def _listed(runs: list[Candidate], what: str, detail: Callable[[Candidate], str]) -> str:
    """One line for a claim's runs: how many, what, the first SHOWN_RUNS named with their detail."""
    named = ", ".join(f"{c.arm}/seed {c.seed} ({detail(c)})" for c in runs[:SHOWN_RUNS])
    more = f" and {len(runs) - SHOWN_RUNS} more" if len(runs) > SHOWN_RUNS else ""
    return f"{len(runs)} run{'s' * (len(runs) != 1)} {what}: {named}{more}"


def _judged(c: Candidate) -> str:
    setup = f" with {c.setup:.0f} s to build its setup first" if c.setup is not None else ""
    return f"about {c.total:.1f} s{setup}"


def _readiness(loaded, ev: Evidence, arm: str) -> tuple[str | None, float | None]:
    """(why the run cannot run here, else None; the seconds judged for a setup to build first, else
    None). A missing setup whose `Study.setup_seconds` is unknown cannot run here."""
    try:
        config = run_config(loaded, ev, arm)
        why = loaded.study.why_not_ready(config)
        missing = None if why else loaded.study.setup_missing(config)
        if missing is None:
            return why, None
        seconds = loaded.study.setup_seconds(config)
        if seconds is None:
            return missing, None
        return None, SAFETY_FACTOR * seconds
    except Exception as e:  # a recorded config that no longer validates
        return f"{type(e).__name__}: {str(e)[:120]}", None


def not_ready(loaded, ev: Evidence, arm: str) -> str | None:
    try:
        config = run_config(loaded, ev, arm)
        return loaded.study.why_not_ready(config) or loaded.study.setup_missing(config)
    except Exception as e:  # a recorded config that no longer validates
        return f"{type(e).__name__}: {str(e)[:120]}"
