"""CLI latency: wall time of `gates --help`, `gates status`, `gates studies` and `gates check` of the C05
contract, each in a fresh process.

Every command is started `--repeats` times (after one untimed warm-up run that fills the OS file
cache and Python's bytecode cache) in the repository root, so `gates status` lists the committed
claims. The median is reported against the target (under 1 s each). `gates check` of a C05 contract
imports its study, whose module imports torch at its top (as every study of this repository's does):
torch alone takes longer than the target, so that command is timed without one (a study without
torch is checked in well under a second: the check imports neither scipy.stats nor MLflow). The
console script installed beside this Python is used (`gates`, as a user types it), else
`python -m gates`.

    python benchmarks/cli_latency.py [--repeats 5] [--json PATH] [--cwd DIR] [--module]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHECKED = "contracts/c05-structural-probe-v3.yaml"
COMMANDS = (("--help",), ("status",), ("studies",), ("check", CHECKED))
TARGET_S = 1.0
# commands whose time is bound by what the study imports, not by the platform: no target
NO_TARGET = {("check", CHECKED): "imports the study, and so torch"}


def launcher(module: bool = False) -> list[str]:
    script = Path(sys.executable).parent / "gates"
    if module or not (script.is_file() and os.access(script, os.X_OK)):
        return [sys.executable, "-m", "gates"]
    return [str(script)]


def timed(argv: list[str], cwd: Path) -> float:
    started = time.perf_counter()
    done = subprocess.run(
        argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(
            f"{' '.join(argv)} failed (exit {done.returncode}): {done.stderr.strip()[-500:]}"
        )
    return elapsed


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--repeats", type=int, default=5, help="timed runs per command (median reported)"
    )
    parser.add_argument(
        "--json", type=Path, default=None, metavar="PATH", help="also write the results here"
    )
    parser.add_argument(
        "--cwd", type=Path, default=ROOT, help="project folder to run in (default: this repository)"
    )
    parser.add_argument(
        "--module",
        action="store_true",
        help="run `python -m gates` (the gates package found "
        "from --cwd first, e.g. another checkout) instead of the installed console script",
    )
    args = parser.parse_args(argv)
    base = launcher(args.module)
    claims = len(list((args.cwd / "runs").glob("*/evidence.json")))
    results = {
        "launcher": " ".join(base),
        "cwd": str(args.cwd),
        "claims": claims,
        "repeats": args.repeats,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "target_s": TARGET_S,
        "commands": {},
    }
    print(
        f"{' '.join(base)} in {args.cwd} ({claims} claims with evidence), median of {args.repeats} fresh processes"
    )
    width = max(len("gates " + " ".join(c)) for c in COMMANDS)
    for command in COMMANDS:
        if command[0] == "check" and not (args.cwd / command[1]).is_file():
            print(f"  gates {' '.join(command)}: skipped (no such file in {args.cwd})")
            continue
        argv_ = base + list(command)
        timed(argv_, args.cwd)  # warm-up: file cache, bytecode
        times = [timed(argv_, args.cwd) for _ in range(args.repeats)]
        median = statistics.median(times)
        name = "gates " + " ".join(command)
        results["commands"][name] = {
            "median_s": round(median, 3),
            "min_s": round(min(times), 3),
            "max_s": round(max(times), 3),
            "times_s": [round(t, 3) for t in times],
        }
        if command in NO_TARGET:
            results["commands"][name]["target_s"] = None
            verdict = f"no target ({NO_TARGET[command]})"
        else:
            verdict = f"target < {TARGET_S:g} s: " + ("ok" if median < TARGET_S else "ABOVE TARGET")
        print(
            f"  {name:<{width}} median {median:.3f} s  (min {min(times):.3f}, max {max(times):.3f})  "
            f"{verdict}"
        )
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return results


if __name__ == "__main__":
    main()
