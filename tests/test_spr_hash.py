"""SPR ordered hash: the seed's worked example, what the merge rules separate, the embeddings, the study."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from gates.models.corpora import is_present
from gates.models.spr_hash import (
    SprHashConfig,
    SprHashStudy,
    build_vocab,
    cooccurrence_embeddings,
    leaf_vectors,
    mean_pairwise_cos,
    merge,
    root_hash,
    sign_alt,
    tokenize,
)
from gates.study import Budget, NullReporter

STUDY = SprHashStudy()
# the seed's 4-d example: 我 = [1, 2, 3, 4], 打 = [0, 1, 0, 1], 你 = [5, 6, 7, 8]
WO, DA, NI = (
    torch.tensor([1.0, 2, 3, 4]),
    torch.tensor([0.0, 1, 0, 1]),
    torch.tensor([5.0, 6, 7, 8]),
)


def distinct(roots: torch.Tensor) -> int:
    return len({tuple(row) for row in roots.round(decimals=9).tolist()})


# ------------------------------------------------------------------------------------ merge rules
def test_the_seeds_worked_example():
    wo_ni, ni_wo = torch.stack([WO, NI]), torch.stack([NI, WO])  # two leaves: (我, 你) vs (你, 我)
    assert root_hash(wo_ni, "roll_only").tolist() == [9, 7, 9, 11]  # the collision
    assert root_hash(ni_wo, "roll_only").tolist() == [9, 7, 9, 11]
    assert root_hash(wo_ni, "ordered").tolist() == [9, -3, 9, -3]  # the fix
    assert root_hash(ni_wo, "ordered").tolist() == [9, 5, 9, 5]
    assert torch.equal(root_hash(wo_ni, "mean"), root_hash(ni_wo, "mean"))
    # the whole sentence on 4 leaves: 我打你 vs 你打我 are told apart by the ordered hash only
    wo_da_ni = leaf_vectors(torch.stack([WO, DA, NI]), depth=2)
    ni_da_wo = leaf_vectors(torch.stack([NI, DA, WO]), depth=2)
    assert not torch.equal(root_hash(wo_da_ni, "ordered"), root_hash(ni_da_wo, "ordered"))
    assert torch.equal(root_hash(wo_da_ni, "mean"), root_hash(ni_da_wo, "mean"))


def test_merge_rules_by_hand():
    left, right = torch.tensor([1.0, 1, 1, 1]), torch.tensor([1.0, 2, 3, 4])
    assert sign_alt(right).tolist() == [1, -2, 3, -4]
    assert torch.equal(sign_alt(sign_alt(right)), right)
    assert merge(left, right, "ordered").tolist() == [5, 0, 3, -2]  # roll -> [4, 1, 2, 3]
    assert merge(left, right, "roll_only").tolist() == [5, 2, 3, 4]
    assert merge(left, right, "mean").tolist() == [1, 1.5, 2, 2.5]


def test_root_is_a_popcount_sum():
    """root = sum_i T^popcount(i) x_i with T = sign_alt o roll: the same T at every level."""
    leaves = torch.randn(3, 32, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    expected = torch.zeros(3, 6, dtype=torch.float64)
    for i in range(32):
        x = leaves[:, i]
        for _ in range(bin(i).count("1")):
            x = sign_alt(torch.roll(x, 1, dims=-1))
        expected += x
    assert torch.allclose(root_hash(leaves, "ordered"), expected, atol=1e-12)
    assert torch.allclose(root_hash(leaves, "mean"), leaves.mean(dim=1), atol=1e-12)


def test_which_orders_each_rule_separates():
    """All orders of 2 words separate; of 4 words on 4 leaves, 12 of 24 (leaves 1 and 2 have equal
    popcount, so swapping their words collides); the mean separates none."""
    words = torch.randn(4, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    orders = list(itertools.permutations(range(4)))
    roots = {
        rule: torch.stack([root_hash(words[list(order)], rule) for order in orders])
        for rule in ("ordered", "roll_only", "mean")
    }
    assert distinct(roots["ordered"]) == 12
    assert distinct(roots["roll_only"]) == 12
    assert distinct(roots["mean"]) == 1
    for a, b in itertools.combinations(range(len(orders)), 2):
        same = torch.allclose(roots["ordered"][a], roots["ordered"][b], atol=1e-9)
        swap_1_2 = (orders[a][0], orders[a][2], orders[a][1], orders[a][3]) == orders[b]
        assert same == swap_1_2, (orders[a], orders[b])
    pair = torch.stack(
        [root_hash(words[list(order)], "ordered") for order in itertools.permutations(range(2))]
    )
    assert distinct(pair) == 2


def test_leaves_are_padded_with_zeros_and_must_fit():
    x = torch.ones(3, 4)
    padded = leaf_vectors(x, depth=3)
    assert padded.shape == (8, 4) and padded[3:].abs().sum() == 0
    with pytest.raises(ValueError):
        leaf_vectors(torch.ones(9, 4), depth=3)
    with pytest.raises(ValueError):
        root_hash(torch.ones(3, 4), "ordered")  # 3 leaves: not a power of two


def test_mean_pairwise_cos():
    roots = torch.tensor([[1.0, 0], [0, 1], [1, 1]])
    mean, largest = mean_pairwise_cos(roots)
    assert mean == pytest.approx((0 + 2**-0.5 + 2**-0.5) / 3)
    assert largest == pytest.approx(2**-0.5)


# ------------------------------------------------------------------------------------ tokens, embeddings
def test_tokenize():
    assert tokenize("Klicken Sie auf OK.") == ["klicken", "sie", "auf", "ok", "."]
    assert tokenize("单击“确定” in LibreOffice") == [
        "单",
        "击",
        "“",
        "确",
        "定",
        "”",
        "in",
        "libreoffice",
    ]


def small_corpus(rng: np.random.Generator, lines: int = 400) -> list[list[str]]:
    """Two topics whose words share contexts within a topic only."""
    topics = [["red", "green", "blue"], ["cat", "dog", "cow"]]
    contexts = [["colour", "paint", "bright"], ["animal", "farm", "pet"]]
    out = []
    for _ in range(lines):
        t = rng.integers(2)
        out.append(
            [str(rng.choice(contexts[t])), str(rng.choice(topics[t])), str(rng.choice(contexts[t]))]
        )
    return out


def test_cooccurrence_embeddings_are_deterministic_and_meaningful():
    lines = small_corpus(np.random.default_rng(0))
    vocab = build_vocab(lines, 12)
    assert len(vocab) == 12 and vocab == build_vocab(list(reversed(lines)), 12)
    first = cooccurrence_embeddings(lines, vocab, window=1, dim=4)
    again = cooccurrence_embeddings(lines, vocab, window=1, dim=4)
    assert first.shape == (12, 4) and np.array_equal(first, again)
    unit = first / np.linalg.norm(first, axis=1, keepdims=True)
    cos = lambda a, b: float(unit[vocab.index(a)] @ unit[vocab.index(b)])  # noqa: E731
    assert cos("red", "blue") > cos("red", "cat") + 0.5
    assert cos("cat", "cow") > cos("cow", "green") + 0.5


def test_vocab_reserves_and_ranks():
    lines = [["b", "a", "a", "c"], ["c", "a"]]
    assert build_vocab(lines, 3) == ["a", "c", "b"]  # by count, ties by text
    assert build_vocab(lines, 3, reserved=("<pad>", "a")) == ["<pad>", "a", "c"]


# ------------------------------------------------------------------------------------ config and study
@pytest.mark.parametrize(
    "bad",
    [
        dict(merge="sum"),
        dict(sentences=1),
        dict(depth=5, max_words=40),
        dict(min_words=10, max_words=5),
        dict(dim=64, vocab_size=50),
        dict(window=0),
        dict(steps=3),
    ],
)
def test_config_rejects(bad):
    with pytest.raises(ValidationError):
        SprHashConfig(**bad)


@pytest.fixture
def text_file(tmp_path):
    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(300)]
    lines = [" ".join(rng.choice(words, size=rng.integers(3, 20))) for _ in range(600)]
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_study_reports_once_at_the_budget(text_file):
    config = SprHashConfig(corpus=text_file, vocab_size=200, sentences=20)
    assert STUDY.check_ready(config) is None
    assert STUDY.param_count(config) == 0
    reporter = NullReporter(Budget(steps=7, eval_every=7))
    final = STUDY.run(config, seed=0, reporter=reporter)
    assert reporter.history == [(7, final)]
    assert set(final) == set(STUDY.metrics)
    assert -1 <= final["mean_pairwise_cos"] <= final["max_pairwise_cos"] <= 1
    assert final == STUDY.run(config, 0, NullReporter(Budget(1, 1)))  # same seed, same sentences
    assert final != STUDY.run(config, 1, NullReporter(Budget(1, 1)))


def test_mean_merge_ignores_order_and_ordered_does_not(text_file):
    def run(merge):
        config = SprHashConfig(corpus=text_file, vocab_size=200, sentences=20, merge=merge)
        return STUDY.run(config, 0, NullReporter(Budget(1, 1)))

    assert run("mean")["shuffled_cos"] == pytest.approx(1.0)
    assert run("ordered")["shuffled_cos"] < 0.9


def test_check_ready_names_the_missing_file(tmp_path):
    why = STUDY.check_ready(SprHashConfig(corpus=str(tmp_path / "nothing.txt")))
    assert why and "not found" in why


@pytest.mark.skipif(
    not is_present("libreoffice-help"),
    reason="corpus not fetched: gates data fetch libreoffice-help",
)
def test_ordered_hash_spreads_real_sentences_more_than_the_mean():
    ordered = STUDY.run(SprHashConfig(merge="ordered", sentences=50), 0, NullReporter(Budget(1, 1)))
    mean = STUDY.run(SprHashConfig(merge="mean", sentences=50), 0, NullReporter(Budget(1, 1)))
    assert ordered["mean_pairwise_cos"] < mean["mean_pairwise_cos"]


# ------------------------------------------------------------------------------------ device
@pytest.mark.skipif(torch.cuda.is_available(), reason="auto resolves to cuda on this machine")
def test_cpu_gives_the_metrics_of_auto_bit_for_bit(text_file):
    config = SprHashConfig(corpus=text_file, vocab_size=200, sentences=20)
    finals = {
        device: STUDY.run(
            config.model_copy(update={"device": device}), 2, NullReporter(Budget(1, 1))
        )
        for device in ("auto", "cpu")
    }
    assert finals["cpu"] == finals["auto"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU")
def test_a_cuda_arm_is_refused_without_a_gpu(text_file):
    why = STUDY.why_not_ready(SprHashConfig(corpus=text_file, vocab_size=200, device="cuda"))
    assert why and "cuda" in why.lower()
    assert (
        STUDY.why_not_ready(SprHashConfig(corpus=text_file, vocab_size=200, device="cpu")) is None
    )
