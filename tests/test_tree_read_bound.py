"""The max-closure read (models/tree_read.py: BoundIndex, bound_read; issue #29), exactly on small
trees: every node's score bounds the best key below it (for every query with exact radii, for every
fit query with fitted ones), a read wide enough is the exact top k, the certificate is sound, and
calibration picks the cheapest passing schedule by the read's own counted cost."""

from __future__ import annotations

import itertools

import pytest
import torch

from gates.models import relation_tree as rt
from gates.models import tree_read as tr

TOL = 1e-10  # float64: the bound may miss by the last bits of its rounding, never by more


pytestmark = pytest.mark.usefixtures("one_thread")


def bank(seed: int, n: int, d: int = 8, fit: int = 40, dtype=torch.float64):
    """Keys in heap order of a learned topology, fit queries and other queries (float64)."""
    generator = torch.Generator().manual_seed(seed)
    keys = torch.randn(1, n, d, generator=generator, dtype=dtype) * (
        1 + torch.rand(1, n, 1, generator=generator, dtype=dtype)  # unequal norms
    )
    keys_heap = rt.heap_keys(keys, rt.build_topology("learned", keys, generator))
    fit_queries = torch.randn(fit, d, generator=generator, dtype=dtype)
    return keys_heap, fit_queries, generator


def other_queries(generator, d: int, dtype=torch.float64) -> torch.Tensor:
    """Queries unlike the fit queries: other scales, and directions along the keys' extremes."""
    gaussian = torch.randn(30, d, generator=generator, dtype=dtype)
    return torch.cat(
        [gaussian * 0.01, gaussian * 50, torch.eye(d, dtype=dtype), -torch.eye(d, dtype=dtype)]
    )


def best_below(keys_heap: torch.Tensor, queries: torch.Tensor, depth: int) -> torch.Tensor:
    """max_{l below p} q . k_l of every depth-`depth` node, by brute force: (Q, 2^depth)."""
    scores = queries @ keys_heap[0].T
    return scores.view(len(queries), 2**depth, -1).amax(dim=-1)


@pytest.mark.parametrize("m", [1, 2, 4, 8])
@pytest.mark.parametrize("n", [16, 256])
def test_exact_radius_bounds_every_node_for_any_query(m, n):
    keys_heap, fit, generator = bank(0, n)
    index = tr.BoundIndex(keys_heap, None, m=m, radius="exact")
    depth = index.depth
    for queries in (fit, other_queries(generator, 8)):
        for k in range(1, depth + 1):
            slack = index.scores(queries, k) - best_below(keys_heap, queries, k)
            assert float(slack.min()) >= -TOL * float(queries.norm(dim=-1).max()), (m, n, k)
            if index.ball_depth(k) == depth:  # the balls are the leaves: the exact maximum
                assert torch.allclose(slack, torch.zeros_like(slack), atol=1e-9)


@pytest.mark.parametrize("m", [1, 2, 4])
def test_fitted_radius_bounds_every_node_on_every_fit_query_and_is_tighter(m):
    keys_heap, fit, generator = bank(1, 256)
    fitted = tr.BoundIndex(keys_heap, fit, m=m, radius="fit")
    exact = tr.BoundIndex(keys_heap, None, m=m, radius="exact")
    for k in range(1, fitted.depth + 1):
        slack = fitted.scores(fit, k) - best_below(keys_heap, fit, k)
        assert float(slack.min()) >= -TOL, k
        # never looser than the exact bound, on any query
        others = other_queries(generator, 8)
        assert bool((fitted.scores(others, k) <= exact.scores(others, k) + TOL).all())
    for j in fitted.radii:
        assert bool((fitted.radii[j] >= 0).all())
        assert bool((fitted.radii[j] <= exact.radii[j] + TOL).all())
        # the smallest such radius: some fit query meets the bound of each ball with equality
        best = tr.subtree_maxima(fitted.leaf_keys, fit, {j})[j]
        excess = (best - fit @ fitted.centres[j].T) / fit.norm(dim=-1, keepdim=True)
        assert torch.allclose(excess.amax(dim=0).clamp_min(0), fitted.radii[j], atol=1e-12)
    # a fitted radius is a bound on the fit queries only: these other queries break it somewhere
    broken = [
        float(
            (
                fitted.scores(other_queries(generator, 8), k)
                - best_below(keys_heap, other_queries(generator, 8), k)
            ).min()
        )
        for k in range(1, fitted.depth - fitted.g + 1)
    ]
    assert min(broken) < 0


def test_fitted_radii_do_not_depend_on_the_query_chunks():
    keys_heap, fit, _ = bank(2, 128)
    whole = tr.BoundIndex(keys_heap, fit, m=4, radius="fit", chunk_numbers=2**20)
    chunked = tr.BoundIndex(keys_heap, fit, m=4, radius="fit", chunk_numbers=128 * 3)
    # (equal up to the matmul's rounding, which depends on the number of rows)
    assert all(torch.allclose(whole.radii[j], chunked.radii[j], atol=1e-12) for j in whole.radii)


def test_centres_are_the_means_and_subtree_maxima_the_brute_force():
    keys_heap, fit, _ = bank(3, 64)
    index = tr.BoundIndex(keys_heap, fit)
    maxima = tr.subtree_maxima(index.leaf_keys, fit, set(range(0, 6)))
    for j in range(1, 6):
        means = keys_heap[0].view(2**j, -1, 8).mean(dim=1)
        assert torch.allclose(index.centres[j], means, atol=1e-12)
        assert torch.equal(maxima[j], best_below(keys_heap, fit, j))
    assert torch.equal(maxima[0], (fit @ keys_heap[0].T).amax(dim=-1, keepdim=True))


@pytest.mark.parametrize("radius", ["exact", "fit"])
def test_a_read_keeping_every_node_is_the_exact_top_k(radius):
    keys_heap, fit, generator = bank(4, 256)
    index = tr.BoundIndex(keys_heap, fit, m=4, radius=radius)
    queries = torch.cat([fit, other_queries(generator, 8)])
    exact = rt.dense_topk(keys_heap, queries, 10)
    for dense, scan in ((0, 0), (0, 5), (3, 3), (3, 8), (8, 8), (2, 6)):
        schedule = tr.Schedule(dense, (256,) * (scan - dense + 1))
        certificate: dict = {}
        result = tr.bound_read(index, queries, schedule, 10, certify=certificate)
        assert torch.equal(result.leaves, exact), (dense, scan)
        assert bool(certificate["certified"].all())  # nothing pruned: -inf
        assert int(result.visited[0, 0]) == tr.bound_visited_nodes(schedule, index.depth)


def test_the_leaf_scan_returns_the_exact_top_k_of_the_scanned_leaves():
    keys_heap, fit, _ = bank(5, 256)
    index = tr.BoundIndex(keys_heap, fit, m=2)
    scores = fit @ keys_heap[0].T
    for schedule in (tr.Schedule(3, (2, 3)), tr.Schedule(4, (3,)), tr.Schedule(2, (1, 2, 2, 3))):
        every = tr.bound_read(index, fit, schedule, k=None).leaves[0]
        top = tr.bound_read(index, fit, schedule, k=5).leaves[0]
        size = 2 ** (index.depth - schedule.scan_depth)
        for i in range(len(fit)):
            scanned = every[i]
            assert len(set((scanned // size).tolist())) == tr.kept_per_depth(schedule)[-1]
            best = scanned[scores[i, scanned].argsort(descending=True, stable=True)[:5]]
            assert top[i].tolist() == best.tolist()


def test_the_kept_nodes_are_the_best_bounds_at_each_depth():
    """Dense top: the top W_L0 depth-L0 nodes by bound; a beam level: the top W of the kept nodes'
    children by bound."""
    keys_heap, fit, _ = bank(6, 256)
    index = tr.BoundIndex(keys_heap, fit, m=4)
    for dense, width in ((4, 3), (5, 6), (3, 8)):
        leaves = tr.bound_read(index, fit, tr.Schedule(dense, (width,)), k=None).leaves[0]
        kept = leaves >> (index.depth - dense)
        expected = index.scores(fit, dense).topk(width, dim=-1).indices
        for i in range(len(fit)):
            assert set(kept[i].tolist()) == set(expected[i].tolist())
    leaves = tr.bound_read(index, fit, tr.Schedule(3, (2, 3)), k=None).leaves[0]
    first = index.scores(fit, 3).topk(2, dim=-1).indices
    children = index.scores(fit, 4)
    for i in range(len(fit)):
        candidates = torch.stack([2 * first[i], 2 * first[i] + 1]).flatten()
        best = candidates[children[i, candidates].topk(3).indices]
        assert set((leaves[i] >> (index.depth - 4)).tolist()) == set(best.tolist())


@pytest.mark.parametrize("m", [1, 4])
def test_the_certificate_is_sound_with_exact_radii(m):
    """The largest bound pruned is at least every key the read did not scan, for any query; so a
    certified query's returned top k is the exact top k."""
    keys_heap, fit, generator = bank(7, 256, fit=60)
    index = tr.BoundIndex(keys_heap, None, m=m, radius="exact")
    queries = torch.cat([fit, other_queries(generator, 8)])
    scores = queries @ keys_heap[0].T
    exact = rt.dense_topk(keys_heap, queries, 5)[0]
    certified_queries = 0
    for dense, widths in ((2, (1, 1, 1)), (3, (2, 2)), (4, (6,)), (1, (2, 3, 4, 4)), (5, (20, 30))):
        schedule = tr.Schedule(dense, widths)
        certificate: dict = {}
        returned = tr.bound_read(index, queries, schedule, 5, certify=certificate).leaves[0]
        scanned = tr.bound_read(index, queries, schedule, None).leaves[0]
        for i in range(len(queries)):
            unscanned = torch.ones(256, dtype=torch.bool)
            unscanned[scanned[i]] = False
            if unscanned.any():
                assert (
                    float(scores[i, unscanned].max())
                    <= float(certificate["pruned_bound"][i]) + 1e-9
                )
            if certificate["certified"][i]:
                certified_queries += 1
                assert set(returned[i].tolist()) == set(exact[i].tolist())
    assert certified_queries > 0  # the check above was exercised


def test_cut_keeps_only_the_ball_tables_a_schedule_reads():
    keys_heap, fit, _ = bank(8, 256)
    full = tr.BoundIndex(keys_heap, fit, m=4)  # g = 2
    schedule = tr.Schedule(3, (2, 3, 3))  # nodes of depths 3..5: balls of depths 5..7
    cut = full.cut(schedule)
    assert sorted(cut.centres) == sorted(cut.radii) == [5, 6, 7]
    assert torch.equal(
        tr.bound_read(full, fit, schedule).leaves, tr.bound_read(cut, fit, schedule).leaves
    )
    assert cut.nbytes() == 8 * (256 * 8 + (32 + 64 + 128) * 9)  # keys + centres and radii (float64)
    assert full.nbytes() == 8 * (256 * 8 + 254 * 9)
    assert sorted(full.cut(tr.Schedule(6, (4, 4, 4))).centres) == []  # balls at depth 8: the keys
    with pytest.raises(ValueError, match="dropped"):
        tr.bound_read(cut, fit, tr.Schedule(2, (2, 2)))
    with pytest.raises(ValueError, match="does not fit"):
        tr.bound_read(full, fit, tr.Schedule(5, (2, 2, 2, 2, 2)))


def test_bad_arguments_are_refused():
    keys_heap, fit, _ = bank(9, 16)
    with pytest.raises(ValueError, match="power of two"):
        tr.BoundIndex(keys_heap, fit, m=3)
    with pytest.raises(ValueError, match="needs the fit queries"):
        tr.BoundIndex(keys_heap, None, radius="fit")
    with pytest.raises(ValueError, match="'fit' or 'exact'"):
        tr.BoundIndex(keys_heap, fit, radius="mass")
    with pytest.raises(ValueError, match="one tree"):
        tr.BoundIndex(keys_heap.expand(2, -1, -1), fit)


def test_the_cost_counts_balls_pairs_and_leaves():
    depth, m = 12, 4
    schedule = tr.Schedule(5, (6, 9, 9))  # scan at depth 7: 9 blocks of 32 leaves
    expected = (
        2**7  # the dense top: 32 nodes x 4 balls
        + tr.BOUND_PAIR_COST * (6 + 9)
        + tr.BOUND_PAIR_BALL_COST * (2 * 6 * 4 + 2 * 9 * 4)
        + tr.BOUND_SCAN_PAIR_COST * 9
        + tr.BOUND_LEAF_COST * 9 * 32
    )
    assert tr.bound_schedule_cost(schedule, depth, m) == pytest.approx(expected)
    # near the leaves a node has fewer balls than m (they are its leaves)
    near = tr.Schedule(10, (2, 2))
    assert tr.bound_schedule_cost(near, depth, m) == pytest.approx(
        2**12
        + tr.BOUND_PAIR_COST * 2
        + tr.BOUND_PAIR_BALL_COST * 2 * 2 * 2
        + tr.BOUND_SCAN_PAIR_COST * 2
        + tr.BOUND_LEAF_COST * 2 * 2
    )
    assert tr.bound_visited_nodes(schedule, depth) == 32 + 2 * (6 + 9) + 9 * 32
    assert tr.bound_visited_nodes(tr.Schedule(0, (1,) * 13), depth) == 1 + 2 * 12


def test_calibration_picks_the_cheapest_passing_schedule_of_the_bound_read():
    keys_heap, fit, _ = bank(10, 512, d=16, fit=96, dtype=torch.float32)
    index = tr.BoundIndex(keys_heap, fit, m=4)
    first = tr.calibrate(index, fit, target=0.9)
    again = tr.calibrate(index, fit, target=0.9)
    assert first.schedule == again.schedule and first.fit_recall == again.fit_recall
    assert first.fit_lower >= 0.9
    target = rt.dense_topk(keys_heap, fit, 10)
    assert rt.topk_recall(
        tr.bound_read(index, fit, first.schedule).leaves, target, 10
    ) == pytest.approx(first.fit_recall, abs=1e-12)
    passing = [
        tr.bound_schedule_cost(s, index.depth, index.m)
        for s, _, lower in first.tried
        if lower >= 0.9
    ]
    assert first.cost == min(passing) == tr.bound_schedule_cost(first.schedule, index.depth, 4)
    # the default dense depths of the bound read: from D/2 - 3 while the dense top scores at most
    # N / 16 balls (depth L0 + g <= D - 4)
    tried_dense = {s.dense_depth for s, _, _ in first.tried}
    assert tried_dense == set(range(index.depth // 2 - 3, index.depth - 4 - index.g + 1))


def test_float32_index_reads_like_float64_on_clear_cut_queries():
    """The read in float32 (the benchmark's dtype) returns the same top k as in float64 wherever the
    10th and 11th best scores are not near-tied."""
    keys_heap, fit, _ = bank(11, 512, d=16, fit=64)
    schedule = tr.Schedule(4, (4, 6))
    index64 = tr.BoundIndex(keys_heap, fit, m=4)
    index32 = tr.BoundIndex(keys_heap.float(), fit.float(), m=4)
    leaves64 = tr.bound_read(index64, fit, schedule).leaves[0]
    leaves32 = tr.bound_read(index32, fit.float(), schedule).leaves[0]
    agree = [set(a.tolist()) == set(b.tolist()) for a, b in zip(leaves64, leaves32)]
    assert sum(agree) >= 0.9 * len(agree)


def test_schedules_over_every_depth_read_valid_distinct_leaves():
    keys_heap, fit, _ = bank(12, 64, fit=7)
    index = tr.BoundIndex(keys_heap, fit, m=2)
    for dense, scan in itertools.combinations_with_replacement(range(7), 2):
        for width in (1, 3, 100):
            schedule = tr.Schedule(dense, (width,) * (scan - dense + 1))
            leaves = tr.bound_read(index, fit, schedule, k=None).leaves[0]
            kept = tr.kept_per_depth(schedule)[-1]
            assert leaves.shape == (7, kept * 2 ** (6 - scan))
            assert all(len(set(row.tolist())) == len(row) for row in leaves)
