"""A small dense query-key teacher: a causal attention LM trained once on a real corpus, then frozen.

Why. The relation-closure study (studies.md section 2, Stage A) measures tree approximations of
dense attention against the exact dense posterior softmax_l(q.k_l / sqrt(d_k)). For real text it
needs real queries and keys: those of a trained attention reader, frozen. Every arm of a contract
reuses one teacher, so it is trained once per (corpus data, config, code version) and cached.

Data. `gates.data.load_text(corpus)` gives the corpus as lines (one text each). A line goes to the
training slice when the first 8 bytes of sha1(line) read as a fraction of 2^64 fall below
`train_fraction`, else to the held-out slice: the split is a function of the line's text alone, so
it does not depend on line order, and equal lines always land together (train and held-out never
share a line). Each slice keeps the corpus order of its lines.

Tokenizer. SentencePiece unigram trained on the training slice only, deterministic (one thread,
the slice's lines in corpus order, all of them, no shuffling). A slice becomes one token stream:
each line's pieces followed by EOS, concatenated.

Model (pre-norm residual blocks, one attention head, tied input/output embedding):
    h_0 = E[token_t] + P[t]                       learned positions, t < max_positions
    per block:  x = LN(h);  q = W_Q x,  k = W_K x  (width d_k),  v = W_V x  (width d_model)
                a_ts = softmax_{s <= t}(q_t . k_s / sqrt(d_k))
                h = h + W_O sum_s a_ts v_s;   h = h + MLP(LN(h))   (MLP: d -> 4d -> d, GELU)
    logits_t = LN(h_t) E^T
`record` returns a block's q and k (the last block's unless asked for another), so the study's dense
posterior over a window's positions (with the causal mask, or without it for a memory bank of keys)
is computed from them exactly as that layer of the teacher does: softmax(q . k / sqrt(d_k)).

Positions. Training windows are `seq_len` tokens; every other step instead uses windows of
`max_positions` tokens (batch * seq_len // max_positions of them: the same tokens per step). So all
`max_positions` learned positions are trained, and `record` accepts any window_len up to
max_positions (default 256, the longest per-context tree in studies.md).

Training: random contiguous windows of the training stream (seeded by the teacher's own `seed`,
independent of any contract seed), next-token cross-entropy, AdamW with linear warmup and cosine
decay, gradient clipping at 1. Losses are in nats per SentencePiece token.

Cache: <TREEHEAP_GATES_CACHE or ~/.cache/treeheap-gates>/teachers/<key>/ with tokenizer.model,
weights.pt (state_dict), teacher.json (config, key, losses, perplexity, timings, token counts) and
records/ (recorded queries and keys). key = sha256 of (source_fingerprint(corpus), the config's
canonical JSON, TEACHER_VERSION). A teacher is built in a private temp folder and moved into place
with one os.replace, teacher.json written last; a folder without a readable teacher.json is never
taken as a teacher. One trainer per key at a time (an flock on <key>.lock), so concurrent callers
wait and then load instead of training twice.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import math
import os
import random
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field, model_validator
from torch import nn

from gates.models.common import count_parameters, seed_everything, split_lines
from gates.models.corpora import cache_root
from gates.models.tokenizer import encode_stream

try:  # one trainer per cache key; without fcntl (Windows) concurrent callers may both train
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None

# Bump when a change to this file changes what a cached teacher or recording means.
TEACHER_VERSION = 1
Split = Literal["train", "heldout"]
EVAL_WINDOWS = 1024  # at most this many seq_len windows per slice for the reported losses
RECORD_CHUNK = 64  # windows per forward pass in `record` (fixed, so results do not depend on it)


class TeacherConfig(BaseModel):
    """What defines a teacher: the corpus, the tokenizer, the network and its training."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    corpus: str = "libreoffice-help:en"  # a gates.data source name, or a path to a .txt file
    vocab_size: int = Field(default=2000, ge=50)
    d_model: int = Field(default=64, ge=8)
    d_k: int = Field(default=32, ge=32, le=64)  # query/key width (studies.md: d_k 32-64)
    layers: int = Field(default=2, ge=1, le=2)
    seq_len: int = Field(default=128, ge=8)  # the usual training window
    max_positions: int = Field(
        default=256, ge=8
    )  # learned positions; the longest recordable window
    batch: int = Field(default=32, ge=1)
    steps: int = Field(default=1500, ge=1)
    lr: float = Field(default=3e-3, gt=0)
    seed: int = Field(default=0, ge=0)  # the teacher's own; independent of any contract seed
    train_fraction: float = Field(default=0.9, gt=0, lt=1)

    @model_validator(mode="after")
    def _positions_cover_windows(self) -> TeacherConfig:
        if self.max_positions < self.seq_len:
            raise ValueError(
                f"max_positions ({self.max_positions}) must be >= seq_len ({self.seq_len})"
            )
        return self


# ------------------------------------------------------------------------------------ data


def train_tokenizer(lines: list[str], vocab_size: int) -> bytes:
    """A SentencePiece unigram model (serialized) trained deterministically on `lines`.

    hard_vocab_limit=False lets a tiny corpus end with fewer pieces than asked rather than fail;
    the model's vocabulary is whatever the tokenizer ends with (recorded in teacher.json).
    """
    import sentencepiece as spm

    model = io.BytesIO()
    longest = max(len(line.encode("utf-8")) for line in lines)
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_writer=model,
        model_type="unigram",
        vocab_size=vocab_size,
        hard_vocab_limit=False,
        num_threads=1,  # multi-threaded EM may sum in a different order from run to run
        input_sentence_size=len(lines) + 1,  # every line (it samples when there are more)
        shuffle_input_sentence=False,
        max_sentence_length=max(4192, longest + 1),  # longer lines would be skipped silently
        bos_id=-1,
        eos_id=1,
        unk_id=0,
        pad_id=-1,
        minloglevel=2,
    )
    return model.getvalue()


# ------------------------------------------------------------------------------------ model
class CausalSelfAttention(nn.Module):
    """One head: q, k of width d_k, v of width d_model; scores q.k / sqrt(d_k), causal."""

    def __init__(self, config: TeacherConfig):
        super().__init__()
        self.d_k = config.d_k
        self.W_Q = nn.Linear(config.d_model, config.d_k, bias=False)
        self.W_K = nn.Linear(config.d_model, config.d_k, bias=False)
        self.W_V = nn.Linear(config.d_model, config.d_model, bias=False)
        self.W_O = nn.Linear(config.d_model, config.d_model, bias=False)

    def queries_keys(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.W_Q(x), self.W_K(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k = self.queries_keys(x)  # (B, T, d_k)
        scores = q @ k.transpose(1, 2) / math.sqrt(self.d_k)  # (B, T, T): row t = query t
        # in place on the fresh scores (the division's backward does not need them) with a mask built
        # once per (T, device): the same numbers as masked_fill of a new mask, without the copy
        attention = scores.masked_fill_(future_mask(x.shape[1], x.device), float("-inf")).softmax(
            dim=-1
        )
        return self.W_O(attention @ self.W_V(x))


@functools.lru_cache(maxsize=32)
def future_mask(length: int, device: torch.device) -> torch.Tensor:
    """(length, length) bool, True where key s > query t (masked): built once per length and device.

    Built outside inference mode even when first asked inside it: a training step saves the mask
    for its backward, which an inference tensor cannot be."""
    with torch.inference_mode(False):
        return torch.ones(length, length, dtype=torch.bool, device=device).triu(1)


class Block(nn.Module):
    """Pre-norm residual block: attention, then an MLP."""

    def __init__(self, config: TeacherConfig):
        super().__init__()
        self.attention_norm = nn.LayerNorm(config.d_model)
        self.attention = CausalSelfAttention(config)
        self.mlp_norm = nn.LayerNorm(config.d_model)
        self.mlp = nn.Sequential(
            nn.Linear(config.d_model, 4 * config.d_model),
            nn.GELU(),
            nn.Linear(4 * config.d_model, config.d_model),
        )

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        h = h + self.attention(self.attention_norm(h))
        return h + self.mlp(self.mlp_norm(h))


class TeacherLM(nn.Module):
    """Token + learned position embedding, `layers` blocks, final norm, output tied to the input."""

    def __init__(self, config: TeacherConfig, vocab_size: int):
        super().__init__()
        self.token_embedding = nn.Embedding(vocab_size, config.d_model)
        self.position_embedding = nn.Embedding(config.max_positions, config.d_model)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.layers))
        self.final_norm = nn.LayerNorm(config.d_model)
        nn.init.normal_(self.token_embedding.weight, std=0.02)
        nn.init.normal_(self.position_embedding.weight, std=0.02)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        return self.token_embedding(tokens) + self.position_embedding(positions)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens (B, T) -> next-token logits (B, T, vocab)."""
        h = self.embed(tokens)
        for block in self.blocks:
            h = block(h)
        return self.final_norm(h) @ self.token_embedding.weight.T

    def queries_keys(self, tokens: torch.Tensor, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """tokens (B, T) -> block `layer`'s queries and keys, (B, T, d_k) each."""
        h = self.embed(tokens)
        for block in self.blocks[:layer]:
            h = block(h)
        block = self.blocks[layer]
        return block.attention.queries_keys(block.attention_norm(h))


# ------------------------------------------------------------------------------------ training
def sample_windows(
    stream: torch.Tensor, rows: int, length: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """`rows` random contiguous windows: inputs (rows, length) and next-token targets.

    The starts are drawn on the CPU by `generator` (the same windows whatever the device); the rows
    are read from the stream's windows view (`unfold`: no index tensor) on the stream's device."""
    starts = torch.randint(0, len(stream) - length, (rows,), generator=generator)
    windows = stream.unfold(0, length + 1, 1)[starts.to(stream.device)]
    return windows[:, :-1], windows[:, 1:]


def mean_loss(model: TeacherLM, stream: torch.Tensor, length: int, max_windows: int) -> float:
    """Mean next-token loss over the first `max_windows` non-overlapping windows of the stream."""
    count = min(max_windows, (len(stream) - 1) // length)
    if count == 0:
        raise ValueError(f"a slice of {len(stream)} tokens holds no window of {length + 1}")
    total = 0.0
    with torch.no_grad():
        for first in range(0, count, RECORD_CHUNK):
            rows = torch.arange(first, min(count, first + RECORD_CHUNK))
            index = rows[:, None] * length + torch.arange(length + 1)[None, :]
            windows = stream[index].to(model_device(model))
            logits = model(windows[:, :-1])
            total += F.cross_entropy(
                logits.flatten(0, 1), windows[:, 1:].flatten(), reduction="sum"
            ).item()
    return total / (count * length)


def model_device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def train_teacher(
    config: TeacherConfig, model: TeacherLM, stream: torch.Tensor, log: Callable[[str], None]
) -> float:
    """Train in place on the model's device; returns the mean training loss of the last 50 steps.

    The windows are drawn on the CPU (the same windows on every device)."""
    long_rows = max(1, config.batch * config.seq_len // config.max_positions)
    if len(stream) <= config.max_positions + 1:
        raise ValueError(
            f"the training slice has {len(stream)} tokens, fewer than one window "
            f"of max_positions + 1 = {config.max_positions + 1}"
        )
    generator = torch.Generator().manual_seed(config.seed)
    # weight decay on matrices and embeddings only (not norms or biases), as in nanoGPT
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=config.lr,
        betas=(0.9, 0.99),
    )
    warmup = max(1, min(100, config.steps // 10))

    def lr_at(step: int) -> float:  # linear warmup, then cosine down to 10% of lr
        if step <= warmup:
            return config.lr * step / warmup
        progress = (step - warmup) / max(1, config.steps - warmup)
        return config.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))

    recent: list[float] = []
    device = model_device(model)
    model.train()
    for step in range(1, config.steps + 1):
        # every other step uses the longest windows, so all learned positions are trained
        if step % 2 == 0:
            inputs, targets = sample_windows(stream, long_rows, config.max_positions, generator)
        else:
            inputs, targets = sample_windows(stream, config.batch, config.seq_len, generator)
        inputs, targets = inputs.to(device), targets.to(device)
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step)
        loss = F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        recent = (recent + [loss.item()])[-50:]
        if step % max(1, config.steps // 6) == 0 or step == config.steps:
            log(f"teacher step {step}/{config.steps}: train loss {sum(recent) / len(recent):.3f}")
    model.eval()
    return sum(recent) / len(recent)


@contextmanager
def preserved_rng_state(device: str = "cpu") -> Iterator[None]:
    """Restore python, numpy and torch (CPU, and the current GPU's on cuda) global RNG states on exit.

    Why: a study seeds itself and may then call load_or_train; whether the teacher was cached
    must not change the random numbers the study draws afterwards.
    """
    python_state, numpy_state = random.getstate(), np.random.get_state()
    gpus = [torch.cuda.current_device()] if device == "cuda" else []
    with torch.random.fork_rng(devices=gpus):
        try:
            yield
        finally:
            random.setstate(python_state)
            np.random.set_state(numpy_state)


# ------------------------------------------------------------------------------------ cache


def teacher_key(config: TeacherConfig) -> str:
    """sha256 of the corpus data's fingerprint, the config's canonical JSON and TEACHER_VERSION.

    No device: whatever device the arm asking for it runs on, a teacher is trained on the CPU, on one
    thread (`build_entry`), so its weights do not depend on the device and one entry serves every
    machine. Only its recordings depend on the device they are computed on (`Teacher.record` keeps
    them apart). Why not train on the arm's device: CUDA rounds differently, and 400+ AdamW steps
    carry that into a different network, whose queries and keys (what every relation-closure metric
    is computed from) would move a GPU replay of a CPU-recorded contract by far more than float32
    rounding: beyond replay tolerances. Trained once per cache, it costs about a minute."""
    from gates.models.corpora import source_fingerprint

    identity = {
        "source_fingerprint": source_fingerprint(config.corpus),
        "config": config.model_dump(mode="json"),
        "teacher_version": TEACHER_VERSION,
    }
    return hashlib.sha256(
        json.dumps(identity, sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()


def is_cached(config: TeacherConfig) -> bool:
    """Whether this teacher is trained and complete in this machine's cache (nothing is trained)."""
    key = teacher_key(config)
    return read_complete(cache_root() / "teachers" / key, key) is not None


# one training step of the default teacher on one core (training is pinned to one thread), with the
# tokenizer and corpus read: 6,000 steps took 1,003 s and 400 steps 55 s (teacher.json's
# train_seconds on the machine that recorded the spr096 claims)
SECONDS_PER_STEP = 0.17
SECONDS_BEFORE_TRAINING = 30.0


def training_seconds(config: TeacherConfig) -> float:
    """About how long training this teacher takes on one core like the recording machine's: what an
    audit weighs against its time left before it builds one (`gates verify --audit-seconds`). Steps
    times the measured cost of a default step, scaled by tokens per step, layers and d_model^2."""
    tokens = (config.batch * config.seq_len) / (32 * 128)
    scale = tokens * (config.layers / 2) * (config.d_model / 64) ** 2
    return SECONDS_BEFORE_TRAINING + SECONDS_PER_STEP * config.steps * scale


def read_complete(folder: Path, key: str) -> dict | None:
    """teacher.json of a complete cache entry for `key`, else None (missing, partial or foreign)."""
    try:
        meta = json.loads((folder / "teacher.json").read_text())
    except (OSError, ValueError):
        return None
    complete = (
        meta.get("key") == key
        and (folder / "tokenizer.model").is_file()
        and (folder / "weights.pt").is_file()
    )
    return meta if complete else None


@contextmanager
def key_lock(teachers: Path, key: str) -> Iterator[None]:
    """Hold an exclusive lock for one key (released by the OS if the process dies)."""
    teachers.mkdir(parents=True, exist_ok=True)
    with open(teachers / f"{key}.lock", "w") as handle:
        if fcntl is not None:
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            if fcntl is not None:
                fcntl.flock(handle, fcntl.LOCK_UN)


# ------------------------------------------------------------------------------------ teacher
@dataclass
class Teacher:
    """A frozen teacher: its tokenizer, model (eval mode, no gradients) and teacher.json metadata."""

    config: TeacherConfig
    key: str
    directory: Path
    tokenizer: object  # sentencepiece.SentencePieceProcessor
    model: TeacherLM  # on `device`
    meta: dict
    trained_now: bool  # True when this load_or_train call trained it, False when loaded from cache
    device: str = "cpu"  # where it runs (records): "cpu" or "cuda"; it was trained on the CPU
    _streams: dict = field(default_factory=dict, repr=False)

    def stream(self, split: Split) -> torch.Tensor:
        """The split's token stream (computed once per Teacher; the corpus is re-read for it)."""
        if split not in ("train", "heldout"):
            raise ValueError(f"split must be 'train' or 'heldout', not {split!r}")
        if split not in self._streams:
            from gates.models.corpora import load_text

            train, heldout = split_lines(load_text(self.config.corpus), self.config.train_fraction)
            self._streams[split] = torch.from_numpy(
                encode_stream(self.tokenizer, train if split == "train" else heldout)
            )
        return self._streams[split]

    def layer(self, layer: int | None) -> int:
        """The attention layer `layer` names (None: the last), checked against the teacher's layers."""
        last = self.config.layers - 1
        if layer is None:
            return last
        if not 0 <= layer <= last:
            raise ValueError(f"the teacher has attention layers 0..{last}, not {layer}")
        return layer

    def queries_keys(
        self, tokens: torch.Tensor, layer: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """tokens (B, T) -> an attention layer's queries and keys (None: the last layer), (B, T, d_k)
        float32 each, on the teacher's device."""
        with torch.no_grad():
            q, k = self.model.queries_keys(tokens.to(self.device), self.layer(layer))
        return q.float().contiguous(), k.float().contiguous()

    def record(
        self, split: Split, num_windows: int, window_len: int, layer: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Queries and keys of an attention layer (None: the last) over consecutive windows of a split.

        The split's stream is cut into non-overlapping windows of window_len tokens from its start;
        the first num_windows are run through the frozen teacher, each window on its own (positions
        0..window_len-1). Returns (queries, keys), each (num_windows, window_len, d_k) float32, on the
        CPU (computed on the teacher's device). Cached under <teacher>/records/, since every arm of a
        study asks for the same ones; a recording on cuda is kept apart (`-cuda` in its name): its
        numbers differ from the CPU's by rounding; one of another layer than the last has
        `-layer<L>` in its name.
        """
        layer = self.layer(layer)
        if split not in ("train", "heldout"):
            raise ValueError(f"split must be 'train' or 'heldout', not {split!r}")
        if not 1 <= window_len <= self.config.max_positions:
            raise ValueError(
                f"window_len must be in 1..{self.config.max_positions} (the teacher's "
                f"max_positions), not {window_len}"
            )
        if num_windows < 1:
            raise ValueError(f"num_windows must be >= 1, not {num_windows}")
        on = "" if self.device == "cpu" else f"-{self.device}"
        which = "" if layer == self.config.layers - 1 else f"-layer{layer}"
        path = self.directory / "records" / f"{split}-{num_windows}x{window_len}{which}{on}.pt"
        if path.is_file():
            saved = torch.load(path, weights_only=True, map_location="cpu")
            return saved["queries"], saved["keys"]

        stream = self.stream(split)
        available = len(stream) // window_len
        if num_windows > available:
            raise ValueError(
                f"the {split} split has {len(stream)} tokens: only {available} windows of "
                f"{window_len} available, {num_windows} asked"
            )
        windows = stream[: num_windows * window_len].view(num_windows, window_len)
        parts = [
            self.queries_keys(windows[i : i + RECORD_CHUNK], layer)
            for i in range(0, num_windows, RECORD_CHUNK)
        ]
        queries = torch.cat([q for q, _ in parts]).cpu()
        keys = torch.cat([k for _, k in parts]).cpu()

        path.parent.mkdir(exist_ok=True)
        temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
        torch.save({"queries": queries, "keys": keys}, temporary)
        os.replace(temporary, path)
        return queries, keys


def load_teacher(
    config: TeacherConfig,
    key: str,
    folder: Path,
    meta: dict,
    trained_now: bool,
    device: str = "cpu",
) -> Teacher:
    import sentencepiece as spm

    tokenizer = spm.SentencePieceProcessor(model_file=str(folder / "tokenizer.model"))
    with preserved_rng_state():  # the throwaway random init must not move the caller's stream
        model = TeacherLM(config, tokenizer.get_piece_size())
    model.load_state_dict(torch.load(folder / "weights.pt", weights_only=True, map_location="cpu"))
    model.to(device).eval().requires_grad_(False)
    return Teacher(config, key, folder, tokenizer, model, meta, trained_now, device)


def build_entry(
    config: TeacherConfig,
    key: str,
    folder: Path,
    log: Callable[[str], None],
    caller_device: str = "cpu",
) -> None:
    """Train a teacher (on the CPU: see `teacher_key`) and write its cache entry into `folder` (teacher.json
    last). `caller_device`: the device of the run asking, whose random state is kept."""
    import sentencepiece as spm

    from gates.models.corpora import load_text, source_fingerprint

    started = time.perf_counter()
    train_lines, heldout_lines = split_lines(load_text(config.corpus), config.train_fraction)
    if not train_lines or not heldout_lines:
        raise ValueError(
            f"corpus {config.corpus!r} split into {len(train_lines)} train and "
            f"{len(heldout_lines)} held-out lines; both must be non-empty"
        )
    (folder / "tokenizer.model").write_bytes(train_tokenizer(train_lines, config.vocab_size))
    tokenizer = spm.SentencePieceProcessor(model_file=str(folder / "tokenizer.model"))
    train_stream = torch.from_numpy(encode_stream(tokenizer, train_lines))
    heldout_stream = torch.from_numpy(encode_stream(tokenizer, heldout_lines))
    log(
        f"teacher {key[:12]}: {len(train_lines)} train / {len(heldout_lines)} held-out lines, "
        f"{len(train_stream)} / {len(heldout_stream)} tokens, vocab {tokenizer.get_piece_size()}"
    )

    threads = torch.get_num_threads()
    # One thread: a reduction split over a different number of threads rounds differently, and a
    # teacher must be the same network on every machine (CI replays contracts that train one).
    torch.set_num_threads(1)
    try:
        with preserved_rng_state(
            caller_device
        ):  # a study calling us mid-run keeps its own random stream
            seed_everything(config.seed)
            model = TeacherLM(config, tokenizer.get_piece_size())
            train_started = time.perf_counter()
            final_train_loss = train_teacher(config, model, train_stream, log)
            train_seconds = time.perf_counter() - train_started
    finally:
        torch.set_num_threads(threads)
    heldout_loss = mean_loss(model, heldout_stream, config.seq_len, EVAL_WINDOWS)
    torch.save(model.state_dict(), folder / "weights.pt")
    meta = {
        "key": key,
        "teacher_version": TEACHER_VERSION,
        "source_fingerprint": source_fingerprint(config.corpus),
        "config": config.model_dump(mode="json"),
        "vocab_size_actual": tokenizer.get_piece_size(),
        "parameters": count_parameters(model),
        "train_lines": len(train_lines),
        "heldout_lines": len(heldout_lines),
        "train_tokens": len(train_stream),
        "heldout_tokens": len(heldout_stream),
        "final_train_loss": final_train_loss,  # mean of the last 50 steps' minibatch losses
        "train_eval_loss": mean_loss(model, train_stream, config.seq_len, EVAL_WINDOWS),
        "heldout_loss": heldout_loss,  # nats per token, first EVAL_WINDOWS seq_len windows
        "heldout_perplexity": math.exp(heldout_loss),
        "train_seconds": train_seconds,
        "total_seconds": time.perf_counter() - started,
        "torch_threads": 1,  # training is pinned to one thread (see build_entry)
        "device": "cpu",  # trained on the CPU whatever device asked for it (see teacher_key)
        "torch_version": torch.__version__,
        "sentencepiece_version": spm.__version__,
    }
    (folder / "teacher.json.tmp").write_text(json.dumps(meta, indent=2, sort_keys=True))
    os.replace(folder / "teacher.json.tmp", folder / "teacher.json")  # the commit point


def load_or_train(
    config: TeacherConfig, log: Callable[[str], None] = print, device: str = "cpu"
) -> Teacher:
    """The cached teacher for `config`, training (and caching) it first when there is none, loaded on
    `device` ("cpu" or "cuda", already resolved): its recordings are computed there. Training is on the
    CPU whatever the device, so every machine shares one teacher (see `teacher_key`)."""
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda' (resolve 'auto' first), not {device!r}")
    key = teacher_key(config)
    teachers = cache_root() / "teachers"
    folder = teachers / key
    meta = read_complete(folder, key)
    if meta is not None:
        return load_teacher(config, key, folder, meta, trained_now=False, device=device)

    with key_lock(teachers, key):
        meta = read_complete(folder, key)  # another process may have finished while we waited
        if meta is not None:
            return load_teacher(config, key, folder, meta, trained_now=False, device=device)
        for stale in teachers.glob(f".tmp-{key}-*"):  # left by killed trainers (we hold the lock)
            shutil.rmtree(stale, ignore_errors=True)
        if folder.exists():  # partial: no complete teacher.json; move aside, then delete
            trash = teachers / f".tmp-{key}-partial-{uuid.uuid4().hex}"
            os.replace(folder, trash)
            shutil.rmtree(trash, ignore_errors=True)
        building = teachers / f".tmp-{key}-{uuid.uuid4().hex}"
        building.mkdir()
        try:
            build_entry(config, key, building, log, caller_device=device)
            os.replace(building, folder)
        finally:
            shutil.rmtree(building, ignore_errors=True)
        meta = read_complete(folder, key)
        log(
            f"teacher {key[:12]}: held-out perplexity {meta['heldout_perplexity']:.2f} "
            f"after {meta['train_seconds']:.1f}s of training; cached in {folder}"
        )
        return load_teacher(config, key, folder, meta, trained_now=True, device=device)
