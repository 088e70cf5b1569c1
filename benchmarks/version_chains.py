"""Version chains: how often a claim re-tried as new versions ends supported when it is false.

A researcher registers a claim, and whenever a version's verdict is inconclusive registers the next
version with more seeds (issue #38: the record shows the pattern four times). Each draw simulates one
such chain through the verdict engine itself (`verdict.decide`, at the level `record.Family` gives each
version), per-seed values normal with the mean exactly at the bar of a threshold `x >= bar` (refuted_if
the mirror), and counts a false support when any version is supported. Rules compared:

- `full-same`: what the record did before families: every version at full alpha on seeds 0..n-1 (a
  later version re-uses the earlier seeds);
- `full-fresh`: every version at full alpha on fresh seeds: fresh seeds alone do not make it a new test;
- `family`: the platform's rule (gates.record._family): one family alpha; the first version declares
  `alpha` 0.05 with no `family_alpha`, so a re-try is judged at what is left, nothing;
- `family-split`: the first version declares `family_alpha: 0.05` and each version the same share of it
  (0.05 / the chain's length), on fresh seeds (the family's next).

    python benchmarks/version_chains.py [--draws 2000] [--json [PATH]]

`--json` writes benchmarks/results/version_chains.json and the table next to it (.md).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import zlib
from pathlib import Path
from unittest import mock

import numpy as np

from gates.contract import Decision
from gates.entities import RunRecord
from gates.inference import ENGINE_VERSION, decide
from gates.inference._statistics import _Stat
from gates.record import Family, Version
from gates.study import Metric

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
ALPHA = 0.05
SEED = 20261204
CHAINS = ([3, 10], [5, 10], [5, 10, 20], [3, 5, 8, 10])
RULES = ("full-same", "full-fresh", "family", "family-split")
DECISION = Decision.model_validate(
    {
        "alpha": ALPHA,
        "supported_if": [
            {"kind": "threshold", "arm": "a", "metric": "x", "direction": "higher", "value": 0.0}
        ],
        "refuted_if": [
            {"kind": "threshold", "arm": "a", "metric": "x", "direction": "lower", "value": 0.0}
        ],
    }
)
METRICS = {"x": Metric("higher", "test")}


def _runs(values: np.ndarray) -> list[RunRecord]:
    return [
        RunRecord(arm="a", seed=s, status="completed", metrics={"x": float(x)})
        for s, x in enumerate(values)
    ]


def chain_verdict(chain: list[int], rule: str, rng: np.random.Generator) -> str:
    """The first decided verdict of one simulated chain (or the last version's, inconclusive)."""
    fresh = rule != "full-same"
    own = ALPHA / len(chain) if rule == "family-split" else ALPHA
    family = Family("claim", ALPHA if rule.startswith("family") else math.inf)
    same = rng.standard_normal(max(chain))
    verdict = "inconclusive"
    for k, n in enumerate(chain):
        values = rng.standard_normal(n) if fresh else same[:n]
        level = family.level(own)
        if level <= 0:
            break  # the family left nothing: `gates check` refuses the version, the chain ends
        verdict = decide(DECISION, _runs(values), METRICS, alpha=level).verdict
        family = Family(
            family.root, family.alpha, (*family.earlier, Version(f"v{k + 1}", level, (), True))
        )
        if verdict != "inconclusive":
            break
    return verdict


def simulate(chain: list[int], rule: str, draws: int) -> dict:
    name = f"{'->'.join(map(str, chain))}/{rule}"
    rng = np.random.default_rng([SEED, zlib.crc32(name.encode())])
    started = time.perf_counter()
    counts: dict[str, int] = {}
    with mock.patch.object(_Stat, "needed", lambda self, level: None):  # power planning: unused
        for _ in range(draws):
            verdict = chain_verdict(chain, rule, rng)
            counts[verdict] = counts.get(verdict, 0) + 1
    support = counts.get("supported", 0) / draws
    refute = counts.get("refuted", 0) / draws
    bound = ALPHA + 3 * math.sqrt(ALPHA * (1 - ALPHA) / draws)
    return {
        "name": name,
        "chain": chain,
        "rule": rule,
        "draws": draws,
        "false_support": support,
        "false_refutation": refute,
        "se_false_support": math.sqrt(support * (1 - support) / draws),
        "above": [
            k for k, r in (("false_support", support), ("false_refutation", refute)) if r > bound
        ],
        "verdicts": counts,
        "seconds": round(time.perf_counter() - started, 2),
    }


def markdown(results: list[dict], draws: int, seconds: float) -> str:
    lines = [
        f"# Version chains ({draws} draws per cell, alpha {ALPHA:g}, engine {ENGINE_VERSION})",
        "",
        "A false claim (normal per-seed values, mean exactly at the bar of `x >= bar`) re-tried as a new "
        "version whenever a version is inconclusive; a rate is the share of chains in which some version "
        "ends supported (false support) or refuted (false refutation). `full-same` and `full-fresh` are "
        "what testing every version at full alpha gives (on the same seeds, on fresh ones); `family` and "
        "`family-split` are the platform's rule (a family's versions share one alpha). Written by "
        f"`python benchmarks/version_chains.py --draws {draws} --json` in {seconds:.0f} s.",
        "",
        "| chain (seeds) | " + " | ".join(RULES) + " |",
        "|---|" + "---|" * len(RULES),
    ]
    by = {(tuple(r["chain"]), r["rule"]): r for r in results}
    for chain in CHAINS:
        cells = []
        for rule in RULES:
            r = by.get((tuple(chain), rule))
            cells.append(
                "-"
                if r is None
                else f"{r['false_support']:.3f} / {r['false_refutation']:.3f}"
                + (" **ABOVE**" if r["above"] else "")
            )
        lines.append(f"| {' -> '.join(map(str, chain))} | " + " | ".join(cells) + " |")
    lines += ["", "Each cell: false support / false refutation."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=2000, help="simulated chains per cell")
    parser.add_argument(
        "--json",
        type=Path,
        nargs="?",
        const=RESULTS / "version_chains.json",
        default=None,
        metavar="PATH",
        help="write the results here (default benchmarks/results/version_chains.json) and the "
        "table next to it (.md)",
    )
    args = parser.parse_args(argv)
    started = time.perf_counter()
    results = [simulate(list(c), rule, args.draws) for c in CHAINS for rule in RULES]
    seconds = round(time.perf_counter() - started, 1)
    table = markdown(results, args.draws, seconds)
    print(table)
    promised = [r["name"] for r in results if r["rule"].startswith("family") and r["above"]]
    print(f"{len(promised)} family cells above the level", file=sys.stderr)
    out = {
        "alpha": ALPHA,
        "draws": args.draws,
        "seconds": seconds,
        "engine_version": ENGINE_VERSION,
        "seed": SEED,
        "family_cells_above": promised,
        "cells": results,
    }
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2) + "\n")
        args.json.with_suffix(".md").write_text(table)
    return out


if __name__ == "__main__":
    main()
