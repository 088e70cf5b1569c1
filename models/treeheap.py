"""TreeHeap's parts (seed 001; studies.md section 3), each as the spec writes it.

Shapes: B sentences, N = 2^D leaves, d features. Leaves are left-packed: leaf i holds piece i of
the sentence, `mask` (B x N, bool) is True where a leaf holds a piece. Nodes are kept per level,
level 0 = the root (1 node), level D = the leaves; node i of level k has children 2i and 2i + 1
of level k + 1. Left-packing is kept by every level: node i is occupied iff child 2i is.

    Butterfly, round s:  pair (a, b) = (x_i, x_j), j = i XOR 2^s, i < j
                         b' = b + alpha_s tanh(F(a));  a' = a + alpha_s tanh(G(b'))
                         inverse: a = a' - alpha_s tanh(G(b'));  b = b' - alpha_s tanh(F(a))
    FOLD (lifting):      d = r - P(l);  p = l + U(d),  U(d) = 0.5 d + 0.5 tanh(U~(d)),  U~ = 0 at init
    UNFOLD:              l = p - U(d);  r = d + P(l)
    FOLD (mlp):          d = r - P(l);  p = MLP([l, r])                      (a generic learned merge)
    FOLD (bilinear):     d = r - P(l);  p = l + U(d) + g W_o((A l) * (B r))  (g = 0 zeroes the relation branch)
    READ, query h:       mass 1 at the root; at node n of depth k: p_stop = sigmoid(q_s(h).K_s(n + e_k) / sqrt(m)),
                         the rest splits over the children by softmax_c(q_b(h).K_b(n_c) / sqrt(m));
                         leaves stop all mass that reaches them;  context = sum_nodes stopped mass x n
    NodeAttention:       the same nodes with one softmax, no recursion (the all_nodes control):
                         w_n = softmax_n(q(h).K(n + e_k) / sqrt(m)) over every occupied node;  context = sum_n w_n n

Padding never reaches a real leaf: a Butterfly pair with an empty member is the identity, a fold
whose right child is empty passes the left child up (d = 0), READ gives empty subtrees no mass.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def mlp(d_in: int, hidden: int, d_out: int, zero_last: bool = False) -> nn.Sequential:
    net = nn.Sequential(nn.Linear(d_in, hidden), nn.GELU(), nn.Linear(hidden, d_out))
    if zero_last:
        nn.init.zeros_(net[2].weight)
        nn.init.zeros_(net[2].bias)
    return net


def xor_pairing(n_leaves: int, rounds: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per round s: (indices i with bit s clear, their partners i XOR 2^s)."""
    pairing = []
    for s in range(rounds):
        first = torch.tensor([i for i in range(n_leaves) if not i & (1 << s)])
        pairing.append((first, first ^ (1 << s)))
    return pairing


def random_pairing(
    n_leaves: int, rounds: int, generator: torch.Generator
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The pair_break intervention: each round pairs the leaves by a random perfect matching."""
    pairing = []
    for _ in range(rounds):
        order = torch.randperm(n_leaves, generator=generator)
        pairing.append((order[0::2], order[1::2]))
    return pairing


class Butterfly(nn.Module):
    def __init__(self, d: int, hidden: int, depth: int):
        super().__init__()
        self.F, self.G = mlp(d, hidden, d), mlp(d, hidden, d)
        self.alpha = nn.Parameter(torch.full((depth,), 0.5))

    def _couple(self, s: int, a, b, both, inverse: bool = False):
        """Round s on pairs (a, b): b' = b + alpha_s tanh(F(a)); a' = a + alpha_s tanh(G(b')), or its inverse."""
        if inverse:
            a = torch.where(both, a - self.alpha[s] * torch.tanh(self.G(b)), a)
            return a, torch.where(both, b - self.alpha[s] * torch.tanh(self.F(a)), b)
        b = torch.where(both, b + self.alpha[s] * torch.tanh(self.F(a)), b)
        return torch.where(both, a + self.alpha[s] * torch.tanh(self.G(b)), a), b

    def _rounds(self, x, mask, pairing, inverse: bool):
        """Every round in order (or reversed, inverted); `pairing` None is the XOR pairing, else per round
        (first members, their partners), e.g. `xor_pairing` or `random_pairing`."""
        rounds = range(len(self.alpha))
        for s in reversed(rounds) if inverse else rounds:
            if pairing is None:
                # XOR pairing as a view: leaf i = (block, bit s, low bits), its partner differs in bit s only
                x4 = x.unflatten(1, (-1, 2, 2**s))
                m4 = mask.unflatten(1, (-1, 2, 2**s))
                both = (m4[:, :, 0] & m4[:, :, 1]).unsqueeze(
                    -1
                )  # a pair with an empty member is the identity
                a, b = self._couple(s, x4[:, :, 0], x4[:, :, 1], both, inverse)
                x = torch.stack([a, b], 2).flatten(1, 3)
            else:
                i, j = pairing[s]
                both = (mask[:, i] & mask[:, j]).unsqueeze(-1)
                a, b = self._couple(s, x[:, i], x[:, j], both, inverse)
                x = x.index_copy(1, i, a).index_copy(1, j, b)
        return x

    def forward(self, x: torch.Tensor, mask: torch.Tensor, pairing=None) -> torch.Tensor:
        return self._rounds(x, mask, pairing, inverse=False)

    def inverse(self, y: torch.Tensor, mask: torch.Tensor, pairing=None) -> torch.Tensor:
        return self._rounds(y, mask, pairing, inverse=True)


class Fold(nn.Module):
    """One FOLD step shared by all levels: children (l, r) -> (parent p, detail d)."""

    def __init__(
        self,
        d: int,
        hidden: int,
        kind: str = "lifting",
        relation_rank: int = 0,
        merge_hidden: int = 0,
    ):
        super().__init__()
        self.kind = kind
        self.P = mlp(d, hidden, d)  # predicts the right child from the left
        if kind == "mlp":
            self.merge = mlp(2 * d, merge_hidden or hidden, d)
        else:
            self.U_tilde = mlp(d, hidden, d, zero_last=True)
        if kind == "bilinear":
            self.rel_A = nn.Linear(d, relation_rank, bias=False)
            self.rel_B = nn.Linear(d, relation_rank, bias=False)
            self.rel_out = nn.Linear(relation_rank, d, bias=False)
        self.relation_gate = 1.0  # the relation_zero intervention sets 0.0

    def U(self, d: torch.Tensor) -> torch.Tensor:
        return 0.5 * d + 0.5 * torch.tanh(self.U_tilde(d))

    def parent(self, left, r, d):
        if self.kind == "mlp":
            return self.merge(torch.cat([left, r], -1))
        p = left + self.U(d)
        if self.kind == "bilinear":
            p = p + self.relation_gate * self.rel_out(self.rel_A(left) * self.rel_B(r))
        return p

    def forward(self, left, r, right_present, detail_source=None):
        """(parent, detail). `detail_source` (the detail_shuffle intervention) swaps the detail the
        parent is built from, e.g. for another sentence's, with the right child that detail implies."""
        keep = right_present.unsqueeze(-1)
        d = torch.where(keep, r - self.P(left), torch.zeros_like(r))
        if detail_source is not None:
            used = torch.where(keep, detail_source(d), torch.zeros_like(d))
            return torch.where(keep, self.parent(left, used + self.P(left), used), left), d
        return torch.where(keep, self.parent(left, r, d), left), d

    def unfold(self, p, d, right_present):
        keep = right_present.unsqueeze(-1)
        left = torch.where(keep, p - self.U(d), p)
        return left, d + self.P(left)


def fold_levels(fold: Fold, leaves: torch.Tensor, mask: torch.Tensor, detail_source=None):
    """FOLD every level: (states per level root first, details per level root first, masks per level).

    `detail_source`: see Fold.forward."""
    states, details, masks = [leaves], [], [mask]
    x = leaves
    while x.shape[1] > 1:
        left, r = x[:, 0::2], x[:, 1::2]
        present_l, present_r = mask[:, 0::2], mask[:, 1::2]
        x, d = fold(left, r, present_r, detail_source)
        mask = present_l | present_r
        x = x * mask.unsqueeze(-1)
        states.append(x)
        details.append(d)
        masks.append(mask)
    return states[::-1], details[::-1], masks[::-1]


def unfold_levels(
    fold: Fold, root: torch.Tensor, details: list[torch.Tensor], masks: list[torch.Tensor]
):
    """UNFOLD from the root and the details (root first) back to the leaves."""
    x = root
    for d, child_mask in zip(details, masks[1:]):
        left, r = fold.unfold(x, d, child_mask[:, 1::2])
        x = torch.stack([left, r], 2).flatten(1, 2)
    return x


def heap_nodes(states: list[torch.Tensor], masks: list[torch.Tensor]):
    """Every level's nodes in one row, heap order (root first; node n's children are 2n + 1, 2n + 2):
    (nodes B x (2N - 1) x d, each node's depth (2N - 1), occupied B x (2N - 1))."""
    nodes = torch.cat(states, 1)
    depth = torch.cat(
        [torch.full((s.shape[1],), k, device=nodes.device) for k, s in enumerate(states)]
    )
    return nodes, depth, torch.cat(masks, 1)


class Read(nn.Module):
    """Recursive READ with stop / branch mass; mass is conserved at every node."""

    def __init__(self, d_query: int, d: int, m: int, depth: int):
        super().__init__()
        self.m, self.depth = m, depth
        self.depth_embedding = nn.Parameter(torch.zeros(depth + 1, d))
        self.q_stop, self.k_stop = nn.Linear(d_query, m), nn.Linear(d, m, bias=False)
        self.q_branch, self.k_branch = nn.Linear(d_query, m), nn.Linear(d, m, bias=False)
        parent = (
            torch.arange(1, 2 ** (depth + 1) - 1).sub(1).div(2, rounding_mode="floor")
        )  # of nodes 1, 2, ...
        self.register_buffer("parent", parent, persistent=False)

    def keys(self, states: list[torch.Tensor], masks: list[torch.Tensor]) -> dict:
        """Per-sentence projections, computed once and reused at every decoder step."""
        nodes, depth, mask = heap_nodes(states, masks)
        # stop and branch keys side by side (B x 2 x nodes x m): one batched product per decoder step
        keys = torch.stack(
            [self.k_stop(nodes + self.depth_embedding[depth]), self.k_branch(nodes)], 1
        )
        return {"nodes": nodes, "keys": keys, "mask": mask}

    def query_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The stop and branch query maps stacked into one (2m x d_query), for a caller that fuses them
        with its own maps of h."""
        return (
            torch.cat([self.q_stop.weight, self.q_branch.weight]),
            torch.cat([self.q_stop.bias, self.q_branch.bias]),
        )

    def masses(self, h: torch.Tensor, keys: dict) -> torch.Tensor:
        """Stopped mass per node for decoder states h (see `masses_for`)."""
        weight, bias = self.query_weights()
        return self.masses_for(F.linear(h, weight, bias), keys)

    def masses_for(self, queries: torch.Tensor, keys: dict) -> torch.Tensor:
        """Stopped mass per node (B x (2N - 1), heap order: node n's children are 2n + 1, 2n + 2), from
        the stop and branch queries side by side (B x 2m).

        The recursion m_stop = m p_stop, m_child = (m - m_stop) P(child) in log space: the mass
        reaching a child is its parent's times (1 - p_stop(parent)) P(child | parent), one level of
        nodes at a time (O(N) per query)."""
        h = queries
        queries = queries.unflatten(1, (2, self.m))  # B x 2 x m
        stop_logit, branch_logit = (
            torch.einsum("bsnm,bsm->bsn", keys["keys"], queries) * (1 / math.sqrt(self.m))
        ).unbind(1)
        branch_logit = branch_logit.masked_fill(~keys["mask"], -1e9)  # empty subtrees get no mass
        log_branch = torch.log_softmax(branch_logit[:, 1:].unflatten(1, (-1, 2)), -1).flatten(1)
        log_edge = log_branch - F.softplus(
            stop_logit[:, self.parent]
        )  # log (1 - p_stop(parent)) P(child)
        log_reach = [h.new_zeros(h.shape[0], 1)]
        for k in range(1, self.depth + 1):  # level k's edges are log_edge[:, 2^k - 2 : 2^(k+1) - 2]
            log_reach.append(
                log_reach[-1].repeat_interleave(2, 1) + log_edge[:, 2**k - 2 : 2 ** (k + 1) - 2]
            )
        log_reach = torch.cat(log_reach, 1)
        internal = 2**self.depth - 1
        p_stop = torch.cat(
            [
                torch.sigmoid(stop_logit[:, :internal]),  # leaves stop all mass that reaches them
                h.new_ones(h.shape[0], 2**self.depth),
            ],
            1,
        )
        return log_reach.exp() * p_stop

    def forward(self, h: torch.Tensor, keys: dict) -> tuple[torch.Tensor, torch.Tensor]:
        return self.read_for(F.linear(h, *self.query_weights()), keys)

    def read_for(self, queries: torch.Tensor, keys: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """(context = sum over nodes of stopped mass x node state, the masses) for queries (B x 2m)."""
        mass = self.masses_for(queries, keys)
        return torch.einsum("bn,bnd->bd", mass, keys["nodes"]), mass


class NodeAttention(nn.Module):
    """The all_nodes control for READ: dense attention over the same 2N - 1 nodes (leaves and parents)
    with one softmax instead of the stop / branch recursion, w_n = softmax_n(q(h).K(n + e_k) / sqrt(m))
    over the occupied nodes, context = sum_n w_n n (no value map, like READ). With m twice READ's it
    has exactly READ's parameters: READ's stop and branch maps side by side."""

    def __init__(self, d_query: int, d: int, m: int, depth: int):
        super().__init__()
        self.m = m
        self.depth_embedding = nn.Parameter(torch.zeros(depth + 1, d))
        self.query, self.key = nn.Linear(d_query, m), nn.Linear(d, m, bias=False)

    def keys(self, states: list[torch.Tensor], masks: list[torch.Tensor]) -> dict:
        nodes, depth, mask = heap_nodes(states, masks)
        return {"nodes": nodes, "keys": self.key(nodes + self.depth_embedding[depth]), "mask": mask}

    def query_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.query.weight, self.query.bias

    def read_for(self, queries: torch.Tensor, keys: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """(context, the attention weight per node: B x (2N - 1), heap order, 0 on empty nodes)."""
        scores = torch.einsum("bnm,bm->bn", keys["keys"], queries) * (1 / math.sqrt(self.m))
        weights = torch.softmax(scores.masked_fill(~keys["mask"], -math.inf), -1)
        return torch.einsum("bn,bnd->bd", weights, keys["nodes"]), weights
