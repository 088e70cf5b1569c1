"""How long the claims dashboard takes to load with 50 contracts.

Builds, in a temp folder: 50 C05-style contracts (3-6 arms x 3-5 seeds, 6-8 conditions each), their
evidence (synthetic per-seed final metrics, decided by the real gates.verdict and written by the real
ledger, so `gates verify` holds) and an MLflow SQLite store with 20 evaluation points of every metric
for every run (~900 runs). Then starts `gates dashboard` on a free port and times over HTTP: the
index and one contract page, cold (first request after the server prints its address) and warm
(median of 5), plus a second contract page never opened before, and `gates report --html`.

    python benchmarks/dashboard_load.py [--contracts 50]
"""

from __future__ import annotations

import argparse
import copy
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
CONTRACTS, POINTS, STEPS = 50, 20, 300
METRICS = (
    "train_loss",
    "train_acc",
    "test_acc",
    "hit_at_3",
    "mean_rank",
    "route_valid_rate",
    "test_loss",
)
EXTRA_ARMS = {
    "subheap_kernel_h16": ("subheap_kernel", 16),
    "flat_address_h64": ("flat_address", 64),
}


def make_contract(i: int, rng: random.Random) -> dict:
    data = yaml.safe_load((ROOT / "contracts" / "c05-structural-probe.yaml").read_text())
    data["id"] = f"bench-{i:02d}"
    data["claim"] = f"Synthetic claim {i}: " + data["claim"]
    data["seeds"] = list(range(rng.randint(3, 5)))
    data.pop("replay", None)
    n_arms = rng.randint(3, 6)
    if n_arms == 3:  # drop path_only and the conditions that name it
        del data["arms"]["path_only"]
        for name in ("supported_if", "refuted_if"):
            data["decision"][name] = [c for c in data["decision"][name] if c["arm"] != "path_only"]
    for name, (features, hidden) in list(EXTRA_ARMS.items())[: max(0, n_arms - 4)]:
        data["arms"][name] = {
            **copy.deepcopy(data["arms"][features]),
            "features": features,
            "hidden": hidden,
        }
    return data


def final_metrics(arm: str, rng: random.Random) -> dict[str, float]:
    good = "subheap" in arm
    acc = min(1.0, rng.gauss(0.97, 0.02)) if good else max(0.0, rng.gauss(0.03, 0.02))
    return {
        "train_loss": abs(rng.gauss(0.01 if good else 1.8, 0.01)),
        "train_acc": 1.0 if good else 0.26,
        "test_acc": acc,
        "hit_at_3": min(1.0, acc + 0.02),
        "mean_rank": 1 + (1 - acc) * 50,
        "route_valid_rate": 1.0,
        "test_loss": abs(rng.gauss(0.01 if good else 6.5, 0.1)),
    }


def build(root: Path, contracts: int = CONTRACTS) -> tuple[str, int]:
    """contracts/, runs/ and mlflow.db under root; (tracking URI, number of runs)."""
    from mlflow.entities import Metric

    from gates.contract import load_contract
    from gates.entities import RunRecord
    from gates.inference import judge
    from gates.record import EVIDENCE_FORMAT, Tracker, record_entry, write_evidence

    rng = random.Random(0)
    (root / "contracts").mkdir()
    uri = f"sqlite:///{root / 'mlflow.db'}"
    tracker = Tracker(uri)
    n_runs = 0
    for i in range(contracts):
        data = make_contract(i, rng)
        path = root / "contracts" / f"{data['id']}.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        loaded = load_contract(path)
        exp = tracker.experiment_id(loaded.id)
        parent = tracker.client.create_run(
            exp, tags={"gates.role": "contract", "gates.contract": loaded.id}
        )
        records = []
        for seed in data["seeds"]:
            for arm in data["arms"]:
                final = final_metrics(arm, rng)
                run = tracker.client.create_run(
                    exp,
                    tags={
                        "mlflow.parentRunId": parent.info.run_id,
                        "gates.contract": loaded.id,
                        "gates.arm": arm,
                    },
                )
                steps = [STEPS * (k + 1) // POINTS for k in range(POINTS)]
                points = [
                    Metric(m, final[m] * (0.5 + 0.5 * (k + 1) / POINTS), 0, s)
                    for m in METRICS
                    for k, s in enumerate(steps)
                ]
                for chunk in range(0, len(points), 1000):
                    tracker.client.log_batch(run.info.run_id, metrics=points[chunk : chunk + 1000])
                records.append(
                    {
                        "arm": arm,
                        "seed": seed,
                        "status": "completed",
                        "halt_reason": None,
                        "halt_detail": None,
                        "metrics": final,
                        "seconds": 1.0,
                        "first_signal": None,
                        "mlflow_run_id": run.info.run_id,
                    }
                )
                n_runs += 1
        runs = [RunRecord.model_validate(r) for r in records]  # as the verdict engine reads them
        result = judge(loaded.contract, runs, loaded.study.metrics).to_dict()
        written = write_evidence(
            root / "runs",
            {
                "format": EVIDENCE_FORMAT,
                "contract_id": loaded.id,
                "contract_path": f"contracts/{path.name}",
                "contract_sha256": loaded.sha256,
                "claim": data["claim"],
                "source": data["source"],
                "study": data["study"],
                "verdict": result["verdict"],
                "reasons": result["reasons"],
                "settle": result["settle"],
                "git_commit": "0" * 40,
                "git_dirty": "false",
                "code_sha256": "0" * 64,
                "gates_version": "0.1.0",
                "created_at": "2026-01-01T00:00:00+00:00",
                "settings": {
                    "alpha": 0.05,
                    "evaluation": "interval",
                    "correction": result["correction"],
                    "seeds": data["seeds"],
                    "budget": data["budget"],
                    "arm_configs": data["arms"],
                },
                "mlflow": {
                    "tracking_uri": uri,
                    "experiment_id": exp,
                    "parent_run_id": parent.info.run_id,
                },
                "preflight": {"arms": {}, "notes": []},
                "falsifiable_point": None,
                "runs": records,
                "conditions": result["conditions"],
                "halts": result["halts"],
            },
        )
        record_entry(root / "runs", written, "recorded")  # indexed, as `gates run` does
    return uri, n_runs


def get(url: str) -> tuple[float, int]:
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=120) as r:
        size = len(r.read())
        assert r.status == 200
    return time.perf_counter() - started, size


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--contracts", type=int, default=CONTRACTS, help="how many contracts (at least 2)"
    )
    n = max(2, parser.parse_args(argv).contracts)
    page, other = f"bench-{min(7, n - 1):02d}", f"bench-{min(31, n - 2):02d}"
    with tempfile.TemporaryDirectory(prefix="gates-dash-bench-") as tmp:
        root = Path(tmp)
        started = time.perf_counter()
        uri, n_runs = build(root, n)
        print(
            f"built {n} contracts, {n_runs} runs x {len(METRICS)} metrics x {POINTS} points "
            f"in {time.perf_counter() - started:.1f} s"
        )
        started = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-m", "gates", "dashboard", "--port", "0", "--tracking-uri", uri],
            cwd=root,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        try:
            url = re.search(r"http://\S+/", proc.stdout.readline()).group(0)
            startup = time.perf_counter() - started
            cold_index, index_size = get(url)
            cold_page, page_size = get(url + f"contract/{page}")
            warm_index = statistics.median(get(url)[0] for _ in range(5))
            warm_page = statistics.median(get(url + f"contract/{page}")[0] for _ in range(5))
            other_page, _ = get(url + f"contract/{other}")
        finally:
            proc.terminate()
            proc.wait(timeout=10)
        started = time.perf_counter()
        subprocess.run(
            [
                sys.executable,
                "-m",
                "gates",
                "report",
                "--html",
                str(root / "report"),
                "--tracking-uri",
                uri,
            ],
            cwd=root,
            check=True,
            capture_output=True,
        )
        report = time.perf_counter() - started
    print(f"server start to listening: {startup * 1000:.0f} ms")
    print(
        f"index ({n} contracts, {index_size / 1024:.0f} KiB): cold {cold_index * 1000:.0f} ms, "
        f"warm {warm_index * 1000:.1f} ms (median of 5)"
    )
    print(
        f"contract page ({page_size / 1024:.0f} KiB): cold {cold_page * 1000:.0f} ms, warm {warm_page * 1000:.1f} ms "
        f"(median of 5); another contract's first view {other_page * 1000:.0f} ms"
    )
    print(f"gates report --html ({n + 1} pages, whole command): {report:.1f} s")


if __name__ == "__main__":
    main()
