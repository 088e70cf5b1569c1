"""The claims history: `runs/INDEX.jsonl`, an append-only, hash-chained index of every verdict recorded.

One JSON object per line, appended and never rewritten:

    {"kind": "recorded", "contract_id": ..., "contract_sha256": ..., "evidence_sha256": ...,
     "verdict": ..., "gates_version": ..., "engine_version": ..., "time": ..., "reason": ..., "prev": ...}

- `kind`: `recorded` (a `gates run` wrote the evidence), `rederived` (the evidence was rewritten from
  its recorded per-seed values, e.g. by a corrected verdict engine; `reason` says why), `withdrawn`
  (`gates withdraw`: the claim is no longer made; `evidence_sha256` is null), `backfilled` (evidence
  that existed before the index, entered once as it was) or `certified` (`gates certify`: re-runs of
  the recorded runs under today's code reproduced them; the entry adds that code's `code_sha256` and
  per-file `code_files`, and `reran`, which runs: staleness is then measured from that code).
- `evidence_sha256`: sha256 of the evidence.json bytes the entry vouches for; `values_sha256` (every
  kind but `withdrawn`, since issue #28): sha256 of what the runs recorded (`values_sha256()`), which
  a `rederived` or `certified` entry never changes; a `rederived` entry adds `rederived_from`, the
  engine and design-rule flags the evidence was derived under before.
- `prev`: sha256 of the previous line's bytes (without its newline); the first line has 64 zeros.

`check()` (run by `gates verify`, whose `_lineage` adds that the file only grew across git commits)
finds: entries that vouch for other per-seed values than their attempt recorded, a second contract
under one id (`contract_change`), a broken chain (a line edited, removed or moved: the next
line's `prev` no longer matches), evidence whose bytes differ from the latest entry for its id
(changed without an entry that says so, or a `gates run` killed between writing the evidence and
indexing it: re-running it repairs that), and evidence or a contract that has entries but is gone
without a withdrawal. The chain cannot show a history re-chained or regenerated whole: that is what
the committed file's git history shows (docs/verify.md, the threat model).

Appends take an exclusive lock on the index file (flock) and are synced (fsync) before returning.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import stat
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import gates
from gates.contract import read_capped
from gates.errors import storage_error
from gates.record._files import (
    MAX_EVIDENCE_BYTES,
    MAX_INDEX_BYTES,
    fsync_dir,
    parse_json,
    read_json,
    read_json_object,
)

INDEX = "INDEX.jsonl"
GENESIS = "0" * 64
KINDS = ("recorded", "rederived", "withdrawn", "backfilled", "certified")
FIELDS = (
    "kind",
    "contract_id",
    "contract_sha256",
    "evidence_sha256",
    "verdict",
    "gates_version",
    "engine_version",
    "time",
    "reason",
    "prev",
)
CERTIFIED_FIELDS = (
    "code_sha256",
    "code_files",
    "reran",
    "tolerance",
)  # what a `certified` entry adds
# what later entries add: the recorded values' hash (every kind but `withdrawn`) and, on a `rederived`
# entry, the engine and rules the evidence had before (what changed, so re-deriving was due)
ADDED_FIELDS = ("values_sha256", "rederived_from")
VALUES = (
    "runs",
    "tuning",
    "falsifiable_point",
)  # what a run records; the verdict is derived from it
EVIDENCE = "evidence.json"  # = gates.record._evidence.EVIDENCE (which pulls in pydantic)


def index_path(runs_root: Path) -> Path:
    return Path(runs_root) / INDEX


def sha256_file(path: Path, max_bytes: int = MAX_EVIDENCE_BYTES) -> str:
    """sha256 of a regular file's bytes (read_capped: ValueError for a folder, FIFO or huge file)."""
    return hashlib.sha256(read_capped(Path(path), max_bytes)).hexdigest()


def line_sha256(line: bytes) -> str:
    return hashlib.sha256(line).hexdigest()


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


# ---------------------------------------------------------------------------------- writing
def record(
    runs_root: Path, evidence_path: Path, kind: str, reason: str = "", extra: dict | None = None
) -> dict:
    """Append one entry for the evidence at `evidence_path` (runs/<id>/evidence.json) and return it.

    For `withdrawn`, the evidence may be missing (its id is the folder's name); its contract sha256
    and verdict are taken from the evidence if present, else from the id's latest entry. `extra`:
    fields a kind adds (a certification's code fingerprint)."""
    if kind not in KINDS:
        raise ValueError(f"unknown index entry kind {kind!r}; expected one of {', '.join(KINDS)}")
    runs_root, evidence_path = Path(runs_root), Path(evidence_path)
    contract_id = evidence_path.parent.name
    evidence = None
    if evidence_path.is_file():
        try:
            data = read_capped(evidence_path, MAX_EVIDENCE_BYTES)
            evidence = parse_json(data)
        except ValueError as e:
            raise ValueError(
                f"{evidence_path}: {e}; an index entry vouches for readable evidence"
            ) from None
        if not isinstance(evidence, dict):
            raise ValueError(f"{evidence_path} is not a JSON object")
        contract_id = evidence.get("contract_id", contract_id)
        evidence_sha = hashlib.sha256(data).hexdigest()
    elif kind != "withdrawn":
        raise ValueError(
            f"{evidence_path} does not exist; only a withdrawal may name missing evidence"
        )
    entry = {
        "kind": kind,
        "contract_id": contract_id,
        "contract_sha256": evidence.get("contract_sha256") if evidence else None,
        "evidence_sha256": None if kind == "withdrawn" else evidence_sha,
        "verdict": evidence.get("verdict") if evidence else None,
        # the versions that computed the evidence: what it records, else (backfilled evidence from
        # before engines were numbered: gates.ledger.signature calls that engine 1) today's
        "gates_version": str((evidence or {}).get("gates_version") or gates.__version__),
        "engine_version": str(
            (evidence or {}).get("engine_version")
            or ("1" if kind == "backfilled" else engine_version())
        ),
        "time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "reason": reason,
        **({"values_sha256": values_sha256(evidence)} if evidence and kind != "withdrawn" else {}),
        **(extra or {}),
        "prev": None,
    }
    return _append(runs_root, entry)


def withdraw(runs_root: Path, contract_id: str, reason: str) -> dict:
    """Append a withdrawal of `contract_id` (its evidence, if any, stays where it is)."""
    return record(runs_root, Path(runs_root) / contract_id / EVIDENCE, "withdrawn", reason)


def backfill(runs_root: Path) -> list[dict]:
    """Enter every runs/<id>/evidence.json that has no index entry yet as `backfilled` (idempotent:
    evidence already indexed is left alone). Returns the entries appended."""
    runs_root = Path(runs_root)
    indexed = {e.get("contract_id") for e in _entries(runs_root)[0]}
    added = []
    for evidence in sorted(runs_root.glob(f"*/{EVIDENCE}")):
        if evidence.parent.name in indexed:
            continue
        try:
            ev = read_json(evidence, MAX_EVIDENCE_BYTES)
            when = f"recorded {ev.get('created_at', '?')} at commit {str(ev.get('git_commit', '?'))[:12]}"
        except (AttributeError, ValueError):
            when = "unreadable"
        added.append(
            record(
                runs_root,
                evidence,
                "backfilled",
                f"evidence that predates the index, entered as found ({when})",
            )
        )
    return added


def _append(runs_root: Path, entry: dict) -> dict:
    path = index_path(runs_root)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        created = not path.exists()
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
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
    return entry


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


# ---------------------------------------------------------------------------------- reading
def read(runs_root: Path) -> list[dict]:
    """Every entry, in order; ValueError naming the line when a line is not a JSON object. An
    index that does not exist yet is empty."""
    entries, problems = _entries(Path(runs_root))
    unreadable = [p for p in problems if p[1] is None]
    if unreadable:
        raise ValueError(unreadable[0][2])
    return [{k: v for k, v in e.items() if k != "_line"} for e in entries]


def require_index_file(runs_root: Path) -> None:
    """ValueError (one line) unless the claims history is absent or a readable regular file within
    its cap: what a command that will append to it checks first (a run, before any training)."""
    path = index_path(Path(runs_root))
    if os.path.lexists(path):
        try:
            read_capped(path, MAX_INDEX_BYTES)
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from None


def _entries(runs_root: Path) -> tuple[list[dict], list[tuple[int, str | None, str]]]:
    """(entries with their line number under `_line`, problems as (line number, contract id or None,
    text)), chain breaks included."""
    path = index_path(runs_root)
    where = f"runs/{INDEX}" if path.parent.name == "runs" else str(path)
    if not os.path.lexists(path):
        return [], []
    try:  # capped and type-checked as evidence is: a folder or FIFO here must not hang or crash a reader
        data = read_capped(path, MAX_INDEX_BYTES)
    except ValueError as e:
        return [], [(0, None, f"{where}: {e}")]
    entries, problems = [], []
    prev_line: bytes | None = None
    prev_id: str | None = None
    raw_lines = data.split(b"\n")
    torn = raw_lines[-1] != b""
    if not torn:
        raw_lines = raw_lines[:-1]
    for number, raw in enumerate(raw_lines, start=1):
        try:
            entry = parse_json(raw)
            if not isinstance(entry, dict):
                raise ValueError("not a JSON object")
        except ValueError as e:
            problems.append(
                (
                    number,
                    None,
                    f"{where} line {number} is not a JSON object ({str(e)[:80]}): "
                    f"the index was edited or an append was torn",
                )
            )
            prev_line, prev_id = raw, None
            continue
        cid = entry.get("contract_id") if isinstance(entry.get("contract_id"), str) else None
        expected = line_sha256(prev_line) if prev_line is not None else GENESIS
        if entry.get("prev") != expected:
            before = (
                f"line {number - 1}" + (f" ({prev_id})" if prev_id else "")
                if prev_line is not None
                else "the start"
            )
            problems.append(
                (
                    number,
                    cid,
                    f"{where} chain broken at line {number} ({cid or '?'}): its prev "
                    f"{str(entry.get('prev'))[:16]} is not the sha256 of {before}, "
                    f"{expected[:16]}: an entry was edited, removed or reordered",
                )
            )
            if prev_id and prev_id != cid:
                problems.append((number - 1, prev_id, problems[-1][2]))
        missing = [k for k in FIELDS if k not in entry]
        if missing or entry.get("kind") not in KINDS:
            problems.append(
                (
                    number,
                    cid,
                    f"{where} line {number} ({cid or '?'}) is not an index entry: "
                    + (f"lacks {', '.join(missing)}" if missing else f"kind {entry.get('kind')!r}"),
                )
            )
        if torn and number == len(raw_lines):
            problems.append(
                (
                    number,
                    cid,
                    f"{where} line {number} ({cid or '?'}) lacks its newline: an append "
                    f"was interrupted (the next `gates run` or `gates withdraw` repairs it)",
                )
            )
        entries.append({**entry, "_line": number})
        prev_line, prev_id = raw, cid
    return entries, problems


def latest(runs_root: Path) -> dict[str, dict]:
    """contract id -> its latest readable entry (with its line number under `_line`)."""
    found = {}
    for entry in _entries(Path(runs_root))[0]:
        if isinstance(entry.get("contract_id"), str):
            found[entry["contract_id"]] = entry
    return found


def is_withdrawn(entry: dict | None) -> bool:
    return entry is not None and entry.get("kind") == "withdrawn"


# ---------------------------------------------------------------------------------- checking
def check(runs_root: Path, contracts: dict[str, Path]) -> dict[str, list[str]]:
    """contract id -> what is wrong with its history (ids without problems are absent).

    `contracts`: contract id -> file, for the contracts that load (gates.verify.find_contracts). A
    problem that belongs to no readable entry (a garbled line) is given to the entries around it."""
    runs_root = Path(runs_root)
    entries, problems = _entries(runs_root)
    out: dict[str, list[str]] = {}

    def add(cid: str, text: str) -> None:
        if text not in out.setdefault(cid, []):
            out[cid].append(text)

    by_line = {
        e["_line"]: e.get("contract_id") for e in entries if isinstance(e.get("contract_id"), str)
    }
    for number, cid, text in problems:
        if cid is not None:
            add(cid, text)
            continue
        around = [
            by_line[n]
            for n in (
                max((n for n in by_line if n < number), default=None),
                min((n for n in by_line if n > number), default=None),
            )
            if n is not None
        ]
        for neighbour in around or _evidence_ids(runs_root) or ["(index)"]:
            add(neighbour, text)

    for cid, text in _values_problems(entries):
        add(cid, text)
    for cid, text in _contract_problems(entries, runs_root):
        add(cid, text)
    last = latest(runs_root)
    tried = attempts(runs_root)
    where = f"runs/{INDEX}" if runs_root.name == "runs" else str(index_path(runs_root))
    for cid, entry in sorted(last.items()):
        evidence = runs_root / cid / EVIDENCE
        said = f"line {entry['_line']}, {entry.get('kind')} {entry.get('time')}"
        if is_withdrawn(entry):
            continue
        if not evidence.is_file():
            gone = "" if cid in contracts else "; its contract is gone too"
            add(
                cid,
                f"{evidence} disappeared without a withdrawal (latest index entry: {said}){gone}; "
                f"expected the evidence, or `gates withdraw {cid} --reason ...`",
            )
            continue
        actual = sha256_file(evidence)
        if actual != entry.get("evidence_sha256"):
            add(
                cid,
                f"{evidence} changed without an index entry: sha256 {actual[:16]} != "
                f"{str(entry.get('evidence_sha256'))[:16]} of the latest entry ({said}) in {where}; "
                f"evidence is rewritten only by `gates run` (which indexes it; re-running an "
                f"interrupted one repairs this) or with a `rederived` entry that says why",
            )
            continue
        ev = read_json_object(evidence, MAX_EVIDENCE_BYTES)
        if ev is None:
            continue  # the byte hash matched: the evidence is what was indexed; check_claim says what is wrong
        for key in ("verdict", "contract_sha256"):
            if isinstance(ev, dict) and ev.get(key) != entry.get(key):
                add(
                    cid,
                    f"the latest index entry ({said}) says {key} {entry.get(key)!r}, its evidence "
                    f"{ev.get(key)!r}: the entry was edited",
                )
        if isinstance(ev, dict):
            for text in attempt_problems(ev, tried.get(cid, [])):
                add(cid, text)
    for evidence in sorted(runs_root.glob(f"*/{EVIDENCE}")):
        cid = evidence.parent.name
        if cid not in last:
            add(
                cid,
                f"{evidence} has no entry in {where}: evidence is indexed when `gates run` writes it "
                f"(a run killed between the two is repaired by running it again)",
            )
    return out


def _values_problems(entries: list[dict]) -> list[tuple[str, str]]:
    """(contract id, problem) for each `rederived` or `certified` entry whose values hash differs from
    the one its attempt was recorded with: those entries vouch for new evidence bytes but never for
    new per-seed values (entries from before values were hashed pin nothing until one does)."""
    pinned: dict[str, tuple[str, int]] = {}
    out = []
    for e in entries:
        cid, kind, values = e.get("contract_id"), e.get("kind"), e.get("values_sha256")
        if not isinstance(cid, str):
            continue
        if kind in ATTEMPT_KINDS:
            pinned.pop(cid, None)
            if isinstance(values, str):
                pinned[cid] = (values, e["_line"])
        elif kind in ("rederived", "certified"):
            if cid not in pinned:
                if isinstance(values, str):
                    pinned[cid] = (values, e["_line"])
                continue
            want, line = pinned[cid]
            if values != want:
                out.append(
                    (
                        cid,
                        f"{INDEX} line {e['_line']} ({kind}) vouches for per-seed values (sha256 "
                        f"{str(values)[:16]}) other than those its attempt recorded (line {line}: "
                        f"{want[:16]}): re-deriving or certifying never changes what the runs recorded",
                    )
                )
    return out


def contract_change(
    runs_root: Path, contract_id: str, sha256: str, supersedes: str | None
) -> str | None:
    """Why an attempt at `contract_id` under contract `sha256` may not be recorded in this claims
    history, or None. One id, one contract: an id whose evidence was recorded under one contract
    takes another only once that claim was withdrawn, and the new contract must declare what it
    supersedes (its own id included), so that the change of goalpost is on the record."""
    state = None
    for e in _entries(Path(runs_root))[0]:
        if e.get("contract_id") == contract_id:
            state = _standing(state, e)
    return _change_problem(contract_id, state, sha256, supersedes)


def _standing(state: tuple | None, entry: dict) -> tuple | None:
    """(contract sha256, its line, withdrawn since) of an id's latest attempt, after `entry`."""
    if entry.get("kind") in ATTEMPT_KINDS:
        return entry.get("contract_sha256"), entry.get("_line"), False
    if entry.get("kind") == "withdrawn" and state is not None:
        return state[0], state[1], True
    return state


def _change_problem(
    cid: str, state: tuple | None, sha256: str, supersedes: str | None
) -> str | None:
    if state is None or state[0] is None or state[0] == sha256:
        return None
    standing, line, withdrawn = state
    said = f"{INDEX} line {line} recorded {cid} under contract sha256 {str(standing)[:16]}"
    if not withdrawn:
        return (
            f"{said}, and this contract hashes to {sha256[:16]}: one id, one contract (a changed "
            f"contract is a new version under a new id with `supersedes: {cid}`, or the recorded "
            f"claim is withdrawn first)"
        )
    if not supersedes:
        return (
            f"{said}, withdrawn since; a new contract under the same id declares what it supersedes "
            f"(`supersedes: {cid}`)"
        )
    return None


def _contract_problems(entries: list[dict], runs_root: Path) -> list[tuple[str, str]]:
    """(contract id, problem) for each attempt recorded under another contract than the attempt before
    it (`contract_change`); the latest attempt's `supersedes` is read from its evidence (an older
    attempt's evidence is gone: only its withdrawal is checked)."""
    last_attempt = {
        e["contract_id"]: e["_line"]
        for e in entries
        if e.get("kind") in ATTEMPT_KINDS and isinstance(e.get("contract_id"), str)
    }
    out, states = [], {}
    for e in entries:
        cid = e.get("contract_id")
        if not isinstance(cid, str):
            continue
        if e.get("kind") in ATTEMPT_KINDS:
            supersedes = "(not checked)"
            if e["_line"] == last_attempt[cid]:
                ev = read_json_object(runs_root / cid / EVIDENCE, MAX_EVIDENCE_BYTES)
                supersedes = ev.get("supersedes") if ev else None
            why = _change_problem(cid, states.get(cid), str(e.get("contract_sha256")), supersedes)
            if why:
                out.append((cid, f"line {e['_line']}: {why}"))
        states[cid] = _standing(states.get(cid), e)
    return out


# ---------------------------------------------------------------------------------- attempts
@dataclass
class Attempt:
    """One attempt at a claim: a `recorded` (or `backfilled`) entry and what later entries said of it
    (re-derived by a corrected engine, withdrawn), up to the next attempt."""

    number: int
    verdict: str | None
    time: str | None
    contract_sha256: str | None
    evidence_sha256: str | None
    reason: str  # why it was recorded (empty for a first attempt)
    rederived: int = 0  # times its verdict was re-derived from its recorded per-seed values
    withdrawn: str | None = None  # the withdrawal's reason, when one followed it

    def line(self) -> str:
        """'attempt 1 inconclusive (2026-11-30; withdrawn: ...)', as status and the dashboard show it."""
        notes = [str(self.time or "?")[:10]]
        if self.reason:
            notes.append(f"recorded because: {self.reason}")
        if self.withdrawn is not None:
            notes.append(f"withdrawn: {self.withdrawn}")
        return f"attempt {self.number} {self.verdict or '-'} ({'; '.join(notes)})"


ATTEMPT_KINDS = ("recorded", "backfilled")


def certifications(runs_root: Path) -> dict[str, dict]:
    """contract id -> its latest `certified` entry that still concerns its evidence (no attempt
    recorded since: a new attempt's evidence is measured against the code that computed it)."""
    out: dict[str, dict] = {}
    for e in _entries(Path(runs_root))[0]:
        cid = e.get("contract_id")
        if not isinstance(cid, str):
            continue
        if e.get("kind") == "certified" and isinstance(e.get("code_files"), dict):
            out[cid] = e
        elif e.get("kind") in ATTEMPT_KINDS:
            out.pop(cid, None)
    return out


def attempts(runs_root: Path, contract_id: str | None = None) -> dict[str, list[Attempt]]:
    """contract id -> its attempts in order, from the claims history (or only `contract_id`'s). Every
    `recorded` or `backfilled` entry starts an attempt; a `rederived` entry updates its verdict and
    evidence hash; a `withdrawn` entry marks it withdrawn."""
    out: dict[str, list[Attempt]] = {}
    for e in _entries(Path(runs_root))[0]:
        cid = e.get("contract_id")
        if not isinstance(cid, str) or (contract_id is not None and cid != contract_id):
            continue
        found = out.setdefault(cid, [])
        kind = e.get("kind")
        if kind in ATTEMPT_KINDS:
            found.append(
                Attempt(
                    len(found) + 1,
                    e.get("verdict"),
                    e.get("time"),
                    e.get("contract_sha256"),
                    e.get("evidence_sha256"),
                    str(e.get("reason") or "") if kind == "recorded" else "",
                )
            )
        elif found and kind == "rederived":
            found[-1].verdict, found[-1].evidence_sha256 = (
                e.get("verdict"),
                e.get("evidence_sha256"),
            )
            found[-1].rederived += 1
        elif found and kind == "withdrawn":
            found[-1].withdrawn = str(e.get("reason") or "no reason given")
    return out


def attempt_problems(evidence: dict, found: list[Attempt]) -> list[str]:
    """What the evidence's own `attempt` record says that the claims history contradicts: its number,
    and the number and verdict of each earlier attempt (evidence from before attempts were recorded has
    no `attempt` and is not checked)."""
    said = evidence.get("attempt")
    if not isinstance(said, dict):
        return []
    problems = []
    if said.get("number") != len(found):
        problems.append(
            f"the evidence says it is attempt {said.get('number')}, the claims history ({INDEX}) has "
            f"{len(found)} attempt{'s' * (len(found) != 1)} of this claim: an attempt is missing from "
            f"one of them"
        )
    earlier = [
        (a.get("number"), a.get("verdict"))
        for a in said.get("earlier") or []
        if isinstance(a, dict)
    ]
    indexed = [(a.number, a.verdict) for a in found[:-1]]
    if earlier != indexed:
        problems.append(
            f"the evidence lists earlier attempts {earlier}, the claims history {indexed}"
        )
    return problems


def _evidence_ids(runs_root: Path) -> list[str]:
    return sorted(p.parent.name for p in runs_root.glob(f"*/{EVIDENCE}"))


def link_supersession(
    claims: list, declared: dict[str, str], evidence: dict[str, dict | None]
) -> None:
    """Set each claim's `supersedes` and `superseded_by` (claims: objects with `contract_id`). What a
    contract declares (`declared`: id -> the id it supersedes) comes first; evidence whose contract
    is gone still says what it superseded."""
    supersedes = dict(declared)
    for cid, ev in evidence.items():
        if ev is not None and isinstance(ev.get("supersedes"), str):
            supersedes.setdefault(cid, ev["supersedes"])
    for claim in claims:
        claim.supersedes = supersedes.get(claim.contract_id)
        claim.superseded_by = sorted(
            new for new, old in supersedes.items() if old == claim.contract_id
        )
