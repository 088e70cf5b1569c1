"""The TreeHeap translator's model (seed 001, stage D of seed 000; studies.md section 3): the modules,
decoding, the FLOP count and the parameter parts. The config, data, training loop, metrics and the
study: gates.models.treeheap_translator.study.

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

Arm `factorial` (issue #31) names the encoder and the reader apart (config fields `encoder`, `reader`),
so that any encoder meets any reader it fits (`FITS`: every encoder gives N left-packed d_model-wide
leaf states, so every pair fits):

    encoders  butterfly        the Butterfly (F, G of width `butterfly_hidden`), no positions
              butterfly_relay  the same with empty leaves zeroed, then coupled like present ones (they
                               relay a message but hold no input); equal to butterfly on full sentences
              bigru            packed BiGRU over x + pos (`gru_hidden` per direction), W [fwd, bwd] -> d
              transformer2     two pre-norm Transformer encoder layers over x + pos (`ffn_hidden`), a final LN
    readers   lifting          the lifting FOLD over the encoder's leaf states, then recursive READ
              all_nodes        the same FOLD's 2N - 1 nodes read by one softmax (NodeAttention)
              mha              CrossAttention (multi-head, q / k / v / o maps) over the leaf states
    every cell  h_0 = tanh(W_0 mean of the encoder's leaf states over the occupied leaves)

(one rule for every cell, so that the table does not confound the reader with h_0; the lifting arm's
h_0 = 0 and bahdanau's [last forward, first backward] stay as they were). Empty leaves' encoder states
are zeroed; no reader reads them. `matched_width(config, reference)` sizes the cell's encoder width
(`WIDTH_OF_ENCODER`) to a reference cell's encoder + reader parameters.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from gates.models.translation_data import EOS, PAD, Example, collate
from gates.models.treeheap import (
    Butterfly,
    Fold,
    NodeAttention,
    Read,
    fold_levels,
    mlp,
    random_pairing,
)

if TYPE_CHECKING:  # annotations only: the config lives with the study
    from gates.models.treeheap_translator.study import TranslatorConfig

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
# arm `factorial` (issue #31): any encoder of the source leaves with any reader of their states
ENCODERS = ("butterfly", "butterfly_relay", "bigru", "transformer2")
READERS = ("lifting", "all_nodes", "mha")
BUTTERFLY_ENCODERS = ("butterfly", "butterfly_relay")  # no positions; pair_break applies
# the lifting FOLD over the leaf states, then READ or one softmax over its nodes; detail_shuffle applies
TREE_READERS = ("lifting", "all_nodes")
# which readers each encoder fits: every encoder gives N left-packed d_model-wide leaf states (the
# BiGRU through its output map), which is what every reader takes
FITS = {encoder: READERS for encoder in ENCODERS}
TRANSFORMER_LAYERS = 2  # transformer2
WIDTH_OF_ENCODER = {
    "butterfly": "butterfly_hidden",
    "butterfly_relay": "butterfly_hidden",
    "bigru": "gru_hidden",
    "transformer2": "ffn_hidden",
}  # the field `matched_width` sizes for a factorial cell


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


class PreNormBlock(nn.Module):
    """A pre-norm Transformer encoder layer without EncoderLayer's closing LayerNorm (transformer2 stacks
    them and normalises once at the end): x + SelfAttn(LN(x)), then x + MLP(LN(x))."""

    def __init__(self, d: int, heads: int, hidden: int):
        super().__init__()
        self.heads = heads
        self.ln_attn, self.ln_mlp = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = mlp(d, hidden, d)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        q, k, v = (
            self.qkv(self.ln_attn(x)).unflatten(-1, (3, self.heads, -1)).permute(2, 0, 3, 1, 4)
        )
        attended = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None, None, :])
        x = x + self.proj(attended.transpose(1, 2).flatten(2))
        return x + self.mlp(self.ln_mlp(x))


class TransformerEncoder(nn.Module):
    """`layers` pre-norm Transformer encoder layers and one final LayerNorm (the factorial's
    transformer2); empty leaves are never keys."""

    def __init__(self, d: int, heads: int, hidden: int, layers: int):
        super().__init__()
        self.blocks = nn.ModuleList(PreNormBlock(d, heads, hidden) for _ in range(layers))
        self.ln_out = nn.LayerNorm(d)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x, mask)
        return self.ln_out(x)


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
        if arm not in ("target_only", "factorial", *DENSE_ARMS):
            self.butterfly = Butterfly(d, config.butterfly_hidden or config.hidden, config.depth)
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
        if arm == "factorial":
            self._build_cell(config)
        self.tgt_embed = nn.Embedding(vocab_size, d)
        self.gru = nn.GRUCell(2 * d, d)
        self.out = nn.Linear(2 * d, vocab_size)

    def _build_cell(self, config: TranslatorConfig) -> None:
        """A factorial cell: the encoder (d_model-wide states on the N leaves), the reader, and the map
        to h_0 (every cell: h_0 = tanh(W_0 mean of the encoder's states over the occupied leaves))."""
        d, encoder = config.d_model, config.encoder
        if encoder in BUTTERFLY_ENCODERS:  # no positions, as the lifting arm
            self.butterfly = Butterfly(d, config.butterfly_hidden or config.hidden, config.depth)
        else:  # learned positions, as bahdanau / transformer_enc
            self.positions = nn.Embedding(config.n_leaves, d)
            if encoder == "bigru":
                self.encoder = nn.GRU(d, config.gru_hidden, batch_first=True, bidirectional=True)
                self.encoder_out = nn.Linear(2 * config.gru_hidden, d)  # back to d_model per leaf
            else:
                self.encoder = TransformerEncoder(
                    d, config.heads, config.ffn_hidden, TRANSFORMER_LAYERS
                )
        if config.reader in TREE_READERS:
            self.fold = Fold(d, config.hidden, "lifting")
            self.read = (
                Read(d, d, config.read_dim, config.depth)
                if config.reader == "lifting"
                else NodeAttention(d, d, 2 * config.read_dim, config.depth)
            )
        else:
            self.read = CrossAttention(d, d, config.read_dim, config.heads, d)
        self.init_state = nn.Linear(d, d)

    def _encode_cell(self, leaves, mask, intervention, permutation, generator) -> dict:
        """A factorial cell's memory: the encoder's leaf states (zeroed where a leaf is empty), h_0 from
        their mean over the occupied leaves, and the reader's keys (of the FOLD's nodes, or the leaves)."""
        config = self.config
        if config.encoder in BUTTERFLY_ENCODERS:
            pairing = (
                [
                    (i.to(leaves.device), j.to(leaves.device))
                    for i, j in random_pairing(config.n_leaves, config.depth, generator)
                ]
                if intervention == "pair_break"
                else None
            )
            if config.encoder == "butterfly_relay":
                # empty leaves zeroed, then coupled like present ones: they relay but hold nothing
                states = self.butterfly(leaves * mask.unsqueeze(-1), torch.ones_like(mask), pairing)
            else:
                states = self.butterfly(leaves, mask, pairing)
        elif config.encoder == "bigru":  # packed: padding never enters either direction
            packed = nn.utils.rnn.pack_padded_sequence(
                leaves + self.positions.weight,
                mask.sum(1).cpu(),
                batch_first=True,
                enforce_sorted=False,
            )
            out = nn.utils.rnn.pad_packed_sequence(
                self.encoder(packed)[0], batch_first=True, total_length=leaves.shape[1]
            )[0]
            states = self.encoder_out(out)
        else:
            states = self.encoder(leaves + self.positions.weight, mask)
        keep = mask.unsqueeze(-1)
        states = torch.where(keep, states, 0.0)
        memory = {"h0": torch.tanh(self.init_state(states.sum(1) / keep.sum(1)))}
        if config.reader in TREE_READERS:
            detail_source = (lambda d: d[permutation]) if intervention == "detail_shuffle" else None
            levels, details, masks = fold_levels(self.fold, states, mask, detail_source)
            memory.update(
                states=levels,
                details=details,
                masks=masks,
                root=levels[0][:, 0],
                read=self.read.keys(levels, masks),
            )
        else:
            memory["read"] = self.read.keys(states, mask)
        return memory

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
        if arm == "factorial":
            return self._encode_cell(leaves, mask, intervention, permutation, generator)
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
        if arm in READER_ARMS or arm == "factorial":
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
        if arm in READER_ARMS or arm == "factorial":
            weight, bias = self.read.query_weights()
            weights.append(weight)
            biases.append(bias)
        elif arm == "flat_seq":
            weights.append(self.attn_query.weight)
            biases.append(self.attn_query.bias)
        return Fused(torch.cat(weights), torch.cat(biases), self.gru.weight_ih[:, d:])

    def initial_state(self, memory: dict, like: torch.Tensor) -> torch.Tensor:
        """h_0: from the encoder for the dense baselines and every factorial cell, else 0 (the source
        reaches the decoder only through c_t)."""
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


# ------------------------------------------------------------------------------------ sizes
def forward_flops(config: TranslatorConfig, vocab_size: int) -> int:
    """Multiply-adds x 2 of one example's forward pass with every leaf full and T = N target steps."""
    d, h, m, n = config.d_model, config.hidden, config.read_dim, config.n_leaves
    arm, nodes = config.arm, 2 * n - 1
    if arm == "factorial":
        return _cell_flops(config, vocab_size)
    encoder = 0 if arm in ("target_only", *DENSE_ARMS) else _butterfly_flops(config)
    if arm in FOLD_ARMS:
        per_parent = 2 * d * h + {
            "mlp": 3 * d * config.merge_hidden,
            "bilinear": 2 * d * h + 3 * d * config.relation_rank,
        }.get(config.arm, 2 * d * h)
        encoder += (n - 1) * per_parent
    per_step = _decoder_step_flops(d, vocab_size)
    if arm in TREE_ARMS:
        keys, step = _tree_read_flops(d, m, nodes)
        encoder, per_step = encoder + keys, per_step + step
    if arm == "flat_seq":
        encoder += n * (d * config.attn_hidden + config.attn_hidden * m)
        per_step += d * m + n * m + n * d
    if arm == "all_nodes":
        encoder += nodes * d * 2 * m
        per_step += d * 2 * m + nodes * 2 * m + nodes * d
    if arm in DENSE_ARMS:
        if arm == "bahdanau":
            e = 2 * config.gru_hidden
            encoder += _bigru_flops(n, d, config.gru_hidden)
        else:
            e = d
            encoder += _transformer_layer_flops(n, d, config.ffn_hidden)
        keys, step = _dense_read_flops(n, d, m, e)
        encoder += keys + e * d  # keys and values, h_0
        per_step += step
    return 2 * (encoder + n * per_step)


def _cell_flops(config: TranslatorConfig, vocab_size: int) -> int:
    """`forward_flops` of a factorial cell: its encoder, its reader, h_0, the decoder."""
    d, h, m, n = config.d_model, config.hidden, config.read_dim, config.n_leaves
    nodes = 2 * n - 1
    if config.encoder in BUTTERFLY_ENCODERS:  # relay: F and G on every pair anyway
        encoder = _butterfly_flops(config)
    elif config.encoder == "bigru":  # then the map back to d
        encoder = _bigru_flops(n, d, config.gru_hidden) + n * 2 * config.gru_hidden * d
    else:
        encoder = TRANSFORMER_LAYERS * _transformer_layer_flops(n, d, config.ffn_hidden)
    encoder += d * d  # h_0
    per_step = _decoder_step_flops(d, vocab_size)
    if config.reader in TREE_READERS:
        encoder += (n - 1) * 2 * (2 * d * h)  # the lifting FOLD's P and U~ at every parent
        keys, step = _tree_read_flops(d, m, nodes)  # all_nodes: one key of width 2m, the same count
    else:
        keys, step = _dense_read_flops(n, d, m, d)
    return 2 * (encoder + keys + n * (per_step + step))


# the parts both count (multiply-adds); a read part is (once per example, per target step)
def _butterfly_flops(config: TranslatorConfig) -> int:
    """F and G on every pair at every level."""
    d, n = config.d_model, config.n_leaves
    return config.depth * (n // 2) * 2 * (2 * d * (config.butterfly_hidden or config.hidden))


def _bigru_flops(n: int, d: int, g: int) -> int:
    """Two directions of a GRU of width g over every leaf."""
    return n * 2 * 3 * g * (d + g)


def _transformer_layer_flops(n: int, d: int, ffn: int) -> int:
    """q, k, v and output maps, scores and their weighted sum, the MLP."""
    return n * (4 * d * d + 2 * n * d + 2 * d * ffn)


def _decoder_step_flops(d: int, vocab_size: int) -> int:
    """The GRU cell and the output layer."""
    return 3 * (2 * d * d + d * d) + 2 * d * vocab_size


def _tree_read_flops(d: int, m: int, nodes: int) -> tuple[int, int]:
    """Stop and branch keys at every node; per step the query and the descent."""
    return nodes * 2 * d * m, 2 * d * m + 2 * nodes * m + nodes * d


def _dense_read_flops(n: int, d: int, m: int, e: int) -> tuple[int, int]:
    """Keys and values of n states of width e; per step the query, scores, weighted values, output map."""
    return n * (e * m + e * d), d * m + n * m + n * d + d * d


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


def matched_width(config: TranslatorConfig, reference: str | dict = "lifting") -> int:
    """The width (gru_hidden for bahdanau, ffn_hidden for transformer_enc; for a factorial cell its
    encoder's: `WIDTH_OF_ENCODER`) whose encoder + reader parameters come closest to the `reference`
    arm's at the same d_model, hidden, read_dim, heads and depth (the count grows with the width: a
    bisection). `reference` is an arm name or the fields that make the reference config from this
    one (a cell: {"arm": "factorial", "encoder": ..., "reader": ..., its width})."""

    def encoder_reader(cfg: TranslatorConfig) -> int:
        return parameter_parts(Translator(cfg, 16))[
            "encoder_reader"
        ]  # no part but the embeddings sees the vocabulary

    update = {"arm": reference} if isinstance(reference, str) else reference
    target = encoder_reader(config.model_copy(update=update))
    field = (
        WIDTH_OF_ENCODER[config.encoder] if config.arm == "factorial" else WIDTH_FIELD[config.arm]
    )
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
