"""A contract checked against itself and its study once its sections validate: arms and metrics
named anywhere exist, the claim is refutable and consistent (`_check_references`), and the tuning
section fits the arm configs it searches (`_check_tuning`).
"""

from __future__ import annotations

from pydantic import ValidationError

from gates.contract._bounds import MIN_VERDICT_SEEDS
from gates.contract._conditions import Compare, Threshold, condition_terms, metric_locs
from gates.contract._errors import _explain
from gates.contract._schema import Contract
from gates.contract._tuning import is_validation_metric
from gates.errors import UserError, did_you_mean
from gates.study import Study


def _check_references(contract: Contract, study: Study, err) -> list[UserError]:
    """Arms and metrics named anywhere must exist; the contract must be refutable and consistent."""
    errors = []
    arms = list(contract.arms)
    metrics = list(study.metrics)

    def arm_ref(loc, name):
        if name not in contract.arms:
            errors.append(
                err(
                    loc, f"no arm named {name!r}{did_you_mean(name, arms)}; arms: {', '.join(arms)}"
                )
            )

    def metric_ref(loc, name):
        if name not in study.metrics:
            errors.append(
                err(
                    loc,
                    f"study {study.name!r} reports no metric {name!r}"
                    f"{did_you_mean(name, metrics)}; metrics: {', '.join(metrics)}",
                )
            )

    pf = contract.preflight
    arm_ref(("preflight", "compute_cost", "baseline_arm"), pf.compute_cost.baseline_arm)
    for f in ("arm", "versus"):
        arm_ref(("preflight", "predicted_ablation", f), getattr(pf.predicted_ablation, f))
    metric_ref(("preflight", "predicted_ablation", "metric"), pf.predicted_ablation.metric)
    arm_ref(("preflight", "falsifiable_point", "arm"), pf.falsifiable_point.arm)
    metric_ref(("preflight", "falsifiable_point", "metric"), pf.falsifiable_point.metric)
    if pf.falsifiable_point.by_step > contract.budget.steps:
        errors.append(
            err(
                ("preflight", "falsifiable_point", "by_step"),
                f"by_step {pf.falsifiable_point.by_step} is past the budget of "
                f"{contract.budget.steps} steps; expected <= budget.steps",
            )
        )
    if pf.capacity_match:
        for i, a in enumerate(pf.capacity_match.arms):
            arm_ref(("preflight", "capacity_match", "arms", i), a)
    for i, rule in enumerate(contract.stop_rules.futility):
        metric_ref(("stop_rules", "futility", i, "metric"), rule.metric)
        for j, a in enumerate(rule.arms or []):
            arm_ref(("stop_rules", "futility", i, "arms", j), a)
        if rule.at_step > contract.budget.steps:
            errors.append(
                err(
                    ("stop_rules", "futility", i, "at_step"),
                    f"at_step {rule.at_step} is past the budget of {contract.budget.steps} steps",
                )
            )
        elif rule.at_step - rule.window < contract.budget.eval_every:
            errors.append(
                err(
                    ("stop_rules", "futility", i, "window"),
                    f"window {rule.window} reaches back before the first evaluation (step "
                    f"{contract.budget.eval_every}) from at_step {rule.at_step}; expected "
                    f"at_step - window >= budget.eval_every, so the trend can be measured",
                )
            )
    for j, m in enumerate(contract.stop_rules.divergence.metrics or []):
        metric_ref(("stop_rules", "divergence", "metrics", j), m)

    located = [(("decision", list_name, i), c) for list_name, i, c in contract.conditions()] + [
        (("controls", i), c) for i, c in enumerate(contract.controls)
    ]
    for base, c in located:
        if isinstance(c, Threshold):
            arm_ref(base + ("arm",), c.arm)
            metric_ref(base + ("metric",), c.metric)
        elif isinstance(c, Compare):
            arm_ref(base + ("arm",), c.arm)
            arm_ref(base + ("other",), c.other)
            metric_ref(base + ("metric",), c.metric)
            if c.other_metric is not None:
                metric_ref(base + ("other_metric",), c.other_metric)
            if c.arm == c.other and (c.other_metric or c.metric) == c.metric:
                errors.append(
                    err(base, "compares a term with itself; expected two different arms or metrics")
                )
        else:
            for j, a in enumerate(c.arms or []):
                arm_ref(base + ("arms", j), a)
            if c.arm is not None:
                arm_ref(base + ("arm",), c.arm)
            for j, m in enumerate(c.metrics or []):
                metric_ref(base + ("metrics", j), m)
            if c.metric is not None:
                metric_ref(base + ("metric",), c.metric)
    if contract.convergence is not None:
        conv = contract.convergence
        metric_ref(("convergence", "metric"), conv.metric)
        if conv.window > contract.budget.steps - contract.budget.eval_every:
            errors.append(
                err(
                    ("convergence", "window"),
                    f"window {conv.window} cannot be measured: the first evaluation is at step "
                    f"{contract.budget.eval_every} and the run ends at {contract.budget.steps}; expected "
                    f"window <= steps - eval_every ({contract.budget.steps - contract.budget.eval_every})",
                )
            )
        elif conv.window < contract.budget.eval_every:
            errors.append(
                err(
                    ("convergence", "window"),
                    f"window {conv.window} is shorter than eval_every {contract.budget.eval_every}: it "
                    f"would hold no two evaluations; expected window >= budget.eval_every",
                )
            )
    if contract.sequential is not None and contract.sequential.looks[-1] != len(contract.seeds):
        errors.append(
            err(
                ("sequential", "looks"),
                f"the last look ({contract.sequential.looks[-1]} seeds) must use every seed listed "
                f"({len(contract.seeds)}); expected looks ending at len(seeds)",
            )
        )
    if contract.decision.evaluation == "exact" and not study.deterministic:
        errors.append(
            err(
                ("decision", "evaluation"),
                f"study {study.name!r} is not deterministic across seeds; expected 'interval'",
            )
        )
    family_alpha = contract.decision.family_alpha
    if family_alpha is not None and contract.supersedes is not None:
        errors.append(
            err(
                ("decision", "family_alpha"),
                f"a later version spends its family's alpha, declared by the first version; expected "
                f"no family_alpha here (this contract supersedes {contract.supersedes!r})",
            )
        )
    elif family_alpha is not None and family_alpha < contract.decision.alpha:
        errors.append(
            err(
                ("decision", "family_alpha"),
                f"family_alpha {family_alpha:g} is below this version's alpha "
                f"{contract.decision.alpha:g}; expected family_alpha >= alpha (the family includes "
                f"this version)",
            )
        )
    if contract.decision.evaluation == "interval" and len(contract.seeds) < MIN_VERDICT_SEEDS:
        errors.append(
            err(
                ("seeds",),
                f"{len(contract.seeds)} seed(s) never reach a verdict; expected at least "
                f"{MIN_VERDICT_SEEDS} for interval evaluation (seeds: {MIN_VERDICT_SEEDS})",
            )
        )
    return errors


def _check_candidates(t, err) -> list[UserError]:
    """A listed sampler's candidates: one per trial, each a value of every searched field and of no
    other, within the field's range (or choices)."""
    if t.sampler.kind != "listed":
        return []
    where = ("tuning", "sampler", "candidates")
    errors = []
    if len(t.sampler.candidates) != t.trials_per_arm:
        errors.append(
            err(
                where,
                f"{len(t.sampler.candidates)} candidates for {t.trials_per_arm} trials per arm; "
                f"expected one candidate per trial",
            )
        )
    for i, candidate in enumerate(t.sampler.candidates):
        if set(candidate) != set(t.space):
            errors.append(
                err(
                    (*where, i),
                    f"fields {sorted(candidate)}; expected exactly the searched fields "
                    f"{sorted(t.space)}",
                )
            )
            continue
        for key, value in candidate.items():
            why = t.space[key].outside(value)
            if why:
                errors.append(
                    err(
                        (*where, i, key),
                        f"{key} = {value!r} is {why}; expected a value of tuning.space.{key}",
                    )
                )
    return errors


def _check_tuning(contract: Contract, study: Study, err) -> list[UserError]:
    """A tuning section must search real fields within what every tuned arm accepts, and keep the
    decision fair: it reads no metric of the validation split tuning selected on, and compares no
    tuned arm with an untuned one."""
    t = contract.tuning
    errors = []
    fields = list(study.Config.model_fields)
    tuned = t.tuned_arms(contract.arms)
    if isinstance(t.trials, dict):
        for arm in t.trials:
            if arm not in contract.arms:
                errors.append(
                    err(
                        ("tuning", "trials", arm),
                        f"no arm named {arm!r}{did_you_mean(arm, list(contract.arms))}; "
                        f"arms: {', '.join(contract.arms)}",
                    )
                )
    for key, param in t.space.items():
        if key not in study.Config.model_fields:
            errors.append(
                err(
                    ("tuning", "space", key),
                    f"not a field of study {study.name!r}'s arm config"
                    f"{did_you_mean(key, fields)}; fields: {', '.join(fields)}",
                )
            )
            continue
        for where, value in param.bounds():
            for arm in tuned:
                try:
                    study.Config.model_validate({**contract.arms[arm], key: value})
                except ValidationError as e:
                    why = "; ".join(_explain(x, study.Config) for x in e.errors())
                    errors.append(
                        err(
                            ("tuning", "space", key) + where,
                            f"{key} = {value!r} is outside what arm {arm!r} accepts ({why}); "
                            f"expected a range within the field's validation",
                        )
                    )
                    break
    errors += _check_candidates(t, err)
    obj = t.objective
    if obj.metric not in study.metrics:
        errors.append(
            err(
                ("tuning", "objective", "metric"),
                f"study {study.name!r} reports no metric {obj.metric!r}"
                f"{did_you_mean(obj.metric, list(study.metrics))}; "
                f"metrics: {', '.join(study.metrics)}",
            )
        )
    else:
        if not is_validation_metric(obj.metric):
            val = [m for m in study.metrics if is_validation_metric(m)]
            errors.append(
                err(
                    ("tuning", "objective", "metric"),
                    f"{obj.metric!r} is not a validation metric; expected one measured on a split the "
                    f"decision never sees, named val_*, valid_* or validation_* (study {study.name!r} "
                    f"has: {', '.join(val) or 'none'})",
                )
            )
        better = study.metrics[obj.metric].direction
        if obj.direction != better:
            errors.append(
                err(
                    ("tuning", "objective", "direction"),
                    f"{obj.metric!r} is better when {better} in study {study.name!r}; "
                    f"expected direction {better!r}",
                )
            )
    overlap = sorted(set(t.seeds) & set(contract.seeds))
    if overlap:
        errors.append(
            err(
                ("tuning", "seeds"),
                f"tuning seeds {overlap} are also the contract's seeds; expected "
                f"seeds disjoint from {contract.seeds}, so no verdict run is a tuning run",
            )
        )
    for list_name, i, c in contract.conditions():
        base = ("decision", list_name, i)
        for loc, metric in metric_locs(c):
            if metric == obj.metric or is_validation_metric(metric):
                what = (
                    "is the tuning objective"
                    if metric == obj.metric
                    else "is measured on the validation split"
                )
                errors.append(
                    err(
                        base + loc,
                        f"{metric!r} {what}: tuning selected every arm's config on that "
                        f"split, so a decision on it would be biased; expected a metric from "
                        f"a split tuning never saw (e.g. test_*)",
                    )
                )
        if not isinstance(c, Threshold):
            arms = {arm for arm, _ in condition_terms(c)}
            if arms & set(tuned) and arms - set(tuned):
                errors.append(
                    err(
                        base,
                        f"compares tuned arm(s) {sorted(arms & set(tuned))} with untuned "
                        f"{sorted(arms - set(tuned))}; expected both sides tuned with the same "
                        f"budget, or neither",
                    )
                )
    return errors
