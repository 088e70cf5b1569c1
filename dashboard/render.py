"""HTML pages, the same for the live dashboard and the static report (only the links differ).

Every text that comes from a contract, evidence or MLflow goes through `e()` (HTML-escaped); the
pages carry a Content-Security-Policy that allows no script at all.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from urllib.parse import quote

from gates.dashboard import svg
from gates.dashboard.board import (
    FLAGS,
    SORTS,
    VERDICTS,
    BoardQuery,
    Entry,
    flags_of,
    select,
    shown_verdict,
)
from gates.dashboard.data import Claim, ContractView, finite
from gates.dashboard.diff import ADDED, REMOVED, shown
from gates.dashboard.svg import e
from gates.entities import ConditionRecord, RunRecord
from gates.record import (
    ARMS_VIEW,
    OTHER_SIDE,
    ConditionBar,
    ConditionRow,
    Evidence,
    condition_difference,
    condition_label,
    condition_rows,
    condition_sentence,
    converged_cell,
    describe_regime,
    describe_shared,
    holding_side,
    interval_text,
    term_short_names,
    term_values,
)

# form-action 'self': the board's filter form submits (GET) to the dashboard itself, nowhere else
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'self'"


@dataclass(frozen=True)
class Links:
    """Where the index and a contract page are, seen from the page being rendered; `served`: pages
    answered by `gates dashboard`, whose board filters by query string (static files cannot)."""

    index: str
    contract_fmt: str
    served: bool = False

    def contract(self, contract_id: str) -> str:
        return self.contract_fmt.format(quote(contract_id, safe=""))


SERVER = Links("/", "/contract/{}", served=True)
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
svg .g5{stroke-dasharray:8 3 2 3;stroke-width:2}svg .conv{fill:#ffd54f;fill-opacity:.22;stroke:none}
.m{display:inline-block;padding:1px 7px;border-radius:9px;font-weight:600;color:#fff;white-space:nowrap}
.m-supports,.m-sound{background:#2e7d32}.m-refutes{background:#c62828}.m-undetermined{background:#ef8f00}
.m-invalidates{background:#6d4c41}tr.moot td{color:#777}tr.moot .m{opacity:.55}
td.m-cell{min-width:130px}.landed{display:block;font-size:12px;margin-top:2px}
.wide{overflow-x:auto;max-width:100%}table.conditions td,table.controls td{font-size:13px}
td.seeds{min-width:140px;max-width:240px;overflow-wrap:anywhere}td.test{min-width:150px}
td.label,td.metric{overflow-wrap:anywhere;min-width:80px}.lbl{white-space:nowrap}
td.verdict{max-width:340px}details.shared summary{cursor:pointer}
.charts{display:flex;flex-wrap:wrap;gap:8px 16px}.charts figure{margin:0;width:600px}
form.board{background:#fff;border:1px solid #ddd;padding:8px 12px;margin:8px 0;display:flex;flex-wrap:wrap;
gap:6px 16px;align-items:center}form.board label{white-space:nowrap}form.board input[type=search]{width:260px}
tr.versions>td{background:#f5f5f5;padding:2px 8px}tr.versions table{margin:4px 0 4px 16px}
.flag{display:inline-block;padding:0 6px;border-radius:8px;font-size:11px;border:1px solid #90a4ae;color:#37474f}
.flag-certified{border-color:#2e7d32;color:#2e7d32}.flag-problem{border-color:#c62828;color:#c62828}
table.diff td.old{background:#fbe9e7}table.diff td.new{background:#e8f5e9}table.diff td{max-width:520px}
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
    out += flag_badges(c)
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
    if c.family:
        notes.append(f'<span class="family">{e(c.family)}</span>')
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
        notes.append(  # folded: the list is long where a claim shares runs with several
            f'<details class="shared" title="{e(describe_shared(c.shared_runs))}"><summary>shares '
            f"runs with {n} other contract{'s' if n != 1 else ''}</summary>{others}</details>"
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
    if c.stale:  # in brief: the files are on the contract page (and in the title)
        n = len(c.stale_files)
        count = f" ({n} file{'s' if n != 1 else ''})" if n else ""
        notes.append(
            f'<span class="stale" title="{e(", ".join(c.stale_files))}">stale{e(count)}</span>'
        )
    if c.rule_flags:
        notes.append(f'<span class="older">recorded under older rules ({len(c.rule_flags)})</span>')
    return out + "".join(f'<div class="small">{n}</div>' for n in notes)


def flag_badges(c: Claim) -> str:
    """Small badges beside a verdict: certified, and each problem code a claim that is not lost
    carries (a lost claim lists its problems in the verify column)."""
    out = []
    if c.certified:
        out.append(f'<span class="flag flag-certified" title="{e(c.certified)}">certified</span>')
    if c.check != "lost":
        for p in c.problems:
            code = getattr(p, "code", "problem")
            out.append(f'<span class="flag flag-problem" title="{e(p)}">{e(code)}</span>')
    return "".join(f" {x}" for x in out)


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
    """'regime left: sibling X superseded by Y', linked (gates.record.RegimeLeft)."""
    return (
        f'regime left: sibling <a href="{e(links.contract(left.sibling))}">{e(left.sibling)}</a> superseded by '
        f'<a href="{e(links.contract(left.superseded_by))}">{e(left.superseded_by)}</a> in another regime'
    )


def record_flags(c: Claim) -> str:
    """What the check says of the claim, field by field: the board's flags, its attempts on the
    claims history, its problems with their codes (`unlinked_successor` and the like, lost or not),
    its certification, staleness and the rules it predates (their details follow)."""
    flags = flags_of(c)
    rows = [
        (
            "flags",
            " ".join(f'<span class="flag flag-{e(f)}">{e(f)}</span>' for f in flags) or "none",
        ),
        (
            "attempts",
            f"{e(c.attempts)} on the claims history (runs/INDEX.jsonl)"
            + (
                '<ul class="small attempts">'
                + "".join(f"<li>earlier: {e(x)}</li>" for x in c.earlier)
                + "</ul>"
                if c.earlier
                else ""
            ),
        ),
    ]
    if c.problems:
        items = "".join(
            f'<li><code class="code">{e(getattr(p, "code", "-"))}</code> {e(p)}</li>'
            for p in c.problems
        )
        rows.append(("problems", f'<ul class="small problems">{items}</ul>'))
    rows.append(
        (
            "certified",
            e(c.certified)
            if c.certified
            else "no: its runs were not re-run under today's code (<code>gates certify</code>)",
        )
    )
    if c.stale:
        n = len(c.stale_files)
        rows.append(("stale", f"yes: {n} changed file{'s' if n != 1 else ''} (listed below)"))
    if c.rule_flags:
        rows.append(("older rules", f"{len(c.rule_flags)} (listed below)"))
    return '<dl class="record">' + "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in rows) + "</dl>"


def history_notes(c: Claim, links: Links) -> str:
    """A contract page's notes on its history and code: withdrawal, supersedes chain, a regime left by
    a superseded sibling, stale code with the files, rules the recorded contract predates."""
    out = []
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
    if c.family:
        out.append(f'<p class="small family">Claim family: {e(c.family)}.</p>')
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


CLAIM_SHOWN = 180  # characters of a claim's text on the board (the whole text in its title)


def index_page(
    claims: list[Claim], links: Links, footer: str, query: BoardQuery = BoardQuery()
) -> str:
    """The board: counts over every claim, the filter form (served pages only: a static file has no
    server to filter it), and the rows the query selects, superseded versions folded under the
    newest version of their chain."""
    counts = {}
    for c in claims:
        shown = shown_verdict(c)
        counts[shown] = counts.get(shown, 0) + 1
    lost = sum(c.check == "lost" for c in claims)
    summary = ", ".join(f"{n} {v}" for v, n in sorted(counts.items()))
    entries = select(claims, query)
    listed = len(entries) + sum(len(x.folded) for x in entries)
    folded = sum(len(x.folded) for x in entries)
    what = f"{listed} of {len(claims)} contracts match" if query.narrows else "every contract"
    fold_note = (
        f"; {folded} superseded version{'s' if folded != 1 else ''} folded under "
        f"{'their successors' if folded != 1 else 'its successor'}"
        if folded
        else ""
    )
    rows = "".join(_board_row(x, links) for x in entries)
    lost_note = (
        f'<p class="lost">{lost} claim{"s" if lost != 1 else ""} lost {"their" if lost != 1 else "its"} '
        f"evidence (see the verify column).</p>"
        if lost
        else ""
    )
    board = (
        _board_form(claims, counts, query, links)
        if links.served
        else '<p class="small">This static copy lists every claim; <code>gates dashboard</code> '
        "serves the same board with search, filters (verdict, study, flags) and sorting.</p>"
    )
    body = (
        f"<h1>Claims</h1><p>{len(claims)} contracts: {e(summary) or 'none'}.</p>{lost_note}{board}"
        f'<p class="small listed">Listed: {e(what)}{e(fold_note)}.</p>'
        f'<table class="claims"><thead><tr><th>contract</th><th>claim</th><th>verdict</th>'
        f"<th>recorded</th><th>contract hash</th><th>verify</th></tr></thead><tbody>{rows}</tbody>"
        f"</table>"
        f'<p class="small">Hash: the contract file\'s sha256 against the one its evidence recorded. Check: '
        f"the evidence, the contract and the claims history, as <code>gates status</code> checks them; "
        f"<code>gates verify</code> (run in CI) also re-derives every verdict from the recorded "
        f"per-seed metrics.</p>"
    )
    return page("Claims", body, links, footer)


def _claim_row(c: Claim, links: Links) -> str:
    return (
        f'<tr id="row-{e(c.contract_id)}"><td class="id">'
        f'<a href="{e(links.contract(c.contract_id))}">{e(c.contract_id)}</a>'
        f'<br><span class="small study">{e(c.study or "-")}</span></td>'
        f'<td>{_clip(c.claim, CLAIM_SHOWN)}</td><td class="verdict">{verdict_cell(c, links)}</td>'
        f'<td class="date">{e((c.created_at or "-")[:10])}</td><td>{hash_cell(c.hash_status)}</td>'
        f"<td>{check_cell(c)}</td></tr>"
    )


def _board_row(entry: Entry, links: Links) -> str:
    """A claim's row and, in a row of their own under it, its superseded versions folded away."""
    out = _claim_row(entry.claim, links)
    if entry.folded:
        n = len(entry.folded)
        inner = "".join(_claim_row(c, links) for c in entry.folded)
        out += (
            f'<tr class="versions" id="versions-{e(entry.claim.contract_id)}"><td colspan="6">'
            f'<details><summary class="small">{n} earlier version{"s" if n != 1 else ""} '
            f"({e(', '.join(c.contract_id for c in entry.folded))})</summary>"
            f'<table class="claims folded"><tbody>{inner}</tbody></table></details></td></tr>'
        )
    return out


def _board_form(
    claims: list[Claim], verdicts: dict[str, int], query: BoardQuery, links: Links
) -> str:
    """The board's GET form (each verdict with its count): submitting it loads the board with its
    query string."""

    def options(values: list[str], chosen: str, everything: str, counts: dict | None = None) -> str:
        out = [f'<option value=""{"" if chosen else " selected"}>{e(everything)}</option>']
        for v in values:
            n = f" ({counts.get(v, 0)})" if counts is not None else ""
            out.append(
                f'<option value="{e(v)}"{" selected" if v == chosen else ""}>{e(v)}{n}</option>'
            )
        return "".join(out)

    studies = sorted({c.study for c in claims if c.study})
    flags = "".join(
        f'<label><input type="checkbox" name="flag" value="{e(f)}"'
        f"{' checked' if f in query.flags else ''}> {e(words)}</label>"
        for f, words in FLAGS.items()
    )
    sorts = "".join(
        f'<option value="{e(k)}"{" selected" if k == query.sort else ""}>{e(words)}</option>'
        for k, words in SORTS.items()
    )
    return (
        f'<form class="board" method="get" action="{e(links.index)}" role="search">'
        f'<label>search <input type="search" name="q" value="{e(query.text)}" '
        f'placeholder="id or claim text"></label>'
        f'<label>verdict <select name="verdict">{options(list(VERDICTS), query.verdict, "any", verdicts)}'
        f"</select></label>"
        f'<label>study <select name="study">{options(studies, query.study, "any")}</select></label>'
        f"<span>{flags}</span>"
        f'<label>sort <select name="sort">{sorts}</select></label>'
        f'<button type="submit">apply</button> <a href="{e(links.index)}">clear</a></form>'
    )


def not_found_page(what: str, links: Links, footer: str) -> str:
    return page(
        "Not found",
        f'<h1>Not found</h1><p>{e(what)}</p><p><a href="{e(links.index)}">All claims</a></p>',
        links,
        footer,
    )


def _num(x) -> str:
    return svg.fmt(x) if finite(x) else ("-" if x is None else e(x))


# MLflow 3.17's UI shows every page in the mode of its global GenAI / Model training switch (GenAI
# unless switched), whatever the experiment's declared kind; the URL parameter sets it
ML_VIEW = "?workflowType=machine_learning"


def mlflow_run_url(ui: str, experiment_id, run_id) -> str:
    return (
        f"{ui.rstrip('/')}/#/experiments/{quote(str(experiment_id), safe='')}"
        f"/runs/{quote(str(run_id), safe='')}{ML_VIEW}"
    )


def mlflow_arms_url(ui: str, experiment_id) -> str:
    """The experiment's arms view (written by `gates run`: the arm x seed runs grouped by arm, the
    decision's metrics charted), opened in the chart view."""
    return (
        f"{ui.rstrip('/')}/#/experiments/{quote(str(experiment_id), safe='')}/runs{ML_VIEW}"
        f"&viewStateShareKey={ARMS_VIEW}&compareRunsMode=CHART"
    )


def contract_page(view: ContractView, links: Links, mlflow_ui: str, footer: str) -> str:
    c, ev = view.claim, view.evidence
    parts = [
        f'<p class="small"><a href="{e(links.index)}">All claims</a></p>',
        f"<h1>{e(c.contract_id)} {verdict_badge('withdrawn' if c.withdrawn else c.verdict)}</h1>",
        f"<blockquote>{e(c.claim)}</blockquote>",
        f"<p>Contract hash: {hash_cell(c.hash_status)}; verify: {check_cell(c)}</p>",
        record_flags(c),
        history_notes(c, links),
        _changes(view, links),
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
        _controls(ev),
        _conditions(ev),
        _lost(ev),
        _curves(view),
        _gate5(ev),
        _runs(view, mlflow_ui),
        _provenance(ev, mlflow_ui),
    ]
    return page(c.contract_id, "".join(parts), links, footer)


def _changes(view: ContractView, links: Links) -> str:
    """What changed from the contract this one supersedes, field by field (old -> new)."""
    before = view.predecessor
    if before is None:
        return ""
    head = (
        f'<h2>Changes from <a href="{e(links.contract(before.contract_id))}">'
        f"{e(before.contract_id)}</a></h2>"
    )
    if before.note:
        return f'{head}<p class="note">No comparison: {e(before.note)}</p>'
    if not before.changes:
        return f"{head}<p>The two contract files hold the same fields and values.</p>"
    rows = "".join(
        f'<tr class="{e(x.kind)}"><td><code>{e(x.path)}</code></td><td>{e(x.kind)}</td>'
        f'<td class="old">{e(shown(x.old)) if x.kind != ADDED else ""}</td>'
        f'<td class="new">{e(shown(x.new)) if x.kind != REMOVED else ""}</td></tr>'
        for x in before.changes
    )
    return (
        f'{head}<p class="small">The two contract files\' YAML compared field by field '
        f"({len(before.changes)} change{'s' if len(before.changes) != 1 else ''}).</p>"
        f'<div class="wide"><table class="diff"><thead><tr><th>field</th><th>change</th>'
        f"<th>{e(before.contract_id)}</th><th>this contract</th></tr></thead><tbody>{rows}"
        f"</tbody></table></div>"
    )


def _attempt(ev: Evidence) -> str:
    """The evidence's own attempt record, as verdict.md has it (gates.record._attempts.describe): its number, why
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


def _arms(ev: Evidence) -> list[str]:
    return list(ev.settings.arm_configs)


def _condition_row(row: ConditionRow, moot: bool) -> str:
    """One condition (or a supported_if condition with its refuted_if mirror) as a table row: what it
    compares (arm, metric, bar), what its result means for the claim (coloured by that, not by holds
    or fails), the arms' values apart from the margin beyond the bar, the interval against the bar,
    the test and the per-seed values."""
    first, bar, meaning = row.first, row.bar, row.meaning
    names = term_short_names(first, bar)
    labels = " + ".join(
        f'<span class="lbl" title="{e(r.description)}">{e(condition_label(r))}</span>'
        for r in row.records
    )
    kind = e(first.kind or "-") + (f"; {e(first.control)} control" if first.control else "")
    estimand = (
        f'<br><span class="small estimand">estimates: {e(first.estimand)}</span>'
        if first.estimand
        else ""
    )
    landed = row.landed if row.merged else condition_sentence(first)
    moot_note = (
        '<br><span class="small">does not decide: the verdict is invalid</span>' if moot else ""
    )
    log = '<br><span class="small scale">log scale</span>' if first.scale == "log" else ""
    interval = e(interval_text(first))
    right = holding_side(first)
    interval_svg = svg.condition_interval(
        first.as_dict(),  # svg draws from plain JSON
        colour=svg.MEANING_COLOUR[meaning],
        right=right,
        left=OTHER_SIDE[right],
    )
    arms, metrics = _terms_cells(bar)
    mirror = ""
    if row.merged:
        # the mirror's operator and bar; all of it where it names the terms the other way round
        head, other = first.description.split(" ", 1)[0], row.records[1].description
        mirror = other[len(head) + 1 :] if other.startswith(head + " ") else other
        mirror = f'<br><span class="small mirror">mirror: <code>{e(mirror)}</code></span>'
    return (
        f'<tr class="{"moot" if moot else ""}" data-meaning="{e(meaning)}">'
        f'<td class="label">{labels}<br><span class="small kind">{kind}</span>{estimand}</td>'
        f'<td class="m-cell"><span class="m m-{e(meaning)}">{e(meaning)}</span>'
        f'<span class="landed">{e(landed)}</span>{moot_note}</td>'
        f'<td class="arm">{arms}</td><td class="metric">{metrics}</td>'
        f'<td class="bar"><code>{e(_bar_text(bar))}</code>{mirror}</td>'
        f'<td class="num value">{_values_cell(first, names)}</td>'
        f'<td class="num margin">{_signed(first.estimate)}{log}</td>'
        f'<td>{interval_svg}<br><span class="small interval">{interval}</span>{log}</td>'
        f'<td class="small test">{_test_cell(row)}</td>'
        f'<td class="small seeds">{_seeds_cell(first, names)}</td></tr>'
    )


def _terms_cells(bar: ConditionBar) -> tuple[str, str]:
    """(arm cell, metric cell): a threshold's arm; a compare's arm and the arm it is compared with;
    a trend's arms in order."""
    arms = list(dict.fromkeys(a for a, _ in bar.terms))
    metrics = list(dict.fromkeys(m for _, m in bar.terms))
    joint = " &gt; " if bar.op is None else " vs "
    return (
        joint.join(f"<code>{e(a)}</code>" for a in arms) or "-",
        " vs ".join(f"<code>{e(m)}</code>" for m in metrics) or "-",
    )


def _bar_text(bar: ConditionBar) -> str:
    return f"{bar.op} {bar.bar}" if bar.op else "monotone trend"


def _signed(x) -> str:
    if not finite(x):
        return _num(x)
    return ("+" if x > 0 else "") + svg.fmt(x)


def _values_cell(record: ConditionRecord, names: dict[str, str]) -> str:
    """Each term's value across seeds (its mean; the geometric mean on a log scale), and a compare's
    raw difference (ratio) of the two before any margin."""
    centre = "geometric mean" if record.scale == "log" else "mean"
    values = term_values(record)
    lines = [
        (f'<span class="small">{e(names.get(v.term, v.term))}</span> ' if len(values) > 1 else "")
        + _num(v.centre)
        + (f' <span class="small">({centre} of {v.seeds})</span>' if v.seeds else "")
        for v in values
    ]
    diff = condition_difference(record)
    if diff is not None:
        a, op, b, value = diff
        shown = svg.fmt(value) if op == "/" else _signed(value)
        lines.append(
            f'<span class="small">{e(names.get(a, a))} {op} {e(names.get(b, b))} =</span> {shown}'
        )
    return "<br>".join(lines) or "-"


def _test_cell(row: ConditionRow) -> str:
    """The test, each record's adjusted p-values, and (folded) why the test and how adjusted."""
    first = row.first
    out = [e(first.test)]
    for r in row.records:
        who = f"{e(condition_label(r))}: " if row.merged else ""
        out.append(f"{who}p adj holds {_num(r.p_hold_adj)}, fails {_num(r.p_fail_adj)}")
    more = []
    if first.test_reason:
        more.append(e(first.test_reason))
    if first.note:
        more.append(e(first.note))
    for r in row.records:
        who = f"{e(condition_label(r))}: " if row.merged else ""
        more.append(f'<span class="adjustment">{who}adjusted: {e(r.adjustment or "-")}</span>')
    return "<br>".join(out) + (
        f"<details><summary>why, how adjusted</summary>{'<br>'.join(more)}</details>"
    )


def _seeds_cell(record: ConditionRecord, names: dict[str, str]) -> str:
    """Each term's per-seed values (named where there are several terms)."""
    one = len(record.values) == 1
    return "<br>".join(
        ("" if one else f"{e(names.get(term, term))}: ") + ", ".join(_num(v) for v in vals)
        for term, vals in record.values.items()
    )


CONDITION_HEAD = (
    "<thead><tr><th>condition</th><th>outcome: what it means</th><th>arm</th><th>metric</th>"
    "<th>bar</th><th>value across seeds</th><th>margin beyond the bar</th>"
    "<th>interval against the bar</th><th>test</th><th>per-seed values</th></tr></thead>"
)


def families(ev: Evidence) -> str:
    """How the conditions' p-values were compared with alpha, by the evidence's correction (verdict.md's
    wording, gates.record._report._families)."""
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
    moot = ev.verdict == "invalid"
    rows = "".join(_condition_row(row, moot) for row in condition_rows(ev.conditions, _arms(ev)))
    log = any(c.scale == "log" for c in ev.conditions + ev.controls)
    scale = (
        " A log-scale condition's margin and interval are on the log scale: exp(margin) is the "
        "factor by which the bar is cleared."
        if log
        else ""
    )
    invalid = (
        '<p class="lost">The verdict is invalid: these conditions were computed but decide nothing '
        "(see the controls and the reasons above).</p>"
        if moot
        else ""
    )
    return (
        f'<h2>Conditions</h2>{invalid}<p class="small families">{families(ev)}</p>'
        f'<p class="small">Colours say what a result means for the claim: a supported_if condition '
        f"that holds supports it and one that fails refutes it; a refuted_if condition that holds "
        f"refutes it and one that fails rules that refutation out. A condition and its mirror (the "
        f"same arm, metric and bar in refuted_if) share a row that says which side of the bar the "
        f"result landed on. Value: each arm's metric across seeds; margin: how far beyond the bar "
        f"(threshold, or the compared arm plus its margin) the estimate lies, &gt; 0 on the side "
        f"where the condition holds; the interval is two-sided at 1 &minus; 2&alpha; (an exact "
        f"test shows the per-seed range of the effect).{scale}</p>"
        f'<div class="wide"><table class="conditions">{CONDITION_HEAD}<tbody>{rows}</tbody></table>'
        f"</div>"
    )


def _controls(ev: Evidence) -> str:
    controls = ev.controls
    if not controls:
        return ""
    rows = "".join(_condition_row(row, False) for row in condition_rows(controls, _arms(ev)))
    broken = [c for c in controls if c.outcome != "holds"]
    verdict = (
        f'<p class="lost">{len(broken)} control{"s" if len(broken) != 1 else ""} '
        f"{'do' if len(broken) != 1 else 'does'} not hold: the verdict is invalid.</p>"
        if broken
        else ""
    )
    return (
        f"<h2>Controls</h2>{verdict}"
        '<p class="small">Each must hold for the experiment to be interpretable (each tested at '
        "&alpha;: all must hold, an intersection-union test; a control fails in the controls' own "
        "Holm family); one that fails or cannot be settled invalidates the verdict.</p>"
        f'<div class="wide"><table class="controls">{CONDITION_HEAD}<tbody>{rows}</tbody></table>'
        f"</div>"
    )


def _curves(view: ContractView) -> str:
    """A chart per metric the runs logged: per arm the mean across seeds with its band, arms
    overlaid, with what applies to the metric drawn over them."""
    ev, contract = view.evidence, view.contract
    out = ["<h2>Learning curves</h2>"]
    if view.store_note:
        out.append(f'<p class="note">{e(view.store_note)}</p>')
    if not view.histories:
        return "".join(out)
    arms = _arms(ev) or sorted({a for a, _ in view.histories})
    if contract is None:
        out.append(
            '<p class="note">The contract file is missing or was edited after the evidence: stop '
            "rules (futility, convergence) are not drawn; the bars and gate 5 come from the "
            "evidence.</p>"
        )
    seeds = len(ev.settings.seeds)
    out.append(
        f'<p class="small">Each arm: the mean over its seeds at each step (line) and a band from '
        f"the lowest to the highest seed (min-max, not &plusmn;1 sd; {seeds} "
        f"seed{'s' if seeds != 1 else ''} per arm, fewer where a run stopped early). Dashed: a "
        f"condition's or control's bar on the metric (arm colour); dash-dot with a diamond: the "
        f"falsifiable point (gate 5).</p>"
    )
    bars = _threshold_bars(ev)
    figures = []
    for metric in view.curve_metrics:
        marks = _marks(view, metric, bars)
        chart = svg.learning_curves(
            metric, arms, svg.arm_bands(view.histories, metric, arms), marks
        )
        notes = _curve_notes(view, metric, marks)
        caption = f'<figcaption class="small">{"; ".join(notes)}</figcaption>' if notes else ""
        figures.append(f"<figure>{chart}{caption}</figure>")
    out.append(f'<div class="charts">{"".join(figures)}</div>')
    if view.final_only:
        out.append(
            f'<p class="small final-only">Logged at too few steps to draw (final values in the runs '
            f"table): {e(', '.join(view.final_only))}.</p>"
        )
    return "".join(out)


def _threshold_bars(ev: Evidence) -> dict[str, list[tuple[str, float, str]]]:
    """metric -> (arm, bar, what it is) of every threshold condition and control: one per mirror
    pair (they share the bar)."""
    out: dict[str, list[tuple[str, float, str]]] = {}
    for records in (ev.conditions, ev.controls):
        for row in condition_rows(records, _arms(ev)):
            if row.bar.threshold is None:
                continue
            arm, metric = row.bar.terms[0]
            what = " + ".join(condition_label(r) for r in row.records)
            out.setdefault(metric, []).append(
                (arm, row.bar.threshold, f"{what}: {row.first.description}")
            )
    return out


def _marks(view: ContractView, metric: str, bars: dict) -> svg.Marks:
    """What is drawn over a metric's curves: the bars on it, gate 5, the contract's futility rules
    and convergence window, and each halted run's last point."""
    ev, contract = view.evidence, view.contract
    fp = ev.falsifiable_point
    gate5 = (
        {"arm": fp.arm, "threshold": fp.threshold, "by_step": fp.by_step, "direction": fp.direction}
        if fp is not None and fp.metric == metric
        else None
    )
    futility, window = [], None
    if contract is not None:
        futility = [r.model_dump() for r in contract.stop_rules.futility if r.metric == metric]
        conv = contract.convergence
        if conv is not None and conv.metric == metric:
            end = ev.settings.budget.steps
            window = (max(0, end - conv.window), end)
    halts = []
    for r in ev.runs:
        points = view.histories.get((r.arm, r.seed), {}).get(metric, [])
        if r.status == "halted" and points:
            halts.append((r.arm, r.seed, *points[-1]))
    return svg.Marks(bars.get(metric, []), gate5, futility, halts, window)


def _curve_notes(view: ContractView, metric: str, marks: svg.Marks) -> list[str]:
    ev, contract = view.evidence, view.contract
    notes = [_rule_text(r) for r in marks.futility]
    notes += [f"{e(a)} seed {e(s)} halted at step {e(step)}" for a, s, step, _ in marks.halts]
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
    return notes


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


def _convergence_td(r: RunRecord) -> str:
    """A run's convergence (gates.record.converged_cell, as verdict.md says it) in a table cell: a run
    still improving is marked, as every decision condition reading its arm is undetermined."""
    text = e(converged_cell(r, no="not converged", over_window=True))
    if r.has("converged") and not r.converged:
        return (
            f'<td class="o-undetermined" title="still improving at the end of training: every decision '
            f'condition reading this arm is undetermined">{text}</td>'
        )
    return f'<td class="small">{text}</td>'


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
        cells = (_convergence_td(r) if judged else "") + "".join(
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
    experiment = (
        f'<a href="{e(mlflow_arms_url(mlflow_ui, ml.experiment_id))}">{e(experiment)}</a> (its arms, '
        "what the decision reads charted)"
        if ml is not None and ml.experiment_id is not None
        else e(experiment)
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
            f"{e(tracking)}, experiment {experiment}, parent run {parent}",
        ),
        ("signature", f'<code class="mono">{e(sig)}</code>'),
    ]
    return (
        "<h2>Signature and provenance</h2><dl>"
        + "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in rows)
        + "</dl>"
    )
