"""Translator scaling: TreeHeap encoder + READ vs dense attention, forward+backward time and memory against N.

Per source length N (default 32 ... 1,024 leaves, powers of two; all leaves occupied), batch B
(default 8), width d = 128, T decoder queries (default 32, a target sentence), two models built
from the same parts as the translator study (models/treeheap.py, models/treeheap_translator/model.py):

- TreeHeap: WRITE (embedding of N random piece ids) -> Butterfly (log2 N rounds, F and G MLPs of
  hidden 128) -> lifting FOLD level by level to the root (P, U~ MLPs of hidden 128) -> recursive
  READ: `Read.keys` once, then `Read.forward` for each of the T queries (m = 64).
- dense: the same WRITE -> one single-head softmax self-attention layer over the N leaves (q, k, v,
  out projections of width d, explicit N x N score matrix, no fused kernel, no residual) -> dense
  attention read as the study's flat_seq arm: keys = MLP(d, 128, m) of the N encoder states once,
  then per query softmax_i(q(h).k_i / sqrt(m)) over the N states, context = weighted sum of states.

The T queries are fixed random decoder states (B x T x d), read one at a time as the decoder does;
the loss is the sum of all contexts, so backward runs through every part. Per N and model:
- time: median wall clock of `--repeats` forward+backward passes after warm-up, tree and dense
  interleaved so drift in machine load hits both alike (CUDA: synchronized before and after); on
  CPU also the median process CPU time of the same passes (steadier when the machine is busy);
- memory: CPU, peak resident-set growth during one forward+backward (`peak_rss_growth_mb`, after
  gc + malloc_trim); CUDA, torch.cuda.max_memory_allocated after reset_peak_memory_stats, minus
  what was allocated before (parameters and inputs excluded);
- GFLOP: matmul/einsum floating-point operations of one forward+backward (torch FlopCounterMode;
  elementwise ops not counted);
- saved MB: tensors autograd keeps for backward (deduplicated by storage, parameters excluded), an
  allocator-independent count of activation memory.
Then the growth exponent of each (least-squares slope of log value against log N) over all sizes
and over the largest half (at small N fixed per-op overheads dominate), with what N log N and N^2
would give over the same sizes, and lines of conclusion computed from the numbers. Unless
`--no-stages`, each part is also timed alone (its input detached, loss = sum of its outputs; process
CPU time on CPU, wall on CUDA) with its GFLOP: Butterfly, FOLD, READ; attention, dense read.

    python benchmarks/translator_scaling.py [--sizes 32,64,128,256,512,1024] [--batch 8] [--queries 32]
        [--repeats 5] [--threads 1] [--device cpu|cuda] [--json PATH] [--no-stages] [--quick]
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from gates.models.common import peak_rss_growth_mb
from gates.models.treeheap import Butterfly, Fold, Read, fold_levels, mlp

D, HIDDEN, M, VOCAB = 128, 128, 64, 4000
WARMUP = 2


def log(line: str) -> None:
    """Progress goes to stderr; the tables go to stdout."""
    print(line, file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------ models
class TreeModel(nn.Module):
    """WRITE -> Butterfly -> lifting FOLD -> recursive READ (keys once, one READ per query)."""

    def __init__(self, n: int, d: int = D, hidden: int = HIDDEN, m: int = M, vocab: int = VOCAB):
        super().__init__()
        depth = depth_of(n)
        self.embed = nn.Embedding(vocab, d)
        self.butterfly = Butterfly(d, hidden, depth)
        self.fold = Fold(d, hidden, "lifting")
        self.read = Read(d, d, m, depth)

    def write(self, src, mask):
        return self.butterfly(self.embed(src), mask)

    def encode(self, leaves, mask):
        states, _, masks = fold_levels(self.fold, leaves, mask)
        return states, masks

    def contexts(self, states, masks, queries):
        keys = self.read.keys(states, masks)
        return torch.stack([self.read(queries[:, t], keys)[0] for t in range(queries.shape[1])], 1)

    def forward(self, src, mask, queries):
        return self.contexts(*self.encode(self.write(src, mask), mask), queries)


class DenseModel(nn.Module):
    """WRITE -> one single-head softmax self-attention layer -> dense attention read (flat_seq's)."""

    def __init__(self, d: int = D, hidden: int = HIDDEN, m: int = M, vocab: int = VOCAB):
        super().__init__()
        self.m = m
        self.embed = nn.Embedding(vocab, d)
        self.q, self.k, self.v, self.out = (nn.Linear(d, d) for _ in range(4))
        self.attn_query, self.attn_key = nn.Linear(d, m), mlp(d, hidden, m)

    def write(self, src, mask):
        return self.embed(src)

    def encode(self, x, mask):
        scores = self.q(x) @ self.k(x).transpose(1, 2) / math.sqrt(x.shape[-1])  # B x N x N
        return self.out(torch.softmax(scores, -1) @ self.v(x)), mask

    def contexts(self, states, mask, queries):
        keys = self.attn_key(states)
        out = []
        for t in range(queries.shape[1]):
            scores = torch.einsum("bnm,bm->bn", keys, self.attn_query(queries[:, t])) / math.sqrt(
                self.m
            )
            out.append(torch.einsum("bn,bnd->bd", torch.softmax(scores, -1), states))
        return torch.stack(out, 1)

    def forward(self, src, mask, queries):
        return self.contexts(*self.encode(self.write(src, mask), mask), queries)


def depth_of(n: int) -> int:
    depth = int(round(math.log2(n))) if n > 1 else 0
    if n < 2 or 2**depth != n:
        raise ValueError(f"--sizes: {n} is not a power of two >= 2")
    return depth


def make_inputs(n: int, batch: int, queries: int, device: torch.device, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    src = torch.randint(VOCAB, (batch, n), generator=generator)
    mask = torch.ones(batch, n, dtype=torch.bool)
    h = torch.randn(batch, queries, D, generator=generator)
    return src.to(device), mask.to(device), h.to(device)


def make_models(n: int, device: torch.device, seed: int = 0) -> dict[str, nn.Module]:
    torch.manual_seed(seed)
    return {"tree": TreeModel(n).to(device), "dense": DenseModel().to(device)}


# ------------------------------------------------------------------------------------ measuring
def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train_pass(model: nn.Module, inputs) -> None:
    """One forward+backward; gradients start from None, so their memory is part of the pass."""
    model.zero_grad(set_to_none=True)
    model(*inputs).sum().backward()


def timed_ms(fn, device: torch.device) -> tuple[float, float]:
    """(wall ms, process CPU ms) of one call."""
    sync(device)
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    sync(device)
    return 1000 * (time.perf_counter() - wall), 1000 * (time.process_time() - cpu)


def interleaved_ms(
    fns: dict, repeats: int, device: torch.device, warmup: int = WARMUP
) -> tuple[dict[str, float], dict[str, float]]:
    """Median wall ms and median process CPU ms of each function, timed in turn (warm-up first) so
    machine-load drift hits all alike. On a busy machine the CPU time is the steadier of the two: a
    one-thread process that waits for a core is not charged for the wait."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    walls, cpus = {name: [] for name in fns}, {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            wall, cpu = timed_ms(fn, device)
            walls[name].append(wall)
            cpus[name].append(cpu)
    return (
        {name: statistics.median(v) for name, v in walls.items()},
        {name: statistics.median(v) for name, v in cpus.items()},
    )


def release_free_memory() -> None:
    """Return freed heap memory to the system, so a later RSS peak counts memory the pass needs
    rather than free blocks earlier passes left behind (glibc only; elsewhere a no-op)."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def peak_mb(fn, device: torch.device) -> float:
    if device.type == "cuda":
        sync(device)
        gc.collect()
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        fn()
        sync(device)
        return (torch.cuda.max_memory_allocated(device) - before) / 2**20
    release_free_memory()
    return peak_rss_growth_mb(fn)


def gflop(fn) -> float:
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops() / 1e9


def saved_mb(model: nn.Module, inputs) -> float:
    """MB of the tensors autograd saves for backward in one forward (each storage once, no parameters)."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    storages: dict[int, int] = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in params:
            storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        out = model(*inputs)
    del out
    return sum(storages.values()) / 2**20


def stage_fns(models: dict, inputs) -> dict[str, callable]:
    """Each part alone, forward+backward, its input detached (requires grad), loss = sum of its outputs."""
    src, mask, queries = inputs
    tree, dense = models["tree"], models["dense"]
    with torch.no_grad():
        embedded = tree.embed(src)
        leaves = tree.write(src, mask)
        states, masks = tree.encode(leaves, mask)
        x = dense.write(src, mask)
        encoded, _ = dense.encode(x, mask)
    leaves_in, embedded_in, x_in = (t.detach().requires_grad_() for t in (leaves, embedded, x))
    states_in = [s.detach().requires_grad_() for s in states]
    encoded_in = encoded.detach().requires_grad_()

    def run(model, loss_fn):
        def fn():
            model.zero_grad(set_to_none=True)
            loss_fn().backward()

        return fn

    return {
        "tree butterfly": run(tree, lambda: tree.butterfly(embedded_in, mask).sum()),
        "tree fold": run(tree, lambda: sum(s.sum() for s in tree.encode(leaves_in, mask)[0])),
        "tree read": run(tree, lambda: tree.contexts(states_in, masks, queries).sum()),
        "dense attention": run(dense, lambda: dense.encode(x_in, mask)[0].sum()),
        "dense read": run(dense, lambda: dense.contexts(encoded_in, mask, queries).sum()),
    }


def measure(n: int, args, device: torch.device) -> dict:
    models = make_models(n, device, args.seed)
    inputs = make_inputs(n, args.batch, args.queries, device, args.seed)
    passes = {
        name: (lambda model=model: train_pass(model, inputs)) for name, model in models.items()
    }
    result = {"n": n}
    result["ms"], result["cpu_ms"] = interleaved_ms(passes, args.repeats, device)
    if device.type != "cpu":  # host CPU time says little about GPU work
        del result["cpu_ms"]
    result["mb"] = {name: peak_mb(fn, device) for name, fn in passes.items()}
    result["gflop"] = {name: gflop(fn) for name, fn in passes.items()}
    result["saved_mb"] = {name: saved_mb(model, inputs) for name, model in models.items()}
    if args.stages:
        stages = stage_fns(models, inputs)
        wall, cpu = interleaved_ms(stages, args.repeats, device, warmup=1)
        result["stage_ms"] = (
            cpu if device.type == "cpu" else wall
        )  # CPU time on CPU: steadier under load
        result["stage_gflop"] = {name: gflop(fn) for name, fn in stages.items()}
    return result


# ------------------------------------------------------------------------------------ analysis
def fit_exponent(ns: list[int], values: list[float]) -> float:
    """Least-squares slope of log value against log N (points with a positive finite value; NaN if < 2)."""
    points = [(math.log(n), math.log(v)) for n, v in zip(ns, values) if v > 0 and math.isfinite(v)]
    if len(points) < 2:
        return float("nan")
    mx = sum(x for x, _ in points) / len(points)
    my = sum(y for _, y in points) / len(points)
    sxx = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else float("nan")


def largest_half(ns: list[int]) -> list[int]:
    ordered = sorted(ns)
    return ordered[len(ordered) // 2 :] if len(ordered) >= 4 else ordered


def exponents(results: list[dict], metric: str, name: str) -> tuple[float, float]:
    ns = [r["n"] for r in results]
    top = largest_half(ns)
    values = {r["n"]: r[metric][name] for r in results}
    return fit_exponent(ns, [values[n] for n in ns]), fit_exponent(top, [values[n] for n in top])


def ratio(a: float, b: float) -> float:
    return a / b if b > 0 and math.isfinite(a) and math.isfinite(b) else float("nan")


def fmt(value: float, spec: str) -> str:
    return "n/a" if not math.isfinite(value) else format(value, spec)


TOLERANCE = 0.15  # an exponent within this of a reference is "consistent with" it


def growth_words(exponent: float, reference: float, name: str) -> str:
    """How a fitted exponent compares with a reference exponent (N log N's over the same sizes, or 2)."""
    if not math.isfinite(exponent):
        return "undetermined"
    if abs(exponent - reference) <= TOLERANCE:
        return f"consistent with {name}"
    return f"{'steeper' if exponent > reference else 'flatter'} than {name}"


def conclusion(results: list[dict], references: dict) -> list[str]:
    """Lines computed from the numbers: who is faster at the largest N, the crossover, the growth."""
    last = results[-1]
    n = last["n"]
    lines = []
    speed = ratio(last["ms"]["dense"], last["ms"]["tree"])
    words = f"{speed:.2f}x faster" if speed >= 1 else f"{1 / speed:.2f}x slower"
    memory = ratio(last["mb"]["tree"], last["mb"]["dense"])
    faster = [r["n"] for r in results if r["ms"]["tree"] < r["ms"]["dense"]]
    crossover = (
        f"the tree is faster from N = {faster[0]:,}"
        if faster
        and all(r["ms"]["tree"] < r["ms"]["dense"] for r in results if r["n"] >= faster[0])
        else f"the tree is faster at N = {', '.join(f'{x:,}' for x in faster)}"
        if faster
        else "the tree is slower at every N measured"
    )
    lines.append(
        f"At N = {n:,} the TreeHeap pass is {words} than dense ({last['ms']['tree']:.1f} vs "
        f"{last['ms']['dense']:.1f} ms) and peaks at {fmt(memory, '.2f')}x its memory "
        f"({fmt(last['mb']['tree'], '.1f')} vs {fmt(last['mb']['dense'], '.1f')} MB); {crossover}."
    )
    top = references["top"]
    for metric, label in (("ms", "time"), ("mb", "memory")):
        tree, dense = exponents(results, metric, "tree")[1], exponents(results, metric, "dense")[1]
        tree_words = growth_words(tree, top, "N log N")
        dense_words = growth_words(dense, 2.0, "N^2") + (
            f", nearer {'N^2' if abs(dense - 2.0) < abs(dense - top) else 'N log N'}"
            if math.isfinite(dense)
            else ""
        )
        # borne out: the tree grows no faster than N log N (within the tolerance) and dense is nearer N^2 than N log N
        holds = tree <= top + TOLERANCE and abs(dense - 2.0) < abs(dense - top)
        lines.append(
            f"Growth of {label} over the largest half of sizes: tree N^{fmt(tree, '.2f')} ({tree_words}, "
            f"N log N = N^{top:.2f} here), dense N^{fmt(dense, '.2f')} ({dense_words}); tree minus dense "
            f"{fmt(tree - dense, '+.2f')}: the claim O(N log N) vs O(N^2) is "
            f"{'borne out' if holds else 'NOT borne out'} by the measured {label} "
            f"(tolerance {TOLERANCE} on the tree's exponent)."
        )
    if "cpu_ms" in last:
        tree, dense = (
            exponents(results, "cpu_ms", "tree")[1],
            exponents(results, "cpu_ms", "dense")[1],
        )
        lines.append(
            f"Process CPU time (steadier than wall time on a busy machine) over the largest half: tree "
            f"N^{fmt(tree, '.2f')}, dense N^{fmt(dense, '.2f')}; at N = {n:,} tree/dense = "
            f"{ratio(last['cpu_ms']['tree'], last['cpu_ms']['dense']):.2f}."
        )
    tree, dense = exponents(results, "gflop", "tree")[1], exponents(results, "gflop", "dense")[1]
    lines.append(
        f"Arithmetic (GFLOP, free of timing noise) over the largest half: tree N^{fmt(tree, '.2f')}, dense "
        f"N^{fmt(dense, '.2f')}; at N = {n:,} the tree does "
        f"{ratio(last['gflop']['tree'], last['gflop']['dense']):.2f}x the dense arithmetic and keeps "
        f"{fmt(ratio(last['saved_mb']['tree'], last['saved_mb']['dense']), '.2f')}x "
        f"its tensors for backward."
    )
    if "stage_ms" in last:
        stages = last["stage_ms"]
        tree_parts = {k: v for k, v in stages.items() if k.startswith("tree")}
        top_part = max(tree_parts, key=tree_parts.get)
        share = tree_parts[top_part] / sum(tree_parts.values())
        ns = [r["n"] for r in results]
        top_ns = largest_half(ns)
        growth = fit_exponent(
            top_ns, [r["stage_ms"][top_part] for r in results if r["n"] in top_ns]
        )
        work = fit_exponent(
            top_ns, [r["stage_gflop"][top_part] for r in results if r["n"] in top_ns]
        )
        lines.append(
            f"Largest part of the tree's {'CPU ' if 'cpu_ms' in last else ''}time at N = {n:,}: "
            f"{top_part[5:]} ({share:.0%} of the parts' sum), growing as N^{fmt(growth, '.2f')} in time and "
            f"N^{fmt(work, '.2f')} in GFLOP over the largest half."
        )
    return lines


# ------------------------------------------------------------------------------------ output
def print_header(args, device: torch.device) -> None:
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"
    where = (
        f"{torch.cuda.get_device_name(device)}"
        if device.type == "cuda"
        else f"CPU, torch threads {torch.get_num_threads()} (machine: {os.cpu_count()} cores, load average {load})"
    )
    memory = (
        "CUDA max_memory_allocated after reset_peak_memory_stats, minus allocated before"
        if device.type == "cuda"
        else "peak RSS growth (models.common.peak_rss_growth_mb, after malloc_trim)"
    )
    print(f"device: {where}; torch {torch.__version__}")
    print(
        f"TreeHeap = WRITE -> Butterfly (log2 N rounds) -> lifting FOLD to the root -> READ.keys once + "
        f"READ.forward per query (d {D}, hidden {HIDDEN}, m {M})"
    )
    print(
        f"dense    = WRITE -> single-head softmax self-attention (q, k, v, out of width {D}; explicit N x N "
        f"scores) -> flat_seq read (key MLP hidden {HIDDEN}, m {M}, softmax over N per query)"
    )
    print(
        f"batch {args.batch}, {args.queries} queries read one at a time, all leaves occupied, loss = sum of the "
        f"contexts; one pass = forward + backward"
    )
    print(
        f"time: median wall clock of {args.repeats} passes after {WARMUP} warm-up, tree and dense interleaved"
        f"{' (cpu t/d: the same for process CPU time)' if device.type == 'cpu' else ''}; memory: "
        f"{memory}; GFLOP: matmul/einsum of one pass (FlopCounterMode); saved: tensors kept for backward"
    )


def print_table(results: list[dict]) -> None:
    header = (
        f"{'N':>6} {'tree ms':>9} {'dense ms':>9} {'t/d':>6} {'cpu t/d':>7} "
        f"{'tree MB':>8} {'dense MB':>9} {'t/d':>6} "
        f"{'tree GF':>8} {'dense GF':>9} {'t/d':>6} {'tree sv MB':>10} {'dense sv MB':>11}"
    )
    print(header)
    print("-" * len(header))
    for r in results:
        ms, mb, gf, sv = r["ms"], r["mb"], r["gflop"], r["saved_mb"]
        cpu = ratio(r["cpu_ms"]["tree"], r["cpu_ms"]["dense"]) if "cpu_ms" in r else float("nan")
        print(
            f"{r['n']:>6,} {ms['tree']:>9.1f} {ms['dense']:>9.1f} {ratio(ms['tree'], ms['dense']):>6.2f} "
            f"{fmt(cpu, '.2f'):>7} "
            f"{fmt(mb['tree'], '.1f'):>8} {fmt(mb['dense'], '.1f'):>9} "
            f"{fmt(ratio(mb['tree'], mb['dense']), '.2f'):>6} "
            f"{gf['tree']:>8.2f} {gf['dense']:>9.2f} {ratio(gf['tree'], gf['dense']):>6.2f} "
            f"{sv['tree']:>10.1f} {sv['dense']:>11.1f}"
        )


def print_exponents(results: list[dict], references: dict) -> None:
    ns = [r["n"] for r in results]
    top = largest_half(ns)
    print(
        f"\ngrowth exponents (slope of log value vs log N): all sizes {ns[0]:,}-{ns[-1]:,} | largest half "
        f"{top[0]:,}-{top[-1]:,}   (N log N would give {references['all']:.2f} | {references['top']:.2f}; "
        f"N^2 gives 2)"
    )
    for metric, label in (
        ("ms", "time"),
        ("cpu_ms", "cpu"),
        ("mb", "memory"),
        ("gflop", "GFLOP"),
        ("saved_mb", "saved"),
    ):
        if metric not in results[0]:
            continue
        cells = []
        for name in ("tree", "dense"):
            every, half = exponents(results, metric, name)
            cells.append(f"{name} {fmt(every, '.2f')} | {fmt(half, '.2f')}")
        print(f"  {label:<7} " + "    ".join(cells))


def print_stages(results: list[dict]) -> None:
    if "stage_ms" not in results[0]:
        return
    names = list(results[0]["stage_ms"])
    clock = "process CPU" if "cpu_ms" in results[0] else "wall"
    print(
        f"\nparts alone, forward+backward: {clock} ms (GFLOP)   (input detached, loss = sum of outputs; median, "
        f"interleaved)"
    )
    print(f"{'N':>6} " + " ".join(f"{name:>18}" for name in names))
    for r in results:
        print(
            f"{r['n']:>6,} "
            + " ".join(
                f"{r['stage_ms'][name]:>9.1f} ({r['stage_gflop'][name]:>6.2f})" for name in names
            )
        )
    ns = [r["n"] for r in results]
    top = largest_half(ns)
    cells = []
    for name in names:
        ms = fit_exponent(top, [r["stage_ms"][name] for r in results if r["n"] in top])
        gf = fit_exponent(top, [r["stage_gflop"][name] for r in results if r["n"] in top])
        cells.append(f"{fmt(ms, '.2f'):>9} ({fmt(gf, '6.2f'):>6})")
    print(f"{'exp':>6} " + " ".join(cells) + "   (largest half)")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sizes", default="32,64,128,256,512,1024", help="comma-separated N (powers of two)"
    )
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--queries", type=int, default=32, help="T decoder queries per sentence")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--threads", type=int, default=1, help="torch CPU threads (also with --device cuda)"
    )
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:index]")
    parser.add_argument("--json", type=Path, default=None, help="write the numbers to this file")
    parser.add_argument(
        "--no-stages", dest="stages", action="store_false", help="skip timing the parts alone"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--quick", action="store_true", help="sizes 8,16,32,64, batch 2, 4 queries, 2 repeats"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes, args.batch, args.queries, args.repeats = "8,16,32,64", 2, 4, 2
    try:  # bad options: one line naming the option, exit status 2 (parser.error)
        sizes = sorted({int(s) for s in args.sizes.split(",")})
    except ValueError:
        parser.error(f"--sizes: expected comma-separated integers, got {args.sizes!r}")
    try:
        for n in sizes:
            depth_of(n)
    except ValueError as error:
        parser.error(str(error))
    if min(args.batch, args.queries, args.repeats, args.threads) < 1:
        parser.error("--batch, --queries, --repeats and --threads must be >= 1")
    try:
        device = torch.device(args.device)
    except RuntimeError:
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        parser.error(f"--device: expected cpu or cuda[:index], got {args.device!r}")
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device")

    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        started = time.perf_counter()
        print_header(args, device)
        results = []
        for n in sizes:
            log(f"N = {n:,}")
            results.append(measure(n, args, device))
        references = {
            "all": fit_exponent(sizes, [n * math.log2(n) for n in sizes]),
            "top": fit_exponent(
                largest_half(sizes), [n * math.log2(n) for n in largest_half(sizes)]
            ),
        }
        print()
        print_table(results)
        print_exponents(results, references)
        print_stages(results)
        print()
        for line in conclusion(results, references):
            print(line)
        load = (
            ", ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"
        )
        print(f"wall time {time.perf_counter() - started:.0f} s; load average now {load}")
    finally:  # the thread count is process-wide: leave it as the caller had it
        torch.set_num_threads(threads)

    report = {
        "device": str(device),
        "threads": args.threads,
        "batch": args.batch,
        "queries": args.queries,
        "repeats": args.repeats,
        "d": D,
        "hidden": HIDDEN,
        "m": M,
        "results": results,
        "exponents": {
            metric: {
                name: dict(zip(("all", "largest_half"), exponents(results, metric, name)))
                for name in ("tree", "dense")
            }
            for metric in ("ms", "cpu_ms", "mb", "gflop", "saved_mb")
            if metric in results[0]
        },
        "nlogn_reference": references,
    }
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2, allow_nan=True))
        print(f"numbers written to {args.json}")
    return report


if __name__ == "__main__":
    main()
