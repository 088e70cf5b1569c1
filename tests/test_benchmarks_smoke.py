"""Smoke test of benchmarks/tree_read.py at tiny sizes (random keys, one thread, a few seconds)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
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


@pytest.mark.parametrize("with_libraries", [False, True])
def test_tree_read_benchmark_runs_at_tiny_sizes(capsys, tmp_path, with_libraries):
    if with_libraries:
        try:
            import faiss  # noqa: F401
            import scann  # noqa: F401
        except ImportError:
            if os.environ.get("GATES_REQUIRE_SERVICES"):  # CI installs them (the dev extra)
                pytest.fail("faiss-cpu and scann are required here (GATES_REQUIRE_SERVICES is set)")
            pytest.skip("faiss-cpu or scann is not installed (pip install -e '.[bench]')")
    bench = load_benchmark()
    argv = [
        "--sizes",
        "256,512",
        "--queries",
        "32",
        "--fit-queries",
        "64",
        "--steps",
        "2",
        "--repeats",
        "1",
        "--source",
        "random",
        "--threads",
        "1",
        "--drill-iterations",
        "1",
        "--d",
        "32",
        "--json",
        str(tmp_path / "tree_read.json"),
        "--plot",
        str(tmp_path / "latency.svg"),
        "--bound-m",
        "1,4",
    ]
    threads = torch.get_num_threads()
    try:
        results = bench.main(argv + ([] if with_libraries else ["--no-faiss", "--no-scann"]))
    finally:  # the benchmark sets the process-wide thread count; leave it as other tests expect
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    rows = {row.method: row for row in results[256]["rows"]}
    expected = {"dense exact", "floor (10 true rows)", "TreeHeap beam", "TreeHeap drill-down"}
    expected |= {"TreeHeap fast"}
    expected |= {"TreeHeap max-bound", "TreeHeap exact-bound"}  # the max-closure read (issue #29)
    if with_libraries:  # issue #40: HNSW on the L2 reduction and ScaNN beside IVF
        expected |= {"faiss IVF-Flat", "faiss IVF-PQ", "faiss HNSW-L2", "ScaNN"}
    assert set(rows) == expected
    assert rows["dense exact"].recall == pytest.approx(1.0)
    assert rows["TreeHeap beam"].extra["reached"]  # calibrate_beam always ends at a passing width
    assert rows["TreeHeap fast"].extra["reached"]
    assert (
        rows["TreeHeap max-bound"].extra["reached"]
        and rows["TreeHeap exact-bound"].extra["reached"]
    )
    for row in rows.values():
        assert 0.0 <= row.recall <= 1.0 and row.latency_ms > 0
        assert row.index_bytes_per_key is None or row.index_bytes_per_key > 0
        if row.method.startswith("TreeHeap"):
            assert 0.0 < row.visited <= 1.0
    floor = rows["floor (10 true rows)"]
    assert floor.recall == 1.0 and floor.index_bytes_per_key is None
    assert floor.bytes_per_query == pytest.approx(0.95 * 10 * 4 * 32)  # 0.95 x 10 rows of d = 32
    assert rows["dense exact"].bytes_per_query == 256 * 4 * 32
    assert all(
        row.bytes_per_query > floor.bytes_per_query for row in rows.values() if row is not floor
    )
    if with_libraries:
        for name in ("faiss IVF-Flat", "faiss HNSW-L2", "ScaNN"):
            assert rows[name].extra["reached"] and rows[name].recall >= 0.9
    # the fast read's index keeps the keys and only the parents it reads: less than the full parent table
    assert rows["TreeHeap fast"].index_bytes_per_key < rows["TreeHeap beam"].index_bytes_per_key
    assert "not the target N = 65,536" in out and "(target >= 10x, bar >= 5x)" in out
    assert "limits at N = 512" in out and "fast read at N = 512" in out
    assert (
        "what each step bought at N = 512" in out
        and "same leaves as the reference for 100.0% of queries" in out
    )
    assert "latency growth exponents" in out and "| 512 | " in out and "| growth exponent | " in out
    written = json.loads((tmp_path / "tree_read.json").read_text())
    assert set(written["sizes"]) == {"256", "512"}
    methods = {"dense", "floor", "beam", "drilldown", "fast_beam", "max_bound", "exact_bound"} | (
        {"faiss_ivf", "faiss_ivfpq", "faiss_hnsw_l2", "scann"} if with_libraries else set()
    )
    for size in written["sizes"].values():
        assert set(size) == methods
        for method in size.values():
            assert {"latency_ms", "recall_at_10", "visited_share", "speedup"} <= set(method)
            assert {"bytes_per_query", "reached"} <= set(method)
        assert size["dense"]["speedup"] == 1.0
    assert set(written["exponents"]) == methods and all(
        isinstance(v, float) for v in written["exponents"].values()
    )
    assert [step["step"][:2] for step in written["steps"]] == ["re", "1.", "2.", "3.", "4."]
    assert set(written["exponents_adjacent"]) == methods
    assert all(set(pairs) == {"256-512"} for pairs in written["exponents_adjacent"].values())
    assert set(written["process_peak_rss_mb"]) == {"256", "512"}
    assert "issue #40 targets at N = 512" in out and "max-closure read at N = 512" in out
    assert ("the best library" in out) == with_libraries
    assert "| exponent 256 -> 512 | " in out
    assert "</svg>" in (tmp_path / "latency.svg").read_text()


def test_tree_read_benchmark_skips_the_reference_reads_above_reference_upto(capsys):
    bench = load_benchmark()
    argv = "--sizes 256,512 --queries 16 --fit-queries 32 --steps 1 --repeats 1 --source random"
    argv += (
        " --threads 1 --d 32 --no-faiss --no-scann --no-drilldown --reference-upto 256 --bound-m 2,4"
        " --cold"
    )
    threads = torch.get_num_threads()
    try:
        results = bench.main(argv.split())
    finally:
        torch.set_num_threads(threads)
        bench._SWEEP.clear()  # the 512 MB sweep buffer of --cold
    out = capsys.readouterr().out
    assert "each read after a 512 MB sweep (cold caches)" in out
    assert {row.key for row in results[256]["rows"]} == {
        "dense",
        "floor",
        "beam",
        "fast_beam",
        "max_bound",
        "exact_bound",
    }
    assert {row.key for row in results[512]["rows"]} == {
        "dense",
        "floor",
        "fast_beam",
        "max_bound",
        "exact_bound",
    }
    assert results[512]["info"]["width"] is None
    assert "limits at N = 512" not in out and "what each step bought" not in out
    assert "| 512 | " in out and " - |" in out  # the beam's cell at 512


def test_tree_read_benchmark_writes_an_svg_plot_without_matplotlib():
    bench = load_benchmark()
    svg = bench.svg_plot(
        {"dense": [(4096, 10.0), (16384, 90.0)], "max_bound": [(4096, 2.0), (16384, 4.0)]},
        {"dense": "dense exact", "max_bound": "TreeHeap max-bound"},
    )
    assert svg.startswith("<svg") and svg.count("<polyline") == 2 and "TreeHeap max-bound" in svg
    assert "16,384" in svg and "1 ms" in svg and "100 ms" in svg


def test_tree_read_benchmark_fits_the_growth_exponent():
    bench = load_benchmark()
    ns = [4096, 16384, 65536, 262144]
    assert bench.fit_exponent(ns, [2.0 * n for n in ns]) == pytest.approx(1.0)
    assert bench.fit_exponent(ns, [n**0.5 for n in ns]) == pytest.approx(0.5)
    assert math.isnan(bench.fit_exponent([4096], [1.0]))


def test_calibrate_int_finds_the_smallest_passing_setting():
    load_benchmark()
    bench = sys.modules["read_common"]  # the helpers every read of the benchmark shares
    tried = []

    def recall_at(value):
        tried.append(value)
        return 1.0 if value >= 37 else 0.5

    assert bench.calibrate_int(recall_at, 1, 1000, 0.95) == (37, 1.0)
    assert bench.calibrate_int(lambda v: 0.0, 1, 8, 0.95)[0] == 8  # nothing passes: the upper end


def test_interior_best_extends_the_grid_past_the_edge_its_best_sits_at():
    load_benchmark()
    common = sys.modules["read_common"]
    tried = []

    def evaluate(value):  # fastest at 64, and settings below 8 fail
        tried.append(value)
        return value < 8, abs(math.log2(value) - 6) + 1.0, None

    double = lambda value: None if value * 2 > 1024 else value * 2  # noqa: E731
    half = lambda value: None if value // 2 < 1 else value // 2  # noqa: E731
    best, results, at_edge = common.interior_best(evaluate, [4, 8, 16], half, double)
    assert (best, at_edge) == (64, False) and tried == [4, 8, 16, 32, 64, 128]
    # at most `extend` values past the edge: the best then stays at the edge, and says so
    best, _, at_edge = common.interior_best(evaluate, [4, 8, 16], half, double, extend=1)
    assert (best, at_edge) == (32, True)
    # a failing setting never wins over a passing one, however fast
    best, _, at_edge = common.interior_best(lambda v: (v < 8, float(v), None), [2, 4, 8, 16], half)
    assert (best, at_edge) == (8, False)


# ------------------------------------------------------------------ benchmarks/translator_scaling.py
def load_scaling():
    path = SCRIPT.parent / "translator_scaling.py"
    if "translator_scaling_benchmark" not in sys.modules:
        spec = importlib.util.spec_from_file_location("translator_scaling_benchmark", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    return sys.modules["translator_scaling_benchmark"]


def test_translator_scaling_benchmark_runs_at_tiny_sizes(capsys, tmp_path):
    bench = load_scaling()
    threads = torch.get_num_threads()
    report = bench.main(
        [
            "--sizes",
            "8,16",
            "--batch",
            "2",
            "--queries",
            "2",
            "--repeats",
            "1",
            "--threads",
            "1",
            "--json",
            str(tmp_path / "scaling.json"),
        ]
    )
    assert (
        torch.get_num_threads() == threads
    )  # the benchmark restores the process-wide thread count
    out = capsys.readouterr().out
    assert (
        "TreeHeap = WRITE -> Butterfly" in out
        and "explicit N x N" in out
        and "torch threads 1" in out
    )
    assert "growth exponents" in out and "At N = 16 the TreeHeap pass is" in out
    written = json.loads((tmp_path / "scaling.json").read_text())
    assert [r["n"] for r in written["results"]] == [8, 16]
    for r in written["results"]:
        for name in ("tree", "dense"):
            assert (
                r["ms"][name] > 0
                and r["cpu_ms"][name] > 0
                and r["gflop"][name] > 0
                and r["saved_mb"][name] > 0
            )
        assert set(r["stage_ms"]) == {
            "tree butterfly",
            "tree fold",
            "tree read",
            "dense attention",
            "dense read",
        }
    small, large = written["results"]
    # the counted arithmetic is deterministic: both grow with N, dense by its N x N attention more than linearly
    assert large["gflop"]["tree"] > small["gflop"]["tree"]
    assert large["gflop"]["dense"] > 2 * small["gflop"]["dense"]
    assert set(written["exponents"]["gflop"]["tree"]) == {"all", "largest_half"}
    assert report["results"][0]["n"] == 8


def test_translator_scaling_backward_reaches_every_parameter():
    bench = load_scaling()
    inputs = bench.make_inputs(16, batch=2, queries=3, device=torch.device("cpu"))
    for name, model in bench.make_models(16, torch.device("cpu")).items():
        bench.train_pass(model, inputs)
        missing = [p for p, param in model.named_parameters() if param.grad is None]
        assert not missing, f"{name}: no gradient for {missing}"


def test_translator_scaling_fit_exponent_and_bad_sizes(capsys):
    bench = load_scaling()
    ns = [32, 64, 128, 256]
    assert bench.fit_exponent(ns, [3.0 * n**2 for n in ns]) == pytest.approx(2.0)
    assert bench.fit_exponent(ns, [n * math.log2(n) for n in ns]) == pytest.approx(1.23, abs=0.01)
    assert math.isnan(bench.fit_exponent([32], [1.0]))
    assert bench.largest_half([32, 64, 128, 256, 512, 1024]) == [256, 512, 1024]
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--sizes", "8,24"])
    assert (
        exit_info.value.code == 2 and "--sizes: 24 is not a power of two" in capsys.readouterr().err
    )


def _one_flat_seq_step(out: Path, *options: str):
    """benchmarks/training_throughput.py on one step of the translator's flat_seq arm, 1 thread, its
    JSON to `out` (skipped without the zh-en corpus, which CI fetches): the finished process."""
    import subprocess

    from gates.models.treeheap_translator import TranslatorConfig, TranslatorStudy

    why = TranslatorStudy().check_ready(TranslatorConfig(arm="flat_seq"))
    if why:
        pytest.skip(why)
    return subprocess.run(
        [
            sys.executable,
            str(SCRIPT.parent / "training_throughput.py"),
            *options,
            "--studies",
            "translator_flat_seq",
            "--steps",
            "1",
            "--warmup",
            "0",
            "--threads",
            "1",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        cwd=SCRIPT.parent.parent,
    )


def test_training_throughput_benchmark_compares_with_a_baseline_commit(tmp_path):
    """One step of the translator's flat_seq arm, the code at HEAD (git archive) on both sides, in fresh
    processes that import their checkout alone; the JSON has what the README quotes. Needs the zh-en
    corpus (CI fetches it)."""
    import subprocess

    out = tmp_path / "throughput.json"
    done = _one_flat_seq_step(out, "--baseline", "HEAD", "--repeats", "1")
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    row = result["studies"]["translator_flat_seq"]
    assert result["baseline"] == "HEAD" and row["unit"] == "tokens"
    assert row["current_per_s"] > 0 and row["baseline_per_s"] > 0 and row["ratio"] > 0
    # each side imported its own clean checkout (paths relative to it; the worker fails on any other)
    for side in ("baseline", "current"):
        assert result["imports"][side] == {
            "gates": "gates/__init__.py",
            "gates.models": "models/__init__.py",
            "gates.models.treeheap_translator": "models/treeheap_translator/__init__.py",
        }
    assert result["current_commit"] == result["baseline_commit"]
    script = SCRIPT.parent / "training_throughput.py"
    bad = subprocess.run(
        [sys.executable, str(script), "--studies", "nope"], capture_output=True, text=True
    )
    assert bad.returncode == 2 and "unknown ['nope']" in bad.stderr


def test_training_throughput_profile_splits_a_translator_step(tmp_path):
    """--profile: one profiled step of flat_seq; the regions partition the step (shares sum to 1) and
    backward is split by forward region. Needs the zh-en corpus (CI fetches it)."""
    out = tmp_path / "profile.json"
    done = _one_flat_seq_step(out, "--profile")
    assert done.returncode == 0, done.stderr
    profile = json.loads(out.read_text())["profiles"]["translator_flat_seq"]
    regions = {row["region"]: row for row in profile["regions"]}
    for region in (
        "encoder: Butterfly",
        "decoder loop: READ (c_t)",
        "output layer (logits)",
        "backward",
    ):
        assert regions[region]["ms_per_step"] > 0
    own = [row for row in profile["regions"] if not row["region"].startswith(" ")]
    assert sum(row["share"] for row in own) == pytest.approx(1, abs=0.01)
    assert any(row["region"] == "  of output layer (logits)" for row in profile["regions"])


def test_training_throughput_batch_sizes_fit_the_fixed_part_of_a_step(tmp_path):
    """--profile --batch-sizes: flat_seq's step at two batch sizes (with --config fields set) and the
    line through them; the fixed part and its ceiling follow from the measured times. Needs the zh-en
    corpus (CI fetches it)."""
    out = tmp_path / "scaling.json"
    done = _one_flat_seq_step(
        out, "--profile", "--batch-sizes", "4,8", "--config", "depth=4,d_model=16,hidden=16"
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())["profiles"]["translator_flat_seq"]
    assert result["config"] == {"depth": 4, "d_model": 16, "hidden": 16}
    (small, large) = result["batches"]
    assert (small["batch_size"], large["batch_size"]) == (4, 8)
    per_sentence = (large["ms_per_step"] - small["ms_per_step"]) / 4  # two points: the line itself
    assert result["ms_per_sentence"] == pytest.approx(per_sentence, abs=0.01)
    assert result["fixed_ms"] == pytest.approx(small["ms_per_step"] - 4 * per_sentence, abs=0.1)
    fixed = result["fixed_ms"]
    if fixed < small["ms_per_step"]:
        assert result["ceiling_without_fixed"] == pytest.approx(
            small["ms_per_step"] / (small["ms_per_step"] - fixed), rel=0.02
        )
    else:  # noise made the larger batch no slower: the line bounds nothing
        assert result["ceiling_without_fixed"] is None
    assert "of the step is fixed; removing all of it gives at most" in done.stdout
