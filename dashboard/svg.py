"""Inline SVG charts, drawn in Python (no JavaScript, nothing fetched): learning curves with the
stop-rule thresholds and halt points, and each condition's interval against its bar."""

from __future__ import annotations

import math
from html import escape

PALETTE = [
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#17becf",
    "#bcbd22",
    "#7f7f7f",
    "#d62728",
]
OUTCOME_COLOUR = {"holds": "#2e7d32", "fails": "#c62828", "undetermined": "#ef8f00"}


def e(text) -> str:
    return escape(str(text), quote=True)


def fmt(x: float) -> str:
    return f"{x:.4g}"


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if not hi > lo:
        return [lo]
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step + 1e-9) + 1)]


def _span(values: list[float]) -> tuple[float, float]:
    lo, hi = min(values), max(values)
    if hi == lo:
        pad = abs(lo) * 0.05 or 0.5
        return lo - pad, hi + pad
    pad = (hi - lo) * 0.06
    return lo - pad, hi + pad


def learning_curves(
    metric: str,
    arms: list[str],
    histories: dict,
    thresholds: list[tuple[str, float]],
    futility: list[dict],
    halts: list[tuple[str, int]],
    width: int = 720,
    height: int = 280,
) -> str:
    """One metric: a line per arm x seed (colour by arm), dashed decision thresholds (arm colour),
    dotted futility look (vertical, at_step) and bar (horizontal, worse_than), a red x at each halt."""
    colour = {arm: PALETTE[i % len(PALETTE)] for i, arm in enumerate(arms)}
    series = {
        k: [(s, v) for s, v in h.get(metric, []) if math.isfinite(v)] for k, h in histories.items()
    }
    series = {k: pts for k, pts in series.items() if pts}
    xs = [s for pts in series.values() for s, _ in pts] + [r["at_step"] for r in futility]
    ys = [v for pts in series.values() for _, v in pts] + [v for _, v in thresholds]
    ys += [r["worse_than"] for r in futility if r.get("worse_than") is not None]
    left, right, top, bottom = 64, 170, 26, 38
    pw, ph = width - left - right, height - top - bottom
    out = [
        f'<svg class="learning-curve" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="learning curves of {e(metric)}">',
        f'<text x="{left}" y="16" class="t">{e(metric)}</text>',
    ]
    if not series:
        out.append(
            f'<text x="{left}" y="{top + ph / 2}" class="n">no history of {e(metric)} in the store</text></svg>'
        )
        return "".join(out)
    x0, x1 = 0.0, max(xs)
    y0, y1 = _span(ys)

    def px(x):
        return left + (x - x0) / ((x1 - x0) or 1) * pw

    def py(y):
        return top + (1 - (y - y0) / (y1 - y0)) * ph

    out.append(f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" class="frame"/>')
    for t in nice_ticks(y0, y1):
        out.append(
            f'<line x1="{left}" x2="{left + pw}" y1="{py(t):.1f}" y2="{py(t):.1f}" class="grid"/>'
            f'<text x="{left - 6}" y="{py(t) + 4:.1f}" class="yl">{fmt(t)}</text>'
        )
    for t in nice_ticks(x0, x1):
        out.append(f'<text x="{px(t):.1f}" y="{top + ph + 16}" class="xl">{fmt(t)}</text>')
    out.append(f'<text x="{left + pw / 2}" y="{height - 4}" class="xl">step</text>')
    for (arm, seed), pts in sorted(series.items(), key=lambda kv: (str(kv[0][0]), kv[0][1])):
        path = " ".join(f"{px(s):.1f},{py(v):.1f}" for s, v in pts)
        out.append(
            f'<polyline points="{path}" fill="none" stroke="{colour.get(arm, "#444")}" stroke-width="1.6" '
            f'stroke-opacity="0.85"><title>{e(arm)} seed {e(seed)}: {e(metric)} = {fmt(pts[-1][1])} at step '
            f"{pts[-1][0]}</title></polyline>"
        )
    for arm, value in thresholds:
        out.append(
            f'<line x1="{left}" x2="{left + pw}" y1="{py(value):.1f}" y2="{py(value):.1f}" '
            f'stroke="{colour.get(arm, "#444")}" stroke-dasharray="6 4" class="thr">'
            f"<title>decision threshold on {e(arm)}: {fmt(value)}</title></line>"
        )
    for r in futility:
        x = px(r["at_step"])
        out.append(
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{top}" y2="{top + ph}" class="fut">'
            f"<title>futility look at step {r['at_step']}</title></line>"
            f'<text x="{x + 3:.1f}" y="{top + 11}" class="n">futility @ {r["at_step"]}</text>'
        )
        if r.get("worse_than") is not None:
            y = py(r["worse_than"])
            out.append(
                f'<line x1="{left}" x2="{left + pw}" y1="{y:.1f}" y2="{y:.1f}" class="fut">'
                f"<title>futility bar: worse than {fmt(r['worse_than'])}</title></line>"
            )
    for arm, seed in halts:
        pts = series.get((arm, seed))
        if pts:
            x, y = px(pts[-1][0]), py(pts[-1][1])
            out.append(
                f'<path d="M{x - 5:.1f},{y - 5:.1f}L{x + 5:.1f},{y + 5:.1f}M{x - 5:.1f},{y + 5:.1f}'
                f'L{x + 5:.1f},{y - 5:.1f}" class="halt"><title>{e(arm)} seed {e(seed)} halted at step '
                f"{pts[-1][0]}</title></path>"
            )
    lx = left + pw + 12
    for i, arm in enumerate(arms):
        y = top + 8 + i * 16
        out.append(
            f'<line x1="{lx}" x2="{lx + 16}" y1="{y}" y2="{y}" stroke="{colour[arm]}" stroke-width="3"/>'
            f'<text x="{lx + 22}" y="{y + 4}" class="lg">{e(arm)}</text>'
        )
    y = top + 8 + len(arms) * 16 + 6
    legend = [("thr", "threshold (decision)"), ("fut", "futility (stop rule)")]
    for cls, label in legend:
        out.append(
            f'<line x1="{lx}" x2="{lx + 16}" y1="{y}" y2="{y}" class="{cls}" stroke="#555"/>'
            f'<text x="{lx + 22}" y="{y + 4}" class="lg">{label}</text>'
        )
        y += 16
    out.append(
        f'<path d="M{lx + 3},{y - 5}L{lx + 13},{y + 5}M{lx + 3},{y + 5}L{lx + 13},{y - 5}" class="halt"/>'
        f'<text x="{lx + 22}" y="{y + 4}" class="lg">halt</text></svg>'
    )
    return "".join(out)


def condition_interval(c: dict, width: int = 300, height: int = 34) -> str:
    """One condition's effect beyond its bar (> 0: holds) with its interval; the bar is the line at 0."""
    est, low, high = c.get("estimate"), c.get("ci_low"), c.get("ci_high")
    if not (isinstance(est, (int, float)) and math.isfinite(est)):
        return '<span class="n">no estimate</span>'
    low = low if isinstance(low, (int, float)) and math.isfinite(low) else est
    high = high if isinstance(high, (int, float)) and math.isfinite(high) else est
    lo, hi = _span([low, high, est, 0.0])
    pad = 10

    def px(x):
        return pad + (x - lo) / (hi - lo) * (width - 2 * pad)

    colour = OUTCOME_COLOUR.get(c.get("outcome"), "#555")
    scale = " (log scale)" if c.get("scale") == "log" else ""
    mid = 14
    return (
        f'<svg class="condition-interval" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="interval of {e(c.get("description", ""))}">'
        f'<rect x="{pad}" y="3" width="{px(0) - pad:.1f}" height="{2 * mid - 6}" fill="#fbe9e7"/>'
        f'<rect x="{px(0):.1f}" y="3" width="{width - pad - px(0):.1f}" height="{2 * mid - 6}" fill="#e8f5e9"/>'
        f'<line x1="{px(0):.1f}" x2="{px(0):.1f}" y1="1" y2="{2 * mid - 1}" stroke="#000" stroke-width="1.5">'
        f"<title>the bar (threshold or margin): the condition holds right of it</title></line>"
        f'<line x1="{px(low):.1f}" x2="{px(high):.1f}" y1="{mid}" y2="{mid}" stroke="{colour}" stroke-width="3"/>'
        f'<line x1="{px(low):.1f}" x2="{px(low):.1f}" y1="{mid - 6}" y2="{mid + 6}" '
        f'stroke="{colour}" stroke-width="2"/>'
        f'<line x1="{px(high):.1f}" x2="{px(high):.1f}" y1="{mid - 6}" y2="{mid + 6}" '
        f'stroke="{colour}" stroke-width="2"/>'
        f'<circle cx="{px(est):.1f}" cy="{mid}" r="4.5" fill="{colour}"><title>estimate {fmt(est)}, interval '
        f"[{fmt(low)}, {fmt(high)}]{scale}</title></circle>"
        f'<text x="{pad}" y="{height - 1}" class="xs">{fmt(lo)}</text>'
        + (
            f'<text x="{px(0):.1f}" y="{height - 1}" class="xl">0</text>'
            if 40 < px(0) < width - 40
            else ""
        )
        + f'<text x="{width - pad}" y="{height - 1}" class="xe">{fmt(hi)}</text></svg>'
    )
