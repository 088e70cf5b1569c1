"""The relation_closure study end to end on a tiny teacher trained on generated English-like text:
the data it draws, the arms' metrics, the MLP's capacity match, and determinism."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gates.models import relation_tree as rt
from gates.models.relation_closure import RelationClosureConfig, RelationClosureStudy, draw_data
from gates.models.teacher import load_or_train
from gates.study import Budget, NullReporter
from tests.conftest import tiny_teacher


@pytest.fixture(scope="module")
def teacher_config(tmp_path_factory):
    with tiny_teacher(tmp_path_factory.mktemp("closure")) as config:
        yield config


def arm(teacher_config, **overrides) -> RelationClosureConfig:
    base = dict(
        teacher=teacher_config, leaves=32, trees=4, fit_queries=256, eval_queries=64, batch=64
    )
    return RelationClosureConfig(**{**base, **overrides})


def run(config, seed=0, steps=20):
    reporter = NullReporter(Budget(steps, 10))
    return RelationClosureStudy().run(config, seed, reporter), reporter


def test_fit_and_evaluation_queries_come_from_disjoint_windows(teacher_config):
    teacher = load_or_train(teacher_config, log=lambda _: None)
    keys, fit, evaluation, validation = draw_data(
        teacher, arm(teacher_config), torch.Generator().manual_seed(0)
    )
    assert validation is None
    assert keys.shape == (4, 32, 32) and fit.shape == (256, 32) and evaluation.shape == (64, 32)
    rows_fit = {tuple(q.tolist()) for q in fit}
    assert not any(tuple(q.tolist()) in rows_fit for q in evaluation)


def test_continuation_queries_are_the_trees_own_later_positions(teacher_config):
    """query_set continuation: tree t holds the first N keys of a recorded window, its queries are
    that same window's positions N.. (each sees the whole tree under the causal mask), fit and
    evaluation positions disjoint, the same positions for every tree."""
    teacher = load_or_train(teacher_config, log=lambda _: None)
    config = arm(
        teacher_config,
        leaves=16,
        query_set="continuation",
        fit_queries=20,
        eval_queries=20,
        val_queries=8,
    )
    keys, fit, evaluation, validation = draw_data(teacher, config, torch.Generator().manual_seed(0))
    assert (
        keys.shape == (4, 16, 32) and fit.shape == (4, 20, 32) and evaluation.shape == (4, 20, 32)
    )
    assert validation.shape == (4, 8, 32)
    window = teacher_config.max_positions
    pool = min(2048, teacher.stream("train").numel() // window)
    queries, window_keys = teacher.record("train", pool, window)
    for t in range(4):
        rows = [i for i in range(pool) if torch.equal(window_keys[i, :16], keys[t])]
        assert len(rows) == 1
        positions = {}
        for name, drawn in (("fit", fit), ("eval", evaluation), ("val", validation)):
            matches = [
                (drawn[t, j] == queries[rows[0]]).all(-1).nonzero().flatten().tolist()
                for j in range(len(drawn[t]))
            ]
            assert all(len(m) == 1 for m in matches)
            positions[name] = {m[0] for m in matches}
        assert min(positions["fit"] | positions["eval"] | positions["val"]) >= 16
        assert (
            len(positions["fit"] | positions["eval"] | positions["val"]) == 20 + 20 + 8
        )  # disjoint
    metrics, reporter = run(config)
    assert [sorted(m) for _, m in reporter.history[:1]] == [
        ["closure_error", "fit_loss", "val_closure_error"]
    ]
    assert "val_closure_error" in metrics
    assert 0 < metrics["dense_entropy_ratio"] <= 1
    assert metrics["dense_entropy"] == pytest.approx(metrics["dense_entropy_ratio"] * np.log(16))
    assert (
        0
        <= metrics["mass_kept_top_quarter_at_depth_2"]
        <= metrics["mass_kept_top_half_at_depth_2"]
        <= 1
    )
    assert metrics["teacher_heldout_loss"] == teacher.meta["heldout_loss"]


def test_teacher_layer_reads_that_layer_s_queries_and_keys(teacher_config):
    """teacher_layer: 0 draws the same windows and positions from the first layer's recording; None is
    the last layer (what every contract before it read)."""
    teacher = load_or_train(teacher_config, log=lambda _: None)
    common = dict(
        leaves=16, query_set="continuation", fit_queries=20, eval_queries=20, val_queries=8
    )
    last = draw_data(teacher, arm(teacher_config, **common), torch.Generator().manual_seed(0))
    assert all(
        torch.equal(a, b)
        for a, b in zip(
            last,
            draw_data(
                teacher,
                arm(teacher_config, teacher_layer=1, **common),
                torch.Generator().manual_seed(0),
            ),
        )
    )
    first = draw_data(
        teacher, arm(teacher_config, teacher_layer=0, **common), torch.Generator().manual_seed(0)
    )
    window = teacher_config.max_positions
    pool = min(2048, teacher.stream("train").numel() // window)
    queries0, keys0 = teacher.record("train", pool, window, layer=0)
    queries1, keys1 = teacher.record("train", pool, window)
    for t in range(4):
        (row,) = [i for i in range(pool) if torch.equal(keys1[i, :16], last.keys[t])]
        assert torch.equal(first.keys[t], keys0[row, :16])
        positions = [
            (last.fit_queries[t, j] == queries1[row]).all(-1).nonzero().item() for j in range(20)
        ]
        assert torch.equal(first.fit_queries[t], queries0[row, positions])


def test_oracle_parents_read_exactly_and_fitted_parents_report_every_metric(teacher_config):
    metrics, _ = run(arm(teacher_config, parent="oracle"))
    assert metrics["closure_error"] == 0 and metrics["leaf_kl"] < 1e-6
    metrics, reporter = run(arm(teacher_config, parent="prototypes", prototypes=4, read="beam"))
    assert [step for step, _ in reporter.history] == [10, 20]
    for name in (
        "closure_error",
        "closure_error_level_0",
        "leaf_kl",
        "kl_at_depth_1",
        "kl_at_depth_5",
        "node_kl_at_depth_1",
        "topk_recall_10",
        "visited_share",
        "latency_ms",
        "dense_latency_ms",
        "peak_mem_mb",
        "beam_width",
    ):
        assert name in metrics and name in RelationClosureStudy.metrics
    assert abs(metrics["kl_at_depth_5"] - metrics["leaf_kl"]) < 1e-6  # depth D is the full read
    assert metrics["fit_topk_recall_10"] >= 0.95


def test_mlp_parent_matches_eight_prototypes_within_two_percent(teacher_config):
    study = RelationClosureStudy()
    mlp = study.param_count(arm(teacher_config, parent="mlp", mlp_match_prototypes=8))
    prototypes = study.param_count(arm(teacher_config, parent="prototypes", prototypes=8))
    assert abs(mlp - prototypes) <= 0.02 * prototypes


def test_same_seed_same_metrics(teacher_config):
    config = arm(teacher_config, parent="single_key", topology="random")
    first, _ = run(config, seed=3)
    second, _ = run(config, seed=3)
    assert first == second
    other, _ = run(config, seed=4)
    assert other["closure_error"] != first["closure_error"]


def test_setup_missing_names_an_untrained_teacher(teacher_config):
    """Audits leave out runs whose teacher would first have to be trained (minutes not in their
    recorded seconds); the fixture's teacher is cached, another config's is not."""
    study = RelationClosureStudy()
    assert study.setup_missing(arm(teacher_config)) is None
    other = teacher_config.model_copy(update={"steps": teacher_config.steps + 1})
    assert "is not trained in this machine's cache" in study.setup_missing(arm(other))
    # what an audit weighs before it trains one: the recorded 6,000-step teacher took 1,003 s, the
    # 400-step one 55 s (teacher.json); the fixture's tiny teacher far less
    from gates.models.teacher import TeacherConfig, training_seconds

    assert 1003 <= training_seconds(TeacherConfig(steps=6000)) <= 1.2 * 1003
    assert 55 <= training_seconds(TeacherConfig(steps=400)) <= 2 * 55
    assert study.setup_seconds(arm(other)) < training_seconds(TeacherConfig(steps=400))


def test_config_rejects_impossible_shapes(teacher_config):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="power of two"):
        arm(teacher_config, leaves=48)
    with pytest.raises(ValidationError, match="max_positions"):
        arm(teacher_config, leaves=128)  # the tiny teacher has 64 positions
    with pytest.raises(ValidationError, match="later positions per window"):
        arm(
            teacher_config, leaves=32, query_set="continuation", fit_queries=16, eval_queries=17
        )  # 64 - 32 < 33
    with pytest.raises(ValidationError, match="per-context trees"):
        arm(
            teacher_config, leaf_set="bank", query_set="continuation", fit_queries=8, eval_queries=8
        )
    with pytest.raises(ValidationError, match="val_queries are drawn"):
        arm(teacher_config, val_queries=8)
    with pytest.raises(ValidationError, match="dense arm"):
        arm(teacher_config, parent="dense", read="beam")
    with pytest.raises(
        ValidationError, match="teacher_layer must name one of the teacher's layers 0..1"
    ):
        arm(teacher_config, teacher_layer=2)


# ------------------------------------------------------------------------------------ device
@pytest.mark.skipif(torch.cuda.is_available(), reason="auto resolves to cuda on this machine")
def test_cpu_gives_the_metrics_of_auto_bit_for_bit(teacher_config):
    # a soft read only: its metrics are all computed (a cheap read adds wall-clock latencies)
    runs = {
        device: run(arm(teacher_config, parent="prototypes", prototypes=4, device=device), seed=2)
        for device in ("auto", "cpu")
    }
    (auto, auto_reporter), (cpu, cpu_reporter) = runs["auto"], runs["cpu"]
    assert cpu == auto
    assert cpu_reporter.history == auto_reporter.history


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU")
def test_a_cuda_arm_is_refused_without_a_gpu(teacher_config):
    study = RelationClosureStudy()
    why = study.why_not_ready(arm(teacher_config, device="cuda"))
    assert why and "cuda" in why.lower()
    assert study.why_not_ready(arm(teacher_config, device="cpu")) is None


# ------------------------------------------------------------------------------------ the optimised fit step
# The parents' forward before #12, kept here as the reference: logits node-major (T, Q, N-1, m) and
# torch.logsumexp over the trailing m; the closure targets concatenated from the per-depth levels.
def _old_prototypes_forward(self, queries):
    import math

    q = rt.tree_queries(queries, self.num_trees) / math.sqrt(self.width)
    num_trees, num_nodes, m, width = self.keys.shape
    logits = q @ self.keys.reshape(num_trees, num_nodes * m, width).transpose(1, 2)
    return (logits.unflatten(-1, (num_nodes, m)) + self.log_w.unsqueeze(1)).logsumexp(dim=-1)


def _old_lowrank_forward(self, queries):
    u = self._projected_queries(queries)
    num_trees, num_queries, m, rank = u.shape
    logits = u.reshape(num_trees, num_queries * m, rank) @ self.coef.transpose(1, 2)
    logits = logits.view(num_trees, num_queries, m, -1).transpose(2, 3)
    return (logits + self.log_w.unsqueeze(1)).logsumexp(dim=-1)


def test_closure_targets_equal_the_concatenated_levels_bit_for_bit():
    scores = torch.randn(3, 7, 32, generator=torch.Generator().manual_seed(0)) * 3
    levels = torch.cat(rt.exact_node_scores(scores)[:-1], dim=-1)
    assert torch.equal(rt.exact_internal_scores(scores), levels)


@pytest.mark.parametrize(
    "kind,m", [("prototypes", 1), ("prototypes", 4), ("prototypes", 8), ("lowrank", 4)]
)
def test_the_optimised_fit_step_equals_the_previous_one(kind, m, monkeypatch):
    generator = torch.Generator().manual_seed(0)
    keys = torch.randn(4, 32, 16, generator=generator)
    queries = 2 * torch.randn(96, 16, generator=generator)
    keys_heap = rt.heap_keys(keys, rt.build_topology("learned", keys, generator))
    cls, old_forward = (
        (rt.PrototypeParent, _old_prototypes_forward)
        if kind == "prototypes"
        else (rt.LowRankParent, _old_lowrank_forward)
    )

    def fit(old: bool):
        with monkeypatch.context() as patch:
            if old:
                patch.setattr(cls, "forward", old_forward)
            parent = rt.make_parent(kind, keys_heap, torch.Generator().manual_seed(1), m=m, rank=8)
            losses = rt.fit_parents(
                parent, keys_heap, queries, 5, 0.02, 32, torch.Generator().manual_seed(2)
            )
            return losses, [p.detach().clone() for p in parent.parameters()]

    (old_losses, old_params), (new_losses, new_params) = fit(old=True), fit(old=False)
    assert np.allclose(new_losses, old_losses, rtol=0, atol=1e-5), (new_losses, old_losses)
    for old_param, new_param in zip(old_params, new_params):
        assert torch.allclose(new_param, old_param, rtol=1e-4, atol=1e-5)
    # one gradient, compared directly
    parent = rt.make_parent(kind, keys_heap, torch.Generator().manual_seed(1), m=m, rank=8)
    target = rt.closure_targets(keys_heap, queries)
    grads = []
    for forward in (old_forward, cls.forward):
        parent.zero_grad()
        (forward(parent, queries) - target).pow(2).mean().backward()
        grads.append([p.grad.clone() for p in parent.parameters()])
    for old_grad, new_grad in zip(*grads):
        assert torch.allclose(new_grad, old_grad, rtol=1e-4, atol=1e-7)
