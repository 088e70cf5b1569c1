"""The order of work of a contract: one plan, whatever runs its jobs.

1. tuning trials (`tuning_jobs`; an arm's trial n `after` its trial n - 1), when the contract tunes
   its arms; then the tuned configs (`gates.execution._tuning.tune_and_apply`: the best trial's
   params, preflight again);
2. arm x seed jobs grouped by look (`run_jobs(loaded, seeds)`), seed-major, the arms that relative
   futility rules judge last in each seed (`after` names the jobs they are compared with);
3. between looks, a decision point (`next_seeds(loaded, records)`): the seeds of the next look, or
   None when the records decide (a sequential contract, gates.inference._sequential) or every seed has run.
   A contract without `sequential` is one look of all its seeds.

Each job is a `Job` (gates/execution/_job.py), its `after` fixed as it is made. One driver follows the
plan (gates/execution/_tasks.py), whichever backend runs the jobs (this process, local processes, Ray
tasks): it submits one look's jobs as their `after` allows and asks `next_seeds` with the
records it has, so the looks are written once.
"""

from __future__ import annotations

from collections.abc import Iterator

from gates.contract import LoadedContract
from gates.entities import RunRecord
from gates.execution._job import KIND_RUN, KIND_TUNE, Job


def job_key(arm: str, seed: int) -> str:
    return f"{arm}/seed{seed}"


def tuning_key(arm: str, index: int) -> str:
    return f"tune:{arm}:{index}"


def judged_arms(loaded: LoadedContract) -> set[str]:
    """Arms that relative futility rules (`behind_best_other_by`) judge against the other arms."""
    return {
        a
        for r in loaded.contract.stop_rules.futility
        if r.behind_best_other_by is not None
        for a in r.arms
    }


def reference_metrics(loaded: LoadedContract) -> set[str]:
    """Metrics whose histories relative futility rules compare across arms of one seed."""
    return {
        r.metric for r in loaded.contract.stop_rules.futility if r.behind_best_other_by is not None
    }


def arm_order(loaded: LoadedContract) -> list[str]:
    """The arms in run order within a seed: the arms that relative futility rules judge come last, so
    that the arms they are compared with have already run on that seed."""
    judged = judged_arms(loaded)
    return [a for a in loaded.arm_configs if a not in judged] + [
        a for a in loaded.arm_configs if a in judged
    ]


def tuning_jobs(loaded: LoadedContract) -> list[Job]:
    """One job per pre-registered tuning trial of every tuned arm, arm by arm; trial n of an arm after
    its trial n - 1, so that each samples with the trials before it finished, as in one process."""
    t = loaded.contract.tuning
    if t is None:
        return []
    return [
        Job(
            KIND_TUNE,
            tuning_key(arm, i),
            arm,
            index=i,
            after=(tuning_key(arm, i - 1),) if i else (),
        )
        for arm in t.tuned_arms(loaded.contract.arms)
        for i in range(t.trials_per_arm)
    ]


def run_jobs(loaded: LoadedContract, seeds: list[int]) -> list[Job]:
    """The arm x seed jobs of these seeds, seed-major, in the order a single process runs them."""
    judged, order = judged_arms(loaded), arm_order(loaded)
    return [
        Job(
            KIND_RUN,
            job_key(arm, seed),
            arm,
            seed=seed,
            after=tuple(job_key(a, seed) for a in order[: order.index(arm)])
            if arm in judged
            else (),
        )
        for seed in seeds
        for arm in order
    ]


def job_order(loaded: LoadedContract) -> list[tuple[str, int]]:
    """Every (arm, seed) job of every seed, seed-major."""
    return [(j.arm, j.seed) for j in run_jobs(loaded, list(loaded.contract.seeds))]


def looks(loaded: LoadedContract) -> list[int]:
    """Cumulative seed counts at which the records are judged (one look of all seeds by default)."""
    seq = loaded.contract.sequential
    return list(seq.looks) if seq is not None else [len(loaded.contract.seeds)]


def failing_streak(loaded: LoadedContract, records: list[RunRecord], arm: str) -> list[RunRecord]:
    """The arm's last runs when they all failed (raised, or returned what the study does not declare) and
    are at least `stop_rules.failures.max_consecutive` in a row: its remaining seeds are not run. Else []."""
    streak = []
    for r in reversed([r for r in records if r.arm == arm and r.status != "skipped"]):
        if r.status != "failed":
            break
        streak.append(r)
    limit = loaded.contract.stop_rules.failures.max_consecutive
    return streak[::-1] if len(streak) >= limit else []


def seeds_by_look(loaded: LoadedContract, records: list[RunRecord]) -> Iterator[list[int]]:
    """Each look's seeds (`next_seeds`), asked once the caller has added the last look's records to
    `records` (its own list, grown between looks); a plan that asks again for seeds with records is a
    bug, raised rather than run twice."""
    while (seeds := next_seeds(loaded, records)) is not None:
        if any(r.seed in seeds for r in records):
            raise RuntimeError(f"the plan asked again for seeds {seeds} that already have records")
        yield seeds


def next_seeds(loaded: LoadedContract, records: list[RunRecord]) -> list[int] | None:
    """The decision point between looks: the seeds to run next given the records so far (one per
    arm x seed run, finished or not), or None when there is nothing more to run."""
    c = loaded.contract
    if c.sequential is not None:
        from gates.inference import claim_inputs, next_look

        return next_look(c, records, loaded.study.metrics, **claim_inputs(loaded))
    have = {(r.arm, r.seed) for r in records}
    lacking = [s for s in c.seeds if any((a, s) not in have for a in loaded.arm_configs)]
    return lacking or None
