"""The relation_closure study end to end on a tiny teacher trained on generated English-like text:
the data it draws, the arms' metrics, the MLP's capacity match, and determinism."""

from __future__ import annotations

import pytest
import torch

from gates.study import Budget, NullReporter
from models.relation_closure import RelationClosureConfig, RelationClosureStudy, draw_data
from models.teacher import TeacherConfig, load_or_train
from tests.test_teacher import TINY, grammar_lines


@pytest.fixture(scope="module")
def teacher_config(tmp_path_factory):
    import os

    root = tmp_path_factory.mktemp("closure")
    corpus = root / "corpus.txt"
    corpus.write_text("\n".join(grammar_lines(0, 3000)) + "\n")
    old = os.environ.get("TREEHEAP_GATES_CACHE")
    os.environ["TREEHEAP_GATES_CACHE"] = str(root / "cache")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    config = TeacherConfig(corpus=str(corpus), **TINY)
    load_or_train(config, log=lambda _: None)
    yield config
    torch.set_num_threads(threads)
    if old is None:
        os.environ.pop("TREEHEAP_GATES_CACHE")
    else:
        os.environ["TREEHEAP_GATES_CACHE"] = old


def arm(teacher_config, **overrides) -> RelationClosureConfig:
    base = dict(teacher=teacher_config, leaves=32, trees=4, fit_queries=256, eval_queries=64, batch=64)
    return RelationClosureConfig(**{**base, **overrides})


def run(config, seed=0, steps=20):
    reporter = NullReporter(Budget(steps, 10))
    return RelationClosureStudy().run(config, seed, reporter), reporter


def test_fit_and_evaluation_queries_come_from_disjoint_windows(teacher_config):
    teacher = load_or_train(teacher_config, log=lambda _: None)
    keys, fit, evaluation = draw_data(teacher, arm(teacher_config), torch.Generator().manual_seed(0))
    assert keys.shape == (4, 32, 32) and fit.shape == (256, 32) and evaluation.shape == (64, 32)
    rows_fit = {tuple(q.tolist()) for q in fit}
    assert not any(tuple(q.tolist()) in rows_fit for q in evaluation)


def test_oracle_parents_read_exactly_and_fitted_parents_report_every_metric(teacher_config):
    metrics, _ = run(arm(teacher_config, parent="oracle"))
    assert metrics["closure_error"] == 0 and metrics["leaf_kl"] < 1e-6
    metrics, reporter = run(arm(teacher_config, parent="prototypes", prototypes=4, read="beam"))
    assert [step for step, _ in reporter.history] == [10, 20]
    for name in ("closure_error", "closure_error_level_0", "leaf_kl", "kl_at_depth_1", "kl_at_depth_5",
                 "node_kl_at_depth_1", "topk_recall_10", "visited_share", "latency_ms",
                 "dense_latency_ms", "peak_mem_mb", "beam_width"):
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


def test_config_rejects_impossible_shapes(teacher_config):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="power of two"):
        arm(teacher_config, leaves=48)
    with pytest.raises(ValidationError, match="max_positions"):
        arm(teacher_config, leaves=128)  # the tiny teacher has 64 positions
    with pytest.raises(ValidationError, match="dense arm"):
        arm(teacher_config, parent="dense", read="beam")
