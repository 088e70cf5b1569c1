"""SPR ordered hash: does an order-aware merge keep real sentences apart? (seed 003, studies.md section 4)

The question. An SPR tree hashes a sentence bottom-up: N = 2^D leaves (the token embeddings in
sentence order, zero vectors after the last token) are merged pairwise, level by level, into one
root vector. The mean merge forgets word order ("cat eats fish" == "fish eats cat"). The seed's fix
rolls the right child one dimension and flips every other sign before adding it:

    ordered:    parent = left + sign_alt(roll(right, 1))     sign_alt(x) = x * [1, -1, 1, -1, ...]
    roll_only:  parent = left + roll(right, 1)               (the seed's flawed first version)
    mean:       parent = (left + right) / 2                  (the unordered baseline)

The seed's worked example (d = 4, two leaves): roll_only hashes (我, 你) and (你, 我) both to
[9, 7, 9, 11]; ordered gives [9, -3, 9, -3] vs [9, 5, 9, 5].

What the rule does not separate (measured in tests, worth knowing when reading results). The same
T = sign_alt o roll is applied at every level, so unrolling the recursion gives

    root = sum_i T^popcount(i) x_i            (i = leaf index, popcount = number of 1 bits)

Leaves whose indices have equal popcount (1 and 2, 3 and 5 and 6, ...) get the same transform, so
swapping their tokens leaves the root unchanged: of the 24 orders of 4 distinct words on 4 leaves
the ordered hash separates 12 (pairs differing only by the swap of leaves 1 and 2 collide); the
mean separates 1. roll_only has the same popcount symmetry and, as the worked example shows, more.

Distinctness on real text (the seed's experiment 1). Co-occurrence embeddings of the corpus:
- tokens: lowercase; every CJK ideograph is one token, every other run of letters/digits is one
  word, every punctuation mark one token (`tokenize`); so de/en are split into words and zh into
  characters by one rule;
- vocabulary: the `vocab_size` most frequent tokens (ties by the token's text), the rest are OOV;
- counts: symmetric window co-occurrence (every pair at distance 1..window within one line, weight
  1), PPMI (positive pointwise mutual information, no smoothing);
- embeddings: truncated SVD of the PPMI matrix to `dim` dimensions, U sqrt(S), via ARPACK with a
  fixed start vector and each column's sign fixed (largest |entry| positive): deterministic;
- an OOV token's leaf is the zero vector (it keeps its position but adds nothing).
S = `sentences` distinct lines with min_words..max_words tokens (and at least one in-vocabulary
token) are drawn by the seed from the corpus; each is hashed (in float64) under the arm's merge
rule. Every arm of one seed hashes the same lines, so arms compare with paired tests.

Metrics (no training: reported once, at step = budget.steps):
- mean_pairwise_cos: mean cosine similarity over all S(S-1)/2 pairs of root hashes (lower = the
  hash keeps sentences further apart; the seed reports 0.48 ordered vs 0.96 mean for S = 20);
- max_pairwise_cos: the closest pair (1.0 under every rule when two lines differ only in OOV
  tokens, as API reference lines of the LibreOffice help often do);
- shuffled_cos: mean cosine between a sentence's root and the root of its own tokens in a random
  (seeded) order: 1.0 for the mean merge by construction; how much the hash sees word order.
"""

from __future__ import annotations

import re
from collections import Counter
from functools import lru_cache
from typing import ClassVar, Literal

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field, model_validator

from gates.study import DeviceConfig, Metric, Reporter, Study, StudyConfig, resolve_device

Merge = Literal["ordered", "roll_only", "mean"]


class SprHashConfig(DeviceConfig):
    """One arm: a merge rule and the number of real sentences hashed, plus the embedding recipe."""

    merge: Merge = "ordered"
    sentences: int = Field(default=50, ge=2, description="S, real sentences drawn by the seed")
    corpus: str = Field(default="libreoffice-help:en", description="a gates.data text source")
    depth: int = Field(default=6, ge=1, le=12, description="D: the tree has 2^D leaves")
    dim: int = Field(default=32, ge=2, le=512, description="embedding width d")
    vocab_size: int = Field(default=5000, ge=10, description="top-V tokens that get an embedding")
    window: int = Field(
        default=2, ge=1, le=20, description="co-occurrence window (tokens each side)"
    )
    min_words: int = Field(default=5, ge=1)
    max_words: int = Field(default=40, ge=1)

    @model_validator(mode="after")
    def _sentences_fit(self) -> SprHashConfig:
        if self.min_words > self.max_words:
            raise ValueError(
                f"min_words ({self.min_words}) must not exceed max_words ({self.max_words})"
            )
        if self.max_words > 2**self.depth:
            raise ValueError(
                f"max_words ({self.max_words}) does not fit 2^depth = {2**self.depth} leaves; "
                f"expected depth >= {int(np.ceil(np.log2(self.max_words)))}"
            )
        if self.dim >= self.vocab_size:
            raise ValueError(
                f"dim ({self.dim}) must be below vocab_size ({self.vocab_size}) for the SVD"
            )
        return self


# ------------------------------------------------------------------------------------ the merge rules
def sign_alt(x: torch.Tensor) -> torch.Tensor:
    """x * [1, -1, 1, -1, ...] along the last dimension (its own inverse)."""
    signs = torch.ones(x.shape[-1], dtype=x.dtype, device=x.device)
    signs[1::2] = -1
    return x * signs


def merge(left: torch.Tensor, right: torch.Tensor, rule: Merge) -> torch.Tensor:
    """One parent from its two children (any leading shape, vectors on the last dimension)."""
    if rule == "ordered":
        return left + sign_alt(torch.roll(right, 1, dims=-1))
    if rule == "roll_only":
        return left + torch.roll(right, 1, dims=-1)
    if rule == "mean":
        return (left + right) / 2
    raise ValueError(f"unknown merge rule {rule!r}")


def right_child(parent: torch.Tensor, left: torch.Tensor) -> torch.Tensor:
    """Inverse of the ordered merge given the left child: unroll(unsign(parent - left))."""
    return torch.roll(sign_alt(parent - left), -1, dims=-1)


def root_hash(leaves: torch.Tensor, rule: Merge) -> torch.Tensor:
    """(..., 2^D, d) leaves in sentence order -> (..., d) root, merging level by level."""
    if leaves.shape[-2] & (leaves.shape[-2] - 1):
        raise ValueError(f"the number of leaves must be a power of 2, got {leaves.shape[-2]}")
    h = leaves
    while h.shape[-2] > 1:  # D levels; each merges all sibling pairs of the level at once
        h = merge(h[..., 0::2, :], h[..., 1::2, :], rule)
    return h[..., 0, :]


def leaf_vectors(vectors: torch.Tensor, depth: int) -> torch.Tensor:
    """Pad (..., n, d) token vectors with zero vectors to (..., 2^depth, d)."""
    missing = 2**depth - vectors.shape[-2]
    if missing < 0:
        raise ValueError(f"{vectors.shape[-2]} tokens do not fit 2^{depth} leaves")
    return F.pad(vectors, (0, 0, 0, missing))


def mean_pairwise_cos(roots: torch.Tensor) -> tuple[float, float]:
    """(mean, max) cosine similarity over all pairs of rows of roots (S, d)."""
    unit = F.normalize(roots, dim=-1)
    cos = unit @ unit.T
    upper = torch.triu_indices(len(roots), len(roots), offset=1, device=roots.device)
    pairs = cos[upper[0], upper[1]]
    return pairs.mean().item(), pairs.max().item()


# ------------------------------------------------------------------------------------ tokens and embeddings
CJK = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
TOKEN = re.compile(rf"[{CJK}]|[^\W{CJK}]+|[^\w\s]")


def tokenize(text: str) -> list[str]:
    """Lowercase; one token per CJK ideograph, per run of other letters/digits, per punctuation mark."""
    return TOKEN.findall(text.lower())


def build_vocab(
    token_lists: list[list[str]], size: int, reserved: tuple[str, ...] = ()
) -> list[str]:
    """`reserved` tokens first, then the most frequent tokens (ties by text) up to `size` in all."""
    counts = Counter(token for tokens in token_lists for token in tokens)
    for token in reserved:
        counts.pop(token, None)
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return list(reserved) + [token for token, _ in ranked[: max(size - len(reserved), 0)]]


def cooccurrence_embeddings(
    token_lists: list[list[str]], vocab: list[str], window: int, dim: int
) -> np.ndarray:
    """PPMI of symmetric window co-occurrence counts, truncated SVD -> (len(vocab), dim) float32."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.linalg import svds

    index = {token: i for i, token in enumerate(vocab)}
    gap = [-1] * window  # -1 (OOV and line gaps) is never counted, so no window spans two lines
    stream = np.array(
        [index.get(t, -1) for tokens in token_lists for t in tokens + gap], dtype=np.int64
    )
    rows, cols = [], []
    for offset in range(1, window + 1):  # over distances, vectorised over the whole corpus
        a, b = stream[:-offset], stream[offset:]
        keep = (a >= 0) & (b >= 0)
        rows += [a[keep], b[keep]]  # both directions: the counts are symmetric
        cols += [b[keep], a[keep]]
    rows, cols = np.concatenate(rows), np.concatenate(cols)
    size = len(vocab)
    counts = coo_matrix(
        (np.ones(len(rows)), (rows, cols)), shape=(size, size)
    ).tocsr()  # sums duplicates
    counts.sum_duplicates()

    # PPMI_ij = max(0, log(C_ij * total / (C_i. * C_.j))), on the nonzero entries only
    total = counts.sum()
    marginal = np.asarray(counts.sum(axis=1)).ravel()
    coo = counts.tocoo()
    pmi = np.log(coo.data * total / (marginal[coo.row] * marginal[coo.col]))
    positive = pmi > 0
    ppmi = coo_matrix(
        (pmi[positive], (coo.row[positive], coo.col[positive])), shape=(size, size)
    ).tocsr()

    # ARPACK is deterministic given its start vector; singular vectors' signs are fixed afterwards
    u, s, _ = svds(ppmi, k=dim, v0=np.full(size, 1.0 / np.sqrt(size)), solver="arpack")
    order = np.argsort(-s)
    u, s = u[:, order], s[order]
    u *= np.sign(u[np.abs(u).argmax(axis=0), np.arange(dim)])
    return (u * np.sqrt(s)).astype(np.float32)


@lru_cache(maxsize=4)
def corpus_embeddings(
    corpus: str, vocab_size: int, window: int, dim: int
) -> tuple[tuple[str, ...], np.ndarray, tuple]:
    """(vocab, embeddings, token lists of the corpus' distinct lines); cached: every arm shares them."""
    from gates.models.corpora import load_text

    texts = list(dict.fromkeys(load_text(corpus)))  # distinct lines, corpus order
    token_lists = [tokenize(text) for text in texts]
    vocab = build_vocab(token_lists, vocab_size)
    return (
        tuple(vocab),
        cooccurrence_embeddings(token_lists, vocab, window, dim),
        tuple(map(tuple, token_lists)),
    )


def sentence_ids(
    token_lists, vocab: tuple[str, ...], config: SprHashConfig, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Draw S lines by the seed; return their token ids (S, 2^D) (pad/OOV = len(vocab)) and a shuffle.

    The shuffle (S, 2^D) gives, per sentence, its tokens in a random order (pads stay at the end).
    """
    index = {token: i for i, token in enumerate(vocab)}
    oov = len(vocab)
    eligible = [
        i
        for i, tokens in enumerate(token_lists)
        if config.min_words <= len(tokens) <= config.max_words and any(t in index for t in tokens)
    ]
    if len(eligible) < config.sentences:
        raise ValueError(
            f"only {len(eligible)} lines of {config.corpus!r} have {config.min_words}-"
            f"{config.max_words} tokens; the arm asks for {config.sentences}"
        )
    rng = np.random.default_rng(seed)
    chosen = rng.choice(np.asarray(eligible), size=config.sentences, replace=False)
    ids = np.full((config.sentences, 2**config.depth), oov, dtype=np.int64)
    shuffled = ids.copy()
    for row, line in enumerate(chosen):  # S <= a few hundred lines: building ids, not a hot path
        tokens = np.array([index.get(t, oov) for t in token_lists[line]], dtype=np.int64)
        ids[row, : len(tokens)] = tokens
        shuffled[row, : len(tokens)] = tokens[rng.permutation(len(tokens))]
    return ids, shuffled


# ------------------------------------------------------------------------------------ study
class SprHashStudy(Study):
    """Ordered vs roll-only vs mean merge: how far apart are real sentences' root hashes?"""

    name: ClassVar[str] = "spr_hash"
    Config: ClassVar[type[StudyConfig]] = SprHashConfig
    # test: the hash has no trained parameters and nothing is selected on these sentences; the SVD
    # embeddings are fitted (without labels, the same for every arm) on the corpus they are drawn from
    metrics: ClassVar[dict[str, Metric]] = {
        "mean_pairwise_cos": Metric("lower", "test", -1.0, 1.0),
        "max_pairwise_cos": Metric("lower", "test", -1.0, 1.0),
        "shuffled_cos": Metric("lower", "test", -1.0, 1.0),
    }
    deterministic: ClassVar[bool] = False  # the sentences are drawn by the seed
    trains: ClassVar[bool] = (
        False  # the hash has no parameters; the embeddings are an SVD fit, no training steps
    )
    # the embeddings every arm hashes: corpus, vocabulary, co-occurrence window, width
    regime_fields: ClassVar[tuple[str, ...]] = ("corpus", "vocab_size", "window", "dim")

    def param_count(self, config: SprHashConfig) -> int:
        return 0  # the hash has no parameters; the embeddings are fitted by SVD, not trained

    def flops(self, config: SprHashConfig) -> int:
        """Per sentence: 2^D - 1 merges of d-vectors; an add plus a sign/scale per element (roll: 0)."""
        per_element = 1 if config.merge == "roll_only" else 2
        return (2**config.depth - 1) * config.dim * per_element

    def check_ready(self, config: SprHashConfig) -> str | None:
        from gates.models.corpora import check_source

        return check_source(config.corpus, kind="text")

    def run(self, config: SprHashConfig, seed: int, reporter: Reporter) -> dict[str, float]:
        vocab, embeddings, token_lists = corpus_embeddings(
            config.corpus, config.vocab_size, config.window, config.dim
        )
        ids, shuffled = sentence_ids(token_lists, vocab, config, seed)
        device = torch.device(
            resolve_device(config.device)
        )  # the SVD and the draws stay on the CPU
        table = (
            torch.from_numpy(np.vstack([embeddings, np.zeros((1, config.dim), np.float32)]))
            .double()
            .to(device)
        )
        roots = root_hash(table[torch.from_numpy(ids).to(device)], config.merge)  # (S, d)
        shuffled_roots = root_hash(table[torch.from_numpy(shuffled).to(device)], config.merge)
        mean_cos, max_cos = mean_pairwise_cos(roots)
        metrics = {
            "mean_pairwise_cos": mean_cos,
            "max_pairwise_cos": max_cos,
            "shuffled_cos": F.cosine_similarity(roots, shuffled_roots, dim=-1).mean().item(),
        }
        reporter.report(reporter.budget.steps, dict(metrics))  # nothing is trained: one report
        return metrics
