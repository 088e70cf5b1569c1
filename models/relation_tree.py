"""Relation closure on a tree: can a parent summarise how its leaves answer queries? (seed 000, SPR-096)

The math of stages B and C of studies.md section 2, independent of where the keys come from (a
frozen teacher's per-context trees, or one pooled memory bank). Everything is plain tensors.

Shapes and conventions.
- `keys (T, N, d)`: T independent trees, N = 2^D leaves each, d the key width.
- queries: `(Q, d)` shared by every tree (a memory bank read by held-out queries), or `(T, Q, d)`,
  one query set per tree (per-context trees: each window's queries read its own keys). Every
  function takes either; internally queries are `(T, Q, d)` (a broadcast view when shared).
- Heap order. A topology is a permutation `leaf_order (T, N)`: heap position i holds original leaf
  `leaf_order[t, i]`. Positions 0..N-1 are the bottom level of a complete binary tree read left to
  right, so node j at depth k (0 = root) covers positions [j 2^(D-k), (j+1) 2^(D-k)) and its
  children are nodes 2j and 2j+1 at depth k+1. Internal nodes are numbered breadth first over the
  whole tree, flat index 2^k - 1 + j (N - 1 of them); `log_prior` uses the same numbering over all
  2N - 1 nodes (leaves at 2^D - 1 + i). Reads return leaves as heap positions; map them back with
  `leaf_order.gather(1, ...)` when original ids are wanted.

Exact objects (the ground truth; SPR-096 section 4):
    s_l(q) = q.k_l / sqrt(d)                       leaf score
    P_dense(l | q) = softmax_l s_l(q)              dense posterior
    z_p(q) = logsumexp_{l in D(p)} s_l(q)          parent response, exactly recursive:
    z_p = logsumexp(z_L, z_R)
    P(c | q, p) = softmax_c (z_c(q) + log pi_{c|p})           routing at a parent
    P_tree(l | q) = prod over the path of P(c_d | q, p_d)     tree posterior (== P_dense for exact z)

Stage B replaces z_p of every internal node by a fitted z^_p (`SingleKeyParent`, `PrototypeParent`,
`LowRankParent`, `MLPParent`; `OracleParent` is exact z) and fits all nodes of all trees jointly
to minimise the closure error E_q (z^_p(q) - z_p(q))^2 (`fit_parents`). Leaves always keep their
exact score: a parent summarises its leaves, a leaf is its own key.

Stage C reads with the fitted parents: the full soft read (`full_read`, `leaf_kl`), the
resolution read (`kl_at_depth`, `node_kl_at_depth`), and two cheap reads that visit a few nodes
(`beam_read`, `drilldown_read`), scored by `topk_recall`, visited nodes, latency (`time_read`) and
an accounting of bytes (`ByteAccount`). `soft_read_metrics` and `cheap_read_metrics` gather the
metric dicts of studies.md section 2.

Cost note. Scoring every internal node for Q queries costs Q x (N-1) x m x d multiply-adds and
holds a (Q, N-1, m) tensor (the MLP: (Q, N-1, hidden)); the soft read and fitting therefore take
queries in chunks / minibatches. The cheap reads gather only the nodes they score: per query and
depth 2 x beam x (numbers per node) values, copied without reuse across queries, whereas the dense
read streams the N keys once for the whole query batch through one matmul. Fewer visited nodes
therefore need not mean lower batch latency on a CPU: measure both (`time_read`).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from gates.models.common import count_parameters

TopologyKind = Literal["positional", "random", "learned", "kmeans"]
ParentKind = Literal["single_key", "prototypes", "lowrank", "mlp", "oracle"]
PROTOTYPE_SPREAD = 0.5  # initial prototypes sit halfway between the block mean and a descendant key


# ------------------------------------------------------------------------------------ shapes
def tree_depth(num_leaves: int) -> int:
    """D for N = 2^D leaves (N >= 2)."""
    depth = num_leaves.bit_length() - 1
    if num_leaves < 2 or 2**depth != num_leaves:
        raise ValueError(f"the number of leaves must be a power of two >= 2, got {num_leaves}")
    return depth


def tree_queries(queries: torch.Tensor, num_trees: int) -> torch.Tensor:
    """(Q, d) shared queries or (T, Q, d) per-tree queries -> (T, Q, d) (a view when shared)."""
    if queries.dim() == 2:
        return queries.unsqueeze(0).expand(num_trees, -1, -1)
    if queries.dim() != 3 or queries.shape[0] != num_trees:
        raise ValueError(
            f"queries must be (Q, d) or ({num_trees}, Q, d), got {tuple(queries.shape)}"
        )
    return queries


def select_queries(queries: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Rows `index` of the query set, whichever of the two layouts it has."""
    return queries[index] if queries.dim() == 2 else queries[:, index]


def query_chunks(queries: torch.Tensor, chunk: int):
    """Consecutive query blocks of at most `chunk` (memory batching, not a per-query loop)."""
    num_queries = queries.shape[-2]
    for start in range(0, num_queries, chunk):
        yield select_queries(
            queries, torch.arange(start, min(start + chunk, num_queries), device=queries.device)
        )


def heap_keys(keys: torch.Tensor, leaf_order: torch.Tensor) -> torch.Tensor:
    """Keys (T, N, d) rearranged into heap order: row i of tree t is key leaf_order[t, i]."""
    return keys.gather(1, leaf_order.unsqueeze(-1).expand(-1, -1, keys.shape[-1]))


def leaf_scores(keys_heap: torch.Tensor, queries: torch.Tensor) -> torch.Tensor:
    """s_l(q) = q.k_l / sqrt(d) for every leaf: (T, Q, N)."""
    q = tree_queries(queries, keys_heap.shape[0])
    return q @ keys_heap.transpose(1, 2) / math.sqrt(keys_heap.shape[-1])


def block_sizes(depth: int) -> torch.Tensor:
    """Leaves under each internal node, BFS order: (N-1,) = 2^(D-k) for a node at depth k."""
    return torch.cat([torch.full((2**k,), 2.0 ** (depth - k)) for k in range(depth)])


def internal_levels(flat: torch.Tensor) -> list[torch.Tensor]:
    """Split (..., N-1) BFS-ordered internal-node values into per-depth views (..., 2^k), k < D."""
    depth = tree_depth(flat.shape[-1] + 1)
    return list(flat.split([2**k for k in range(depth)], dim=-1))


def resolution_depths(depth: int) -> list[int]:
    """t in {1, 2, 4, ...} up to D, and D itself."""
    return sorted({2**i for i in range(depth.bit_length()) if 2**i <= depth} | {depth})


# ------------------------------------------------------------------------------------ topology
def build_topology(
    kind: TopologyKind, keys: torch.Tensor, generator: torch.Generator, power_iterations: int = 32
) -> torch.Tensor:
    """leaf_order (T, N): the leaves of each tree in heap order. Same shape for every kind.

    - positional: the identity (text order).
    - random: an independent uniform permutation per tree.
    - learned: recursive balanced bisection by the keys. At depth k every block of 2^(D-k)
      positions (all blocks of all trees at once) is sorted by its projection on the block's first
      principal component (`principal_split`): the lower half becomes the left child, the upper
      half the right. Sorting within a block keeps it contiguous, so the next depth refines it.
      D levels, a loop over depths only.
    - kmeans: the same recursion with each split a balanced 2-means of the block (`kmeans_split`):
      a clustering of the keys by distance rather than by their direction of largest spread.
    """
    num_trees, num_leaves, width = keys.shape
    depth = tree_depth(num_leaves)
    identity = torch.arange(num_leaves, device=keys.device).expand(num_trees, -1)
    if kind == "positional":
        return identity.clone()
    if kind == "random":
        noise = torch.rand(num_trees, num_leaves, generator=generator, dtype=torch.float64)
        return noise.to(keys.device).argsort(dim=1)
    if kind == "kmeans":
        split = partial(kmeans_split, generator=generator)
    elif kind == "learned":
        split = partial(principal_split, generator=generator, iterations=power_iterations)
    else:
        raise ValueError(f"unknown topology {kind!r}")
    order = identity.clone()
    for k in range(depth):
        size = num_leaves >> k
        blocks = heap_keys(keys, order).reshape(num_trees * 2**k, size, width)
        within = split(blocks)
        order = (
            order.reshape(num_trees * 2**k, size).gather(1, within).reshape(num_trees, num_leaves)
        )
    return order


def principal_split(
    blocks: torch.Tensor, generator: torch.Generator, iterations: int = 32
) -> torch.Tensor:
    """A median split of each block (B, size, d) along its first principal component: the positions
    sorted by their projection on it, (B, size). The component comes from power iteration on
    X^T X v of the centred block, batched over blocks."""
    centred = blocks - blocks.mean(dim=1, keepdim=True)
    direction = torch.randn(
        len(blocks), 1, blocks.shape[-1], generator=generator, dtype=blocks.dtype
    ).to(blocks.device)
    for _ in range(iterations):  # v <- X^T X v: the leading eigenvector of the scatter
        # elementwise products and sums, not bmm: deep levels are 2^k tiny (size x d) blocks
        projection = (centred * direction).sum(dim=-1, keepdim=True)  # (blocks, size, 1)
        direction = (centred * projection).sum(dim=1, keepdim=True)  # (blocks, 1, d)
        direction = direction / direction.norm(dim=-1, keepdim=True).clamp_min(1e-30)
    projection = (centred * direction).sum(dim=-1)  # (blocks, size)
    return projection.argsort(dim=1, stable=True)  # median split = first half vs second half


def kmeans_split(
    blocks: torch.Tensor, generator: torch.Generator, iterations: int = 16
) -> torch.Tensor:
    """A balanced 2-means of each block (B, size, d): the positions sorted so that the first half is
    one cluster and the second the other, (B, size). Seeded as k-means++ does with two centres (a
    point drawn at random, then the point farthest from it); then Lloyd steps in which each point's
    side is its rank by |x - c0|^2 - |x - c1|^2 (the half nearest c0 relative to c1 goes left: the
    balanced assignment that minimises the within-cluster squared distances given the centres), and
    each centre the mean of its half."""
    count, size, width = blocks.shape
    half = size // 2
    rows = torch.arange(count, device=blocks.device)
    first = torch.randint(size, (count,), generator=generator).to(blocks.device)
    c0 = blocks[rows, first]
    c1 = blocks[rows, ((blocks - c0[:, None]) ** 2).sum(-1).argmax(dim=1)]
    within = torch.arange(size, device=blocks.device).expand(count, -1)
    for _ in range(iterations):
        side = ((blocks - c0[:, None]) ** 2).sum(-1) - ((blocks - c1[:, None]) ** 2).sum(-1)
        within = side.argsort(dim=1, stable=True)
        ordered = blocks.gather(1, within.unsqueeze(-1).expand(-1, -1, width))
        c0, c1 = ordered[:, :half].mean(dim=1), ordered[:, half:].mean(dim=1)
    return within


# ------------------------------------------------------------------------------------ exact responses
def exact_node_scores(scores: torch.Tensor) -> list[torch.Tensor]:
    """z of every node, per depth: [z_0 (..., 1), z_1 (..., 2), ..., z_D (..., N) = the leaf scores].

    Bottom up, z_p = logsumexp(z_L, z_R): children 2j, 2j+1 are adjacent, so one reshape pairs them.
    """
    depth = tree_depth(scores.shape[-1])
    levels = [scores]
    for _ in range(depth):
        # logaddexp of the even and odd children: elementwise, ~10x faster on CPU than a
        # logsumexp over a trailing dimension of size 2
        levels.insert(0, torch.logaddexp(levels[0][..., 0::2], levels[0][..., 1::2]))
    return levels


def exact_internal_scores(scores: torch.Tensor) -> torch.Tensor:
    """z of the N-1 internal nodes, BFS order: (..., N-1). The closure target.

    The same logaddexp levels as `exact_node_scores`, each written straight into its slice of the
    result (depth k at 2^k - 1 .. 2^(k+1) - 2) rather than concatenated afterwards: the same numbers,
    one allocation and no copy per fit step."""
    num_leaves = scores.shape[-1]
    depth = tree_depth(num_leaves)
    internal = scores.new_empty(*scores.shape[:-1], num_leaves - 1)
    below = scores
    for k in reversed(range(depth)):
        level = internal[..., 2**k - 1 : 2 ** (k + 1) - 1]
        torch.logaddexp(below[..., 0::2], below[..., 1::2], out=level)
        below = level
    return internal


# ------------------------------------------------------------------------------------ parents
class _SmallLogSumExp(torch.autograd.Function):
    """logsumexp over a short axis (the m prototypes of a node) that keeps exp(x - max) for its backward.

    Forward: the operations of torch.logsumexp (max, shift, exp, sum, log, add back; an infinite max
    shifts by 0). Backward: grad x exp(x - max) / sum, one pass over what the forward kept, where
    torch.logsumexp's backward recomputes exp(x - result) from its saved input (a subtraction, an exp
    and a product over all Q x (N-1) x m logits, per fit step). Gradients equal up to float32 rounding
    (the softmax weights computed as a ratio rather than as an exp of a difference).
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, dim: int) -> torch.Tensor:
        shift = x.amax(dim=dim, keepdim=True)
        shift.masked_fill_(shift.isinf(), 0.0)
        exp = (x - shift).exp_()
        total = exp.sum(dim=dim, keepdim=True)
        ctx.save_for_backward(exp, total)
        ctx.dim = dim
        return total.log().add_(shift).squeeze(dim)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        exp, total = ctx.saved_tensors
        return exp * (grad.unsqueeze(ctx.dim) / total), None


def small_logsumexp(x: torch.Tensor, dim: int) -> torch.Tensor:
    """logsumexp of x over `dim`, a short axis (see `_SmallLogSumExp`); torch's own under no_grad."""
    if not (torch.is_grad_enabled() and x.requires_grad):
        return x.logsumexp(dim=dim)
    return _SmallLogSumExp.apply(x, dim)


def _gather_nodes(table: torch.Tensor, nodes: torch.Tensor) -> torch.Tensor:
    """table (T, P, ...) per-node parameters, nodes (T, Q, B) -> (T, Q, B, ...)."""
    num_trees, num_nodes = table.shape[:2]
    rows = (
        nodes + num_nodes * torch.arange(num_trees, device=nodes.device).view(-1, 1, 1)
    ).flatten()
    # index_select on a (T P, ...) view: a row copy per node, much faster than 2-d fancy indexing
    return table.flatten(0, 1).index_select(0, rows).view(*nodes.shape, *table.shape[2:])


def init_prototype_keys(
    keys_heap: torch.Tensor, m: int, generator: torch.Generator, spread: float = PROTOTYPE_SPREAD
) -> torch.Tensor:
    """The shared data-driven initialisation: (T, N-1, m, d) starting keys for every internal node.

    k_{p,a} = mean_p + spread (k_{l_a} - mean_p), l_a a uniformly drawn descendant leaf of p (with
    replacement): the block's centre, pulled towards m different leaves so the prototypes start
    apart and inside the block's key cloud. With log weights log(|D(p)| / m) (`init_log_weights`)
    the sum of weights is |D(p)|, so z^_p(0) = log |D(p)| = z_p(0): exact at q = 0, with gradient
    there the prototypes' average, which is the exact gradient (the block mean / sqrt(d)) in
    expectation over the draws. The same function starts single_key (m = 1), lowrank and mlp.
    """
    num_trees, num_leaves, width = keys_heap.shape
    depth = tree_depth(num_leaves)
    per_depth = []
    for k in range(depth):
        blocks = keys_heap.view(num_trees, 2**k, num_leaves >> k, width)
        pick = torch.randint(num_leaves >> k, (num_trees, 2**k, m), generator=generator)
        picked = blocks.gather(2, pick.to(keys_heap.device).unsqueeze(-1).expand(-1, -1, -1, width))
        mean = blocks.mean(dim=2, keepdim=True)
        per_depth.append(mean + spread * (picked - mean))
    return torch.cat(per_depth, dim=1)


def init_log_weights(num_trees: int, depth: int, m: int, like: torch.Tensor) -> torch.Tensor:
    """log(|D(p)| / m) for each of the m prototypes of each internal node: (T, N-1, m)."""
    sizes = block_sizes(depth).to(device=like.device, dtype=like.dtype)
    return (sizes / m).log().view(1, -1, 1).expand(num_trees, -1, m).clone()


class Parent(nn.Module):
    """z^_p(q) for every internal node p of T trees; parameters batched as (T, N-1, ...).

    forward(queries) -> (T, Q, N-1), all internal nodes in BFS order (fitting, the soft read).
    score_nodes(queries, nodes) -> (T, Q, B) for flat internal-node indices nodes (T, Q, B), gathering
    only those nodes' parameters (the cheap reads).
    """

    num_trees: int
    depth: int
    width: int
    numbers_per_node: int  # numbers a cheap read gathers (or computes) per scored node and query

    def _setup(self, keys_heap: torch.Tensor) -> None:
        self.num_trees, num_leaves, self.width = keys_heap.shape
        self.depth = tree_depth(num_leaves)

    def score_nodes(
        self, queries: torch.Tensor, nodes: torch.Tensor, account: ByteAccount | None = None
    ) -> torch.Tensor:
        raise NotImplementedError

    def decayed_parameters(self) -> list[nn.Parameter]:
        """What `fit_parents(weight_decay=)` shrinks towards zero: none unless a parent says so."""
        return []


class SingleKeyParent(Parent):
    """z^_p(q) = q.k_p / sqrt(d) + b_p: one key per node, linear in q (the lower-bound baseline)."""

    def __init__(self, keys_heap: torch.Tensor, generator: torch.Generator):
        super().__init__()
        self._setup(keys_heap)
        self.numbers_per_node = self.width + 1
        self.key = nn.Parameter(
            init_prototype_keys(keys_heap, 1, generator)[:, :, 0]
        )  # (T, N-1, d)
        self.bias = nn.Parameter(
            init_log_weights(self.num_trees, self.depth, 1, keys_heap)[:, :, 0]
        )

    def forward(self, queries: torch.Tensor) -> torch.Tensor:
        q = tree_queries(queries, self.num_trees) / math.sqrt(self.width)
        return q @ self.key.transpose(1, 2) + self.bias.unsqueeze(1)

    def score_nodes(self, queries, nodes, account=None):
        q = tree_queries(queries, self.num_trees) / math.sqrt(self.width)
        key = _gather_nodes(self.key, nodes)  # (T, Q, B, d)
        if account is not None:
            account.live(key, nodes)
        return torch.einsum("tqbd,tqd->tqb", key, q) + _gather_nodes(self.bias, nodes)


class PrototypeParent(Parent):
    """z^_p(q) = log sum_a w_a exp(q.k_{p,a} / sqrt(d)), w_a = exp(log_w_{p,a}) >= 0.

    Computed as logsumexp_a (q.k_{p,a} / sqrt(d) + log_w_{p,a}), so m = 1 is single_key exactly.
    """

    def __init__(self, keys_heap: torch.Tensor, generator: torch.Generator, m: int = 4):
        super().__init__()
        self._setup(keys_heap)
        self.m = m
        self.numbers_per_node = m * (self.width + 1)
        self.keys = nn.Parameter(init_prototype_keys(keys_heap, m, generator))  # (T, N-1, m, d)
        self.log_w = nn.Parameter(init_log_weights(self.num_trees, self.depth, m, keys_heap))

    def forward(self, queries: torch.Tensor) -> torch.Tensor:
        q = tree_queries(queries, self.num_trees) / math.sqrt(self.width)
        num_trees, num_nodes, m, width = self.keys.shape
        # prototype-major: logits (T, Q, m, N-1), so the logsumexp over the m prototypes combines m
        # contiguous rows of N-1 nodes (vectorised), not m numbers at a time; the keys' copy into that
        # order is m (N-1) d numbers per tree, small beside the Q m (N-1) logits
        by_prototype = self.keys.transpose(1, 2).reshape(num_trees, m * num_nodes, width)
        logits = (q @ by_prototype.transpose(1, 2)).unflatten(-1, (m, num_nodes))
        return small_logsumexp(logits + self.log_w.transpose(1, 2).unsqueeze(1), dim=-2)

    def score_nodes(self, queries, nodes, account=None):
        q = tree_queries(queries, self.num_trees) / math.sqrt(self.width)
        keys = _gather_nodes(self.keys, nodes)  # (T, Q, B, m, d): the read's main cost
        if account is not None:
            account.live(keys, nodes)
        logits = torch.einsum("tqbmd,tqd->tqbm", keys, q) + _gather_nodes(self.log_w, nodes)
        return logits.logsumexp(dim=-1)


class LowRankParent(Parent):
    """Prototypes k_{p,a} = B_a c_p: m shared bases B_a (d x r) per tree, coefficients c_p (r) per node.

    z^_p(q) = logsumexp_a (u_a(q).c_p + log_w_{p,a}) with u_a(q) = B_a^T q / sqrt(d), computed once
    per query. Initialisation: the prototype init's per-node mean key projected on the tree's top-r
    principal directions U (eigenvectors of K^T K), c_p = U^T mean_a k_{p,a}; B_a = U plus a small
    per-prototype perturbation so the m prototypes can move apart; log weights as for prototypes.
    """

    def __init__(
        self, keys_heap: torch.Tensor, generator: torch.Generator, m: int = 4, rank: int = 16
    ):
        super().__init__()
        self._setup(keys_heap)
        self.m, self.rank = m, min(rank, self.width)
        self.numbers_per_node = self.rank + 2 * m
        start = init_prototype_keys(keys_heap, m, generator).mean(dim=2)  # (T, N-1, d)
        gram = keys_heap.transpose(1, 2) @ keys_heap  # (T, d, d)
        top = torch.linalg.eigh(gram).eigenvectors[
            ..., -self.rank :
        ]  # (T, d, r), columns unit norm
        nudge = torch.randn(
            self.num_trees, m, self.width, self.rank, generator=generator, dtype=keys_heap.dtype
        ).to(keys_heap.device)
        self.bases = nn.Parameter(
            top.unsqueeze(1) + 0.1 / math.sqrt(self.width) * nudge
        )  # (T, m, d, r)
        self.coef = nn.Parameter(start @ top)  # (T, N-1, r)
        self.log_w = nn.Parameter(init_log_weights(self.num_trees, self.depth, m, keys_heap))

    def _projected_queries(self, queries: torch.Tensor) -> torch.Tensor:
        q = tree_queries(queries, self.num_trees) / math.sqrt(self.width)
        return torch.einsum("tqd,tadr->tqar", q, self.bases)  # (T, Q, m, r)

    def forward(self, queries: torch.Tensor) -> torch.Tensor:
        u = self._projected_queries(queries)
        num_trees, num_queries, m, rank = u.shape
        logits = u.reshape(num_trees, num_queries * m, rank) @ self.coef.transpose(
            1, 2
        )  # (T, Q m, N-1)
        logits = logits.view(
            num_trees, num_queries, m, -1
        )  # (T, Q, m, N-1): prototype-major, as above
        return small_logsumexp(logits + self.log_w.transpose(1, 2).unsqueeze(1), dim=-2)

    def score_nodes(self, queries, nodes, account=None):
        u = self._projected_queries(queries)
        coef = _gather_nodes(self.coef, nodes)  # (T, Q, B, r)
        if account is not None:
            account.live(u, coef, nodes)
        logits = torch.einsum("tqar,tqbr->tqba", u, coef) + _gather_nodes(self.log_w, nodes)
        return logits.logsumexp(dim=-1)


class MLPParent(Parent):
    """z^_p(q) = w2 . gelu(W1 [q, e_p] + b1) + b2 + beta_p: one MLP per tree, shared over its nodes.

    residual: plus q . e_p[:d] / sqrt(d), the node state's first d numbers read as a key, so the MLP
    is a correction to one key per node and represents single_key exactly (w2 = 0, as it starts):
    without it the node state only shifts shared hidden units, and a node-specific linear response
    in q costs many of them (spr096-prototypes-vs-mlp-v2). Needs state_dim >= d.

    Node state = (e_p, beta_p). beta_p is the state's direct path to the output (a skip from the
    state), initialised to log |D(p)| like every other parent's bias/log weights, so no parent
    starts with an advantage on the large depth-dependent offset of z. e_p starts with the single
    prototype init key (mean pulled towards a descendant) in its first min(d, s) coordinates and
    small noise elsewhere; W1 is uniform +-1/sqrt(fan_in), w2 and b2 start at zero (the MLP's
    correction starts at zero). Scoring all nodes holds a (Q, N-1, hidden) tensor: fit with batches
    sized for it. `mlp_shape_matching` picks (state_dim, hidden) for a target parameter count.
    """

    def __init__(
        self,
        keys_heap: torch.Tensor,
        generator: torch.Generator,
        state_dim: int = 64,
        hidden: int = 32,
        residual: bool = False,
    ):
        super().__init__()
        self._setup(keys_heap)
        d, s, h, dtype = self.width, state_dim, hidden, keys_heap.dtype
        if residual and s < d:
            raise ValueError(f"a residual MLP reads a key of {d} numbers from a state of {s}")
        self.residual = residual
        self.numbers_per_node = s + 1 + h

        def uniform(*shape: int) -> torch.Tensor:  # +-1/sqrt(fan_in), fan_in = d + s
            draw = torch.rand(*shape, generator=generator, dtype=dtype) * 2 - 1
            return (draw / math.sqrt(d + s)).to(keys_heap.device)

        state = 0.02 * torch.randn(
            self.num_trees, 2**self.depth - 1, s, generator=generator, dtype=dtype
        )
        state = state.to(keys_heap.device)
        start = init_prototype_keys(keys_heap, 1, generator)[:, :, 0]
        state[..., : min(d, s)] = start[..., : min(d, s)]
        self.state = nn.Parameter(state)  # (T, N-1, s)
        self.beta = nn.Parameter(
            init_log_weights(self.num_trees, self.depth, 1, keys_heap)[:, :, 0]
        )
        self.w1_query = nn.Parameter(uniform(self.num_trees, d, h))
        self.w1_state = nn.Parameter(uniform(self.num_trees, s, h))
        self.b1 = nn.Parameter(uniform(self.num_trees, h))
        self.w2 = nn.Parameter(torch.zeros(self.num_trees, h, dtype=dtype, device=keys_heap.device))
        self.b2 = nn.Parameter(torch.zeros(self.num_trees, dtype=dtype, device=keys_heap.device))

    def decayed_parameters(self) -> list[nn.Parameter]:
        """The shared MLP's weight matrices: decay shrinks the correction, not the node states or
        biases (beta_p carries log |D(p)|), so the residual form decays towards one key per node."""
        return [self.w1_query, self.w1_state, self.w2]

    def _head(self, pre: torch.Tensor) -> torch.Tensor:
        """pre (T, Q, B, h) -> (T, Q, B) scalar outputs."""
        return torch.einsum("tqbh,th->tqb", F.gelu(pre), self.w2) + self.b2.view(-1, 1, 1)

    def forward(self, queries: torch.Tensor) -> torch.Tensor:
        q = tree_queries(queries, self.num_trees)
        from_query = q @ self.w1_query + self.b1.unsqueeze(1)  # (T, Q, h)
        from_state = self.state @ self.w1_state  # (T, N-1, h)
        pre = from_query.unsqueeze(2) + from_state.unsqueeze(1)  # (T, Q, N-1, h)
        out = self._head(pre) + self.beta.unsqueeze(1)
        if self.residual:
            out = out + q @ self.state[..., : self.width].transpose(1, 2) / math.sqrt(self.width)
        return out

    def score_nodes(self, queries, nodes, account=None):
        q = tree_queries(queries, self.num_trees)
        state = _gather_nodes(self.state, nodes)  # (T, Q, B, s)
        if account is not None:
            account.live(state, nodes)
        pre = (q @ self.w1_query + self.b1.unsqueeze(1)).unsqueeze(2) + torch.einsum(
            "tqbs,tsh->tqbh", state, self.w1_state
        )
        out = self._head(pre) + _gather_nodes(self.beta, nodes)
        if self.residual:
            key = state[..., : self.width]
            out = out + torch.einsum("tqbd,tqd->tqb", key, q) / math.sqrt(self.width)
        return out


class OracleParent(Parent):
    """Exact z (the upper bound): no parameters. Holds the leaf keys as a plain attribute (not an
    index of its own) and recomputes every node for every read, so its reads cost O(N) per query."""

    def __init__(self, keys_heap: torch.Tensor):
        super().__init__()
        self._setup(keys_heap)
        self.keys_heap = keys_heap
        self.numbers_per_node = 2**self.depth  # it scores every node (and leaf) for every query

    def forward(self, queries: torch.Tensor) -> torch.Tensor:
        return exact_internal_scores(leaf_scores(self.keys_heap, queries))

    def score_nodes(self, queries, nodes, account=None):
        every = self.forward(queries)  # (T, Q, N-1)
        if account is not None:
            account.live(every, nodes)
        return every.gather(2, nodes)


def make_parent(
    kind: ParentKind,
    keys_heap: torch.Tensor,
    generator: torch.Generator,
    m: int = 4,
    rank: int = 16,
    state_dim: int = 64,
    hidden: int = 32,
    residual: bool = False,
) -> Parent:
    """One parent model for every internal node of every tree, initialised from the heap-ordered keys."""
    if kind == "single_key":
        return SingleKeyParent(keys_heap, generator)
    if kind == "prototypes":
        return PrototypeParent(keys_heap, generator, m=m)
    if kind == "lowrank":
        return LowRankParent(keys_heap, generator, m=m, rank=rank)
    if kind == "mlp":
        return MLPParent(
            keys_heap, generator, state_dim=state_dim, hidden=hidden, residual=residual
        )
    if kind == "oracle":
        return OracleParent(keys_heap)
    raise ValueError(f"unknown parent {kind!r}")


def parameter_count(parent: Parent) -> int:
    """Trainable parameters per tree (every parameter tensor is batched over the T trees)."""
    return count_parameters(parent) // parent.num_trees


def mlp_parameter_count(num_internal: int, d: int, state_dim: int, hidden: int) -> int:
    """Per-tree parameters of MLPParent: node states (s + beta) + W1 over [q, e] + b1 + w2 + b2."""
    return num_internal * (state_dim + 1) + (d + state_dim) * hidden + 2 * hidden + 1


def mlp_shape_matching(
    target_params: int, num_internal: int, d: int, hidden: int = 32
) -> tuple[int, int]:
    """(state_dim, hidden) whose per-tree MLP parameter count is within 2% of target_params.

    hidden is kept small (the MLP's all-node read holds Q x (N-1) x hidden) and halved while the
    target cannot afford it; state_dim is then solved from the count, which is linear in it.
    """
    while hidden >= 1:
        fixed = mlp_parameter_count(num_internal, d, 0, hidden)
        state_dim = round((target_params - fixed) / (num_internal + hidden))
        if state_dim >= 1:
            count = mlp_parameter_count(num_internal, d, state_dim, hidden)
            if abs(count - target_params) <= 0.02 * target_params:
                return state_dim, hidden
        hidden //= 2
    raise ValueError(
        f"no MLP of {num_internal} nodes and width {d} has about {target_params} parameters"
    )


# ------------------------------------------------------------------------------------ fitting
def closure_targets(keys_heap: torch.Tensor, queries: torch.Tensor) -> torch.Tensor:
    """Exact z of every internal node for these queries: (T, Q, N-1)."""
    return exact_internal_scores(leaf_scores(keys_heap, queries))


def fit_parents(
    parent: Parent,
    keys_heap: torch.Tensor,
    fit_queries: torch.Tensor,
    steps: int,
    lr: float,
    batch: int,
    generator: torch.Generator,
    on_step: Callable[[int, float], None] | None = None,
    weight_decay: float = 0.0,
) -> list[float]:
    """Adam on the closure error mean_{q, p} (z^_p(q) - z_p(q))^2, all nodes of all trees jointly.

    Each step draws `batch` fit queries without replacement (the same rows for every tree when
    queries are per tree) from `generator`; targets are recomputed exactly per batch ((T, batch,
    2N-1) floats, never all queries at once). Adam's per-parameter scaling is what makes a loss
    averaged over N-1 nodes move every node's parameters at a useful rate. Deterministic given the
    generator (and torch's thread count). Returns the loss of every step; the oracle returns [].
    weight_decay > 0: AdamW's decoupled decay on the parent's `decayed_parameters` only.
    """
    parameters = [p for p in parent.parameters() if p.requires_grad]
    if not parameters:
        return []
    if weight_decay:
        decayed = {id(p) for p in parent.decayed_parameters()}
        groups = [
            {"params": [p for p in parameters if id(p) in decayed], "weight_decay": weight_decay},
            {"params": [p for p in parameters if id(p) not in decayed], "weight_decay": 0.0},
        ]
        optimizer = torch.optim.AdamW(groups, lr=lr)
    else:  # plain Adam, as every recorded claim ran
        optimizer = torch.optim.Adam(parameters, lr=lr)
    num_queries = fit_queries.shape[-2]
    losses = []
    parent.train()
    for step in range(1, steps + 1):
        rows = torch.randperm(num_queries, generator=generator)[: min(batch, num_queries)]
        q = select_queries(fit_queries, rows.to(fit_queries.device))
        with torch.no_grad():
            target = closure_targets(keys_heap, q)
        loss = (parent(q) - target).pow(2).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
        if on_step is not None:
            on_step(step, losses[-1])
    parent.eval()
    return losses


# ------------------------------------------------------------------------------------ soft reads
def _prior_at(
    log_prior: torch.Tensor | None, depth_of_nodes: int, positions: torch.Tensor
) -> torch.Tensor | float:
    """log pi of the nodes at `positions` (T, Q, B) of one depth, from the BFS (T, 2N-1) prior."""
    if log_prior is None:
        return 0.0
    flat = (2**depth_of_nodes - 1 + positions).reshape(positions.shape[0], -1)
    return log_prior.gather(1, flat).view_as(positions)


def tree_log_posteriors(
    parent_scores: torch.Tensor, scores: torch.Tensor, log_prior: torch.Tensor | None = None
) -> list[torch.Tensor]:
    """log P_tree of every node, per depth: [(T, Q, 1) = 0 at the root, ..., (T, Q, N) at the leaves].

    parent_scores (T, Q, N-1) are z^ of internal nodes (BFS), scores (T, Q, N) the exact leaf
    scores. At each parent, log P(c | q, p) = log_softmax over its two children of
    (z^_c + log pi_c|p); a node's log posterior is its parent's plus that. `log_prior` (T, 2N-1),
    BFS over all nodes (root entry unused), need not be normalised: only the sibling ratio counts.
    """
    child_scores = internal_levels(parent_scores)[1:] + [scores]
    posteriors = [torch.zeros_like(scores[..., :1])]
    for k, children in enumerate(child_scores, start=1):
        if log_prior is not None:
            children = children + log_prior[:, 2**k - 1 : 2 ** (k + 1) - 1].unsqueeze(1)
        route = children.unflatten(-1, (-1, 2)).log_softmax(dim=-1)
        posteriors.append((posteriors[-1].unsqueeze(-1) + route).flatten(-2))
    return posteriors


def full_read(
    parent: Parent,
    keys_heap: torch.Tensor,
    queries: torch.Tensor,
    log_prior: torch.Tensor | None = None,
) -> torch.Tensor:
    """log P_tree(l | q) over every leaf (heap positions): (T, Q, N)."""
    return tree_log_posteriors(parent(queries), leaf_scores(keys_heap, queries), log_prior)[-1]


def _kl(log_p: torch.Tensor, log_r: torch.Tensor) -> torch.Tensor:
    """KL(p || r) over the last axis, with 0 log 0 = 0."""
    p = log_p.exp()
    return torch.where(p > 0, p * (log_p - log_r), torch.zeros_like(p)).sum(dim=-1)


def leaf_kl(log_p_tree: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """KL(P_dense || P_tree) per tree and query: (T, Q). The metric leaf_kl is its mean."""
    return _kl(scores.log_softmax(dim=-1), log_p_tree)


def kl_at_depth(log_post_t: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """The resolution read at depth t, measured at the leaves: (T, Q).

    The read stops at depth t and spreads each depth-t node's tree posterior uniformly over its
    2^(D-t) leaves; this is KL(P_dense(leaf) || that leaf distribution). At t = D it is leaf_kl.
    It splits (chain rule) into node_kl_at_depth(t), which cannot decrease with t, plus
    sum_n P_dense(n) KL(P_dense(. | n) || uniform over n's leaves) over depth-t nodes n: the detail
    a depth-t read leaves out, which cannot increase. Whether the sum falls as t grows is the
    question "does the posterior approach dense as resolution grows" (falsification condition F2).
    """
    num_nodes, num_leaves = log_post_t.shape[-1], scores.shape[-1]
    spread = log_post_t.unsqueeze(-1) - math.log(num_leaves // num_nodes)  # (T, Q, 2^t, 1)
    log_dense = scores.log_softmax(dim=-1).unflatten(-1, (num_nodes, -1))
    return _kl(log_dense.flatten(-2), spread.expand_as(log_dense).flatten(-2))


def node_kl_at_depth(log_post_t: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """KL(dense mass summed into depth-t nodes || tree posterior of depth-t nodes): (T, Q).

    Both are the images of the leaf distributions under the same map leaf -> its depth-t ancestor,
    so by the data-processing inequality this cannot decrease with t: it measures how much error a
    coarser read has not yet revealed, not whether resolution helps. Hence `kl_at_depth`.
    """
    log_dense = scores.log_softmax(dim=-1)
    log_dense_nodes = log_dense.unflatten(-1, (log_post_t.shape[-1], -1)).logsumexp(dim=-1)
    return _kl(log_dense_nodes, log_post_t)


def mass_kept(log_post_t: torch.Tensor, scores: torch.Tensor, keep: int) -> torch.Tensor:
    """The pruning read at depth t: keep the `keep` depth-t nodes of highest tree posterior, prune
    the leaves under the others; the dense posterior mass of the kept leaves: (T, Q).

    This is the question F2 asks (SPR-096 section 9 stage C: coarse levels exclude most irrelevant
    leaves while keeping the dense mass). Unlike kl_at_depth it does not improve by construction: a
    tree whose depth-t nodes each hold a spread of the query's mass (a random topology) keeps about
    keep / 2^t of it, however exact its parents."""
    dense_nodes = scores.softmax(dim=-1).unflatten(-1, (log_post_t.shape[-1], -1)).sum(dim=-1)
    best = log_post_t.topk(keep, dim=-1).indices
    return dense_nodes.gather(-1, best).sum(dim=-1)


def best_mass(scores: torch.Tensor, keep: int) -> torch.Tensor:
    """The dense posterior mass of the `keep` leaves that hold the most: (T, Q). No pruning read that keeps
    `keep` leaves (any topology, any parents, any depth) keeps more, so it is mass_kept's ceiling."""
    return scores.softmax(dim=-1).topk(keep, dim=-1).values.sum(dim=-1)


def dense_entropy(scores: torch.Tensor) -> torch.Tensor:
    """Entropy (nats) of the dense posterior over the leaves: (T, Q). log N is a uniform posterior,
    which any summary approximates; a claim about summaries needs it well below log N."""
    log_p = scores.log_softmax(dim=-1)
    return -(log_p.exp() * log_p).sum(dim=-1)


def soft_read_metrics(
    parent: Parent,
    keys_heap: torch.Tensor,
    queries: torch.Tensor,
    log_prior: torch.Tensor | None = None,
    query_chunk: int = 128,
) -> dict[str, float]:
    """Full soft read on evaluation queries, means over trees and queries:
    leaf_kl, kl_at_depth_t and node_kl_at_depth_t for t in resolution_depths(D), the dense mass kept
    when the best half (t >= 1) or quarter (t >= 2) of depth-t nodes are kept
    (mass_kept_top_half_at_depth_t, mass_kept_top_quarter_at_depth_t: 50% or 75% of the leaves
    pruned) and the most any read keeping as many leaves can keep (best_mass_top_half,
    best_mass_top_quarter: the dense mass of the N/2 or N/4 leaves of highest dense posterior), dense_entropy,
    closure_error and closure_error_level_k (k = depth of the parent, 0 = root). Queries go in chunks for memory."""
    depth = parent.depth
    depths = resolution_depths(depth)
    sums: dict[str, float] = {}
    num_queries = queries.shape[-2]

    def add(name: str, value: torch.Tensor) -> None:
        sums[name] = sums.get(name, 0.0) + float(value.double().sum())

    with torch.no_grad():
        for q in query_chunks(queries, query_chunk):
            scores = leaf_scores(keys_heap, q)
            estimate = parent(q)
            error = (estimate - exact_internal_scores(scores)).pow(2)  # (T, Q, N-1)
            posteriors = tree_log_posteriors(estimate, scores, log_prior)
            add("leaf_kl", leaf_kl(posteriors[-1], scores))
            add("dense_entropy", dense_entropy(scores))
            for share, keep in (
                ("half", scores.shape[-1] // 2),
                ("quarter", scores.shape[-1] // 4),
            ):
                add(f"best_mass_top_{share}", best_mass(scores, keep))
            for t in depths:
                add(f"kl_at_depth_{t}", kl_at_depth(posteriors[t], scores))
                add(f"node_kl_at_depth_{t}", node_kl_at_depth(posteriors[t], scores))
                for share, keep in (("half", 2**t // 2), ("quarter", 2**t // 4)):
                    if keep:
                        add(
                            f"mass_kept_top_{share}_at_depth_{t}",
                            mass_kept(posteriors[t], scores, keep),
                        )
            add("closure_error", error.mean(dim=-1))
            for k, level in enumerate(internal_levels(error)):
                add(f"closure_error_level_{k}", level.mean(dim=-1))
    return {name: total / (parent.num_trees * num_queries) for name, total in sums.items()}


# ------------------------------------------------------------------------------------ cheap reads
class ByteAccount:
    """An accounting of a read's memory, not RSS: the bytes of its index (parent parameters and leaf
    keys, counted once) plus the largest set of intermediates the read reported live at one time,
    all from tensor sizes (numel x element size) as the read runs."""

    def __init__(self, *index: torch.Tensor):
        self.index_bytes = sum(t.numel() * t.element_size() for t in index)
        self.peak_live_bytes = 0
        self._pending = 0

    def live(self, *tensors: torch.Tensor) -> None:
        """Tensors alive now, besides those reported by the enclosing `step`."""
        self._pending += sum(t.numel() * t.element_size() for t in tensors)

    def step(self, *tensors: torch.Tensor) -> None:
        """Close one step of the read: these tensors plus whatever `live` reported since the last step."""
        total = self._pending + sum(t.numel() * t.element_size() for t in tensors)
        self.peak_live_bytes = max(self.peak_live_bytes, total)
        self._pending = 0

    @property
    def read_bytes(self) -> int:
        return self.index_bytes + self.peak_live_bytes


def read_account(parent: Parent | None, keys_heap: torch.Tensor) -> ByteAccount:
    """A ByteAccount whose index is the parent's parameters and buffers plus the leaf keys."""
    index = [] if parent is None else [*parent.parameters(), *parent.buffers()]
    return ByteAccount(*index, keys_heap)


@dataclass
class ReadResult:
    """leaves (T, Q, R): returned heap positions ranked by exact leaf score, -1 padding;
    visited (T, Q): nodes read per query (the root plus every child scored); read_bytes: see
    ByteAccount; overflow: (tree, query) reads whose frontier hit the cap (drill-down only)."""

    leaves: torch.Tensor
    visited: torch.Tensor
    read_bytes: int
    overflow: int = 0


def _child_scores(
    parent: Parent,
    keys_heap: torch.Tensor,
    q: torch.Tensor,
    depth_of_children: int,
    positions: torch.Tensor,
    log_prior: torch.Tensor | None,
    account: ByteAccount | None,
) -> torch.Tensor:
    """Scores (+ log prior) of the nodes at `positions` (T, Q, B) of one depth: z^ for internal
    nodes, the exact s_l for leaves. Gathers only those nodes."""
    if depth_of_children < parent.depth:
        scores = parent.score_nodes(q, 2**depth_of_children - 1 + positions, account)
    else:
        keys = _gather_nodes(keys_heap, positions)  # (T, Q, B, d)
        if account is not None:
            account.live(keys)
        scores = torch.einsum("tqbd,tqd->tqb", keys, q) / math.sqrt(keys_heap.shape[-1])
    return scores + _prior_at(log_prior, depth_of_children, positions)


def _rank_leaves(
    keys_heap: torch.Tensor, q: torch.Tensor, positions: torch.Tensor, valid: torch.Tensor
) -> torch.Tensor:
    """Returned leaves sorted by exact score, best first; invalid slots become -1 at the end."""
    keys = _gather_nodes(keys_heap, positions)
    scores = torch.einsum("tqbd,tqd->tqb", keys, q) / math.sqrt(keys_heap.shape[-1])
    order = scores.masked_fill(~valid, float("-inf")).argsort(dim=-1, descending=True, stable=True)
    return torch.where(valid.gather(-1, order), positions.gather(-1, order), -1)


def _chunked(
    read: Callable[[torch.Tensor], ReadResult], queries: torch.Tensor, query_chunk: int | None
) -> ReadResult:
    """Run a read over consecutive query blocks (memory batching): leaves and visits concatenated
    over queries (leaves padded with -1 to the widest block), read_bytes the largest block's (the
    blocks run one after another), overflow summed."""
    if query_chunk is None or query_chunk >= queries.shape[-2]:
        return read(queries)
    parts = [read(q) for q in query_chunks(queries, query_chunk)]
    width = max(part.leaves.shape[-1] for part in parts)
    leaves = torch.cat(
        [F.pad(part.leaves, (0, width - part.leaves.shape[-1]), value=-1) for part in parts], 1
    )
    return ReadResult(
        leaves,
        torch.cat([part.visited for part in parts], dim=1),
        max(part.read_bytes for part in parts),
        sum(part.overflow for part in parts),
    )


def beam_query_chunk(parent: Parent, beam_width: int, max_gathered: int = 2**25) -> int:
    """Queries per block such that one depth of a beam read gathers about `max_gathered` numbers
    (block x 2 beam_width x the parent's numbers per node); pass it as `query_chunk` to keep wide
    beams in memory."""
    return max(1, max_gathered // (2 * beam_width * parent.numbers_per_node))


def beam_read(
    parent: Parent,
    keys_heap: torch.Tensor,
    queries: torch.Tensor,
    beam_width: int,
    log_prior: torch.Tensor | None = None,
    query_chunk: int | Literal["auto"] | None = "auto",
) -> ReadResult:
    """Keep the beam_width nodes of highest path log posterior per depth; expand both children.

    Children are scored by gathering only their parameters (z^, or the exact leaf score at the
    bottom), routed by log_softmax over each sibling pair, and the best beam_width children by path
    log posterior survive. Cost O(Q x D x beam x m x d); all nodes are never scored. Returns the
    final beam's leaves ranked by exact leaf score. `query_chunk` reads the queries in blocks, the
    same result with bounded memory: "auto" = `beam_query_chunk(parent, beam_width)`, None = one block.
    """
    if query_chunk == "auto":
        query_chunk = beam_query_chunk(parent, beam_width)
    return _chunked(
        lambda q: _beam_block(parent, keys_heap, q, beam_width, log_prior), queries, query_chunk
    )


def _beam_block(
    parent: Parent,
    keys_heap: torch.Tensor,
    queries: torch.Tensor,
    beam_width: int,
    log_prior: torch.Tensor | None,
) -> ReadResult:
    num_trees = keys_heap.shape[0]
    q = tree_queries(queries, num_trees)
    account = read_account(parent, keys_heap)
    shape = (num_trees, q.shape[1], 1)
    nodes = torch.zeros(shape, dtype=torch.long, device=q.device)  # positions within the depth
    log_post = torch.zeros(shape, dtype=q.dtype, device=q.device)
    visited = 1
    for k in range(1, parent.depth + 1):
        children = (2 * nodes.unsqueeze(-1) + torch.arange(2, device=q.device)).flatten(-2)
        scores = _child_scores(parent, keys_heap, q, k, children, log_prior, account)
        route = scores.unflatten(-1, (-1, 2)).log_softmax(dim=-1)
        child_post = (log_post.unsqueeze(-1) + route).flatten(-2)
        visited += children.shape[-1]
        account.step(children, scores, child_post)
        if children.shape[-1] > beam_width:
            best = child_post.topk(beam_width, dim=-1)
            nodes, log_post = children.gather(-1, best.indices), best.values
        else:
            nodes, log_post = children, child_post
    leaves = _rank_leaves(keys_heap, q, nodes, torch.ones_like(nodes, dtype=torch.bool))
    visited_per_query = torch.full(leaves.shape[:2], visited, dtype=torch.long, device=q.device)
    return ReadResult(leaves, visited_per_query, account.read_bytes)


def drilldown_read(
    parent: Parent,
    keys_heap: torch.Tensor,
    queries: torch.Tensor,
    tolerance: float,
    max_frontier: int,
    log_prior: torch.Tensor | None = None,
    query_chunk: int | Literal["auto"] | None = "auto",
) -> ReadResult:
    """Descend only where a parent cannot separate its children with confidence (SPR-096 6.4).

    At an expanded node, if min(P(L), P(R)) < tolerance the parent is confident and only the more
    probable child is expanded; otherwise both are. tolerance = 0 expands everything. The frontier
    differs per query: it is a padded (T, Q, F) index tensor with a validity mask, F = the largest
    frontier at this depth, capped at max_frontier; a query whose frontier exceeds the cap keeps
    its max_frontier children of highest path posterior and is counted in `overflow`.
    `query_chunk` reads the queries in blocks, the same result with bounded memory: "auto" sizes
    blocks for a frontier of max_frontier (`beam_query_chunk(parent, max_frontier)`), None = one block.
    """
    if query_chunk == "auto":
        query_chunk = beam_query_chunk(parent, max_frontier)
    return _chunked(
        lambda q: _drilldown_block(parent, keys_heap, q, tolerance, max_frontier, log_prior),
        queries,
        query_chunk,
    )


def _drilldown_block(
    parent: Parent,
    keys_heap: torch.Tensor,
    queries: torch.Tensor,
    tolerance: float,
    max_frontier: int,
    log_prior: torch.Tensor | None,
) -> ReadResult:
    num_trees = keys_heap.shape[0]
    q = tree_queries(queries, num_trees)
    account = read_account(parent, keys_heap)
    shape = (num_trees, q.shape[1], 1)
    nodes = torch.zeros(shape, dtype=torch.long, device=q.device)
    log_post = torch.zeros(shape, dtype=q.dtype, device=q.device)
    valid = torch.ones(shape, dtype=torch.bool, device=q.device)
    visited = torch.ones(shape[:2], dtype=torch.long, device=q.device)
    overflowed = torch.zeros(shape[:2], dtype=torch.bool, device=q.device)
    lowest = torch.finfo(q.dtype).min  # kept children rank above padding even at log P = -inf
    for k in range(1, parent.depth + 1):
        children = 2 * nodes.unsqueeze(-1) + torch.arange(2, device=q.device)  # (T, Q, F, 2)
        scores = _child_scores(parent, keys_heap, q, k, children.flatten(-2), log_prior, account)
        route = scores.unflatten(-1, (-1, 2)).log_softmax(dim=-1)
        confident = route.exp().min(dim=-1).values < tolerance
        left_wins = route[..., 0] >= route[..., 1]
        more_probable = torch.stack([left_wins, ~left_wins], dim=-1)
        keep = (valid & ~confident).unsqueeze(-1) | (valid.unsqueeze(-1) & more_probable)
        visited += 2 * valid.sum(dim=-1)
        child_post = (log_post.unsqueeze(-1) + route).flatten(-2)
        keep, children = keep.flatten(-2), children.flatten(-2)
        count = keep.sum(dim=-1)
        overflowed |= count > max_frontier
        width = int(min(max_frontier, int(count.max())))
        rank_key = torch.where(keep, child_post.clamp(min=lowest), float("-inf"))
        chosen = rank_key.topk(width, dim=-1).indices
        account.step(children, scores, child_post, keep, rank_key)
        nodes, log_post, valid = (
            children.gather(-1, chosen),
            child_post.gather(-1, chosen),
            keep.gather(-1, chosen),
        )
    leaves = _rank_leaves(keys_heap, q, nodes, valid)
    return ReadResult(leaves, visited, account.read_bytes, int(overflowed.sum()))


def dense_read(keys_heap: torch.Tensor, queries: torch.Tensor, k: int = 10) -> ReadResult:
    """The reference: every leaf scored (matmul), softmax, top-k. visited = N leaves per query."""
    account = read_account(None, keys_heap)
    scores = leaf_scores(keys_heap, queries)
    posterior = scores.softmax(dim=-1)
    top = posterior.topk(min(k, scores.shape[-1]), dim=-1)
    account.step(scores, posterior, top.values, top.indices)
    visited = torch.full(scores.shape[:2], scores.shape[-1], dtype=torch.long, device=scores.device)
    return ReadResult(top.indices, visited, account.read_bytes)


def dense_topk(
    keys_heap: torch.Tensor, queries: torch.Tensor, k: int, query_chunk: int = 256
) -> torch.Tensor:
    """The dense top-k leaves (heap positions), best first: (T, Q, k). Queries in chunks."""
    with torch.no_grad():
        return torch.cat(
            [
                leaf_scores(keys_heap, q).topk(k, dim=-1).indices
                for q in query_chunks(queries, query_chunk)
            ],
            dim=1,
        )


def topk_recall(returned_leaves: torch.Tensor, dense_scores_or_topk: torch.Tensor, k: int) -> float:
    """Share of the dense top-k leaves that the read returns among its first k (mean over trees, queries).

    The second argument is either the dense scores (T, Q, N) or an already computed dense top list
    (T, Q, >= k) of integer positions.
    """
    if dense_scores_or_topk.is_floating_point():
        target = dense_scores_or_topk.topk(k, dim=-1).indices
    else:
        target = dense_scores_or_topk[..., :k]
    returned = returned_leaves[..., :k]
    hits = (returned.unsqueeze(-1) == target.unsqueeze(-2)) & (returned.unsqueeze(-1) >= 0)
    return float(hits.any(dim=-2).sum(dim=-1).double().mean() / k)


def cheap_read_metrics(
    result: ReadResult, dense_top: torch.Tensor, num_leaves: int, ks: tuple[int, ...] = (1, 5, 10)
) -> dict[str, float]:
    """topk_recall_k, visited_nodes (mean per query), visited_share = visited / (2N - 1), read_bytes."""
    metrics = {f"topk_recall_{k}": topk_recall(result.leaves, dense_top, k) for k in ks}
    visited = float(result.visited.double().mean())
    metrics.update(
        visited_nodes=visited,
        visited_share=visited / (2 * num_leaves - 1),
        read_bytes=float(result.read_bytes),
    )
    return metrics


def calibrate_beam(
    parent: Parent,
    keys_heap: torch.Tensor,
    fit_queries: torch.Tensor,
    target_recall: float = 0.95,
    k: int = 10,
    log_prior: torch.Tensor | None = None,
    max_gathered: int = 2**25,
    relative_precision: float = 0.0,
    on_width: Callable[[int, float], None] | None = None,
) -> tuple[int, float]:
    """Smallest beam width whose top-k recall on the FIT queries reaches target_recall.

    Doubles 1, 2, 4, ... until the target is reached (beam N returns every leaf: recall 1), then
    bisects between the last failing and the first passing power, until the bracket is at most
    max(1, relative_precision x width) wide (0: the exact smallest width). Bisection assumes recall
    grows with the width, which beam search does not guarantee; the width returned always reached
    the target. Returns (width, its recall on the fit queries); evaluate on evaluation queries after.
    Wide beams read the queries in blocks (`beam_query_chunk(parent, width, max_gathered)`).
    `on_width(width, recall)` is called after every width tried (progress for slow searches).
    """
    num_leaves = keys_heap.shape[1]
    target = dense_topk(keys_heap, fit_queries, k)

    def recall(width: int) -> float:
        with torch.inference_mode():
            read = beam_read(
                parent,
                keys_heap,
                fit_queries,
                width,
                log_prior,
                query_chunk=beam_query_chunk(parent, width, max_gathered),
            )
        value = topk_recall(read.leaves, target, k)
        if on_width is not None:
            on_width(width, value)
        return value

    return smallest_passing(
        recall, target_recall, start=1, upper=num_leaves, relative_precision=relative_precision
    )


def smallest_passing(
    score: Callable[[int], float],
    target: float,
    start: int,
    upper: int,
    relative_precision: float = 0.0,
) -> tuple[int, float]:
    """Smallest integer setting in [start, upper] whose score reaches `target`, assuming the score
    grows with the setting: double from `start` until it passes, then bisect the bracket down to
    max(1, relative_precision x setting). Returns (setting, its score); `upper` if none passes."""
    low, value, reached = start - 1, start, score(start)  # low: the last setting that failed
    while reached < target and value < upper:
        low, value = value, min(2 * value, upper)
        reached = score(value)
    high = value
    while reached >= target and high - low > max(1, int(relative_precision * high)):
        middle = (low + high) // 2
        tried = score(middle)
        if tried >= target:
            high, reached = middle, tried
        else:
            low = middle
    return high, reached


# ------------------------------------------------------------------------------------ timing
def time_read(fn: Callable[[], object], repeats: int = 5) -> float:
    """Median wall-clock milliseconds of fn() over `repeats` calls, after one warm-up, in inference mode."""
    with torch.inference_mode():
        fn()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            times.append(1000 * (time.perf_counter() - start))
    return statistics.median(times)
