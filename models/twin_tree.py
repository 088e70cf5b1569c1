"""Twin tree: translate by hashing a sentence into one vector and splitting it back (seed 003, section 4)

The architecture (the seed's section 4, as written there):

    Encoder (0 parameters)   H_src = root of the ordered hash of the source leaves (models.spr_hash)
    Bridge  (d x d)          H_tgt = H_src W
    Decoder (one W_split per level, shared by every node of that level), from the root down:
                             H_L = H W_split[level]
                             H_R = unroll(unsign(H - H_L))      the exact inverse of the ordered merge
                                                                 H = H_L + sign_alt(roll(H_R, 1)) given H_L
    Leaves (2^D of them) are decoded to the target token with the largest dot product leaf . E_tgt[v],
    a padding token included (empty leaves must decode to it).

So every node the decoder produces is consistent with an ordered-hash tree of the target sentence:
merging the decoded leaves bottom-up gives back H_tgt exactly. Only the left children are predicted.

Choices where the seed is silent (documented here, tested in tests/test_twin_tree.py):
- Embeddings: trainable tables on both sides, as in the seed's parameter count ("E trainable",
  encoder 0 parameters). Source leaves are E_src[token] in sentence order, zero vectors after the
  last token (the padding row is fixed at zero), exactly the spr_hash leaves. E_tgt is only read out.
- Loss: cross-entropy over the target vocabulary of the logits leaf . E_tgt^T on every leaf (pads
  included). MSE between decoded leaves and trainable target embeddings has a trivial minimum
  (every embedding 0), so it needs frozen targets; cross-entropy trains both tables and decodes by
  the same dot product it trains.
- Tokens: models.spr_hash.tokenize (lowercase words and punctuation; one token per CJK character),
  both sides. Vocabularies are built from the training pairs only: <pad>, <unk>, then the most
  frequent tokens up to vocab_size. A token outside them is <unk> (its leaf still counts).
- Initialisation: E_src, E_tgt ~ N(0, 1/d) (seeded), W = identity, W_split[level] = I / 2 (split the
  parent evenly before training).
- `merge` (the encoder's rule) is a config field so that a contract can ablate the order-aware hash
  (mean or roll_only): the decoder, bridge and parameter count are the same in every arm.

Data.
- `pairs: toy`: four sentence pairs in the seed's spirit (its first pair, 我打你 -> I hit you, is
  given there; the other three are reconstructed: the same verbs with subject and object swapped, so
  an unordered hash cannot tell two of them apart). 4 source + 5 target word types. The toy is a
  memorisation check by design: it trains and evaluates on the same four pairs.
- any other value is a gates.data pair source (`libreoffice-help:de-en`, a .tsv, moses:...). Pairs
  with min_tokens..max_tokens tokens on both sides are kept (the first of those per distinct
  tokenised source); a pair is held out when sha1(tokenised source, joined by spaces), read as a
  fraction, is below test_fraction, so the split depends on the text alone, never on the seed or
  the file order, and no source sentence is on both sides. Each side keeps its
  lowest-hash train_pairs / test_pairs pairs (a fixed pseudo-random sample). Seeds change the
  initialisation and the minibatches only.

Metrics (on the held-out pairs; for the toy on its training pairs):
- token_acc: share of non-pad target leaves decoded to their token;
- exact_match: share of sentences with every leaf (pads included) right;
- bleu: sacrebleu corpus BLEU of the decoded tokens (non-pad leaves, in order, joined by spaces)
  against the reference's tokens joined by spaces (tokenize="none": both sides are already split
  by the same tokenizer, lowercase; n-gram orders longer than every sentence are skipped, see
  corpus_bleu); a reference word outside the vocabulary can never be matched;
- train_token_acc: token_acc on the first test_pairs training pairs (how much was learned at all);
- train_loss: the step's cross-entropy (from models.common.train_loop).
"""

from __future__ import annotations

from functools import lru_cache
from typing import ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from torch import nn

from gates.models.common import count_parameters, seed_everything, text_fraction, train_loop
from gates.models.spr_hash import Merge, build_vocab, right_child, root_hash, tokenize
from gates.study import (
    DeviceConfig,
    Metric,
    Reporter,
    Study,
    StudyConfig,
    nonnegative,
    proportion,
    resolve_device,
)

PAD, UNK = "<pad>", "<unk>"  # ids 0 and 1 on both sides

# The seed's toy: its first pair is given (我打你 -> I hit you); the rest keep its vocabulary and
# swap subject and object, so pairs 1/2 and 3/4 are the same bag of source words in another order.
TOY_PAIRS = (
    ("我打你", "I hit you"),
    ("你打我", "you hit me"),
    ("我爱你", "I love you"),
    ("你爱我", "you love me"),
)


class TwinTreeConfig(DeviceConfig):
    """One arm: the data, the encoder's merge rule, the tree's size and the optimiser.

    With pairs: toy, the data fields (token limits, pair counts, test_fraction) do not apply.
    """

    pairs: str = Field(default="toy", description="'toy' or a gates.data pair source")
    merge: Merge = Field(
        default="ordered", description="the encoder's merge rule (mean / roll_only ablate order)"
    )
    depth: int = Field(default=2, ge=1, le=8, description="D: 2^D leaves on both trees")
    dim: int = Field(default=32, ge=2, le=1024)
    vocab_size: int = Field(default=4000, ge=3, description="per side, <pad> and <unk> included")
    min_tokens: int = Field(default=1, ge=1)
    max_tokens: int | None = Field(default=None, ge=1, description="default 2^depth")
    train_pairs: int = Field(default=4000, ge=1)
    test_pairs: int = Field(default=500, ge=1)
    test_fraction: float = Field(default=0.1, gt=0, lt=1)
    batch_size: int = Field(default=256, ge=1, description="pairs per step (the toy: all four)")
    lr: float = Field(default=0.01, gt=0)

    @model_validator(mode="after")
    def _sentences_fit(self) -> TwinTreeConfig:
        longest = self.longest
        if longest > 2**self.depth:
            raise ValueError(
                f"max_tokens ({longest}) does not fit 2^depth = {2**self.depth} leaves"
            )
        if self.min_tokens > longest:
            raise ValueError(f"min_tokens ({self.min_tokens}) exceeds max_tokens ({longest})")
        if self.pairs == "toy" and self.depth < 2:
            raise ValueError("the toy's sentences have 3 tokens: depth must be >= 2")
        return self

    @property
    def longest(self) -> int:
        return self.max_tokens if self.max_tokens is not None else 2**self.depth


# ------------------------------------------------------------------------------------ data
@lru_cache(maxsize=4)
def load_split(
    pairs: str,
    min_tokens: int,
    max_tokens: int,
    test_fraction: float,
    train_pairs: int,
    test_pairs: int,
) -> tuple[tuple, tuple]:
    """(train, test) as tuples of (source tokens, target tokens); see the module docstring."""
    if pairs == "toy":
        toy = tuple((tuple(tokenize(s)), tuple(tokenize(t))) for s, t in TOY_PAIRS)
        return toy, toy  # memorisation check: evaluated on what it trained on
    from gates.models.corpora import load_pairs

    kept = {}  # tokenised source -> (split key, source tokens, target tokens), first pair only
    for source, target in load_pairs(pairs):
        src, tgt = tuple(tokenize(source)), tuple(tokenize(target))
        key = " ".join(src)  # sources equal after tokenisation share a side of the split
        if (
            key not in kept
            and min_tokens <= len(src) <= max_tokens
            and min_tokens <= len(tgt) <= max_tokens
        ):
            kept[key] = (text_fraction(key), src, tgt)
    ranked = sorted(kept.values())  # by hash value: a fixed pseudo-random order
    test = tuple((s, t) for h, s, t in ranked if h < test_fraction)[:test_pairs]
    train = tuple((s, t) for h, s, t in ranked if h >= test_fraction)[:train_pairs]
    if not train or not test:
        raise ValueError(
            f"{pairs!r} gives {len(train)} training and {len(test)} held-out pairs with "
            f"{min_tokens}-{max_tokens} tokens per side; expected both non-empty"
        )
    return train, test


def leaf_ids(sentences, vocab: list[str], depth: int) -> torch.Tensor:
    """Token ids (B, 2^depth): the sentence's tokens in order, <unk> outside vocab, <pad> after."""
    index = {token: i for i, token in enumerate(vocab)}
    ids = np.zeros((len(sentences), 2**depth), dtype=np.int64)  # 0 = <pad>
    for row, tokens in enumerate(sentences):  # building data once, not a hot path
        ids[row, : len(tokens)] = [index.get(t, 1) for t in tokens]
    return torch.from_numpy(ids)


def build_data(config: TwinTreeConfig) -> dict:
    """Vocabularies (from training pairs only) and id tensors of the training and evaluation pairs."""
    train, test = load_split(
        config.pairs,
        config.min_tokens,
        config.longest,
        config.test_fraction,
        config.train_pairs,
        config.test_pairs,
    )
    src_vocab = build_vocab([s for s, _ in train], config.vocab_size, reserved=(PAD, UNK))
    tgt_vocab = build_vocab([t for _, t in train], config.vocab_size, reserved=(PAD, UNK))
    ids = lambda sentences, vocab: leaf_ids(sentences, vocab, config.depth)  # noqa: E731
    return {
        "src_vocab": src_vocab,
        "tgt_vocab": tgt_vocab,
        "train_src": ids([s for s, _ in train], src_vocab),
        "train_tgt": ids([t for _, t in train], tgt_vocab),
        "test_src": ids([s for s, _ in test], src_vocab),
        "test_tgt": ids([t for _, t in test], tgt_vocab),
        "test_references": [" ".join(t) for _, t in test],
    }


# ------------------------------------------------------------------------------------ model
class TwinTree(nn.Module):
    """Hash the source (0 parameters), bridge it (d x d), split it level by level (D matrices d x d)."""

    def __init__(self, config: TwinTreeConfig, src_vocab_size: int, tgt_vocab_size: int):
        super().__init__()
        d = config.dim
        self.merge, self.depth = config.merge, config.depth
        self.source_embedding = nn.Embedding(src_vocab_size, d, padding_idx=0)  # <pad> row stays 0
        nn.init.normal_(self.source_embedding.weight, std=d**-0.5)
        with torch.no_grad():
            self.source_embedding.weight[0].zero_()
        self.target_embedding = nn.Parameter(torch.randn(tgt_vocab_size, d) * d**-0.5)
        self.bridge = nn.Parameter(torch.eye(d))
        self.split = nn.Parameter(torch.eye(d).repeat(config.depth, 1, 1) / 2)

    def encode(self, src_ids: torch.Tensor) -> torch.Tensor:
        """(B, 2^D) source ids -> (B, d) root hash."""
        return root_hash(self.source_embedding(src_ids), self.merge)

    def decode(self, root: torch.Tensor) -> torch.Tensor:
        """(B, d) root -> (B, 2^D, d) leaves; level l splits every node with W_split[l]."""
        h = root[:, None, :]
        for level in range(self.depth):  # over levels; all nodes of a level at once
            left = h @ self.split[level]
            right = right_child(h, left)  # unroll(unsign(H - H_L))
            h = torch.stack([left, right], dim=2).flatten(1, 2)  # children in leaf order
        return h

    def forward(self, src_ids: torch.Tensor) -> torch.Tensor:
        """(B, 2^D) source ids -> (B, 2^D, V_tgt) logits leaf . E_tgt^T."""
        leaves = self.decode(self.encode(src_ids) @ self.bridge)
        return leaves @ self.target_embedding.T


def decoded_metrics(logits: torch.Tensor, target: torch.Tensor) -> dict[str, float]:
    """token_acc over non-pad target leaves, exact_match over whole sentences (pads included)."""
    right = logits.argmax(-1) == target
    return {
        "token_acc": right[target != 0].float().mean().item(),
        "exact_match": right.all(dim=1).float().mean().item(),
    }


def corpus_bleu(predicted: torch.Tensor, tgt_vocab: list[str], references: list[str]) -> float:
    """sacrebleu corpus BLEU of the non-pad decoded tokens against the references' tokens.

    effective_order: n-gram orders the whole corpus has no n-grams of are skipped (without it the
    toy's 3-token sentences score 0 even when decoded perfectly); any corpus with a 4-token
    sentence gets standard 4-gram BLEU.
    """
    from sacrebleu.metrics import BLEU

    hypotheses = [" ".join(tgt_vocab[i] for i in row if i != 0) for row in predicted.tolist()]
    return (
        BLEU(tokenize="none", effective_order=True, force=True)
        .corpus_score(hypotheses, [references])
        .score
    )


# ------------------------------------------------------------------------------------ study
class TwinTreeStudy(Study):
    """Ordered-hash encoder, linear bridge, per-level split decoder; toy memorisation or real pairs."""

    name: ClassVar[str] = "twin_tree"
    Config: ClassVar[type[StudyConfig]] = TwinTreeConfig
    # token_acc, exact_match, bleu: on the held-out pairs (the toy, a memorisation check by design,
    # has no held-out pairs and measures them on its training pairs: see the module docstring)
    metrics: ClassVar[dict[str, Metric]] = {
        "token_acc": proportion("higher", "test"),
        "exact_match": proportion("higher", "test"),
        "bleu": Metric("higher", "test", 0.0, 100.0),
        "train_token_acc": proportion("higher", "train"),
        "train_loss": nonnegative("lower", "train"),
    }
    deterministic: ClassVar[bool] = False  # initialisation and minibatches depend on the seed
    hyperparameters: ClassVar[frozenset[str]] = frozenset({"lr"})
    # the data: which pairs, the sentence lengths and split, the vocabularies, the tree both sides fill
    regime_fields: ClassVar[tuple[str, ...]] = (
        "pairs",
        "depth",
        "vocab_size",
        "min_tokens",
        "max_tokens",
        "train_pairs",
        "test_pairs",
        "test_fraction",
    )

    def vocab_sizes(self, config: TwinTreeConfig) -> tuple[int, int]:
        """(source, target) vocabulary sizes the arm builds from its data; when the data is not there
        yet, the bound vocab_size for both (check_ready then says what to fetch)."""
        if self.check_ready(config) is not None:
            return config.vocab_size, config.vocab_size
        data = build_data(config)
        return len(data["src_vocab"]), len(data["tgt_vocab"])

    def param_count(self, config: TwinTreeConfig) -> int:
        return count_parameters(TwinTree(config, *self.vocab_sizes(config)))

    def chance(self, metric: str, config: TwinTreeConfig) -> float | None:
        """token_acc (and train_token_acc): a decoder that ignores the source and always emits the training
        targets' most frequent token (<unk> included) scores that token's share of the evaluated non-pad target
        leaves: the majority class. None while the data is not there (check_ready says what to fetch)."""
        if metric not in ("token_acc", "train_token_acc") or self.check_ready(config) is not None:
            return None
        data = build_data(config)
        train = data["train_tgt"][data["train_tgt"] != 0]
        majority = int(torch.bincount(train).argmax())
        target = (
            data["test_tgt"]
            if metric == "token_acc"
            else data["train_tgt"][: len(data["test_tgt"])]
        )
        target = target[target != 0]
        return float((target == majority).double().mean())

    def flops(self, config: TwinTreeConfig) -> int:
        """Per sentence, 2 x multiply-adds: the bridge (d^2), the splits (2^D - 1 nodes x d^2) and the
        read-out (2^D leaves x d x V_tgt); the hash's adds are negligible."""
        d, leaves = config.dim, 2**config.depth
        return 2 * (d * d + (leaves - 1) * d * d + leaves * d * self.vocab_sizes(config)[1])

    def check_ready(self, config: TwinTreeConfig) -> str | None:
        if config.pairs == "toy":
            return None
        from gates.models.corpora import check_source

        return check_source(config.pairs, kind="pairs")

    def run(self, config: TwinTreeConfig, seed: int, reporter: Reporter) -> dict[str, float]:
        seed_everything(seed)
        device = torch.device(resolve_device(config.device))
        data = build_data(config)
        # initialised on the CPU (the same weights on every device), then moved with the data
        model = TwinTree(config, len(data["src_vocab"]), len(data["tgt_vocab"])).to(device)
        optimizer = torch.optim.Adam(model.parameters(), lr=config.lr)
        data = {
            key: value.to(device) if isinstance(value, torch.Tensor) else value
            for key, value in data.items()
        }
        train_src, train_tgt = data["train_src"], data["train_tgt"]
        batches = torch.Generator().manual_seed(seed)  # minibatch rows drawn on the CPU, then moved

        def loss_fn() -> torch.Tensor:
            if config.batch_size >= len(train_src):
                src, tgt = train_src, train_tgt
            else:
                rows = torch.randint(len(train_src), (config.batch_size,), generator=batches).to(
                    device
                )
                src, tgt = train_src[rows], train_tgt[rows]
            logits = model(src)
            return F.cross_entropy(logits.flatten(0, 1), tgt.flatten())

        def evaluate() -> dict[str, float]:
            logits = model(data["test_src"])
            train_logits = model(
                train_src[: len(data["test_src"])]
            )  # as many training pairs as held out
            return {
                **decoded_metrics(logits, data["test_tgt"]),
                "bleu": corpus_bleu(logits.argmax(-1), data["tgt_vocab"], data["test_references"]),
                "train_token_acc": decoded_metrics(train_logits, train_tgt[: len(train_logits)])[
                    "token_acc"
                ],
            }

        return train_loop(model, optimizer, loss_fn, reporter.budget, reporter, evaluate)
