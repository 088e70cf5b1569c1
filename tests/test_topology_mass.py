"""relation_closure's `kmeans` topology (balanced 2-means bisection of the keys) and `topology_mass`
(the pruning read between a random tree of the same keys and the best leaves): exact on hand-made
posteriors, end to end on the tiny teacher of tests/test_relation_closure.py, and the arms without
them unchanged."""

from __future__ import annotations

import math

import pytest
import torch

from gates.models import relation_tree as rt
from gates.models.relation_closure import RelationClosureStudy, topology_mass_metrics
from tests.test_relation_closure import arm, run, teacher_config  # noqa: F401 (a fixture)
from tests.test_relation_closure_oracle import P


def test_kmeans_split_is_balanced_and_separates_two_clusters():
    generator = torch.Generator().manual_seed(0)
    points = torch.cat([torch.randn(8, 3) * 0.1 + 5, torch.randn(8, 3) * 0.1 - 5])
    shuffled = points[torch.randperm(16, generator=generator)]
    within = rt.kmeans_split(shuffled[None], generator)[0]
    assert sorted(within.tolist()) == list(range(16))  # a permutation: balanced halves
    left, right = shuffled[within[:8], 0], shuffled[within[8:], 0]
    assert (left.sign() == left[0].sign()).all() and (right.sign() == -left[0].sign()).all()
    order = rt.build_topology("kmeans", torch.randn(2, 16, 4), generator)
    assert (order.sort(dim=1).values == torch.arange(16)).all()


def test_gap_closed_is_the_share_of_the_gap_from_the_random_tree_to_the_best_leaves():
    """Keys of width 1 and the query 1: the leaf scores are the keys. The own tree's depth-2 quarter
    holds 0.4 (P's best node), the random tree's 0.25 (each node holds a quarter), the best 2 leaves
    0.5: an arm that kept 0.4 closes (0.4 - 0.25) / (0.5 - 0.25) = 0.6 of the gap."""
    flat = [1 / 8] * 8
    own = torch.tensor([[[math.log(p)] for p in P]], dtype=torch.float64)
    uniform = torch.tensor([[[math.log(p)] for p in flat]], dtype=torch.float64)
    queries = torch.ones(1, 1, 1, dtype=torch.float64)
    kept = {"best_mass_top_quarter": 0.5, "best_mass_top_half": 0.8}
    kept |= {f"mass_kept_top_half_at_depth_{t}": 0.5 for t in (1, 2, 3)}
    kept |= {f"mass_kept_top_quarter_at_depth_{t}": 0.4 for t in (2, 3)}
    out = topology_mass_metrics(kept, own, [uniform, uniform], queries)
    assert out["own_oracle_mass_top_quarter_at_depth_2"] == pytest.approx(0.4, abs=1e-12)
    assert out["random_tree_mass_top_quarter_at_depth_2"] == pytest.approx(0.25, abs=1e-12)
    assert out["gap_closed_top_quarter_at_depth_2"] == pytest.approx(0.6, abs=1e-12)
    assert out["gap_closed_top_half_at_depth_1"] == pytest.approx(0.0, abs=1e-12)
    assert "gap_closed_top_quarter_at_depth_3" not in out  # the leaves: every tree keeps the best
    assert out["random_tree_mass_top_quarter_at_depth_3"] == pytest.approx(0.25, abs=1e-12)


def small(teacher_config, **overrides):  # noqa: F811
    common = dict(
        leaves=16, query_set="continuation", fit_queries=20, eval_queries=20, val_queries=8
    )
    return arm(teacher_config, **{**common, **overrides})


def test_topology_mass_only_adds_metrics_and_every_arm_of_a_seed_shares_the_random_tree(
    teacher_config,  # noqa: F811
):
    study = RelationClosureStudy()
    results = {}
    for topology in ("learned", "kmeans", "positional"):
        without, _ = run(small(teacher_config, topology=topology), seed=2)
        with_it, _ = run(small(teacher_config, topology=topology, topology_mass=True), seed=2)
        assert {k: v for k, v in with_it.items() if k in without} == without
        assert set(with_it) == study.reported_metrics(
            small(teacher_config, topology=topology, topology_mass=True)
        )
        results[topology] = with_it
    name = "random_tree_mass_top_quarter_at_depth_2"
    assert results["learned"][name] == results["kmeans"][name] == results["positional"][name]
    for metrics in results.values():
        assert metrics["gap_closed_top_quarter_at_depth_2"] <= 1.0
        assert (
            metrics["mass_kept_top_quarter_at_depth_2"]
            <= metrics["own_oracle_mass_top_quarter_at_depth_2"] + 1e-9
        )
    ceiling = study.ceiling(
        "gap_closed_top_quarter_at_depth_2", small(teacher_config, topology_mass=True)
    )
    assert ceiling.value == 1.0
