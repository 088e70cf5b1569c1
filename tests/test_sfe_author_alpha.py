"""biic_lm's SFE options for measuring the seed's alpha_cos the author's way (issue #30 item 5): the
author's word ids, the median pairwise cosine of the embeddings e, the author's auxiliary term (no
gradient), and that the options leave every existing metric of a run unchanged. Data: a small
generated help-like text in which the author's words "field", "form", "key", ... are single pieces;
no corpus fetch."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml
from pydantic import ValidationError

from gates.models.biic_lm import BiicLMConfig, BiicLMStudy, build_model
from gates.models.biic_lm.study import (
    AUTHOR_MIN_OCCURRENCES,
    AUTHOR_WORDS,
    author_alpha_cos,
    author_diversity_loss,
    author_occurrences,
    author_word_ids,
    consecutive_windows,
    median_pairwise_cosine,
)
from gates.study import Budget, NullReporter
from tests.conftest import generated_corpus

ROOT = Path(__file__).resolve().parent.parent
STUDY = BiicLMStudy()

pytestmark = pytest.mark.usefixtures("one_thread")

WORDS = ["field", "form", "key", "check", "right", "frame", "run", "match"]


def word_lines(count: int, seed: int = 0) -> list[str]:
    """Help-like sentences in which eight of the author's words recur in varied contexts."""
    rng = random.Random(seed)
    verbs = "Press Click Select Open Choose Enter Type Delete Insert Format Edit View Tools Table"
    verbs = (verbs + " Sheet Data Window Help").split()
    nouns = "box name list value button menu dialog option cell column row style page comment"
    nouns = (nouns + " section chart macro filter range sidebar").split()
    return [
        f"{rng.choice(verbs)} the {rng.choice(WORDS)} {rng.choice(nouns)}, then "
        f"{rng.choice(verbs).lower()} a {rng.choice(nouns)} {rng.choice(WORDS)}."
        for _ in range(count)
    ]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A generated .txt corpus and a private tokenizer cache (TREEHEAP_GATES_CACHE) for this module."""
    root = tmp_path_factory.mktemp("sfe_author")
    with generated_corpus(root, "words.txt", word_lines(3000)) as path:
        yield path


def tiny(corpus: Path, **overrides) -> BiicLMConfig:
    settings = dict(
        arm="sfe_v11",
        corpus=str(corpus),
        vocab_size=100,
        seq_len=16,
        val_windows=4,
        test_windows=8,
        layers=1,
        heads=1,
        d_model=32,
        mlp_hidden=32,
        alpha_dim=8,
        batch_size=8,
        lr=1e-2,
        warmup_steps=5,
        alpha_tokens=8,
        alpha_occurrences=16,
    )
    return BiicLMConfig(**{**settings, **overrides})


# ------------------------------------------------------------------------------------ pieces
class Pieces:
    """A stand-in tokenizer: `single` texts encode to one id, anything else to two."""

    def __init__(self, single: dict[str, int]):
        self.single = single

    def encode(self, text: str) -> list[int]:
        return [self.single[text]] if text in self.single else [998, 999]


def test_author_word_ids_follow_the_authors_rule():
    # " run" is one piece: its id; "light" only without the space: that id; "book": neither, left out
    ids = author_word_ids(Pieces({" run": 5, "run": 6, "light": 7, " key": 9}))
    assert ids == [5, 7, 9]
    assert len(AUTHOR_WORDS) == 20 and AUTHOR_MIN_OCCURRENCES == 15


def test_median_pairwise_cosine_is_the_lower_middle_of_the_pairs_i_below_j():
    g = torch.Generator().manual_seed(0)
    for n in (4, 5, 16):  # 6, 10, 120 pairs: an even count takes the lower middle value
        x = torch.randn(n, 7, generator=g)
        pairs = sorted(
            float(F.cosine_similarity(x[i], x[j], dim=0)) for i in range(n) for j in range(i + 1, n)
        )
        assert math.isclose(
            float(median_pairwise_cosine(x)), pairs[(len(pairs) - 1) // 2], abs_tol=1e-6
        )


def test_author_alpha_cos_skips_rare_words_and_averages_the_rest():
    g = torch.Generator().manual_seed(1)
    windows = torch.zeros(4, 10, dtype=torch.long)
    flat = windows.view(-1)
    flat[:15] = 3  # word 3: 15 occurrences (kept)
    flat[15:29] = 4  # word 4: 14 occurrences (skipped: fewer than the author's 15)
    flat[29:40] = 5
    occurrences = author_occurrences(windows, [3, 4, 5])
    assert set(occurrences) == {3}
    e = torch.randn(4, 10, 6, generator=g)
    assert math.isclose(
        author_alpha_cos(e, occurrences),
        float(median_pairwise_cosine(e.view(-1, 6)[:15])),
        rel_tol=1e-6,
    )
    flat[29:40] = 3  # word 3 now 26 times; word 5 gone
    both = author_occurrences(windows, [3, 4, 5], minimum=14)
    expected = (
        float(median_pairwise_cosine(e.view(-1, 6)[both[3]]))
        + float(median_pairwise_cosine(e.view(-1, 6)[15:29]))
    ) / 2
    assert math.isclose(author_alpha_cos(e, both), expected, rel_tol=1e-6)
    assert math.isnan(author_alpha_cos(e, {}))


def test_consecutive_windows_drop_the_short_tail():
    import numpy as np

    windows = consecutive_windows(np.arange(23, dtype=np.uint16), 5)
    assert windows.shape == (4, 5) and windows[1].tolist() == [5, 6, 7, 8, 9]


def test_author_diversity_loss_is_the_upper_triangle_over_n_squared():
    g = torch.Generator().manual_seed(2)
    e = torch.randn(1, 6, 4, generator=g)
    tokens = torch.tensor([[7, 7, 7, 8, 9, 9]])
    unit = F.normalize(e[0], dim=-1)
    seven = sum(float(unit[i] @ unit[j]) for i in range(3) for j in range(i + 1, 3)) / 9
    nine = float(unit[4] @ unit[5]) / 4
    # word 8 occurs once: skipped; the mean is over the words present at least twice
    assert math.isclose(
        float(author_diversity_loss(e, tokens, [7, 8, 9])), (seven + nine) / 2, rel_tol=1e-6
    )
    assert float(author_diversity_loss(e, tokens, [8, 11])) == 0.0


def test_the_authors_embeddings_are_one_point_per_word_when_g_is_zero(corpus):
    """v1.0 at initialisation: g = 0, so every occurrence of a word has the same e: cosine 1."""
    config = tiny(corpus, arm="sfe_v10")
    torch.manual_seed(0)
    model = build_model(config).eval()
    tokens = torch.tensor([[5, 6, 5, 7, 5, 8, 5, 9]] * 2)
    with torch.no_grad():
        e = model.alphas(tokens) @ model.basis
    occurrences = author_occurrences(tokens, [5], minimum=2)
    assert math.isclose(author_alpha_cos(e, occurrences), 1.0, abs_tol=1e-6)


def test_config_rejects_author_settings_on_a_non_sfe_arm():
    with pytest.raises(ValidationError):
        BiicLMConfig(arm="transformer", author_alpha=True)
    with pytest.raises(ValidationError):
        BiicLMConfig(arm="biic", aux_loss="author")


# ------------------------------------------------------------------------------------ runs
def run(config: BiicLMConfig, seed: int = 0, steps: int = 12):
    reporter = NullReporter(Budget(steps=steps, eval_every=4))
    final = STUDY.run(config, seed, reporter)
    return final, reporter.history


def test_the_author_metric_leaves_the_run_unchanged(corpus):
    """author_alpha only adds two metrics: every other metric at every evaluation is bit-identical."""
    for arm in ("sfe_v10", "sfe_v11"):
        plain, plain_history = run(tiny(corpus, arm=arm))
        author, author_history = run(tiny(corpus, arm=arm, author_alpha=True))
        assert set(author) - set(plain) == {"author_alpha_cos", "author_alpha_cos_min"}
        assert STUDY.reported_metrics(tiny(corpus, arm=arm)) == frozenset(plain)
        for (s1, m1), (s2, m2) in zip(plain_history, author_history, strict=True):
            assert s1 == s2 and m1 == {k: v for k, v in m2.items() if k in m1}
        values = [m["author_alpha_cos"] for _, m in author_history]
        assert all(-1 <= v <= 1 for v in values)
        assert author["author_alpha_cos_min"] == min(values)


def test_the_authors_auxiliary_term_has_no_gradient(corpus):
    """aux_loss author trains exactly as aux_weight 0: the same weights, the same held-out metrics;
    only the reported train_loss carries the term's value (as the author's logged loss did)."""
    base = tiny(corpus, author_alpha=True)
    without, without_history = run(base.model_copy(update={"aux_weight": 0.0}))
    author, author_history = run(base.model_copy(update={"aux_loss": "author"}))
    gradient, _ = run(base)  # the default: the term on the alphas, with a gradient
    for (_, m0), (_, m1) in zip(without_history, author_history, strict=True):
        assert {k: v for k, v in m0.items() if k != "train_loss"} == {
            k: v for k, v in m1.items() if k != "train_loss"
        }
        assert m1["train_loss"] != m0["train_loss"]  # the words occur in every batch here
        # |cos.triu(1).mean()| < 1/2: the term moves the reported loss by less than 0.01 x 1/2
        assert abs(m1["train_loss"] - m0["train_loss"]) <= 0.01 * 0.5 + 1e-6
    assert gradient["alpha_cos"] != without["alpha_cos"]  # the default's gradient does move g


def test_the_author_words_are_measured_on_the_test_half(corpus):
    """The words measured are the author's, single pieces of this tokenizer, with >= 15 occurrences."""
    import sentencepiece as spm

    from gates.models.bif_lm import load_token_data
    from gates.models.biic_lm.study import heldout_halves

    config = tiny(corpus, author_alpha=True)
    data = load_token_data(config)
    words = author_word_ids(
        spm.SentencePieceProcessor(model_file=str(data.folder / "tokenizer.model"))
    )
    assert len(words) == len(
        WORDS
    )  # the eight words of the generated text; "book" etc. are not pieces
    test = consecutive_windows(heldout_halves(data.heldout)[1], config.seq_len)
    assert set(author_occurrences(test, words)) == set(words)


# ------------------------------------------------------------------------------------ the contract
def test_v2_contract_arms_differ_only_in_the_arm_and_use_the_authors_measure():
    from gates.contract import load_contract

    path = ROOT / "contracts" / "sfe-alpha-suppression-v2.yaml"
    data = yaml.safe_load(path.read_text())
    configs = {name: BiicLMConfig(**arm) for name, arm in data["arms"].items()}
    dumps = [{k: v for k, v in c.model_dump().items() if k != "arm"} for c in configs.values()]
    assert all(d == dumps[0] for d in dumps)
    assert all(c.author_alpha and c.aux_loss == "author" for c in configs.values())
    assert data["supersedes"] == "sfe-alpha-suppression"
    read = {c["metric"] for c in data["decision"]["supported_if"] + data["decision"]["refuted_if"]}
    assert read <= {"author_alpha_cos", "author_alpha_cos_min"}
    loaded = load_contract(path)
    assert loaded.study.name == "biic_lm"
