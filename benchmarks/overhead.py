"""Platform overhead: the same C05 training loop bare vs under the platform.

Bare: the study with a reporter that records nothing. Platform: reporter + stop rules (futility,
divergence, budget) + batched MLflow logging into a fresh SQLite store, one evaluation per 10 steps,
including creating and closing the MLflow run. Prints the wall-time ratio (target <= 1.05) and
the time to log 10,000 metric points through the reporter (target < 5 s on SQLite).

    python benchmarks/overhead.py [--steps 300] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from gates.contract import StopRules
from gates.execution import PlatformReporter, StopRuleEngine
from gates.models.c05_probe import C05ProbeStudy
from gates.record import MLflowMetricSink, Tracker
from gates.study import Budget, NullReporter

RULES = StopRules.model_validate(
    {
        "futility": [
            {
                "metric": "train_acc",
                "at_step": 150,
                "worse_than": 0.5,
                "window": 50,
                "min_rel_improvement": 0.01,
            }
        ],
        "divergence": {"metrics": ["train_loss"]},
        "budget": {"max_seconds": 3600},
    }
)


def bare(study, config, budget) -> float:
    started = time.perf_counter()
    study.run(config, 0, NullReporter(budget))
    return time.perf_counter() - started


def platform(study, config, budget, tracker: Tracker, experiment_id: str) -> float:
    started = time.perf_counter()
    run_id = tracker.client.create_run(experiment_id).info.run_id
    sink = MLflowMetricSink(tracker.client, run_id)
    reporter = PlatformReporter(
        budget, StopRuleEngine(RULES, "subheap_kernel", study.metrics), sink
    )
    study.run(config, 0, reporter)
    sink.flush()
    tracker.client.set_terminated(run_id)
    return time.perf_counter() - started


def log_points(
    tracker: Tracker, experiment_id: str, points: int = 10_000, per_report: int = 10
) -> float:
    run_id = tracker.client.create_run(experiment_id).info.run_id
    sink = MLflowMetricSink(tracker.client, run_id)
    reporter = PlatformReporter(Budget(points, 1), StopRuleEngine(StopRules(), "a", {}), sink)
    started = time.perf_counter()
    for step in range(points // per_report):
        reporter.report(step, {f"metric_{i}": step * 0.001 + i for i in range(per_report)})
    sink.flush()
    elapsed = time.perf_counter() - started
    logged = sum(
        len(tracker.client.get_metric_history(run_id, f"metric_{i}")) for i in range(per_report)
    )
    assert logged == points, f"logged {logged} of {points} points"
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    study = C05ProbeStudy()
    config = study.Config(features="subheap_kernel")
    budget = Budget(args.steps, 10)
    with tempfile.TemporaryDirectory() as tmp:
        tracker = Tracker(f"sqlite:///{Path(tmp) / 'mlflow.db'}")
        experiment_id = tracker.experiment_id("overhead-benchmark")
        bare(study, config, budget)  # warm-up: imports, allocator, first MLflow calls
        platform(study, config, budget, tracker, experiment_id)
        bare_times, platform_times = [], []
        for _ in range(args.repeats):  # interleaved so drift in machine load hits both alike
            bare_times.append(bare(study, config, budget))
            platform_times.append(platform(study, config, budget, tracker, experiment_id))
        log_seconds = log_points(tracker, experiment_id)

    b, p = statistics.median(bare_times), statistics.median(platform_times)
    print(f"C05 subheap_kernel, {args.steps} steps, eval every 10, median of {args.repeats}")
    print(f"  bare      {b:8.3f} s")
    print(
        f"  platform  {p:8.3f} s  (reporter + stop rules + MLflow SQLite, run create/close included)"
    )
    print(f"  ratio     {p / b:8.3f}   target <= 1.05  {'OK' if p / b <= 1.05 else 'MISSED'}")
    print(
        f"log 10,000 metric points through the reporter into SQLite: {log_seconds:.3f} s   "
        f"target < 5 s  {'OK' if log_seconds < 5 else 'MISSED'}"
    )


if __name__ == "__main__":
    main()
