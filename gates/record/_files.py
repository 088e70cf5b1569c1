"""Small file-system helpers shared by the modules that write durable records (evidence, the claims
index, the MLflow store)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def fsync_dir(folder: Path) -> None:
    """Make a rename or a new file in `folder` durable (a crash after it cannot undo it)."""
    with contextlib.suppress(OSError):  # not every platform can fsync a directory
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
