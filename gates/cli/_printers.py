"""What the `gates` commands print, in one place: the preflight report (`check`), the verdict and its
reproduction (`run`), the claims (`verify`, `status`) and their notes. Commands call these; the
dashboard and verdict.md render the same records through gates.record's shared pieces (condition_rows,
condition_label, converged_cell, signature)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rich.table import Table

from gates.cli._common import out
from gates.record import describe_stale

if TYPE_CHECKING:
    from gates.record import Evidence


def looks(c, metrics) -> list[dict]:
    """A sequential contract's looks: seeds, the alpha each spends and in all, and whether the look could
    stop the claim supported ("yes", "no": the tests of its estimands cannot reach that alpha there)."""
    from gates.inference import spent, supportable

    looks = []
    for n, (cum, here) in zip(
        c.sequential.looks, spent(c.sequential.spending, c.sequential.looks, c.decision.alpha)
    ):
        stop = "yes" if supportable(c.decision, n, here, metrics) else "no"
        looks.append({"seeds": n, "alpha": here, "alpha_spent": cum, "could_stop_supported": stop})
    return looks


def check_json(loaded, report, power, notes: list[str], flags: list[str]) -> dict:
    from gates.entities import json_safe

    c = loaded.contract
    return json_safe(
        {
            "id": c.id,
            "sha256": loaded.sha256,
            "claim": c.claim,
            "study": c.study,
            "arms": list(c.arms),
            "seeds": list(c.seeds),
            "budget": {"steps": c.budget.steps, "eval_every": c.budget.eval_every},
            "preflight": report.as_dict(),  # measured: per arm params, flops, ratios; notes
            "gates": c.preflight.model_dump(mode="json"),  # declared: the five gates
            "seeds_for_80pct_power": power,
            "decision": {
                "alpha": c.decision.alpha,
                "alpha_explicit": "alpha" in c.decision.model_fields_set,
                "evaluation": c.decision.evaluation,
                "supported_if": len(c.decision.supported_if),
                "refuted_if": len(c.decision.refuted_if),
                "ways_to_refute": len(c.conditions()),
            },
            "sequential": None
            if c.sequential is None
            else {"spending": c.sequential.spending, "looks": looks(c, loaded.study.metrics)},
            "tuning": None if c.tuning is None else c.tuning.model_dump(mode="json"),
            "controls": [ctl.control for ctl in c.controls],
            "notes": notes,
            "family": loaded.family.as_record(c.decision.alpha) if loaded.family else None,
            "rule_flags": flags,
            "errors": [e.as_dict() for e in report.errors],
            "ready": not report.errors,
        }
    )


def print_check(loaded, report, power, notes: list[str], flags: list[str]) -> None:
    c = loaded.contract
    out.print(f"[bold]{c.id}[/]  sha256 {loaded.sha256}")
    out.print(f"claim: {c.claim}", markup=False)
    out.print(
        f"study: {c.study}; arms: {', '.join(c.arms)}; seeds: {c.seeds}; "
        f"budget: {c.budget.steps} steps, eval every {c.budget.eval_every}"
    )
    if loaded.family is not None:
        out.print(f"claim family: {loaded.family.describe(c.decision.alpha)}", markup=False)
    table = Table("arm", "trainable params", "params ratio", "FLOPs/example", "FLOPs ratio")
    for arm, m in report.arms.items():
        table.add_row(
            arm,
            str(m["params"]),
            f"{m['params_ratio']:.3g}",
            str(m["flops"] or "-"),
            f"{m['flops_ratio']:.3g}" if m["flops_ratio"] is not None else "-",
        )
    out.print(table)
    gates_text = c.preflight
    out.print(
        f"gate 1 compute cost: every arm within {gates_text.compute_cost.max_ratio:g}x "
        f"{gates_text.compute_cost.baseline_arm!r}: {gates_text.compute_cost.rationale}",
        markup=False,
    )
    out.print(f"gate 2 preconditions: {gates_text.preconditions}", markup=False)
    pa = gates_text.predicted_ablation
    out.print(
        f"gate 3 predicted ablation: {pa.arm} {pa.direction} than {pa.versus} on {pa.metric} by "
        f"{pa.size:g}: {pa.statement}",
        markup=False,
    )
    if pa.sd is not None:
        out.print(
            f"  with sd {pa.sd:g} per seed: {power or 'more than 1000'} seeds per arm for 80% power at "
            f"alpha {c.decision.alpha:g} (a supported_if is tested at alpha); the contract has {len(c.seeds)}",
            markup=False,
        )
    out.print(f"gate 4 task fit: {gates_text.task_fit}", markup=False)
    fp = gates_text.falsifiable_point
    out.print(
        f"gate 5 falsifiable point: {fp.arm}.{fp.metric} {'>=' if fp.direction == 'higher' else '<='} "
        f"{fp.threshold:g} by step {fp.by_step}: {fp.statement}",
        markup=False,
    )
    for note in report.notes:
        out.print(note, markup=False)
    if c.tuning is not None:
        t = c.tuning
        space = "; ".join(
            f"{k} {p.type} "
            + (
                f"{p.choices}"
                if p.type == "categorical"
                else f"[{p.low:g}, {p.high:g}]{' log' if p.log else ''}"
            )
            for k, p in t.space.items()
        )
        out.print(
            f"tuning: {t.trials_per_arm} trials for each of {', '.join(t.tuned_arms(c.arms))}; space: {space}; "
            f"objective {t.objective.metric} ({t.objective.direction}) on tuning seeds {t.seeds}; "
            f"{t.sampler.summary()}",
            markup=False,
        )
    out.print(
        f"decision: alpha {c.decision.alpha:g} "
        f"({'explicit' if 'alpha' in c.decision.model_fields_set else 'default'}), "
        f"{c.decision.evaluation} evaluation; {len(c.decision.supported_if)} supported_if (all must hold: each "
        f"tested at alpha), {len(c.decision.refuted_if)} refuted_if; "
        f"{ways_to_refute(len(c.decision.supported_if), len(c.decision.refuted_if))}",
        markup=False,
    )
    if c.sequential is not None:
        out.print(
            f"sequential: {len(c.sequential.looks)} looks, {c.sequential.spending} spending (Lan-DeMets; "
            f"each look tested at the alpha it spends, union bound over looks)",
            markup=False,
        )
        for k, look in enumerate(looks(c, loaded.study.metrics)):
            stop = look["could_stop_supported"]
            out.print(
                f"  look {k + 1}: {look['seeds']} seeds, alpha {look['alpha']:.4g} here "
                f"({look['alpha_spent']:.4g} spent in all); could stop supported here: "
                f"{stop}",
                markup=False,
            )
    for i, ctl in enumerate(c.controls):
        out.print(
            f"control {i} ({ctl.control}): must hold (tested at alpha), else the verdict is invalid",
            markup=False,
        )
    for note in notes:
        out.print(note, markup=False)
    for flag in flags:
        out.print(f"recorded under older rules: {flag}", markup=False)


def ways_to_refute(supported: int, refuted: int) -> str:
    """The claim's ways to refute, counted and named: each refuted_if holding, each supported_if
    failing (one Holm family at alpha; a single way is tested at alpha as it is)."""
    named = ((refuted, "refuted_if", "holding"), (supported, "supported_if", "failing"))
    m = supported + refuted
    if m == 1:
        name, verb = next((name, verb) for n, name, verb in named if n)
        return f"one way to refute (the {name} {verb}), tested at alpha"
    ways = ", ".join(f"{n} {name} {verb}" for n, name, verb in named if n)
    return f"{m} ways to refute ({ways}), Holm-corrected at alpha"


def verify_summary(checks, unaudited, unconfirmed) -> str:
    """`gates verify`'s last line: how many claims with evidence hold it (pending contracts, without
    evidence, and withdrawn claims are counted apart), then the lost claims and broken contracts."""
    by_status: dict[str, list[str]] = {}
    for c in checks:
        by_status.setdefault(c.status, []).append(c.contract_id)
    held, lost = by_status.get("ok", []), by_status.get("lost", [])
    pending, broken = by_status.get("pending", []), by_status.get("broken", [])
    withdrawn = by_status.get("withdrawn", [])
    return (
        f"{len(held)} of {len(held) + len(lost)} claims hold their evidence"
        + (f"; {len(pending)} pending (no evidence yet)" if pending else "")
        + (f"; {len(withdrawn)} withdrawn" if withdrawn else "")
        + (f"; lost: {', '.join(lost)}" if lost else "")
        + (
            f"; {len(broken)} contract{'s do' if len(broken) > 1 else ' does'} not check: "
            f"{', '.join(broken)}"
            if broken
            else ""
        )
        + (
            f"; unaudited runs in: {', '.join(c.contract_id for c in unaudited)}"
            if unaudited
            else ""
        )
        + (
            f"; not confirmable on this machine (runs computed on other CPU kernels or torch): "
            f"{', '.join(c.contract_id for c in unconfirmed)}"
            if unconfirmed
            else ""
        )
    )


def claim_notes(c, describe_stale, short: bool = False) -> list[str]:
    """What a reader of a claim should know beyond pass/fail: withdrawal, supersedes chain, stale
    code, rules the recorded contract predates (`short`: each rule by its name only)."""
    notes = []
    if c.attempts > 1:
        notes.append(f"attempt {c.attempts}; earlier: {'; '.join(c.earlier)}")
    if c.withdrawn:
        notes.append(f"withdrawn: {c.withdrawal}")
    if c.superseded_by:
        notes.append(f"superseded by {', '.join(c.superseded_by)}")
    if c.regime_left:
        notes.append(f"regime left: {c.regime_left.note}")
    if c.shared_runs:
        from gates.record import describe_shared

        notes.append(describe_shared(c.shared_runs))
    if c.supersedes:
        notes.append(f"supersedes {c.supersedes}")
    if c.family:
        notes.append(c.family)
    if c.certified:
        notes.append(f"certified {c.certified}")
    if c.stale:
        since = "its certification" if c.certified else "its evidence"
        notes.append(
            f"stale: code changed since {since}: {describe_stale(c.stale_files)}"
            + (f" ({c.stale_note})" if c.stale_note else "")
        )
    if c.rule_flags:
        import re

        flags = (
            [
                m.group(1) if (m := re.search(r"\(rule: ([^)]*)\)", f)) else f[:80]
                for f in c.rule_flags
            ]
            if short
            else c.rule_flags
        )
        notes.append(f"recorded under older rules: {'; '.join(dict.fromkeys(flags))}")
    return notes


def print_status_lines(rows: list[StatusRow], width: int) -> None:
    """One line per claim, in columns: id, verdict, date, state (ok, lost, pending, broken; "stale"
    where its code changed since; nothing for a withdrawn claim, which its verdict names); a line
    that does not fit the width drops the padding, then is cut (the id first, whole)."""
    from rich.text import Text

    if not rows:
        return
    id_w = max(len(r.id) for r in rows)
    shown_w = max(len(r.shown) for r in rows)
    for row in rows:
        # a withdrawn claim says so in its verdict column; whether its code changed since is moot
        state = "" if row.status == "withdrawn" else row.status
        state += " stale" if row.code == "stale" and state else ""
        parts = (row.id, row.shown, row.recorded, state)
        line = f"{row.id:<{id_w}}  {row.shown:<{shown_w}}  {row.recorded:<10}  {state}".rstrip()
        if len(line) > width:
            line = "  ".join(p for p in parts if p)
        if len(line) > width:
            line = line[: max(width - 3, len(row.id))] + "..."
        style = {"lost": "red", "broken": "red", "pending": "yellow"}.get(row.status, "")
        text = Text(line)
        text.stylize("bold", 0, len(row.id))
        at = line.rfind(state)
        if style and at > len(row.id):
            text.stylize(style, at, at + len(state))
        out.print(text, highlight=False, soft_wrap=False, overflow="ignore", crop=False)


# `gates status` below this many columns: one block per claim, as a table's six columns wrap into a
# line per word there and cut the ids (c05-struct…)
WIDE_STATUS = 120


@dataclass
class StatusRow:
    id: str
    shown: str  # the verdict, withdrawn or superseded
    recorded: str  # its date
    hash_ok: str
    code: str  # "current", "stale" or "-"
    stale_files: str  # which files changed, when stale
    notes: list[str]  # notes, then the first problem
    status: str = "ok"  # the check's: ok, lost, pending, withdrawn, broken


def status_row(c) -> StatusRow:
    shown = c.verdict or c.status  # evidence that cannot be read is "lost", never "pending"
    if c.withdrawn:
        shown = f"withdrawn ({c.verdict or '-'})"
    elif c.superseded_by:
        shown = f"{shown} (superseded)"
    notes = [n for n in claim_notes(c, describe_stale, short=True) if not n.startswith("stale")]
    if c.problems:
        more = f" (+{len(c.problems) - 1} more)" if len(c.problems) > 1 else ""
        notes.append(c.problems[0][:100] + ("..." if len(c.problems[0]) > 100 else "") + more)
    return StatusRow(
        c.contract_id,
        shown,
        (c.created_at or "-")[:10],
        {True: "yes", False: "no", None: "-"}[c.hash_ok],  # None: not compared (no evidence)
        "stale" if c.stale else ("current" if c.created_at else "-"),
        describe_stale(c.stale_files, shown=0) if c.stale else "",
        notes,
        c.status,
    )


def print_status_blocks(rows: list[StatusRow], width: int) -> None:
    """One block per claim for a narrow terminal: its id whole, then verdict, date, hash and code on the
    same line where they fit (else on the next), then one indented line per stale files, note and
    problem, each cut to the width (`gates status --json` has them whole)."""
    from rich.text import Text

    def fit(text: str) -> str:
        return text if len(text) <= width else text[: max(width - 3, 0)] + "..."

    for row in rows:
        facts = f"{row.shown}  {row.recorded}  hash {row.hash_ok}  code {row.code}"
        if len(row.id) + 2 + len(facts) <= width:
            out.print(Text.assemble((row.id, "bold"), f"  {facts}"), highlight=False)
        else:
            out.print(Text(row.id, style="bold"), highlight=False)
            out.print(fit(f"    {facts}"), markup=False, highlight=False)
        details = ([f"stale: {row.stale_files}"] if row.code == "stale" else []) + row.notes
        for line in details:
            out.print(fit(f"    {line}"), markup=False, highlight=False)


def print_stale_hint(contract: Path, runs_dir: Path, contracts_dir: Path) -> None:
    """After a reproduction that reproduces: where the claim is stale (its code changed since its
    evidence or certification, as `gates status` says), the command that clears it."""
    from gates.verify import claims

    for check in claims(runs_dir, contracts_dir, [contract]):
        if not check.stale:
            continue
        out.print(
            f"the claim is stale: code changed since its evidence ({describe_stale(check.stale_files)}); "
            f"`gates certify {contract} --reason TEXT` re-runs its runs under today's code and, when they "
            f"reproduce, records that (the claim is then current)",
            markup=False,
            highlight=False,
        )


def print_verdict(ev: Evidence, runs_dir: Path, outcome=None, contract: Path | None = None) -> None:
    from gates.record import condition_label, condition_rows, interval_text, signature

    colour = {
        "supported": "green",
        "refuted": "red",
        "inconclusive": "yellow",
        "invalid": "magenta",
    }[ev.verdict]
    out.print(f"\n[bold {colour}]{ev.verdict.upper()}[/]  {ev.contract_id}", highlight=False)
    out.print(ev.claim, markup=False, highlight=False)
    for row in condition_rows(list(ev.conditions), list(ev.settings.arm_configs)):
        c = row.first
        # coloured by what the result means for the claim, never by holds/fails alone
        mark = {"supports": "green", "refutes": "red"}.get(row.meaning, "yellow")
        names = " + ".join(condition_label(r) for r in row.records)
        outcomes = ", ".join(r.outcome for r in row.records)
        out.print(
            f"  [{mark}]{row.meaning:<12}[/] {c.description}  ({names}: {outcomes})",
            highlight=False,
        )
        observed = "; ".join(
            f"{term} = {', '.join(f'{v:.4g}' for v in values)}" for term, values in c.values.items()
        )
        stats = ""
        if c.estimate is not None:
            stats = f"margin {c.estimate:+.4g}"
            if c.ci_low is not None:
                stats += f" {interval_text(c)}"
            if c.p_hold_adj is not None:
                stats += f", p(holds) {c.p_hold_adj:.3g}, p(fails) {c.p_fail_adj:.3g}"
        out.print(f"               {observed}; {stats} ({c.test})", markup=False, highlight=False)
    out.print("why:", highlight=False)
    for r in ev.reasons:
        out.print(f"  - {r}", markup=False, highlight=False)
    for s in ev.settle:
        out.print(f"  to settle: {s}", markup=False, highlight=False)
    out.print(signature(ev), markup=False, highlight=False)
    if outcome is None:
        return
    out.print(outcome.reuse.line(), markup=False, highlight=False)
    path = runs_dir / ev.contract_id / "evidence.json"
    if outcome.recorded:
        earlier = len(outcome.recording.earlier)
        out.print(
            f"recorded attempt {outcome.recording.number}"
            + (f" (earlier attempts: {earlier}, kept on the record)" if earlier else "")
            + f": {path} and {runs_dir / 'INDEX.jsonl'}",
            markup=False,
            highlight=False,
        )
        return
    for line in outcome.reproduction.lines():
        out.print(line, markup=False, highlight=False)
    out.print(
        f"nothing was written under {runs_dir}/ (the record: {path}); to record this run as attempt "
        f"{outcome.recording.number + 1}: gates run {contract or 'CONTRACT'} --record --reason TEXT",
        markup=False,
        highlight=False,
    )


def print_outcome(outcome, loaded, uri: str, runs_dir: Path, contracts_dir: Path, as_json: bool):
    """`gates run`'s end: what was reused and the verdict, as JSON events (--json) or for people, with
    the reproduction's comparison, the stale hint and where MLflow holds the runs."""
    evidence = outcome.evidence
    if as_json:
        print(
            json.dumps({"event": "reuse", **outcome.reuse.as_dict(), "line": outcome.reuse.line()})
        )
        print(
            json.dumps(
                {
                    "event": "verdict",
                    "mode": outcome.recording.mode,
                    "attempt": outcome.recording.number,
                    "recorded": outcome.recorded,
                    "contract_id": evidence.contract_id,
                    "contract_sha256": evidence.contract_sha256,
                    "verdict": evidence.verdict,
                    "reasons": evidence.reasons,
                    "settle": evidence.settle,
                    "conditions": [c.as_dict() for c in evidence.conditions],  # as recorded
                    "git_commit": evidence.git_commit,
                    **(
                        {"reproduction": outcome.reproduction.as_dict()}
                        if outcome.reproduction
                        else {}
                    ),
                }
            )
        )
        return
    print_verdict(evidence, runs_dir, outcome, contract=loaded.path)
    if outcome.reproduction is not None and outcome.reproduction.reproduces:
        print_stale_hint(loaded.path, runs_dir, contracts_dir)
    out.print(
        f"MLflow: {uri} (experiment {evidence.contract_id!r}); "
        f"open with `mlflow ui --backend-store-uri {uri}`",
        markup=False,
        highlight=False,
    )
    if outcome.mlflow_note:  # the supersession is recorded; only its MLflow view is missing
        out.print(outcome.mlflow_note, markup=False, highlight=False)


VERIFY_MARKS = {
    "ok": "[green]ok[/]",
    "lost": "[red]LOST[/]",
    "pending": "[yellow]pending[/]",
    "broken": "[red]BROKEN[/]",
    "withdrawn": "[magenta]withdrawn[/]",
}


def print_checks(checks, strict_code: bool) -> None:
    """`gates verify`'s line per claim: its state, verdict, what was replayed or audited, then its
    problems and notes (under --strict-code a stale claim fails, so it is not noted as well)."""
    for c in checks:
        n = len(c.audited)
        extra = (" (replayed)" if c.replayed else "") + (
            f" (audited {n} run{'s' * (n != 1)})" if n else ""
        )
        shown = c.verdict or ("does not check" if c.status == "broken" else "-")
        out.print(f"{VERIFY_MARKS[c.status]} {c.contract_id}: {shown}{extra}", highlight=False)
        for p in c.problems:
            out.print(f"    {p}", markup=False, highlight=False)
        notes = claim_notes(c, lambda files: describe_stale(files, shown=3), short=True)
        for note in notes if not strict_code else [n for n in notes if not n.startswith("stale")]:
            out.print(f"    note: {note}", markup=False, highlight=False)


def status_json(checks) -> str:
    """`gates status --json`: per claim its id, verdict, state and notes' facts."""
    return json.dumps(
        [
            {
                "id": c.contract_id,
                "verdict": c.verdict,
                "status": c.status,
                "hash_ok": c.hash_ok,
                "stale": c.stale,
                "stale_files": c.stale_files,
                "stale_note": c.stale_note,
                "withdrawn": c.withdrawn,
                "withdrawal": c.withdrawal,
                "superseded_by": c.superseded_by,
                "supersedes": c.supersedes,
                "family": c.family,
                "rule_flags": c.rule_flags,
                "recorded": c.created_at,
                "attempts": c.attempts,
                "earlier_attempts": c.earlier,
                "shared_runs": c.shared_runs,
                "regime_left": c.regime_left.as_dict() if c.regime_left else None,
                "problems": c.problems,
                "problem_codes": c.codes,
                "certified": c.certified,
            }
            for c in checks
        ],
        indent=2,
    )


def print_status_table(rows: list[StatusRow]) -> None:
    """`gates status -v` on a wide terminal: a table of six columns."""
    table = Table("contract", "verdict", "recorded", "hash ok", "code", "notes and problems")
    for row in rows:
        code = f"stale: {row.stale_files}" if row.code == "stale" else row.code
        table.add_row(row.id, row.shown, row.recorded, row.hash_ok, code, "; ".join(row.notes))
    out.print(table)
