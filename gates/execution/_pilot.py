"""Pilots: short runs of a contract's arms before it is registered, kept on the record.

A researcher always pilots (does the arm train at all, how many steps until it flattens, what spread
across seeds) before fixing the contract's bars. What the author saw before registering is part of
what a reader must know, so a pilot is not a private run: `gates pilot` trains arms of a contract on
seeds no contract or tuning can use (PILOT_SEED_BASE and up), records each run in the contract's
MLflow experiment under a parent run of role `pilot` (never reused by `gates run`), and `gates check`
and the verdict list every pilot of the contract's id with when it ran, on which contract hash and
steps, and what it measured: what was known before.
"""

from __future__ import annotations

from pathlib import Path

from gates.contract import PILOT_SEED_BASE, LoadedContract
from gates.errors import UserError
from gates.record import PilotRecord, Tracker, base_tags, current_provenance, pilot_runs
from gates.study import Budget

PILOT_ROLE = "pilot"


def pilot_seeds(count: int) -> list[int]:
    """The seeds of a pilot of `count` runs per arm: PILOT_SEED_BASE, +1, ... (never a contract's)."""
    return [PILOT_SEED_BASE + i for i in range(count)]


def run_pilot(
    loaded: LoadedContract,
    tracking_uri: str,
    *,
    arms: list[str] | None = None,
    steps: int | None = None,
    seeds: int = 1,
    progress=None,
) -> list[PilotRecord]:
    """Train `arms` (default: every arm) of `loaded` for `steps` (default: the contract's budget) on
    `seeds` pilot seeds each, recorded in MLflow as pilots; the pilot runs of the contract, this one's
    included, as `pilot_runs` reads them back."""
    from gates.execution._runner import SilentProgress
    from gates.execution._study_run import _run_one

    c = loaded.contract
    unknown = [a for a in arms or [] if a not in loaded.arm_configs]
    if unknown:
        raise UserError(
            f"no arm named {unknown[0]!r}; expected one of {', '.join(loaded.arm_configs)}",
            file=str(loaded.path),
            field="--arm",
        )
    if steps is not None and not 1 <= steps <= c.budget.steps:
        raise UserError(
            f"--steps {steps} is outside 1..{c.budget.steps} (the contract's budget); expected a "
            f"pilot no longer than the runs it pilots",
            field="--steps",
        )
    steps = steps or c.budget.steps
    budget = Budget(steps, min(c.budget.eval_every, steps))
    prov = current_provenance(type(loaded.study).__module__)
    tracker = Tracker(tracking_uri)
    experiment_id = tracker.experiment_id(c.id)
    tags = {**base_tags(loaded, prov), "gates.pilot": "true", "gates.pilot_steps": str(steps)}
    parent = tracker.client.create_run(
        experiment_id, tags={**tags, "gates.role": PILOT_ROLE}, run_name=f"{c.id} pilot"
    )
    parent_id = parent.info.run_id
    status = "FAILED"
    try:
        for arm in arms or list(loaded.arm_configs):
            for seed in pilot_seeds(seeds):
                _run_one(
                    loaded,
                    tracker,
                    experiment_id,
                    parent_id,
                    tags,
                    arm,
                    loaded.arm_configs[arm],
                    seed,
                    budget,
                    progress or SilentProgress(),
                    others={},
                )
        status = "FINISHED"
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    finally:
        tracker.client.set_terminated(parent_id, status=status)
    return pilot_runs(tracking_uri, c.id, contract_path=Path(loaded.path))
