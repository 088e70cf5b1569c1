"""Verdict levels: how often the verdict engine says something false when the truth sits exactly at a bar.

Every cell simulates `--draws` experiments (default 2,000) through the engine itself (`verdict.decide`,
`sequential.judge_sequential`) with the true value of what the condition estimates exactly at its bar,
so that each "supported" is a false support, each "refuted" a false refutation and each control that
holds a false validity. The engine promises each rate at most alpha (0.05 here); a cell whose rate lies
above alpha + 3 Monte Carlo standard errors at alpha (3 sqrt(alpha (1 - alpha) / draws): 0.0146 at
2,000 draws) is marked ABOVE, and the list of such cells is printed at the end.

Per-seed distributions (`family`): normal (a linear metric); lognormal with sigma 0.25, 0.5 and 1 on a
`positive` metric (scale log: the estimand is the geometric mean, which is the median); Student t with
2 degrees of freedom (a linear metric; symmetric, estimand the mean, which is the median); and, to show
what issue #24 reported, lognormal per-seed values on a metric declared linear (estimand the mean).

Shapes (`block`):
- threshold: one arm against a constant; supported_if `x <= bar` (direction lower) or `x >= bar`
  (higher), refuted_if the mirror condition at the same bar;
- paired: two arms correlated through a shared per-seed component (half the variance on the
  condition's scale), compared seed by seed. Linear metrics: an absolute margin 0.5 (true difference
  exactly 0.5), refuted_if the mirror (a negative margin). Log metrics: relative_margin 0.1 with the
  true ratio (the geometric mean of the per-seed ratios) exactly 0.9 (lower) or 1.1 (higher);
  refuted_if is the plain compare the other way (`a >= b` resp. `a <= b`), as measured when the
  mirror of a relative margin was not expressible, and a false refutation comes from the supported_if
  condition failing at its bar (a negative relative margin, issue #43, now states the exact mirror and
  non-inferiority on a log metric: the same shifted log-scale t-test, not yet a cell here);
- welch: two independent arms, the same family, the estimand (difference of means, ratio of geometric
  means) at the bar as for paired; spread ratio a:b 1 (equal) or 2 (b half as spread);
- sequential: a threshold judged by `judge_sequential` at looks [3, 6, 10] with O'Brien-Fleming or
  Pocock spending (a rate counts a false result at any look);
- refutation: every way to refute at its bar: supported_if `a.x <= bar`, refuted_if `a.x >= bar` and
  `a.z >= bar` (another metric, also at its bar): a Holm family of three ways to refute, all true nulls;
- iut: two supported_if conditions, one at its bar, the other clearly true (intersection-union: each is
  tested at alpha with no correction);
- control: the decision clearly supported, one control whose true value sits exactly at its bar
  (threshold, paired or Welch compare; or two controls, the other clearly holding): false validity is
  the rate at which every control holds;
- mixed: Welch, arm a lognormal sigma 1, arm b normal (sd 0.15 of its centre): on a positive metric with
  equal geometric means (compare without margin), and on a linear metric with equal means. The level is
  not promised here: the log scale assumes both arms are lognormal-like, the mean's t-test assumes
  symmetric spread;
- exact: `interval: bootstrap` (engine 4: the bootstrap gives the interval of a mean, its p-values
  come from the estimand's test, here the t-test; engine 3 took them from the sign and permutation
  tests);
- bounded: accuracies in [0, 1] judged on a declared estimand (issue #38): k / 20 items right with
  k ~ Binomial(20, 0.9) (ties), or seeds that collapse to 0.3 one time in ten; the mean by the
  bounded-mean test, the median by the sign test, the truth at the bar of the declared estimand;
  threshold, paired, Welch and sequential, n in {3, 5, 8, 10}.
- linear-skew: lognormal values on a metric declared linear, claim about the mean at the mean: the
  failure issue #24 reported, why right-skewed metrics are declared `positive`.

Seeds per arm n in {3, 5, 8, 10} (sequential: 10). Every cell draws from its own generator, seeded by the
cell's name, so a cell's numbers do not depend on which other cells run or on `--workers`. The power
planning for the settle lines (`seeds_needed`), which never changes an outcome, is left out (as in
tests/test_sequential.py) to save time.

    python benchmarks/verdict_levels.py [--draws 2000] [--workers 2] [--only SUBSTRING ...] [--ci]
                                        [--json [PATH]] [--markdown [PATH]] [--render JSON]

`--json` writes benchmarks/results/verdict_levels.json (or PATH) and `--markdown` the tables (the largest
rate per block, then every cell) to benchmarks/results/verdict_levels.md (or PATH); `--json` alone writes
both. `--render PATH` rewrites the tables from a JSON written before, without simulating. tests/test_levels.py runs a
subset of these cells (`ci_cells`) and asserts each rate.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import platform
import sys
import time
import zlib
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import numpy as np
from pydantic import TypeAdapter
from scipy import integrate, optimize, stats

from gates.contract import Control, Decision, Sequential
from gates.entities import RunRecord, json_safe
from gates.inference import ENGINE_VERSION, decide, judge_sequential
from gates.inference._statistics import _Stat
from gates.study import Metric, positive

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
ALPHA = 0.05
SEED = 20261202
LOOKS = [3, 6, 10]
RHO = 0.5  # paired: share of each arm's variance (on the condition's scale) from the shared per-seed component
LINEAR_CENTRE, LINEAR_SD, MARGIN = (
    10.0,
    1.0,
    0.5,
)  # linear families: centre, spread (sd or t scale), margin
LOG_CENTRE, RATIO = 2.0, 0.1  # log families: geometric mean of b, relative margin
MIXED_B_CV = 0.15  # mixed shapes: the normal arm's sd relative to its centre

# family name -> (noise kind, spread on the condition's scale, declared scale)
FAMILIES = {
    "normal": ("normal", 1.0, "linear"),
    "lognormal-0.25": ("lognormal", 0.25, "log"),
    "lognormal-0.5": ("lognormal", 0.5, "log"),
    "lognormal-1": ("lognormal", 1.0, "log"),
    "t2": ("t2", 1.0, "linear"),
}
SKEWED = {f"lognormal-{s:g}-linear": ("lognormal", s, "linear") for s in (0.25, 0.5, 1.0)}
# Accuracies in [0, 1] (a `proportion` metric), judged on a declared estimand (block `bounded`): the mean
# (the bounded-mean test) or the median (the sign test), with the truth at the bar of that estimand.
# discrete: k / 20 test items right, k ~ Binomial(20, 0.9): few values, many ties (mean 0.9, median 0.9);
# collapsed: uniform in [0.96, 1] with probability 0.9, else 0.3 (a seed that collapsed): mean 0.912,
# median 0.96 + 0.04 * 0.4 / 0.9. Issue #38: a switch to the sign test on ties gave 33-50% false support
# of the mean here.
BOUNDED_TRUTH = {
    ("acc-discrete", "mean"): 0.9,
    ("acc-discrete", "median"): 0.9,
    ("acc-collapsed", "mean"): 0.9 * 0.98 + 0.1 * 0.3,
    ("acc-collapsed", "median"): 0.96 + 0.04 * 0.4 / 0.9,
}


def slack(draws: int, alpha: float = ALPHA) -> float:
    """Monte Carlo slack: 3 standard errors of a rate equal to alpha."""
    return 3 * math.sqrt(alpha * (1 - alpha) / draws)


# ---------------------------------------------------------------------------------- cells
@dataclass(frozen=True)
class Cell:
    block: str  # threshold | paired | welch | sequential | refutation | iut | control | mixed | exact | linear-skew
    family: str
    direction: str  # the claim's: lower (x <= bar) or higher (x >= bar)
    n: int  # seeds per arm (sequential: the last look)
    spread: float = 1.0  # welch (and a control welch): arm a's spread over arm b's
    spending: str = ""  # sequential
    shape: str = ""  # control: threshold | paired | welch | two; exact: threshold | paired | welch

    @property
    def name(self) -> str:
        parts = [self.block, self.family, self.direction, f"n{self.n}"]
        if self.shape:
            parts.insert(1, self.shape)
        if self.spread != 1.0:
            parts.append(f"spread{self.spread:g}")
        if self.spending:
            parts.append(self.spending)
        return "/".join(parts)

    @property
    def decides(self) -> float:
        """Rough cost of one draw, in one-condition decide calls (to balance the workers)."""
        two = self.block in ("paired", "welch", "mixed") or self.shape in ("paired", "welch", "two")
        cost = (1.4 if two else 1.0) * (3 if self.block == "sequential" else 1)
        if (
            self.block == "exact"
        ):  # bootstrap intervals; a Monte Carlo permutation test beyond 2^16 arrangements
            cost *= 30 if self.shape == "welch" and self.n >= 10 else 4
        return cost * (1.5 if self.block in ("refutation", "iut", "control") else 1)


def ci_cells() -> list[Cell]:
    """The cells tests/test_levels.py asserts (about a minute on two cores): every family, direction and
    shape at 5 seeds, one-sample at 3 and 10, sequential, a refutation family, intersection-union,
    controls, and the failure of a skewed metric declared linear."""
    cells = []
    for family in FAMILIES:
        for direction in ("lower", "higher"):
            cells += [Cell("threshold", family, direction, n) for n in (3, 5, 10)]
            cells += [
                Cell("paired", family, direction, 5),
                Cell("welch", family, direction, 5, spread=2.0),
            ]
    # normal values at [3, 6, 10] under O'Brien-Fleming: tests/test_sequential.py
    cells += [
        Cell("sequential", "lognormal-1", "lower", 10, spending=spending)
        for spending in ("obrien-fleming", "pocock")
    ]
    cells.append(Cell("sequential", "normal", "higher", 10, spending="pocock"))
    cells += [
        Cell("refutation", "lognormal-1", "lower", 5),
        Cell("refutation", "t2", "lower", 5),
        Cell("iut", "lognormal-1", "lower", 5),
    ]
    cells += [
        Cell("control", "normal", "higher", 5, shape="threshold"),
        Cell("control", "lognormal-1", "lower", 5, shape="threshold"),
        Cell("control", "lognormal-0.5", "lower", 5, shape="paired"),
        Cell("control", "normal", "lower", 5, shape="welch", spread=2.0),
    ]
    cells.append(Cell("linear-skew", "lognormal-1-linear", "lower", 5))
    # accuracies on a declared estimand: the collapse issue #38 reported, on the mean and on the median
    cells += [
        Cell("bounded", "acc-collapsed-mean", "higher", 5, shape="threshold"),
        Cell("bounded", "acc-collapsed-mean", "higher", 10, shape="paired"),
        Cell("bounded", "acc-collapsed-median", "higher", 8, shape="threshold"),
        Cell("bounded", "acc-discrete-median", "lower", 10, shape="threshold"),
    ]
    return cells


def full_cells() -> list[Cell]:
    """The benchmark's grid: every family x direction x shape x n in {3, 5, 8, 10}, and the rest."""
    cells = []
    ns = (3, 5, 8, 10)
    for family in FAMILIES:
        for direction in ("lower", "higher"):
            for n in ns:
                cells += [
                    Cell("threshold", family, direction, n),
                    Cell("paired", family, direction, n),
                    Cell("welch", family, direction, n),
                    Cell("welch", family, direction, n, spread=2.0),
                ]
            for spending in ("obrien-fleming", "pocock"):
                cells.append(Cell("sequential", family, direction, 10, spending=spending))
    for family in ("normal", "lognormal-1", "t2"):
        for direction in ("lower", "higher"):
            cells += [Cell("refutation", family, direction, 5), Cell("iut", family, direction, 5)]
            cells += [
                Cell(
                    "control",
                    family,
                    direction,
                    5,
                    shape=shape,
                    spread=2.0 if shape == "welch" else 1.0,
                )
                for shape in ("threshold", "paired", "welch", "two")
            ]
    for family in ("mixed-log", "mixed-linear"):
        for direction in ("lower", "higher"):
            cells += [Cell("mixed", family, direction, n) for n in ns]
    for family in ("normal", "lognormal-1", "t2"):
        for direction in ("lower", "higher"):
            cells += [
                Cell("exact", family, direction, n, shape=shape)
                for n in (5, 10)
                for shape in ("threshold", "paired")
            ]
            cells += [
                Cell("exact", family, direction, 5, shape="welch", spread=s) for s in (1.0, 2.0)
            ]
    # 10 + 10 seeds: C(20, 10) arrangements, beyond the exact limit: Monte Carlo permutation (~30 ms a decide)
    cells.append(Cell("exact", "lognormal-1", "lower", 10, shape="welch", spread=2.0))
    for family in SKEWED:
        for direction in ("lower", "higher"):
            cells += [Cell("linear-skew", family, direction, n) for n in ns]
    for acc, estimand in BOUNDED_TRUTH:
        for direction in ("lower", "higher"):
            for n in (3, 5, 8, 10):
                cells += [
                    Cell("bounded", f"{acc}-{estimand}", direction, n, shape=shape)
                    for shape in ("threshold", "paired", "welch")
                ]
            cells += [
                Cell("bounded", f"{acc}-{estimand}", direction, 10, shape="sequential", spending=sp)
                for sp in ("obrien-fleming", "pocock")
            ]
    return cells


def _accuracies(family: str, rng: np.random.Generator, size) -> np.ndarray:
    if family == "acc-discrete":
        return rng.binomial(20, 0.9, size=size) / 20.0
    collapsed = rng.random(size) < 0.1
    return np.where(collapsed, 0.3, rng.uniform(0.96, 1.0, size=size))


def _build_bounded(cell: Cell) -> Sim:
    """An accuracy threshold at its estimand's true value, or two arms of one accuracy distribution
    compared without margin (paired by seed, or Welch: the bounded-mean and sign tests pair by seed)."""
    acc, estimand = cell.family.rsplit("-", 1)
    d, n = cell.direction, cell.n
    metrics = {"x": Metric("higher", "test", 0.0, 1.0)}
    declared = {"estimand": estimand}
    if cell.shape in ("threshold", "sequential"):
        bar = BOUNDED_TRUTH[(acc, estimand)]
        supported, refuted = (
            _thr("a", "x", d, bar, **declared),
            _thr("a", "x", _flip(d), bar, **declared),
        )
        arms = ("a",)
    else:
        supported, refuted = _cmp(d, cell.shape, **declared), _cmp(_flip(d), cell.shape, **declared)
        arms = ("a", "b")
    decision = Decision.model_validate(
        {"alpha": ALPHA, "supported_if": [supported], "refuted_if": [refuted]}
    )

    def draw(rng, draws):
        return {(arm, "x"): _accuracies(acc, rng, (draws, n)) for arm in arms}

    sim = Sim(decision, metrics, [], draw)
    if cell.shape == "sequential":
        sim.contract = _sequential_contract(decision, n, cell.spending)
    return sim


def _sequential_contract(decision: Decision, n: int, spending: str) -> SimpleNamespace:
    """What `judge_sequential` reads of a contract: one arm over n seeds, looks LOOKS."""
    return SimpleNamespace(
        decision=decision,
        seeds=list(range(n)),
        arms={"a": {}},
        controls=[],
        sequential=Sequential(looks=LOOKS, spending=spending),
    )


# ---------------------------------------------------------------------------------- values
def _noise(kind: str, rng: np.random.Generator, size) -> np.ndarray:
    return rng.standard_t(2, size=size) if kind == "t2" else rng.standard_normal(size)


def _values(family: str, centre: float, spread: float, z: np.ndarray) -> np.ndarray:
    """Per-seed values whose estimand is `centre`: linear families centre + spread z; lognormal on a
    log-scale metric centre exp(spread z) (centre: the geometric mean); lognormal on a linear metric
    with mean `centre`."""
    kind, sigma, scale = (FAMILIES | SKEWED)[family]
    if kind != "lognormal":
        return centre + spread * z
    s = sigma * spread
    geometric = centre if scale == "log" else centre * math.exp(-s * s / 2)
    return geometric * np.exp(s * z)


def _normal_log_mean_zero(cv: float) -> float:
    """The centre m of a normal N(m, cv m) with E[log x] = 0 (geometric mean 1)."""

    def mean_log(m):
        sd = cv * m
        lo, hi = max(1e-12, m - 12 * sd), m + 12 * sd
        return integrate.quad(lambda x: math.log(x) * stats.norm.pdf(x, m, sd), lo, hi, limit=200)[
            0
        ]

    return float(optimize.brentq(mean_log, 0.5, 2.0, xtol=1e-14))


# ---------------------------------------------------------------------------------- one cell
@dataclass
class Sim:
    decision: Decision
    metrics: dict
    controls: list
    draw: object  # (rng, draws) -> {(arm, metric): array (draws, n)}
    support: bool = (
        True  # whether a "supported" is false (the truth at every supported_if's bar or beyond)
    )
    refute: bool = True  # whether a "refuted" is false
    validity: bool = False  # whether every control holding is false
    contract: object = None  # sequential


def _thr(arm, metric, direction, value, **kw):
    return {
        "kind": "threshold",
        "arm": arm,
        "metric": metric,
        "direction": direction,
        "value": value,
        **kw,
    }


def _cmp(direction, test, margin=None, relative=None, arm="a", other="b", **kw):
    out = {
        "kind": "compare",
        "arm": arm,
        "metric": "x",
        "other": other,
        "direction": direction,
        "test": test,
        **kw,
    }
    if margin is not None:
        out["margin"] = margin
    if relative is not None:
        out["relative_margin"] = relative
    return out


def _flip(direction: str) -> str:
    return "higher" if direction == "lower" else "lower"


def _declared(family: str) -> Metric:
    scale = (FAMILIES | SKEWED)[family][2]
    return (
        positive("lower", "test")
        if scale == "log"
        else (Metric("lower", "test", 0.0, None) if family in SKEWED else Metric("lower", "test"))
    )


def _centre(family: str) -> float:
    return LOG_CENTRE if (FAMILIES | SKEWED)[family][2] == "log" else LINEAR_CENTRE


def _compare_pair(family: str, direction: str, test: str, **kw) -> tuple[dict, dict, float]:
    """(supported_if, refuted_if, arm a's true centre given b's) of a compare with its effect at the bar."""
    if (FAMILIES | SKEWED)[family][2] == "log":
        ratio = 1 - RATIO if direction == "lower" else 1 + RATIO
        return (
            _cmp(direction, test, relative=RATIO, **kw),
            _cmp(_flip(direction), test, **kw),
            LOG_CENTRE * ratio,
        )
    shift = -MARGIN if direction == "lower" else MARGIN
    return (
        _cmp(direction, test, margin=MARGIN, **kw),
        _cmp(_flip(direction), test, margin=-MARGIN, **kw),
        LINEAR_CENTRE + shift,
    )


def _paired_draw(family: str, centres: dict[str, float], n: int):
    kind = (FAMILIES | SKEWED)[family][0]

    def draw(rng, draws):
        shared = _noise(kind, rng, (draws, n))
        return {
            (arm, "x"): _values(
                family,
                c,
                1.0,
                math.sqrt(RHO) * shared + math.sqrt(1 - RHO) * _noise(kind, rng, (draws, n)),
            )
            for arm, c in centres.items()
        }

    return draw


def _independent_draw(family: str, arms: dict[tuple[str, str], tuple[float, float]], n: int):
    """arms: (arm, metric) -> (centre, spread multiplier)."""
    kind = (FAMILIES | SKEWED)[family][0]

    def draw(rng, draws):
        return {
            key: _values(family, c, s, _noise(kind, rng, (draws, n)))
            for key, (c, s) in arms.items()
        }

    return draw


def _control(item: dict, role: str = "positive"):
    return TypeAdapter(Control).validate_python({**item, "control": role})


def build(cell: Cell) -> Sim:
    fam, d, n = cell.family, cell.direction, cell.n
    if cell.block == "mixed":
        return _build_mixed(cell)
    if cell.block == "bounded":
        return _build_bounded(cell)
    metric, centre = _declared(fam), _centre(fam)
    metrics = {"x": metric, "z": metric}
    interval = {"interval": "bootstrap"} if cell.block == "exact" else {}
    shape = cell.shape if cell.block == "exact" else cell.block
    if shape in ("threshold", "sequential", "linear-skew"):
        decision = Decision.model_validate(
            {
                "alpha": ALPHA,
                "supported_if": [_thr("a", "x", d, centre, **interval)],
                "refuted_if": [_thr("a", "x", _flip(d), centre, **interval)],
            }
        )
        sim = Sim(decision, metrics, [], _independent_draw(fam, {("a", "x"): (centre, 1.0)}, n))
        if cell.block == "sequential":
            sim.contract = _sequential_contract(decision, n, cell.spending)
        return sim
    if shape in ("paired", "welch"):
        supported, refuted, centre_a = _compare_pair(fam, d, shape, **interval)
        decision = Decision.model_validate(
            {"alpha": ALPHA, "supported_if": [supported], "refuted_if": [refuted]}
        )
        draw = (
            _paired_draw(fam, {"a": centre_a, "b": centre}, n)
            if shape == "paired"
            else _independent_draw(
                fam, {("a", "x"): (centre_a, 1.0), ("b", "x"): (centre, 1.0 / cell.spread)}, n
            )
        )
        return Sim(decision, metrics, [], draw)
    if cell.block == "refutation":  # three ways to refute, each at its bar
        decision = Decision.model_validate(
            {
                "alpha": ALPHA,
                "supported_if": [_thr("a", "x", d, centre)],
                "refuted_if": [_thr("a", "x", _flip(d), centre), _thr("a", "z", _flip(d), centre)],
            }
        )
        return Sim(
            decision,
            metrics,
            [],
            _independent_draw(fam, {("a", "x"): (centre, 1.0), ("a", "z"): (centre, 1.0)}, n),
        )
    if (
        cell.block == "iut"
    ):  # z clearly holds (6 spreads on the right side of its bar), x at its bar
        far = _shifted(fam, centre, 6.0, d)
        decision = Decision.model_validate(
            {
                "alpha": ALPHA,
                "supported_if": [_thr("a", "x", d, centre), _thr("a", "z", d, centre)],
                "refuted_if": [_thr("a", "x", _flip(d), centre)],
            }
        )
        return Sim(
            decision,
            metrics,
            [],
            _independent_draw(fam, {("a", "x"): (centre, 1.0), ("a", "z"): (far, 1.0)}, n),
            refute=True,
        )
    if cell.block == "control":
        return _build_control(cell, metric, centre)
    raise ValueError(f"unknown block {cell.block!r}")


def _shifted(family: str, centre: float, spreads: float, direction: str) -> float:
    """A centre `spreads` spreads on the holding side of a `direction` condition at `centre`."""
    sign = -1.0 if direction == "lower" else 1.0
    if (FAMILIES | SKEWED)[family][2] == "log":
        return centre * math.exp(sign * spreads * FAMILIES[family][1])
    return centre + sign * spreads * LINEAR_SD


def _build_control(cell: Cell, metric: Metric, centre: float) -> Sim:
    """The decision (on arm a's metric y, far on the holding side) clearly supported; the control(s) on arms
    base and nosource at their bar."""
    fam, d, n = cell.family, cell.direction, cell.n
    good = _shifted(fam, centre, 6.0, "higher")
    decision = Decision.model_validate(
        {
            "alpha": ALPHA,
            "supported_if": [_thr("a", "y", "higher", centre)],
            "refuted_if": [_thr("a", "y", "lower", centre)],
        }
    )
    metrics = {"x": metric, "y": metric}
    arms = {("a", "y"): (good, 1.0)}
    if cell.shape in ("threshold", "two"):
        controls = [_control(_thr("base", "x", d, centre))]
        arms[("base", "x")] = (centre, 1.0)
        if (
            cell.shape == "two"
        ):  # a second control that clearly holds: intersection-union, no inflation
            controls.append(_control(_thr("nosource", "x", d, centre)))
            arms[("nosource", "x")] = (_shifted(fam, centre, 6.0, d), 1.0)
        draw = _independent_draw(fam, arms, n)
    else:
        supported, _, centre_base = _compare_pair(fam, d, cell.shape, arm="base", other="nosource")
        controls = [_control(supported)]
        if cell.shape == "paired":
            pair = _paired_draw(fam, {"base": centre_base, "nosource": centre}, n)
            rest = _independent_draw(fam, arms, n)

            def draw(rng, draws):
                return {**pair(rng, draws), **rest(rng, draws)}
        else:
            arms[("base", "x")] = (centre_base, 1.0)
            arms[("nosource", "x")] = (centre, 1.0 / cell.spread)
            draw = _independent_draw(fam, arms, n)
    return Sim(decision, metrics, controls, draw, support=False, refute=False, validity=True)


def _build_mixed(cell: Cell) -> Sim:
    """Arm a lognormal sigma 1, arm b normal (sd MIXED_B_CV of its centre), equal geometric means on a positive
    metric (mixed-log) or equal means on a linear metric (mixed-linear); compare without margin, mirrored."""
    d, n = cell.direction, cell.n
    if cell.family == "mixed-log":
        metric, geo_a, centre_b = positive("lower", "test"), 1.0, _normal_log_mean_zero(MIXED_B_CV)
    else:
        metric, geo_a = Metric("lower", "test"), 1.0
        centre_b = math.exp(0.5)  # the lognormal(0, 1)'s mean
    decision = Decision.model_validate(
        {
            "alpha": ALPHA,
            "supported_if": [_cmp(d, "welch")],
            "refuted_if": [_cmp(_flip(d), "welch")],
        }
    )

    def draw(rng, draws):
        a = geo_a * np.exp(rng.standard_normal((draws, n)))
        b = centre_b * (1 + MIXED_B_CV * rng.standard_normal((draws, n)))
        return {("a", "x"): a, ("b", "x"): np.maximum(b, 1e-9)}  # b <= 0 has probability ~1e-11

    return Sim(decision, {"x": metric}, [], draw)


# ---------------------------------------------------------------------------------- simulate
def _runs(values: dict[tuple[str, str], np.ndarray], i: int, n: int) -> list[RunRecord]:
    by_arm: dict[str, dict[str, list[float]]] = {}
    for (arm, metric), a in values.items():
        by_arm.setdefault(arm, {})[metric] = a[i].tolist()
    return [
        RunRecord(arm=arm, seed=s, status="completed", metrics={m: xs[s] for m, xs in ms.items()})
        for arm, ms in by_arm.items()
        for s in range(n)
    ]


def simulate(cell: Cell, draws: int) -> dict:
    """One cell: verdict counts, false rates and the tests the engine chose, from `draws` simulated
    experiments drawn by a generator seeded with the cell's name."""
    sim = build(cell)
    rng = np.random.default_rng([SEED, zlib.crc32(cell.name.encode())])
    values = sim.draw(rng, draws)
    verdicts, tests, looks = Counter(), Counter(), Counter()
    valid = 0
    started = time.perf_counter()
    with mock.patch.object(_Stat, "needed", lambda self, level: None):
        for i in range(draws):
            runs = _runs(values, i, cell.n)
            if sim.contract is not None:
                result = judge_sequential(sim.contract, runs, sim.metrics)
                looks[len(result.looks)] += 1
            else:
                result = decide(sim.decision, runs, sim.metrics, controls=sim.controls)
            verdicts[result.verdict] += 1
            judged = result.controls[0] if sim.validity else result.conditions[0]
            tests[f"{judged.test} ({judged.scale})"] += 1
            valid += bool(result.controls) and all(c.outcome == "holds" for c in result.controls)
    rates = {
        "false_support": verdicts["supported"] / draws if sim.support else None,
        "false_refutation": verdicts["refuted"] / draws if sim.refute else None,
        "false_validity": valid / draws if sim.validity else None,
    }
    bound = ALPHA + slack(draws)
    return {
        "name": cell.name,
        **asdict(cell),
        "draws": draws,
        **rates,
        **{
            f"se_{k}": (math.sqrt(r * (1 - r) / draws) if r is not None else None)
            for k, r in rates.items()
        },
        "above": [k for k, r in rates.items() if r is not None and r > bound],
        "verdicts": dict(verdicts),
        "tests": dict(tests),
        "stopped_at_look": dict(sorted(looks.items())),
        "seconds": round(time.perf_counter() - started, 2),
    }


def _simulate_args(args: tuple[Cell, int]) -> dict:
    return simulate(*args)


def run_cells(cells: list[Cell], draws: int, workers: int = 2) -> dict[str, dict]:
    """Every cell's result by name; `workers` processes (fork) when available, the costliest cells first."""
    order = sorted(cells, key=lambda c: -c.decides * c.n**0.25)
    jobs = [(c, draws) for c in order]
    if workers > 1 and len(cells) > 1 and "fork" in multiprocessing.get_all_start_methods():
        with multiprocessing.get_context("fork").Pool(min(workers, len(cells))) as pool:
            out = pool.map(_simulate_args, jobs, chunksize=1)
    else:
        out = [_simulate_args(job) for job in jobs]
    return {r["name"]: r for r in out}


# ---------------------------------------------------------------------------------- report
def _rate(r: dict, key: str) -> str:
    rate = r[key]
    if rate is None:
        return "-"
    flag = " **ABOVE**" if key in r["above"] else ""
    return f"{rate:.3f} ± {r['se_' + key]:.3f}{flag}"


PROMISED = (
    "threshold",
    "paired",
    "welch",
    "sequential",
    "refutation",
    "iut",
    "control",
    "exact",
    "bounded",
)


def summary(results: dict[str, dict]) -> list[str]:
    """The largest rate of each block over its cells (mixed and linear-skew: per distribution), as table lines."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in results.values():
        block = f"{r['block']} {r['shape']}".strip()
        groups.setdefault((block, "" if r["block"] in PROMISED else r["family"]), []).append(r)
    lines = [
        "## Summary: the largest rate per block",
        "",
        "| block | distributions | n | cells | false support | false refutation | false validity | cells above |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for (block, family), rows in groups.items():
        families = family or ", ".join(dict.fromkeys(r["family"] for r in rows))
        ns = ", ".join(str(n) for n in sorted({r["n"] for r in rows}))
        worst = []
        for key in ("false_support", "false_refutation", "false_validity"):
            rates = [r[key] for r in rows if r[key] is not None]
            worst.append(f"{max(rates):.3f}" if rates else "-")
        above = sum(bool(r["above"]) for r in rows)
        lines.append(
            f"| {block} | {families} | {ns} | {len(rows)} | {' | '.join(worst)} | "
            f"{f'**{above}**' if above else 0} |"
        )
    return lines


def markdown(results: dict[str, dict], draws: int, seconds: float) -> str:
    bound = ALPHA + slack(draws)
    intro = (
        f"The truth sits exactly at each bar: every rate below is of a false result and the engine promises "
        f"it at most alpha. ± is the Monte Carlo standard error of that rate; the standard error at alpha "
        f"is {math.sqrt(ALPHA * (1 - ALPHA) / draws):.4f}, and a cell above alpha + 3 of those "
        f"({bound:.4f}) is marked ABOVE. `-`: not a false result in that cell's design. Written by "
        f"`python benchmarks/verdict_levels.py --draws {draws} --json` in {seconds:.0f} s."
    )
    header = (
        "| block | distribution | direction | n | spread a:b | looks | false support | false refutation | "
        "false validity | tests (share of draws) |"
    )
    lines = [
        f"# Verdict levels ({draws} draws per cell, alpha {ALPHA:g})",
        "",
        intro,
        "",
        *summary(results),
        "",
        "## Every cell",
        "",
        header,
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results.values():
        total = sum(r["tests"].values())
        tests = ", ".join(
            f"{t} {k / total:.0%}" for t, k in sorted(r["tests"].items(), key=lambda x: -x[1])
        )
        block = f"{r['block']} {r['shape']}".strip()
        looks = f"{LOOKS} {r['spending']}" if r["spending"] else ""
        lines.append(
            f"| {block} | {r['family']} | {r['direction']} | {r['n']} | {r['spread']:g} | {looks} | "
            f"{_rate(r, 'false_support')} | {_rate(r, 'false_refutation')} | {_rate(r, 'false_validity')} | "
            f"{tests} |"
        )
    above = [r for r in results.values() if r["above"]]
    lines += ["", "## Above the level", ""]
    lines += [
        f"- `{r['name']}`: " + ", ".join(f"{k.replace('_', ' ')} {r[k]:.3f}" for k in r["above"])
        for r in above
    ] or ["none"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=2000, help="simulated experiments per cell")
    parser.add_argument(
        "--workers", type=int, default=min(2, os.cpu_count() or 1), help="processes (fork)"
    )
    parser.add_argument(
        "--only",
        nargs="*",
        default=None,
        metavar="SUBSTRING",
        help="only the cells whose name contains one of these (e.g. threshold/lognormal-1)",
    )
    parser.add_argument(
        "--ci", action="store_true", help="only the cells tests/test_levels.py asserts"
    )
    parser.add_argument(
        "--json",
        type=Path,
        nargs="?",
        const=RESULTS / "verdict_levels.json",
        default=None,
        metavar="PATH",
        help="write the results here (default benchmarks/results/verdict_levels.json) "
        "and the table next to it (.md) unless --markdown says where",
    )
    parser.add_argument(
        "--markdown",
        type=Path,
        nargs="?",
        const=RESULTS / "verdict_levels.md",
        default=None,
        metavar="PATH",
        help="write the table here (default benchmarks/results/verdict_levels.md)",
    )
    parser.add_argument(
        "--render",
        type=Path,
        default=None,
        metavar="JSON",
        help="print (and with --markdown write) the tables of a results JSON; no simulation",
    )
    args = parser.parse_args(argv)
    if args.render is not None:
        saved = json.loads(args.render.read_text())
        table = markdown({c["name"]: c for c in saved["cells"]}, saved["draws"], saved["seconds"])
        print(table)
        if args.markdown is not None:
            args.markdown.write_text(table)
        return saved
    cells = ci_cells() if args.ci else full_cells()
    if args.only:
        cells = [c for c in cells if any(s in c.name for s in args.only)]
    started = time.perf_counter()
    results = run_cells(cells, args.draws, args.workers)
    results = {c.name: results[c.name] for c in cells}  # the grid's order
    seconds = round(time.perf_counter() - started, 1)
    table = markdown(results, args.draws, seconds)
    print(table)
    above = [r["name"] for r in results.values() if r["above"]]
    print(
        f"{len(cells)} cells x {args.draws} draws in {seconds:.1f} s on {args.workers} worker(s); "
        f"{len(above)} above alpha + {slack(args.draws):.4f}",
        file=sys.stderr,
    )
    out = {
        "alpha": ALPHA,
        "draws": args.draws,
        "slack": slack(args.draws),
        "bound": ALPHA + slack(args.draws),
        "seconds": seconds,
        "workers": args.workers,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "engine_version": ENGINE_VERSION,
        "seed": SEED,
        "above": above,
        "cells": list(results.values()),
    }
    markdown_path = args.markdown or (
        args.json.with_suffix(".md") if args.json is not None else None
    )
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(json_safe(out), indent=2) + "\n")
    if markdown_path is not None:
        markdown_path.parent.mkdir(parents=True, exist_ok=True)
        markdown_path.write_text(table)
    return out


if __name__ == "__main__":
    main()
