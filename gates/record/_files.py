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
# What a record may hold. Memory follows the number of JSON values far more than the bytes (a small
# object costs ~200 bytes of Python objects for ~10 of JSON, and verify holds a few views of a claim's
# evidence at once): 59 MB of small objects took 3 GB and 90 s to verify. The largest evidence here
# (butterfly-reach-v4) is 240 KB with ~13,000 values; the caps leave 60x and 20x room, and hold the
# peak memory of one verify to a few hundred MB (docs/verify.md, "Files that are not what they
# should be").
MAX_EVIDENCE_BYTES = 16 * 1024 * 1024
MAX_JSON_VALUES = 250_000  # per JSON document (an evidence file, a history line)
MAX_INDEX_BYTES = 256 * 1024 * 1024  # the claims history: ~500 bytes a line, half a million lines


def as_text(v) -> str | None:
    """A JSON value read as text: the string, or None for any other type (a hand-edited field)."""
    return v if isinstance(v, str) else None


def as_mapping(v) -> dict | None:
    """A JSON value read as an object: the dict, or None for any other type."""
    return v if isinstance(v, dict) else None


def parse_json(data: bytes | str):
    """JSON from bytes or text, or ValueError in one line: not UTF-8, not JSON, or nested deeper than
    MAX_JSON_DEPTH (a 200,000-deep value would otherwise raise RecursionError here or in any
    recursive reader after it), or holding more than MAX_JSON_VALUES values: counted on the bytes
    before any is parsed (every value but the first follows a `,`, `:` or opening bracket; those
    within strings count too: an upper bound), so that no memory goes to a file that is refused."""
    raw = data.encode() if isinstance(data, str) else bytes(data)
    values = sum(raw.count(c) for c in (b",", b":", b"[", b"{"))
    if values > MAX_JSON_VALUES:
        raise ValueError(
            f"JSON with more than {MAX_JSON_VALUES} values (about {values}); expected a record of "
            f"at most {MAX_JSON_VALUES}"
        )
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
