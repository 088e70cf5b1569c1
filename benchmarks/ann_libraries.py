"""The outside reference of benchmarks/tree_read.py: the inner-product search libraries a
practitioner would pick, each calibrated by the tree reads' own rule, and the physical floor.

Every library's setting must bring the lower one-sided 95% bound of its fit recall@10 (mean - 1.645
standard errors over the fit queries) to the target, on the same fit queries as the trees; where a
library has a structural choice (lists, leaves, graph degree, re-rank size), each value of a grid
is calibrated and the fastest on the FIT queries is kept (timed: what a practitioner would do), the
grid extended past an edge its best sits at (`interior_best`).

- faiss IVF-Flat (inner product): nlist from 0.5, 1, 2, 4, 8 x sqrt(N) (faiss's rule of thumb is
  4 sqrt(N)), nprobe calibrated per nlist.
- faiss IVF-PQ: IVF at IVF-Flat's nlist, 4-bit fast-scan PQ (d/2 sub-quantizers), exact re-rank of
  k_factor x 10 (4, 16, 64), nprobe calibrated per k_factor.
- faiss HNSW on the L2 reduction: each key gets the coordinate sqrt(max|x|^2 - |x|^2), each query 0,
  so the nearest in L2 are the largest inner products (the usual reduction; a proximity graph on raw
  inner products is weak); M from 8, 16, 32, 64, efConstruction 200, efSearch calibrated.
- ScaNN (tree + asymmetric hashing + exact re-rank, its documented configuration: `tree(num_leaves,
  num_leaves_to_search)`, `score_ah(2, anisotropic_quantization_threshold)`, `reorder(R)`): the
  threshold 0.2 x the mean key norm (ScaNN's 0.2 is stated for unit-norm data; its anisotropic
  loss weighs inner products relative to the key's norm), num_leaves from 0.5, 1, 2, 4, 8 x sqrt(N),
  re-rank size from 20, 40, 80, 160, 320, leaves_to_search calibrated per pair.
- The floor: an oracle that reads only the 10 true neighbours' rows of each query (gather, dot
  products, top 10): no read that returns them can touch fewer full-precision rows.

Each row carries `bytes_per_query`: an estimate of the bytes a read touches per query, counted from
the work it reports (vectors scored x their bytes; codes at their size), so the table shows how far
every method is from the floor's 0.95 x 10 rows.
"""

from __future__ import annotations

import math
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from read_common import (
    K,
    Row,
    calibrate_int,
    fit_lower_bound,
    interior_best,
    log,
    measured,
    median_ms,
)

from gates.models import relation_tree as rt

IVF_NLIST_FACTORS = (0.5, 1, 2, 4, 8)  # x sqrt(N)
IVFPQ_K_FACTORS = (4, 16, 64)  # IVF-PQ re-ranks k_factor x 10 candidates exactly
HNSW_MS = (8, 16, 32, 64)  # graph degree M of HNSW on the L2 reduction
HNSW_EF_CONSTRUCTION = 200
SCANN_LEAF_FACTORS = (0.5, 1, 2, 4, 8)  # x sqrt(N)
SCANN_REORDER = (20, 40, 80, 160, 320)
SCANN_THRESHOLD = 0.2  # x the mean key norm


class Calibrator:
    """The rule shared by every library: the smallest integer setting whose fit recall's lower bound
    reaches the target, searched by doubling then bisection (`calibrate_int`)."""

    def __init__(self, keys: torch.Tensor, fit_queries: torch.Tensor, target: float):
        self.fit_target = rt.dense_topk(keys, fit_queries, K)
        self.target = target

    def smallest(self, search, start: int, upper: int, name: str) -> tuple[int, float, float]:
        """search(value) -> ids (Q, K) on the fit queries. Returns (value, fit recall, lower bound)."""
        memo: dict[int, tuple[float, float]] = {}

        def bound_at(value: int) -> float:
            ids = torch.as_tensor(np.asarray(search(value), dtype=np.int64))
            memo[value] = fit_lower_bound(ids.unsqueeze(0), self.fit_target)
            log(
                f"    {name} {value}: fit recall {memo[value][0]:.4f} (lower bound {memo[value][1]:.4f})"
            )
            return memo[value][1]

        value, _ = calibrate_int(bound_at, start, upper, self.target)
        return value, *memo[value]


def library_rows(faiss, scann, keys, fit_queries, eval_queries, target, args) -> list[Row]:
    """The library rows over the original key order (ids = original leaf ids): faiss IVF-Flat,
    IVF-PQ and HNSW-L2 when faiss is given, ScaNN when scann is given."""
    n, d = keys.shape[1:]
    base = np.ascontiguousarray(keys[0].numpy(), dtype=np.float32)
    fit_np = np.ascontiguousarray(fit_queries.numpy(), dtype=np.float32)
    eval_np = np.ascontiguousarray(eval_queries.numpy(), dtype=np.float32)
    calibrator = Calibrator(keys, fit_queries, args.target)
    rows: list[Row] = []
    if faiss is not None:
        ivf_row = ivf_flat(faiss, base, fit_np, eval_np, target, calibrator, args)
        rows.append(ivf_row)
        if not args.no_ivfpq:
            rows.append(ivf_pq(faiss, base, fit_np, eval_np, target, calibrator, args, ivf_row))
        rows.append(hnsw_l2(faiss, base, fit_np, eval_np, target, calibrator, args))
    if scann is not None:
        rows.append(scann_row(scann, base, fit_np, eval_np, target, calibrator, args))
    return rows


def eval_recall(ids, target) -> float:
    return rt.topk_recall(torch.as_tensor(np.asarray(ids, dtype=np.int64)).unsqueeze(0), target, K)


def counted_search(index, queries, target, stats) -> tuple[float, float]:
    """Recall@10 of one faiss search of the evaluation queries, and the distance computations faiss
    counted in it (`stats`: its IVF or HNSW counters) per query."""
    stats.reset()
    recall = eval_recall(index.search(queries, K)[1], target)
    return recall, stats.ndis / len(queries)


def grid_note(results: dict, unit: str, at_edge: bool) -> str:
    cells = ", ".join(f"{value}: {result[1]:.1f} ms" for value, result in sorted(results.items()))
    return f"fit-query ms per {unit} {cells}" + ("; best at the grid edge" if at_edge else "")


def double_or_none(limit):
    return lambda value: None if value * 2 > limit else value * 2


def half_or_none(floor):
    return lambda value: None if value // 2 < floor else value // 2


# ------------------------------------------------------------------------------------ faiss
def ivf_flat(faiss, base, fit_np, eval_np, target, calibrator, args) -> Row:
    n, d = base.shape
    started = time.perf_counter()

    def evaluate(nlist: int):
        quantizer = faiss.IndexFlatIP(d)
        ivf = faiss.IndexIVFFlat(quantizer, d, nlist, faiss.METRIC_INNER_PRODUCT)
        ivf.cp.min_points_per_centroid = 1  # only silences faiss's "few training points" warning
        ivf.train(base)
        ivf.add(base)

        def search(nprobe: int):
            ivf.nprobe = nprobe
            return ivf.search(fit_np, K)[1]

        nprobe, fit_recall, lower = calibrator.smallest(
            search, 1, nlist, f"IVF nlist {nlist} nprobe"
        )
        ivf.nprobe = nprobe
        fit_ms = median_ms(lambda: ivf.search(fit_np, K), args.repeats)
        log(f"    IVF nlist {nlist}: nprobe {nprobe}, {fit_ms:.1f} ms on the fit queries")
        return lower < args.target, fit_ms, (ivf, quantizer, nprobe, fit_recall)

    grid = sorted({max(1, round(f * math.sqrt(n))) for f in IVF_NLIST_FACTORS})
    nlist, results, at_edge = interior_best(evaluate, grid, half_or_none(1), double_or_none(n // 4))
    failed, _, (ivf, _, nprobe, fit_recall) = results[nlist]
    prep = time.perf_counter() - started
    recall, scanned = counted_search(ivf, eval_np, target, faiss.cvar.indexIVF_stats)
    read = lambda: ivf.search(eval_np, K)  # noqa: E731
    row = Row(
        "faiss IVF-Flat",
        f"nlist {nlist}, nprobe {nprobe} ({nprobe / nlist:.1%} of lists; fit rec {fit_recall:.3f}"
        f"{', NOT reached' if failed else ''}; {grid_note(results, 'nlist', at_edge)})",
        recall,
        scanned / n,
        "keys scanned/N",
        median_ms(read, args.repeats),
        prep,
        {"read": read, "nlist": nlist, "nprobe": nprobe, "reached": not failed, "at_edge": at_edge},
        key="faiss_ivf",
        bytes_per_query=(scanned + nlist) * 4 * d,
    )
    return measured(row, read, n, len(faiss.serialize_index(ivf)))


def ivf_pq(faiss, base, fit_np, eval_np, target, calibrator, args, ivf_row: Row) -> Row:
    """IVF-PQ (4-bit fast scan) with an exact re-rank, at IVF-Flat's nlist."""
    n, d = base.shape
    nlist = ivf_row.extra["nlist"]
    started = time.perf_counter()
    pq = faiss.index_factory(d, f"IVF{nlist},PQ{d // 2}x4fs,RFlat", faiss.METRIC_INNER_PRODUCT)
    faiss.extract_index_ivf(faiss.downcast_index(pq.base_index)).cp.min_points_per_centroid = 1
    pq.train(base)
    pq.add(base)
    space = faiss.ParameterSpace()

    def evaluate(k_factor: int):
        space.set_index_parameter(pq, "k_factor_rf", k_factor)

        def search(nprobe: int):
            space.set_index_parameter(pq, "nprobe", nprobe)
            return pq.search(fit_np, K)[1]

        probe, fit_recall, lower = calibrator.smallest(
            search, 1, nlist, f"IVF-PQ k_factor {k_factor} nprobe"
        )
        space.set_index_parameter(pq, "nprobe", probe)
        return (
            lower < args.target,
            median_ms(lambda: pq.search(fit_np, K), args.repeats),
            (probe, fit_recall),
        )

    k_factor, results, _ = interior_best(evaluate, IVFPQ_K_FACTORS, extend=0)
    failed, _, (probe, fit_recall) = results[k_factor]
    space.set_index_parameter(pq, "k_factor_rf", k_factor)
    space.set_index_parameter(pq, "nprobe", probe)
    prep = time.perf_counter() - started
    read = lambda: pq.search(eval_np, K)  # noqa: E731
    row = Row(
        "faiss IVF-PQ",
        f"IVF{nlist},PQ{d // 2}x4fs,RFlat: nprobe {probe}, k_factor {k_factor} (fit rec "
        f"{fit_recall:.3f}{', NOT reached' if failed else ''}; k_factors tried "
        f"{', '.join(str(k) for k in sorted(results))})",
        eval_recall(pq.search(eval_np, K)[1], target),
        None,
        "",
        median_ms(read, args.repeats),
        prep,
        {"read": read, "reached": not failed},
        key="faiss_ivfpq",
        # the probed lists' 4-bit codes (d/2 x 4 bits a key), the centroids, the re-ranked rows
        bytes_per_query=probe / nlist * n * d / 4 + nlist * 4 * d + k_factor * K * 4 * d,
    )
    return measured(row, read, n, len(faiss.serialize_index(pq)))


def l2_reduction(base: np.ndarray, queries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Keys [x, sqrt(R^2 - |x|^2)] with R the largest key norm, queries [q, 0]: |q' - x'|^2 =
    |q|^2 + R^2 - 2 q.x, so the L2-nearest keys are the largest inner products."""
    norms = np.linalg.norm(base, axis=1)
    extra = np.sqrt(np.maximum(norms.max() ** 2 - norms**2, 0.0))[:, None]
    keys = np.ascontiguousarray(np.concatenate([base, extra], 1), dtype=np.float32)
    pad = np.zeros((len(queries), 1), dtype=np.float32)
    return keys, np.ascontiguousarray(np.concatenate([queries, pad], 1))


def hnsw_l2(faiss, base, fit_np, eval_np, target, calibrator, args) -> Row:
    n, d = base.shape
    keys, fit_l2 = l2_reduction(base, fit_np)
    _, eval_l2 = l2_reduction(base, eval_np)
    started = time.perf_counter()
    builds = {}

    def evaluate(m: int):
        built = time.perf_counter()
        index = faiss.IndexHNSWFlat(d + 1, m)
        index.hnsw.efConstruction = HNSW_EF_CONSTRUCTION
        index.add(keys)
        builds[m] = time.perf_counter() - built

        def search(ef: int):
            index.hnsw.efSearch = ef
            return index.search(fit_l2, K)[1]

        ef, fit_recall, lower = calibrator.smallest(search, K, n, f"HNSW-L2 M {m} efSearch")
        index.hnsw.efSearch = ef
        fit_ms = median_ms(lambda: index.search(fit_l2, K), args.repeats)
        log(f"    HNSW-L2 M {m}: efSearch {ef}, {fit_ms:.1f} ms on the fit queries")
        return lower < args.target, fit_ms, (index, ef, fit_recall)

    m, results, at_edge = interior_best(evaluate, HNSW_MS, half_or_none(4), double_or_none(128))
    failed, _, (index, ef, fit_recall) = results[m]
    prep = time.perf_counter() - started
    recall, distances = counted_search(index, eval_l2, target, faiss.cvar.hnsw_stats)
    read = lambda: index.search(eval_l2, K)  # noqa: E731
    row = Row(
        "faiss HNSW-L2",
        f"M {m}, efConstruction {HNSW_EF_CONSTRUCTION}, efSearch {ef} (fit rec {fit_recall:.3f}"
        f"{', NOT reached' if failed else ''}; build {builds[m]:.1f} s; "
        f"{grid_note(results, 'M', at_edge)})",
        recall,
        distances / n,
        "dist comps/N",
        median_ms(read, args.repeats),
        prep,
        {"read": read, "reached": not failed, "at_edge": at_edge, "build_s": builds[m]},
        key="faiss_hnsw_l2",
        bytes_per_query=distances * 4 * (d + 1),
    )
    return measured(row, read, n, len(faiss.serialize_index(index)))


# ------------------------------------------------------------------------------------ ScaNN
def scann_bytes(searcher) -> int:
    """The searcher's serialized size: what it keeps in memory, as faiss's serialize_index."""
    folder = Path(tempfile.mkdtemp(prefix="scann-"))
    try:
        searcher.serialize(str(folder))
        return sum(path.stat().st_size for path in folder.iterdir())
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def scann_row(scann, base, fit_np, eval_np, target, calibrator, args) -> Row:
    n, d = base.shape
    threshold = SCANN_THRESHOLD * float(np.linalg.norm(base, axis=1).mean())
    started = time.perf_counter()
    builds = {}

    def evaluate(leaves: int):
        built = time.perf_counter()
        searcher = (
            scann.scann_ops_pybind.builder(base, K, "dot_product")
            .tree(num_leaves=leaves, num_leaves_to_search=1, training_sample_size=min(n, 250_000))
            .score_ah(2, anisotropic_quantization_threshold=threshold)
            .reorder(max(SCANN_REORDER))
            .set_n_training_threads(args.threads)
            .build()
        )
        searcher.set_num_threads(args.threads)
        builds[leaves] = time.perf_counter() - built

        def with_reorder(reorder: int):
            def search(to_search: int):
                return searcher.search_batched_parallel(
                    fit_np, K, pre_reorder_num_neighbors=reorder, leaves_to_search=to_search
                )[0]

            to_search, fit_recall, lower = calibrator.smallest(
                search, 1, leaves, f"ScaNN leaves {leaves} reorder {reorder} leaves_to_search"
            )
            fit_ms = median_ms(
                lambda: searcher.search_batched_parallel(
                    fit_np, K, pre_reorder_num_neighbors=reorder, leaves_to_search=to_search
                ),
                args.repeats,
            )
            return lower < args.target, fit_ms, (to_search, fit_recall)

        reorder, inner, inner_edge = interior_best(
            with_reorder, SCANN_REORDER, half_or_none(K), double_or_none(2560)
        )
        failed, fit_ms, (to_search, fit_recall) = inner[reorder]
        log(
            f"    ScaNN num_leaves {leaves}: reorder {reorder}, leaves_to_search {to_search}, "
            f"{fit_ms:.1f} ms on the fit queries ({grid_note(inner, 'reorder', inner_edge)})"
        )
        return failed, fit_ms, (searcher, reorder, to_search, fit_recall, inner, inner_edge)

    grid = sorted({max(2, round(f * math.sqrt(n))) for f in SCANN_LEAF_FACTORS})
    leaves, results, at_edge = interior_best(
        evaluate, grid, half_or_none(2), double_or_none(n // 50)
    )
    failed, _, (searcher, reorder, to_search, fit_recall, inner, inner_edge) = results[leaves]
    prep = time.perf_counter() - started

    def read():
        return searcher.search_batched_parallel(
            eval_np, K, pre_reorder_num_neighbors=reorder, leaves_to_search=to_search
        )

    row = Row(
        "ScaNN",
        f"tree-AH: num_leaves {leaves}, leaves_to_search {to_search} ({to_search / leaves:.1%}), "
        f"reorder {reorder}, AH 2 dims/block, threshold {threshold:.2f} (fit rec {fit_recall:.3f}"
        f"{', NOT reached' if failed else ''}; build {builds[leaves]:.1f} s; "
        f"{grid_note(results, 'num_leaves', at_edge)}; at {leaves}: "
        f"{grid_note(inner, 'reorder', inner_edge)})",
        eval_recall(read()[0], target),
        to_search / leaves,
        "leaves/num_leaves",
        median_ms(read, args.repeats),
        prep,
        {"read": read, "reached": not failed, "at_edge": at_edge or inner_edge},
        key="scann",
        # the searched leaves' 4-bit codes (d/2 blocks), the leaf centres, the re-ranked rows
        bytes_per_query=to_search / leaves * n * d / 4 + leaves * 4 * d + reorder * 4 * d,
    )
    return measured(row, read, n, scann_bytes(searcher))


# ------------------------------------------------------------------------------------ the floor
def floor_row(keys: torch.Tensor, eval_queries: torch.Tensor, target: torch.Tensor, args) -> Row:
    """An oracle given each query's 10 true neighbours: gather their rows, score them, sort them.
    Its latency is the least a read that touches those rows can take here; 0.95 x 10 rows is the
    least a read at recall 0.95 must touch."""
    n, d = keys.shape[1:]
    table, ids = keys[0], target[0]

    def read():
        rows = table.index_select(0, ids.flatten()).view(*ids.shape, d)
        return torch.einsum("qkd,qd->qk", rows, eval_queries).topk(K, dim=-1)

    row = Row(
        "floor (10 true rows)",
        f"oracle: gather + score + sort the 10 true neighbours' rows; a read at recall "
        f"{args.target} must touch at least {args.target * K * 4 * d:,.0f} bytes a query",
        1.0,
        K / n,
        "keys/N",
        median_ms(read, args.repeats),
        0.0,
        {"read": read},
        key="floor",
        bytes_per_query=args.target * K * 4 * d,
    )
    return measured(row, read, n, None)
