"""C05 probe: the data, the path/route helpers, determinism, and that real training separates the arms."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from pydantic import ValidationError

from gates.models.c05_probe import (
    C05ProbeConfig,
    C05ProbeStudy,
    StructuralKernel,
    address_paths,
    crop_to_own_addresses,
    is_internal,
    make_datasets,
    masked_scores,
    path_code,
    target_rank,
    walk_route,
)
from gates.study import Budget, Halt, NullReporter

STUDY = C05ProbeStudy()
SMALL = dict(train_trees=200, test_trees=100)  # quick runs where only plumbing is tested


def node_depth(address: torch.Tensor) -> torch.Tensor:
    return torch.floor(torch.log2(address.double() + 1)).long()


# ------------------------------------------------------------------------------------ data
def test_pattern_sits_where_the_label_says_and_test_targets_are_deep():
    config = C05ProbeConfig(pattern=(0.9, -0.4, 0.7), sigma=2.0)
    train, test = make_datasets(config, seed=3)
    assert train["values"].shape == (900, 127) and test["values"].shape == (400, 127)
    for trees, depths in ((train, {2, 3}), (test, {5, 6})):
        rows = torch.arange(len(trees["target"]))
        a = trees["target"]
        planted = torch.stack(
            [
                trees["values"][rows, a],
                trees["values"][rows, 2 * a + 1],
                trees["values"][rows, 2 * a + 2],
            ],
            dim=1,
        )
        assert torch.equal(planted, torch.tensor([0.9, -0.4, 0.7]).expand_as(planted))
        assert torch.equal(trees["subheap"][rows, a], planted)  # the kernel's view agrees
        assert set(trees["depth"].tolist()) == depths  # both depths drawn
        assert (node_depth(a) < trees["depth"]).all()  # an internal node of its tree
        assert torch.equal(trees["exists"].sum(1), 2 ** (trees["depth"] + 1) - 1)
        assert (trees["values"][~trees["exists"]] == 0).all()
        assert is_internal(a, trees["exists"]).all()
    # unseen addresses: every test target is deeper than any internal node of a training tree
    assert (node_depth(test["target"]) >= 3).all()
    assert node_depth(test["target"]).min() == 3 and node_depth(test["target"]).max() == 5
    assert node_depth(train["target"]).max() == 2 and node_depth(train["target"]).min() == 0
    # deterministic from the seed, different across seeds
    again, _ = make_datasets(config, seed=3)
    other, _ = make_datasets(config, seed=4)
    assert torch.equal(again["values"], train["values"])
    assert not torch.equal(other["values"], train["values"])


def test_cropping_to_owned_addresses_keeps_the_loss():
    config = C05ProbeConfig(features="path_subheap_kernel", **SMALL)
    train, _ = make_datasets(config, seed=0)
    cropped = crop_to_own_addresses(train)
    assert cropped["values"].shape[1] == 15  # depth <= 3 trees own addresses 0..14
    torch.manual_seed(0)
    model = StructuralKernel(config)
    full = F.cross_entropy(masked_scores(model, train), train["target"])
    crop = F.cross_entropy(masked_scores(model, cropped), cropped["target"])
    assert torch.allclose(full, crop, rtol=1e-6, atol=1e-6)


# ------------------------------------------------------------------------------------ paths
def test_paths_by_hand():
    bits, lengths = address_paths(3)
    L, R = 0, 1
    expected = {
        0: [],
        1: [L],
        2: [R],
        3: [L, L],
        4: [L, R],
        6: [R, R],
        10: [L, R, R],
        14: [R, R, R],
    }
    for address, path in expected.items():
        assert lengths[address] == len(path)
        assert bits[address, : len(path)].tolist() == path
        assert bits[address, len(path) :].sum() == 0
    code = path_code(3)
    assert code.shape == (15, 6)
    assert code[0].tolist() == [0] * 6
    assert code[10].tolist() == [1, 0, 0, 1, 0, 1]  # L R R as (is_L, is_R) per step
    assert code[3].tolist() == [1, 0, 1, 0, 0, 0]  # L L, then zeros


def test_route_walk_reaches_the_address_and_knows_internal_nodes():
    bits, lengths = (torch.from_numpy(a) for a in address_paths(3))
    exists = torch.arange(15)[None, :] < 7  # one tree of depth 2 in a depth-3 address space
    # walking every path in a full depth-3 tree lands exactly on its address
    full = torch.ones(15, 15, dtype=torch.bool)
    reached, ok = walk_route(bits, lengths, full)
    assert torch.equal(reached, torch.arange(15)) and ok.all()
    cases = {
        0: (True, True),
        1: (True, True),
        2: (True, True),  # root and depth-1 nodes: internal
        3: (True, False),
        6: (True, False),  # depth-2 leaves: reachable, no subheap
        7: (False, False),
        10: (False, False),
    }  # depth 3: not in this tree
    for address, (reachable, internal) in cases.items():
        reached, ok = walk_route(bits[[address]], lengths[[address]], exists)
        assert bool(ok) == reachable, address
        assert bool(ok & is_internal(reached, exists)) == internal, address


def test_rank_agrees_with_argmax_under_ties():
    scores = torch.tensor([[1.0, 3.0, 3.0, float("-inf")], [2.0, 2.0, 0.0, 5.0]])
    assert target_rank(scores, torch.tensor([1, 1])).tolist() == [1, 3]
    assert target_rank(scores, torch.tensor([2, 0])).tolist() == [2, 2]
    generator = torch.Generator().manual_seed(0)
    scores = torch.randint(0, 4, (200, 9), generator=generator).float()
    target = torch.randint(0, 9, (200,), generator=generator)
    assert torch.equal(target_rank(scores, target) == 1, scores.argmax(1) == target)


# ------------------------------------------------------------------------------------ config
@pytest.mark.parametrize(
    "bad",
    [
        dict(pattern=(1.0, 2.0)),
        dict(pattern=(1.0, 2.0, 3.0, 4.0)),
        dict(sigma=0.0),
        dict(train_depths=[0, 2]),
        dict(train_depths=[]),
        dict(test_depths=[3, 5]),
        dict(features="address"),
        dict(hidden=0),
        dict(epochs=3),
    ],
)
def test_config_rejects(bad):
    with pytest.raises(ValidationError):
        C05ProbeConfig(**bad)


def test_params_and_flops_are_measured():
    flat = C05ProbeConfig(features="flat_address")
    assert STUDY.param_count(flat) == 127 * 32 + 32 + 1
    assert STUDY.param_count(C05ProbeConfig(features="subheap_kernel")) == 6 * 32 + 32 + 32 + 1
    assert STUDY.param_count(C05ProbeConfig(features="path_only")) == 12 * 32 + 32 + 32 + 1
    assert STUDY.flops(C05ProbeConfig(features="path_subheap_kernel")) == 2 * (18 * 32 + 32)
    assert STUDY.flops(flat) == 2 * 32


# ------------------------------------------------------------------------------------ runs
def test_same_seed_same_metrics_bit_for_bit():
    config = C05ProbeConfig(features="path_subheap_kernel", pattern=(0.9, -0.4, 0.7), **SMALL)
    runs = [NullReporter(Budget(steps=40, eval_every=20)) for _ in range(3)]
    finals = [STUDY.run(config, seed, reporter) for seed, reporter in zip((7, 7, 8), runs)]
    assert finals[0] == finals[1]
    assert runs[0].history == runs[1].history
    assert finals[0] != finals[2]


def test_reporter_gets_every_metric_at_the_eval_steps():
    reporter = NullReporter(Budget(steps=25, eval_every=10))
    final = STUDY.run(C05ProbeConfig(**SMALL), seed=0, reporter=reporter)
    assert [step for step, _ in reporter.history] == [10, 20, 25]
    for _, metrics in reporter.history:
        assert set(metrics) == set(STUDY.metrics)
        assert all(isinstance(v, float) and np.isfinite(v) for v in metrics.values())
    assert final == reporter.history[-1][1]
    assert 0 <= final["test_acc"] <= final["hit_at_3"] <= 1 and final["mean_rank"] >= 1


def test_halt_from_the_reporter_stops_the_run():
    class HaltAt20(NullReporter):
        def report(self, step, metrics):
            super().report(step, metrics)
            if step >= 20:
                raise Halt("futility", step, "test")

    reporter = HaltAt20(Budget(steps=100, eval_every=10))
    with pytest.raises(Halt) as raised:
        STUDY.run(C05ProbeConfig(**SMALL), seed=0, reporter=reporter)
    assert raised.value.step == 20
    assert [step for step, _ in reporter.history] == [10, 20]


def test_subheap_kernel_transfers_to_deep_trees_and_flat_address_does_not():
    """The seed's claim on the easy pattern (5, -4, 3), sigma 1, with real training."""
    budget = Budget(steps=150, eval_every=150)
    subheap = STUDY.run(C05ProbeConfig(features="subheap_kernel"), 0, NullReporter(budget))
    flat = STUDY.run(C05ProbeConfig(features="flat_address"), 0, NullReporter(budget))
    assert subheap["test_acc"] >= 0.9, subheap
    assert subheap["route_valid_rate"] >= 0.9, subheap
    assert flat["test_acc"] <= 0.25, flat
    assert flat["mean_rank"] > subheap["mean_rank"]


# ------------------------------------------------------------------------------------ device
@pytest.mark.skipif(torch.cuda.is_available(), reason="auto resolves to cuda on this machine")
def test_cpu_gives_the_metrics_of_auto_bit_for_bit():
    config = C05ProbeConfig(features="path_subheap_kernel", **SMALL)
    runs = {device: NullReporter(Budget(steps=30, eval_every=15)) for device in ("auto", "cpu")}
    finals = {
        device: STUDY.run(config.model_copy(update={"device": device}), 5, reporter)
        for device, reporter in runs.items()
    }
    assert finals["cpu"] == finals["auto"]
    assert runs["cpu"].history == runs["auto"].history


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU")
def test_a_cuda_arm_is_refused_without_a_gpu():
    why = STUDY.why_not_ready(C05ProbeConfig(device="cuda"))
    assert why and "cuda" in why.lower()
    assert STUDY.why_not_ready(C05ProbeConfig(device="cpu")) is None
