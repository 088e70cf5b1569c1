"""`gates new ID --study NAME`: a contract skeleton, and the check that refuses one not filled in.

The skeleton has every required field of a contract (gates.contract.Contract), the study's arm
config with its defaults (from the study's pydantic Config), the five preflight gates as short
prompts in comments, and a `TODO: ...` string wherever only the researcher can decide (the claim,
the budget, the numbers of the gates and the decision). `gates check` and `gates run` refuse a
contract while any `TODO` value is left, naming each one as FILE:LINE: field.
"""

from __future__ import annotations

import json
import math
import os
import re
import textwrap
from pathlib import Path
from typing import Any

from gates.errors import UserError, UserErrors, did_you_mean

PLACEHOLDER = "TODO"  # a string value "TODO" or "TODO: ..." is a placeholder left by `gates new`
_PLACEHOLDER = re.compile(rf"\s*{PLACEHOLDER}(:|\s*$)")


def _todo(what: str) -> str:
    return json.dumps(f"{PLACEHOLDER}: {what}")


def _scalar(value: Any) -> str:
    """A YAML scalar (JSON is YAML: strings quoted, numbers, booleans and null as they are)."""
    if isinstance(value, float) and not math.isfinite(value):
        return ".nan" if math.isnan(value) else (".inf" if value > 0 else "-.inf")
    return json.dumps(value, ensure_ascii=False)


def _flow(value: Any) -> str:
    """A config value on one line: scalars, and lists or mappings in flow style."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_flow(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_flow(v) for v in value) + "]"
    return _scalar(value)


def _arm_lines(config_cls) -> list[str]:
    """The arm config's fields, one per line, with the study's defaults (a required field: TODO)."""
    from pydantic_core import PydanticUndefined

    lines = []
    for name, field in config_cls.model_fields.items():
        if field.default is PydanticUndefined and field.default_factory is None:
            value = _todo(f"{name} (required by the study's config)")
        else:
            value = _flow(_jsonable(field.get_default(call_default_factory=True)))
        note = f"  # {' '.join(field.description.split())}" if field.description else ""
        lines.append(f"    {name}: {value}{note}")
    return lines or ["    {}"]


def _jsonable(value: Any) -> Any:
    """A default as JSON data (nested configs dumped, tuples as lists, enums by value)."""
    from pydantic import BaseModel

    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    try:
        from pydantic import TypeAdapter

        return TypeAdapter(type(value)).dump_python(value, mode="json")
    except Exception:
        return value


def _decision_metric(study) -> tuple[str | None, str]:
    """The metric a decision would most likely read (the study's first test metric, else a cost one)."""
    for role in ("test", "cost"):
        for name, metric in study.metrics.items():
            if metric.role == role:
                return name, metric.direction
    return None, "higher"


def _control_metric(study) -> tuple[str, str]:
    """The metric a positive control would read: a validation metric (the arm works where it can), else the
    decision's."""
    for name, metric in study.metrics.items():
        if metric.role == "validation":
            return name, metric.direction
    name, better = _decision_metric(study)
    return name or _todo("a test or validation metric of the study"), better


def skeleton(contract_id: str, study_name: str, study) -> str:
    """The text of a new contract `contract_id` for the registered study `study_name`."""
    metric, better = _decision_metric(study)
    worse = "lower" if better == "higher" else "higher"
    metric_text = metric if metric is not None else _todo("a test or cost metric of the study")
    roles = "\n".join(
        "#   " + line
        for line in textwrap.wrap(
            ", ".join(f"{m} ({spec.direction}, {spec.role})" for m, spec in study.metrics.items()),
            96,
        )
    )
    arm = "\n".join(_arm_lines(study.Config))
    support, refute = _todo("the bar for support"), _todo("the bar for refutation")
    control_metric, control_better = _control_metric(study)
    convergence = ""
    if study.trains:
        watched = next(
            (m for m, spec in study.metrics.items() if spec.role in ("train", "validation")), None
        )
        convergence = (
            "# Convergence: a run still improving at its end leaves every condition reading its arm "
            "undetermined\n# (or, where runs cannot be judged so: `no_convergence: why`).\n"
            f"convergence:\n  metric: {watched or _todo('a train or validation metric reported at every evaluation')}\n"
            f"  window: {_todo('steps at the end of the run over which improvement is measured')}\n"
            f"  max_rel_improvement: 0.01\n"
        )
    return f"""\
# {contract_id}: a hypothesis contract for study {study_name!r}, written by `gates new`.
# Fix everything here before any training step. Replace every "TODO: ..." value: `gates check`
# refuses this file, naming each one (file:line: field), until none is left. Then:
#   gates check contracts/{contract_id}.yaml && gates run contracts/{contract_id}.yaml
# The study's metrics (better direction, role):
{roles}
# A decision reads only test and cost metrics. Arm configs: `gates schema --study {study_name}`.
id: {contract_id}
claim: {_todo("what the variant does that the baseline does not, measured how (one or two sentences)")}
source: {_todo("where the hypothesis comes from (a paper, notes, an earlier contract)")}
study: {study_name}
# Each arm is one config of the study, shown with its defaults: change what the arms differ in.
arms:
  baseline:
{arm}
  variant:
{arm}
seeds: 8  # a count: seeds 0-7 ({{count: N, start: S}} for others); `gates check` says whether they can reach significance
# The arm config fields under test: arms a condition compares may differ only in these (declare any other
# difference, e.g. a width matched for capacity, as `differences: {{field: why}}`).
factor: [{_todo("the config field(s) the arms differ in")}]
{convergence}budget:
  steps: {_todo("training steps per arm x seed")}
  eval_every: {_todo("report metrics every this many steps")}
preflight:
  # Gate 1, compute cost: every arm within max_ratio x the baseline's parameters and FLOPs (measured).
  compute_cost:
    baseline_arm: baseline
    max_ratio: {_todo("e.g. 2: the most any arm may cost relative to the baseline")}
    rationale: {_todo("why the arms' costs are comparable")}
  # Gate 2, preconditions: why the conditions under which the idea worked before hold here.
  preconditions: {_todo("why earlier successes' conditions hold in this setup")}
  # Gate 3, predicted ablation: the effect you expect, its direction and size, before seeing it.
  predicted_ablation:
    metric: {metric_text}
    arm: variant
    versus: baseline
    direction: {better}
    size: {_todo("predicted absolute difference in the metric")}
    statement: {_todo("what removing the idea (the baseline) does to the metric")}
  # Gate 4, task fit: why this task needs what the hypothesis offers.
  task_fit: {_todo("why the task rewards what the variant adds, and not something else")}
  # Gate 5, falsifiable point: where the hypothesis would first fail, and by when.
  falsifiable_point:
    metric: {metric_text}
    arm: variant
    direction: {better}
    threshold: {_todo("the value the variant must reach")}
    by_step: {_todo("the step by which it must reach it")}
    statement: {_todo("the first observation that would count against the hypothesis")}
# A negative result needs an arm that works where it can: refuted_if below asserts that the variant fails,
# so a positive control shows it works (in its metric's better direction, beyond chance), else the
# verdict is invalid. An arm that fails by construction is declared instead: `blind: {{arm: why}}`.
controls:
  - {{kind: threshold, arm: variant, metric: {control_metric}, direction: {control_better}, value: {_todo("a bar a working variant clears and an arm at chance does not")}, control: positive}}
# Optional: stop_rules (futility, divergence, budget), tuning, sequential, replay, ceilings (a condition's
# `ceiling:`), differences, blind.
decision:
  alpha: 0.05
  supported_if:
    - {{kind: threshold, arm: variant, metric: {metric_text}, direction: {better}, value: {support}}}
  refuted_if:
    - {{kind: threshold, arm: variant, metric: {metric_text}, direction: {worse}, value: {refute}}}
"""


def write(contracts_dir: Path, contract_id: str, study_name: str) -> Path:
    """Write contracts_dir/<id>.yaml; a UserError for an invalid id, an unknown study or an existing file."""
    from gates.contract._bounds import SLUG
    from gates.study import get_study, study_names

    if not re.fullmatch(SLUG.strip("^$"), contract_id) or len(contract_id) > 80:
        raise UserError(
            f"{contract_id!r} is not a contract id; expected lowercase letters, digits and '-', "
            f"starting with a letter or digit, at most 80 characters (e.g. my-claim-v1)",
            field="ID",
        )
    try:
        study = get_study(study_name)
    except KeyError:
        raise UserError(
            f"unknown study {study_name!r}{did_you_mean(study_name, study_names())}; registered: "
            f"{', '.join(study_names()) or 'none'}",
            field="--study",
        ) from None
    text = skeleton(contract_id, study_name, study)
    path = Path(contracts_dir) / f"{contract_id}.yaml"
    for other in _files_with_id(Path(contracts_dir), contract_id):
        if other != path:
            raise UserError(
                f"{other} already has id {contract_id!r}; expected a new id (one contract per id)",
                field="ID",
            )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except FileExistsError:
        raise UserError(
            f"{path} already exists; expected a new id (a new version of a contract gets a new id, "
            f"e.g. {contract_id}-v2)",
            field="ID",
        ) from None
    except OSError as e:
        raise UserError(
            f"cannot write {path}: {e.strerror or e}", field="--contracts-dir"
        ) from None
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    return path


def _files_with_id(contracts_dir: Path, contract_id: str) -> list[Path]:
    """The contract files in `contracts_dir` whose `id` is `contract_id` (files that do not parse: skipped)."""
    from gates.contract._load import MAX_CONTRACT_BYTES
    from gates.contract._yaml import load_yaml

    found = []
    for path in sorted(list(contracts_dir.glob("*.yaml")) + list(contracts_dir.glob("*.yml"))):
        try:
            data, _ = load_yaml(path, max_bytes=MAX_CONTRACT_BYTES)
        except UserError:
            continue
        if isinstance(data, dict) and data.get("id") == contract_id:
            found.append(path)
    return found


# ---------------------------------------------------------------------------------- the check
def placeholders(data: Any, lines: dict[tuple, int], shown: str) -> list[UserError]:
    """A UserError for every `TODO` value left in a contract's data (FILE:LINE: field: ...)."""
    found: list[UserError] = []

    def walk(value: Any, loc: tuple) -> None:
        if isinstance(value, dict):
            for key, child in value.items():
                walk(child, loc + (key,))
        elif isinstance(value, list):
            for i, child in enumerate(value):
                walk(child, loc + (i,))
        elif isinstance(value, str) and _PLACEHOLDER.match(value):
            prompt = value.strip()
            shown_prompt = prompt if len(prompt) <= 90 else prompt[:87] + "..."
            found.append(
                UserError(
                    f'still the placeholder "{shown_prompt}" that `gates new` wrote; expected your '
                    f"value",
                    file=shown,
                    line=lines.get(loc),
                    field=".".join(map(str, loc)),
                )
            )

    walk(data, ())
    return found


def require_filled(path: Path) -> None:
    """Refuse a contract that still has `TODO` placeholders: every one named, exit 2."""
    from gates.contract._load import MAX_CONTRACT_BYTES
    from gates.contract._yaml import load_yaml

    data, lines = load_yaml(Path(path), max_bytes=MAX_CONTRACT_BYTES)
    found = placeholders(data, lines, str(path))
    if found:
        raise UserErrors(found)
