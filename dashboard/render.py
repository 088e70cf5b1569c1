"""HTML pages, the same for the live dashboard and the static report (only the links differ).

Every text that comes from a contract, evidence or MLflow goes through `e()` (HTML-escaped); the
pages carry a Content-Security-Policy that allows no script at all.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from urllib.parse import quote

from dashboard import svg
from dashboard.data import Claim, ContractView, finite
from dashboard.svg import e

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
td.id,td.date{white-space:nowrap}
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
    return (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
            f'<meta name="viewport" content="width=device-width,initial-scale=1"><title>{e(title)}</title>'
            f'<style>{CSS}</style></head><body><header><a href="{e(links.index)}">treeheap-gates: claims</a></header>'
            f'<main>{body}</main><footer>{footer} Rendered {now}; read-only.</footer></body></html>\n')


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
    supersedes chain, stale code and older rules in brief."""
    if c.withdrawn:
        out = f'<span class="v v-withdrawn">withdrawn</span> <s class="small">{e(c.verdict or "-")}</s>'
    else:
        out = verdict_badge(c.verdict)
    notes = []
    if c.superseded_by:
        notes.append("superseded by " + ", ".join(f'<a href="{e(links.contract(x))}">{e(x)}</a>' for x in c.superseded_by))
    if c.supersedes:
        notes.append(f'supersedes <a href="{e(links.contract(c.supersedes))}">{e(c.supersedes)}</a>')
    if c.stale:
        study = [f for f in c.stale_files if not f.startswith("gates/")]
        platform = len(c.stale_files) - len(study)
        notes.append(f'<span class="stale">stale: {e(", ".join(study) or "")}'
                     f'{e(", " if study and platform else "")}{e(f"{platform} in gates/" if platform else "")}</span>')
    if c.rule_flags:
        notes.append(f'<span class="older">recorded under older rules ({len(c.rule_flags)})</span>')
    return out + "".join(f'<br><span class="small">{n}</span>' for n in notes)


def history_notes(c: Claim, links: Links) -> str:
    """A contract page's notes on its history and code: withdrawal, supersedes chain, stale code with
    the files, rules the recorded contract predates."""
    out = []
    if c.withdrawn:
        out.append(f'<p class="lost">Withdrawn: {e(c.withdrawal or "")}. The claim is no longer made; its record '
                   f'stays in runs/INDEX.jsonl (and its evidence, where kept, below).</p>')
    if c.superseded_by:
        links_ = ", ".join(f'<a href="{e(links.contract(x))}">{e(x)}</a>' for x in c.superseded_by)
        out.append(f'<p class="note">Superseded by {links_}: a newer version of this contract. This claim stays '
                   f'recorded as it was.</p>')
    if c.supersedes:
        out.append(f'<p class="small">Supersedes <a href="{e(links.contract(c.supersedes))}">{e(c.supersedes)}</a>.</p>')
    if c.stale:
        items = "".join(f"<li><code>{e(f)}</code></li>" for f in c.stale_files)
        how = f" ({e(c.stale_note)})" if c.stale_note else ""
        out.append(f'<div class="note stale">Stale: the code this evidence was computed with has changed since{how}; '
                   f'<code>gates verify --strict-code</code> fails on it. Changed files:<ul class="small">{items}</ul></div>')
    if c.rule_flags:
        items = "".join(f"<li>{e(f)}</li>" for f in c.rule_flags)
        out.append(f'<div class="note older">Recorded under older rules (a new version that follows them is how '
                   f'this claim is brought up to date):<ul class="small">{items}</ul></div>')
    return "".join(out)


def index_page(claims: list[Claim], links: Links, footer: str) -> str:
    counts = {}
    for c in claims:
        shown = "withdrawn" if c.withdrawn else (c.verdict or "pending")
        counts[shown] = counts.get(shown, 0) + 1
    lost = sum(c.check == "lost" for c in claims)
    summary = ", ".join(f"{n} {v}" for v, n in sorted(counts.items()))
    rows = "".join(
        f'<tr id="row-{e(c.contract_id)}"><td class="id"><a href="{e(links.contract(c.contract_id))}">{e(c.contract_id)}</a></td>'
        f'<td>{e(c.claim)}</td><td class="verdict">{verdict_cell(c, links)}</td>'
        f'<td class="date">{e((c.created_at or "-")[:10])}</td><td>{hash_cell(c.hash_status)}</td><td>{check_cell(c)}</td></tr>'
        for c in claims)
    lost_note = (f'<p class="lost">{lost} claim{"s" if lost != 1 else ""} lost {"their" if lost != 1 else "its"} '
                 f'evidence (see the verify column).</p>' if lost else "")
    body = (f"<h1>Claims</h1><p>{len(claims)} contracts: {e(summary) or 'none'}.</p>{lost_note}"
            f'<table class="claims"><thead><tr><th>contract</th><th>claim</th><th>verdict</th><th>recorded</th>'
            f'<th>contract hash</th><th>verify</th></tr></thead><tbody>{rows}</tbody></table>'
            f'<p class="small">Hash: the contract file\'s sha256 against the one its evidence recorded. Verify: '
            f'<code>gates verify</code> (the verdict re-derived from the recorded per-seed metrics).</p>')
    return page("Claims", body, links, footer)


def not_found_page(what: str, links: Links, footer: str) -> str:
    return page("Not found", f'<h1>Not found</h1><p>{e(what)}</p><p><a href="{e(links.index)}">All claims</a></p>',
                links, footer)


def _num(x) -> str:
    return svg.fmt(x) if finite(x) else ("-" if x is None else e(x))


def mlflow_run_url(ui: str, experiment_id, run_id) -> str:
    return f"{ui.rstrip('/')}/#/experiments/{quote(str(experiment_id), safe='')}/runs/{quote(str(run_id), safe='')}"


def contract_page(view: ContractView, links: Links, mlflow_ui: str, footer: str) -> str:
    c, ev = view.claim, view.evidence
    parts = [f'<p class="small"><a href="{e(links.index)}">All claims</a></p>',
             f"<h1>{e(c.contract_id)} {verdict_badge('withdrawn' if c.withdrawn else c.verdict)}</h1>", f"<blockquote>{e(c.claim)}</blockquote>",
             f"<p>Contract hash: {hash_cell(c.hash_status)}; verify: {check_cell(c)}</p>", history_notes(c, links)]
    if ev is None:
        if not c.withdrawn:
            parts.append(f'<p class="note">No evidence yet: run <code>gates run contracts/{e(c.contract_id)}.yaml</code>.</p>')
        return page(c.contract_id, "".join(parts), links, footer)
    parts.append(f'<p class="small">Source: {e(ev.get("source", "-"))}<br>Study <code>{e(ev.get("study", "-"))}</code>, '
                 f'recorded {e(ev["created_at"])}</p>')
    parts += [_reasons(ev), _conditions(ev), _curves(view), _gate5(ev), _runs(view, mlflow_ui), _provenance(ev, mlflow_ui)]
    return page(c.contract_id, "".join(parts), links, footer)


def _reasons(ev: dict) -> str:
    out = "<h2>Why</h2><ul>" + "".join(f"<li>{e(r)}</li>" for r in ev.get("reasons", [])) + "</ul>"
    if ev.get("settle"):
        out += "<p>What would settle it:</p><ul>" + "".join(f"<li>{e(s)}</li>" for s in ev["settle"]) + "</ul>"
    return out


def _conditions(ev: dict) -> str:
    alpha = ev.get("settings", {}).get("alpha")
    rows = []
    for cond in ev["conditions"]:
        values = "<br>".join(f"{e(term)}: {', '.join(_num(v) for v in vals)}" for term, vals in cond.get("values", {}).items())
        interval = (f"[{_num(cond.get('ci_low'))}, {_num(cond.get('ci_high'))}]" if cond.get("ci_low") is not None else "-")
        note = f'<br><span class="small">{e(cond["note"])}</span>' if cond.get("note") else ""
        reason = f'<br><span class="small">{e(cond["test_reason"])}</span>' if cond.get("test_reason") else ""
        rows.append(
            f'<tr><td>{e(cond["list_name"])}[{e(cond["index"])}]: <code>{e(cond["description"])}</code>{note}</td>'
            f'<td class="o-{e(cond["outcome"])}">{e(cond["outcome"])}</td><td>{svg.condition_interval(cond)}</td>'
            f'<td class="num">{_num(cond.get("estimate"))}</td><td class="num">{interval}</td>'
            f'<td class="num">{_num(cond.get("p_hold_adj"))}</td><td class="num">{_num(cond.get("p_fail_adj"))}</td>'
            f'<td>{e(cond.get("test", "-"))}{reason}</td><td class="small">{values}</td></tr>')
    return (f'<h2>Conditions</h2><p class="small">Each condition\'s effect beyond its bar (threshold or margin; '
            f'&gt; 0 means it holds) with its two-sided interval at 1 &minus; 2&alpha; (&alpha; = {_num(alpha)}; an exact randomization '
            f'test shows the per-seed range of the effect), Holm-corrected p-values across all conditions; '
            f'under each test, why it was used. The black line is the bar; green side: holds.</p>'
            f'<table class="conditions"><thead><tr><th>condition</th><th>outcome</th><th>interval against the bar</th>'
            f'<th>estimate</th><th>interval</th><th>p(holds) adj</th><th>p(fails) adj</th><th>test</th>'
            f'<th>per-seed values</th></tr></thead><tbody>{"".join(rows)}</tbody></table>')


def _curves(view: ContractView) -> str:
    ev, contract = view.evidence, view.contract
    out = ["<h2>Learning curves</h2>"]
    if view.store_note:
        out.append(f'<p class="note">{e(view.store_note)}</p>')
    if not view.histories:
        return "".join(out)
    arms = list(ev.get("settings", {}).get("arm_configs", {})) or sorted({a for a, _ in view.histories})
    halts = [(r["arm"], r["seed"]) for r in ev["runs"] if r["status"] == "halted"]
    if contract is None:
        out.append('<p class="note">The contract file is missing or was edited after the evidence: decision '
                   'thresholds and stop rules are not drawn.</p>')
    for metric in view.metrics:
        thresholds, futility = [], []
        if contract is not None:
            from gates.contract import Threshold

            thresholds = [(cond.arm, cond.value) for _, _, cond in contract.conditions()
                          if isinstance(cond, Threshold) and cond.metric == metric]
            futility = [r.model_dump() for r in contract.stop_rules.futility if r.metric == metric]
        out.append(f'<figure>{svg.learning_curves(metric, arms, view.histories, thresholds, futility, halts)}')
        notes = [_rule_text(r) for r in futility] + [f"{e(a)} seed {e(s)} halted" for a, s in halts]
        conv = contract.convergence if contract is not None else None
        if conv is not None and conv.metric == metric:
            still = [f"{r['arm']} seed {r['seed']}" for r in ev["runs"] if r.get("converged") is False]
            notes.append(e(f"convergence: over the last {conv.window} steps an improvement above "
                           f"{conv.max_rel_improvement:.2%} means not converged; still improving: "
                           f"{', '.join(still) or 'none'}"))
        if notes:
            out.append(f'<figcaption class="small">{"; ".join(notes)}</figcaption>')
        out.append("</figure>")
    return "".join(out)


def _rule_text(r: dict) -> str:
    bar = (f"worse than {svg.fmt(r['worse_than'])}" if r.get("worse_than") is not None
           else f"behind the best other arm by more than {svg.fmt(r['behind_best_other_by'])}")
    arms = f" (arms: {', '.join(r['arms'])})" if r.get("arms") else ""
    return e(f"futility: {r['metric']} at step {r['at_step']}: {bar} and improving by less than "
             f"{svg.fmt(r['min_rel_improvement'])} over {r['window']} steps{arms}")


def _gate5(ev: dict) -> str:
    fp = ev.get("falsifiable_point")
    if not fp:
        return ""
    op = ">=" if fp.get("direction") == "higher" else "<="
    items = "".join(f"<li>seed {e(r['seed'])}: {_num(r.get('value'))} at step {e(r.get('step'))}: "
                    f"{'met' if r.get('met') else 'not met'}</li>" for r in fp.get("runs", []))
    return (f"<h2>Falsifiable point (gate 5)</h2><p><code>{e(fp['arm'])}.{e(fp['metric'])} {op} "
            f"{_num(fp['threshold'])}</code> by step {e(fp['by_step'])}</p><ul>{items}</ul>{_predictions(ev)}"
            f"{_lost(ev)}")


def _predictions(ev: dict) -> str:
    """Gate 3's predicted ablation against what was measured (recorded since verdict engine 2)."""
    pred = (ev.get("predictions") or {}).get("predicted_ablation")
    if not pred:
        return ""
    came = {True: "came true", False: "did not come true", None: "not measured"}[pred.get("came_true")]
    side = "above" if pred.get("direction") == "higher" else "below"
    return (f"<h2>Predicted ablation (gate 3)</h2><p><code>{e(pred['arm'])}.{e(pred['metric'])}</code> {side} "
            f"<code>{e(pred['versus'])}</code> by at least {_num(pred.get('predicted_size'))}; measured "
            f"{_num(pred.get('measured_size'))}: <strong>{came}</strong></p>")


def _lost(ev: dict) -> str:
    lost = ev.get("lost") or []
    if not lost:
        return ""
    items = "".join(f"<li>{e(x['arm'])}.{e(x['metric'])} seed {e(x['seed'])}: {e(x['why'])}</li>" for x in lost)
    return (f'<h2>Lost values</h2><p class="small">A supported_if condition that reads one cannot hold.</p>'
            f"<ul>{items}</ul>")


def _converged_cell(r: dict) -> str:
    """A run's convergence: "-" when not judged (halted, failed), else yes/no with the window's change."""
    if "converged" not in r:
        return '<td class="small">-</td>'
    conv = r.get("convergence") or {}
    rel = conv.get("rel_improvement")
    change = f" ({rel:+.2%} over the last {e(conv.get('window'))} steps)" if rel is not None else ""
    if r["converged"]:
        return f'<td class="small">yes{change}</td>'
    return (f'<td class="o-undetermined" title="still improving at the end of training: every decision condition '
            f'reading this arm is undetermined">not converged{change}</td>')


def _runs(view: ContractView, mlflow_ui: str) -> str:
    ev = view.evidence
    exp = ev.get("mlflow", {}).get("experiment_id")
    shown = [m for m in view.metrics if any(m in r["metrics"] for r in ev["runs"])]
    head = "".join(f"<th>{e(m)}</th>" for m in shown)
    judged = any("converged" in r for r in ev["runs"])  # the contract has a convergence rule
    if judged:
        head = "<th>converged</th>" + head
    rows, full = [], []
    for r in ev["runs"]:
        link = (f'<a href="{e(mlflow_run_url(mlflow_ui, exp, r["mlflow_run_id"]))}">{e(r["mlflow_run_id"][:8])}</a>'
                if r.get("mlflow_run_id") and exp is not None else "-")
        cells = (_converged_cell(r) if judged else "") + "".join(
            f'<td class="num">{_num(r["metrics"].get(m))}</td>' for m in shown)
        rows.append(f'<tr><td>{e(r["arm"])}</td><td class="num">{e(r["seed"])}</td><td>{e(r["status"])}</td>'
                    f'<td>{e(r.get("halt_reason") or "-")}</td>{cells}<td class="num">{_num(r.get("seconds"))}</td>'
                    f'<td class="mono">{link}</td></tr>')
        metrics = ", ".join(f"{e(k)}={_num(v)}" for k, v in sorted(r["metrics"].items()))
        full.append(f'<tr><td>{e(r["arm"])}</td><td class="num">{e(r["seed"])}</td><td class="small">{metrics}</td></tr>')
    return (f'<h2>Runs: final metrics per arm and seed</h2><table class="runs"><thead><tr><th>arm</th><th>seed</th>'
            f'<th>status</th><th>halt</th>{head}<th>seconds</th><th>MLflow run</th></tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table><details><summary>every final metric</summary>'
            f'<table><tbody>{"".join(full)}</tbody></table></details>')


def _provenance(ev: dict, mlflow_ui: str) -> str:
    from gates.ledger import signature

    try:
        sig = signature(ev)
    except (KeyError, TypeError):
        sig = "-"
    ml = ev.get("mlflow", {})
    parent = (f'<a href="{e(mlflow_run_url(mlflow_ui, ml["experiment_id"], ml["parent_run_id"]))}">'
              f'{e(ml["parent_run_id"])}</a>' if ml.get("parent_run_id") and ml.get("experiment_id") is not None else "-")
    s = ev.get("settings", {})
    rows = [("contract", f'<code>{e(ev.get("contract_path", "-"))}</code>'),
            ("contract sha256", f'<code class="mono">{e(ev["contract_sha256"])}</code>'),
            ("git commit", f'<code>{e(ev["git_commit"])}</code>' + (" (dirty)" if ev.get("git_dirty") == "true" else "")),
            ("code sha256", f'<code>{e(ev.get("code_sha256", "-"))}</code>'),
            ("settings", e(f"alpha {s.get('alpha')}, {s.get('evaluation')} evaluation, {s.get('correction')} "
                           f"correction, seeds {s.get('seeds')}, budget {s.get('budget')}")),
            ("MLflow", f'{e(ml.get("tracking_uri", "-"))}, experiment {e(ml.get("experiment_id", "-"))}, parent run {parent}'),
            ("signature", f'<code class="mono">{e(sig)}</code>')]
    return "<h2>Signature and provenance</h2><dl>" + "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in rows) + "</dl>"
