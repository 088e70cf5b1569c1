"""Training throughput: units (target tokens, examples) per second of one training step per study, the
code at a baseline commit against the code at HEAD, measured in the same run.

    python benchmarks/training_throughput.py                 # every study, 2 threads, baseline 6e708ad
    python benchmarks/training_throughput.py --studies translator_lifting --steps 5 --json out.json
    python benchmarks/training_throughput.py --device cuda   # the current code on the GPU (baseline: CPU)
    python benchmarks/training_throughput.py --current my-branch --baseline main   # any two commits

Each side is a clean checkout of its commit (`git archive REF`, the whole tree, unpacked into a
temporary folder), as a user would have it: the current side is HEAD (`--current`), never the
working tree, so uncommitted changes to gates/ or models/ are not measured. Each measurement is a
fresh subprocess (`--worker`) that imports that side's code alone, isolated as `gates certify`
isolates its re-runs under a claim's earlier code (gates/verify/_isolation.py: the editable
install's finder and this repository dropped from `sys.path`, the checkout first with its commit's
package layout and entry points, and a check that every module of the project came from the
checkout); the resolved files of gates, the studies package and the study module come back with each
measurement (printed once per side, and in the JSON). The step builders (here for the translator,
`study_steps.py` for the others) are the benchmark's own and work against both versions of the code.
A worker builds one study's model, optimizer and a fixed-size batch at the settings of its committed
contracts, runs `--warmup` steps, then times `--steps` steps. Baseline and current alternate
`--repeats` times and the best of each is kept, so load that comes and goes during the run touches
both sides alike.

Output: a table for people; with `--json PATH`
{"baseline": REF, "baseline_commit": SHA, "current": REF, "current_commit": SHA, "threads": T,
"device": D, "imports": {"baseline"|"current": {MODULE: FILE}}, "studies": {NAME: {"unit",
"baseline_per_s", "current_per_s", "ratio", ...}}}.

Per-step profile (`--profile`, the translator arms only, CPU): where one training step's time goes,
from `torch.profiler` over `--steps` steps of the current side's code (after `--warmup`), regions
marked from here (the model code has no markers and is not changed: its methods are wrapped in
`record_function` on the instance). Rows: the encoder (Butterfly, FOLD, READ's keys), the decoder
steps without READ (the GRU), READ (the tree read; flat_seq's dense attention), the output layer,
the loss (log-softmax + NLL), backward (split by the forward region that made each autograd node),
gradient clipping, the optimizer; "ms/step" is the region's own time (its sub-regions apart),
"python" the part of it where no torch op runs (interpreter and glue), "ops" the torch ops it
dispatches per step (many small ops = dispatch-bound). The profiler adds time per op: the
unprofiled ms/step of the same process is printed beside the total. Measure on an idle machine:

    python benchmarks/training_throughput.py --profile --studies translator_lifting,translator_flat_seq \\
        --threads 2 --warmup 3 --steps 10 --json benchmarks/results/training_profile.json

`--profile --json` writes {"current": REF, "current_commit": SHA, "threads": T, "profiles": {NAME:
{"ms_per_step_unprofiled", "ms_per_step_profiled", "regions": [{"region", "ms_per_step", "share",
"python_ms_per_step", "ops_per_step"}]}}}.

What a faster step can gain (`--profile --batch-sizes 64,128,256`, optionally `--config
depth=4,d_model=64,...` for other settings): ms per step at each batch size and the least-squares line
ms = fixed + per_sentence x batch. The fixed part is what no batch amortises (per-op dispatch, Python,
the optimizer over the embedding and output tables); the rest scales with the work. Removing every
fixed millisecond would speed the first batch size's step by at most ms / (ms - fixed): a bound on
what overhead-cutting (compiling the loop, fusing ops) can buy without changing the model's arithmetic.
The JSON's profiles then hold {NAME: {"config", "batches": [{"batch_size", "ms_per_step",
"tokens_per_s"}], "fixed_ms", "ms_per_sentence", "fixed_share_at_first", "ceiling_without_fixed"}}.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DEFAULT_BASELINE = "6e708ad"  # the code before the throughput issue (#12)


# ---------------------------------------------------------------------------------- one commit's code
def _load_isolation():
    """gates/verify/_isolation.py of this tree (the checkout, the isolated process, the check of its
    imports: one implementation with `gates certify`'s reference re-runs), loaded by its path under a
    name outside the project, so that loading it imports no `gates` before a worker isolates."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "treeheap_gates_isolation", ROOT / "gates" / "verify" / "_isolation.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


isolation = _load_isolation()
PROJECT = isolation.PROJECT


def checkout(ref: str, into: Path) -> tuple[Path, str] | None:
    """A clean checkout of REF in `into` (with its metadata): (folder, commit); None (with a note)
    where git or REF is missing."""
    try:
        return isolation.checkout(ROOT, ref, into)
    except RuntimeError as e:
        print(f"note: no checkout of {ref} ({e})", file=sys.stderr)
        return None


def studies(module: str):
    """A module of the studies, as the code measured names it (study_steps.studies)."""
    from study_steps import studies as named

    return named(module)


# ---------------------------------------------------------------------------------- step builders
def build_translator_step(
    arm: str, device: str = "cpu", profile: bool = False, overrides: dict | None = None
):
    """One training step of the translator at the translator contracts' settings (d 128, N 32, vocab
    4,000, batch 64, zh<->en; `overrides`: other config fields): (step, target tokens of the last step,
    "tokens"). With `profile`, the step's parts and the model's are marked as profiler regions
    (`instrument`)."""
    import torch

    tt = studies("treeheap_translator")
    seed_everything = studies("common").seed_everything
    collate = studies("translation_data").collate

    packed_api = hasattr(
        tt, "Decoded"
    )  # the code after #12; before it, forward returned (logits, masses)
    fields = {"device": device} if packed_api else {}
    config = tt.TranslatorConfig(**{"arm": arm, **fields, **(overrides or {})})
    data = tt.load_data(config)
    seed_everything(0)
    model = tt.Translator(config, data.vocab_size).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=0.0)
    train, generator, counted = data.splits["train"], torch.Generator().manual_seed(0), [0]
    mark = torch.profiler.record_function if profile else (lambda _name: nullcontext())
    if profile:
        instrument(model)

    def step():
        with mark("batch"):
            rows = torch.randint(len(train), (config.batch_size,), generator=generator).tolist()
            examples = [train[r] for r in rows]
            optimizer.zero_grad(set_to_none=True)
            if packed_api:
                batch = model.batch(examples)
            else:
                batch = collate(examples, config.n_leaves)
        with mark("forward"):
            decoded = model(batch)
        with mark("loss (log-softmax + NLL)"):
            if packed_api:
                loss, n = tt.token_nll(decoded)
            else:
                loss, n = tt.token_nll(decoded[0], batch["tgt_out"])
        with mark("backward"):
            (loss / n).backward()
        with mark("clip grad norm"):
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.clip_grad_norm)
        with mark("optimizer (AdamW)"):
            optimizer.step()
        counted[0] = n

    return step, counted, "tokens"


def builders() -> dict:
    """name -> builder(device) -> (step, [units of the last step], unit)."""
    import study_steps  # the other studies' builders (benchmarks/study_steps.py)

    found = {
        f"translator_{arm}": (lambda device, arm=arm: build_translator_step(arm, device))
        for arm in ("lifting", "flat_seq")
    }
    found.update(study_steps.STEPS)
    return found


# ---------------------------------------------------------------------------------- profile
# Parts of the Translator marked as regions: (attribute, region). The model's own methods are wrapped on
# the instance (forward calls self.step, self.context, ...), submodules through their forward; where an
# attribute is missing (another arm, older code) it is skipped.
REGIONS = [
    ("encode", "encoder: WRITE + rest"),
    ("butterfly.forward", "encoder: Butterfly"),
    ("fold.forward", "encoder: FOLD"),
    ("read.keys", "encoder: READ keys"),
    ("attn_key.forward", "encoder: keys (flat_seq)"),
    ("input_gates", "decoder: target embeddings"),
    ("step", "decoder loop: GRU step (without READ)"),
    ("context", "decoder loop: READ (c_t)"),
    ("out.forward", "output layer (logits)"),
]


def instrument(model) -> list[str]:
    """Wrap REGIONS' callables of `model` in torch.profiler.record_function; the regions marked."""
    import functools

    import torch

    marked = []
    for attribute, region in REGIONS:
        *path, name = attribute.split(".")
        owner = model
        for part in path:
            owner = getattr(owner, part, None)
        original = getattr(owner, name, None) if owner is not None else None
        if original is None:
            continue

        def wrapped(*args, _original=original, _region=region, **kwargs):
            with torch.profiler.record_function(_region):
                return _original(*args, **kwargs)

        setattr(owner, name, functools.wraps(original)(wrapped))
        marked.append(region)
    return marked


STEP_REGION = "training step"
SHOWN = {STEP_REGION: "step glue", "forward": "forward: rest (order, loop glue, cat)"}
STEP_PARTS = [
    "batch",
    "forward",
    "loss (log-softmax + NLL)",
    "backward",
    "clip grad norm",
    "optimizer (AdamW)",
]


def profile_worker(name: str, device: str, threads: int, warmup: int, steps: int) -> dict:
    """Time `steps` plain steps, then profile `steps` marked ones: the regions' table (see the docstring)."""
    import torch

    if not name.startswith("translator_"):
        raise ValueError(f"--profile: the translator arms only, not {name}")
    torch.set_num_threads(threads)
    _retain_freed_memory()
    step, _, _ = build_translator_step(name.removeprefix("translator_"), device, profile=True)
    for _ in range(warmup):
        step()
    started = time.perf_counter()
    for _ in range(steps):
        step()
    plain_ms = 1000 * (time.perf_counter() - started) / steps
    activities = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(steps):
            with torch.profiler.record_function(STEP_REGION):
                step()
    table = regions_table(prof.events(), steps)
    return {"ms_per_step_unprofiled": round(plain_ms, 1), **table}


def scaling_worker(
    name: str, threads: int, warmup: int, steps: int, batch_sizes: list[int], overrides: dict
) -> dict:
    """ms per step at each batch size, and the least-squares line ms = fixed + per_sentence x batch: the
    fixed part is what no batch amortises (per-op dispatch, Python, the optimizer over the tables); the
    per-sentence part scales with the work. Removing every fixed millisecond would speed the first
    batch size's step by at most its ms / (ms - fixed)."""
    import numpy as np
    import torch

    torch.set_num_threads(threads)
    _retain_freed_memory()
    rows = []
    for batch in batch_sizes:
        step, counted, _ = build_translator_step(
            name.removeprefix("translator_"), "cpu", overrides={**overrides, "batch_size": batch}
        )
        for _ in range(warmup):
            step()
        tokens, started = 0, time.perf_counter()
        for _ in range(steps):
            step()
            tokens += counted[0]
        seconds = time.perf_counter() - started
        rows.append(
            {
                "batch_size": batch,
                "ms_per_step": round(1000 * seconds / steps, 1),
                "tokens_per_s": round(tokens / seconds, 1),
            }
        )
    per_sentence, fixed = (
        float(c) for c in np.polyfit(batch_sizes, [r["ms_per_step"] for r in rows], 1)
    )
    first = rows[0]["ms_per_step"]
    return {
        "config": overrides,
        "batches": rows,
        "fixed_ms": round(fixed, 1),
        "ms_per_sentence": round(per_sentence, 3),
        "fixed_share_at_first": round(fixed / first, 3),
        # None: the line says nothing (noise made the larger batch no slower)
        "ceiling_without_fixed": round(first / (first - fixed), 2) if first > fixed else None,
    }


def print_scaling(name: str, result: dict) -> None:
    shown = ", ".join(f"{k}={v}" for k, v in result["config"].items()) or "the contracts' defaults"
    print(f"{name} ({shown}):")
    for r in result["batches"]:
        print(
            f"  batch {r['batch_size']:4d}: {r['ms_per_step']:7.1f} ms/step  {r['tokens_per_s']:9.1f} tokens/s"
        )
    first, ceiling = result["batches"][0], result["ceiling_without_fixed"]
    print(
        f"  ms = {result['fixed_ms']:.1f} + {result['ms_per_sentence']:.3f} x batch: at batch "
        f"{first['batch_size']}, {result['fixed_share_at_first']:.0%} of the step is fixed; removing all "
        f"of it gives at most "
        + (f"x{ceiling:.2f}" if ceiling else "(no bound: the larger batch was no slower)"),
        flush=True,
    )


def regions_table(events, steps: int) -> dict:
    """The profiler's events -> per region: own time (sub-regions apart), the part of it with no torch op
    running, torch ops dispatched; backward split by the region whose forward op made each autograd node."""
    import bisect

    marks = {STEP_REGION, *STEP_PARTS, *(region for _, region in REGIONS)}
    spans = sorted(
        ((e.time_range.start, e.time_range.end, e.name) for e in events if e.name in marks),
        key=lambda s: (s[0], -s[1]),
    )
    starts = [s[0] for s in spans]

    def innermost(start: float, end: float) -> str | None:
        """The innermost region holding [start, end] (regions nest: the holder that started last)."""
        for s in reversed(spans[: bisect.bisect_right(starts, start)]):
            if s[1] >= end:
                return s[2]
        return None

    own, stack = {}, []  # region -> microseconds not inside a sub-region
    for start, end, name in spans:
        while stack and stack[-1][1] <= start:
            stack.pop()
        if stack:  # the parent's own time loses this child's
            own[stack[-1][2]] = own.get(stack[-1][2], 0.0) - (end - start)
        own[name] = own.get(name, 0.0) + (end - start)
        stack.append((start, end, name))

    ops = [e for e in events if e.name not in marks]
    top = [e for e in ops if e.cpu_parent is None or e.cpu_parent.name in marks]
    op_time, op_count = {}, {}
    for e in top:
        region = innermost(e.time_range.start, e.time_range.end) or "outside the step"
        op_time[region] = op_time.get(region, 0.0) + (e.time_range.end - e.time_range.start)
        op_count[region] = op_count.get(region, 0) + 1
    # backward: each autograd node's evaluation, by the region of the forward op that made the node. Ops
    # record the sequence number the next node will get; a node takes it and the number moves on, so
    # the op that made node k is the last to record k (ops before it made no node: batch, sorting, ...)
    made_in = {}
    for e in sorted(ops, key=lambda e: e.time_range.start):
        if e.sequence_nr >= 0 and not e.name.startswith("autograd::"):
            region = innermost(e.time_range.start, e.time_range.end)
            if region not in (None, "backward"):
                made_in[e.sequence_nr] = region
    backward = {}
    for e in top:
        if e.name.startswith("autograd::engine::evaluate_function:"):
            source = made_in.get(e.sequence_nr, "other (gradient accumulation, ...)")
            backward[source] = backward.get(source, 0.0) + (e.time_range.end - e.time_range.start)

    total = sum(own.values())
    rows = []
    order = [STEP_REGION, "batch", "forward", *(r for _, r in REGIONS), *STEP_PARTS[2:]]
    for region in dict.fromkeys(order):
        if region not in own:
            continue
        rows.append(
            {
                "region": SHOWN.get(region, region),
                "ms_per_step": own[region] / 1000 / steps,
                "share": own[region] / total,
                "python_ms_per_step": max(0.0, own[region] - op_time.get(region, 0.0))
                / 1000
                / steps,
                "ops_per_step": op_count.get(region, 0) / steps,
            }
        )
        if region == "backward":
            for source, micros in sorted(backward.items(), key=lambda kv: -kv[1]):
                rows.append(
                    {
                        "region": f"  of {SHOWN.get(source, source)}",
                        "ms_per_step": micros / 1000 / steps,
                        "share": micros / total,
                        "python_ms_per_step": None,
                        "ops_per_step": None,
                    }
                )
    for row in rows:
        for key in ("ms_per_step", "python_ms_per_step", "ops_per_step"):
            if row[key] is not None:
                row[key] = round(row[key], 2)
        row["share"] = round(row["share"], 3)
    return {
        "ms_per_step_profiled": round(total / 1000 / steps, 1),
        "python_ms_per_step": round(sum(r["python_ms_per_step"] or 0.0 for r in rows), 1),
        "regions": rows,
    }


def print_profile(name: str, result: dict) -> None:
    print(
        f"\n{name}: {result['ms_per_step_profiled']:.1f} ms/step profiled "
        f"({result['ms_per_step_unprofiled']:.1f} unprofiled), of which "
        f"{result['python_ms_per_step']:.1f} ms with no torch op running"
    )
    print(f"  {'region':46s} {'ms/step':>8s} {'share':>6s} {'python':>7s} {'ops':>6s}")
    for row in result["regions"]:
        python = "" if row["python_ms_per_step"] is None else f"{row['python_ms_per_step']:7.1f}"
        ops = "" if row["ops_per_step"] is None else f"{row['ops_per_step']:6.0f}"
        print(
            f"  {row['region']:46s} {row['ms_per_step']:8.1f} {100 * row['share']:5.1f}% {python:>7s} {ops:>6s}"
        )


# ---------------------------------------------------------------------------------- measuring
def _retain_freed_memory() -> None:
    try:  # as `gates run` does; the baseline's code predates it and runs without
        from gates.execution import retain_freed_memory

        retain_freed_memory()
    except ImportError:
        pass


def worker(name: str, device: str, threads: int, warmup: int, steps: int) -> dict:
    import torch

    torch.set_num_threads(threads)
    _retain_freed_memory()
    step, counted, unit = builders()[name](device)
    for _ in range(warmup):
        step()
    units = 0
    if device == "cuda":
        torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(steps):
        step()
        units += counted[0]
    if device == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    return {"unit": unit, "per_s": units / seconds, "ms_per_step": 1000 * seconds / steps}


def measure(name: str, code: Path, side: str, args, device: str, profile: bool = False) -> dict:
    """One fresh process importing the code in `code` (a checkout) alone."""
    command = [
        "--worker",
        name,
        "--device",
        device,
        "--threads",
        str(args.threads),
        "--warmup",
        str(args.warmup),
        "--steps",
        str(args.steps),
        *(["--profile"] if profile else []),
        *(["--batch-sizes", args.batch_sizes] if args.batch_sizes else []),
        *(["--config", args.config] if args.config else []),
    ]
    try:
        return isolation.run_isolated(code, command, script=Path(__file__).resolve())
    except RuntimeError as e:
        raise RuntimeError(f"{name} ({side}) failed:\n{e}") from None


def run_worker(args) -> dict:
    code = Path(args.code)
    isolation.isolate(code)
    if args.batch_sizes:
        result = scaling_worker(
            args.worker,
            args.threads,
            args.warmup,
            args.steps,
            _batch_sizes(args.batch_sizes),
            _config(args.config),
        )
    elif args.profile:
        result = profile_worker(args.worker, args.device, args.threads, args.warmup, args.steps)
    else:
        result = worker(args.worker, args.device, args.threads, args.warmup, args.steps)
    module = _study_module(args.worker)
    study = next(
        (m for m in (f"gates.models.{module}", f"models.{module}") if m in sys.modules), None
    )
    result["imports"] = isolation.imported_from(code, study)
    return result


def _batch_sizes(text: str) -> list[int]:
    return [int(b) for b in text.split(",")]


def _config(text: str | None) -> dict:
    """`depth=4,d_model=64` -> {"depth": 4, "d_model": 64} (numbers as numbers)."""
    out = {}
    for item in (text or "").split(","):
        if item:
            key, value = item.split("=", 1)
            out[key] = json.loads(value) if value[:1].isdigit() or value[:1] == "-" else value
    return out


def _study_module(name: str) -> str:
    """The module of the studies a benchmark name measures (for the record of where it came from)."""
    if name.startswith("translator_"):
        return "treeheap_translator"
    if name.startswith("relation_closure"):
        return "relation_closure"
    return name.rsplit("_", 1)[0] if name.startswith("bif_lm") else name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--studies", help="comma-separated names (default: all)")
    parser.add_argument(
        "--baseline", default=DEFAULT_BASELINE, help="git ref of the code to compare with"
    )
    parser.add_argument(
        "--current", default="HEAD", help="git ref of the code measured against the baseline"
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--device", default="cpu", choices=["cpu", "cuda"], help="for the current code"
    )
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument(
        "--repeats", type=int, default=2, help="alternations of baseline and current"
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="per-step profile of the current code's translator arms (CPU), no comparison",
    )
    parser.add_argument(
        "--batch-sizes",
        help="with --profile: instead of the profile, ms per step at these batch sizes (64,128,256) and "
        "the fixed part no batch amortises",
    )
    parser.add_argument(
        "--config",
        help="with --batch-sizes: translator config fields to set (depth=4,d_model=64,...)",
    )
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--code", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.worker:
        print(json.dumps(run_worker(args)))
        return 0

    names = list(builders())
    if args.profile:
        names = [n for n in names if n.startswith("translator_")]
        if args.device != "cpu":
            print("error: --profile: CPU only", file=sys.stderr)
            return 2
    if args.studies:
        unknown = [n for n in args.studies.split(",") if n not in names]
        if unknown:
            print(f"error: --studies: unknown {unknown}; expected some of {names}", file=sys.stderr)
            return 2
        names = args.studies.split(",")
    _note_uncommitted(args.current)
    with tempfile.TemporaryDirectory(prefix="throughput-") as tmp:
        current = checkout(args.current, Path(tmp) / "current")
        if current is None:
            return 2
        if args.profile:
            profiles = {}
            for name in names:
                profiles[name] = measure(name, current[0], "current", args, "cpu", profile=True)
                _print_imports("current", args.current, current, profiles[name].pop("imports"))
                (print_scaling if args.batch_sizes else print_profile)(name, profiles[name])
            if args.json:
                _write(
                    args.json,
                    {
                        "current": args.current,
                        "current_commit": current[1],
                        "threads": args.threads,
                        "warmup": args.warmup,
                        "steps": args.steps,
                        "profiles": profiles,
                    },
                )
            return 0
        base = checkout(args.baseline, Path(tmp) / "baseline")
        if base is None:
            print("note: measuring the current code only", file=sys.stderr)
        results, imports = {}, {}
        for name in names:
            now, before = [], []
            for _ in range(args.repeats):
                if base is not None:  # the baseline predates devices: it runs on the CPU
                    before.append(measure(name, base[0], "baseline", args, "cpu"))
                now.append(measure(name, current[0], "current", args, args.device))
            for side, ref, found, runs in (
                ("baseline", args.baseline, base, before),
                ("current", args.current, current, now),
            ):
                if runs and side not in imports:
                    imports[side] = _relative(runs[0]["imports"], found[0])
                    _print_imports(side, ref, found, runs[0]["imports"])
            best = max(now, key=lambda r: r["per_s"])
            row = {
                "unit": best["unit"],
                "current_per_s": round(best["per_s"], 1),
                "current_ms_per_step": round(best["ms_per_step"], 1),
            }
            if before:
                old = max(before, key=lambda r: r["per_s"])
                row.update(
                    baseline_per_s=round(old["per_s"], 1),
                    baseline_ms_per_step=round(old["ms_per_step"], 1),
                    ratio=round(best["per_s"] / old["per_s"], 2),
                )
            results[name] = row
            print(
                f"{name:28s} {row.get('baseline_per_s', float('nan')):10.1f} -> {row['current_per_s']:10.1f} "
                f"{row['unit']}/s   x{row.get('ratio', float('nan')):.2f}   "
                f"({row.get('baseline_ms_per_step', float('nan')):.0f} -> {row['current_ms_per_step']:.0f} ms/step)",
                flush=True,
            )
    if args.json:
        _write(
            args.json,
            {
                "baseline": args.baseline,
                "baseline_commit": base[1] if base else None,
                "current": args.current,
                "current_commit": current[1],
                "threads": args.threads,
                "device": args.device,
                "imports": imports,
                "studies": results,
            },
        )
    return 0


def _note_uncommitted(ref: str) -> None:
    changed = subprocess.run(
        ["git", "status", "--porcelain", "--", *PROJECT, "pyproject.toml"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    ).stdout.strip()
    if changed:
        print(
            f"note: uncommitted changes to the project's code are not measured (the current side is {ref}):\n"
            f"{changed[:500]}",
            file=sys.stderr,
        )


def _relative(files: dict, code: Path) -> dict:
    return {name: str(Path(file).relative_to(code.resolve())) for name, file in files.items()}


def _print_imports(side: str, ref: str, found: tuple[Path, str], files: dict) -> None:
    listed = ", ".join(f"{name} {file}" for name, file in files.items())
    print(f"{side} = {ref} ({found[1][:10]}), checkout {found[0]}: {listed}", file=sys.stderr)


def _write(path: Path, result: dict) -> None:
    path.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
