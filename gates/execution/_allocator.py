"""Keep freed memory in the process while it trains (glibc only; elsewhere nothing happens).

glibc returns every freed block above its mmap threshold to the OS and page-faults it in again on the
next step: a training loop frees and reallocates the same large buffers (logits, activations) every
step. Raising the mmap and trim thresholds keeps them in the heap for reuse. Measured on the 2-core
development machine (benchmarks/training_throughput.py workers, 1 thread): translator step 1.06x,
bif_lm 1.36x, teacher ~1.1x. The numbers computed are unchanged; the process's resident memory stays at
its peak. The process owner (`gates run`, `gates worker`, `gates verify`, a benchmark) calls it once.
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)


def retain_freed_memory() -> bool:
    """Raise glibc's mmap threshold to 1 GiB and its trim threshold to 2 GiB - 1; True if applied."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):  # not glibc (macOS, musl without mallopt, Windows)
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, 1 << 30)) and bool(mallopt(M_TRIM_THRESHOLD, 2**31 - 1))
