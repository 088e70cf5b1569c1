"""The C05 probe's generic arm (`features: message_passing`, c05-structural-probe-v4): its shapes, that it
reads node values and positions (and only through its own inputs), its parameter count against the
subheap kernel it is matched to, and that adding it left the kernels' arms as they were."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gates.models.c05_probe import (
    MESSAGE_ROUNDS,
    C05ProbeConfig,
    C05ProbeStudy,
    StructuralKernel,
    TreeMessagePassing,
    crop_to_own_addresses,
    make_datasets,
    make_kernel,
    masked_scores,
)
from gates.study import Budget, NullReporter, cpu_threads

STUDY = C05ProbeStudy()
V3_ARM = dict(
    pattern=(5.0, -4.0, 3.0),
    sigma=1.0,
    train_depths=[2, 3],
    test_depths=[5, 6],
    train_trees=900,
    test_trees=400,
)  # every arm of c05-structural-probe-v3 (and of v4) but its features


def generic(**overrides) -> C05ProbeConfig:
    return C05ProbeConfig(**{**V3_ARM, "features": "message_passing", "hidden": 8, **overrides})


def test_shapes_and_masking():
    torch.manual_seed(0)
    config = generic(train_trees=5, test_trees=4)
    model = TreeMessagePassing(config)
    train, test = (crop_to_own_addresses(t) for t in make_datasets(config, seed=0))
    for trees in (train, test):  # a cropped heap prefix: 15 addresses (depth 3), 127 (depth 6)
        scores = model(trees["subheap"], trees["exists"])
        assert scores.shape == trees["exists"].shape
        masked = masked_scores(model, trees)
        assert torch.isfinite(masked[trees["exists"]]).all()
        assert torch.isneginf(masked[~trees["exists"]]).all()
    assert train["exists"].shape[1] == 15 and test["exists"].shape[1] == 127


def _probe():
    """A model, one depth-6 tree (full address space) and its scores."""
    torch.manual_seed(1)
    config = generic(train_trees=3, test_trees=2)
    model = TreeMessagePassing(config).eval()
    _, test = make_datasets(config, seed=3)
    subheap, exists = test["subheap"][:1].clone(), test["exists"][:1].clone()
    exists[:] = True  # one full depth-6 tree: every address is a node
    return model, subheap, exists, model(subheap, exists).detach()


def _changed(before: torch.Tensor, after: torch.Tensor) -> set[int]:
    return set(torch.nonzero((before - after).abs()[0] > 1e-6).flatten().tolist())


def test_it_reads_node_values_within_two_hops():
    """Changing node 9's value (depth 3) changes the scores of the nodes within MESSAGE_ROUNDS hops of
    it (the messages carry it) and of no other node; the children's copies in subheap[..., 1:] are
    not read: the network gets them only as messages."""
    model, subheap, exists, before = _probe()
    changed = subheap.clone()
    changed[0, 9, 0] += 3.0
    # within two hops of 9: itself; parent 4, grandparent 1; children 19, 20; grandchildren 39-42;
    # sibling 10 (through the parent)
    assert MESSAGE_ROUNDS == 2
    assert _changed(before, model(changed, exists)) == {9, 4, 1, 19, 20, 39, 40, 41, 42, 10}
    ignored = subheap.clone()
    ignored[..., 1:] = torch.randn_like(ignored[..., 1:])
    assert torch.equal(model(ignored, exists), before)


def test_it_reads_depth_and_path():
    """The same values at the same address, with that address's depth one-hot (or its path code)
    replaced, give another score there: the position is an input."""
    model, subheap, exists, before = _probe()
    depth_columns = slice(0, model.position.shape[1] - 12)  # one-hot depth 0..6, then 12 path bits
    for columns, new in ((depth_columns, [0, 0, 0, 0, 0, 1, 0]), (slice(7, 19), [1, 0] * 6)):
        moved = TreeMessagePassing(generic())
        moved.load_state_dict(model.state_dict())
        moved.position[9, columns] = torch.tensor(new, dtype=torch.float32)
        assert 9 in _changed(before, moved(subheap, exists).detach())
    # and a node outside the tree (exists False) neither scores nor sends messages: its value is unread
    outside = exists.clone()
    outside[0, 63:] = False  # depth 6 removed
    cut = model(subheap, outside).detach()
    changed = subheap.clone()
    changed[0, 100, 0] += 5.0
    assert torch.equal(model(changed, outside)[0, :63], cut[0, :63])


def test_parameters_match_the_widened_subheap_kernel():
    """23 inputs per node (value, x, depth 0..6 one-hot, 12 path bits) -> 8, two rounds of
    (4 x 8 -> 8), 8 -> 1: 192 + 2 x 264 + 9 = 729, the subheap kernel's 8 x 91 + 1."""
    assert STUDY.param_count(generic()) == 23 * 8 + 8 + MESSAGE_ROUNDS * (32 * 8 + 8) + 9 == 729
    kernel = C05ProbeConfig(**V3_ARM, features="subheap_kernel", hidden=91)
    assert STUDY.param_count(kernel) == 729
    assert STUDY.flops(generic()) == 2 * (23 * 8 + MESSAGE_ROUNDS * 4 * 8 * 8 + 8) == 1408


def test_it_trains_on_its_training_depths():
    """A short run fits held-out trees of the training depths well beyond chance (about 0.10)."""
    config = generic(train_trees=200, test_trees=50, val_trees=100, lr=0.005, device="cpu")
    with cpu_threads(1):
        final = STUDY.run(config, 0, NullReporter(Budget(100, 50)))
    assert final["val_acc"] > 0.9 and set(final) == set(STUDY.metrics)


# Seed 0 of each arm of c05-structural-probe-v3 (its contract's configs, 300 steps, one thread), as the
# code before the generic arm computed it: the same numbers as runs/c05-structural-probe-v3/evidence.json,
# bit for bit on the machine they were recorded on; another CPU rounds its sums otherwise.
V3_SEED0 = {
    "flat_address": {
        "train_loss": 1.8059496879577637,
        "train_acc": 0.2633333206176758,
        "test_acc": 0.017500000074505806,
        "hit_at_3": 0.017500000074505806,
        "mean_rank": 52.84000015258789,
        "route_valid_rate": 1.0,
        "test_loss": 6.4429826736450195,
        "val_loss": 1.7393079996109009,
        "val_acc": 0.2549999952316284,
    },
    "path_only": {
        "train_loss": 1.805742621421814,
        "train_acc": 0.2633333206176758,
        "test_acc": 0.0,
        "hit_at_3": 0.0,
        "mean_rank": 47.55500030517578,
        "route_valid_rate": 1.0,
        "test_loss": 9.818650245666504,
        "val_loss": 1.7390660047531128,
        "val_acc": 0.2549999952316284,
    },
    "subheap_kernel": {
        "train_loss": 9.790475451154634e-05,
        "train_acc": 1.0,
        "test_acc": 1.0,
        "hit_at_3": 1.0,
        "mean_rank": 1.0,
        "route_valid_rate": 1.0,
        "test_loss": 0.00022152060410007834,
        "val_loss": 0.00013617762306239456,
        "val_acc": 1.0,
    },
    "path_subheap_kernel": {
        "train_loss": 0.00012285054253879935,
        "train_acc": 1.0,
        "test_acc": 1.0,
        "hit_at_3": 1.0,
        "mean_rank": 1.0,
        "route_valid_rate": 1.0,
        "test_loss": 0.0002985534956678748,
        "val_loss": 0.00022336430265568197,
        "val_acc": 1.0,
    },
}
# Another CPU's rounding, measured: on an AMD EPYC, path_only's mean_rank came out 47.84 against 47.56
# recorded (0.6% relative: a blind arm at chance ranks near-tied scores, which rounding reorders) and a
# loss 6e-4 relative from the record (a 1e-5 tolerance failed there). The recorded values are compared
# within what CI's audit allows across machines (`--audit-tolerance 0.01,0.01`: abs + rel x |value|,
# 1.7x the measured rank drift and 16x the loss drift), the blind arms' mean_rank within 5% (8x); a
# change of data, initialisation or defaults moves these metrics by whole percents or by factors (the
# kernels' losses). That the code is unchanged is checked exactly against the reference code path on
# this machine (`test_the_kernels_are_unchanged`).
ACROSS_CPUS = (0.01, 0.01)
BLIND_RANK_REL = 0.05


def _train(features: str) -> dict[str, float]:
    config = C05ProbeConfig(**V3_ARM, features=features, device="cpu")  # as recorded
    with cpu_threads(1):
        return STUDY.run(config, 0, NullReporter(Budget(300, 25)))


@pytest.mark.parametrize("features", sorted(V3_SEED0))
def test_the_kernels_are_unchanged(features, monkeypatch):
    """Every kernel arm builds and initialises exactly as before (the same module, the same draws from
    the RNG) and trains, on this machine, to exactly the metrics the code before the generic arm
    computes here (the study's run with its kernel built as it was then, `StructuralKernel(config)`)."""
    from gates.models import c05_probe

    config = C05ProbeConfig(**V3_ARM, features=features, device="cpu")
    torch.manual_seed(0)
    built = make_kernel(config)
    after = torch.get_rng_state()
    torch.manual_seed(0)
    reference = StructuralKernel(config)
    assert type(built) is StructuralKernel and torch.equal(after, torch.get_rng_state())
    for a, b in zip(built.state_dict().values(), reference.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    final = _train(features)
    with monkeypatch.context() as before:  # the reference code path: the kernel built directly
        before.setattr(c05_probe, "make_kernel", StructuralKernel)
        assert _train(features) == final  # bit for bit: the same machine, the same code path


@pytest.mark.parametrize("features", sorted(V3_SEED0))
def test_the_kernels_train_to_the_recorded_metrics_on_any_cpu(features):
    """v3's recorded seed-0 metrics, within another CPU's rounding (ACROSS_CPUS, measured above)."""
    from gates.verify._audit import within_tolerance

    final = _train(features)
    expected = V3_SEED0[features]
    assert set(final) == set(expected)
    for name, value in expected.items():
        if name == "mean_rank" and features in ("flat_address", "path_only"):
            assert final[name] == pytest.approx(value, rel=BLIND_RANK_REL), name
        else:
            assert within_tolerance(final[name], value, *ACROSS_CPUS), (name, final[name], value)
    assert np.isfinite(list(final.values())).all()
