"""What every read in benchmarks/tree_read.py and benchmarks/ann_libraries.py shares: the row a
method reports, its memory columns, the recall and the calibration rule, and the one timer every
latency comes from (warm repeated reads, or each after a cache-evicting sweep with `--cold`)."""

from __future__ import annotations

import ctypes
import math
import statistics
import sys
import time
from dataclasses import dataclass, field

import torch

from gates.models import relation_tree as rt
from gates.models import tree_read as tr
from gates.models.common import peak_rss_growth_mb

K = 10  # recall@10 throughout
Z = 1.645  # one-sided 95%: every method's fit recall must reach the target at this lower bound


def log(line: str) -> None:
    """Progress goes to stderr; the tables go to stdout."""
    print(line, file=sys.stderr, flush=True)


@dataclass
class Row:
    method: str
    setting: str
    recall: float  # recall@10 on evaluation queries
    visited: float | None  # share, see `of`
    of: str  # what the visited share counts
    latency_ms: float
    build_s: float  # index build + fit + calibration, seconds (not part of the latency)
    extra: dict = field(default_factory=dict)
    key: str = ""  # the method's name in --json
    index_bytes_per_key: float | None = None  # what the read keeps in memory, per key
    peak_rss_mb: float | None = None  # peak resident memory growth during one read
    # bytes the read touches per query, estimated from the work it counts (vectors scored x their
    # bytes; compressed codes at their size); None where the method reports no count
    bytes_per_query: float | None = None


def measured(row: Row, read, n: int, index_bytes: int | None) -> Row:
    """Fill a row's memory columns: index bytes per key and the peak RSS growth of one read.

    Freed heap memory is first handed back to the system (glibc's malloc_trim): otherwise a read
    that fits in what earlier reads freed shows no growth at all."""
    row.index_bytes_per_key = None if index_bytes is None else index_bytes / n
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: the growth may then read low
        pass
    process_peak_mb()  # the peak so far, before peak_rss_growth_mb resets it
    with torch.inference_mode():
        row.peak_rss_mb = peak_rss_growth_mb(read)
    process_peak_mb()
    return row


_PEAK_MB = [0.0]


def process_peak_mb() -> float:
    """The process's peak resident memory so far, MB (Linux VmHWM; `peak_rss_growth_mb` resets
    VmHWM for each read it measures, so every reading is kept here and the maximum returned)."""
    try:
        with open("/proc/self/status") as status:
            kb = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
        _PEAK_MB[0] = max(_PEAK_MB[0], kb / 1024)
    except (OSError, StopIteration, ValueError):
        pass
    return _PEAK_MB[0]


def tensor_bytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def recall_of(leaves: torch.Tensor, target: torch.Tensor) -> float:
    return rt.topk_recall(leaves, target, K)


def calibrate_int(recall_at, start: int, upper: int, target: float) -> tuple[int, float]:
    """Smallest integer setting in [start, upper] whose fit recall >= target (doubling, then bisection)."""
    return rt.smallest_passing(recall_at, target, start, upper)


def fit_lower_bound(ids: torch.Tensor, target: torch.Tensor) -> tuple[float, float]:
    """(mean, lower one-sided 95% bound) of the per-query top-10 recall of returned ids (1, Q, >= K)
    against the exact target (1, Q, K): the criterion every method's setting must bring to the target."""
    per = tr.per_query_recall(ids, target, K)
    mean = float(per.mean())
    return mean, mean - Z * float(per.std()) / math.sqrt(len(per))


def interior_best(evaluate, grid, lower=None, upper=None, extend: int = 3):
    """The best of a grid of settings, the grid extended past an edge its best sits at.

    evaluate(value) -> (failed, ms, payload); the best is the lowest (failed, ms). While the best sits
    at the grid's low (high) edge and lower(v) (upper(v)) gives a next value (None: nothing beyond),
    that value is tried too, at most `extend` times per side: a tuned setting at the edge of its
    range would say the range, not the method, decided. Returns (best value, {value: result},
    at_edge: the best still at an edge of a grid of more than one value)."""
    results = {value: evaluate(value) for value in grid}
    for _ in range(extend):
        best = min(results, key=lambda v: results[v][:2])
        ordered = sorted(results)
        step = lower if best == ordered[0] else upper if best == ordered[-1] else None
        following = None if step is None or len(ordered) < 2 else step(best)
        if following is None or following in results:
            break
        results[following] = evaluate(following)
    best = min(results, key=lambda v: results[v][:2])
    ordered = sorted(results)
    return best, results, len(ordered) > 1 and best in (ordered[0], ordered[-1])


# --cold: a buffer larger than any cache here (L3 32 MB on the benchmark machine), written through
# before each timed read, so that the read starts as it would after other work: index, queries and
# the read's own buffers out of the caches
COLD_BYTES = 512 * 2**20
_SWEEP: list[torch.Tensor] = []


def median_ms(fn, repeats: int) -> float:
    """Median ms of fn() over `repeats` calls after one warm-up (`models.relation_tree.time_read`);
    with `--cold`, each timed call right after a sweep through COLD_BYTES of memory. Every latency
    the benchmark reports comes from here."""
    if not _SWEEP:
        return rt.time_read(fn, repeats)
    with torch.inference_mode():
        fn()
        times = []
        for _ in range(repeats):
            _SWEEP[0].add_(1.0)  # writes every cache line of the buffer
            start = time.perf_counter()
            fn()
            times.append(1000 * (time.perf_counter() - start))
    return statistics.median(times)
