"""Appending to the claims history (gates.record._index reads it back): one entry a line, never
rewritten. Appends take an exclusive lock on the index file (flock) and are synced (fsync) before
returning; the bytes written are the entry's JSON as `_append` serialises it, which every `prev` of
the chain after it hashes.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import stat
from datetime import datetime, timezone
from pathlib import Path

import gates
from gates.contract import read_capped
from gates.errors import storage_error
from gates.record._files import MAX_EVIDENCE_BYTES, fsync_dir, parse_json
from gates.record._index import (
    ADDED_FIELDS,
    CERTIFIED_FIELDS,
    EVIDENCE,
    FIELDS,
    GENESIS,
    KINDS,
    IndexEntry,
    index_entries,
    index_location_problem,
    index_path,
    line_sha256,
)
from gates.record._successors import design_of
from gates.record._view import EvidenceView, raw_view

VALUES = (
    "runs",
    "tuning",
    "falsifiable_point",
)  # what a run records; the verdict is derived from it


def values_sha256(evidence: dict) -> str:
    """sha256 of what a run recorded (its per-seed runs, the tuning, the first signals), in canonical
    JSON: everything the verdict is derived from. Re-deriving never changes it, so an entry that
    carries it pins the values its attempt was recorded with."""
    values = {k: evidence.get(k) for k in VALUES}
    canonical = json.dumps(values, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def engine_version() -> str:
    """The verdict engine's version (`ENGINE_VERSION` of gates.inference)."""
    from gates.inference import ENGINE_VERSION

    return str(ENGINE_VERSION)


def record_entry(
    runs_root: Path, evidence_path: Path, kind: str, reason: str = "", extra: dict | None = None
) -> IndexEntry:
    """Append one entry for the evidence at `evidence_path` (runs/<id>/evidence.json) and return it
    as read back (with its line number).

    For `withdrawn`, the evidence may be missing (its id is the folder's name); its contract sha256
    and verdict are taken from the evidence if present, else from the id's latest entry. `extra`:
    fields a kind adds (a certification's code fingerprint)."""
    if kind not in KINDS:
        raise ValueError(f"unknown index entry kind {kind!r}; expected one of {', '.join(KINDS)}")
    runs_root, evidence_path = Path(runs_root), Path(evidence_path)
    evidence, evidence_sha = _evidence(evidence_path, kind)
    ev = EvidenceView.of(evidence or {})
    design = design_of(ev) if evidence and kind == "withdrawn" else None
    entry = {
        "kind": kind,
        "contract_id": ev.contract_id if ev.contract_id is not None else evidence_path.parent.name,
        "contract_sha256": ev.contract_sha256,
        "evidence_sha256": evidence_sha,
        "verdict": ev.verdict,
        # the versions that computed the evidence: what it records, else (backfilled evidence from
        # before engines were numbered: gates.record._evidence.signature calls that engine 1) today's
        "gates_version": ev.gates_version or gates.__version__,
        "engine_version": ev.engine_version or ("1" if kind == "backfilled" else engine_version()),
        "time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "reason": reason,
        **({"values_sha256": values_sha256(evidence)} if evidence and kind != "withdrawn" else {}),
        # what was withdrawn, kept though its evidence and contract may go: a claim registered
        # again on the same design must name it (`successor_problem`)
        **({"design": design} if design else {}),
        **(extra or {}),
        "prev": None,
    }
    return _append(runs_root, entry)


def _evidence(path: Path, kind: str) -> tuple[dict | None, str | None]:
    """(the evidence's JSON object, the sha256 of its bytes; None for a withdrawal's), or (None, None)
    for a withdrawal of missing evidence; ValueError for evidence that is unreadable, no JSON object,
    or missing (an entry of any other kind vouches for readable evidence)."""
    if not path.is_file():
        if kind != "withdrawn":
            raise ValueError(f"{path} does not exist; only a withdrawal may name missing evidence")
        return None, None
    try:
        data = read_capped(path, MAX_EVIDENCE_BYTES)
        evidence = parse_json(data)
    except ValueError as e:
        raise ValueError(f"{path}: {e}; an index entry vouches for readable evidence") from None
    if not isinstance(evidence, dict):
        raise ValueError(f"{path} is not a JSON object")
    return evidence, None if kind == "withdrawn" else hashlib.sha256(data).hexdigest()


def withdraw_claim(runs_root: Path, contract_id: str, reason: str) -> IndexEntry:
    """Append a withdrawal of `contract_id` (its evidence, if any, stays where it is)."""
    return record_entry(runs_root, Path(runs_root) / contract_id / EVIDENCE, "withdrawn", reason)


def backfill_index(runs_root: Path) -> list[IndexEntry]:
    """Enter every runs/<id>/evidence.json that has no index entry yet as `backfilled` (idempotent:
    evidence already indexed is left alone). Returns the entries appended."""
    runs_root = Path(runs_root)
    indexed = {e.contract_id for e in index_entries(runs_root)}
    added = []
    for evidence in sorted(runs_root.glob(f"*/{EVIDENCE}")):
        if evidence.parent.name in indexed:
            continue
        ev = raw_view(evidence)
        when = (
            "unreadable"
            if ev is None
            else f"recorded {_said(ev.created_at)} at commit {_said(ev.git_commit)[:12]}"
        )
        added.append(
            record_entry(
                runs_root,
                evidence,
                "backfilled",
                f"evidence that predates the index, entered as found ({when})",
            )
        )
    return added


def _said(value: str | None) -> str:
    return "?" if value is None else value


def _append(runs_root: Path, entry: dict) -> IndexEntry:
    path = index_path(runs_root)
    problem = index_location_problem(runs_root)
    if problem:
        raise ValueError(problem)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        created = not path.exists()
        # O_NOFOLLOW: a link put in place since the check above is refused, never written through
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o644)
    except OSError as e:
        _unwritable(e, path)
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # reading a FIFO's "history" would block
            raise ValueError(f"{path} is not a regular file; expected the claims history")
        fcntl.flock(
            fd, fcntl.LOCK_EX
        )  # one writer at a time: `prev` must name the line really before
        data = _read_all(fd)
        if data and not data.endswith(b"\n"):
            data = _repair_tail(fd, data)
        last = data.rstrip(b"\n").rsplit(b"\n", 1)[-1] if data.strip() else None
        entry = {
            **{k: entry.get(k) for k in FIELDS if k != "prev"},
            **{k: entry[k] for k in (*ADDED_FIELDS, *CERTIFIED_FIELDS) if k in entry},
        }
        entry["prev"] = line_sha256(last) if last is not None else GENESIS
        number = data.count(b"\n") + 1  # every line before it ends in one (`_repair_tail`)
        line = (
            json.dumps(entry, ensure_ascii=False, allow_nan=False, separators=(", ", ": ")).encode()
            + b"\n"
        )
        try:
            written = os.write(fd, line)  # O_APPEND: one write lands at the end, whole
            if written != len(line):  # on a regular file: the disk (or quota) filled up mid-line
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
            os.fsync(fd)
        except OSError:
            # the index as it was: no torn line, nor one whose sync failed (a re-run appends it anew)
            with contextlib.suppress(OSError):
                os.ftruncate(fd, len(data))
            raise
    except OSError as e:
        _unwritable(e, path)
        raise
    finally:
        os.close(fd)  # releases the lock
    if created:
        fsync_dir(path.parent)
    return IndexEntry.from_json(entry, number)


def _unwritable(e: OSError, path: Path) -> None:
    """Raise a StorageError naming the index when `e` is a full disk or a read-only file or folder
    (one line, exit 1); else nothing (the caller re-raises `e`)."""
    found = storage_error(e, path)
    if found is not None:
        raise found from e


def _read_all(fd: int) -> bytes:
    os.lseek(fd, 0, os.SEEK_SET)
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)


def _repair_tail(fd: int, data: bytes) -> bytes:
    """An append interrupted mid-line (power loss) leaves a last line without its newline: a whole
    JSON object gets its newline; a torn fragment, which no reader ever accepted, is cut off."""
    head, _, tail = data.rpartition(b"\n")
    try:
        complete = isinstance(parse_json(tail), dict)
    except ValueError:
        complete = False
    if complete:
        os.write(fd, b"\n")
        return data + b"\n"
    keep = len(head) + 1 if head else 0
    os.ftruncate(fd, keep)
    return data[:keep]
