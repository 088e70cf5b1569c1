"""Preflight: measure what can be measured before any step (parameters, FLOPs) and refuse a run
outside the contract's declared bounds (compute cost, capacity match). Used by the runner, and again
by the plan after tuning (the tuned configs must pass the same gates)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from gates.contract import LoadedContract
from gates.errors import UserError


@dataclass
class PreflightReport:
    arms: dict[str, dict] = field(default_factory=dict)  # arm -> params, flops, ratios
    errors: list[UserError] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"arms": self.arms, "notes": self.notes}


def preflight(loaded: LoadedContract, *, here: bool = True) -> PreflightReport:
    """Measure what can be measured before any step and refuse a run outside the declared bounds.
    `here`: also refuse an arm this machine cannot run (its pinned device, a corpus not fetched)."""
    c, study = loaded.contract, loaded.study
    report = PreflightReport()

    def refuse(loc: tuple, msg: str):
        report.errors.append(loaded.error(loc, msg))

    for arm, cfg in loaded.arm_configs.items():
        why = study.why_not_ready(cfg) if here else None
        if why:
            refuse(("arms", arm), f"arm cannot run here: {why}")
        report.arms[arm] = {"params": study.param_count(cfg), "flops": study.flops(cfg)}

    cost = c.preflight.compute_cost
    base = report.arms[cost.baseline_arm]
    for arm, m in report.arms.items():
        m["params_ratio"] = _ratio(m["params"], base["params"])
        m["flops_ratio"] = (
            _ratio(m["flops"], base["flops"])
            if m["flops"] is not None and base["flops"] is not None
            else None
        )
        for kind in ("params_ratio", "flops_ratio"):
            if m[kind] is not None and m[kind] > cost.max_ratio:
                refuse(
                    ("preflight", "compute_cost", "max_ratio"),
                    f"arm {arm!r} measures {kind.replace('_', ' ')} {m[kind]:.3g} to {cost.baseline_arm!r}, "
                    f"above the declared bound {cost.max_ratio:g}; expected every arm within it",
                )

    match = c.preflight.capacity_match
    if match:
        _capacity_match(match, study, loaded.arm_configs, report, refuse)
    if (
        c.convergence is not None
    ):  # the window measurable on a train or validation metric (gates.execution._stop_rules)
        from gates.execution._stop_rules import preflight_convergence

        report.notes += preflight_convergence(loaded, refuse)
    return report


def _capacity_match(match, study, arm_configs, report, refuse) -> None:
    """The arms' trainable parameters (or the named part of them) within the relative tolerance."""
    what = "trainable parameters" if match.part is None else f"{match.part!r} parameters"
    counts = {}
    for arm in match.arms:
        if match.part is None:
            counts[arm] = report.arms[arm]["params"]
            continue
        parts = study.parameter_parts(arm_configs[arm])
        if match.part not in parts:
            known = ", ".join(sorted(parts)) or "none"
            refuse(
                ("preflight", "capacity_match", "part"),
                f"study {study.name!r} has no parameter part {match.part!r} for arm {arm!r}; expected one of: {known}",
            )
            return
        counts[arm] = parts[match.part]
    spread = (max(counts.values()) - min(counts.values())) / max(min(counts.values()), 1)
    text = ", ".join(f"{a}={n}" for a, n in counts.items())
    if spread > match.tolerance:
        refuse(
            ("preflight", "capacity_match", "tolerance"),
            f"{what} differ by {spread:.2%} ({text}); expected within {match.tolerance:.2%}",
        )
    else:
        report.notes.append(
            f"capacity match{'' if match.part is None else f' ({match.part})'}: {text} "
            f"within {spread:.2%} (tolerance {match.tolerance:.2%})"
        )


def _ratio(cost: float, baseline: float) -> float:
    """cost / baseline, where two zero costs (parameter-free arms) are equal, not infinitely apart."""
    if baseline:
        return cost / baseline
    return 1.0 if not cost else math.inf
