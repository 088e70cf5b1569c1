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
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

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
    size = 2 ** (depth - scan)
    pair_query = every_query.repeat_interleave(nodes.shape[1])
    scores = grouped_matmul(
        index.leaf_keys.view(-1, size, index.width), q, pair_query, nodes.flatten()
    )
    scores = scores.view(num_queries, -1)  # slot i: leaf i % size of kept node i // size
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
    visited = torch.full(
        (1, num_queries), visited_nodes(schedule, depth), dtype=torch.long, device=q.device
    )
    return rt.ReadResult(ranked.unsqueeze(0), visited, account.read_bytes)


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
    the cheapest of the widest tried: check `fit_lower` against the target)."""
    depth = index.depth
    top = max(0, depth // 2 - 3)  # chosen at N = 2^12..2^18 (d = 32, 64): D/2 - 2 or D/2 - 1
    dense_depths = (
        list(range(top, min(depth, top + 4) + 1)) if dense_depths is None else dense_depths
    )
    dense_top = rt.dense_topk(index.leaf_keys.unsqueeze(0), fit_queries, k)
    tried: list[tuple[Schedule, float, float]] = []
    memo: dict[Schedule, tuple[float, float]] = {}

    def bound(schedule: Schedule) -> float:
        """The lower confidence bound of the schedule's fit recall (read once, remembered)."""
        if schedule not in memo:
            with torch.inference_mode():
                recall = per_query_recall(
                    fast_read(index, fit_queries, schedule, k).leaves, dense_top, k
                )
            mean = float(recall.mean())
            memo[schedule] = mean, mean - z * float(recall.std()) / math.sqrt(len(recall))
            tried.append((schedule, *memo[schedule]))
            if on_try is not None:
                on_try(schedule, *memo[schedule])
        return memo[schedule][1]

    def candidate(schedule: Schedule) -> tuple[float, float, Schedule]:
        return schedule_cost(schedule, depth, index.m), bound(schedule), schedule

    candidates = []
    for dense in dense_depths:
        scans = range(dense, min(depth, dense + 4) + 1) if scan_depths is None else scan_depths
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
