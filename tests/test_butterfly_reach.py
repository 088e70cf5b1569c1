"""butterfly_reach: the data, every arm's shapes and masks, the measured reach of each untrained kernel
against the pairing's structural reach, determinism, and a tiny contract through `gates run`."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
import yaml
from pydantic import ValidationError

from gates.models.butterfly_reach import (
    BOTH,
    FILLER,
    SOURCE,
    TARGET,
    ButterflyReachConfig,
    ButterflyReachStudy,
    ReachModel,
    adjacent_pairing,
    influence,
    make_examples,
    near_far,
    pairing_reach,
    reach_stats,
    structural_reach,
)
from gates.models.treeheap import xor_pairing
from gates.study import Budget, NullReporter
from tests.conftest import ROOT

STUDY = ButterflyReachStudy()
ARMS = ["butterfly", "adjacent", "butterfly_relay", "root_bottleneck", "bag_of_leaves"]
SMALL = dict(d_model=8, hidden=8, batch_size=16, test_examples=8, val_examples=16)


def examples(config, count=6, lengths=None, distance=None, seed=0):
    return make_examples(config, torch.Generator().manual_seed(seed), count, lengths, distance)


# ------------------------------------------------------------------------------------ data
def test_examples_place_source_and_target_at_the_distance_inside_the_sequence():
    config = ButterflyReachConfig()
    full = examples(config, 2000)
    short = examples(config, 2000, config.short_lengths)
    for batch, lengths in ((full, {16}), (short, set(config.short_lengths))):
        rows = torch.arange(len(batch["target"]))
        assert set(batch["length"].tolist()) == lengths
        assert torch.equal(
            batch["mask"], torch.arange(16)[None] < batch["length"][:, None]
        )  # left-packed
        assert torch.equal((batch["target"] - batch["source"]).abs(), batch["distance"])
        assert (batch["target"] < batch["length"]).all() and (
            batch["source"] < batch["length"]
        ).all()
        assert (batch["distance"] < batch["length"]).all()
        assert torch.equal(batch["answer"], batch["values"][rows, batch["source"]])
        same = batch["target"] == batch["source"]
        assert (batch["role"][rows, batch["target"]] == torch.where(same, BOTH, TARGET)).all()
        assert (batch["role"][rows[~same], batch["source"][~same]] == SOURCE).all()
        marked = (batch["role"] != FILLER).sum(1)
        assert torch.equal(marked, torch.where(same, 1, 2))  # one source, one target, nothing else
        assert set(batch["distance"].tolist()) <= set(config.distances)
        assert (batch["target"] > batch["source"]).any() and (
            batch["target"] < batch["source"]
        ).any()
    assert set(full["distance"].tolist()) == set(config.distances)  # N - 1 = 15 included
    assert 15 not in set(short["distance"].tolist())  # does not fit in L <= 15
    assert set(examples(config, 50, None, 15)["target"].tolist()) <= {0, 15}
    # the answer is uniform over the values and independent of the target's own value
    own = full["answer"] == full["values"][torch.arange(2000), full["target"]]
    assert own[full["distance"] > 0].float().mean() < 0.2
    again = examples(config, 2000)
    assert all(torch.equal(again[k], full[k]) for k in full)


def test_config_rejects():
    for bad in (
        dict(distances=[16]),
        dict(distances=[1, 1]),
        dict(short_lengths=[17]),
        dict(depth=6),
        dict(arm="dense"),
        dict(short_lengths=[2], distances=[5]),
    ):
        with pytest.raises(ValidationError):
            ButterflyReachConfig(**bad)


def test_near_and_far_are_within_and_beyond_the_adjacent_chain():
    assert near_far(ButterflyReachConfig()) == ([1, 2, 3], [5, 8, 15])


# ------------------------------------------------------------------------------------ pairings
def test_adjacent_pairing_by_hand():
    pairing = adjacent_pairing(8, 3)
    as_pairs = [list(zip(i.tolist(), j.tolist())) for i, j in pairing]
    assert as_pairs[0] == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert as_pairs[1] == [(1, 2), (3, 4), (5, 6)]  # shifted by one, no wrap-around
    assert as_pairs[2] == as_pairs[0]


def test_structural_reach_of_the_pairings():
    full = structural_reach("butterfly", 4, 16)
    assert full.all()  # XOR: every leaf hears every leaf in log2 N rounds
    for depth in (2, 3, 5):
        assert structural_reach("butterfly", depth, 2**depth).all()
        n = 2**depth  # one round fewer leaves half the leaves unheard
        fewer = pairing_reach(xor_pairing(n, depth - 1), n, n)
        assert fewer.float().mean().item() == pytest.approx(0.5)
    adjacent = structural_reach("adjacent", 4, 16)
    distance = (torch.arange(16)[:, None] - torch.arange(16)[None]).abs()
    assert adjacent[distance <= 3].all() and not adjacent[distance > 4].any()
    assert abs(adjacent.float().mean().item() - 0.4375) < 1e-9
    # short sequences: the empty-member identity cuts XOR paths unless L is a power of two
    assert structural_reach("butterfly", 4, 8).all()
    cut = structural_reach("butterfly", 4, 9)
    assert not cut[7, 8] and not cut.all()  # leaf 8's only path to 7 crosses into empty leaf 9
    for length in range(9, 16):
        assert not structural_reach("butterfly", 4, length).all()
        assert structural_reach("butterfly_relay", 4, length).all()


# ------------------------------------------------------------------------------------ model
@pytest.mark.parametrize("arm", ARMS)
def test_every_arm_has_the_shapes(arm):
    config = ButterflyReachConfig(arm=arm, **SMALL)
    torch.manual_seed(0)
    model = ReachModel(config)
    batch = examples(config, 5, config.short_lengths)
    states = model.states(model.embed(batch), batch["mask"])
    assert states.shape == (5, 16, 8)
    assert model(batch).shape == (5, config.values)
    if arm == "root_bottleneck":  # one root vector for every target
        assert torch.equal(states, states[:, :1].expand_as(states))


@pytest.mark.parametrize("arm", ARMS)
def test_empty_leaves_never_leak(arm):
    config = ButterflyReachConfig(arm=arm, **SMALL)
    torch.manual_seed(0)
    model = ReachModel(config)
    batch = examples(config, 32, config.short_lengths)
    noisy = dict(batch)
    g = torch.Generator().manual_seed(1)
    noisy["values"] = torch.where(
        batch["mask"],
        batch["values"],
        torch.randint(config.values, batch["values"].shape, generator=g),
    )
    noisy["role"] = torch.where(
        batch["mask"], batch["role"], torch.randint(4, batch["role"].shape, generator=g)
    )
    assert not torch.equal(noisy["values"], batch["values"])
    with torch.no_grad():
        z = model.states(model.embed(batch), batch["mask"])
        z_noisy = model.states(model.embed(noisy), batch["mask"])
        big = model.states(model.embed(batch) + 100 * (~batch["mask"]).unsqueeze(-1), batch["mask"])
    present = batch["mask"]
    assert torch.equal(z[present], z_noisy[present])
    assert torch.equal(z[present], big[present])
    # and measured: no present target's state has a gradient from an empty leaf's input
    strength = influence(model, batch)
    empty_source = present[:, :, None] & ~present[:, None, :]
    assert (strength[empty_source] == 0).all()


def test_param_counts_match_across_pairings():
    counts = {arm: STUDY.param_count(ButterflyReachConfig(arm=arm)) for arm in ARMS}
    assert counts["butterfly"] == counts["adjacent"] == counts["butterfly_relay"] == 9036
    assert abs(counts["bag_of_leaves"] - counts["butterfly"]) <= 4  # the Butterfly's 4 alphas
    assert counts["root_bottleneck"] == 11080


@pytest.mark.parametrize("arm", ARMS)
@pytest.mark.parametrize("length", [16, 12, 9])
def test_measured_reach_of_the_untrained_kernel_is_the_pairings(arm, length):
    """Gradients of each target's state with respect to each source's input, on an untrained model,
    are nonzero exactly where the pairing gives a path."""
    config = ButterflyReachConfig(arm=arm, **SMALL)
    torch.manual_seed(0)
    model = ReachModel(config)
    batch = examples(config, 2, [length])
    strength = influence(model, batch)[:, :length, :length]
    measured = strength > 1e-6 * strength.amax(-1, keepdim=True)
    expected = structural_reach(arm, 4, length)
    assert torch.equal(measured, expected.expand_as(measured))


def test_reach_shares_butterfly_full_adjacent_partial():
    shares = {}
    for arm in ("butterfly", "adjacent"):
        config = ButterflyReachConfig(arm=arm, **SMALL)
        torch.manual_seed(0)
        model = ReachModel(config)
        batch = examples(config, 3)
        stats, counts = reach_stats(influence(model, batch), batch["mask"], far=4)
        shares[arm] = stats
        if arm == "butterfly":
            assert (counts == 16).all()
    assert shares["butterfly"] == {"mean": 1.0, "min": 1.0, "far": 1.0}
    assert shares["adjacent"]["mean"] == pytest.approx(0.4375) and shares["adjacent"]["far"] == 0.0
    assert shares["adjacent"]["min"] == pytest.approx(4 / 16)  # the chain's end leaves hear 4


# ------------------------------------------------------------------------------------ study
def test_same_seed_same_metrics_and_every_metric_declared():
    config = ButterflyReachConfig(arm="butterfly", **SMALL)
    reporter = NullReporter(Budget(6, 3))
    first = STUDY.run(config, 5, reporter)
    second = STUDY.run(config, 5, NullReporter(Budget(6, 3)))
    assert first == second
    assert set(first) <= set(STUDY.metrics)
    assert [step for step, _ in reporter.history] == [3, 6]
    assert first["init_mean_reach_share"] == 1.0 and first["init_short_mean_reach_share"] < 0.95
    for d in config.distances:
        assert f"accuracy_at_distance_{d}" in first
    assert "short_accuracy_at_distance_15" not in first  # does not fit a short sequence
    assert "reach.txt" in reporter.attached
    other = STUDY.run(config, 6, NullReporter(Budget(6, 3)))
    assert other != first


def test_butterfly_learns_far_and_adjacent_does_not():
    """A short real training run separates the pairings on the far distances."""
    far = {}
    for arm in ("butterfly", "adjacent"):
        config = ButterflyReachConfig(arm=arm, test_examples=64, val_examples=64)
        far[arm] = STUDY.run(config, 0, NullReporter(Budget(300, 300)))["accuracy_far"]
    assert far["butterfly"] >= 0.9 and far["adjacent"] <= 0.3


def test_a_tiny_contract_runs_end_to_end(tmp_path):
    data = yaml.safe_load((ROOT / "contracts" / "butterfly-reach.yaml").read_text())
    data["id"] = "butterfly-reach-tiny"
    for cfg in data["arms"].values():
        cfg.update(SMALL)
    # 8 seeds: the accuracies are bounded, so their median, whose sign test reaches the 11 ways to refute's
    # Holm level (0.05 / 11) from 8 seeds; the design rules refuse a contract that could never decide
    data["seeds"] = 8
    data["budget"] = {"steps": 4, "eval_every": 2}
    data["preflight"]["falsifiable_point"]["by_step"] = 4
    # what today's design rules ask of a new contract that the recorded one predates: the config field under
    # test, and a convergence rule or why there is none
    data["factor"] = ["arm"]
    data.pop("convergence")
    data["no_convergence"] = "a 4-step test run: far too short for its learning curves to flatten"
    (tmp_path / "contracts").mkdir()
    path = tmp_path / "contracts" / "butterfly-reach-tiny.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    proc = subprocess.run(
        [sys.executable, "-m", "gates", "run", str(path), "--tracking-uri", uri, "--json"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    evidence = json.loads(
        (tmp_path / "runs" / "butterfly-reach-tiny" / "evidence.json").read_text()
    )
    assert evidence["verdict"] in ("supported", "refuted", "inconclusive", "invalid")
    runs = evidence["runs"]
    assert len(runs) == 32 and all(r["status"] == "completed" for r in runs)
    assert all(
        "min_reach_share" in r["metrics"] and "accuracy_at_distance_15" in r["metrics"]
        for r in runs
    )


def test_cpu_gives_the_metrics_of_auto_bit_for_bit():
    config = ButterflyReachConfig(arm="adjacent", **SMALL)
    runs = {device: NullReporter(Budget(6, 3)) for device in ("auto", "cpu")}
    finals = {
        device: STUDY.run(config.model_copy(update={"device": device}), 2, reporter)
        for device, reporter in runs.items()
    }
    assert finals["cpu"] == finals["auto"]
    assert runs["cpu"].history == runs["auto"].history


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU")
def test_a_cuda_arm_is_refused_without_a_gpu():
    why = STUDY.why_not_ready(ButterflyReachConfig(device="cuda"))
    assert why and "cuda" in why.lower()
    assert STUDY.why_not_ready(ButterflyReachConfig(device="cpu")) is None


# ------------------------------------------------------------------------------------ v3: messages, clipping
MULTI = dict(distances=[1, 2, 3, 5, 8, 15], short_lengths=[], short_fraction=0.0, messages=8)


def test_defaults_keep_the_one_message_task_and_no_clipping():
    config = ButterflyReachConfig()
    assert config.messages == 1 and config.clip_grad_norm is None
    batch = examples(config, 10)
    assert (
        "message" not in batch and batch["target"].shape == (10,) and batch["answer"].shape == (10,)
    )
    # v1/v2's parameter counts (the recorded contracts): no message embedding, no root read
    counts = {arm: STUDY.param_count(ButterflyReachConfig(arm=arm)) for arm in ARMS}
    assert counts == {
        "butterfly": 9036,
        "adjacent": 9036,
        "butterfly_relay": 9036,
        "root_bottleneck": 11080,
        "bag_of_leaves": 9032,
    }
    assert not hasattr(ReachModel(ButterflyReachConfig(arm="root_bottleneck")), "read")


def test_multi_message_examples_are_disjoint_id_marked_pairs():
    config = ButterflyReachConfig(**MULTI)
    batch = examples(config, 500)
    m, rows = 8, torch.arange(500)[:, None]
    for key in ("target", "source", "answer", "distance"):
        assert batch[key].shape == (500, m)
    ends = torch.cat([batch["source"], batch["target"]], 1)
    assert all(
        len(set(row)) == 2 * m for row in ends.tolist()
    )  # 16 distinct leaves: disjoint pairs
    assert torch.equal(batch["answer"], batch["values"][rows, batch["source"]])
    assert torch.equal(batch["distance"], (batch["target"] - batch["source"]).abs())
    assert (batch["role"][rows, batch["source"]] == SOURCE).all() and (
        batch["role"][rows, batch["target"]] == TARGET
    ).all()
    ids = batch["message"][rows, batch["source"]]
    assert torch.equal(
        ids, batch["message"][rows, batch["target"]]
    )  # both ends carry the pair's id
    assert torch.equal(
        ids.sort(1).values, torch.arange(1, m + 1).expand(500, m)
    )  # ids 1..M, once each
    assert not torch.equal(ids, torch.arange(1, m + 1).expand(500, m))  # shuffled
    assert batch["mask"].all() and (batch["distance"] >= 1).all()
    assert set(batch["distance"].flatten().tolist()) == set(range(1, 16))  # N - 1 = 15 occurs too
    # a forced distance: pair 0 is at it (its id random), the rest random
    forced = examples(config, 300, None, 15)
    assert (forced["distance"][:, 0] == 15).all() and set(forced["source"][:, 0].tolist()) == {
        0,
        15,
    }
    assert len(set(forced["message"][torch.arange(300), forced["source"][:, 0]].tolist())) == m
    again = examples(config, 500)
    assert all(torch.equal(again[k], batch[k]) for k in batch)


def test_multi_message_short_sequences_use_present_leaves_only():
    config = ButterflyReachConfig(
        **{**MULTI, "messages": 4, "short_lengths": [9, 12, 15], "short_fraction": 0.5}
    )
    batch = examples(config, 400, config.short_lengths)
    rows = torch.arange(400)[:, None]
    assert (batch["source"] < batch["length"][:, None]).all() and (
        batch["target"] < batch["length"][:, None]
    ).all()
    assert ((batch["message"] > 0) == (batch["role"] != FILLER)).all()
    assert (batch["message"][~batch["mask"]] == 0).all() and batch["mask"][
        rows, batch["source"]
    ].all()
    forced = examples(config, 200, config.short_lengths, 8)
    assert (forced["distance"][:, 0] == 8).all() and (forced["length"] > 8).all()


def test_multi_message_config_rejects():
    for bad in (
        dict(MULTI, messages=9),
        dict(MULTI, distances=[0, 1]),
        dict(MULTI, short_lengths=[9, 15], short_fraction=0.5),
        dict(MULTI, clip_grad_norm=0.0),
    ):
        with pytest.raises(ValidationError):
            ButterflyReachConfig(**bad)


@pytest.mark.parametrize("arm", ARMS)
def test_multi_message_shapes_and_no_leak(arm):
    config = ButterflyReachConfig(
        arm=arm, **{**MULTI, "messages": 4, "short_lengths": [9, 12]}, **SMALL
    )
    torch.manual_seed(0)
    model = ReachModel(config).eval()
    batch = examples(config, 6, config.short_lengths)
    logits = model(batch)
    assert logits.shape == (6, 4, config.values)
    assert hasattr(model, "message_embed") and hasattr(model, "read") == (arm == "root_bottleneck")
    noisy = dict(batch)
    noisy["values"] = torch.where(
        batch["mask"], batch["values"], (batch["values"] + 3) % config.values
    )
    noisy["message"] = torch.where(
        batch["mask"], batch["message"], torch.full_like(batch["message"], 2)
    )
    assert torch.allclose(model(noisy), logits)  # empty leaves never leak


def test_clipping_is_applied_to_every_arm_only_when_set(monkeypatch):
    calls = []
    real = torch.nn.utils.clip_grad_norm_
    monkeypatch.setattr(
        torch.nn.utils,
        "clip_grad_norm_",
        lambda p, n, *a, **k: calls.append(n) or real(p, n, *a, **k),
    )
    for arm in ("butterfly", "root_bottleneck"):
        for clip in (None, 0.5):
            calls.clear()
            config = ButterflyReachConfig(arm=arm, clip_grad_norm=clip, **MULTI, **SMALL)
            out = STUDY.run(config, 1, NullReporter(Budget(4, 2)))
            assert calls == ([] if clip is None else [0.5] * 4)
            for key in (
                "test_acc",
                "accuracy_near",
                "accuracy_far",
                "accuracy_at_distance_15",
                "val_acc",
            ):
                assert 0.0 <= out[key] <= 1.0
            assert set(out) <= set(STUDY.metrics)
