"""The fast tree read (models/tree_read.py) against the reference reads of models/relation_tree.py:
the same leaves as the reference beam for its schedule, what the other schedules change (dense top,
leaf scan) checked from their definitions, the grouped matmul, calibration, and the study's arm."""

from __future__ import annotations

import itertools

import pytest
import torch

from gates.models import relation_tree as rt
from gates.models import tree_read as tr
from tests.test_relation_closure import arm, run, teacher_config  # noqa: F401 (a fixture)

# many small ops: on a shared machine a second thread mostly waits (results do not depend on it)
pytestmark = pytest.mark.usefixtures("one_thread")


def small_tree(
    seed: int,
    n: int,
    kind: str = "prototypes",
    d: int = 8,
    queries: int = 20,
    m: int = 3,
    dtype=torch.float64,
):
    """A fitted tree on Gaussian keys (float64: no near-ties for rounding to flip)."""
    generator = torch.Generator().manual_seed(seed)
    keys = torch.randn(1, n, d, generator=generator, dtype=dtype)
    q = torch.randn(queries, d, generator=generator, dtype=dtype)
    keys_heap = rt.heap_keys(keys, rt.build_topology("learned", keys, generator))
    parent = rt.make_parent(kind, keys_heap, generator, m=m).to(dtype)
    rt.fit_parents(parent, keys_heap, q, 5, 0.05, 8, generator)
    return parent, keys_heap, q


@pytest.mark.parametrize("kind", ["prototypes", "single_key", "lowrank"])
@pytest.mark.parametrize("n", [8, 64, 256])
def test_beam_schedule_returns_the_reference_beams_leaves(kind, n):
    for seed in range(3):
        parent, keys_heap, q = small_tree(seed, n, kind)
        index = tr.TreeIndex(parent, keys_heap)
        for width in (1, 2, 3, 5, 8, 13, n):
            reference = rt.beam_read(parent, keys_heap, q, width)
            fast = tr.fast_read(index, q, tr.beam_schedule(width, index.depth), k=None)
            assert torch.equal(fast.leaves, reference.leaves), (kind, n, seed, width)
            assert torch.equal(fast.visited, reference.visited)


def test_beam_schedule_matches_the_reference_in_float32_on_teacher_like_sizes():
    parent, keys_heap, q = small_tree(0, 1024, d=16, queries=64, m=4, dtype=torch.float32)
    index = tr.TreeIndex(parent, keys_heap)
    for width in (4, 16, 40):
        reference = rt.beam_read(parent, keys_heap, q, width)
        fast = tr.fast_read(index, q, tr.beam_schedule(width, index.depth), k=10)
        assert torch.equal(fast.leaves, reference.leaves[..., :10])


def test_dense_top_keeps_the_exact_top_nodes_by_path_posterior():
    """Changed from the beam: the depth-L0 nodes kept are the top W by the full tree posterior at that
    depth (the beam, with 2^L0 > W, would have pruned on the way down)."""
    parent, keys_heap, q = small_tree(1, 256)
    index = tr.TreeIndex(parent, keys_heap)
    posteriors = rt.tree_log_posteriors(parent(q), rt.leaf_scores(keys_heap, q))
    for dense, width in ((5, 3), (6, 7), (4, 16)):
        leaves = tr.fast_read(index, q, tr.Schedule(dense, (width,)), k=None).leaves[
            0
        ]  # all scanned leaves
        kept = leaves >> (index.depth - dense)
        expected = posteriors[dense][0].topk(min(width, 2**dense), dim=-1).indices
        for i in range(len(q)):
            assert set(kept[i].tolist()) == set(expected[i].tolist())


def test_leaf_scan_returns_the_exact_top_k_below_the_kept_nodes_and_never_less_than_the_beam():
    """Changed from the beam: at scan depth Ls < D every leaf below the kept nodes is scored exactly
    and the top k by exact score are returned; the same beam descending to the leaves reaches a
    subset of those leaves, so per query the scan's top-k recall is at least the beam's."""
    parent, keys_heap, q = small_tree(2, 256, queries=40)
    index = tr.TreeIndex(parent, keys_heap)
    depth, k = index.depth, 5
    scores = rt.leaf_scores(keys_heap, q)[0]
    dense_top = scores.topk(k, dim=-1).indices.unsqueeze(0)
    for width, scan in itertools.product((2, 4, 6), (4, 6, 7)):
        beam = tr.beam_schedule(width, depth)
        schedule = tr.Schedule(beam.dense_depth, beam.widths[: scan - beam.dense_depth + 1])
        every = tr.fast_read(index, q, schedule, k=None).leaves[0]
        top = tr.fast_read(index, q, schedule, k=k).leaves[0]
        for i in range(len(q)):
            scanned = every[i]
            exact = scanned[scores[i, scanned].argsort(descending=True, stable=True)[:k]]
            assert top[i].tolist() == exact.tolist()
        reference = rt.beam_read(parent, keys_heap, q, width)
        per_query = [
            (
                rt.topk_recall(top[i : i + 1].unsqueeze(0), dense_top[:, i : i + 1], k),
                rt.topk_recall(reference.leaves[:, i : i + 1], dense_top[:, i : i + 1], k),
            )
            for i in range(len(q))
        ]
        assert all(fast >= ref for fast, ref in per_query)


def test_grouped_matmul_is_a_per_pair_matrix_vector_product():
    generator = torch.Generator().manual_seed(0)
    table = torch.randn(50, 6, 4, generator=generator, dtype=torch.float64)
    queries = torch.randn(30, 4, generator=generator, dtype=torch.float64)
    # skewed: node 7 shared by every query (one big bucket), the rest sparse (many small ones)
    pair_query = torch.cat([torch.arange(30), torch.randint(0, 30, (200,), generator=generator)])
    pair_node = torch.cat([torch.full((30,), 7), torch.randint(0, 50, (200,), generator=generator)])
    out = tr.grouped_matmul(table, queries, pair_query, pair_node)
    expected = torch.einsum("prd,pd->pr", table[pair_node], queries[pair_query])
    assert torch.allclose(out, expected, atol=1e-12)
    assert tr.grouped_matmul(table, queries, pair_query[:0], pair_node[:0]).shape == (0, 6)


def test_every_schedule_reads_valid_distinct_leaves_and_counts_its_visits():
    parent, keys_heap, q = small_tree(3, 256, queries=7)
    index = tr.TreeIndex(parent, keys_heap)
    for dense in range(0, 9):
        for scan in range(dense, 9):
            for widths in itertools.product((1, 300), repeat=min(2, scan - dense + 1)):
                widths = (widths + (widths[-1],) * 9)[: scan - dense + 1]
                schedule = tr.Schedule(dense, widths)
                result = tr.fast_read(index, q, schedule, k=None)
                kept = tr.kept_per_depth(schedule)
                assert result.leaves.shape == (1, 7, kept[-1] * 2 ** (8 - scan))
                assert all(len(set(row.tolist())) == len(row) for row in result.leaves[0])
                assert int(result.visited[0, 0]) == tr.visited_nodes(schedule, 8)


def test_index_keeps_only_the_parents_the_read_uses():
    parent, keys_heap, q = small_tree(4, 256, d=8, m=3, dtype=torch.float32)
    full, cut = tr.TreeIndex(parent, keys_heap), tr.TreeIndex(parent, keys_heap, max_depth=4)
    schedule = tr.Schedule(2, (3, 4, 4))
    assert torch.equal(
        tr.fast_read(full, q, schedule).leaves, tr.fast_read(cut, q, schedule).leaves
    )
    # keys (256 x 8 floats) + prototypes and log weights of depths 1..4 (30 nodes x 3 x (8 + 1))
    assert cut.nbytes() == 4 * (256 * 8 + 30 * 3 * 9)
    assert full.nbytes() == 4 * (256 * 8 + 254 * 3 * 9)  # the root routes nothing: not stored
    assert cut.bytes_per_key() == cut.nbytes() / 256
    with pytest.raises(ValueError, match="does not fit"):
        tr.fast_read(cut, q, tr.Schedule(2, (3, 4, 4, 4)))
    with pytest.raises(ValueError, match="does not fit"):
        tr.fast_read(full, q, tr.Schedule(5, (3, 4, 4, 4, 4)))
    with pytest.raises(ValueError, match="linear in the query"):
        tr.TreeIndex(rt.make_parent("mlp", keys_heap, torch.Generator().manual_seed(0)), keys_heap)
    with pytest.raises(ValueError, match="one tree"):
        tr.TreeIndex(parent, keys_heap.expand(2, -1, -1))


def test_calibration_picks_the_cheapest_passing_schedule_deterministically():
    parent, keys_heap, fit = small_tree(5, 512, d=16, queries=96, m=4, dtype=torch.float32)
    index = tr.TreeIndex(parent, keys_heap)
    first = tr.calibrate(index, fit, target=0.9)
    again = tr.calibrate(index, fit, target=0.9)
    assert first.schedule == again.schedule and first.fit_recall == again.fit_recall
    assert first.fit_recall > first.fit_lower >= 0.9  # the lower confidence bound passed
    target = rt.dense_topk(keys_heap, fit, 10)
    assert rt.topk_recall(
        tr.fast_read(index, fit, first.schedule).leaves, target, 10
    ) == pytest.approx(first.fit_recall, abs=1e-12)
    passing = [
        tr.schedule_cost(s, index.depth, index.m) for s, _, lower in first.tried if lower >= 0.9
    ]
    assert first.cost == min(passing) == tr.schedule_cost(first.schedule, index.depth, index.m)
    plain = tr.calibrate(
        index, fit, target=0.9, z=0.0
    )  # the plain mean: a cheaper schedule, or the same
    assert plain.fit_recall >= 0.9 and plain.cost <= first.cost
    uniform = tr.calibrate(index, fit, target=0.9, per_level=False, scan_depths=[index.depth])
    assert uniform.schedule.scan_depth == index.depth and len(set(uniform.schedule.widths[1:])) <= 1


def test_study_fast_beam_arm_reports_recall_cost_and_a_smaller_index(teacher_config):  # noqa: F811
    base = dict(leaf_set="bank", leaves=256, trees=1, parent="prototypes", calibration_queries=256)
    metrics, _ = run(arm(teacher_config, **base, read="fast_beam"))
    beam, _ = run(arm(teacher_config, **base, read="beam"))
    for name in (
        "topk_recall_10",
        "visited_share",
        "latency_ms",
        "dense_latency_ms",
        "peak_mem_mb",
        "index_bytes_per_key",
        "beam_width",
        "fit_topk_recall_10",
    ):
        assert name in metrics
    assert metrics["fit_topk_recall_10"] >= 0.95
    assert metrics["index_bytes_per_key"] < beam["index_bytes_per_key"]
    again, _ = run(arm(teacher_config, **base, read="fast_beam"))
    machine = {"latency_ms", "dense_latency_ms"}
    assert {k: v for k, v in again.items() if k not in machine} == {
        k: v for k, v in metrics.items() if k not in machine
    }
    with pytest.raises(ValueError, match="fast_beam reads one bank"):
        arm(teacher_config, read="fast_beam")  # per-context trees
