"""BIF: factorised token embeddings and the FAM layer in a small causal LM (seed 004, studies.md section 5)

The question. The seed's author replaced a transformer's first attention by FAM, a token mixer that
scores token pairs in a 64-dimensional "recipe" space of static per-token coefficients alpha, and
saw perplexity drop by 3.9 with fewer parameters (18.7M vs 19.4M). The parameter gap leaves the
source of the gain open. BIF phase 1 asks for a clean answer with three arms at matched parameters:
a standard baseline, BIF (factorised embedding + FAM first layer), and an ablation that keeps the
factorised embedding but replaces FAM by a compressed standard attention of FAM's size.

Data. `gates.data.load_text(corpus)` gives the corpus as lines (the English LibreOffice help by
default, or any .txt file, one text per line). A line belongs to the held-out slice when the first
8 bytes of sha1(line), read as a fraction of 2^64, are >= `train_fraction`; else to the training
slice. The split is a function of a line's text alone: reordering the corpus moves no line across
it, and equal lines always land together. Each slice keeps its lines in corpus order.

Tokenizer. SentencePiece unigram with exactly `vocab_size` pieces, trained on the training slice
only, deterministically (one thread, every line in corpus order, no sampling or shuffling). A slice
becomes one token stream: each line's pieces followed by EOS. The tokenizer and both streams are
cached in <TREEHEAP_GATES_CACHE or ~/.cache/treeheap-gates>/tokenizers/<key>/, key = sha256 of
(source_fingerprint(corpus), the tokenizer settings, TOKENIZER_VERSION). The folder is built under
a temporary name and renamed into place; tokenizer.json (with every file's sha256) is written last
and checked on every load, so a half-written or edited cache is rebuilt, never used.

Validation. A fixed held-out set: `val_windows` windows of seq_len + 1 tokens at evenly spaced
offsets of the held-out stream (first and last included). It depends on the data and the config,
never on the seed: every arm and seed is scored on the same tokens at every evaluation.
val_loss = mean next-token cross-entropy over those windows (nats per token), val_ppl = exp(val_loss).

Test (optional, `test_windows` > 0; 0, the default, keeps the above exactly). The held-out stream is
cut into two halves in corpus order: the first gives the `val_windows` validation windows (val_*, what
a convergence rule or tuning reads), the second `test_windows` test windows of seq_len + 1 tokens,
chosen the same way (test_loss, test_ppl = exp(test_loss); what a decision reads). The halves share no
token, so nothing that looks at validation sees the test windows. (biic_lm's split, the same rule.)

Arms (d = d_model, V = vocab_size, k = alpha_dim, L = layers, T = seq_len; positions are learned,
P in R^{T x d}, for every arm):

    baseline      h_0 = E[x_t] + P[t]                        E in R^{V x d}
                  L standard blocks
                  logits = LN(h_L) E^T                       (tied)

    bif           alpha_t = A[x_t] in R^k,  h_0 = alpha_t B + P[t]      A in R^{V x k}, B in R^{k x d}
                  block 1 (FAM in place of attention):
                      S_ij = alpha_i W' alpha_j^T  (j <= i; -inf for j > i)     W' in R^{k x k}
                                                             (stored as W = sigma^2 W', below)
                      h = h_0 + softmax_j(S_i) h_0           X = the layer input h_0 itself: no
                                                             norm, no value or output projection
                      h = h + MLP(LN(h))
                  L - 1 standard blocks
                  logits = LN(h_L) B^T A^T                   (tied through the factorised embedding)

    bif_ablation  as bif, but block 1's scores come from a compressed standard attention:
                      q = LN(h_0) W_q,  key = LN(h_0) W_k  (width r = round(k^2 / (2 d)); W_q, W_k in R^{d x r})
                      S_ij = q_i . key_j / sqrt(r),  h = h_0 + softmax_j(S_i) h_0,  then the MLP
                  so its mixer has 2 d r (+ the LN's 2d) parameters, about FAM's k^2 (exactly k^2
                  when 2d divides k^2), and mixes the same X with the same residual: FAM and the
                  ablation differ only in what scores a pair (static alphas vs the layer input).

    standard block (pre-norm):  h = h + W_O MultiHead(LN(h));  h = h + W_2 GELU(W_1 LN(h))
                  heads of width d / heads, scores q.k / sqrt(d / heads), causal; W_1 in R^{d x m}
                  with m = mlp_hidden. Linear layers have no bias; LayerNorms have gain and bias.

Block 1 of the bif arms replaces the attention only and keeps its MLP (the seed: "把第一层 attention
换成 FAM", the first layer's attention replaced by FAM).

Matching parameters. The factorised embedding uses V k + k d parameters where the baseline's uses
V d: at V = 8000, d = 128, k = 64 it saves about half a million. The bif arms spend them on a wider
MLP (`mlp_hidden`, every block), chosen once in the contract with `mlp_hidden_to_match` so that all
three arms agree within 2% (`capacity_match`). Every re-invested parameter is one multiply-add per
token, so forward FLOPs stay close too (the tied factorised head costs d k + k V, not d V).

Initialisation (nanoGPT-like) and scale. Linear weights N(0, 0.02^2), the projections that write
into the residual stream (W_O, W_2) N(0, (0.02 / sqrt(2 L))^2), E and P N(0, 0.02^2). The recipe
table A is an embedding like E: N(0, sigma^2), sigma = ALPHA_STD = 0.02, so AdamW (whose steps are
about lr per coordinate whatever the scale) moves each token's recipe, and its tied output logits,
about as fast as the baseline's rows of E; B is a k -> d linear map, N(0, 1/k), so alpha B starts at
E's scale. FAM then reads the recipes in units of that scale:
    S_ij = (alpha_i / sigma) W (alpha_j / sigma)^T  =  alpha_i W' alpha_j^T  with W' = W / sigma^2,
the seed's bilinear form exactly, with W ~ N(0, 1/k^2) so that S starts as O(1) scores and W learns
at AdamW's usual relative rate. (Read raw, |alpha|^2 is about k sigma^2 = 0.026: S would be near 0
and W would need entries near 40, out of reach of AdamW at lr 3e-3 within a CPU budget. A pilot
with A ~ N(0, 1) instead, which makes S O(1) directly, moved each recipe 50x slower relative to its
scale than the baseline's rows of E (lr / 1 against lr / 0.02): bif's val_ppl was 2315 against the
baseline's 545 after 60 steps, a gap that says nothing about FAM.)

Training: random contiguous windows of the training stream drawn by a generator seeded with the
run's seed; next-token cross-entropy; AdamW with linear warmup and cosine decay to `min_lr_ratio`
of `lr` at the contract's last step; gradient clipping at 1; no dropout. The mixers (attention, FAM
and the ablation's) compute softmax(S + causal) X in one fused call (`causal_mix`).

Device: `device` (auto | cpu | cuda; auto = cuda when torch sees a GPU). The model is initialised on
the CPU and moved, the token streams and validation windows live on the device, and window starts
are drawn on the CPU by the seed's generator: a seed trains on the same windows everywhere.

Metrics: train_loss (the step's minibatch), val_loss, val_ppl; with test_windows > 0 also test_loss,
test_ppl (on the test windows, evaluated with validation).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Literal

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from torch import nn

from gates.models.common import count_parameters, seed_everything, split_lines, train_loop
from gates.models.corpora import cache_root
from gates.models.tokenizer import encode_stream, train_sentencepiece
from gates.study import (
    DeviceConfig,
    Metric,
    Reporter,
    Study,
    StudyConfig,
    positive,
    resolve_device,
)

Arm = Literal["baseline", "bif", "bif_ablation"]

# Bump when a change here changes what a cached tokenizer folder holds (split, settings, streams).
TOKENIZER_VERSION = 1
EVAL_CHUNK = 32  # validation windows per forward pass (fixed, so val_loss never depends on it)
ALPHA_STD = 0.02  # initial scale of the recipe table A, the same as the baseline's embedding E


class BifLMConfig(DeviceConfig):
    """One arm: which token side the LM has, its sizes, the data and the training."""

    arm: Arm = "baseline"
    # data and tokenizer
    corpus: str = "libreoffice-help:en"  # a gates.data source, or a path to a .txt file
    vocab_size: int = Field(default=8000, ge=50, le=65535)  # streams are stored as uint16
    train_fraction: float = Field(default=0.9, gt=0, lt=1)  # the rest of the lines is held out
    seq_len: int = Field(default=128, ge=8)
    val_windows: int = Field(default=64, ge=1)  # the fixed held-out set, seq_len tokens each
    # > 0: validation windows from the held-out stream's first half, these test windows from its second
    # half (test_loss, test_ppl); 0: no test metrics, validation over the whole held-out stream
    test_windows: int = Field(default=0, ge=0)
    # model
    d_model: int = Field(default=128, ge=8)
    layers: int = Field(default=4, ge=1)
    heads: int = Field(default=4, ge=1)
    mlp_hidden: int = Field(default=512, ge=1)
    alpha_dim: int = Field(default=64, ge=2)  # k, the recipe width (bif arms only)
    # training
    batch_size: int = Field(default=12, ge=1)
    lr: float = Field(default=3e-3, gt=0)
    warmup_steps: int = Field(default=20, ge=0)
    min_lr_ratio: float = Field(default=0.1, ge=0, le=1)
    weight_decay: float = Field(default=0.0, ge=0)

    @model_validator(mode="after")
    def _consistent_sizes(self) -> BifLMConfig:
        if self.d_model % self.heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by heads ({self.heads})")
        if self.arm != "baseline" and self.alpha_dim >= self.d_model:
            raise ValueError(
                f"alpha_dim ({self.alpha_dim}) must be below d_model ({self.d_model}): "
                f"e = alpha B factorises the embedding through a narrower recipe space"
            )
        return self

    @property
    def ablation_width(self) -> int:
        """q/k width r of the ablation's compressed attention: 2 d r is about FAM's k^2."""
        return max(1, round(self.alpha_dim**2 / (2 * self.d_model)))


# ------------------------------------------------------------------------------------ data


def train_tokenizer(lines: list[str], vocab_size: int) -> bytes:
    """The LM's tokenizer: exactly vocab_size unigram pieces, UNK 0 and EOS 1, no BOS or PAD."""
    return train_sentencepiece(lines, vocab_size, unk_id=0, eos_id=1)


def tokenizer_settings(config: BifLMConfig) -> dict:
    """Everything that decides what a tokenizer folder holds, besides the data itself."""
    return {
        "model_type": "unigram",
        "vocab_size": config.vocab_size,
        "train_fraction": config.train_fraction,
        "split": "sha1(line)[:8] / 2^64 < train_fraction",
        "eos": "after every line",
        "version": TOKENIZER_VERSION,
    }


def tokenizer_key(config: BifLMConfig) -> str:
    from gates.models.corpora import source_fingerprint

    identity = {"source": source_fingerprint(config.corpus), "settings": tokenizer_settings(config)}
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class TokenData:
    folder: Path
    train: np.ndarray  # uint16 token stream of the training slice
    heldout: np.ndarray  # uint16 token stream of the held-out slice
    meta: dict


STREAM_FILES = {"train": "train_tokens.npy", "heldout": "heldout_tokens.npy"}
META = "tokenizer.json"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _read_cached(folder: Path) -> TokenData | None:
    """The cached folder's data if complete and unedited (every file matches tokenizer.json), else None."""
    try:
        meta = json.loads((folder / META).read_text())
        for filename, digest in meta["files"].items():
            if _sha256(folder / filename) != digest:
                return None
        streams = {side: np.load(folder / filename) for side, filename in STREAM_FILES.items()}
    except (OSError, ValueError, KeyError):
        return None
    return TokenData(folder, streams["train"], streams["heldout"], meta)


def load_token_data(config: BifLMConfig, log=lambda _msg: None) -> TokenData:
    """The tokenizer and token streams for config's corpus and tokenizer settings (built once, cached)."""
    from gates.models.corpora import load_text, source_fingerprint

    key = tokenizer_key(config)
    folder = cache_root() / "tokenizers" / key
    cached = _read_cached(folder)
    if cached is not None:
        return cached

    import sentencepiece as spm

    log(f"training a {config.vocab_size}-piece tokenizer on {config.corpus} into {folder}")
    train_lines, heldout_lines = split_lines(load_text(config.corpus), config.train_fraction)
    if not train_lines or not heldout_lines:
        raise ValueError(
            f"{config.corpus}: the split left {len(train_lines)} training and "
            f"{len(heldout_lines)} held-out lines; expected both non-empty"
        )
    model_bytes = train_tokenizer(train_lines, config.vocab_size)
    tokenizer = spm.SentencePieceProcessor(model_proto=model_bytes)
    streams = {
        side: encode_stream(tokenizer, lines).astype(np.uint16)  # vocab_size <= 65,536
        for side, lines in (("train", train_lines), ("heldout", heldout_lines))
    }

    # Build under a private name, tokenizer.json last, then one rename: readers see all or nothing.
    folder.parent.mkdir(parents=True, exist_ok=True)
    building = folder.parent / f".{key}.{uuid.uuid4().hex}.tmp"
    building.mkdir()
    try:
        (building / "tokenizer.model").write_bytes(model_bytes)
        for side, filename in STREAM_FILES.items():
            np.save(building / filename, streams[side])
        files = ["tokenizer.model", *STREAM_FILES.values()]
        meta = {
            "key": key,
            "source": config.corpus,
            "source_fingerprint": source_fingerprint(config.corpus),
            "settings": tokenizer_settings(config),
            "pieces": tokenizer.get_piece_size(),
            "lines": {"train": len(train_lines), "heldout": len(heldout_lines)},
            "tokens": {side: int(len(s)) for side, s in streams.items()},
            "files": {name: _sha256(building / name) for name in files},
        }
        (building / META).write_text(json.dumps(meta, indent=2) + "\n")
        if folder.exists() and _read_cached(folder) is None:  # an unusable leftover: move it aside
            stale = folder.parent / f".{key}.{uuid.uuid4().hex}.stale"
            os.rename(folder, stale)
            shutil.rmtree(stale, ignore_errors=True)
        try:
            os.rename(building, folder)
        except OSError:  # another process finished the same key first: use theirs (the same bytes)
            shutil.rmtree(building, ignore_errors=True)
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
    cached = _read_cached(folder)
    if cached is None:
        raise RuntimeError(f"tokenizer cache {folder} is unreadable right after it was written")
    return cached


def validation_set(
    heldout: np.ndarray, seq_len: int, count: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The fixed held-out windows: `count` windows of seq_len + 1 tokens at evenly spaced offsets.

    Returns inputs and next-token targets, (count, seq_len) each. A function of the stream and
    the sizes only (no randomness): the same tokens for every arm, seed and evaluation.
    """
    last_start = len(heldout) - (seq_len + 1)
    if last_start < 0:
        raise ValueError(
            f"the held-out stream has {len(heldout)} tokens; a window needs {seq_len + 1}"
        )
    starts = np.linspace(0, last_start, num=count).round().astype(np.int64)
    windows = torch.from_numpy(
        heldout[starts[:, None] + np.arange(seq_len + 1)[None, :]].astype(np.int64)
    )
    return windows[:, :-1], windows[:, 1:]


def heldout_halves(heldout: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(validation, test) halves of the held-out stream, in corpus order (used when test_windows > 0)."""
    half = len(heldout) // 2
    return heldout[:half], heldout[half:]


def sample_windows(
    stream: torch.Tensor, rows: int, seq_len: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """`rows` random contiguous windows of the training stream: inputs and next-token targets.

    The starts are drawn on the CPU by `generator` (the same windows on every device); the rows are
    read from the stream's windows view (`unfold`: no index tensor), on the stream's device."""
    starts = torch.randint(0, len(stream) - seq_len, (rows,), generator=generator)
    windows = stream.unfold(0, seq_len + 1, 1)[starts.to(stream.device)]
    return windows[:, :-1], windows[:, 1:]


# ------------------------------------------------------------------------------------ model
def causal_softmax(scores: torch.Tensor) -> torch.Tensor:
    """softmax over the last axis with position j > i masked out (scores (..., T, T), row i = query i).

    The reference for the mixers, which compute softmax(S + causal) X in one fused call (`causal_mix`)."""
    T = scores.shape[-1]
    future = torch.ones(T, T, dtype=torch.bool, device=scores.device).triu(1)
    return scores.masked_fill(future, float("-inf")).softmax(dim=-1)


def causal_mix(
    queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float
) -> torch.Tensor:
    """causal_softmax(scale x queries keys^T) @ values, in one fused call (scaled_dot_product_attention).

    The same math as building the (..., T, T) scores, masking and normalising them and multiplying,
    without the mask built per call, the scaled copy, the masked copy and the score matrices kept for
    the backward (up to float32 rounding: the fused kernel normalises blockwise). Deterministic on the
    CPU; on CUDA, under torch.use_deterministic_algorithms (models.common.seed_everything), torch picks
    a deterministic backend."""
    return F.scaled_dot_product_attention(queries, keys, values, is_causal=True, scale=scale)


class CausalSelfAttention(nn.Module):
    """Standard multi-head causal attention on the (normalised) layer input."""

    def __init__(self, config: BifLMConfig):
        super().__init__()
        self.heads = config.heads
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model, bias=False)
        self.out = nn.Linear(config.d_model, config.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, d = x.shape
        q, k, v = (
            t.view(B, T, self.heads, d // self.heads).transpose(1, 2)
            for t in self.qkv(x).split(d, dim=2)
        )
        mixed = causal_mix(q, k, v, 1 / math.sqrt(d // self.heads))  # (B, heads, T, d / heads)
        return self.out(mixed.transpose(1, 2).reshape(B, T, d))


class MLP(nn.Module):
    def __init__(self, config: BifLMConfig):
        super().__init__()
        self.up = nn.Linear(config.d_model, config.mlp_hidden, bias=False)
        self.down = nn.Linear(config.mlp_hidden, config.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(x)))


class Block(nn.Module):
    """Standard pre-norm block: attention, then the MLP."""

    def __init__(self, config: BifLMConfig):
        super().__init__()
        self.attention_norm = nn.LayerNorm(config.d_model)
        self.attention = CausalSelfAttention(config)
        self.mlp_norm = nn.LayerNorm(config.d_model)
        self.mlp = MLP(config)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        h = h + self.attention(self.attention_norm(h))
        return h + self.mlp(self.mlp_norm(h))


class FAM(nn.Module):
    """Factorised attention mixer: S_ij = alpha_i W' alpha_j^T, out_i = sum_j softmax_j(S_i + causal) x_j.

    The scores read only the tokens' static recipes alpha (no position, no context); what is
    mixed is the layer input x. k^2 parameters: W, with W' = W / ALPHA_STD^2 (module docstring).
    """

    def __init__(self, config: BifLMConfig):
        super().__init__()
        self.W = nn.Parameter(torch.randn(config.alpha_dim, config.alpha_dim) / config.alpha_dim)

    def forward(self, x: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
        recipe = alpha / ALPHA_STD  # alpha in units of its initial scale: O(1) coordinates
        # S_ij = (recipe_i W) . recipe_j = alpha_i W' alpha_j^T, unscaled; softmax(S + causal) x
        return causal_mix(recipe @ self.W, recipe, x, scale=1.0)


class CompressedAttention(nn.Module):
    """The ablation's mixer: one head whose q, k of width r come from LN(x); mixes x like FAM.

    2 d r + 2 d parameters (W_q, W_k and the LN), about FAM's k^2.
    """

    def __init__(self, config: BifLMConfig):
        super().__init__()
        self.width = config.ablation_width
        self.norm = nn.LayerNorm(config.d_model)
        self.W_q = nn.Linear(config.d_model, self.width, bias=False)
        self.W_k = nn.Linear(config.d_model, self.width, bias=False)

    def forward(self, x: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
        z = self.norm(x)
        return causal_mix(self.W_q(z), self.W_k(z), x, scale=1 / math.sqrt(self.width))


class MixerBlock(nn.Module):
    """Block 1 of the bif arms: h = x + mixer(x, alpha) (no norm on x), then the standard MLP."""

    def __init__(self, config: BifLMConfig):
        super().__init__()
        self.mixer = FAM(config) if config.arm == "bif" else CompressedAttention(config)
        self.mlp_norm = nn.LayerNorm(config.d_model)
        self.mlp = MLP(config)

    def forward(self, h: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
        h = h + self.mixer(h, alpha)
        return h + self.mlp(self.mlp_norm(h))


class BifLM(nn.Module):
    """The three arms' language models (see the module docstring for the equations)."""

    def __init__(self, config: BifLMConfig):
        super().__init__()
        self.config = config
        V, d, k = config.vocab_size, config.d_model, config.alpha_dim
        self.factorised = config.arm != "baseline"
        if self.factorised:
            self.alpha = nn.Embedding(V, k)  # A: one recipe per token
            self.basis = nn.Parameter(torch.empty(k, d))  # B: the shared parts library
            self.first = MixerBlock(config)
            standard = config.layers - 1
        else:
            self.token_embedding = nn.Embedding(V, d)
            standard = config.layers
        self.position_embedding = nn.Embedding(config.seq_len, d)
        self.blocks = nn.ModuleList(Block(config) for _ in range(standard))
        self.final_norm = nn.LayerNorm(d)
        self._init_weights()

    def _init_weights(self) -> None:
        residual_std = 0.02 / math.sqrt(2 * self.config.layers)
        for name, module in self.named_modules():
            if isinstance(module, nn.Linear):
                std = residual_std if name.endswith(("attention.out", "mlp.down")) else 0.02
                nn.init.normal_(module.weight, std=std)
        nn.init.normal_(self.position_embedding.weight, std=0.02)
        if self.factorised:
            nn.init.normal_(self.alpha.weight, std=ALPHA_STD)  # an embedding table, like E
            nn.init.normal_(
                self.basis, std=1 / math.sqrt(self.config.alpha_dim)
            )  # alpha B starts at E's scale
        else:
            nn.init.normal_(self.token_embedding.weight, std=0.02)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens (B, T) -> next-token logits (B, T, V)."""
        positions = self.position_embedding(torch.arange(tokens.shape[1], device=tokens.device))
        if self.factorised:
            alpha = self.alpha(tokens)  # (B, T, k)
            h = self.first(alpha @ self.basis + positions, alpha)
        else:
            h = self.token_embedding(tokens) + positions
        for block in self.blocks:
            h = block(h)
        h = self.final_norm(h)
        if self.factorised:
            return (
                h @ self.basis.T
            ) @ self.alpha.weight.T  # tied through the factorisation: h B^T A^T
        return h @ self.token_embedding.weight.T


# ------------------------------------------------------------------------------------ sizes
def forward_flops(config: BifLMConfig) -> int:
    """Forward FLOPs per token: 2 x the multiply-adds of every matmul, attention at T = seq_len.

    The O(T) parts (scores and mixing) are counted for a full row of T keys, as the issue asks
    (a causal row has on average (T + 1) / 2). Embedding lookups, norms, softmax, GELU, the
    residual adds and the LayerNorm affine maps are not counted.
    """
    V, d, k, T, m, L = (
        config.vocab_size,
        config.d_model,
        config.alpha_dim,
        config.seq_len,
        config.mlp_hidden,
        config.layers,
    )
    standard_block = (
        4 * d * d + 2 * T * d + 2 * d * m
    )  # q,k,v,o; q.k over T keys; mixing T values; MLP
    if config.arm == "baseline":
        return 2 * (L * standard_block + d * V)
    if config.arm == "bif":
        mixer = (
            k * k + T * k + T * d
        )  # alpha_i W; (alpha_i W) . alpha_j over T keys; mixing T inputs
    else:
        r = config.ablation_width
        mixer = 2 * d * r + T * r + T * d  # q, k; q . k over T keys; mixing T inputs
    embed = k * d  # alpha_t B
    head = d * k + k * V  # (h B^T) A^T
    return 2 * (embed + mixer + 2 * d * m + (L - 1) * standard_block + head)


def mlp_hidden_to_match(config: BifLMConfig, target_params: int) -> int:
    """The mlp_hidden at which config's model has the parameter count nearest to target_params.

    Measured, not derived: the count is linear in mlp_hidden, so two builds give the slope.
    """
    at = lambda m: count_parameters(BifLM(config.model_copy(update={"mlp_hidden": m})))  # noqa: E731
    base, slope = at(1), at(2) - at(1)
    return max(1, round(1 + (target_params - base) / slope))


# ------------------------------------------------------------------------------------ study
def learning_rate(config: BifLMConfig, step: int, total_steps: int) -> float:
    """Linear warmup over warmup_steps, then cosine decay to min_lr_ratio * lr at total_steps."""
    if step <= config.warmup_steps:
        return config.lr * step / max(1, config.warmup_steps)
    progress = (step - config.warmup_steps) / max(1, total_steps - config.warmup_steps)
    cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return config.lr * (config.min_lr_ratio + (1 - config.min_lr_ratio) * cosine)


def optimizer_for(model: BifLM, config: BifLMConfig) -> torch.optim.AdamW:
    """AdamW (betas 0.9, 0.95; the learning rate is set per step by `learning_rate`), fused: one kernel
    per parameter (CPU and CUDA) instead of a handful of tensor ops each; the same update up to float32
    rounding, about 4x less optimizer time (1.5% of a step at the contract's sizes)."""
    return torch.optim.AdamW(
        model.parameters(),
        lr=config.lr,
        betas=(0.9, 0.95),
        weight_decay=config.weight_decay,
        fused=True,
    )


def mean_loss(model: BifLM, inputs: torch.Tensor, targets: torch.Tensor) -> float:
    """Mean next-token cross-entropy (nats per token) over fixed windows, in fixed chunks."""
    total = 0.0
    for first in range(0, len(inputs), EVAL_CHUNK):
        logits = model(inputs[first : first + EVAL_CHUNK])
        total += F.cross_entropy(
            logits.flatten(0, 1), targets[first : first + EVAL_CHUNK].flatten(), reduction="sum"
        ).item()
    return total / targets.numel()


class BifLMStudy(Study):
    """Baseline vs BIF (factorised embedding + FAM) vs its ablation, at matched parameters."""

    name: ClassVar[str] = "bif_lm"
    Config: ClassVar[type[StudyConfig]] = BifLMConfig
    # val_*: the fixed windows of the held-out slice, also what tuning selects on: validation, not test
    # losses in nats per token: positive, on the log scale (a geometric mean; far from 0, at about 5-6
    # with a small seed spread, it differs little from the mean, and a right-skewed spread keeps its level)
    metrics: ClassVar[dict[str, Metric]] = {
        "train_loss": positive("lower", "train", unit="nats"),
        "val_loss": positive("lower", "validation", unit="nats"),
        "val_ppl": Metric("lower", "validation", 1.0, None, scale="log"),
        # the test windows (test_windows > 0): never read by tuning or a convergence rule
        "test_loss": positive("lower", "test", unit="nats"),
        "test_ppl": Metric("lower", "test", 1.0, None, scale="log"),
    }
    deterministic: ClassVar[bool] = False  # initialisation and batches depend on the seed
    hyperparameters: ClassVar[frozenset[str]] = frozenset(
        {"lr", "warmup_steps", "min_lr_ratio", "weight_decay"}
    )
    # the data: corpus, tokenizer, split, window length and the fixed held-out windows
    regime_fields: ClassVar[tuple[str, ...]] = (
        "corpus",
        "vocab_size",
        "train_fraction",
        "seq_len",
        "val_windows",
    )

    def reported_metrics(self, config: BifLMConfig) -> frozenset[str]:
        """train_loss, val_loss, val_ppl; test_loss and test_ppl too when the config has test windows."""
        names = {"train_loss", "val_loss", "val_ppl"}
        if config.test_windows > 0:
            names |= {"test_loss", "test_ppl"}
        return frozenset(names)

    def chance(self, metric: str, config: BifLMConfig) -> float | None:
        """An LM that learned nothing predicts the vocab_size pieces uniformly (the tokenizer has exactly that
        many): log V nats per token, perplexity V."""
        if metric in ("val_ppl", "test_ppl"):
            return float(config.vocab_size)
        if metric in ("train_loss", "val_loss", "test_loss"):
            return math.log(config.vocab_size)
        return None

    def param_count(self, config: BifLMConfig) -> int:
        return count_parameters(BifLM(config))

    def flops(self, config: BifLMConfig) -> int:
        """Forward FLOPs per token (see `forward_flops`)."""
        return forward_flops(config)

    def check_ready(self, config: BifLMConfig) -> str | None:
        from gates.models.corpora import check_source

        return check_source(config.corpus)

    def run(self, config: BifLMConfig, seed: int, reporter: Reporter) -> dict[str, float]:
        device = torch.device(resolve_device(config.device))
        data = load_token_data(config)
        val_stream, test_stream = (
            heldout_halves(data.heldout) if config.test_windows > 0 else (data.heldout, None)
        )
        val_inputs, val_targets = (
            t.to(device) for t in validation_set(val_stream, config.seq_len, config.val_windows)
        )
        if test_stream is not None:
            test_inputs, test_targets = (
                t.to(device)
                for t in validation_set(test_stream, config.seq_len, config.test_windows)
            )
        train = torch.from_numpy(data.train.astype(np.int64)).to(device)

        seed_everything(seed)
        model = BifLM(config).to(device)  # initialised on the CPU: the same weights on every device
        optimizer = optimizer_for(model, config)
        batches = torch.Generator().manual_seed(seed)
        total_steps = reporter.budget.steps
        step = 0

        def loss_fn() -> torch.Tensor:
            nonlocal step
            step += 1
            for (
                group
            ) in optimizer.param_groups:  # set before train_loop's optimizer.step() for this step
                group["lr"] = learning_rate(config, step, total_steps)
            inputs, targets = sample_windows(train, config.batch_size, config.seq_len, batches)
            return F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten())

        def evaluate() -> dict[str, float]:
            val_loss = mean_loss(model, val_inputs, val_targets)
            metrics = {"val_loss": val_loss, "val_ppl": math.exp(val_loss)}
            if test_stream is not None:
                test_loss = mean_loss(model, test_inputs, test_targets)
                metrics |= {"test_loss": test_loss, "test_ppl": math.exp(test_loss)}
            return metrics

        return train_loop(
            model, optimizer, loss_fn, reporter.budget, reporter, evaluate, clip_grad_norm=1.0
        )
