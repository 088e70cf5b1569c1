"""Small file-system helpers shared by the modules that write durable records (evidence, the claims
index, the MLflow store)."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

from gates.contract import read_capped


def fsync_dir(folder: Path) -> None:
    """Make a rename or a new file in `folder` durable (a crash after it cannot undo it)."""
    with contextlib.suppress(OSError):  # not every platform can fsync a directory
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


MAX_JSON_DEPTH = 64  # records nest a few levels; deeper is a damaged or hostile file
MAX_EVIDENCE_BYTES = 64 * 1024 * 1024
MAX_INDEX_BYTES = 256 * 1024 * 1024  # the claims history: ~500 bytes a line, half a million lines


def parse_json(data: bytes | str):
    """JSON from bytes or text, or ValueError in one line: not UTF-8, not JSON, or nested deeper than
    MAX_JSON_DEPTH (a 200,000-deep value would otherwise raise RecursionError here or in any
    recursive reader after it)."""
    try:
        value = json.loads(data)
    except RecursionError:
        raise ValueError(f"JSON nested deeper than {MAX_JSON_DEPTH} levels") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"not UTF-8 ({e.reason} at byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"not JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    level, stack = 0, [(value, 1)]
    while stack:  # iterative: the check itself must not recurse
        node, level = stack.pop()
        if level > MAX_JSON_DEPTH:
            raise ValueError(f"JSON nested deeper than {MAX_JSON_DEPTH} levels")
        if isinstance(node, dict):
            stack.extend((v, level + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, level + 1) for v in node)
    return value


def read_json(path: Path, max_bytes: int):
    """The JSON value of a regular file of at most `max_bytes` (read_capped: folders, FIFOs and
    devices refused without blocking), or ValueError in one line saying what is wrong."""
    return parse_json(read_capped(Path(path), max_bytes))


def read_json_object(path: Path, max_bytes: int) -> dict | None:
    """A record file's JSON object (read_json), or None when it is unreadable or not an object."""
    try:
        data = read_json(path, max_bytes)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None
