"""TreeHeap translator (seed 001, stage D of seed 000; studies.md section 3).

A sentence goes WRITE -> Butterfly -> FOLD -> (root, details, masks) -> recursive READ at every
decoder step -> GRU -> softmax (the parts: models/treeheap.py):

    leaves   x_i = E_src(w_i)       w = [direction token] + SentencePiece pieces + [EOS], no positions
    encoder  Butterfly(x) -> FOLD level by level -> node states (root first)
    decoder  c_t = READ(h_t);  h_{t+1} = GRU([E_tgt(y_t), c_t], h_t);  p(y_{t+1}) = softmax(W_o [h_{t+1}, c_t])
             y_0 = the direction token, h_0 = 0: the source reaches the decoder only through c_t.

Arms: lifting / mlp / bilinear (recursive READ over the tree built by that FOLD); root_only (lifting
FOLD, the context is the root alone); flat_seq (the same WRITE + Butterfly leaves, dense attention
over them instead of FOLD + READ: softmax_i(q(h).k(x_i) / sqrt(m)); parameters matched by the key
MLP's width); target_only (no source: c_t = 0, a target-side language model). The dense baselines
of issue #14, standard attention NMT on the same WRITE (no Butterfly, no FOLD), each with learned
positions, an encoder, multi-head cross-attention with query / key / value / output maps, and the
decoder's first state from the encoder:

    bahdanau          s = BiGRU(x + pos) (packed: padding never enters);  h_0 = tanh(W_0 [s_fwd_last, s_bwd_first])
    transformer_enc   s = one pre-norm Transformer encoder layer over x + pos (padded keys masked);
                      h_0 = tanh(W_0 mean of s over the occupied leaves)
    both              c_t = W_o [sum_n softmax_n(q_j(h_t).k_j(s_n) / sqrt(m / H)) v_j(s_n)]_{j = 1..H}

and all_nodes, the isolating control: the lifting tree's 2N - 1 nodes read by one softmax
(models/treeheap.py NodeAttention) instead of the recursion. Their widths (gru_hidden, ffn_hidden;
all_nodes by construction) match the encoder + reader parameters of the lifting arm (Butterfly + FOLD
+ READ); `TranslatorStudy.parameter_parts` counts them, `matched_width` sizes them.

Metrics (test split; NLL in nats per target token, both directions pooled unless suffixed):
test_nll, test_ppl, test_nll_<direction>; bleu_<direction> and chrf_<direction> (sacrebleu corpus
scores of greedy or beam decodes of the first `bleu_examples` test examples of each direction,
tokenize "zh" for Chinese targets, "13a" otherwise; the signatures are saved with the samples),
bleu and chrf (their mean over directions); damage_<intervention> = NLL under the intervention
minus the clean NLL, for the arms it applies to:
  source_shuffle  every example reads the source of another example of the same direction
  pair_break      Butterfly pairs leaves by a random matching each round instead of XOR
  detail_shuffle  every parent is built from another sentence's detail (and the right child it implies)
  relation_zero   the bilinear branch is zeroed (bilinear only)
unfold_mse (leaves rebuilt by UNFOLD from the root and details vs the Butterfly's leaves, lifting-form
folds), stop_mass_depth_<k> (mean READ mass stopped at depth k per target token), val_nll (during
training, on a fixed slice of the valid split), train_tokens_per_s, peak_mem_mb (peak RSS growth
during one training step, from /proc; NaN where the kernel does not offer it). With keep_best every
test metric is measured on the weights of the evaluation with the lowest val_nll (early stopping on the
validation split); the final val_nll is then that lowest one and best_val_step its step.
"""

from __future__ import annotations

import math
import time
from typing import ClassVar, Literal, NamedTuple

import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from torch import nn

from gates.models.common import count_parameters, peak_rss_growth_mb, seed_everything, train_loop
from gates.models.translation_data import (
    EOS,
    PAD,
    Example,
    TranslationData,
    collate,
    directions_of,
    load_translation_data,
)
from gates.models.treeheap import (
    Butterfly,
    Fold,
    NodeAttention,
    Read,
    fold_levels,
    mlp,
    random_pairing,
    unfold_levels,
)
from gates.study import (
    DeviceConfig,
    Metric,
    Reporter,
    Study,
    nonnegative,
    positive,
    proportion,
    resolve_device,
)

TREE_ARMS = ("lifting", "mlp", "bilinear")  # recursive READ
FOLD_ARMS = (*TREE_ARMS, "root_only", "all_nodes")
DENSE_ARMS = (
    "bahdanau",
    "transformer_enc",
)  # an encoder over positioned leaves, no Butterfly, no FOLD
READER_ARMS = (
    *TREE_ARMS,
    "all_nodes",
    *DENSE_ARMS,
)  # a `read` module: keys once, a query of h_t per step
INTERVENTIONS = ("source_shuffle", "pair_break", "detail_shuffle", "relation_zero")


class TranslatorConfig(DeviceConfig):
    arm: Literal[
        "lifting",
        "mlp",
        "bilinear",
        "root_only",
        "flat_seq",
        "target_only",
        "all_nodes",
        "bahdanau",
        "transformer_enc",
    ]
    corpus: str = "libreoffice-help:zh-en"
    languages: tuple[str, str] = ("zh", "en")  # what the corpus's two columns are
    directions: tuple[str, ...] = ("zh2en", "en2zh")
    vocab_size: int = Field(4000, ge=16)
    depth: int = Field(5, ge=1, le=10)  # N = 2^depth leaves
    d_model: int = Field(128, ge=4)
    hidden: int = Field(128, ge=1)  # Butterfly F, G and the fold's P, U~
    read_dim: int = Field(64, ge=1)  # m of READ (and of flat_seq's attention)
    merge_hidden: int = Field(85, ge=1)  # mlp fold: MLP([l, r]) width
    relation_rank: int = Field(32, ge=1)  # bilinear fold
    attn_hidden: int = Field(128, ge=1)  # flat_seq's key MLP width (sized to match parameters)
    heads: int = Field(
        4, ge=1
    )  # bahdanau / transformer_enc: attention heads (divide read_dim and d_model)
    gru_hidden: int = Field(
        73, ge=1
    )  # bahdanau: BiGRU width per direction (sized to match parameters)
    ffn_hidden: int = Field(
        112, ge=1
    )  # transformer_enc: the layer's MLP width (sized to match parameters)
    batch_size: int = Field(64, ge=2)
    lr: float = Field(2e-3, gt=0)
    warmup_steps: int = Field(20, ge=0)
    clip_grad_norm: float = Field(1.0, gt=0)
    # regularisation (issue #25: something for `tuning` to search besides lr); 0 = none, as every recorded run
    dropout: float = Field(
        0.0, ge=0, lt=1
    )  # on the token embeddings and on the output layer's input, in training
    weight_decay: float = Field(0.0, ge=0)  # AdamW's decoupled weight decay
    valid_fraction: float = Field(0.05, gt=0, lt=0.5)
    test_fraction: float = Field(0.05, gt=0, lt=0.5)
    valid_examples: int = Field(256, ge=2)
    test_examples: int = Field(0, ge=0)  # 0 = the whole test split
    bleu_examples: int = Field(200, ge=1)  # per direction
    beam_size: int = Field(1, ge=1)
    samples: int = Field(20, ge=0)  # sample translations saved per direction
    # measure the weights of the evaluation with the lowest val_nll (early stopping), not the last
    keep_best: bool = False

    @model_validator(mode="after")
    def _directions_known(self) -> TranslatorConfig:
        known = directions_of(self.languages)
        unknown = [d for d in self.directions if d not in known]
        if unknown or not self.directions:
            raise ValueError(
                f"directions {list(self.directions)} must be a non-empty subset of {list(known)}"
            )
        return self

    @model_validator(mode="after")
    def _heads_divide(self) -> TranslatorConfig:
        if self.arm in DENSE_ARMS and (self.read_dim % self.heads or self.d_model % self.heads):
            raise ValueError(
                f"heads ({self.heads}) must divide read_dim ({self.read_dim}) and d_model ({self.d_model})"
            )
        return self

    @property
    def n_leaves(self) -> int:
        return 2**self.depth


def load_data(config: TranslatorConfig, log=lambda _msg: None) -> TranslationData:
    return load_translation_data(
        config.corpus,
        tuple(config.languages),
        tuple(config.directions),
        config.vocab_size,
        config.n_leaves - 2,
        config.valid_fraction,
        config.test_fraction,
        log=log,
    )


# ------------------------------------------------------------------------------------ model
class EncoderLayer(nn.Module):
    """One pre-norm Transformer encoder layer (transformer_enc): x + SelfAttn(LN(x)), then x + MLP(LN(x)),
    a final LN; empty leaves are never keys (they are queries, whose rows no reader reads)."""

    def __init__(self, d: int, heads: int, hidden: int):
        super().__init__()
        self.heads = heads
        self.ln_attn, self.ln_mlp, self.ln_out = nn.LayerNorm(d), nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = mlp(d, hidden, d)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        q, k, v = (
            self.qkv(self.ln_attn(x)).unflatten(-1, (3, self.heads, -1)).permute(2, 0, 3, 1, 4)
        )  # B x H x N x d/H
        attended = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None, None, :])
        x = x + self.proj(attended.transpose(1, 2).flatten(2))
        return self.ln_out(x + self.mlp(self.ln_mlp(x)))


class CrossAttention(nn.Module):
    """Multi-head dot-product attention of the decoder state over encoder states s (bahdanau,
    transformer_enc): head j weighs the occupied leaves by softmax_n(q_j(h).k_j(s_n) / sqrt(m / H)),
    c = W_o [sum_n w_jn v_j(s_n)]_j. The interface of READ: keys once per sentence, a query per step."""

    def __init__(self, d_query: int, d_memory: int, m: int, heads: int, d_out: int):
        super().__init__()
        self.heads, self.head_dim = heads, m // heads
        self.query, self.key, self.value = (
            nn.Linear(d_query, m),
            nn.Linear(d_memory, m),
            nn.Linear(d_memory, d_out),
        )
        self.out = nn.Linear(d_out, d_out)

    def keys(self, states: torch.Tensor, mask: torch.Tensor) -> dict:
        def split(x):  # B x N x (H k) -> B x H x N x k
            return x.unflatten(-1, (self.heads, -1)).transpose(1, 2)

        return {"keys": split(self.key(states)), "values": split(self.value(states)), "mask": mask}

    def query_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.query.weight, self.query.bias

    def read_for(self, queries: torch.Tensor, keys: dict) -> tuple[torch.Tensor, None]:
        scores = torch.einsum(
            "bhnk,bhk->bhn", keys["keys"], queries.unflatten(-1, (self.heads, -1))
        )
        weights = torch.softmax(
            (scores / math.sqrt(self.head_dim)).masked_fill(~keys["mask"][:, None], -math.inf), -1
        )
        return self.out(torch.einsum("bhn,bhnv->bhv", weights, keys["values"]).flatten(1)), None


class Translator(nn.Module):
    def __init__(self, config: TranslatorConfig, vocab_size: int):
        super().__init__()
        self.config, arm, d = config, config.arm, config.d_model
        if arm != "target_only":
            self.src_embed = nn.Embedding(vocab_size, d)
        if arm not in ("target_only", *DENSE_ARMS):
            self.butterfly = Butterfly(d, config.hidden, config.depth)
        if arm in FOLD_ARMS:
            kind = arm if arm in TREE_ARMS else "lifting"
            self.fold = Fold(
                d, config.hidden, kind, config.relation_rank, merge_hidden=config.merge_hidden
            )
        if arm in TREE_ARMS:
            self.read = Read(d, d, config.read_dim, config.depth)
        if (
            arm == "all_nodes"
        ):  # READ's stop and branch widths side by side: READ's parameters exactly
            self.read = NodeAttention(d, d, 2 * config.read_dim, config.depth)
        if arm in DENSE_ARMS:
            self.positions = nn.Embedding(config.n_leaves, d)  # learned, added to the leaves
            if arm == "bahdanau":
                self.encoder, d_memory = (
                    nn.GRU(d, config.gru_hidden, batch_first=True, bidirectional=True),
                    2 * config.gru_hidden,
                )
            else:
                self.encoder, d_memory = EncoderLayer(d, config.heads, config.ffn_hidden), d
            self.read = CrossAttention(d, d_memory, config.read_dim, config.heads, d)
            self.init_state = nn.Linear(d_memory, d)  # h_0 from the encoder
        if arm == "flat_seq":
            self.attn_query = nn.Linear(d, config.read_dim)
            self.attn_key = mlp(d, config.attn_hidden, config.read_dim)
        self.tgt_embed = nn.Embedding(vocab_size, d)
        self.gru = nn.GRUCell(2 * d, d)
        self.out = nn.Linear(2 * d, vocab_size)

    # -- encoder: WRITE -> Butterfly -> FOLD, with the interventions where they act
    def encode(
        self,
        src: torch.Tensor,
        mask: torch.Tensor,
        intervention: str | None = None,
        permutation: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
    ) -> dict:
        arm = self.config.arm
        if arm == "target_only":
            return {"batch": src.shape[0]}
        if intervention == "source_shuffle":
            src, mask = src[permutation], mask[permutation]
        leaves = self.dropout(self.src_embed(src))
        if intervention == "pad_noise":  # a no-op by construction: padding must not reach anything
            noise = torch.randn(leaves.shape, generator=generator).to(leaves.device)
            leaves = torch.where(mask.unsqueeze(-1), leaves, 100 * noise)
        if arm in DENSE_ARMS:
            states, summary = self.dense_encode(leaves + self.positions.weight, mask)
            return {
                "read": self.read.keys(states, mask),
                "h0": torch.tanh(self.init_state(summary)),
            }
        pairing = (
            [
                (i.to(src.device), j.to(src.device))
                for i, j in random_pairing(self.config.n_leaves, self.config.depth, generator)
            ]
            if intervention == "pair_break"
            else None
        )
        leaves = self.butterfly(leaves, mask, pairing)
        if arm == "flat_seq":
            return {"leaves": leaves, "mask": mask, "keys": self.attn_key(leaves)}
        detail_source = (lambda d: d[permutation]) if intervention == "detail_shuffle" else None
        self.fold.relation_gate = 0.0 if intervention == "relation_zero" else 1.0
        states, details, masks = fold_levels(self.fold, leaves, mask, detail_source)
        memory = {"states": states, "details": details, "masks": masks, "root": states[0][:, 0]}
        if arm in READER_ARMS:
            memory["read"] = self.read.keys(states, masks)
        return memory

    def dense_encode(
        self, x: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(encoder states B x N x d_memory, zero on empty leaves; the summary h_0 is made from)."""
        if (
            self.config.arm == "bahdanau"
        ):  # packed: each direction runs over the occupied leaves only
            packed = nn.utils.rnn.pack_padded_sequence(
                x, mask.sum(1).cpu(), batch_first=True, enforce_sorted=False
            )
            out, last = self.encoder(
                packed
            )  # last: the forward state after the last piece, the backward after the first
            states = nn.utils.rnn.pad_packed_sequence(
                out, batch_first=True, total_length=x.shape[1]
            )[0]
            return states, torch.cat([last[0], last[1]], -1)
        states = self.encoder(x, mask)
        keep = mask.unsqueeze(-1)
        return states, torch.where(keep, states, 0.0).sum(1) / keep.sum(1)

    def context(
        self, query: torch.Tensor, memory: dict
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """c_t for the reader's query of decoder state h_t; with READ also the stopped mass per node."""
        arm = self.config.arm
        if arm in READER_ARMS:
            return self.read.read_for(query, memory["read"])
        if arm == "root_only":
            return memory["root"], None
        if arm == "flat_seq":
            scores = torch.einsum("bnm,bm->bn", memory["keys"], query) / math.sqrt(
                self.config.read_dim
            )
            weights = torch.softmax(scores.masked_fill(~memory["mask"], -math.inf), -1)
            return torch.einsum("bn,bnd->bd", weights, memory["leaves"]), None
        return query.new_zeros(query.shape[0], self.config.d_model), None

    def dropout(self, x: torch.Tensor) -> torch.Tensor:
        """Dropout in training (where a standard seq2seq model has it: the token embeddings and the output
        layer's input). At `dropout` 0 (the default) the input comes back untouched and nothing is drawn from
        the random stream, so a run is bit for bit what it was before the field existed."""
        p = self.config.dropout
        return F.dropout(x, p, training=True) if p > 0 and self.training else x

    def batch(self, examples: list[Example]) -> dict[str, torch.Tensor]:
        """`collate`d examples on the model's device."""
        device = self.tgt_embed.weight.device
        return {k: v.to(device) for k, v in collate(examples, self.config.n_leaves).items()}

    def fused(self) -> Fused:
        """The decoder's parameters laid out for its loop (the same parameters, gradients flow back):
        every map of h_t in one matrix (the GRU's hidden gates, then the reader's query), and the GRU's
        input map split into its context columns (one product per step) and its token-embedding
        columns (`input_gates`, run once for all teacher-forced steps)."""
        d, arm = self.config.d_model, self.config.arm
        weights, biases = [self.gru.weight_hh], [self.gru.bias_hh]
        if arm in READER_ARMS:
            weight, bias = self.read.query_weights()
            weights.append(weight)
            biases.append(bias)
        elif arm == "flat_seq":
            weights.append(self.attn_query.weight)
            biases.append(self.attn_query.bias)
        return Fused(torch.cat(weights), torch.cat(biases), self.gru.weight_ih[:, d:])

    def initial_state(self, memory: dict, like: torch.Tensor) -> torch.Tensor:
        """h_0: from the encoder for the dense baselines, else 0 (the source reaches the decoder only through c_t)."""
        if "h0" in memory:
            return memory["h0"]
        return like.new_zeros(like.shape[0], self.config.d_model)

    def input_gates(self, y: torch.Tensor) -> torch.Tensor:
        """W_ih's token-embedding columns applied to E_tgt(y), plus b_ih (... x 3d)."""
        return F.linear(
            self.dropout(self.tgt_embed(y)),
            self.gru.weight_ih[:, : self.config.d_model],
            self.gru.bias_ih,
        )

    def step(self, x_gates: torch.Tensor, h: torch.Tensor, memory: dict, fused: Fused):
        """One decoder step, h_{t+1} = GRU([E_tgt(y_t), c_t], h_t) written out (torch's GRUCell, term by
        term) so that its token half `x_gates` comes precomputed: (h_{t+1}, [h_{t+1}, c_t] for the output
        layer, READ's masses or None)."""
        d = self.config.d_model
        projected = F.linear(h, fused.h_weight, fused.h_bias)
        hidden_gates, query = projected[:, : 3 * d], projected[:, 3 * d :]
        c, mass = self.context(query, memory)
        r_x, z_x, n_x = (x_gates + F.linear(c, fused.c_weight)).chunk(3, -1)
        r_h, z_h, n_h = hidden_gates.chunk(3, -1)
        reset, update = torch.sigmoid(r_x + r_h), torch.sigmoid(z_x + z_h)
        new = torch.tanh(n_x + reset * n_h)
        h = new + update * (h - new)  # (1 - z) n + z h
        return h, torch.cat([h, c], -1), mass

    def forward(
        self, batch: dict, intervention: str | None = None, permutation=None, generator=None
    ) -> Decoded:
        """Teacher-forced logits of the target tokens that exist, packed step by step (P x V: step 0 of
        every sentence, then step 1 of those still going, ...), their targets (P) and READ's stopped
        masses there (P x nodes, or None).

        The sentences are taken longest target first, so the ones still going at step t are a prefix
        of the batch and the decoder steps only them: a finished sentence's later steps would only
        produce logits the loss ignores (on the contracts' batches this halves the decoder's work).
        The target embeddings are looked up once for all steps (one embedding backward, not one per step)."""
        lengths = (batch["tgt_out"] != PAD).sum(1)
        order = torch.sort(lengths, descending=True, stable=True).indices
        if permutation is not None:  # "row i reads row permutation[i]", renumbered in the new order
            permutation = torch.argsort(order)[permutation.to(order.device)[order]]
        memory = self.encode(
            batch["src"][order], batch["src_mask"][order], intervention, permutation, generator
        )
        tgt_in, tgt_out = batch["tgt_in"][order], batch["tgt_out"][order]
        going = (
            lengths[order].unsqueeze(0)
            > torch.arange(tgt_in.shape[1], device=lengths.device).unsqueeze(1)
        ).sum(1)
        # the token half of every step's GRU input at once; unbind: one gradient stack, not one per step
        inputs = self.input_gates(tgt_in).unbind(1)
        fused = self.fused()
        h = self.initial_state(memory, inputs[0])
        features, masses, targets = [], [], []
        for t, n in enumerate(going.tolist()):
            if n == 0:
                break
            h, feature, mass = self.step(inputs[t][:n], h[:n], _select(memory, slice(0, n)), fused)
            features.append(feature)
            masses.append(mass)
            targets.append(tgt_out[:n, t])
        logits = self.out(self.dropout(torch.cat(features)))  # one large matmul for all steps
        return Decoded(
            logits, torch.cat(targets), torch.cat(masses) if masses[0] is not None else None
        )


class Fused(NamedTuple):
    h_weight: torch.Tensor  # (3d + query) x d: the GRU's hidden gates, then the reader's query map
    h_bias: torch.Tensor
    c_weight: torch.Tensor  # 3d x d: the GRU's input map, context columns


class Decoded(NamedTuple):
    logits: torch.Tensor  # P x V, the target positions that exist, packed step by step
    targets: torch.Tensor  # P
    masses: torch.Tensor | None  # P x nodes: READ's stopped mass per node (READ arms)


def token_nll(decoded: Decoded) -> tuple[torch.Tensor, int]:
    """(summed NLL over the target tokens, their count)."""
    return F.cross_entropy(decoded.logits, decoded.targets, reduction="sum"), len(decoded.targets)


# ------------------------------------------------------------------------------------ decoding
@torch.no_grad()
def translate(
    model: Translator, examples: list[Example], beam_size: int = 1, max_len: int | None = None
) -> list[list[int]]:
    """Greedy (beam_size 1) or beam decoding; token ids without EOS."""
    model.eval()
    batch = model.batch(examples)
    max_len = max_len or model.config.n_leaves
    memory = model.encode(batch["src"], batch["src_mask"])
    start = batch["tgt_in"][:, 0]  # the direction token
    if beam_size == 1:
        return _greedy(model, memory, start, max_len)
    return [
        _beam(model, _select(memory, torch.tensor([row])), start[row : row + 1], beam_size, max_len)
        for row in range(len(examples))
    ]


def _greedy(model, memory, start, max_len):
    h, fused = model.initial_state(memory, model.input_gates(start)), model.fused()
    y, done = start, torch.zeros(start.shape[0], dtype=torch.bool, device=start.device)
    out = [[] for _ in range(start.shape[0])]
    for _ in range(max_len):
        h, feature, _ = model.step(model.input_gates(y), h, memory, fused)
        y = model.out(feature).argmax(-1)
        tokens = y.tolist()  # one transfer per step, not one per sentence
        for row in (~done).nonzero().flatten().tolist():
            if tokens[row] == EOS:
                done[row] = True
            else:
                out[row].append(tokens[row])
        if done.all():
            break
    return out


def _select(memory, rows: torch.Tensor | slice):
    """The memory of the given batch rows (repeats allowed; for beams) or of a slice of them (views;
    for the sentences still going)."""
    if isinstance(memory, torch.Tensor):
        return memory[rows]
    if isinstance(memory, dict):
        count = (
            len(range(memory["batch"])[rows] if isinstance(rows, slice) else rows)
            if "batch" in memory
            else None
        )
        return {k: (count if k == "batch" else _select(v, rows)) for k, v in memory.items()}
    if isinstance(memory, list):
        return [_select(v, rows) for v in memory]
    return memory


def _beam(model, memory, start, beam_size, max_len):
    """Beam search for one sentence. The beam shrinks by one for every hypothesis that ends (EOS),
    so the search stops with beam_size finished hypotheses; ranked by log-probability per token."""
    beams = [(0.0, [], model.initial_state(memory, model.input_gates(start)), int(start[0]))]
    fused = model.fused()
    finished = []
    for _ in range(max_len):
        ys = torch.tensor([b[3] for b in beams], device=start.device)
        h = torch.cat([b[2] for b in beams])
        h, feature, _ = model.step(
            model.input_gates(ys),
            h,
            _select(memory, torch.zeros(len(beams), dtype=torch.long)),
            fused,
        )
        logp = torch.log_softmax(model.out(feature), -1)
        candidates = []
        for i, (score, tokens, _, _) in enumerate(beams):
            top = logp[i].topk(beam_size)
            for value, token in zip(top.values.tolist(), top.indices.tolist()):
                candidates.append((score + value, tokens, h[i : i + 1], token))
        candidates.sort(key=lambda c: -c[0])
        beams = []
        for score, tokens, state, token in candidates[: beam_size - len(finished)]:
            if token == EOS:
                finished.append((score / (len(tokens) + 1), tokens))
            else:
                beams.append((score, tokens + [token], state, token))
        if not beams:
            break
    finished.extend((score / len(tokens), tokens) for score, tokens, _, _ in beams)  # hit max_len
    return max(finished, key=lambda f: f[0])[1]


# ------------------------------------------------------------------------------------ measuring
def same_direction_roll(examples: list[Example]) -> torch.Tensor:
    """A permutation sending every example to another example of its own direction (a roll by one
    inside each direction's group; a group of one stays put)."""
    permutation = torch.arange(len(examples))
    groups: dict[str, list[int]] = {}
    for i, e in enumerate(examples):
        groups.setdefault(e.direction, []).append(i)
    for rows in groups.values():
        permutation[rows] = torch.tensor(rows[1:] + rows[:1])
    return permutation


@torch.no_grad()
def mean_nll(
    model: Translator,
    examples: list[Example],
    batch_size: int,
    intervention: str | None = None,
    seed: int = 0,
) -> tuple[float, torch.Tensor | None, int]:
    """NLL per target token over `examples` (fixed batches, so interventions pair up the same way
    for every model), the mean stopped mass per depth (READ arms, else None) and the token count."""
    model.eval()
    generator = torch.Generator().manual_seed(seed)
    total, count, depth_mass, mass_tokens = 0.0, 0, None, 0
    for start in range(0, len(examples), batch_size):
        chunk = examples[start : start + batch_size]
        batch = model.batch(chunk)
        decoded = model(batch, intervention, same_direction_roll(chunk), generator)
        loss, n = token_nll(decoded)
        total, count = total + float(loss), count + n
        if decoded.masses is not None:
            summed = torch.stack(
                [
                    decoded.masses[:, 2**k - 1 : 2 ** (k + 1) - 1].sum()
                    for k in range(model.config.depth + 1)
                ]
            )
            depth_mass = summed if depth_mass is None else depth_mass + summed
            mass_tokens += n
    model.train()
    return (
        total / max(count, 1),
        (depth_mass / mass_tokens if depth_mass is not None else None),
        count,
    )


def applicable_interventions(arm: str) -> tuple[str, ...]:
    if arm == "target_only":
        return ()
    if arm in DENSE_ARMS:
        return ("source_shuffle",)
    if arm == "flat_seq":
        return ("source_shuffle", "pair_break")
    return INTERVENTIONS if arm == "bilinear" else INTERVENTIONS[:3]


@torch.no_grad()
def unfold_mse(model: Translator, examples: list[Example]) -> float:
    batch = model.batch(examples)
    memory = model.encode(batch["src"], batch["src_mask"])
    rebuilt = unfold_levels(
        model.fold, memory["root"].unsqueeze(1), memory["details"], memory["masks"]
    )
    leaves, mask = memory["states"][-1], batch["src_mask"]
    return float(((rebuilt - leaves) ** 2)[mask].mean())


def bleu_chrf(
    hypotheses: list[str], references: list[str], target_language: str
) -> tuple[float, float, str, str]:
    from sacrebleu.metrics import BLEU, CHRF

    bleu = BLEU(tokenize="zh" if target_language == "zh" else "13a")
    chrf = CHRF()
    b, c = bleu.corpus_score(hypotheses, [references]), chrf.corpus_score(hypotheses, [references])
    return b.score, c.score, str(bleu.get_signature()), str(chrf.get_signature())


def learning_rate(config: TranslatorConfig, step: int) -> float:
    return config.lr * min(1.0, step / config.warmup_steps) if config.warmup_steps else config.lr


def forward_flops(config: TranslatorConfig, vocab_size: int) -> int:
    """Multiply-adds x 2 of one example's forward pass with every leaf full and T = N target steps."""
    d, h, m, n, depth = (
        config.d_model,
        config.hidden,
        config.read_dim,
        config.n_leaves,
        config.depth,
    )
    arm, nodes = config.arm, 2 * n - 1
    encoder = (
        0 if arm in ("target_only", *DENSE_ARMS) else depth * (n // 2) * 2 * (2 * d * h)
    )  # F and G on every pair
    if arm in FOLD_ARMS:
        per_parent = 2 * d * h + {
            "mlp": 3 * d * config.merge_hidden,
            "bilinear": 2 * d * h + 3 * d * config.relation_rank,
        }.get(config.arm, 2 * d * h)
        encoder += (n - 1) * per_parent
    per_step = 3 * (2 * d * d + d * d) + 2 * d * vocab_size  # GRU cell, output layer
    if arm in TREE_ARMS:
        encoder += nodes * 2 * d * m
        per_step += 2 * d * m + 2 * nodes * m + nodes * d
    if arm == "flat_seq":
        encoder += n * (d * config.attn_hidden + config.attn_hidden * m)
        per_step += d * m + n * m + n * d
    if arm == "all_nodes":
        encoder += nodes * d * 2 * m
        per_step += d * 2 * m + nodes * 2 * m + nodes * d
    if arm in DENSE_ARMS:
        e = 2 * config.gru_hidden if arm == "bahdanau" else d
        if arm == "bahdanau":  # two directions over every leaf
            encoder += n * 2 * 3 * config.gru_hidden * (d + config.gru_hidden)
        else:  # q, k, v, output maps, scores and their weighted sum, the MLP
            encoder += n * (4 * d * d + 2 * n * d + 2 * d * config.ffn_hidden)
        encoder += n * (e * m + e * d) + e * d  # keys, values, h_0
        per_step += d * m + n * m + n * d + d * d  # query, scores, weighted values, output map
    return 2 * (encoder + n * per_step)


# ------------------------------------------------------------------------------------ parameters
PARTS = {
    "embeddings": ("src_embed", "tgt_embed"),
    "decoder": ("gru", "out"),
}  # the rest: encoder_reader


def parameter_parts(model: Translator) -> dict[str, int]:
    """Trainable parameters of each part: `embeddings` (source and target token tables), `decoder` (GRU and
    output layer, the same in every arm) and `encoder_reader`, everything between the source embeddings
    and the decoder: Butterfly, FOLD, READ / attention (with its query map of h_t), positions, encoders,
    the map to h_0. The parts sum to the model's count."""
    parts = {"encoder_reader": 0, "embeddings": 0, "decoder": 0}
    for name, p in model.named_parameters():
        if p.requires_grad:
            part = next(
                (k for k, modules in PARTS.items() if name.split(".")[0] in modules),
                "encoder_reader",
            )
            parts[part] += p.numel()
    return parts


WIDTH_FIELD = {"bahdanau": "gru_hidden", "transformer_enc": "ffn_hidden"}


def matched_width(config: TranslatorConfig, reference: str = "lifting") -> int:
    """The width (gru_hidden for bahdanau, ffn_hidden for transformer_enc) whose encoder + reader
    parameters come closest to the `reference` arm's at the same d_model, hidden, read_dim, heads and
    depth (the count grows with the width: a bisection)."""

    def encoder_reader(cfg: TranslatorConfig) -> int:
        return parameter_parts(Translator(cfg, 16))[
            "encoder_reader"
        ]  # no part but the embeddings sees the vocabulary

    target = encoder_reader(config.model_copy(update={"arm": reference}))
    field = WIDTH_FIELD[config.arm]
    low, high = 1, 1
    while encoder_reader(config.model_copy(update={field: high})) < target:
        low, high = high, 2 * high
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (
            (middle, high)
            if encoder_reader(config.model_copy(update={field: middle})) < target
            else (low, middle)
        )
    return min(
        (low, high),
        key=lambda w: abs(encoder_reader(config.model_copy(update={field: w})) - target),
    )


# ------------------------------------------------------------------------------------ study
class TranslatorStudy(Study):
    """zh<->en translation through TreeHeap (WRITE, Butterfly, FOLD, READ, GRU) vs root-only, dense and no-source."""

    name = "treeheap_translator"
    Config = TranslatorConfig
    # NLLs are nats per target token, far from 0 with a small symmetric seed spread (test_nll 2.70-2.72 for
    # one arm): linear, one unit with the NLL differences damage_*. test_ppl = exp(test_nll), so its log
    # scale is test_nll's linear one. unfold_mse is float rounding (~3e-14) and peak_mem_mb is often exactly
    # 0 (a step that does not raise the peak RSS): linear. Throughput is multiplicative: log scale.
    metrics: ClassVar[dict[str, Metric]] = {
        "train_loss": Metric("lower", "train", 0.0, None, unit="nats"),
        "val_nll": Metric("lower", "validation", 0.0, None, unit="nats"),
        "test_nll": Metric("lower", "test", 0.0, None, unit="nats"),
        "test_ppl": Metric("lower", "test", 1.0, None, scale="log"),
        **{
            f"test_nll_{d}": Metric("lower", "test", 0.0, None, unit="nats")
            for d in ("zh2en", "en2zh")
        },
        "bleu": Metric("higher", "test", 0.0, 100.0),
        "chrf": Metric("higher", "test", 0.0, 100.0),
        **{
            f"{m}_{d}": Metric("higher", "test", 0.0, 100.0)
            for m in ("bleu", "chrf")
            for d in ("zh2en", "en2zh")
        },
        # NLL differences on the test split: no range (an intervention can lower the NLL)
        **{f"damage_{i}": Metric("higher", "test", unit="nats") for i in INTERVENTIONS},
        "unfold_mse": nonnegative("lower", "diagnostic"),
        **{f"stop_mass_depth_{k}": proportion("higher", "diagnostic") for k in range(11)},
        "train_tokens_per_s": positive("higher", "cost", unit="tokens/s"),
        "peak_mem_mb": nonnegative("lower", "cost"),
        "best_val_step": nonnegative(
            "higher", "diagnostic"
        ),  # keep_best: the step whose weights were measured
    }
    machine_metrics = frozenset({"train_tokens_per_s", "peak_mem_mb"})
    hyperparameters = frozenset({"lr", "warmup_steps", "clip_grad_norm", "dropout", "weight_decay"})
    # the data (corpus, its columns and directions, the tokenizer, the split, the leaves a sentence must fit
    # in: depth drops longer pairs) and how test weights are chosen (keep_best: the v2 contracts' early stopping)
    regime_fields = (
        "corpus",
        "languages",
        "directions",
        "vocab_size",
        "depth",
        "valid_fraction",
        "test_fraction",
        "valid_examples",
        "test_examples",
        "keep_best",
    )

    def reported_metrics(self, config: TranslatorConfig) -> frozenset[str]:
        """What run() returns for this arm: per-direction NLL, BLEU and chrF for its directions, the damage of
        the interventions that apply to it, READ's (or all_nodes') stopped mass per depth 0..D, unfold_mse for
        the lifting-form folds, best_val_step with keep_best."""
        names = {
            "train_loss",
            "val_nll",
            "test_nll",
            "test_ppl",
            "bleu",
            "chrf",
            "train_tokens_per_s",
            "peak_mem_mb",
        }
        names |= {f"{m}_{d}" for m in ("test_nll", "bleu", "chrf") for d in config.directions}
        names |= {f"damage_{i}" for i in applicable_interventions(config.arm)}
        if config.arm in (*TREE_ARMS, "all_nodes"):
            names |= {f"stop_mass_depth_{k}" for k in range(config.depth + 1)}
        if config.arm in ("lifting", "bilinear", "root_only", "all_nodes"):
            names.add("unfold_mse")
        if config.keep_best:
            names.add("best_val_step")
        return frozenset(names)

    def chance(self, metric: str, config: TranslatorConfig) -> float | None:
        """A decoder that learned nothing spreads its probability uniformly over the vocab_size pieces (the
        tokenizer has exactly that many): NLL log V nats per token, perplexity V."""
        if metric == "test_ppl":
            return float(self.vocab_size(config))
        if metric in ("train_loss", "val_nll", "test_nll") or metric.startswith("test_nll_"):
            return math.log(self.vocab_size(config))
        return None

    def vocab_size(self, config: TranslatorConfig) -> int:
        return config.vocab_size  # the tokenizer is trained to exactly this size

    def param_count(self, config: TranslatorConfig) -> int:
        return count_parameters(Translator(config, self.vocab_size(config)))

    def parameter_parts(self, config: TranslatorConfig) -> dict[str, int]:
        """Trainable parameters by part (they sum to param_count): see `parameter_parts`."""
        return parameter_parts(Translator(config, self.vocab_size(config)))

    def flops(self, config: TranslatorConfig) -> int:
        return forward_flops(config, self.vocab_size(config))

    def check_ready(self, config: TranslatorConfig) -> str | None:
        from gates.data import check_source

        return check_source(config.corpus, "pairs")

    def run(self, config: TranslatorConfig, seed: int, reporter: Reporter) -> dict[str, float]:
        data = load_data(config)
        seed_everything(seed)
        model = Translator(config, data.vocab_size).to(resolve_device(config.device))
        optimizer = torch.optim.AdamW(
            model.parameters(), lr=config.lr, weight_decay=config.weight_decay
        )
        train, valid, test = data.splits["train"], data.splits["valid"], data.splits["test"]
        valid = valid[: config.valid_examples]
        test = test[: config.test_examples] if config.test_examples else test
        generator = torch.Generator().manual_seed(seed)
        counter = {"step": 0, "tokens": 0, "eval_seconds": 0.0}

        def loss_fn() -> torch.Tensor:
            counter["step"] += 1
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(config, counter["step"])
            rows = torch.randint(len(train), (config.batch_size,), generator=generator).tolist()
            batch = model.batch([train[r] for r in rows])
            loss, n = token_nll(model(batch))
            counter["tokens"] += n
            return loss / n

        best = {"val_nll": math.inf, "state": None, "step": 0}

        def evaluate() -> dict[str, float]:
            started = time.perf_counter()
            val_nll = mean_nll(model, valid, config.batch_size)[0]
            if (
                config.keep_best and val_nll < best["val_nll"]
            ):  # a copy of the weights, kept until a lower one
                best.update(
                    val_nll=val_nll,
                    step=counter["step"],
                    state={k: v.detach().clone() for k, v in model.state_dict().items()},
                )
            counter["eval_seconds"] += time.perf_counter() - started
            return {"val_nll": val_nll}

        started = time.perf_counter()
        last = train_loop(
            model,
            optimizer,
            loss_fn,
            reporter.budget,
            reporter,
            evaluate,
            clip_grad_norm=config.clip_grad_norm,
        )
        train_seconds = time.perf_counter() - started
        if config.keep_best and best["state"] is not None:  # the reported series stays as it was
            model.load_state_dict(best["state"])
            last = {**last, "val_nll": best["val_nll"], "best_val_step": float(best["step"])}
        final = {**last, **self.measure(model, data, test, config, seed, reporter)}
        final["train_tokens_per_s"] = counter["tokens"] / (train_seconds - counter["eval_seconds"])
        final["peak_mem_mb"] = peak_rss_growth_mb(
            lambda: _one_step(model, train, config, generator)
        )
        return final

    def measure(
        self,
        model: Translator,
        data: TranslationData,
        test: list[Example],
        config: TranslatorConfig,
        seed: int,
        reporter: Reporter,
    ) -> dict[str, float]:
        metrics: dict[str, float] = {}
        total, tokens, depth_mass = 0.0, 0, None
        for direction in config.directions:  # pooled over directions, weighted by target tokens
            nll, mass, count = mean_nll(
                model, [e for e in test if e.direction == direction], config.batch_size
            )
            metrics[f"test_nll_{direction}"] = nll
            total, tokens = total + nll * count, tokens + count
            if mass is not None:
                depth_mass = mass * count if depth_mass is None else depth_mass + mass * count
        clean = total / tokens
        metrics["test_nll"], metrics["test_ppl"] = clean, math.exp(min(clean, 50.0))
        depth_mass = depth_mass / tokens if depth_mass is not None else None
        for intervention in applicable_interventions(config.arm):
            metrics[f"damage_{intervention}"] = (
                mean_nll(model, test, config.batch_size, intervention, seed)[0] - clean
            )
        if depth_mass is not None:
            metrics.update({f"stop_mass_depth_{k}": float(v) for k, v in enumerate(depth_mass)})
        if config.arm in ("lifting", "bilinear", "root_only", "all_nodes"):
            metrics["unfold_mse"] = unfold_mse(model, test[:256])

        samples, bleus, chrfs = [], [], []
        for direction in config.directions:
            subset = [e for e in test if e.direction == direction][: config.bleu_examples]
            hypotheses = []
            for start in range(0, len(subset), config.batch_size):
                hypotheses += [
                    data.decode(ids)
                    for ids in translate(
                        model, subset[start : start + config.batch_size], config.beam_size
                    )
                ]
            references = [e.tgt_text for e in subset]
            b, c, b_sig, c_sig = bleu_chrf(hypotheses, references, data.target_language[direction])
            metrics[f"bleu_{direction}"], metrics[f"chrf_{direction}"] = b, c
            bleus.append(b)
            chrfs.append(c)
            samples.append(f"## {direction}: BLEU {b:.2f} ({b_sig}), chrF {c:.2f} ({c_sig})\n")
            for e, hyp in list(zip(subset, hypotheses))[: config.samples]:
                samples.append(
                    f"source:    {e.src_text}\nreference: {e.tgt_text}\noutput:    {hyp}\n"
                )
        metrics["bleu"], metrics["chrf"] = sum(bleus) / len(bleus), sum(chrfs) / len(chrfs)
        attach = getattr(reporter, "attach", None)
        if attach is not None:
            attach("samples.txt", "\n".join(samples))
        return metrics


def _one_step(model: Translator, train: list[Example], config: TranslatorConfig, generator) -> None:
    rows = torch.randint(len(train), (config.batch_size,), generator=generator).tolist()
    batch = model.batch([train[r] for r in rows])
    loss, n = token_nll(model(batch))
    (loss / n).backward()
    model.zero_grad(set_to_none=True)
