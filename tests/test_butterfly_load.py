"""butterfly_reach's load task (issue #31 part 2): structured (XOR) and random
id-matched routing at several loads in one run, the attention control, per-load metrics, and that
every earlier config keeps its model."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from pydantic import ValidationError

from gates.models.butterfly_reach import (
    FILLER,
    SOURCE,
    TARGET,
    ButterflyReachConfig,
    ButterflyReachStudy,
    ReachModel,
    influence,
    make_examples,
    make_load,
    structural_reach,
)
from gates.study import Budget, NullReporter

STUDY = ButterflyReachStudy()
ARMS = ["butterfly", "adjacent", "butterfly_relay", "root_bottleneck", "bag_of_leaves", "attention"]
LOAD = dict(short_lengths=[], short_fraction=0.0, loads=[1, 2, 4, 8], clip_grad_norm=1.0)
SMALL = dict(d_model=8, hidden=8, batch_size=16, test_examples=8, val_examples=16)
# the pilot's and the contract's size: the Butterfly's, the root's two networks narrowed to match it
PILOT = dict(depth=4, values=8, d_model=32, hidden=64, **LOAD)
ROOT_MATCH = dict(merge_hidden=43, read_hidden=43)


def load_batch(config, count, m, seed=0):
    return make_load(config, torch.Generator().manual_seed(seed), count, m)


# ------------------------------------------------------------------------------------ data
@pytest.mark.parametrize("m", [1, 2, 4, 8])
def test_structured_pairs_are_disjoint_xor_pairs_with_matched_ids(m):
    config = ButterflyReachConfig(routing="structured", **LOAD)
    batch = load_batch(config, 600, m)
    rows = torch.arange(600)[:, None]
    for key in ("target", "source", "answer", "distance"):
        assert batch[key].shape == (600, m)
    k = batch["k"]
    assert set(k.tolist()) == set(range(1, 16))  # k uniform over 1 .. N-1
    assert torch.equal(batch["target"], batch["source"] ^ k[:, None])  # target i reads i XOR k
    ends = torch.cat([batch["source"], batch["target"]], 1)
    assert all(len(set(row)) == 2 * m for row in ends.tolist())  # M disjoint pairs
    assert torch.equal(batch["answer"], batch["values"][rows, batch["source"]])
    assert torch.equal(batch["distance"], (batch["target"] - batch["source"]).abs())
    assert (batch["role"][rows, batch["source"]] == SOURCE).all()
    assert (batch["role"][rows, batch["target"]] == TARGET).all()
    assert ((batch["role"] != FILLER).sum(1) == 2 * m).all()  # every other leaf a filler
    ids = batch["message"][rows, batch["source"]]
    assert torch.equal(ids, batch["message"][rows, batch["target"]])  # both ends carry the id
    assert torch.equal(ids.sort(1).values, torch.arange(1, m + 1).expand(600, m))  # 1..M once
    assert ((batch["message"] > 0) == (batch["role"] != FILLER)).all()
    if m > 1:
        assert not torch.equal(ids, torch.arange(1, m + 1).expand(600, m))  # shuffled
    assert (batch["source"] < batch["target"]).any() and (batch["source"] > batch["target"]).any()
    assert batch["mask"].all() and (batch["length"] == 16).all()
    again = load_batch(config, 600, m)
    assert all(torch.equal(again[key], batch[key]) for key in batch)


def test_structured_pairs_cover_every_leaf_pair_evenly_so_distances_match_random_routing():
    """Over k and the pair, every unordered pair {i, j} is the pair of exactly one k: distance d has
    weight N - d in both families, far (> D = 4) 55% of the messages, near (1-3) 35%, at every load."""
    shares = {}
    for routing in ("structured", "random"):
        config = ButterflyReachConfig(routing=routing, **LOAD)
        batch = load_batch(config, 24000, 1, seed=1)
        pairs = Counter(
            (min(s, t), max(s, t))
            for s, t in zip(batch["source"][:, 0].tolist(), batch["target"][:, 0].tolist())
        )
        assert len(pairs) == 120  # 200 draws each expected (sd 14)
        assert all(140 < count < 260 for count in pairs.values())
        distance = batch["distance"].flatten()
        shares[routing] = (
            (distance > 4).double().mean().item(),
            (distance <= 3).double().mean().item(),
        )
        assert shares[routing][0] == pytest.approx(0.55, abs=0.015)
        assert shares[routing][1] == pytest.approx(0.35, abs=0.015)
        eight = load_batch(config, 3000, 8, seed=2)["distance"]
        assert (eight > 4).double().mean().item() == pytest.approx(0.55, abs=0.015)


def test_random_routing_at_a_load_is_the_multi_message_draw():
    config = ButterflyReachConfig(routing="random", **LOAD)
    v3 = ButterflyReachConfig(messages=4, distances=[1, 2, 3], short_lengths=[], short_fraction=0.0)
    ours = load_batch(config, 50, 4, seed=3)
    theirs = make_examples(v3, torch.Generator().manual_seed(3), 50, None)
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)


def test_load_config_rejects():
    for bad in (
        dict(LOAD, messages=8),  # a load task sets M per batch
        dict(LOAD, short_lengths=[9, 12]),  # full length only
        dict(LOAD, loads=[1, 9]),  # 9 pairs need 18 leaves
        dict(LOAD, loads=[0, 1]),
        dict(LOAD, loads=[2, 2]),
        dict(routing="structured", short_lengths=[]),  # structured is a load task
        dict(LOAD, d_model=30, heads=4),
        dict(LOAD, routing="xor"),
        dict(LOAD, arm="transformer"),
    ):
        with pytest.raises(ValidationError):
            ButterflyReachConfig(**bad)


# ------------------------------------------------------------------------------------ model
@pytest.mark.parametrize("routing", ["structured", "random"])
@pytest.mark.parametrize("arm", ARMS)
def test_every_arm_runs_forward_at_every_load(arm, routing):
    config = ButterflyReachConfig(arm=arm, routing=routing, **LOAD, **SMALL)
    torch.manual_seed(0)
    model = ReachModel(config)
    assert model.message_embed.num_embeddings == 9  # ids 1..max(loads), and 0 for none
    for m in config.loads:
        batch = load_batch(config, 5, m)
        logits = model(batch)
        assert logits.shape == (5, m, config.values) and torch.isfinite(logits).all()
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch["answer"].flatten())
        loss.backward()
    assert hasattr(model, "read") == (arm == "root_bottleneck")
    assert hasattr(model, "attention") == (arm == "attention")


def test_parameters_match_at_the_pilot_config():
    counts = {
        arm: STUDY.param_count(
            ButterflyReachConfig(
                arm=arm, **PILOT, **(ROOT_MATCH if arm == "root_bottleneck" else {})
            )
        )
        for arm in ARMS
    }
    assert counts == {
        "butterfly": 9324,
        "adjacent": 9324,
        "butterfly_relay": 9324,
        "root_bottleneck": 9342,  # mlp FOLD 4,203 + read 4,203 (P frozen: unused by the mlp FOLD)
        "bag_of_leaves": 9320,
        "attention": 9352,  # q, k, v, out 4,224 + MLP 4,192
    }
    assert max(counts.values()) / min(counts.values()) < 1.01
    root = ReachModel(ButterflyReachConfig(arm="root_bottleneck", **PILOT, **ROOT_MATCH))
    assert not any(p.requires_grad for p in root.fold.P.parameters())
    # v3's root (messages 8, no loads) keeps its read of the hidden width and its trainable P
    v3 = dict(messages=8, distances=[1, 2, 3, 5, 8, 15], short_lengths=[], short_fraction=0.0)
    assert STUDY.param_count(ButterflyReachConfig(arm="root_bottleneck", **v3)) == 17608


def test_the_relaying_butterfly_is_the_butterfly_on_full_length_sequences():
    """With every leaf present, zeroing the empty ones and treating all as present changes nothing:
    butterfly_relay computes exactly what butterfly does (so the load task does not run it twice)."""
    out = {}
    for arm in ("butterfly", "butterfly_relay"):
        config = ButterflyReachConfig(arm=arm, routing="structured", **LOAD, **SMALL)
        torch.manual_seed(0)
        out[arm] = ReachModel(config)(load_batch(config, 20, 8))
    assert torch.equal(out["butterfly"], out["butterfly_relay"])


@pytest.mark.parametrize("length", [16, 12, 9])
def test_attention_reaches_every_present_leaf_and_no_empty_one(length):
    """The untrained attention arm's measured reach is full (every present source influences every
    present target), and nothing comes from an empty leaf."""
    config = ButterflyReachConfig(arm="attention", **SMALL)  # the one-message task, short lengths
    torch.manual_seed(0)
    model = ReachModel(config)
    batch = make_examples(config, torch.Generator().manual_seed(0), 3, [length])
    strength = influence(model, batch)
    present = strength[:, :length, :length]
    assert (present > 1e-6 * present.amax(-1, keepdim=True)).all()
    assert structural_reach("attention", 4, length).all()
    assert (strength[:, :length, length:] == 0).all()
    noisy = dict(batch, values=torch.where(batch["mask"], batch["values"], 7 - batch["values"]))
    with torch.no_grad():
        z, z_noisy = (model.states(model.embed(b), b["mask"]) for b in (batch, noisy))
    assert torch.equal(z[batch["mask"]], z_noisy[batch["mask"]])


# ------------------------------------------------------------------------------------ study
def test_load_run_reports_per_load_metrics_and_exact_match_is_accuracy_at_one_message():
    config = ButterflyReachConfig(arm="butterfly", routing="structured", **LOAD, **SMALL)
    config = config.model_copy(update={"test_examples": 64})
    reporter = NullReporter(Budget(6, 3))
    out = STUDY.run(config, 0, reporter)
    assert out == STUDY.run(config, 0, NullReporter(Budget(6, 3)))  # deterministic
    assert set(out) <= set(STUDY.metrics)
    assert STUDY.reported_metrics(config) <= set(out)
    assert out["exact_match_m1"] == out["test_acc_m1"]  # one message: the example is the message
    for m in (2, 4, 8):
        assert out[f"exact_match_m{m}"] <= out[f"test_acc_m{m}"]
    for pooled, name in (
        ("test_acc", "test_acc"),
        ("accuracy_far", "far_acc"),
        ("accuracy_near", "near_acc"),
        ("exact_match", "exact_match"),
    ):
        assert out[pooled] == pytest.approx(sum(out[f"{name}_m{m}"] for m in config.loads) / 4)
    assert out["init_min_reach_share"] == 1.0 and "short_test_acc" not in out
    assert [step for step, _ in reporter.history] == [3, 6]


def test_training_draws_one_load_per_batch_uniformly(monkeypatch):
    import gates.models.butterfly_reach as module

    seen = []
    real = module.make_load

    def spy(config, generator, count, messages):
        if count == config.batch_size:  # a training batch (test / validation sets have other sizes)
            seen.append(messages)
        return real(config, generator, count, messages)

    monkeypatch.setattr(module, "make_load", spy)
    config = ButterflyReachConfig(arm="bag_of_leaves", routing="random", **LOAD, **SMALL)
    STUDY.run(config.model_copy(update={"batch_size": 5}), 0, NullReporter(Budget(80, 80)))
    assert len(seen) == 80 and set(seen) == {1, 2, 4, 8}
    assert min(Counter(seen).values()) >= 10


def test_chance_of_the_load_metrics():
    config = ButterflyReachConfig(**LOAD)
    assert STUDY.chance("far_acc_m8", config) == STUDY.chance("test_acc_m1", config) == 1 / 8
    assert STUDY.chance("exact_match_m1", config) == 1 / 8
    assert STUDY.chance("exact_match_m4", config) == 8**-4
    assert STUDY.chance("exact_match", config) == pytest.approx((8**-1 + 8**-2 + 8**-4 + 8**-8) / 4)
