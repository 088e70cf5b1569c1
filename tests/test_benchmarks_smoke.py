"""Smoke test of benchmarks/tree_read.py at tiny sizes (random keys, one thread, a few seconds)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "tree_read.py"


def load_benchmark():
    if "tree_read_benchmark" in sys.modules:
        return sys.modules["tree_read_benchmark"]
    spec = importlib.util.spec_from_file_location("tree_read_benchmark", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file executes
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("with_faiss", [False, True])
def test_tree_read_benchmark_runs_at_tiny_sizes(capsys, with_faiss):
    if with_faiss:
        pytest.importorskip("faiss")
    bench = load_benchmark()
    argv = ["--sizes", "256", "--queries", "32", "--fit-queries", "64", "--steps", "2", "--repeats", "1",
            "--source", "random", "--threads", "1", "--drill-iterations", "1", "--d", "32"]
    threads = torch.get_num_threads()
    try:
        results = bench.main(argv + ([] if with_faiss else ["--no-faiss"]))
    finally:  # the benchmark sets the process-wide thread count; leave it as other tests expect
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    rows = {row.method: row for row in results[256]["rows"]}
    expected = {"dense exact", "TreeHeap beam", "TreeHeap drill-down"}
    if with_faiss:
        expected |= {"faiss HNSW", "faiss IVF-Flat"}
    assert set(rows) == expected
    assert rows["dense exact"].recall == pytest.approx(1.0)
    assert rows["TreeHeap beam"].extra["reached"]  # calibrate_beam always ends at a passing width
    for row in rows.values():
        assert 0.0 <= row.recall <= 1.0 and row.latency_ms > 0
        if row.method.startswith("TreeHeap"):
            assert 0.0 < row.visited <= 1.0
    assert "not the target N = 65,536" in out and "(target >= 5x)" in out
    assert "limits at N = 256" in out


def test_calibrate_int_finds_the_smallest_passing_setting():
    bench = load_benchmark()
    tried = []

    def recall_at(value):
        tried.append(value)
        return 1.0 if value >= 37 else 0.5

    assert bench.calibrate_int(recall_at, 1, 1000, 0.95) == (37, 1.0)
    assert bench.calibrate_int(lambda v: 0.0, 1, 8, 0.95)[0] == 8  # nothing passes: the upper end
