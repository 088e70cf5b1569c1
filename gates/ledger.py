"""The evidence ledger: `runs/<id>/evidence.json` and its human-readable `verdict.md`.

Files are written atomically (temporary file in the same folder, fsync, rename), so a crash or a
kill leaves either the old evidence or the new one, never a half-written file. evidence.json is the
record and is written first; verdict.md is derived from it (`render_report`) and written second, so
a kill between the two leaves new evidence beside an old verdict.md, which `gates verify` detects
and `gates render` (or the next `gates run`) repairs. Evidence is read through a schema (`Evidence`)
that checks the shapes every reader relies on.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

import gates
from gates.errors import UserError
from gates.files import fsync_dir
from gates.yamlsafe import read_capped

EVIDENCE = "evidence.json"
REPORT = "verdict.md"
FORMAT = 1


@contextlib.contextmanager
def atomic_writer(path: Path):
    """Yield a text file; on a clean exit it replaces `path` in one rename, else it is discarded.
    The file gets ordinary permissions (0666 less the umask: 0644 under umask 022), as `open` would
    give; mkstemp's 0600 would hide committed evidence from the other users of a shared checkout."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(100):
        tmp = str(path.parent / f".{path.name}.{os.urandom(6).hex()}.tmp")
        try:
            fd = os.open(
                tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666
            )
            break
        except FileExistsError:
            continue
    else:
        raise FileExistsError(f"no free temporary name for {path}")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    with atomic_writer(path) as f:
        f.write(text)


def signature(evidence: dict) -> str:
    """A sacrebleu-style signature: everything needed to know how the verdict was computed."""
    s = evidence["settings"]
    tests = ",".join(sorted({c["test"] for c in evidence["conditions"]}))
    parts = [
        f"contract:{evidence['contract_id']}",
        f"sha256:{evidence['contract_sha256'][:16]}",
        f"commit:{evidence['git_commit'][:12]}{'+dirty' if evidence['git_dirty'] == 'true' else ''}",
        f"code:{evidence['code_sha256'][:12]}",
        f"eval:{s['evaluation']}",
        f"test:{tests}",
        f"correction:{s['correction']}",
        f"alpha:{s['alpha']}",
        f"engine:{evidence.get('engine_version', '1')}",
        f"seeds:{','.join(str(x) for x in s['seeds'])}",
        f"gates:{evidence.get('gates_version', gates.__version__)}",
    ]
    looks = evidence.get("looks")
    if looks:  # a sequential design: the seeds judged at the look that stopped it
        parts.insert(-1, f"looks:{len(looks)}@{len(looks[-1]['seeds'])}seeds")
    devices = devices_of(evidence)
    if (
        devices
    ):  # where the runs were computed (evidence from before devices were recorded has none)
        parts.insert(-1, f"device:{'+'.join(devices)}")
    return "|".join(parts)


def devices_of(evidence: dict) -> list[str]:
    """The devices the runs were computed on, e.g. ["cpu"] or ["cuda:NVIDIA H200"], sorted."""
    found = set()
    for run in evidence.get("runs", []):
        env = run.get("environment") or {}
        if env.get("device"):
            found.add(f"{env['device']}:{env['gpu']}" if env.get("gpu") else env["device"])
    return sorted(found)


def evidence_dir(runs_root: Path, contract_id: str) -> Path:
    return runs_root / contract_id


def write_evidence(runs_root: Path, evidence: dict) -> Path:
    """Write evidence.json (the record, the commit point), then verdict.md rendered from it, for one
    contract. Both are written and synced as temporary files before either replaces anything, so a
    full disk or a read-only folder changes nothing (a UserError naming the folder); a kill between
    the two renames leaves new evidence beside an old verdict.md, which `gates verify` reports and
    `gates render` repairs. Temporary files left by an earlier kill are removed first."""
    folder = evidence_dir(runs_root, evidence["contract_id"])
    evidence_text = json.dumps(evidence, indent=2, sort_keys=False, allow_nan=False) + "\n"
    report_text = render_report(evidence)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        clean_temporaries(folder)
        with atomic_writer(folder / REPORT) as report:
            report.write(report_text)
            report.flush()
            os.fsync(
                report.fileno()
            )  # on disk before the evidence moves: only renames remain after it
            with atomic_writer(folder / EVIDENCE) as record:
                record.write(evidence_text)
            # evidence.json is in place here; verdict.md replaces the old one as this block ends
    except OSError as e:
        why = (
            "it is not a folder"
            if isinstance(e, (FileExistsError, NotADirectoryError))
            else (e.strerror or e)
        )
        raise UserError(
            f"cannot write {EVIDENCE} and {REPORT} here: {why}; expected a writable "
            f"folder with free space (the finished runs stay in MLflow: run `gates run` again once "
            f"it is fixed and it writes the evidence without training them again)",
            file=str(folder),
        ) from None
    return folder / EVIDENCE


def write_report(folder: Path) -> Path:
    """Rewrite folder/verdict.md from folder/evidence.json (after a change of `render_report`)."""
    evidence = read_evidence(folder / EVIDENCE)  # ValueError when it is not valid evidence
    try:
        clean_temporaries(folder)
        atomic_write_text(folder / REPORT, render_report(evidence))
    except OSError as e:
        raise UserError(
            f"cannot write {REPORT} here: {e.strerror or e}; expected a writable folder with free space",
            file=str(folder),
        ) from None
    return folder / REPORT


def clean_temporaries(folder: Path) -> list[Path]:
    """Remove the temporary files a killed write left in a runs/<id>/ folder (`.evidence.json.*.tmp`,
    `.verdict.md.*.tmp`); the files removed."""
    removed = []
    for name in (EVIDENCE, REPORT):
        for stray in folder.glob(f".{name}.*.tmp"):
            with contextlib.suppress(FileNotFoundError):
                stray.unlink()
                removed.append(stray)
    return removed


# ---------------------------------------------------------------------------------- the schema
# The shapes that `gates verify`, `gates status`, `render_report`, the dashboard and `gates report`
# rely on. Extra keys are allowed everywhere (the verdict engine adds fields: a condition's
# `test_reason`, the evidence's `lost_runs`, `predictions`, ...); types are strict (a metric is a
# JSON number or null, never "0.9" or true; a seed is an integer, never 1.0).
class _Shape(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)


Number = float | None  # a JSON number (an int is fine); null for a value that was not finite


class FirstSignalShape(_Shape):
    step: int | None = None
    value: Number = None
    met: bool


class ConvergenceShape(_Shape):
    """The trend a completed run was judged on under the contract's convergence rule."""

    metric: str
    window: int
    first_step: int | None = None
    last_step: int | None = None
    first_value: Number = None
    last_value: Number = None
    rel_improvement: Number = None


class RunErrorShape(_Shape):
    """What a failed run raised or returned: its type, message and where (the innermost frame, file:line)."""

    type: str
    message: str = ""
    where: str | None = None


class RunShape(_Shape):
    arm: str
    seed: int
    status: str
    halt_reason: str | None = None
    halt_detail: str | None = None
    metrics: dict[str, Number]
    seconds: Number = None
    first_signal: FirstSignalShape | None = None
    mlflow_run_id: str | None = None
    converged: bool | None = None  # only on completed runs of a contract with a convergence rule
    convergence: ConvergenceShape | None = None
    environment: dict[str, str] | None = (
        None  # device, torch, cuda, gpu, threads (studies with a device)
    )
    error: RunErrorShape | None = None  # a failed run's error


class ConditionShape(_Shape):
    list_name: Literal["supported_if", "refuted_if", "controls"]
    index: int
    kind: str | None = None
    description: str
    estimate: Number = None
    ci_low: Number = None
    ci_high: Number = None
    ci_level: Number = None
    p_hold: Number = None
    p_fail: Number = None
    p_hold_adj: Number = None
    p_fail_adj: Number = None
    test: str
    n: dict[str, int] = {}
    values: dict[str, list[Number]] = {}
    outcome: Literal["holds", "fails", "undetermined"]
    note: str | None = None
    seeds_needed: int | None = None
    test_reason: str | None = None


class BudgetShape(_Shape):
    steps: int
    eval_every: int


class SettingsShape(_Shape):
    alpha: float
    evaluation: str
    correction: str
    seeds: list[int]
    budget: BudgetShape
    arm_configs: dict[str, dict]


class SignalShape(FirstSignalShape):
    seed: int


class FalsifiablePointShape(_Shape):
    metric: str
    arm: str
    direction: str
    threshold: float
    by_step: int
    runs: list[SignalShape] = []


class PreflightArmShape(_Shape):
    params: float
    params_ratio: float
    flops_ratio: Number = None


class PreflightShape(_Shape):
    arms: dict[str, PreflightArmShape] = {}
    notes: list[str] = []


class MlflowShape(_Shape):
    tracking_uri: str | None = None
    experiment_id: str | None = None
    parent_run_id: str | None = None


class TrialShape(_Shape):
    number: int
    params: dict
    state: str
    value: Number = None


class BestTrialShape(_Shape):
    number: int
    params: dict


class TunedArmShape(_Shape):
    trials: list[TrialShape]
    best: BestTrialShape | None = None


class TuningShape(_Shape):
    arms: dict[str, TunedArmShape] = {}


class LostValueShape(_Shape):
    arm: str
    metric: str
    seed: int
    why: str


class PredictedAblationShape(_Shape):
    arm: str
    metric: str
    versus: str
    direction: str
    predicted_size: Number = None
    measured_size: Number = None
    came_true: bool | None = None
    sd: Number = None
    seeds_for_80pct_power: int | None = None


class PredictedPointShape(_Shape):
    met_on: int
    of: int
    came_true: bool | None = None


class PredictionsShape(_Shape):
    predicted_ablation: PredictedAblationShape | None = None
    falsifiable_point: PredictedPointShape | None = None


class EarlierAttemptShape(_Shape):
    number: int
    verdict: str | None = None
    recorded: str | None = None
    reason: str = ""
    withdrawn: str | None = None
    why: list[str] = []


class AttemptShape(_Shape):
    """Which attempt at the claim this evidence is, why it was recorded, and the attempts before it."""

    number: int
    reason: str = ""
    earlier: list[EarlierAttemptShape] = []


class DesignShape(_Shape):
    factor: list[str] = []
    differences: dict[str, str] = {}
    blind: dict[str, str] = {}
    no_convergence: str | None = None


class NotRunShape(_Shape):
    arm: str
    runs: int
    completed: int
    statuses: dict[str, int] = {}
    first_error: str | None = None
    text: str
    settle: str = ""


class BeyondCeilingShape(_Shape):
    condition: str
    description: str = ""
    ceiling: float
    min: float
    max: float
    source: str = ""
    why: str = ""
    text: str
    settle: str = ""


class Evidence(_Shape):
    """runs/<id>/evidence.json, as far as its readers rely on it."""

    format: int | None = None
    contract_id: str
    contract_path: str | None = None
    contract_sha256: str
    claim: str | None = None
    source: str | None = None
    study: str | None = None
    verdict: Literal["supported", "refuted", "inconclusive", "invalid"]
    reasons: list[str] = []
    settle: list[str] = []
    git_commit: str
    git_dirty: str
    code_sha256: str
    gates_version: str | None = None
    created_at: str
    settings: SettingsShape
    mlflow: MlflowShape | None = None
    preflight: PreflightShape | None = None
    falsifiable_point: FalsifiablePointShape | None = None
    runs: list[RunShape]
    conditions: list[ConditionShape]
    halts: list[dict] = []
    tuning: TuningShape | None = None
    lost: list[LostValueShape] = []
    controls: list[ConditionShape] = []
    looks: list[dict] = []
    predictions: PredictionsShape | None = None
    rule_flags: list[str] = []
    supersedes: str | None = None
    attempt: AttemptShape | None = None  # absent in evidence from before attempts were recorded
    design: DesignShape | None = None
    regime: dict | None = None
    study_package: str | None = None
    not_run: list[NotRunShape] = []
    beyond_ceiling: list[BeyondCeilingShape] = []
    tuning_edges: dict[str, str] = {}
    shared_runs: dict[str, list[str]] = {}


REQUIRED = tuple(name for name, f in Evidence.model_fields.items() if f.is_required())
MAX_EVIDENCE_BYTES = 64 * 1024 * 1024


def raw_evidence(path: Path) -> dict | None:
    """The evidence as plain JSON, or None; never blocks on a FIFO or reads past the evidence cap."""
    try:
        data = json.loads(read_capped(path, MAX_EVIDENCE_BYTES).decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def read_evidence(path: Path) -> dict:
    """Parse and check an evidence file: its data (a dict, extra keys kept), or ValueError saying in
    one line what is wrong (unreadable, not JSON, or the wrong shape, naming the first bad fields)."""
    from gates.yamlsafe import read_capped

    try:
        data = json.loads(read_capped(Path(path), MAX_EVIDENCE_BYTES).decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as e:  # json.JSONDecodeError is a ValueError
        raise ValueError(f"unreadable evidence: {_one_line(e)}") from None
    if not isinstance(data, dict):
        raise ValueError("evidence is not a JSON object")
    missing = [k for k in REQUIRED if k not in data]
    if missing:
        raise ValueError(f"evidence lacks {', '.join(missing)}")
    if data["verdict"] not in ("supported", "refuted", "inconclusive", "invalid"):
        raise ValueError(f"evidence has an unknown verdict {data['verdict']!r}")
    try:
        Evidence.model_validate(data)
    except ValidationError as e:
        raise ValueError(f"malformed evidence: {_shape_errors(e)}") from None
    return data


def _shape_errors(e: ValidationError, shown: int = 3) -> str:
    parts = []
    for x in e.errors()[:shown]:
        where = ".".join(str(p) for p in x["loc"]) or "(top level)"
        got = x.get("input")
        got = type(got).__name__ if isinstance(got, (dict, list)) else repr(got)[:60]
        parts.append(f"{where}: {x['msg'][0].lower() + x['msg'][1:]}, got {got}")
    more = e.error_count() - shown
    return "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")


def _one_line(what) -> str:
    return "; ".join(part.strip() for part in str(what).splitlines() if part.strip())


def _fmt(x, digits=4) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{digits}g}"
    return str(x)


def convergence_lines(runs: list[dict]) -> list[str]:
    """The convergence note above the runs table: the rule's trend, and each run still improving."""
    shown = next((r["convergence"] for r in runs if r.get("convergence")), None)
    lines = []
    if shown:
        lines.append(
            f"Convergence: each completed run's `{shown['metric']}` over its last {shown['window']} steps; "
            f"a run that still improved by more than the contract's bar is not converged, and every "
            f"decision condition reading its arm is undetermined (halted runs are not judged)."
        )
    for r in runs:
        if r.get("converged") is False:
            lines.append(
                f"- still improving: arm {r['arm']} seed {r['seed']} ({_trend(r.get('convergence') or {})})"
            )
    return lines


def _trend(conv: dict) -> str:
    rel = conv.get("rel_improvement")
    if rel is None:
        return f"no measurable trend of {conv.get('metric', '?')} over the last {conv.get('window', '?')} steps"
    return (
        f"{rel:+.2%} over the last {conv['last_step'] - conv['first_step']} steps, "
        f"{conv['metric']} {_fmt(conv['first_value'])} at step {conv['first_step']} -> "
        f"{_fmt(conv['last_value'])} at step {conv['last_step']}"
    )


def _converged_cell(r: dict) -> str:
    if "converged" not in r:
        return "-"
    rel = (r.get("convergence") or {}).get("rel_improvement")
    change = f" ({rel:+.2%})" if rel is not None else ""
    return ("yes" if r["converged"] else "**no**") + change


def _design_lines(ev: dict) -> list[str]:
    """What the contract declares about its design, its regime and the runs it shares, beside the verdict."""
    from gates.siblings import describe_regime, describe_shared

    design, lines = ev.get("design") or {}, []
    if design.get("factor"):
        lines.append(
            f"- factor under test: {', '.join(design['factor'])} (the arm config fields compared arms differ in)"
        )
    lines += [
        f"- also differs between compared arms: {k}: {why}"
        for k, why in (design.get("differences") or {}).items()
    ]
    lines += [
        f"- {arm} fails by construction: {why}" for arm, why in (design.get("blind") or {}).items()
    ]
    if design.get("no_convergence"):
        lines.append(f"- runs not judged for convergence: {design['no_convergence']}")
    if ev.get("regime"):
        lines.append(f"- regime: {describe_regime(ev['regime'])}")
    if ev.get("shared_runs"):
        lines.append(f"- {describe_shared(ev['shared_runs'])} (contracts recorded before this one)")
    return ["Design:", ""] + lines + [""] if lines else []


def _families(ev: dict) -> str:
    """How the conditions' p-values were compared with alpha (the evidence's correction)."""
    alpha, n = ev["settings"]["alpha"], len(ev["conditions"])
    tail = (
        "t intervals are two-sided at 1 - 2*alpha (their ends are the one-sided bounds at alpha), an exact test "
        "shows the per-seed range of the effect."
    )
    if ev["settings"].get("correction") == "iut+holm":
        refute = sum(
            1 for c in ev["conditions"] if c["list_name"] in ("supported_if", "refuted_if")
        )
        return (
            f"Every supported_if condition must hold, so each is tested at alpha {alpha} (an intersection-union "
            f"test: no correction is needed to keep false support at alpha); the claim is refuted when any "
            f"refuted_if condition holds or any supported_if fails, and those {refute} ways to refute are "
            f"Holm-corrected at alpha {alpha}. {tail}"
        )
    return f"Holm-corrected across all {n} conditions at alpha {alpha}; {tail}"


def render_report(ev: dict) -> str:
    """verdict.md: the verdict, why, each condition's statistics, per-seed values, signature."""
    from gates.attempts import describe as describe_attempt

    package = f" (code: {ev['study_package']})" if ev.get("study_package") else ""
    lines = [
        f"# {ev['contract_id']}: **{ev['verdict'].upper()}**",
        "",
        f"> {ev.get('claim', '')}",
        "",
        f"Source: {ev.get('source', '-')}  ",
        f"Study: `{ev.get('study', '-')}`{package}, contract `{ev.get('contract_path', '-')}`, "
        f"recorded {ev['created_at']}",
        "",
    ]
    lines += describe_attempt(ev.get("attempt"))
    if ev.get("supersedes"):
        lines += [f"Supersedes `{ev['supersedes']}` (its evidence stays, shown as superseded).", ""]
    lines += _design_lines(ev)
    if ev.get("rule_flags"):
        lines += (
            [
                "Recorded under older rules (a new version that follows them is how this claim is brought "
                "up to date):",
                "",
            ]
            + [f"- {f}" for f in ev["rule_flags"]]
            + [""]
        )
    lines += ["## Why", ""]
    lines += [f"- {r}" for r in ev.get("reasons", [])]
    if ev.get("settle"):
        lines += ["", "What would settle it:", ""] + [f"- {s}" for s in ev["settle"]]
    if ev.get("tuning_edges"):
        lines += [
            "",
            "Tuning stopped at the edge of its search (every decision condition reading these arms is "
            "undetermined):",
            "",
        ] + [f"- {arm}: {why}" for arm, why in ev["tuning_edges"].items()]
    lines += [
        "",
        "## Conditions",
        "",
        _families(ev),
        "",
        "| condition | outcome | estimate | interval | p(holds) adj | p(fails) adj | test |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in ev["conditions"]:
        ci = (
            f"[{_fmt(c.get('ci_low'))}, {_fmt(c.get('ci_high'))}]"
            if c.get("ci_low") is not None
            else "-"
        )
        lines.append(
            f"| {c['list_name']}[{c['index']}]: `{c['description']}` | **{c['outcome']}** | "
            f"{_fmt(c.get('estimate'))} | {ci} | {_fmt(c.get('p_hold_adj'), 3)} | "
            f"{_fmt(c.get('p_fail_adj'), 3)} | {c['test']} |"
        )
    estimands = [
        f"- {c['list_name']}[{c['index']}]: {c['estimand']}"
        for c in ev["conditions"]
        if c.get("estimand")
    ]
    if estimands:
        lines += [
            "",
            "What each condition estimates (its estimate, interval and test are on this scale; on the log "
            "scale exp(estimate) is the factor by which the bar is cleared):",
            "",
        ] + estimands
    reasons = [
        f"- {c['list_name']}[{c['index']}]: {c['test']}: {c['test_reason']}"
        for c in ev["conditions"]
        if c.get("test_reason")
    ]
    if reasons:
        lines += ["", "Why each test:", ""] + reasons
    if ev.get("controls"):
        lines += [
            "",
            "## Controls",
            "",
            "Each must hold for the experiment to be interpretable (each tested at "
            "alpha: all must hold, an intersection-union test); one that fails or cannot be settled makes the "
            "verdict invalid.",
            "",
            "| control | kind | outcome | estimate | interval | p(holds) adj | test |",
            "|---|---|---|---|---|---|---|",
        ]
        for c in ev["controls"]:
            ci = (
                f"[{_fmt(c.get('ci_low'))}, {_fmt(c.get('ci_high'))}]"
                if c.get("ci_low") is not None
                else "-"
            )
            lines.append(
                f"| controls[{c['index']}]: `{c['description']}` | {c.get('control') or '-'} | "
                f"**{c['outcome']}** | {_fmt(c.get('estimate'))} | {ci} | {_fmt(c.get('p_hold_adj'), 3)} | "
                f"{c['test']} |"
            )
    if ev.get("lost"):
        lines += [
            "",
            "## Lost values",
            "",
            "Seeds without a finite value of a metric a condition reads; a "
            "supported_if condition that reads one cannot hold.",
            "",
        ]
        lines += [f"- {x['arm']}.{x['metric']} seed {x['seed']}: {x['why']}" for x in ev["lost"]]
    judged = any("converged" in r for r in ev["runs"])  # a contract with a convergence rule
    lines += ["", "## Runs", ""]
    if judged:
        lines += convergence_lines(ev["runs"]) + [""]
    lines += [
        "| arm | seed | status | halt | " + ("converged | " if judged else "") + "metrics |",
        "|---|---|---|---|" + ("---|" if judged else "") + "---|",
    ]
    for r in ev["runs"]:
        metrics = ", ".join(f"{k}={_fmt(v)}" for k, v in sorted(r["metrics"].items()))
        conv = f"{_converged_cell(r)} | " if judged else ""
        lines.append(
            f"| {r['arm']} | {r['seed']} | {r['status']} | {r.get('halt_reason') or '-'} | {conv}{metrics} |"
        )
    point = ev.get("falsifiable_point")
    if point:
        sign = ">=" if point["direction"] == "higher" else "<="
        lines += [
            "",
            "## Falsifiable point (gate 5)",
            "",
            f"`{point['arm']}.{point['metric']} {sign} {point['threshold']}` by step {point['by_step']}:",
            "",
        ]
        lines += [
            f"- seed {r['seed']}: {_fmt(r['value'])} at step {r['step']}: {'met' if r['met'] else 'NOT met'}"
            for r in point["runs"]
        ]
    pred = (ev.get("predictions") or {}).get("predicted_ablation")
    if pred:
        sign = "above" if pred["direction"] == "higher" else "below"
        came = {True: "came true", False: "did NOT come true", None: "not measured"}[
            pred["came_true"]
        ]
        lines += [
            "",
            "## Predictions (gates 3 and 5)",
            "",
            f"- gate 3: `{pred['arm']}.{pred['metric']}` {sign} `{pred['versus']}` by at least "
            f"{_fmt(pred['predicted_size'])}; measured {_fmt(pred['measured_size'])}: {came}"
            + (
                f"; with sd {_fmt(pred['sd'])}, {pred['seeds_for_80pct_power'] or '> 1000'} seeds per arm "
                f"give 80% power"
                if pred.get("sd") is not None
                else ""
            ),
        ]
        fpp = ev["predictions"]["falsifiable_point"]
        lines.append(
            f"- gate 5: threshold met by its step on {fpp['met_on']} of {fpp['of']} seeds: "
            f"{'came true' if fpp['came_true'] else 'did NOT come true'}"
        )
    pre = ev.get("preflight", {})
    if pre:
        lines += ["", "## Preflight", ""]
        for arm, p in pre.get("arms", {}).items():
            lines.append(
                f"- `{arm}`: {p['params']} trainable parameters, params ratio {p['params_ratio']:.3g}"
                + (
                    f", FLOPs ratio {p['flops_ratio']:.3g}"
                    if p.get("flops_ratio") is not None
                    else ""
                )
            )
    lines += ["", "---", "", f"`{signature(ev)}`", ""]
    return "\n".join(lines)
