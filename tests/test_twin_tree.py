"""Twin tree: the decoder's exact inverse, the data split, the metrics, and real toy training."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from gates.models.spr_hash import merge, right_child, root_hash
from gates.models.twin_tree import (
    TOY_PAIRS,
    TwinTree,
    TwinTreeConfig,
    TwinTreeStudy,
    build_data,
    corpus_bleu,
    decoded_metrics,
    load_split,
    text_fraction,
)
from gates.study import Budget, NullReporter

STUDY = TwinTreeStudy()


# ------------------------------------------------------------------------------------ the inverse
def test_unsign_unroll_recovers_the_right_child_exactly():
    generator = torch.Generator().manual_seed(0)
    for d in (4, 5, 32):  # odd widths too: the inverse does not rely on d being even
        # integer-valued float64: every operation is exact, so equality is bit for bit
        left, right = (
            torch.randint(-1000, 1000, (7, d), generator=generator).double() for _ in range(2)
        )
        assert torch.equal(right_child(merge(left, right, "ordered"), left), right)
        # real values: exact up to one rounding of the add and the subtract
        left, right = (
            torch.randn(7, d, dtype=torch.float64, generator=generator) for _ in range(2)
        )
        assert torch.allclose(
            right_child(merge(left, right, "ordered"), left), right, rtol=0, atol=1e-14
        )
    # the seed's example: parent [9, -3, 9, -3] with left 我 = [1, 2, 3, 4] gives back 你 = [5, 6, 7, 8]
    parent, wo = torch.tensor([9.0, -3, 9, -3]), torch.tensor([1.0, 2, 3, 4])
    assert right_child(parent, wo).tolist() == [5, 6, 7, 8]


def test_decoded_leaves_merge_back_to_the_root():
    """Whatever W_split predicts, the decoded tree is an ordered-hash tree of its own leaves."""
    config = TwinTreeConfig(depth=4, dim=8)
    model = TwinTree(config, 5, 5).double()
    with torch.no_grad():
        model.split.copy_(torch.randn(4, 8, 8, dtype=torch.float64))
    root = torch.randn(3, 8, dtype=torch.float64)
    leaves = model.decode(root)
    assert leaves.shape == (3, 16, 8)
    assert torch.allclose(root_hash(leaves, "ordered"), root, atol=1e-9)


# ------------------------------------------------------------------------------------ data
def test_toy_pairs_and_ids():
    data = build_data(TwinTreeConfig())
    assert data["src_vocab"][:2] == ["<pad>", "<unk>"] and set(data["src_vocab"][2:]) == {
        "我",
        "打",
        "你",
        "爱",
    }
    assert set(data["tgt_vocab"][2:]) == {"i", "hit", "you", "me", "love"}
    assert (
        data["train_src"].shape == (4, 4) and (data["train_src"][:, 3] == 0).all()
    )  # 3 tokens + pad
    assert torch.equal(data["train_src"], data["test_src"])  # memorisation check by design
    assert data["test_references"][0] == "i hit you"
    assert len(TOY_PAIRS) == 4


@pytest.fixture
def pair_file(tmp_path):
    rng = np.random.default_rng(0)
    rows = [
        f"quelle {i} "
        + " ".join(f"s{j}" for j in rng.integers(0, 50, size=rng.integers(1, 12)))
        + "\t"
        + " ".join(f"t{j}" for j in rng.integers(0, 50, size=rng.integers(1, 12)))
        for i in range(400)
    ]
    rows.insert(0, "Quelle a b c\tt1 t2 t3")
    rows.append("quelle a b c\tanother translation")  # the same source after tokenisation: dropped
    path = tmp_path / "pairs.tsv"
    path.write_text("\n".join(rows) + "\n")
    return path


def test_split_is_stable_filtered_and_held_out(pair_file, tmp_path):
    args = dict(min_tokens=3, max_tokens=8, test_fraction=0.2, train_pairs=1000, test_pairs=1000)
    train, test = load_split(str(pair_file), **args)
    for src, tgt in train + test:
        assert 3 <= len(src) <= 8 and 3 <= len(tgt) <= 8
    train_sources, test_sources = {s for s, _ in train}, {s for s, _ in test}
    assert not train_sources & test_sources
    assert len(train_sources) == len(train)  # one pair per source text
    assert (("quelle", "a", "b", "c"), ("t1", "t2", "t3")) in train + test
    assert not any(tgt[0] == "another" for _, tgt in train + test)
    for src, _ in test:
        assert text_fraction(" ".join(src)) < 0.2  # tokens joined by spaces == the source text here
    # the split depends on the texts, not on the file order
    lines = pair_file.read_text().splitlines()
    shuffled = tmp_path / "shuffled.tsv"
    shuffled.write_text("\n".join(lines[:-1][::-1]) + "\n")
    assert set(load_split(str(shuffled), **args)[1]) == set(test)
    small_train, small_test = load_split(
        str(pair_file), **{**args, "train_pairs": 10, "test_pairs": 5}
    )
    assert len(small_train) == 10 and len(small_test) == 5 and set(small_test) <= set(test)


# ------------------------------------------------------------------------------------ metrics
def test_metrics_by_hand():
    target = torch.tensor([[5, 6, 0, 0], [5, 7, 8, 0]])
    predicted = torch.tensor([[5, 6, 0, 0], [5, 6, 8, 3]])
    logits = torch.nn.functional.one_hot(predicted, 10).float()
    metrics = decoded_metrics(logits, target)
    assert metrics["token_acc"] == pytest.approx(4 / 5)  # 5 non-pad target leaves, 4 right
    assert metrics["exact_match"] == 0.5  # the second sentence has a wrong word and an extra one
    vocab = ["<pad>", "<unk>", "a", "b", "c", "i", "hit", "you", "me", "x"]
    assert corpus_bleu(target, vocab, ["i hit", "i you me"]) == pytest.approx(100.0)
    assert corpus_bleu(predicted, vocab, ["i hit", "i you me"]) < 100.0


# ------------------------------------------------------------------------------------ config
@pytest.mark.parametrize(
    "bad",
    [
        dict(depth=1),
        dict(depth=3, max_tokens=9),
        dict(min_tokens=5, max_tokens=4),
        dict(merge="sum"),
        dict(test_fraction=1.0),
        dict(vocab_size=2),
        dict(lr=0),
        dict(encoder="mean"),
    ],
)
def test_config_rejects(bad):
    with pytest.raises(ValidationError):
        TwinTreeConfig(**bad)


def test_params_are_measured():
    config = TwinTreeConfig(depth=3, dim=16)
    # E_src (2 + 4 words) + E_tgt (2 + 5 words), bridge, one split per level
    assert STUDY.param_count(config) == 6 * 16 + 7 * 16 + 16 * 16 + 3 * 16 * 16
    assert STUDY.param_count(config.model_copy(update={"merge": "mean"})) == STUDY.param_count(
        config
    )
    assert STUDY.check_ready(config) is None
    assert "not found" in STUDY.check_ready(TwinTreeConfig(pairs="/nonexistent/pairs.tsv"))


# ------------------------------------------------------------------------------------ training
def test_toy_is_memorised_exactly():
    reporter = NullReporter(Budget(steps=100, eval_every=50))
    final = STUDY.run(TwinTreeConfig(), seed=0, reporter=reporter)
    assert [step for step, _ in reporter.history] == [50, 100]
    assert set(final) == set(STUDY.metrics)
    assert final["exact_match"] == 1.0 and final["token_acc"] == 1.0
    assert final["bleu"] == pytest.approx(100.0)


def test_an_unordered_encoder_cannot_tell_the_swapped_pairs_apart():
    final = STUDY.run(TwinTreeConfig(merge="mean"), seed=0, reporter=NullReporter(Budget(100, 100)))
    assert final["exact_match"] <= 0.5  # 我打你 / 你打我 (and 我爱你 / 你爱我) share a root


def test_same_seed_same_metrics(pair_file):
    config = TwinTreeConfig(
        pairs=str(pair_file), depth=3, min_tokens=2, dim=8, batch_size=16, test_pairs=20
    )
    runs = [NullReporter(Budget(steps=20, eval_every=10)) for _ in range(3)]
    finals = [STUDY.run(config, seed, reporter) for seed, reporter in zip((3, 3, 4), runs)]
    assert runs[0].history == runs[1].history
    assert finals[0] != finals[2]


# ------------------------------------------------------------------------------------ device
@pytest.mark.skipif(torch.cuda.is_available(), reason="auto resolves to cuda on this machine")
@pytest.mark.parametrize("pairs", ["toy", "file"])
def test_cpu_gives_the_metrics_of_auto_bit_for_bit(pair_file, pairs):
    config = (
        TwinTreeConfig()
        if pairs == "toy"
        else TwinTreeConfig(
            pairs=str(pair_file), depth=3, min_tokens=2, dim=8, batch_size=16, test_pairs=20
        )
    )
    runs = {device: NullReporter(Budget(steps=20, eval_every=10)) for device in ("auto", "cpu")}
    finals = {
        device: STUDY.run(config.model_copy(update={"device": device}), 3, reporter)
        for device, reporter in runs.items()
    }
    assert finals["cpu"] == finals["auto"]
    assert runs["cpu"].history == runs["auto"].history


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU")
def test_a_cuda_arm_is_refused_without_a_gpu():
    why = STUDY.why_not_ready(TwinTreeConfig(device="cuda"))
    assert why and "cuda" in why.lower()
    assert STUDY.why_not_ready(TwinTreeConfig(device="cpu")) is None
