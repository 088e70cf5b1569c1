"""A per-contract lock, so that two `gates run` of one contract never train the same runs twice.

The lock is an fcntl (flock) lock on `runs/.<id>.lock`, holding the pid of its owner. The kernel drops
it when its process ends, even by SIGKILL, so a killed run never blocks the next one; a clean exit also
removes the file (a kill leaves it behind with a stale pid; the next run takes it over).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from gates.errors import UserError, storage_error


def lock_path(runs_root: Path, contract_id: str) -> Path:
    return Path(runs_root) / f".{contract_id}.lock"


def _unwritable(e: OSError, path: Path) -> None:
    """A full disk or a read-only runs folder is a StorageError naming the lock file (exit 1, as
    wherever else a run cannot write), not bad input."""
    found = storage_error(e, path)
    if found is not None:
        raise found from e


@contextlib.contextmanager
def contract_lock(runs_root: Path, contract_id: str):
    """Hold the contract's lock for the block; UserError (exit 2) when another process holds it."""
    path = lock_path(runs_root, contract_id)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        _unwritable(e, path)
        raise UserError(
            f"cannot create the runs folder ({e.strerror or e}); expected a writable folder "
            f"(--runs-dir)",
            file=str(path.parent),
        ) from None
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o666)
        except OSError as e:
            _unwritable(e, path)
            raise UserError(
                f"cannot create the lock file of {contract_id} ({e.strerror or e}); expected a "
                f"writable runs folder (--runs-dir)",
                file=str(path),
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            raise UserError(
                f"another gates run of {contract_id} is in progress (pid {owner}; lock {path}); "
                f"wait for it to finish, or stop it and run again"
            ) from None
        # the holder before us may have removed the file after we opened it: then this lock guards
        # nothing (a third process can create and lock a new file); start again on the current file
        mine = os.fstat(fd)
        try:
            current = os.stat(path)
        except FileNotFoundError:
            current = None
        if current is not None and (current.st_dev, current.st_ino) == (mine.st_dev, mine.st_ino):
            break
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield path
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)  # before the lock is released: nobody can lock this file after us
        os.close(fd)
