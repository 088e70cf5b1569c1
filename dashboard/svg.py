"""Inline SVG charts, drawn in Python (no JavaScript, nothing fetched): learning curves (per arm the
mean across seeds with a min-max band, arms overlaid, with the bars and stop rules that apply to the
metric) and each condition's interval against its bar."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
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
# what a condition's result means for the claim (gates.record._conditions.meaning), as colours
MEANING_COLOUR = {
    "supports": "#2e7d32",
    "refutes": "#c62828",
    "undetermined": "#ef8f00",
    "sound": "#2e7d32",
    "invalidates": "#6d4c41",
}
# the background of each side of a condition's bar, by what landing there means
SIDE_FILL = {
    "supports": "#e8f5e9",
    "sound": "#e8f5e9",
    "refutes": "#fbe9e7",
    "invalidates": "#efebe9",
}


def e(text) -> str:
    return escape(str(text), quote=True)


def fmt(x: float) -> str:
    return f"{x:.4g}"


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


# ---------------------------------------------------------------------------------- axes
def _decimals(step: float) -> int:
    """Decimal places that write `step` exactly (0.25 -> 2, 5 -> 0, 2e-06 -> 6)."""
    for d in range(16):
        if abs(round(step, d) - step) <= abs(step) * 1e-9:
            return d
    return 16


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About `n` round ticks (steps of 1, 2, 2.5 or 5 times a power of ten) covering [lo, hi], each
    rounded to its step's decimals (0.6, never 0.6000000000000001)."""
    if not (_finite(lo) and _finite(hi)) or not hi > lo:
        return [lo]
    raw = (hi - lo) / max(n, 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw * (1 - 1e-9))
    first = math.ceil(lo / step - 1e-9) * step
    count = math.floor((hi - first) / step + 1e-9) + 1
    d = _decimals(step)
    return [round(first + i * step, d) + 0.0 for i in range(count)]  # + 0.0: never "-0"


def tick_labels(ticks: list[float]) -> list[str]:
    """Labels for ticks from `nice_ticks`, with as many digits as their step needs: "0.02", "1500",
    "2.5e-6"; scientific below 1e-4 and from 1e6 up."""
    if not ticks:
        return []
    step = min((abs(b - a) for a, b in zip(ticks, ticks[1:])), default=0) or abs(ticks[0]) or 1.0
    biggest = max(abs(t) for t in ticks) or step
    if 1e-4 <= biggest < 1e6:
        d = _decimals(step)
        return [f"{t:.{d}f}" for t in ticks]
    power = math.floor(math.log10(step))
    # one digit per power of ten from the largest tick down to the step's, one more for 2.5 steps
    digits = math.floor(math.log10(biggest)) - power + 1 + (round(step / 10**power, 6) % 1 > 0)
    return [_short_exponent(f"{t:.{max(digits, 1) - 1}e}") if t else "0" for t in ticks]


def _short_exponent(text: str) -> str:
    """2.50e-06 -> 2.5e-6: trailing zeros of the mantissa and of the exponent dropped."""
    mantissa, _, exponent = text.partition("e")
    if "." in mantissa:
        mantissa = mantissa.rstrip("0").rstrip(".")
    return f"{mantissa}e{int(exponent)}"


def _span(values: list[float]) -> tuple[float, float]:
    lo, hi = min(values), max(values)
    if hi == lo:
        pad = abs(lo) * 0.05 or 0.5
        return lo - pad, hi + pad
    pad = (hi - lo) * 0.06
    return lo - pad, hi + pad


# ---------------------------------------------------------------------------------- learning curves
@dataclass(frozen=True)
class Band:
    """One arm's curve of a metric: per step the mean over the seeds with a value there, and the
    lowest and highest of them."""

    arm: str
    steps: list[int]
    mean: list[float]
    low: list[float]
    high: list[float]
    seeds: list[int]  # how many seeds had a value at each step

    @property
    def spread(self) -> bool:
        return any(h > lo for lo, h in zip(self.low, self.high))


def arm_bands(histories: dict, metric: str, arms: list[str]) -> list[Band]:
    """Per arm (in `arms` order, then any other arm the histories have), the mean of `metric` across
    seeds at each step with its min-max band; arms without a finite value are left out.
    `histories`: (arm, seed) -> metric -> [(step, value)]."""
    by_arm: dict[str, dict[int, list[float]]] = {}
    for (arm, _seed), series in histories.items():
        for step, value in series.get(metric, []):
            if _finite(value):
                by_arm.setdefault(arm, {}).setdefault(step, []).append(value)
    order = list(arms) + sorted(a for a in by_arm if a not in arms)
    bands = []
    for arm in order:
        steps = sorted(by_arm.get(arm, {}))
        if not steps:
            continue
        values = [by_arm[arm][s] for s in steps]
        bands.append(
            Band(
                arm,
                steps,
                [sum(v) / len(v) for v in values],
                [min(v) for v in values],
                [max(v) for v in values],
                [len(v) for v in values],
            )
        )
    return bands


@dataclass(frozen=True)
class Marks:
    """What is drawn over one metric's curves besides the arms: decision and control bars
    (arm, value, label), the gate-5 bar, futility rules, halted runs' last points and the
    convergence window; each appears in the legend only when drawn."""

    bars: list[tuple[str, float, str]] = field(default_factory=list)
    gate5: dict | None = None  # arm, threshold, by_step, direction
    futility: list[dict] = field(default_factory=list)  # at_step, worse_than (rule dumps)
    halts: list[tuple[str, int, int, float]] = field(default_factory=list)  # arm, seed, step, value
    convergence: tuple[int, int] | None = None  # (first step, last step) of the window


LEGEND_ROW = 16
LEGEND_CHAR = 6.2  # width of a legend character, about (11px system-ui)


def learning_curves(
    metric: str,
    arms: list[str],
    bands: list[Band],
    marks: Marks = Marks(),
    width: int = 600,
    height: int = 260,
) -> str:
    """One metric: per arm its mean across seeds (a line) and min-max band (shaded), arms overlaid in
    fixed colours; dashed bars of the conditions and controls on this metric (arm colour), the gate-5
    bar (dash-dot up to its step, a diamond at it), dotted futility look and bar, a red x at each halt,
    the convergence window shaded. The legend lists what is drawn and nothing else."""
    colour = {arm: PALETTE[i % len(PALETTE)] for i, arm in enumerate(arms)}
    for band in bands:  # an arm the evidence does not list: the next free colour
        colour.setdefault(band.arm, PALETTE[len(colour) % len(PALETTE)])
    left, right, top, bottom = 58, 14, 24, 34
    pw, ph = width - left - right, height - top - bottom

    def svg(body: list[str], total: int) -> str:
        return (
            f'<svg class="learning-curve" xmlns="http://www.w3.org/2000/svg" width="{width}" '
            f'height="{total}" viewBox="0 0 {width} {total}" role="img" '
            f'aria-label="learning curves of {e(metric)}">'
            f'<text x="{left}" y="15" class="t">{e(metric)}</text>{"".join(body)}</svg>'
        )

    if not bands:
        return svg(
            [
                f'<text x="{left}" y="{top + ph / 2}" class="n">no history of {e(metric)} in the store</text>'
            ],
            height,
        )
    out = []
    xs = [s for b in bands for s in b.steps] + [r["at_step"] for r in marks.futility]
    ys = [y for b in bands for y in b.low + b.high] + [v for _, v, _ in marks.bars]
    ys += [r["worse_than"] for r in marks.futility if r.get("worse_than") is not None]
    if marks.gate5 is not None:
        xs.append(marks.gate5["by_step"])
        ys.append(marks.gate5["threshold"])
    if marks.convergence is not None:
        xs += list(marks.convergence)
    x0, x1 = min(0.0, min(xs)), max(xs)
    y0, y1 = _span(ys)

    def px(x):
        return left + (x - x0) / ((x1 - x0) or 1) * pw

    def py(y):
        return top + (1 - (y - y0) / (y1 - y0)) * ph

    out.append(f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" class="frame"/>')
    if marks.convergence is not None:
        a, b = (px(x) for x in marks.convergence)
        out.append(
            f'<rect x="{a:.1f}" y="{top}" width="{b - a:.1f}" height="{ph}" class="conv">'
            f"<title>convergence window: steps {marks.convergence[0]} to "
            f"{marks.convergence[1]}</title></rect>"
        )
    yticks = nice_ticks(y0, y1)
    for t, label in zip(yticks, tick_labels(yticks)):
        out.append(
            f'<line x1="{left}" x2="{left + pw}" y1="{py(t):.1f}" y2="{py(t):.1f}" class="grid"/>'
            f'<text x="{left - 6}" y="{py(t) + 4:.1f}" class="yl">{label}</text>'
        )
    xticks = nice_ticks(x0, x1)
    for t, label in zip(xticks, tick_labels(xticks)):
        out.append(f'<text x="{px(t):.1f}" y="{top + ph + 14}" class="xl">{label}</text>')
    out.append(f'<text x="{left + pw / 2}" y="{height - 3}" class="xl">step</text>')
    for band in bands:
        c = colour[band.arm]
        if band.spread:
            upper = [f"{px(s):.1f},{py(y):.1f}" for s, y in zip(band.steps, band.high)]
            lower = [f"{px(s):.1f},{py(y):.1f}" for s, y in zip(band.steps, band.low)]
            out.append(
                f'<path class="band" data-arm="{e(band.arm)}" d="M{" L".join(upper + lower[::-1])} Z" '
                f'fill="{c}" fill-opacity="0.16" stroke="none"><title>{e(band.arm)}: lowest to '
                f"highest seed</title></path>"
            )
        line = [f"{px(s):.1f},{py(y):.1f}" for s, y in zip(band.steps, band.mean)]
        seeds = max(band.seeds)
        out.append(
            f'<path class="mean" data-arm="{e(band.arm)}" d="M{" L".join(line)}" fill="none" '
            f'stroke="{c}" stroke-width="2"><title>{e(band.arm)}: mean of {e(metric)} over '
            f"{seeds} seed{'s' if seeds != 1 else ''}; {fmt(band.mean[-1])} at step "
            f"{band.steps[-1]}</title></path>"
        )
    legend = [(_sample_line(colour[b.arm]), b.arm) for b in bands]
    for arm, value, label in marks.bars:
        out.append(
            f'<line x1="{left}" x2="{left + pw}" y1="{py(value):.1f}" y2="{py(value):.1f}" '
            f'stroke="{colour.get(arm, "#444")}" class="thr"><title>{e(label)}</title></line>'
        )
    if marks.bars:
        legend.append((_sample_line("#555", "thr"), "condition bar"))
    if marks.gate5 is not None:
        g = marks.gate5
        x, y = px(g["by_step"]), py(g["threshold"])
        c = colour.get(g["arm"], "#444")
        op = ">=" if g["direction"] == "higher" else "<="
        out.append(
            f'<g class="gate5"><line x1="{left}" x2="{x:.1f}" y1="{y:.1f}" y2="{y:.1f}" '
            f'stroke="{c}" class="g5"/><path d="M{x:.1f},{y - 6:.1f}L{x + 6:.1f},{y:.1f}L{x:.1f},'
            f'{y + 6:.1f}L{x - 6:.1f},{y:.1f}Z" fill="{c}" stroke="#222"/><title>gate 5: '
            f"{e(g['arm'])}.{e(metric)} {e(op)} {fmt(g['threshold'])} by step {g['by_step']}</title></g>"
        )
        legend.append((_sample_diamond, f"gate 5: {op} {fmt(g['threshold'])} by {g['by_step']}"))
    for r in marks.futility:
        x = px(r["at_step"])
        out.append(
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{top}" y2="{top + ph}" class="fut">'
            f"<title>futility look at step {r['at_step']}</title></line>"
        )
        if r.get("worse_than") is not None:
            y = py(r["worse_than"])
            out.append(
                f'<line x1="{left}" x2="{left + pw}" y1="{y:.1f}" y2="{y:.1f}" class="fut">'
                f"<title>futility bar: worse than {fmt(r['worse_than'])}</title></line>"
            )
    if marks.futility:
        legend.append((_sample_line("#666", "fut"), "futility (stop rule)"))
    for arm, seed, step, value in marks.halts:
        x, y = px(step), py(value)
        out.append(
            f'<path d="{_cross(x, y)}" class="halt"><title>{e(arm)} seed {e(seed)} halted at step '
            f"{step}</title></path>"
        )
    if marks.halts:
        legend.append((_sample_halt, "halted run"))
    if marks.convergence is not None:
        legend.append((_sample_window, "convergence window"))
    # the legend under the plot, wrapped into rows: it never takes width from the plot
    x, y = left, height + 8
    for sample, label in legend:
        wide = 22 + LEGEND_CHAR * len(label) + 14
        if x > left and x + wide > width:
            x, y = left, y + LEGEND_ROW
        out.append(f'{sample(x, y)}<text x="{x + 22}" y="{y + 4}" class="lg">{e(label)}</text>')
        x += wide
    return svg(out, y + 10)


def _cross(x: float, y: float, r: float = 5) -> str:
    return (
        f"M{x - r:.1f},{y - r:.1f}L{x + r:.1f},{y + r:.1f}"
        f"M{x - r:.1f},{y + r:.1f}L{x + r:.1f},{y - r:.1f}"
    )


# a legend entry's sample: drawn at (x, y) as the chart draws the mark it stands for
def _sample_line(colour: str, cls: str = "") -> Callable[[float, float], str]:
    look = f'class="{cls}"' if cls else 'stroke-width="3"'
    return lambda x, y: f'<line x1="{x}" x2="{x + 16}" y1="{y}" y2="{y}" stroke="{colour}" {look}/>'


def _sample_diamond(x: float, y: float) -> str:
    return f'<path d="M{x + 8},{y - 5}L{x + 13},{y}L{x + 8},{y + 5}L{x + 3},{y}Z" fill="#888" stroke="#222"/>'


def _sample_halt(x: float, y: float) -> str:
    return f'<path d="{_cross(x + 8, y, 4)}" class="halt"/>'


def _sample_window(x: float, y: float) -> str:
    return f'<rect x="{x}" y="{y - 5}" width="16" height="10" class="conv"/>'


# ---------------------------------------------------------------------------------- intervals
def condition_interval(
    c: dict,
    *,
    colour: str,
    right: str,
    left: str,
    width: int = 210,
    height: int = 38,
) -> str:
    """One condition's effect beyond its bar with its interval; the bar is the line at 0 and the
    effect is > 0 on the side where the condition holds. `right` and `left` are what landing on each
    side means (a MEANING_COLOUR key: a refuted_if condition's holding side refutes), `colour` the
    colour of the result. Round ticks, 0 always among them."""
    est, low, high = c.get("estimate"), c.get("ci_low"), c.get("ci_high")
    if not _finite(est):
        return '<span class="n">no estimate</span>'
    low = low if _finite(low) else est
    high = high if _finite(high) else est
    lo, hi = _span([low, high, est, 0.0])
    pad = 12

    def px(x):
        return pad + (x - lo) / (hi - lo) * (width - 2 * pad)

    scale = " (log scale)" if c.get("scale") == "log" else ""
    mid = 13
    ticks = [t for t in nice_ticks(lo, hi, 4) if t != 0]
    labels = dict(zip(ticks, tick_labels(ticks)))
    axis = "".join(
        f'<line x1="{px(t):.1f}" x2="{px(t):.1f}" y1="{2 * mid - 4}" y2="{2 * mid}" stroke="#999"/>'
        f'<text x="{px(t):.1f}" y="{height - 1}" class="xl">{labels[t]}</text>'
        for t in ticks
        if abs(px(t) - px(0)) > 18  # the bar's own "0" keeps its room
    )
    return (
        f'<svg class="condition-interval" xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="interval of {e(c.get("description", ""))}">'
        f'<rect x="{pad}" y="2" width="{px(0) - pad:.1f}" height="{2 * mid - 4}" '
        f'fill="{SIDE_FILL.get(left, "#f5f5f5")}"><title>left of the bar: {e(left)}</title></rect>'
        f'<rect x="{px(0):.1f}" y="2" width="{width - pad - px(0):.1f}" height="{2 * mid - 4}" '
        f'fill="{SIDE_FILL.get(right, "#f5f5f5")}"><title>right of the bar: {e(right)}</title></rect>'
        f'<line x1="{px(0):.1f}" x2="{px(0):.1f}" y1="0" y2="{2 * mid}" stroke="#000" '
        f'stroke-width="1.5"><title>the bar (threshold or margin): the condition holds right of it'
        f"</title></line>"
        f'<line x1="{px(low):.1f}" x2="{px(high):.1f}" y1="{mid}" y2="{mid}" stroke="{colour}" '
        f'stroke-width="3"/>'
        f'<line x1="{px(low):.1f}" x2="{px(low):.1f}" y1="{mid - 6}" y2="{mid + 6}" '
        f'stroke="{colour}" stroke-width="2"/>'
        f'<line x1="{px(high):.1f}" x2="{px(high):.1f}" y1="{mid - 6}" y2="{mid + 6}" '
        f'stroke="{colour}" stroke-width="2"/>'
        f'<circle cx="{px(est):.1f}" cy="{mid}" r="4.5" fill="{colour}"><title>margin {fmt(est)}, '
        f"interval [{fmt(low)}, {fmt(high)}]{scale}</title></circle>"
        f'<text x="{px(0):.1f}" y="{height - 1}" class="xl zero">0</text>{axis}</svg>'
    )
