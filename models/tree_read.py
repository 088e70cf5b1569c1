"""A fast TreeHeap read (issue #13): the beam read reshaped into matrix products.

Why the reference reads (`models.relation_tree.beam_read` / `drilldown_read`) are slow on a CPU:
every query gathers the parameters of its own beam's children (m x d numbers per node, per query,
per level), then does batched matrix-VECTOR products. Nothing a node holds is reused across the
queries that visit it, so a read that touches 1.6% of the nodes still moves more bytes than the
dense read, which streams every key once for all queries through one GEMM.

This read does the same kind of work in three GEMM-shaped stages:

1. dense top: every node of depths 1..L0 is scored for every query with one matmul (those levels
   are small: 2^(L0+1) - 2 nodes), and the path log posterior of every depth-L0 node follows
   exactly (the sum of the routing log probabilities along the path, as in the reference);
2. grouped beam levels L0+1..Ls: the (query, node) pairs of a level are grouped by node, so each
   node's child block (2 x m prototypes, contiguous in the breadth-first table) is read once and
   multiplied by the matrix of the queries that visit it (`grouped_matmul`); the queries are what
   gets copied (d numbers per pair), not the node parameters (2 m d numbers per pair);
3. leaf scan: the leaves of the kept depth-Ls nodes are contiguous in heap order (the learned
   topology sorts keys into their subtrees), so the exact re-rank is a matmul of each node's leaf
   slice by its queries, grouped the same way, then a top-k over the scanned scores.

`Schedule(dense_depth=L0, widths=(W_L0, ..., W_Ls))` says how many nodes each query keeps per
depth; `beam_schedule(W, D)` is the reference beam read exactly (same returned leaves, same
visited count: tested), other schedules are a different read:
- dense top: the depth-L0 nodes kept are the top W_L0 by the exact path posterior over ALL of that
  depth's nodes; the reference beam (when 2^L0 > W) would have pruned on the way down. It can only
  keep higher-posterior nodes than the beam would.
- per-level widths W_k instead of one W.
- leaf scan at Ls < D: every leaf below the kept depth-Ls nodes is scored exactly, and the top k by
  exact score are returned, where the beam would keep descending with parent scores. This returns
  the exact top k of a superset of the leaves the same beam would have reached below those nodes.
`calibrate` picks a schedule on fit queries only: the cheapest (by counted work, so deterministic)
whose fit recall reaches the target at one-sided 95% confidence.

The index keeps only what the read uses: the prototypes of depths 1..Ls (not the deeper parents,
which a leaf scan never reads) and the leaf keys in heap order.

The max-closure read (issue #29; `BoundIndex`, `bound_read`) has the same three stages on the same
tree, but routes each query by an upper bound on the best key score below a node (max over the
node's balls of q . c + |q| rho) instead of the path posterior, whose logsumexp (mass) is what the
tree posterior needs but not what finds a query's top keys. Its radii are exact (a bound for every
query, with a per-query certificate of an exact top k) or fitted on the fit queries (the smallest
radii bounding every fit query's best key: tighter, a bound on the fit queries only). `calibrate`
picks its schedule the same way, by its own counted cost (`bound_schedule_cost`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

from gates.models import relation_tree as rt


# ------------------------------------------------------------------------------------ schedule
@dataclass(frozen=True)
class Schedule:
    """dense_depth L0 and the nodes kept per query at depths L0, L0 + 1, ..., Ls = scan_depth."""

    dense_depth: int
    widths: tuple[int, ...]

    @property
    def scan_depth(self) -> int:
        return self.dense_depth + len(self.widths) - 1

    def __str__(self) -> str:
        return f"dense to depth {self.dense_depth}, widths {list(self.widths)}, scan at depth {self.scan_depth}"


def beam_schedule(width: int, depth: int) -> Schedule:
    """The reference beam read of this width: dense while a depth has at most `width` nodes (the
    beam keeps them all there), then width `width` down to the leaves (scan depth D: no scan)."""
    dense = min(depth, int(math.log2(width)))
    return Schedule(dense, tuple([width] * (depth - dense + 1)))


# ------------------------------------------------------------------------------------ index
class TreeIndex:
    """What the fast read needs of a fitted tree (one tree of a bank; T = 1).

    protos[k]: (2^k, m, d) prototypes of the depth-k nodes, k = 1..max_depth (depth 0, the root,
    routes nothing); log_w[k]: (2^k, m); leaf_keys: (N, d) in heap order. Prototypes come from
    `PrototypeParent` (m) or `SingleKeyParent` (m = 1), or are materialised from `LowRankParent`
    (k_{p,a} = B_a c_p); the MLP and oracle parents are not linear in q and are not supported.
    `max_depth` drops the parents below it (a read whose scan depth is Ls never reads them).
    """

    def __init__(self, parent: rt.Parent, keys_heap: torch.Tensor, max_depth: int | None = None):
        if keys_heap.shape[0] != 1:
            raise ValueError(
                f"TreeIndex holds one tree (a memory bank); got {keys_heap.shape[0]} trees"
            )
        self.depth = rt.tree_depth(keys_heap.shape[1])
        self.max_depth = self.depth if max_depth is None else max_depth
        self.width = keys_heap.shape[2]
        protos, log_w = prototype_table(parent)  # (N-1, m, d), (N-1, m)
        self.m = protos.shape[1]
        self.protos = {
            k: protos[2**k - 1 : 2 ** (k + 1) - 1].contiguous()
            for k in range(1, self.max_depth + 1)
            if k < self.depth
        }
        self.log_w = {k: log_w[2**k - 1 : 2 ** (k + 1) - 1].contiguous() for k in self.protos}
        self.leaf_keys = keys_heap[0].contiguous()

    def tensors(self) -> list[torch.Tensor]:
        return [*self.protos.values(), *self.log_w.values(), self.leaf_keys]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())

    def bytes_per_key(self) -> float:
        return self.nbytes() / self.leaf_keys.shape[0]

    def scores(self, q: torch.Tensor, k: int) -> torch.Tensor:
        """z^ of every depth-k node for scaled queries q (Q, d): (Q, 2^k), one matmul (exact at k = D).

        The level's prototypes are laid out prototype-major for it ((m, 2^k, d), a copy of a small
        top level), so the logsumexp over the m prototypes runs on m contiguous (Q, 2^k) slices."""
        if k == self.depth:  # the leaves: exact scores
            return q @ self.leaf_keys.T
        protos = self.protos[k].transpose(0, 1).reshape(-1, self.width)  # (m 2^k, d)
        logits = (q @ protos.T).view(len(q), self.m, -1) + self.log_w[k].T
        return logsumexp_slices(logits.unbind(1))


def prototype_table(parent: rt.Parent) -> tuple[torch.Tensor, torch.Tensor]:
    """(N-1, m, d) prototypes and (N-1, m) log weights of every internal node of tree 0, detached."""
    if isinstance(parent, rt.PrototypeParent):
        return parent.keys[0].detach(), parent.log_w[0].detach()
    if isinstance(parent, rt.SingleKeyParent):
        return parent.key[0].detach().unsqueeze(1), parent.bias[0].detach().unsqueeze(1)
    if isinstance(parent, rt.LowRankParent):
        keys = torch.einsum("adr,pr->pad", parent.bases[0], parent.coef[0])  # k_{p,a} = B_a c_p
        return keys.detach(), parent.log_w[0].detach()
    raise ValueError(
        f"the fast read needs parents linear in the query (prototypes, single_key, lowrank), "
        f"not {type(parent).__name__}"
    )


def logsumexp_last(x: torch.Tensor) -> torch.Tensor:
    """logsumexp over a small last axis (the m prototypes)."""
    return x[..., 0] if x.shape[-1] == 1 else logsumexp_slices(x.unbind(-1))


def logsumexp_slices(slices: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """logsumexp of m same-shape tensors, elementwise: torch's reduction over a trailing axis of
    size 4 is several times slower than these m maximum / exp / add passes."""
    if len(slices) == 1:
        return slices[0]
    top = slices[0]
    for s in slices[1:]:
        top = torch.maximum(top, s)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    total = (slices[0] - top).exp()
    for s in slices[1:]:
        total += (s - top).exp()
    return total.log_() + top


def route(log_post: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """Children's path log posteriors (Q, 2B) from the parents' (Q, B) and the children's scores
    z (Q, 2B), siblings adjacent: log P(L) = log P(parent) + log sigmoid(z_L - z_R), written with one
    softplus per pair: log P(L) = log P(parent) - softplus(z_R - z_L), log P(R) = log P(L) + z_R - z_L."""
    diff = z[:, 1::2] - z[:, 0::2]
    left = log_post - F.softplus(diff)
    return torch.stack([left, left + diff], dim=-1).flatten(1)


# ------------------------------------------------------------------------------------ grouped matmul
def padded_count(counts: torch.Tensor) -> torch.Tensor:
    """Counts rounded up to 4 steps per power of two (1..8 exact, then 10, 12, 14, 16, 20, 24, ..):
    at most 1/4 padding (1/8 on average), and few distinct caps (one bmm each)."""
    octave = (counts - 1).clamp_min(1).double().log2().floor().long()  # c in (2^e, 2^(e+1)]
    step = 1 << (octave - 2).clamp_min(0)
    return (counts + step - 1) // step * step


def grouped_matmul(
    table: torch.Tensor, queries: torch.Tensor, pair_query: torch.Tensor, pair_node: torch.Tensor
) -> torch.Tensor:
    """out[i] = table[pair_node[i]] @ queries[pair_query[i]] for every pair i: (P, R).

    table (U, R, d): a block of R rows per node; queries (Q, d). The pairs are grouped by node, so
    each touched block is read once and multiplied by the matrix of its queries. A node's queries
    are padded to a cap (`padded_count`: at most 1/4 more) and nodes of equal cap form one bmm,
    (nodes, cap, d) x (nodes, d, R). Pairs are sorted by (cap, node), so each bucket is a
    contiguous range and a pair's padded slot is the sum of the caps before its node plus its rank
    within the node. Padding slots compute on query 0 and land in a spare output row, dropped.
    """
    num_pairs, device = len(pair_node), pair_node.device
    cap = padded_count(torch.bincount(pair_node, minlength=len(table)))
    order = (cap.index_select(0, pair_node) * len(table) + pair_node).argsort(stable=True)
    nodes, counts = pair_node.index_select(0, order).unique_consecutive(return_counts=True)
    caps = cap.index_select(0, nodes)
    node_of = torch.repeat_interleave(counts)  # sorted pair -> index into nodes
    rank = torch.arange(num_pairs, device=device) - (counts.cumsum(0) - counts).index_select(
        0, node_of
    )
    slot = (caps.cumsum(0) - caps).index_select(
        0, node_of
    ) + rank  # padded position of each sorted pair
    padded = int(caps.sum())
    query_index = torch.zeros(padded, dtype=torch.long, device=device)
    query_index[slot] = pair_query.index_select(0, order)
    destination = torch.full((padded,), num_pairs, dtype=torch.long, device=device)
    destination[slot] = order
    block = queries.index_select(0, query_index)  # (padded, d): d numbers copied per pair
    result = queries.new_empty(padded, table.shape[1])
    first_node, first_slot = 0, 0
    for c, n in zip(*[t.tolist() for t in caps.unique_consecutive(return_counts=True)]):
        rows = slice(first_slot, first_slot + n * c)
        torch.bmm(
            block[rows].view(n, c, -1),
            table.index_select(0, nodes[first_node : first_node + n]).transpose(1, 2),
            out=result[rows].view(n, c, -1),
        )
        first_node, first_slot = first_node + n, first_slot + n * c
    out = result.new_empty(num_pairs + 1, table.shape[1])
    return out.index_copy_(0, destination, result)[:-1]


# ------------------------------------------------------------------------------------ the read
def fast_read(
    index: TreeIndex,
    queries: torch.Tensor,
    schedule: Schedule,
    k: int | None = 10,
    stage_ms: dict[str, float] | None = None,
) -> rt.ReadResult:
    """Read `queries` (Q, d) with `schedule`; leaves (1, Q, R): heap positions ranked by exact score.

    R = k (None: every leaf the read scored exactly, i.e. the whole last beam when the scan depth
    is D, as the reference beam returns). visited: `visited_nodes`. read_bytes: the index plus the
    largest intermediates of one stage (an accounting of tensor sizes, `rt.ByteAccount`).
    `stage_ms`, when given, accumulates the wall-clock milliseconds of each stage (profiling)."""
    lap = Laps(stage_ms)
    depth, scan = index.depth, schedule.scan_depth
    if not (0 <= schedule.dense_depth <= scan <= depth and min(scan, depth - 1) <= index.max_depth):
        raise ValueError(
            f"schedule ({schedule}) does not fit a tree of depth {depth} (index to depth "
            f"{index.max_depth})"
        )
    account = rt.ByteAccount(*index.tensors())
    q = queries / math.sqrt(index.width)
    num_queries = len(q)
    every_query = torch.arange(num_queries, device=q.device)

    # 1. dense top: log posterior of every depth-L0 node, one level at a time
    log_post = torch.zeros(num_queries, 1, dtype=q.dtype, device=q.device)
    for level in range(1, schedule.dense_depth + 1):
        log_post = route(log_post, index.scores(q, level))
    account.step(log_post)
    lap("dense top")
    nodes = torch.arange(log_post.shape[1], device=q.device).expand(num_queries, -1)
    nodes, log_post = keep_best(nodes, log_post, schedule.widths[0])

    # 2. beam levels: each (query, node) pair scores the node's two children, pairs grouped by node
    for level, width in zip(range(schedule.dense_depth + 1, scan + 1), schedule.widths[1:]):
        pair_query, pair_node = every_query.repeat_interleave(nodes.shape[1]), nodes.flatten()
        if level == depth:  # the children are leaves: their exact scores
            logits = grouped_matmul(
                index.leaf_keys.view(-1, 2, index.width), q, pair_query, pair_node
            )
            z = logits.view(num_queries, -1)
        else:  # node j's children 2j, 2j+1 are adjacent: a (2 m, d) block per node
            table = index.protos[level].view(-1, 2 * index.m, index.width)
            logits = grouped_matmul(table, q, pair_query, pair_node)  # (P, 2 m)
            logits += index.log_w[level].view(-1, 2 * index.m).index_select(0, pair_node)
            z = logsumexp_last(logits.view(-1, 2, index.m)).view(num_queries, -1)
        children = (2 * nodes.unsqueeze(-1) + torch.arange(2, device=q.device)).flatten(1)
        child_post = route(log_post, z)
        account.step(logits, child_post, children)
        nodes, log_post = keep_best(children, child_post, width)
        lap("beam levels")

    # 3. leaf scan: every leaf below the kept depth-Ls nodes, scored exactly (at Ls = D, the beam's
    # own leaves: the reference ranks its final beam by exact score the same way)
    ranked, _ = scan_leaves(index.leaf_keys, q, nodes, depth - scan, k, account, lap)
    visited = torch.full(
        (1, num_queries), visited_nodes(schedule, depth), dtype=torch.long, device=q.device
    )
    return rt.ReadResult(ranked.unsqueeze(0), visited, account.read_bytes)


def scan_leaves(
    leaf_keys: torch.Tensor,
    q: torch.Tensor,
    nodes: torch.Tensor,
    height: int,
    k: int | None,
    account: rt.ByteAccount,
    lap: Laps,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The leaf scan: every leaf below the kept nodes (Q, B) of height `height` (2^height leaves
    each, a contiguous slice in heap order) scored exactly, q @ leaf, grouped by node; returns the
    heap positions of the top k by exact score (Q, R) and their scores (k None: all, sorted)."""
    size = 2**height
    every_query = torch.arange(len(q), device=q.device)
    pair_query = every_query.repeat_interleave(nodes.shape[1])
    scores = grouped_matmul(
        leaf_keys.view(-1, size, leaf_keys.shape[1]), q, pair_query, nodes.flatten()
    )
    scores = scores.view(len(q), -1)  # slot i: leaf i % size of kept node i // size
    account.step(scores)
    lap("scan matmul")
    count = scores.shape[1] if k is None else min(k, scores.shape[1])
    top = (
        scores.topk(count, dim=-1)
        if count < scores.shape[1]
        else scores.sort(dim=-1, descending=True, stable=True)
    )
    ranked = size * nodes.gather(1, top.indices // size) + top.indices % size
    lap("scan top-k")
    return ranked, top.values


class Laps:
    """Adds the time since the previous lap to `into[name]` (milliseconds); a no-op without `into`."""

    def __init__(self, into: dict[str, float] | None):
        self.into, self.last = into, time.perf_counter()

    def __call__(self, name: str) -> None:
        if self.into is not None:
            now = time.perf_counter()
            self.into[name] = self.into.get(name, 0.0) + 1000 * (now - self.last)
            self.last = now


def keep_best(
    nodes: torch.Tensor, log_post: torch.Tensor, width: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The `width` nodes of highest path log posterior per query (all of them, in order, if fewer)."""
    if nodes.shape[1] <= width:
        return nodes, log_post
    best = log_post.topk(width, dim=-1)
    return nodes.gather(1, best.indices), best.values


# ------------------------------------------------------------------------------------ calibration
# What a unit of work costs, relative to one prototype scored in the dense top (a row of a GEMM
# plus its share of the logsumexp and routing): fitted (non-negative least squares, median error
# 6-7%) to the CPU time of 80 schedules at N = 65,536, 1,024 queries, one thread, d = 32 and 64:
# a (query, node) pair entering a beam level (2 m dots, and its share of the sort, the index copies
# and the top-k) ~ 29-30; a leaf scanned (a dot, a copy, its share of the final top-k) ~ 0.85-0.92.
PAIR_COST = 30.0
LEAF_COST = 0.9


def kept_per_depth(schedule: Schedule) -> list[int]:
    """Nodes a query actually keeps at depths L0..Ls: a width beyond what the level offers keeps all."""
    kept = [min(schedule.widths[0], 2**schedule.dense_depth)]
    for width in schedule.widths[1:]:
        kept.append(min(width, 2 * kept[-1]))
    return kept


def schedule_cost(schedule: Schedule, depth: int, m: int) -> float:
    """Work per query of a schedule, in dense-top prototypes (see PAIR_COST, LEAF_COST): the dense
    top's (2^(L0+1) - 2) m prototypes, the pairs entering each beam level and the leaves scanned.
    Counted, not timed, so the schedule calibration picks is deterministic."""
    kept = kept_per_depth(schedule)
    dense = (2 ** (schedule.dense_depth + 1) - 2) * m
    pairs = sum(kept[:-1])
    scanned = kept[-1] * 2 ** (depth - schedule.scan_depth)
    return dense + PAIR_COST * pairs + LEAF_COST * scanned


def visited_nodes(schedule: Schedule, depth: int) -> int:
    """Nodes a read with this schedule visits per query: the root and every node of the dense top,
    both children of every node kept at a beam level, and every leaf scanned (counted once)."""
    kept = kept_per_depth(schedule)
    visited = 2 ** (schedule.dense_depth + 1) - 1 + 2 * sum(kept[:-1])
    return visited + (
        kept[-1] * 2 ** (depth - schedule.scan_depth) if schedule.scan_depth < depth else 0
    )


@dataclass
class Calibration:
    schedule: Schedule
    fit_recall: float  # its mean top-k recall on the fit queries
    fit_lower: float  # the lower confidence bound of that recall, which had to reach the target
    cost: float  # schedule_cost
    tried: list[
        tuple[Schedule, float, float]
    ]  # every schedule read on the fit queries: (it, recall, bound)


def per_query_recall(leaves: torch.Tensor, dense_top: torch.Tensor, k: int) -> torch.Tensor:
    """Share of each query's dense top k that the read returns among its first k: (Q,) (mean over
    queries: `rt.topk_recall`)."""
    returned = leaves[..., :k].unsqueeze(-1)
    hits = (returned == dense_top[..., :k].unsqueeze(-2)) & (returned >= 0)
    return hits.any(dim=-2).sum(dim=-1).flatten().double() / k


def calibrate(
    index: TreeIndex,
    fit_queries: torch.Tensor,
    target: float = 0.95,
    k: int = 10,
    dense_depths: list[int] | None = None,
    scan_depths: list[int] | None = None,
    per_level: bool = True,
    shortlist: int = 3,
    z: float = 1.645,
    on_try: Callable[[Schedule, float, float], None] | None = None,
) -> Calibration:
    """The cheapest schedule (by `schedule_cost`) whose top-k recall on the FIT queries reaches
    `target` at confidence: mean - z x its standard error over the fit queries >= target.

    Why the bound: calibration reads hundreds of schedules and keeps the cheapest that passes, so the
    one kept tends to be one whose fit recall landed high by chance; with a one-sided 95% bound
    (z = 1.645) the chosen schedule's recall on other queries from the same windows reaches the
    target despite that selection (z = 0: the plain mean, as `rt.calibrate_beam`).

    For every (L0, Ls) pair (L0 in dense_depths, Ls in scan_depths, L0 <= Ls): the smallest uniform
    width that passes (doubling, then bisection; `rt.smallest_passing`). The `shortlist` cheapest
    pairs then shrink their widths one depth at a time, the scan depth first (its width multiplies
    the most work), each to the smallest that still passes with the others fixed. Recall is assumed
    to grow with each width (not guaranteed); the schedule returned passed, unless none did (then
    the cheapest of the widest tried: check `fit_lower` against the target).

    A `BoundIndex` is calibrated the same way with its own read and cost (`bound_read`,
    `bound_schedule_cost`); its default dense depths run from D/2 - 3 down to where the dense top
    would score N / 16 balls per query, and its scan depths to L0 + `BOUND_SCAN_LEVELS`."""
    depth = index.depth
    bounded = isinstance(index, BoundIndex)  # the max-closure read (`bound_read`)
    read, cost_of = (bound_read, bound_schedule_cost) if bounded else (fast_read, schedule_cost)
    top = max(0, depth // 2 - 3)  # chosen at N = 2^12..2^18 (d = 32, 64): D/2 - 2 or D/2 - 1
    if dense_depths is None:
        # the max-closure read scans small blocks (~2^4..2^7 leaves): deeper levels than the mass
        # read, as long as its dense top scores at most N / 16 balls per query
        last = max(top, depth - 4 - index.g) if bounded else min(depth, top + 4)
        dense_depths = list(range(top, last + 1))
    deepest_scan = BOUND_SCAN_LEVELS if bounded else 4
    dense_top = rt.dense_topk(index.leaf_keys.unsqueeze(0), fit_queries, k)
    tried: list[tuple[Schedule, float, float]] = []
    memo: dict[Schedule, tuple[float, float]] = {}

    def bound(schedule: Schedule) -> float:
        """The lower confidence bound of the schedule's fit recall (read once, remembered)."""
        if schedule not in memo:
            with torch.inference_mode():
                recall = per_query_recall(
                    read(index, fit_queries, schedule, k).leaves, dense_top, k
                )
            mean = float(recall.mean())
            memo[schedule] = mean, mean - z * float(recall.std()) / math.sqrt(len(recall))
            tried.append((schedule, *memo[schedule]))
            if on_try is not None:
                on_try(schedule, *memo[schedule])
        return memo[schedule][1]

    def candidate(schedule: Schedule) -> tuple[float, float, Schedule]:
        return cost_of(schedule, depth, index.m), bound(schedule), schedule

    candidates = []
    for dense in dense_depths:
        scans = (
            range(dense, min(depth, dense + deepest_scan) + 1)
            if scan_depths is None
            else scan_depths
        )
        for scan in (s for s in scans if dense <= s <= depth):
            levels = scan - dense + 1
            width, _ = rt.smallest_passing(
                lambda w: bound(Schedule(dense, (w,) * levels)),  # noqa: B023 (called at once)
                target,
                start=1,
                upper=2**scan,
            )
            candidates.append(candidate(Schedule(dense, (width,) * levels)))
    candidates.sort(key=lambda c: (c[1] < target, c[0]))
    if per_level:
        for _, lower, schedule in candidates[:shortlist]:
            if lower >= target:
                widths = list(schedule.widths)
                for i in reversed(range(len(widths))):

                    def at(w: int, i: int = i, widths=widths, schedule=schedule) -> float:
                        return bound(
                            Schedule(
                                schedule.dense_depth, tuple(widths[:i] + [w] + widths[i + 1 :])
                            )
                        )

                    widths[i], _ = rt.smallest_passing(at, target, start=1, upper=widths[i])
                candidates.append(candidate(Schedule(schedule.dense_depth, tuple(widths))))
        candidates.sort(key=lambda c: (c[1] < target, c[0]))
    cost, lower, schedule = candidates[0]
    return Calibration(schedule, memo[schedule][0], lower, cost, tried)


# ------------------------------------------------------------------------------------ max-closure read
# Issue #29. The mass read above routes by a subtree's posterior MASS (logsumexp of its scores), but a
# subtree holding one of a query's top keys need not hold much mass: at recall 0.95 it scans 4-8% of the
# keys at every N. A top-k read wants each node's best score instead, max_{l below p} q . k_l, and an
# upper bound on it is what makes pruning safe. This index gives every node such a bound.
RadiusKind = Literal["fit", "exact"]
BOUND_SCAN_LEVELS = 6  # calibration tries scan depths L0..L0 + 6 for the max-closure read
# What the max-closure read's work costs, relative to one ball scored in its dense top (~6 ns a
# query on one core): fitted (non-negative least squares with an intercept, which no schedule's
# choice depends on; median error 12%) to the CPU time of 216 random schedules at N = 4,096 and
# 16,384 (teacher keys, d = 64), m = 1..16, 1,024 queries, one thread: a (query, node) pair
# entering a beam level ~ 50 plus ~0.9 per ball of its two children (their dots, the radius term,
# the max); a node kept for the leaf scan ~ 18 (its share of the grouping); a leaf scanned ~ 1.2.
# (The mass read's PAIR_COST, 30, was fitted to that read; it underestimates these reads' pairs.)
BOUND_PAIR_COST = 50.0
BOUND_PAIR_BALL_COST = 0.9
BOUND_SCAN_PAIR_COST = 18.0
BOUND_LEAF_COST = 1.2


class BoundIndex:
    """A max-closure index: every node p carries an upper bound on the best score of a key below it,

        s_p(q) = max over p's balls a of (q . c_a + |q| rho_a)  >=  max_{l below p} q . k_l,

    p's balls being its 2^g = m descendants at depth min(depth(p) + g, D) (a leaf is a ball of
    radius 0 around its key, so a node within g levels of the leaves is scored exactly); c_a is the
    mean of the keys below a, rho_a its radius:

    - radius "exact": max_{l below a} |k_l - c_a|. By Cauchy-Schwarz q . k_l = q . c_a + q . (k_l - c_a)
      <= q . c_a + |q| rho_a for EVERY query, so s_p bounds p's best key for any query (ball bounds:
      branch and bound). A read that prunes nodes and then finds a k-th best score at least the
      largest bound it pruned has returned the exact top k (`bound_read(..., certify=...)`).
    - radius "fit": the smallest rho_a with q . c_a + |q| rho_a >= max_{l below a} q . k_l on every
      fit query: max over the fit queries of (max_l q . k_l - q . c_a) / |q| (at most the exact
      radius; at least 0 since c_a is the keys' mean). A max-closure fitted on the fit queries only:
      the bound holds on every fit query by construction, on other queries only insofar as they
      resemble them (the read's recall is then what calibration measures, not a guarantee).

    Why balls with a radius per ball and not learned prototypes: the bound is direction-free (one
    number per ball fitted from 1,024 queries cannot overfit the way (d + 1) numbers per prototype
    would), it has an exact version, and the fitted radius is a closed form (no optimiser, no
    schedule to tune). Why m > 1 balls per node: one ball around a whole subtree is loose (a
    subtree's keys spread along many directions); the max over its 2^g sub-balls follows them.

    Stored once per depth j (the ball depths a read uses): centres (2^j, d) and radii (2^j,); a node's
    balls are a contiguous slice of the table of depth j + g, and so are its two children's (the
    grouped beam reads one (2 x 2^g, d) block per node). `cut(schedule)` keeps only what a schedule
    reads. Same tree and leaf order as the mass read (`keys_heap` in heap order); no parent is fitted.
    """

    def __init__(
        self,
        keys_heap: torch.Tensor,
        fit_queries: torch.Tensor | None = None,
        m: int = 4,
        radius: RadiusKind = "fit",
        chunk_numbers: int = 2**24,
    ):
        if keys_heap.shape[0] != 1:
            raise ValueError(
                f"BoundIndex holds one tree (a memory bank); got {keys_heap.shape[0]} trees"
            )
        if m < 1 or m & (m - 1):
            raise ValueError(f"m (balls per node) must be a power of two, got {m}")
        if radius not in ("fit", "exact"):
            raise ValueError(f"radius must be 'fit' or 'exact', got {radius!r}")
        if radius == "fit" and fit_queries is None:
            raise ValueError("radius 'fit' needs the fit queries")
        self.leaf_keys = keys_heap[0].contiguous()
        self.depth = rt.tree_depth(self.leaf_keys.shape[0])
        self.width = self.leaf_keys.shape[1]
        self.m, self.g, self.radius = m, m.bit_length() - 1, radius
        self.centres, self.radii = ball_centres(self.leaf_keys), {}
        if radius == "exact":
            for j, c in self.centres.items():
                blocks = self.leaf_keys.view(2**j, -1, self.width)
                self.radii[j] = (blocks - c.unsqueeze(1)).norm(dim=-1).amax(dim=1)
        else:
            self.radii = fitted_radii(self.leaf_keys, self.centres, fit_queries, chunk_numbers)

    def ball_depth(self, node_depth: int) -> int:
        """Depth of the balls that score a node of this depth."""
        return min(node_depth + self.g, self.depth)

    def ball_depths(self, schedule: Schedule) -> set[int]:
        """Ball depths a read with this schedule uses (depth D: the leaf keys, always kept)."""
        nodes = range(max(1, schedule.dense_depth), schedule.scan_depth + 1)
        return {self.ball_depth(k) for k in nodes} - {self.depth}

    def cut(self, schedule: Schedule) -> BoundIndex:
        """The same index keeping only the ball tables `schedule` reads (shares the tensors)."""
        cut = object.__new__(BoundIndex)
        cut.__dict__.update(self.__dict__)
        keep = self.ball_depths(schedule)
        cut.centres = {j: c for j, c in self.centres.items() if j in keep}
        cut.radii = {j: r for j, r in self.radii.items() if j in keep}
        return cut

    def balls(self, ball_depth: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Centres (2^j, d) and radii (2^j,) of depth j; at j = D the keys and None (radius 0)."""
        if ball_depth == self.depth:
            return self.leaf_keys, None
        if ball_depth not in self.centres:
            raise ValueError(
                f"this index keeps no balls of depth {ball_depth} (kept: {sorted(self.centres)})"
            )
        return self.centres[ball_depth], self.radii[ball_depth]

    def scores(self, q: torch.Tensor, k: int, q_norm: torch.Tensor | None = None) -> torch.Tensor:
        """s_p(q) of every depth-k node for queries q (Q, d): (Q, 2^k), one matmul."""
        centres, radii = self.balls(self.ball_depth(k))
        logits = q @ centres.T
        if radii is not None:
            logits += (q.norm(dim=-1) if q_norm is None else q_norm).unsqueeze(1) * radii
        return logits.view(len(q), 2**k, -1).amax(dim=-1)

    def tensors(self) -> list[torch.Tensor]:
        return [*self.centres.values(), *self.radii.values(), self.leaf_keys]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())

    def bytes_per_key(self) -> float:
        return self.nbytes() / self.leaf_keys.shape[0]


def ball_centres(leaf_keys: torch.Tensor) -> dict[int, torch.Tensor]:
    """Mean key below every node of depths 1..D-1: {j: (2^j, d)}, pairwise from the bottom up (the
    blocks of one depth have equal sizes, so the mean of the children's means is the node's)."""
    depth = rt.tree_depth(leaf_keys.shape[0])
    centres, level = {}, leaf_keys
    for j in range(depth - 1, 0, -1):
        level = level.view(2**j, 2, -1).mean(dim=1)
        centres[j] = level
    return centres


def subtree_maxima(
    leaf_keys: torch.Tensor, queries: torch.Tensor, depths: set[int]
) -> dict[int, torch.Tensor]:
    """max_{l below p} q . k_l of every node of the given depths: {j: (Q, 2^j)}, pairwise maxima of
    the leaf scores from the bottom up."""
    level = queries @ leaf_keys.T  # depth D
    out = {}
    for j in range(rt.tree_depth(leaf_keys.shape[0]) - 1, min(depths, default=0) - 1, -1):
        level = level.view(len(queries), 2**j, 2).amax(dim=-1)
        if j in depths:
            out[j] = level
    return out


def fitted_radii(
    leaf_keys: torch.Tensor,
    centres: dict[int, torch.Tensor],
    fit_queries: torch.Tensor,
    chunk_numbers: int = 2**24,
) -> dict[int, torch.Tensor]:
    """The smallest radius per ball that bounds its best key on every fit query (see BoundIndex),
    {j: (2^j,)}: max over fit queries of (max_{l below a} q . k_l - q . c_a) / |q|, at least 0.
    Fit queries in chunks of at most `chunk_numbers` leaf scores."""
    n = leaf_keys.shape[0]
    radii = {j: torch.zeros(len(c), dtype=c.dtype, device=c.device) for j, c in centres.items()}
    chunk = max(1, chunk_numbers // n)
    for q in fit_queries.split(chunk):
        norm = q.norm(dim=-1, keepdim=True).clamp_min(torch.finfo(q.dtype).tiny)
        for j, best in subtree_maxima(leaf_keys, q, set(centres)).items():
            excess = (best - q @ centres[j].T) / norm
            radii[j] = torch.maximum(radii[j], excess.amax(dim=0))
    return radii


def keep_bounded(
    nodes: torch.Tensor, score: torch.Tensor, width: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The `width` nodes of highest bound per query, and the largest bound of those dropped (Q,)
    (-inf when none is)."""
    if nodes.shape[1] <= width:
        return nodes, score, score.new_full((len(score),), -math.inf)
    best = score.topk(width + 1, dim=-1)
    kept = best.indices[:, :width]
    return nodes.gather(1, kept), best.values[:, :width], best.values[:, width]


def bound_read(
    index: BoundIndex,
    queries: torch.Tensor,
    schedule: Schedule,
    k: int | None = 10,
    stage_ms: dict[str, float] | None = None,
    certify: dict[str, torch.Tensor] | None = None,
) -> rt.ReadResult:
    """Read `queries` (Q, d) with the max-closure bounds of `index` and `schedule`: leaves (1, Q, R),
    heap positions ranked by exact score (R = k; None: every leaf scanned).

    The stages of `fast_read`, routed by the bound instead of the path posterior:
    1. dense top: the bound of every depth-L0 node (one matmul on its balls; the levels above are
       not needed: a bound does not accumulate along the path), each query keeps the top W_L0;
    2. beam levels L0+1..Ls: each kept node's two children scored by their bounds, (query, node)
       pairs grouped by node (`grouped_matmul` on the children's contiguous balls), top W kept;
    3. leaf scan at Ls: every leaf below the kept nodes scored exactly, top k returned.
    `certify`, when given, receives "pruned_bound" (Q,): the largest bound of any node the read
    dropped (-inf: none), and "certified" (Q,) bool: the k-th best score returned reaches it. With
    radius "exact" a certified query's k returned leaves are its exact top k (up to rounding in the
    bound's last bits); with "fit" that holds on fit queries only."""
    lap = Laps(stage_ms)
    depth, scan, dense = index.depth, schedule.scan_depth, schedule.dense_depth
    if not 0 <= dense <= scan <= depth:
        raise ValueError(f"schedule ({schedule}) does not fit a tree of depth {depth}")
    missing = index.ball_depths(schedule) - set(index.centres)
    if missing:
        raise ValueError(
            f"schedule ({schedule}) reads balls of depths {sorted(missing)} this index dropped"
        )
    account = rt.ByteAccount(*index.tensors())
    q, num_queries = queries, len(queries)
    q_norm = q.norm(dim=-1)
    every_query = torch.arange(num_queries, device=q.device)

    # 1. dense top: the bound of every depth-L0 node (the root, at L0 = 0, needs none)
    if dense == 0:
        nodes = torch.zeros(num_queries, 1, dtype=torch.long, device=q.device)
        bounds = q.new_full((num_queries, 1), math.inf)
    else:
        bounds = index.scores(q, dense, q_norm)
        nodes = torch.arange(2**dense, device=q.device).expand(num_queries, -1)
    account.step(bounds)
    nodes, bounds, pruned = keep_bounded(nodes, bounds, schedule.widths[0])
    lap("dense top")

    # 2. beam levels: a node's two children have 2 x 2^(b - level) adjacent balls at depth b
    for level, width in zip(range(dense + 1, scan + 1), schedule.widths[1:]):
        centres, radii = index.balls(index.ball_depth(level))
        per_child = 2 ** (index.ball_depth(level) - level)
        pair_query, pair_node = every_query.repeat_interleave(nodes.shape[1]), nodes.flatten()
        table = centres.view(-1, 2 * per_child, index.width)
        logits = grouped_matmul(table, q, pair_query, pair_node)  # (P, 2 per_child)
        if radii is not None:
            logits += q_norm.index_select(0, pair_query).unsqueeze(1) * radii.view(
                -1, 2 * per_child
            ).index_select(0, pair_node)
        z = logits.view(-1, 2, per_child).amax(dim=-1).view(num_queries, -1)
        children = (2 * nodes.unsqueeze(-1) + torch.arange(2, device=q.device)).flatten(1)
        account.step(logits, z, children)
        nodes, bounds, dropped = keep_bounded(children, z, width)
        pruned = torch.maximum(pruned, dropped)
        lap("beam levels")

    # 3. leaf scan
    ranked, values = scan_leaves(index.leaf_keys, q, nodes, depth - scan, k, account, lap)
    if certify is not None:
        certify["pruned_bound"] = pruned
        certify["certified"] = values[:, -1] >= pruned
    visited = torch.full(
        (1, num_queries), bound_visited_nodes(schedule, depth), dtype=torch.long, device=q.device
    )
    return rt.ReadResult(ranked.unsqueeze(0), visited, account.read_bytes)


def bound_visited_nodes(schedule: Schedule, depth: int) -> int:
    """Nodes a max-closure read scores per query: every depth-L0 node (the root at L0 = 0), both
    children of every node kept at a beam level, every leaf scanned (counted once)."""
    kept = kept_per_depth(schedule)
    visited = 2**schedule.dense_depth + 2 * sum(kept[:-1])
    return visited + (
        kept[-1] * 2 ** (depth - schedule.scan_depth) if schedule.scan_depth < depth else 0
    )


def bound_schedule_cost(schedule: Schedule, depth: int, m: int) -> float:
    """Work per query of a max-closure read, in balls scored by the dense top (see BOUND_PAIR_COST):
    the dense top's 2^L0 x min(m, 2^(D - L0)) balls (none at L0 = 0), each pair entering a beam
    level (a fixed part plus its children's balls), each node kept for the scan and each leaf
    scanned. Counted, not timed, so the schedule calibration picks is deterministic."""
    kept = kept_per_depth(schedule)
    g = m.bit_length() - 1
    dense = 0 if schedule.dense_depth == 0 else 2 ** min(schedule.dense_depth + g, depth)
    pairs = sum(kept[:-1])
    balls = sum(
        2 * kept_here * 2 ** (min(level + g, depth) - level)
        for kept_here, level in zip(kept[:-1], range(schedule.dense_depth + 1, depth + 1))
    )
    scanned = kept[-1] * 2 ** (depth - schedule.scan_depth)
    return (
        dense
        + BOUND_PAIR_COST * pairs
        + BOUND_PAIR_BALL_COST * balls
        + BOUND_SCAN_PAIR_COST * kept[-1]
        + BOUND_LEAF_COST * scanned
    )
