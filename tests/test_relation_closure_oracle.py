"""relation_closure's oracle_mass (the pruning read's mass kept relative to the oracle's: the best
depth-t nodes of the key-bisection tree by dense mass) and mlp_hidden (the MLP parent's width at its
matched parameter count): exact on hand-made posteriors, end to end on the tiny teacher of
tests/test_relation_closure.py, and the arms without them unchanged."""

from __future__ import annotations

import math

import pytest
import torch

from gates.models import relation_tree as rt
from gates.models.relation_closure import (
    RelationClosureConfig,
    RelationClosureStudy,
    oracle_mass,
    oracle_mass_metrics,
)
from tests.test_relation_closure import arm, run, teacher_config  # noqa: F401 (a fixture)

# one query over 8 leaves in heap order: depth-1 nodes hold 0.5 / 0.5, depth-2 nodes 0.4 / 0.1 / 0.4 / 0.1
P = [0.3, 0.1, 0.05, 0.05, 0.2, 0.2, 0.05, 0.05]


def scores_of(*rows: list[float]) -> torch.Tensor:
    """(T = 1, Q, N) leaf scores whose softmax is each row (float64: the sums below are exact)."""
    return torch.tensor([[[math.log(p) for p in row] for row in rows]], dtype=torch.float64)


def test_oracle_mass_keeps_the_nodes_of_highest_dense_mass_exactly():
    scores = scores_of(P, list(reversed(P)))
    assert oracle_mass(scores, 2, 1).flatten().tolist() == pytest.approx([0.5, 0.5], abs=1e-12)
    assert oracle_mass(scores, 4, 1).flatten().tolist() == pytest.approx([0.4, 0.4], abs=1e-12)
    assert oracle_mass(scores, 4, 2).flatten().tolist() == pytest.approx([0.8, 0.8], abs=1e-12)
    assert oracle_mass(scores, 8, 2).flatten().tolist() == pytest.approx(
        [0.5, 0.5], abs=1e-12
    )  # leaves
    # the leaves' level is best_mass: the same leaves, however they are grouped
    assert torch.allclose(oracle_mass(scores, 8, 2), rt.best_mass(scores, 2))


def test_oracle_mass_bounds_mass_kept_and_exact_posteriors_reach_it():
    """rt.mass_kept ranks the depth-t nodes by the tree posterior; ranked by the exact one (a parent
    that scores every node exactly) it is oracle_mass, and any other ranking keeps at most that."""
    scores = scores_of(P)
    exact = rt.tree_log_posteriors(rt.exact_internal_scores(scores), scores)
    wrong = torch.log(torch.tensor([[[0.1, 0.6, 0.2, 0.1]]], dtype=torch.float64))  # node 1 first
    assert rt.mass_kept(exact[2], scores, 1).item() == pytest.approx(0.4, abs=1e-12)
    assert rt.mass_kept(wrong, scores, 1).item() == pytest.approx(0.1, abs=1e-12)
    assert rt.mass_kept(wrong, scores, 2).item() == pytest.approx(0.5, abs=1e-12)  # nodes 1, 2
    assert oracle_mass(scores, 4, 1).item() == pytest.approx(0.4, abs=1e-12)


def test_oracle_mass_metrics_is_the_ratio_of_the_two_means():
    """Keys of width 1 and the query 1: the leaf scores are the keys themselves. Two trees of one query
    each; the reference's depth-2 oracle keeps 0.4 and 0.6; an arm that kept 0.3 on average is at 0.6."""
    second = [0.6, 0.1, 0.1, 0.05, 0.05, 0.05, 0.025, 0.025]  # depth-2 nodes .7 .15 .1 .05
    keys = torch.tensor([[[math.log(p)] for p in row] for row in (P, second)], dtype=torch.float64)
    queries = torch.ones(2, 1, 1, dtype=torch.float64)  # continuation layout (T, Q, d)
    kept = {"mass_kept_top_half_at_depth_1": 0.5, "mass_kept_top_quarter_at_depth_2": 0.33}
    kept |= {"mass_kept_top_half_at_depth_2": 0.7, "mass_kept_top_half_at_depth_3": 0.6}
    kept |= {"mass_kept_top_quarter_at_depth_3": 0.4}
    out = oracle_mass_metrics(kept, keys, queries)
    assert out["oracle_mass_top_quarter_at_depth_2"] == pytest.approx((0.4 + 0.7) / 2, abs=1e-12)
    assert out["mass_kept_vs_oracle_top_quarter_at_depth_2"] == pytest.approx(0.33 / 0.55)
    assert out["oracle_mass_top_half_at_depth_1"] == pytest.approx((0.5 + 0.85) / 2, abs=1e-12)
    assert out["oracle_mass_top_half_at_depth_3"] == pytest.approx((0.8 + 0.85) / 2, abs=1e-12)
    assert out["oracle_mass_top_quarter_at_depth_3"] == pytest.approx((0.5 + 0.7) / 2, abs=1e-12)
    assert set(out) == {
        f"{kind}_top_{share}_at_depth_{t}"
        for kind in ("oracle_mass", "mass_kept_vs_oracle")
        for share, t in (("half", 1), ("half", 2), ("half", 3), ("quarter", 2), ("quarter", 3))
    }


def small(teacher_config, **overrides):  # noqa: F811
    common = dict(
        leaves=16, query_set="continuation", fit_queries=20, eval_queries=20, val_queries=8
    )
    return arm(teacher_config, **{**common, **overrides})


def test_oracle_mass_leaves_every_other_metric_unchanged(teacher_config):  # noqa: F811
    """The option only adds metrics: the same draws, fits and values with and without it."""
    for topology in ("learned", "random"):
        without, _ = run(small(teacher_config, topology=topology), seed=2)
        with_it, _ = run(small(teacher_config, topology=topology, oracle_mass=True), seed=2)
        assert {k: v for k, v in with_it.items() if k in without} == without
        added = set(with_it) - set(without)
        assert added == {
            f"{kind}_top_{share}_at_depth_{t}"
            for kind in ("oracle_mass", "mass_kept_vs_oracle")
            for share, t in (("half", 1), ("half", 2), ("half", 4), ("quarter", 2), ("quarter", 4))
        }
        study = RelationClosureStudy()
        assert set(with_it) == study.reported_metrics(small(teacher_config, oracle_mass=True))


def test_the_oracle_reaches_one_and_every_topology_is_set_against_the_learned_tree(
    teacher_config,  # noqa: F811
):
    """Exact parents on the learned tree keep what the oracle keeps (1 up to float rounding); fitted
    parents keep at most that; a random tree's denominator is the learned tree's own oracle mass."""
    results = {
        name: run(small(teacher_config, oracle_mass=True, **config), seed=1)[0]
        for name, config in {
            "oracle": dict(parent="oracle"),
            "learned": dict(parent="prototypes", prototypes=4),
            "random": dict(parent="prototypes", prototypes=4, topology="random"),
        }.items()
    }
    for t, share in ((1, "half"), (2, "half"), (2, "quarter"), (4, "quarter")):
        ratio = f"mass_kept_vs_oracle_top_{share}_at_depth_{t}"
        reference = f"oracle_mass_top_{share}_at_depth_{t}"
        assert results["oracle"][ratio] == pytest.approx(1.0, abs=1e-6)
        assert results["learned"][ratio] <= 1.0 + 1e-6
        assert results["random"][reference] == results["learned"][reference]
        assert results["random"][ratio] == pytest.approx(
            results["random"][f"mass_kept_top_{share}_at_depth_{t}"] / results["learned"][reference]
        )
    # at the leaves (depth D = 4, a quarter = N/4 leaves) the oracle is the best leaves themselves
    assert results["learned"]["oracle_mass_top_quarter_at_depth_4"] == pytest.approx(
        results["learned"]["best_mass_top_quarter"], abs=1e-6
    )


def test_declarations_of_the_relative_metric(teacher_config):  # noqa: F811
    study = RelationClosureStudy()
    learned = small(teacher_config, oracle_mass=True)
    shuffled = small(teacher_config, oracle_mass=True, topology="random")
    name = "mass_kept_vs_oracle_top_quarter_at_depth_2"
    assert study.metric_range(name, learned) == (0.0, 1.0)
    assert study.metric_range(name, shuffled) == (0.0, None)
    assert study.ceiling(name, learned).value == 1.0
    assert study.ceiling(name, shuffled) is None
    assert study.ceiling("mass_kept_top_quarter_at_depth_2", learned).metric == (
        "best_mass_top_quarter"
    )
    with pytest.raises(ValueError, match="dense arm has none"):
        small(teacher_config, parent="dense", oracle_mass=True)


def test_mlp_hidden_sets_the_width_and_keeps_the_parameter_match(teacher_config):  # noqa: F811
    study = RelationClosureStudy()
    prototypes = study.param_count(arm(teacher_config, parent="prototypes", prototypes=8))
    default = arm(teacher_config, parent="mlp")
    assert default.mlp_hidden is None
    for width in (8, 16, 32, 64):
        config = arm(teacher_config, parent="mlp", mlp_hidden=width)
        internal = config.leaves - 1
        state_dim, hidden = rt.mlp_shape_matching(
            internal * 8 * (config.teacher.d_k + 1), internal, config.teacher.d_k, hidden=width
        )
        assert hidden == width
        assert abs(study.param_count(config) - prototypes) <= 0.02 * prototypes
        keys = torch.zeros(1, config.leaves, 32)
        parent = rt.make_parent("mlp", keys, torch.Generator(), state_dim=state_dim, hidden=hidden)
        assert parent.w1_query.shape[-1] == width
    # None is what every recorded MLP arm ran: hidden 32 (halved only when unaffordable)
    assert study.param_count(default) == study.param_count(
        arm(teacher_config, parent="mlp", mlp_hidden=32)
    )
    with pytest.raises(ValueError, match="cannot be matched"):
        RelationClosureConfig(teacher=teacher_config, leaves=32, parent="mlp", mlp_hidden=4096)


def test_the_residual_mlp_keeps_the_match_and_weight_decay_is_the_mlps(teacher_config):  # noqa: F811
    study = RelationClosureStudy()
    plain = arm(teacher_config, parent="mlp", mlp_hidden=16)
    residual = arm(teacher_config, parent="mlp", mlp_hidden=16, mlp_residual=True)
    assert study.param_count(residual) == study.param_count(plain)
    assert study.flops(residual) > study.flops(plain)  # the key's inner product per node
    assert arm(teacher_config, parent="mlp", weight_decay=0.1).weight_decay == 0.1
    with pytest.raises(ValueError, match="other parents have none"):
        arm(teacher_config, parent="prototypes", weight_decay=0.1)
    with pytest.raises(ValueError, match="reads a key of d_k"):
        RelationClosureConfig(
            teacher=teacher_config,
            leaves=32,
            parent="mlp",
            mlp_match_prototypes=1,
            mlp_residual=True,
        )
