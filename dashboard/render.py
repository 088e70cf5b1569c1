"""HTML pages, the same for the live dashboard and the static report (only the links differ).

Every text that comes from a contract, evidence or MLflow goes through `e()` (HTML-escaped); the
pages carry a Content-Security-Policy that allows no script at all.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from urllib.parse import quote

from gates.dashboard import svg
from gates.dashboard.data import Claim, ContractView, finite
from gates.dashboard.svg import e
from gates.record import ConditionRecord, Evidence, RunRecord, describe_regime, describe_shared

CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'"


@dataclass(frozen=True)
class Links:
    """Where the index and a contract page are, seen from the page being rendered."""

    index: str
    contract_fmt: str

    def contract(self, contract_id: str) -> str:
        return self.contract_fmt.format(quote(contract_id, safe=""))


SERVER = Links("/", "/contract/{}")
STATIC_INDEX = Links("index.html", "contract/{}.html")
STATIC_CONTRACT = Links("../index.html", "{}.html")

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#1d1d1f;background:#fafafa}
header{background:#263238;color:#fff;padding:10px 24px}header a{color:#fff;text-decoration:none;font-weight:600}
main{padding:16px 24px;max-width:1400px}h1{font-size:22px;margin:8px 0}h2{font-size:17px;margin:22px 0 8px}
table{border-collapse:collapse;background:#fff;margin:6px 0}td,th{border:1px solid #ddd;padding:4px 8px;
vertical-align:top;text-align:left}th{background:#eceff1}td.num{text-align:right;font-variant-numeric:tabular-nums}
.v{display:inline-block;padding:1px 8px;border-radius:10px;font-weight:600;color:#fff;white-space:nowrap}
.v-supported{background:#2e7d32}.v-refuted{background:#c62828}.v-inconclusive{background:#ef8f00}.v-invalid{background:#4e342e}
.v-pending{background:#90a4ae}.v-withdrawn{background:#6a1b9a}.o-holds{color:#2e7d32;font-weight:600}.o-fails{color:#c62828;font-weight:600}
.o-undetermined{color:#b26a00;font-weight:600}.h-ok{color:#2e7d32}.h-bad{color:#c62828;font-weight:600}
.h-none{color:#78909c}.note{background:#fff8e1;border-left:4px solid #ffb300;padding:6px 10px;margin:8px 0}
.lost{background:#ffebee;border-left:4px solid #c62828;padding:6px 10px;margin:8px 0}
blockquote{margin:8px 0;padding:6px 12px;border-left:4px solid #90a4ae;background:#fff;font-size:15px}
code,.mono{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px}.mono{word-break:break-all}
td.id,td.date{white-space:nowrap}pre{white-space:pre-wrap;max-width:900px;margin:4px 0}
.s-failed,.s-skipped{color:#c62828;font-weight:600}.s-halted{color:#b26a00;font-weight:600}
dl{display:grid;grid-template-columns:max-content auto;gap:2px 14px}dt{font-weight:600}dd{margin:0}
.small{font-size:12px;color:#555}footer{padding:12px 24px;color:#777;font-size:12px}
svg text{font:11px system-ui,sans-serif;fill:#333}svg .t{font-weight:600;font-size:13px}
svg .yl{text-anchor:end}svg .xl{text-anchor:middle;font-size:10px}
svg .xs{text-anchor:start;font-size:10px}svg .xe{text-anchor:end;font-size:10px}svg .n{fill:#666}svg .lg{font-size:11px}
svg .frame{fill:#fff;stroke:#bbb}svg .grid{stroke:#eee}svg .thr{stroke-dasharray:6 4;stroke-width:1.4}
svg .fut{stroke:#666;stroke-dasharray:2 3;stroke-width:1.4}svg .halt{stroke:#d50000;stroke-width:2.5;fill:none}
"""


def page(title: str, body: str, links: Links, footer: str) -> str:
    now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return (
        f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        f'<meta name="viewport" content="width=device-width,initial-scale=1"><title>{e(title)}</title>'
        f'<style>{CSS}</style></head><body><header><a href="{e(links.index)}">treeheap-gates: claims</a></header>'
        f"<main>{body}</main><footer>{footer} Rendered {now}; read-only.</footer></body></html>\n"
    )


def verdict_badge(verdict: str | None) -> str:
    v = verdict or "pending"
    return f'<span class="v v-{e(v)}">{e(v)}</span>'


def hash_cell(status: str) -> str:
    cls = {"ok": "h-ok", "evidence missing": "h-none"}.get(status, "h-bad")
    return f'<span class="{cls}">{e(status)}</span>'


def check_cell(c: Claim) -> str:
    if c.check == "lost":
        items = "".join(f"<li>{e(p)}</li>" for p in c.problems)
        return f'<span class="h-bad">LOST</span><ul class="small">{items}</ul>'
    return f'<span class="{"h-ok" if c.check == "ok" else "h-none"}">{e(c.check)}</span>'


def verdict_cell(c: Claim, links: Links) -> str:
    """The verdict badge (a withdrawn claim: "withdrawn" and its last verdict struck through), with the
    notes `gates status` prints in brief: attempts, supersedes chain, a regime left, shared runs, what did
    not run as designed, stale code and older rules (long lists as a count: the contract page has them)."""
    if c.withdrawn:
        out = f'<span class="v v-withdrawn">withdrawn</span> <s class="small">{e(c.verdict or "-")}</s>'
    else:
        out = verdict_badge(c.verdict)
    notes = []
    if c.attempts > 1:
        earlier = "; ".join(_clip(x) for x in c.earlier)
        notes.append(f'<span class="attempts">attempt {e(c.attempts)}; earlier: {earlier}</span>')
    if c.superseded_by:
        notes.append(
            "superseded by "
            + ", ".join(f'<a href="{e(links.contract(x))}">{e(x)}</a>' for x in c.superseded_by)
        )
    if c.supersedes:
        notes.append(
            f'supersedes <a href="{e(links.contract(c.supersedes))}">{e(c.supersedes)}</a>'
        )
    if c.regime_left:
        notes.append(
            f'<span class="regime-left" title="{e(c.regime_left.note)}">'
            f"{_regime_left_brief(c.regime_left, links)}</span>"
        )
    if c.shared_runs:
        others = ", ".join(
            f'<a href="{e(links.contract(x))}">{e(x)}</a> ({len(runs)})'
            for x, runs in sorted(c.shared_runs.items())
        )
        n = len(c.shared_runs)
        notes.append(
            f'<span class="shared" title="{e(describe_shared(c.shared_runs))}">shares runs with {n} other '
            f"contract{'s' if n != 1 else ''}: {others}</span>"
        )
    if c.not_run:
        notes.append(f'<span class="not-run">not run as designed: {e(", ".join(c.not_run))}</span>')
    if c.beyond_ceiling:
        notes.append(
            f'<span class="beyond-ceiling">bar beyond the ceiling: {e(", ".join(c.beyond_ceiling))}</span>'
        )
    if c.tuning_edges:
        notes.append(
            f'<span class="tuning-edge">tuning stopped at an edge: {_list_brief(c.tuning_edges)}</span>'
        )
    if c.stale:
        study = [f for f in c.stale_files if not f.startswith("gates/")]
        platform = len(c.stale_files) - len(study)
        notes.append(
            f'<span class="stale">stale: {e(", ".join(study) or "")}'
            f"{e(', ' if study and platform else '')}{e(f'{platform} in gates/' if platform else '')}</span>"
        )
    if c.rule_flags:
        notes.append(f'<span class="older">recorded under older rules ({len(c.rule_flags)})</span>')
    return out + "".join(f'<br><span class="small">{n}</span>' for n in notes)


INDEX_TEXT = 160  # characters of one free-text note (an attempt's reason) shown on the index


def _clip(text: str, limit: int = INDEX_TEXT) -> str:
    """Escaped text, cut to `limit` characters on the index (the whole text in its title)."""
    text = str(text)
    if len(text) <= limit:
        return e(text)
    return f'<span title="{e(text)}">{e(text[: limit - 3])}...</span>'


def _list_brief(items: list[str], shown: int = 3) -> str:
    more = f" and {len(items) - shown} more" if len(items) > shown else ""
    return e(", ".join(items[:shown]) + more)


def _regime_left_brief(left, links: Links) -> str:
    """'regime left: sibling X superseded by Y', linked (gates.siblings.RegimeLeft)."""
    return (
        f'regime left: sibling <a href="{e(links.contract(left.sibling))}">{e(left.sibling)}</a> superseded by '
        f'<a href="{e(links.contract(left.superseded_by))}">{e(left.superseded_by)}</a> in another regime'
    )


def history_notes(c: Claim, links: Links) -> str:
    """A contract page's notes on its history and code: attempts, withdrawal, supersedes chain, a regime
    left by a superseded sibling, stale code with the files, rules the recorded contract predates."""
    out = []
    if c.attempts > 1:
        items = "".join(f"<li>{e(x)}</li>" for x in c.earlier)
        out.append(
            f'<div class="note attempts">Attempt {e(c.attempts)} at this claim in the claims history '
            f'(runs/INDEX.jsonl); earlier:<ul class="small">{items}</ul></div>'
        )
    if c.withdrawn:
        out.append(
            f'<p class="lost">Withdrawn: {e(c.withdrawal or "")}. The claim is no longer made; its record '
            f"stays in runs/INDEX.jsonl (and its evidence, where kept, below).</p>"
        )
    if c.superseded_by:
        links_ = ", ".join(f'<a href="{e(links.contract(x))}">{e(x)}</a>' for x in c.superseded_by)
        out.append(
            f'<p class="note">Superseded by {links_}: a newer version of this contract. This claim stays '
            f"recorded as it was.</p>"
        )
    if c.supersedes:
        out.append(
            f'<p class="small">Supersedes <a href="{e(links.contract(c.supersedes))}">{e(c.supersedes)}</a>.</p>'
        )
    if c.regime_left:
        out.append(f'<p class="note regime-left">Regime left: {e(c.regime_left.note)}.</p>')
    if c.stale:
        items = "".join(f"<li><code>{e(f)}</code></li>" for f in c.stale_files)
        how = f" ({e(c.stale_note)})" if c.stale_note else ""
        out.append(
            f'<div class="note stale">Stale: the code this evidence was computed with has changed since{how}; '
            f'<code>gates verify --strict-code</code> fails on it. Changed files:<ul class="small">{items}</ul></div>'
        )
    if c.rule_flags:
        items = "".join(f"<li>{e(f)}</li>" for f in c.rule_flags)
        out.append(
            f'<div class="note older">Recorded under older rules (a new version that follows them is how '
            f'this claim is brought up to date):<ul class="small">{items}</ul></div>'
        )
    return "".join(out)


def index_page(claims: list[Claim], links: Links, footer: str) -> str:
    counts = {}
    for c in claims:
        shown = "withdrawn" if c.withdrawn else (c.verdict or "pending")
        counts[shown] = counts.get(shown, 0) + 1
    lost = sum(c.check == "lost" for c in claims)
    summary = ", ".join(f"{n} {v}" for v, n in sorted(counts.items()))
    rows = "".join(
        f'<tr id="row-{e(c.contract_id)}"><td class="id">'
        f'<a href="{e(links.contract(c.contract_id))}">{e(c.contract_id)}</a></td>'
        f'<td>{e(c.claim)}</td><td class="verdict">{verdict_cell(c, links)}</td>'
        f'<td class="date">{e((c.created_at or "-")[:10])}</td><td>{hash_cell(c.hash_status)}</td>'
        f"<td>{check_cell(c)}</td></tr>"
        for c in claims
    )
    lost_note = (
        f'<p class="lost">{lost} claim{"s" if lost != 1 else ""} lost {"their" if lost != 1 else "its"} '
        f"evidence (see the verify column).</p>"
        if lost
        else ""
    )
    body = (
        f"<h1>Claims</h1><p>{len(claims)} contracts: {e(summary) or 'none'}.</p>{lost_note}"
        f'<table class="claims"><thead><tr><th>contract</th><th>claim</th><th>verdict</th><th>recorded</th>'
        f"<th>contract hash</th><th>verify</th></tr></thead><tbody>{rows}</tbody></table>"
        f'<p class="small">Hash: the contract file\'s sha256 against the one its evidence recorded. Check: '
        f"the evidence, the contract and the claims history, as <code>gates status</code> checks them; "
        f"<code>gates verify</code> (run in CI) also re-derives every verdict from the recorded "
        f"per-seed metrics.</p>"
    )
    return page("Claims", body, links, footer)


def not_found_page(what: str, links: Links, footer: str) -> str:
    return page(
        "Not found",
        f'<h1>Not found</h1><p>{e(what)}</p><p><a href="{e(links.index)}">All claims</a></p>',
        links,
        footer,
    )


def _num(x) -> str:
    return svg.fmt(x) if finite(x) else ("-" if x is None else e(x))


def mlflow_run_url(ui: str, experiment_id, run_id) -> str:
    return f"{ui.rstrip('/')}/#/experiments/{quote(str(experiment_id), safe='')}/runs/{quote(str(run_id), safe='')}"


def contract_page(view: ContractView, links: Links, mlflow_ui: str, footer: str) -> str:
    c, ev = view.claim, view.evidence
    parts = [
        f'<p class="small"><a href="{e(links.index)}">All claims</a></p>',
        f"<h1>{e(c.contract_id)} {verdict_badge('withdrawn' if c.withdrawn else c.verdict)}</h1>",
        f"<blockquote>{e(c.claim)}</blockquote>",
        f"<p>Contract hash: {hash_cell(c.hash_status)}; verify: {check_cell(c)}</p>",
        history_notes(c, links),
    ]
    if ev is None:
        if not c.withdrawn:
            parts.append(
                f'<p class="note">No evidence yet: run <code>gates run contracts/{e(c.contract_id)}.yaml</code>.</p>'
            )
        return page(c.contract_id, "".join(parts), links, footer)
    parts.append(
        f'<p class="small">Source: {e(ev.written("source", "-"))}<br>Study '
        f"<code>{e(ev.written('study', '-'))}</code>, recorded {e(ev.created_at)}</p>"
    )
    parts += [
        _attempt(ev),
        _design(ev, c, links),
        _reasons(ev),
        _not_run(ev),
        _beyond_ceiling(ev),
        _conditions(ev),
        _controls(ev),
        _lost(ev),
        _curves(view),
        _gate5(ev),
        _runs(view, mlflow_ui),
        _provenance(ev, mlflow_ui),
    ]
    return page(c.contract_id, "".join(parts), links, footer)


def _attempt(ev: Evidence) -> str:
    """The evidence's own attempt record, as verdict.md has it (gates.attempts.describe): its number, why
    it was recorded, and each earlier attempt with its verdict and why (none for a lone first attempt)."""
    attempt = ev.attempt
    if attempt is None or attempt.number <= 1 and not attempt.earlier:
        return ""
    because = f", recorded because: {e(attempt.reason)}" if attempt.reason else ""
    items = []
    for a in attempt.earlier:
        head = (
            f"attempt {e(a.number)}: {verdict_badge(a.verdict or 'pending')}, recorded "
            f"{e(a.recorded or '?')}"
        )
        if a.reason:
            head += f" (because: {e(a.reason)})"
        if a.withdrawn:
            head += f"; withdrawn: {e(a.withdrawn)}"
        why = "".join(f"<li>{e(w)}</li>" for w in a.why)
        items.append(f"<li>{head}" + (f'<ul class="small">{why}</ul>' if why else "") + "</li>")
    return (
        f'<h2>Attempts</h2><p class="attempt">Attempt {e(attempt.number)} at this claim{because}; '
        f'earlier:</p><ul class="attempts">{"".join(items)}</ul>'
    )


def _design(ev: Evidence, c: Claim, links: Links) -> str:
    """What the contract declares about its design, its regime and the runs it shares, beside the verdict
    (verdict.md's "Design"); shared runs as `gates status` finds them now (every recorded claim)."""
    items = []
    if ev.design is not None:
        design = ev.design
        if design.factor:
            items.append(
                f"factor under test: <code>{e(', '.join(design.factor))}</code> (the arm config "
                f"fields compared arms differ in)"
            )
        items += [
            f"also differs between compared arms: <code>{e(k)}</code>: {e(why)}"
            for k, why in design.differences.items()
        ]
        items += [
            f'<span class="blind"><code>{e(arm)}</code> fails by construction: {e(why)}</span>'
            for arm, why in design.blind.items()
        ]
        if design.no_convergence:
            items.append(f"runs not judged for convergence: {e(design.no_convergence)}")
    if ev.regime:
        items.append(f'<span class="regime">regime: {e(describe_regime(ev.regime))}</span>')
    if c.shared_runs:
        pages = ", ".join(
            f'<a href="{e(links.contract(x))}">{e(x)}</a>' for x in sorted(c.shared_runs)
        )
        items.append(f'<span class="shared">{e(describe_shared(c.shared_runs))}</span> ({pages})')
    if not items:
        return ""
    return '<h2>Design</h2><ul class="design">' + "".join(f"<li>{x}</li>" for x in items) + "</ul>"


def _reasons(ev: Evidence) -> str:
    out = "<h2>Why</h2><ul>" + "".join(f"<li>{e(r)}</li>" for r in ev.reasons) + "</ul>"
    if ev.settle:
        out += (
            "<p>What would settle it:</p><ul>"
            + "".join(f"<li>{e(s)}</li>" for s in ev.settle)
            + "</ul>"
        )
    edges = ev.tuning_edges
    if edges:
        out += (
            '<div class="note tuning-edges">Tuning stopped at the edge of its search (every decision condition '
            "reading these arms is undetermined):<ul>"
            + "".join(f"<li><code>{e(arm)}</code>: {e(why)}</li>" for arm, why in edges.items())
            + "</ul></div>"
        )
    return out


def _not_run(ev: Evidence) -> str:
    """Arms the decision or a control reads without a completed run: the verdict is invalid."""
    if not ev.not_run:
        return ""
    items = []
    for x in ev.not_run:
        what = x.text or f"{x.completed} of {x.runs} runs completed"
        error = (
            f'<br>first error: <code class="mono">{e(x.first_error)}</code>'
            if x.first_error and x.first_error not in what
            else ""
        )
        settle = f'<br><span class="small">to settle: {e(x.settle)}</span>' if x.settle else ""
        items.append(f"<li><code>{e(x.arm)}</code>: {e(what)}{error}{settle}</li>")
    return (
        '<h2>Did not run as designed</h2><div class="lost not-run">Invalid: an arm the decision or a control '
        "reads has no completed run, so the claim is neither supported nor refuted (failed runs are never "
        f"results).<ul>{''.join(items)}</ul></div>"
    )


def _beyond_ceiling(ev: Evidence) -> str:
    """Conditions whose bar the best possible arm does not reach: they test nothing; invalid."""
    if not ev.beyond_ceiling:
        return ""
    items = "".join(
        f"<li>{e(x.condition)} <code>{e(x.description)}</code>: the best possible arm reaches "
        f"{_num(x.ceiling)}"
        + (f" ({_num(x.min)} to {_num(x.max)})" if finite(x.min) and x.min != x.max else "")
        + f" ({e(x.written('source', '-'))}: {e(x.why)}), which does not clear the bar"
        + (f'<br><span class="small">to settle: {e(x.settle)}</span>' if x.settle else "")
        + "</li>"
        for x in ev.beyond_ceiling
    )
    return (
        '<h2>Bars beyond the ceiling</h2><div class="lost beyond-ceiling">Invalid: a bar beyond what the best '
        f"possible arm reaches tests nothing.<ul>{items}</ul></div>"
    )


def _condition_row(cond: ConditionRecord) -> str:
    values = "<br>".join(
        f"{e(term)}: {', '.join(_num(v) for v in vals)}" for term, vals in cond.values.items()
    )
    interval = f"[{_num(cond.ci_low)}, {_num(cond.ci_high)}]" if cond.ci_low is not None else "-"
    log = '<br><span class="small scale">log scale</span>' if cond.scale == "log" else ""
    control = f' <span class="small">({e(cond.control)} control)</span>' if cond.control else ""
    estimand = (
        f'<br><span class="small estimand">estimates: {e(cond.estimand)}</span>'
        if cond.estimand
        else ""
    )
    note = f'<br><span class="small">{e(cond.note)}</span>' if cond.note else ""
    reason = f'<br><span class="small">{e(cond.test_reason)}</span>' if cond.test_reason else ""
    interval_svg = svg.condition_interval(cond.as_dict())  # svg draws from plain JSON
    return (
        f"<tr><td>{e(cond.list_name)}[{e(cond.index)}]: <code>{e(cond.description)}</code>{control}"
        f"{estimand}{note}</td>"
        f'<td class="o-{e(cond.outcome)}">{e(cond.outcome)}</td><td>{interval_svg}</td>'
        f'<td class="num">{_num(cond.estimate)}{log}</td><td class="num">{interval}{log}</td>'
        f'<td class="num">{_num(cond.p_hold_adj)}</td><td class="num">{_num(cond.p_fail_adj)}</td>'
        f'<td class="small adjustment">{e(cond.adjustment or "-")}</td>'
        f'<td>{e(cond.test)}{reason}</td><td class="small">{values}</td></tr>'
    )


CONDITION_HEAD = (
    "<thead><tr><th>condition</th><th>outcome</th><th>interval against the bar</th><th>estimate</th>"
    "<th>interval</th><th>p(holds) adj</th><th>p(fails) adj</th><th>adjusted</th><th>test</th>"
    "<th>per-seed values</th></tr></thead>"
)


def families(ev: Evidence) -> str:
    """How the conditions' p-values were compared with alpha, by the evidence's correction (verdict.md's
    wording, gates.ledger._families)."""
    alpha, correction = _num(ev.settings.alpha), ev.settings.correction
    if correction == "iut+holm":
        refute = sum(1 for c in ev.conditions if c.list_name in ("supported_if", "refuted_if"))
        return (
            f"Every supported_if condition must hold, so each is tested at &alpha; = {alpha} with no correction "
            f"(an intersection-union test: p(holds) is unadjusted); the claim is refuted when any refuted_if "
            f"condition holds or any supported_if fails, and those {refute} ways to refute are Holm-corrected "
            f"at &alpha; = {alpha}."
            + (" Controls are intersection-union tests at &alpha; too." if ev.controls else "")
        )
    if correction == "holm":
        return f"Holm-corrected p-values across all {len(ev.conditions)} conditions (&alpha; = {alpha})."
    if correction == "none":
        return "Exact evaluation: each condition holds or fails on every seed (no p-values)."
    return f"p-values adjusted by {e(correction)} (&alpha; = {alpha})."


def _conditions(ev: Evidence) -> str:
    rows = "".join(_condition_row(cond) for cond in ev.conditions)
    log = any(c.scale == "log" for c in ev.conditions + ev.controls)
    scale = (
        " A log-scale condition's estimate and interval are on the log scale: exp(estimate) is the factor by "
        "which the bar is cleared."
        if log
        else ""
    )
    return (
        f'<h2>Conditions</h2><p class="small families">{families(ev)}</p><p class="small">Each condition\'s '
        f"effect beyond its bar (threshold or margin; &gt; 0 means it holds), what it estimates, with its "
        f"two-sided interval at 1 &minus; 2&alpha; (an exact test shows the per-seed range of the effect); under "
        f"each test, why it was used.{scale} The black line is the bar; green side: holds.</p>"
        f'<table class="conditions">{CONDITION_HEAD}<tbody>{rows}</tbody></table>'
    )


def _controls(ev: Evidence) -> str:
    controls = ev.controls
    if not controls:
        return ""
    return (
        '<h2>Controls</h2><p class="small">Each must hold for the experiment to be interpretable (each tested at '
        "&alpha;: all must hold, an intersection-union test; a control fails in the controls' own Holm family); "
        "one that fails or cannot be settled makes the verdict invalid.</p>"
        f'<table class="controls">{CONDITION_HEAD}<tbody>{"".join(_condition_row(c) for c in controls)}</tbody></table>'
    )


def _curves(view: ContractView) -> str:
    ev, contract = view.evidence, view.contract
    out = ["<h2>Learning curves</h2>"]
    if view.store_note:
        out.append(f'<p class="note">{e(view.store_note)}</p>')
    if not view.histories:
        return "".join(out)
    arms = list(ev.settings.arm_configs) or sorted({a for a, _ in view.histories})
    halts = [(r.arm, r.seed) for r in ev.runs if r.status == "halted"]
    if contract is None:
        out.append(
            '<p class="note">The contract file is missing or was edited after the evidence: decision '
            "thresholds and stop rules are not drawn.</p>"
        )
    for metric in view.metrics:
        thresholds, futility = [], []
        if contract is not None:
            from gates.contract import Threshold

            thresholds = [
                (cond.arm, cond.value)
                for _, _, cond in contract.conditions()
                if isinstance(cond, Threshold) and cond.metric == metric
            ]
            futility = [r.model_dump() for r in contract.stop_rules.futility if r.metric == metric]
        out.append(
            f"<figure>{svg.learning_curves(metric, arms, view.histories, thresholds, futility, halts)}"
        )
        notes = [_rule_text(r) for r in futility] + [f"{e(a)} seed {e(s)} halted" for a, s in halts]
        conv = contract.convergence if contract is not None else None
        if conv is not None and conv.metric == metric:
            still = [f"{r.arm} seed {r.seed}" for r in ev.runs if r.converged is False]
            notes.append(
                e(
                    f"convergence: over the last {conv.window} steps an improvement above "
                    f"{conv.max_rel_improvement:.2%} means not converged; still improving: "
                    f"{', '.join(still) or 'none'}"
                )
            )
        if notes:
            out.append(f'<figcaption class="small">{"; ".join(notes)}</figcaption>')
        out.append("</figure>")
    return "".join(out)


def _rule_text(r: dict) -> str:
    bar = (
        f"worse than {svg.fmt(r['worse_than'])}"
        if r.get("worse_than") is not None
        else f"behind the best other arm by more than {svg.fmt(r['behind_best_other_by'])}"
    )
    arms = f" (arms: {', '.join(r['arms'])})" if r.get("arms") else ""
    return e(
        f"futility: {r['metric']} at step {r['at_step']}: {bar} and improving by less than "
        f"{svg.fmt(r['min_rel_improvement'])} over {r['window']} steps{arms}"
    )


def _gate5(ev: Evidence) -> str:
    fp = ev.falsifiable_point
    if fp is None:
        return ""
    op = ">=" if fp.direction == "higher" else "<="
    items = "".join(
        f"<li>seed {e(r.seed)}: {_num(r.value)} at step {e(r.step)}: "
        f"{'met' if r.met else 'not met'}</li>"
        for r in fp.runs
    )
    return (
        f"<h2>Falsifiable point (gate 5)</h2><p><code>{e(fp.arm)}.{e(fp.metric)} {op} "
        f"{_num(fp.threshold)}</code> by step {e(fp.by_step)}</p><ul>{items}</ul>{_predictions(ev)}"
    )


def _predictions(ev: Evidence) -> str:
    """Gate 3's predicted ablation against what was measured (recorded since verdict engine 2)."""
    pred = ev.predictions.predicted_ablation if ev.predictions is not None else None
    if pred is None:
        return ""
    came = {True: "came true", False: "did not come true", None: "not measured"}[pred.came_true]
    side = "above" if pred.direction == "higher" else "below"
    return (
        f"<h2>Predicted ablation (gate 3)</h2><p><code>{e(pred.arm)}.{e(pred.metric)}</code> {side} "
        f"<code>{e(pred.versus)}</code> by at least {_num(pred.predicted_size)}; measured "
        f"{_num(pred.measured_size)}: <strong>{came}</strong></p>"
    )


def _lost(ev: Evidence) -> str:
    if not ev.lost:
        return ""
    items = "".join(
        f"<li>{e(x.arm)}.{e(x.metric)} seed {e(x.seed)}: {e(x.why)}</li>" for x in ev.lost
    )
    return (
        f'<h2>Lost values</h2><p class="small">Seeds without a finite value of a metric a condition reads (a run '
        f"failed, skipped after its arm kept failing, halted or killed); a supported_if condition or a control "
        f'that reads one cannot hold.</p><ul class="lost-values">{items}</ul>'
    )


def _converged_cell(r: RunRecord) -> str:
    """A run's convergence: "-" when not judged (halted, failed), else yes/no with the window's change."""
    if not r.has("converged"):
        return '<td class="small">-</td>'
    conv = r.convergence
    rel = conv.rel_improvement if conv is not None else None
    change = f" ({rel:+.2%} over the last {e(conv.window)} steps)" if rel is not None else ""
    if r.converged:
        return f'<td class="small">yes{change}</td>'
    return (
        f'<td class="o-undetermined" title="still improving at the end of training: every decision condition '
        f'reading this arm is undetermined">not converged{change}</td>'
    )


STATUS_WORDS = {
    "skipped": "not run after its arm kept failing",
    "halted": "halted by a stop rule",
    "failed": "raised an error or returned what its study does not declare",
}
DETAIL_SHOWN = 200  # characters of a run's halt detail shown in the table (the rest folded away)


def _run_detail(r: RunRecord) -> str:
    """Why a run did not complete: its error (where: Type: message) and its halt detail (first line shown,
    the whole text folded away)."""
    parts = []
    error = r.error
    if error is not None and error.type:
        where = f"{error.where}: " if error.where else ""
        parts.append(
            f'<code class="mono error">{e(where)}{e(error.type)}: {e(error.message)}</code>'
        )
    detail = r.halt_detail or ""
    if detail:
        first = detail.splitlines()[0] if detail.strip() else detail
        if len(first) > DETAIL_SHOWN:
            first = first[: DETAIL_SHOWN - 3] + "..."
        parts.append(f'<span class="small halt-detail">{e(first)}</span>')
        if first != detail:
            parts.append(
                f'<details><summary class="small">whole detail</summary><pre class="mono small">{e(detail)}'
                f"</pre></details>"
            )
    return "<br>".join(parts) or "-"


def _runs(view: ContractView, mlflow_ui: str) -> str:
    ev = view.evidence
    exp = ev.mlflow.experiment_id if ev.mlflow is not None else None
    shown = [m for m in view.metrics if any(m in r.metrics for r in ev.runs)]
    head = "".join(f"<th>{e(m)}</th>" for m in shown)
    judged = any(r.has("converged") for r in ev.runs)  # the contract has a convergence rule
    if judged:
        head = "<th>converged</th>" + head
    rows, full = [], []
    for r in ev.runs:
        if r.mlflow_run_id and exp is not None:
            link = (
                f'<a href="{e(mlflow_run_url(mlflow_ui, exp, r.mlflow_run_id))}">'
                f"{e(r.mlflow_run_id[:8])}</a>"
            )
        else:  # a run skipped after its arm kept failing was never started: there is no MLflow run
            link = '<span class="small">none</span>' if not r.mlflow_run_id else "-"
        cells = (_converged_cell(r) if judged else "") + "".join(
            f'<td class="num">{_num(r.metrics.get(m))}</td>' for m in shown
        )
        status = r.status
        words = STATUS_WORDS.get(status)
        status_cell = (
            f'<td class="s-{e(status)}" title="{e(words)}">{e(status)}</td>'
            if words and status != "completed"
            else f"<td>{e(status)}</td>"
        )
        rows.append(
            f'<tr><td>{e(r.arm)}</td><td class="num">{e(r.seed)}</td>{status_cell}'
            f"<td>{e(r.halt_reason or '-')}</td>"
            f'<td class="detail">{_run_detail(r) if status != "completed" else "-"}</td>{cells}'
            f'<td class="num">{_num(r.seconds)}</td><td class="mono">{link}</td></tr>'
        )
        metrics = ", ".join(f"{e(k)}={_num(v)}" for k, v in sorted(r.metrics.items()))
        full.append(
            f'<tr><td>{e(r.arm)}</td><td class="num">{e(r.seed)}</td><td class="small">{metrics or "-"}</td></tr>'
        )
    skipped = sum(r.status == "skipped" for r in ev.runs)
    note = (
        f'<p class="small">{skipped} run{"s were" if skipped != 1 else " was"} skipped: not run after its arm '
        f"kept failing (stop_rules.failures), so there is no MLflow run to open.</p>"
        if skipped
        else ""
    )
    return (
        f'<h2>Runs: final metrics per arm and seed</h2>{note}<table class="runs"><thead><tr><th>arm</th>'
        f"<th>seed</th><th>status</th><th>halt</th><th>error or detail</th>{head}<th>seconds</th>"
        f"<th>MLflow run</th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table><details><summary>every final metric</summary>"
        f"<table><tbody>{''.join(full)}</tbody></table></details>"
    )


def _provenance(ev: Evidence, mlflow_ui: str) -> str:
    from gates.record import signature

    try:
        sig = signature(ev)
    except (KeyError, TypeError):  # a `looks` entry of another shape (the schema does not check it)
        sig = "-"
    ml = ev.mlflow
    parent = (
        f'<a href="{e(mlflow_run_url(mlflow_ui, ml.experiment_id, ml.parent_run_id))}">'
        f"{e(ml.parent_run_id)}</a>"
        if ml is not None and ml.parent_run_id and ml.experiment_id is not None
        else "-"
    )
    tracking, experiment = (
        (ml.written("tracking_uri", "-"), ml.written("experiment_id", "-"))
        if ml is not None
        else ("-", "-")
    )
    s = ev.settings
    rows = [
        ("contract", f"<code>{e(ev.written('contract_path', '-'))}</code>"),
        ("contract sha256", f'<code class="mono">{e(ev.contract_sha256)}</code>'),
        (
            "git commit",
            f"<code>{e(ev.git_commit)}</code>" + (" (dirty)" if ev.git_dirty == "true" else ""),
        ),
        ("code sha256", f"<code>{e(ev.code_sha256)}</code>"),
        (
            "settings",
            e(
                f"alpha {s.alpha}, {s.evaluation} evaluation, {s.correction} "
                f"correction, seeds {s.seeds}, budget {s.budget.as_dict()}"
            ),
        ),
        (
            "MLflow",
            f"{e(tracking)}, experiment {e(experiment)}, parent run {parent}",
        ),
        ("signature", f'<code class="mono">{e(sig)}</code>'),
    ]
    return (
        "<h2>Signature and provenance</h2><dl>"
        + "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in rows)
        + "</dl>"
    )
