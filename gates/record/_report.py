"""Writing a claim's record: evidence.json and verdict.md, the evidence rendered for a reader (what
`gates run` writes beside evidence.json, what `gates render` rewrites and `gates verify` compares
byte for byte).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from gates.entities import ConditionRecord, ConvergenceRecord, RunRecord
from gates.errors import UserError, storage_error
from gates.record._attempts import describe as describe_attempt
from gates.record._conditions import (
    ConditionRow,
    condition_label,
    condition_rows,
    condition_sentence,
)
from gates.record._evidence import (
    EVIDENCE,
    REPORT,
    DesignRecord,
    Evidence,
    PilotRecord,
    as_evidence,
    atomic_write_text,
    atomic_writer,
    clean_temporaries,
    evidence_dir,
    read_evidence,
    signature,
)
from gates.record._siblings import describe_regime, describe_shared


def write_evidence(runs_root: Path, evidence: Evidence | dict) -> Path:
    """Write evidence.json (the record, the commit point), then verdict.md rendered from it, for one
    contract. Both are written and synced as temporary files before either replaces anything, so a
    full disk or a read-only folder changes nothing (a UserError naming the folder); a kill between
    the two renames leaves new evidence beside an old verdict.md, which `gates verify` reports and
    `gates render` repairs. Temporary files left by an earlier kill are removed first. `evidence`: an
    Evidence, or its JSON data (checked: ValueError when malformed); evidence.json is its `as_dict()`,
    key for key in the order it was built."""
    ev = as_evidence(evidence)
    folder = evidence_dir(runs_root, ev.contract_id)
    evidence_text = json.dumps(ev.as_dict(), indent=2, sort_keys=False, allow_nan=False) + "\n"
    report_text = render_report(ev)
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
    except OSError as e:  # the folder (atomic_writer raises a StorageError for the files)
        found = storage_error(e, folder)
        if found is not None:  # a full disk or a read-only folder: exit 1, not bad input
            raise found from e
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


def _fmt(x, digits=4) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{digits}g}"
    return str(x)


def convergence_lines(runs: list[RunRecord]) -> list[str]:
    """The convergence note above the runs table: the rule's trend, and each run still improving."""
    shown = next((r.convergence for r in runs if r.convergence), None)
    lines = []
    if shown:
        lines.append(
            f"Convergence: each completed run's `{shown.metric}` over its last {shown.window} steps; "
            f"a run that still improved by more than the contract's bar is not converged, and every "
            f"decision condition reading its arm is undetermined (halted runs are not judged)."
        )
    for r in runs:
        if r.converged is False:
            lines.append(f"- still improving: arm {r.arm} seed {r.seed} ({_trend(r.convergence)})")
    return lines


def _trend(conv: ConvergenceRecord | None) -> str:
    rel = conv.rel_improvement if conv is not None else None
    if rel is None:
        metric, window = (conv.metric, conv.window) if conv is not None else ("?", "?")
        return f"no measurable trend of {metric} over the last {window} steps"
    return (
        f"{rel:+.2%} over the last {conv.last_step - conv.first_step} steps, "
        f"{conv.metric} {_fmt(conv.first_value)} at step {conv.first_step} -> "
        f"{_fmt(conv.last_value)} at step {conv.last_step}"
    )


def converged_cell(r: RunRecord, no: str = "no", over_window: bool = False) -> str:
    """A run's convergence as a table cell says it, in verdict.md and on the dashboard: "-" when it was
    not judged (halted, failed), else "yes" or `no` with the relative change over the window judged
    (`over_window`: naming the window's steps)."""
    if not r.has("converged"):
        return "-"
    conv = r.convergence
    rel = conv.rel_improvement if conv is not None else None
    change = ""
    if rel is not None:
        over = f" over the last {conv.window} steps" if over_window else ""
        change = f" ({rel:+.2%}{over})"
    return ("yes" if r.converged else no) + change


def interval_text(c: ConditionRecord) -> str:
    """A condition's confidence interval as every view shows it (verdict.md, the dashboard, `gates
    run`): "[low, high]" to 4 significant digits, "-" when it has none."""
    return f"[{_fmt(c.ci_low)}, {_fmt(c.ci_high)}]" if c.ci_low is not None else "-"


def _mirror_p(own: float | None, mirror: float | None) -> str:
    if own is None or mirror is None or math.isclose(own, mirror, rel_tol=1e-9, abs_tol=1e-15):
        return ""
    return f" (mirror {_fmt(mirror, 3)})"


def _labels(row: ConditionRow) -> str:
    return " and ".join(condition_label(r) for r in row.records)


def _design_lines(ev: Evidence) -> list[str]:
    """What the contract declares about its design, its regime and the runs it shares, beside the verdict."""

    design, lines = ev.design or DesignRecord(), []
    if design.factor:
        lines.append(
            f"- factor under test: {', '.join(design.factor)} (the arm config fields compared arms differ in)"
        )
    lines += [
        f"- also differs between compared arms: {k}: {why}" for k, why in design.differences.items()
    ]
    lines += [f"- {arm} fails by construction: {why}" for arm, why in design.blind.items()]
    if design.no_convergence:
        lines.append(f"- runs not judged for convergence: {design.no_convergence}")
    if ev.regime:
        lines.append(f"- regime: {describe_regime(ev.regime)}")
    if ev.shared_runs:
        lines.append(f"- {describe_shared(ev.shared_runs)} (contracts recorded before this one)")
    return ["Design:", ""] + lines + [""] if lines else []


def _families(ev: Evidence) -> str:
    """How the conditions' p-values were compared with alpha (the evidence's correction)."""
    alpha, n = ev.settings.alpha, len(ev.conditions)
    tail = (
        "t intervals are two-sided at 1 - 2*alpha (their ends are the one-sided bounds at alpha), an exact test "
        "shows the per-seed range of the effect."
    )
    if ev.settings.correction == "iut+holm":
        refute = sum(1 for c in ev.conditions if c.list_name in ("supported_if", "refuted_if"))
        return (
            f"Every supported_if condition must hold, so each is tested at alpha {alpha} (an intersection-union "
            f"test: no correction is needed to keep false support at alpha); the claim is refuted when any "
            f"refuted_if condition holds or any supported_if fails, and those {refute} ways to refute are "
            f"Holm-corrected at alpha {alpha}. {tail}"
        )
    return f"Holm-corrected across all {n} conditions at alpha {alpha}; {tail}"


def pilot_lines(pilots: list[PilotRecord], contract_sha256: str) -> list[str]:
    """The pilot runs of a contract (`gates pilot`) as markdown: a summary line, then one row each with
    when it ran, on which version of the contract and what it measured."""
    before = sum(1 for p in pilots if p.before_registration)
    known = sum(1 for p in pilots if p.before_registration is not None)
    lines = [
        f"{len(pilots)} pilot run{'s' if len(pilots) != 1 else ''} of this contract id (`gates pilot`, "
        f"on seeds no contract uses)"
        + (f"; {before} before the contract was first committed" if known else "")
        + ":",
        "",
        "| started | arm | seed | steps | contract | status | metrics |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in pilots:
        version = (
            "this one" if p.contract_sha256 == contract_sha256 else f"draft {p.contract_sha256[:8]}"
        )
        metrics = ", ".join(f"{k}={_fmt(v)}" for k, v in sorted(p.metrics.items()))
        lines.append(
            f"| {p.started} | {p.arm} | {p.seed} | {p.steps} | {version} | {p.status} | {metrics} |"
        )
    return lines


def render_report(evidence: Evidence | dict) -> str:
    """verdict.md: the verdict, why, each condition's statistics, per-seed values, signature.
    `evidence`: an Evidence, or its JSON data (checked: ValueError when malformed)."""

    ev = as_evidence(evidence)
    package = f" (code: {ev.study_package})" if ev.study_package else ""
    lines = [
        f"# {ev.contract_id}: **{ev.verdict.upper()}**",
        "",
        f"> {ev.written('claim', '')}",
        "",
        f"Source: {ev.written('source', '-')}  ",
        f"Study: `{ev.written('study', '-')}`{package}, contract "
        f"`{ev.written('contract_path', '-')}`, recorded {ev.created_at}",
        "",
    ]
    lines += describe_attempt(ev.attempt)
    if ev.supersedes:
        lines += [f"Supersedes `{ev.supersedes}` (its evidence stays, shown as superseded).", ""]
    lines += _design_lines(ev)
    if ev.rule_flags:
        lines += (
            [
                "Recorded under older rules (a new version that follows them is how this claim is brought "
                "up to date):",
                "",
            ]
            + [f"- {f}" for f in ev.rule_flags]
            + [""]
        )
    lines += ["## Why", ""]
    lines += [f"- {r}" for r in ev.reasons]
    if ev.settle:
        lines += ["", "What would settle it:", ""] + [f"- {s}" for s in ev.settle]
    if ev.tuning_edges:
        lines += [
            "",
            "Tuning stopped at the edge of its search (every decision condition reading these arms is "
            "undetermined):",
            "",
        ] + [f"- {arm}: {why}" for arm, why in ev.tuning_edges.items()]
    lines += [
        "",
        "## Conditions",
        "",
        _families(ev),
        "",
        "A supported_if condition and its refuted_if mirror (the same terms and bar the other way round, "
        "judged on the same values) share a row; its numbers are the supported_if side's. The result says "
        "what the outcome means for the claim; the margin is how far the estimate clears the bar "
        "(negative: short of it), with its interval.",
        "",
        "| condition | result | margin | interval | p(holds) adj | p(fails) adj | test |",
        "|---|---|---|---|---|---|---|",
    ]
    rows = condition_rows(list(ev.conditions), list(ev.settings.arm_configs))
    for row in rows:
        c = row.first
        if row.merged:
            mirror = row.records[1]
            cell = f"{condition_label(c)}: `{c.description}`, mirror {condition_label(mirror)}"
            result = f"**{row.meaning}** ({', '.join(f'{condition_label(r)} {r.outcome}' for r in row.records)})"
            # the mirror's adjusted p-values are the same numbers the other way round unless its
            # family was corrected differently (several refuted_if conditions): then both are shown
            p_hold = _fmt(c.p_hold_adj, 3) + _mirror_p(c.p_hold_adj, mirror.p_fail_adj)
            p_fail = _fmt(c.p_fail_adj, 3) + _mirror_p(c.p_fail_adj, mirror.p_hold_adj)
        else:
            cell = f"{condition_label(c)}: `{c.description}`"
            outcome, _, means = condition_sentence(c).partition(": ")
            result = f"**{c.outcome}**: {means}" if means else f"**{outcome}**"
            p_hold, p_fail = _fmt(c.p_hold_adj, 3), _fmt(c.p_fail_adj, 3)
        lines.append(
            f"| {cell} | {result} | {_fmt(c.estimate)} | {interval_text(c)} | {p_hold} | {p_fail} | "
            f"{c.test} |"
        )
    estimands = [f"- {_labels(row)}: {row.first.estimand}" for row in rows if row.first.estimand]
    if estimands:
        lines += [
            "",
            "What each condition estimates (its margin, interval and test are on this scale; on the log "
            "scale exp(margin) is the factor by which the bar is cleared):",
            "",
        ] + estimands
    reasons = [
        f"- {_labels(row)}: {row.first.test}: {row.first.test_reason}"
        for row in rows
        if row.first.test_reason
    ]
    if reasons:
        lines += ["", "Why each test:", ""] + reasons
    if ev.controls:
        lines += [
            "",
            "## Controls",
            "",
            "Each must hold for the experiment to be interpretable (each tested at "
            "alpha: all must hold, an intersection-union test); one that fails or cannot be settled makes the "
            "verdict invalid.",
            "",
            "| control | kind | outcome | margin | interval | p(holds) adj | test |",
            "|---|---|---|---|---|---|---|",
        ]
        for c in ev.controls:
            lines.append(
                f"| controls[{c.index}]: `{c.description}` | {c.control or '-'} | "
                f"**{c.outcome}** | {_fmt(c.estimate)} | {interval_text(c)} | {_fmt(c.p_hold_adj, 3)} | "
                f"{c.test} |"
            )
    if ev.lost:
        lines += [
            "",
            "## Lost values",
            "",
            "Seeds without a finite value of a metric a condition reads; a "
            "supported_if condition that reads one cannot hold.",
            "",
        ]
        lines += [f"- {x.arm}.{x.metric} seed {x.seed}: {x.why}" for x in ev.lost]
    judged = any(r.has("converged") for r in ev.runs)  # a contract with a convergence rule
    lines += ["", "## Runs", ""]
    if judged:
        lines += convergence_lines(ev.runs) + [""]
    lines += [
        "| arm | seed | status | halt | " + ("converged | " if judged else "") + "metrics |",
        "|---|---|---|---|" + ("---|" if judged else "") + "---|",
    ]
    for r in ev.runs:
        metrics = ", ".join(f"{k}={_fmt(v)}" for k, v in sorted(r.metrics.items()))
        conv = f"{converged_cell(r, no='**no**')} | " if judged else ""
        lines.append(
            f"| {r.arm} | {r.seed} | {r.status} | {r.halt_reason or '-'} | {conv}{metrics} |"
        )
    point = ev.falsifiable_point
    if point:
        sign = ">=" if point.direction == "higher" else "<="
        lines += [
            "",
            "## Falsifiable point (gate 5)",
            "",
            f"`{point.arm}.{point.metric} {sign} {point.threshold}` by step {point.by_step}:",
            "",
        ]
        lines += [
            f"- seed {r.seed}: {_fmt(r.value)} at step {r.step}: {'met' if r.met else 'NOT met'}"
            for r in point.runs
        ]
    pred = ev.predictions.predicted_ablation if ev.predictions else None
    if pred:
        sign = "above" if pred.direction == "higher" else "below"
        came = {True: "came true", False: "did NOT come true", None: "not measured"}[pred.came_true]
        lines += [
            "",
            "## Predictions (gates 3 and 5)",
            "",
            f"- gate 3: `{pred.arm}.{pred.metric}` {sign} `{pred.versus}` by at least "
            f"{_fmt(pred.predicted_size)}; measured {_fmt(pred.measured_size)}: {came}"
            + (
                f"; with sd {_fmt(pred.sd)}, {pred.seeds_for_80pct_power or '> 1000'} seeds per arm "
                f"give 80% power"
                if pred.sd is not None
                else ""
            ),
        ]
        fpp = ev.predictions.falsifiable_point
        if fpp is not None:
            lines.append(
                f"- gate 5: threshold met by its step on {fpp.met_on} of {fpp.of} seeds: "
                f"{'came true' if fpp.came_true else 'did NOT come true'}"
            )
    if ev.pilots:
        lines += ["", "## Pilots (what was known before)", ""] + pilot_lines(
            ev.pilots, ev.contract_sha256
        )
    pre = ev.preflight
    if pre is not None and pre.model_fields_set:  # as JSON: a non-empty object
        lines += ["", "## Preflight", ""]
        for arm, p in pre.arms.items():
            lines.append(
                f"- `{arm}`: {p.params} trainable parameters, params ratio {p.params_ratio:.3g}"
                + (f", FLOPs ratio {p.flops_ratio:.3g}" if p.flops_ratio is not None else "")
            )
    lines += ["", "---", "", f"`{signature(ev)}`", ""]
    return "\n".join(lines)
