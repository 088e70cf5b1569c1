"""What every study shares: seeding, parameter counting and a small full-control training loop.

Kept deliberately plain (nanoGPT style): a study builds its model, optimizer and a `loss_fn` that
returns one step's scalar loss, and hands them to `train_loop`, which steps, evaluates on the
budget's schedule and reports. The platform's stop rules act through `reporter.report`, which may
raise `gates.study.Halt`; nothing here catches it.
"""

from __future__ import annotations

import hashlib
import os
import random
from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from gates.study import Budget, Reporter


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch, and make torch refuse nondeterministic kernels.

    Bit-identical reruns on CPU also need the same torch thread count (a reduction split over a
    different number of threads may round differently); we do not change the thread count here,
    because that is process-wide and the caller (the runner or a benchmark) owns it.
    """
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    # cuBLAS needs a fixed workspace to be deterministic; harmless on CPU, and must be set before
    # the first CUDA matmul, so only set it when the user has not chosen one.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    # No TF32 and no cuDNN autotuning (all no-ops on CPU). A replay on another device is compared
    # with the recorded metrics within the contract's tolerance; TF32 rounds matmul inputs to 10
    # mantissa bits on Ampere+ GPUs, errors far above float32's that would eat that tolerance, and
    # cuDNN's benchmark mode picks kernels by timing, which may differ from run to run.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = False


def count_parameters(module: nn.Module) -> int:
    """Trainable parameters (those with requires_grad), each tensor counted once."""
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


def train_loop(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    loss_fn: Callable[[], torch.Tensor],
    budget: Budget,
    reporter: Reporter,
    evaluate: Callable[[], dict[str, float]],
    clip_grad_norm: float | None = None,
) -> dict[str, float]:
    """Run steps 1..budget.steps; at each eval step report {"train_loss", **evaluate()}.

    `loss_fn()` computes one step's scalar loss (full batch or a fresh minibatch, the study's
    choice). `evaluate()` runs with the model in eval mode and gradients off and returns the
    evaluation metrics; a key it returns wins over the step's "train_loss". Returns the metrics of
    the last report. `Halt` raised by the reporter propagates to the caller on purpose.
    """
    last: dict[str, float] = {}
    model.train()
    for step in range(1, budget.steps + 1):
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn()
        loss.backward()
        if clip_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip_grad_norm)
        optimizer.step()

        if budget.is_eval_step(step):
            model.eval()
            with torch.no_grad():
                metrics = {"train_loss": float(loss.detach()), **evaluate()}
            model.train()
            last = {name: float(value) for name, value in metrics.items()}
            reporter.report(step, dict(last))  # may raise Halt: let it stop the run
    return last


def text_fraction(text: str) -> float:
    """sha1 of the text's first 8 bytes as a fraction of 2^64: a stable, order-free split key."""
    return int.from_bytes(hashlib.sha1(text.encode("utf-8")).digest()[:8], "big") / 2.0**64


def in_train_slice(line: str, train_fraction: float) -> bool:
    """Whether a line is for training: a stable hash of its text alone, never its position, so the
    split does not depend on line order and equal lines always land on the same side."""
    return text_fraction(line) < train_fraction


def split_lines(lines: list[str], train_fraction: float) -> tuple[list[str], list[str]]:
    """(train, held-out) lines, each in corpus order; blank lines dropped."""
    train, heldout = [], []
    for line in lines:
        if line.strip():
            (train if in_train_slice(line, train_fraction) else heldout).append(line)
    return train, heldout


def peak_rss_growth_mb(fn: Callable[[], None]) -> float:
    """How far the process's peak resident memory rises above its current size while `fn` runs, in MB.

    Linux only: writing 5 to /proc/self/clear_refs resets the peak (VmHWM) to the current RSS, so
    the peak read afterwards belongs to `fn` alone. NaN where that is not offered (other systems)."""

    def read_kb(field: str) -> int:
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) for line in status if line.startswith(field))

    try:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")
        before = read_kb("VmRSS:")
        fn()
        return max(read_kb("VmHWM:") - before, 0) / 1024
    except (OSError, StopIteration, ValueError):
        return float("nan")
