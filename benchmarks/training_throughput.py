"""Training throughput: units (target tokens, examples) per second of one training step per study, the
code at a baseline commit against the code here, measured in the same run.

    python benchmarks/training_throughput.py                 # every study, 2 threads, baseline 6e708ad
    python benchmarks/training_throughput.py --studies translator_lifting --steps 5 --json out.json
    python benchmarks/training_throughput.py --device cuda   # the code here on the GPU (baseline: CPU)

Each measurement is a fresh subprocess (`--worker`) that imports the studies either from this checkout
or from `git archive BASELINE gates models` unpacked into a temporary folder (PYTHONPATH first), builds
one study's model, optimizer and a fixed-size batch at the settings of its committed contracts, runs
`--warmup` steps, then times `--steps` steps. Baseline and current alternate `--repeats` times and the
best of each is kept, so load that comes and goes during the run touches both sides alike. The step
builders live in `study_steps.py` (and here for the translator); each works against both versions of the
code.

Output: a table for people; with `--json PATH`
{"baseline": REF, "threads": T, "device": D, "studies": {NAME: {"unit", "baseline_per_s", "current_per_s",
"ratio"}}}.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DEFAULT_BASELINE = "6e708ad"  # the code before the throughput issue (#12)


def studies(module: str):
    """A module of the studies as the code measured names them: `gates.models.<module>` since the
    studies were installed under the platform's namespace, `models.<module>` in a baseline from before
    (whose own models/ is on PYTHONPATH: `gates.models` would resolve to this checkout's studies)."""
    import importlib

    import gates

    root = Path(gates.__file__).resolve().parent.parent
    try:
        import gates.models

        if Path(gates.models.__file__).resolve().parent.parent == root:
            return importlib.import_module(f"gates.models.{module}")
    except ImportError:
        pass
    return importlib.import_module(f"models.{module}")


# ---------------------------------------------------------------------------------- step builders
def build_translator_step(arm: str, device: str = "cpu"):
    """One training step of the translator at the translator contracts' settings (d 128, N 32, vocab
    4,000, batch 64, zh<->en): (step, target tokens of the last step, "tokens")."""
    import torch

    tt = studies("treeheap_translator")
    seed_everything = studies("common").seed_everything
    collate = studies("translation_data").collate

    packed_api = hasattr(
        tt, "Decoded"
    )  # the code after #12; before it, forward returned (logits, masses)
    fields = {"device": device} if packed_api else {}
    config = tt.TranslatorConfig(arm=arm, **fields)
    data = tt.load_data(config)
    seed_everything(0)
    model = tt.Translator(config, data.vocab_size).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=0.0)
    train, generator, counted = data.splits["train"], torch.Generator().manual_seed(0), [0]

    def step():
        rows = torch.randint(len(train), (config.batch_size,), generator=generator).tolist()
        examples = [train[r] for r in rows]
        optimizer.zero_grad(set_to_none=True)
        if packed_api:
            loss, n = tt.token_nll(model(model.batch(examples)))
        else:
            batch = collate(examples, config.n_leaves)
            logits, _ = model(batch)
            loss, n = tt.token_nll(logits, batch["tgt_out"])
        (loss / n).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.clip_grad_norm)
        optimizer.step()
        counted[0] = n

    return step, counted, "tokens"


def builders() -> dict:
    """name -> builder(device) -> (step, [units of the last step], unit)."""
    found = {
        f"translator_{arm}": (lambda device, arm=arm: build_translator_step(arm, device))
        for arm in ("lifting", "flat_seq")
    }
    try:
        import study_steps  # the other studies' builders (benchmarks/study_steps.py)
    except ImportError:
        return found
    for name in getattr(study_steps, "STEPS", {}):
        found[name] = study_steps.STEPS[name]
    return found


# ---------------------------------------------------------------------------------- measuring
def worker(name: str, device: str, threads: int, warmup: int, steps: int) -> dict:
    import torch

    torch.set_num_threads(threads)
    try:  # as `gates run` does; the baseline's code predates it and runs without
        from gates.execution import retain_freed_memory

        retain_freed_memory()
    except ImportError:
        pass
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


def measure(name: str, code: Path | None, args, device: str) -> dict:
    """One fresh process; `code` None = this checkout, else a folder holding another version's packages."""
    env = dict(os.environ)
    if code is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(code), env.get("PYTHONPATH", "")]).rstrip(
            os.pathsep
        )
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
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
    ]
    done = subprocess.run(command, env=env, capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(
            f"{name} ({'baseline' if code else 'current'}) failed:\n{done.stderr[-2000:]}"
        )
    return json.loads(done.stdout.strip().splitlines()[-1])


def baseline_code(ref: str, into: Path) -> Path | None:
    """`git archive REF gates models` unpacked into `into`; None (with a note) where git or REF is missing."""
    archive = subprocess.run(
        ["git", "archive", ref, "gates", "models"], cwd=ROOT, capture_output=True
    )
    if archive.returncode != 0:
        print(
            f"note: no baseline ({archive.stderr.decode().strip()[:200]}); measuring the current code only",
            file=sys.stderr,
        )
        return None
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--studies", help="comma-separated names (default: all)")
    parser.add_argument(
        "--baseline", default=DEFAULT_BASELINE, help="git ref of the code to compare with"
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
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.worker:
        print(json.dumps(worker(args.worker, args.device, args.threads, args.warmup, args.steps)))
        return 0

    names = list(builders())
    if args.studies:
        unknown = [n for n in args.studies.split(",") if n not in names]
        if unknown:
            print(f"error: --studies: unknown {unknown}; expected some of {names}", file=sys.stderr)
            return 2
        names = args.studies.split(",")
    results = {}
    with tempfile.TemporaryDirectory(prefix="throughput-baseline-") as tmp:
        base = baseline_code(args.baseline, Path(tmp))
        for name in names:
            current, baseline = [], []
            for _ in range(args.repeats):
                if base is not None:  # the baseline predates devices: it runs on the CPU
                    baseline.append(measure(name, base, args, "cpu"))
                current.append(measure(name, None, args, args.device))
            best = max(current, key=lambda r: r["per_s"])
            row = {
                "unit": best["unit"],
                "current_per_s": round(best["per_s"], 1),
                "current_ms_per_step": round(best["ms_per_step"], 1),
            }
            if baseline:
                old = max(baseline, key=lambda r: r["per_s"])
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
        args.json.write_text(
            json.dumps(
                {
                    "baseline": args.baseline,
                    "threads": args.threads,
                    "device": args.device,
                    "studies": results,
                },
                indent=2,
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
