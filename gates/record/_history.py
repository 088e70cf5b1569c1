"""The claims history: `runs/INDEX.jsonl`, an append-only, hash-chained index of every verdict recorded.

One JSON object per line, appended and never rewritten:

    {"kind": "recorded", "contract_id": ..., "contract_sha256": ..., "evidence_sha256": ...,
     "verdict": ..., "gates_version": ..., "engine_version": ..., "time": ..., "reason": ..., "prev": ...}

- `kind`: `recorded` (a `gates run` wrote the evidence), `rederived` (the evidence was rewritten from
  its recorded per-seed values, e.g. by a corrected verdict engine; `reason` says why), `withdrawn`
  (`gates withdraw_claim`: the claim is no longer made; `evidence_sha256` is null), `backfilled` (evidence
  that existed before the index, entered once as it was) or `certified` (`gates certify`: re-runs of
  the recorded runs under today's code reproduced them; the entry adds that code's `code_sha256` and
  per-file `code_files`, and `reran`, which runs: staleness is then measured from that code).
- `evidence_sha256`: sha256 of the evidence.json bytes the entry vouches for; `values_sha256` (every
  kind but `withdrawn`, since issue #28): sha256 of what the runs recorded (`values_sha256()`), which
  a `rederived` or `certified` entry never changes; a `rederived` entry adds `rederived_from`, the
  engine and design-rule flags the evidence was derived under before.
- `prev`: sha256 of the previous line's bytes (without its newline); the first line has 64 zeros.

`check_history()` (run by `gates verify`, whose `_lineage` adds that the file only grew across git commits)
finds: entries that vouch for other per-seed values than their attempt recorded, a second contract
under one id (`contract_change`), a broken chain (a line edited, removed or moved: the next
line's `prev` no longer matches), evidence whose bytes differ from the latest_entries entry for its id
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
import math
import os
import stat
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import gates
from gates.contract import read_capped
from gates.errors import Problem, storage_error
from gates.record._files import (
    MAX_EVIDENCE_BYTES,
    MAX_INDEX_BYTES,
    fsync_dir,
    parse_json,
    read_json,
    read_json_object,
)
from gates.record._provenance import git

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
    "reran_runs",
)  # what a `certified` entry adds (`reran_runs`: each re-run's values, since issue #39)
# what later entries add: the recorded values' hash (every kind but `withdrawn`) and, on a `rederived`
# entry, the engine and rules the evidence had before (what changed, so re-deriving was due)
ADDED_FIELDS = ("values_sha256", "rederived_from", "design")  # design: a withdrawal's (design_of)
VALUES = (
    "runs",
    "tuning",
    "falsifiable_point",
)  # what a run records; the verdict is derived from it
EVIDENCE = "evidence.json"  # = gates.record._evidence.EVIDENCE (which pulls in pydantic)

# Problem codes of the claims history (gates.errors.Problem: what readers match on, never the text);
# every other history problem is gates.verify's HISTORY. Each loses the claims concerned.
HISTORY_NOT_A_FILE = "history_not_a_file"  # a symbolic link (never followed), folder, FIFO, too big
HISTORY_MALFORMED = "history_malformed"  # an entry whose fields are not what the kind writes
# a certified entry that vouches for re-runs the evidence contradicts, or for code that was not the
# code committed with it
CERTIFICATION_INVALID = "certification_invalid"
# a note, not a loss: a certified entry in the format before re-run values were recorded, added
# after that format ended (or where git cannot say when): not counted, the claim is measured from
# the code its evidence recorded
CERTIFICATION_IGNORED = "certification_ignored"


def index_path(runs_root: Path) -> Path:
    return Path(runs_root) / INDEX


def _shown(runs_root: Path) -> str:
    path = index_path(runs_root)
    return f"runs/{INDEX}" if path.parent.name == "runs" else str(path)


def index_location_problem(runs_root: Path) -> str | None:
    """One line when the claims history is not a file of the repository itself: the file, or the runs
    folder it is in, is a symbolic link (its target, anywhere, would be read_index as the history; git keeps
    the link, not the file). A link is never followed. None otherwise (a missing index included)."""
    runs_root = Path(runs_root)
    for path, what in ((runs_root, "its folder"), (index_path(runs_root), "it")):
        if os.path.islink(path):
            try:
                target = os.readlink(path)
            except OSError:
                target = "?"
            return (
                f"{_shown(runs_root)}: {what} is a symbolic link (to {target}), never followed; "
                f"expected the claims history as a regular file in the repository"
            )
    return None


def _read_index(runs_root: Path) -> bytes:
    """The claims history's bytes: ValueError (one line) for a link, a folder, a FIFO, a device or a
    file over its cap."""
    problem = index_location_problem(runs_root)
    if problem:
        raise ValueError(problem)
    try:
        return read_capped(index_path(runs_root), MAX_INDEX_BYTES)
    except ValueError as e:
        raise ValueError(f"{_shown(runs_root)}: {e}") from None


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
def record_entry(
    runs_root: Path, evidence_path: Path, kind: str, reason: str = "", extra: dict | None = None
) -> dict:
    """Append one entry for the evidence at `evidence_path` (runs/<id>/evidence.json) and return it.

    For `withdrawn`, the evidence may be missing (its id is the folder's name); its contract sha256
    and verdict are taken from the evidence if present, else from the id's latest_entries entry. `extra`:
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
        # before engines were numbered: gates.record._evidence.signature calls that engine 1) today's
        "gates_version": str((evidence or {}).get("gates_version") or gates.__version__),
        "engine_version": str(
            (evidence or {}).get("engine_version")
            or ("1" if kind == "backfilled" else engine_version())
        ),
        "time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "reason": reason,
        **({"values_sha256": values_sha256(evidence)} if evidence and kind != "withdrawn" else {}),
        # what was withdrawn, kept though its evidence and contract may go: a claim registered
        # again on the same design must name it (`successor_problem`)
        **({"design": design_of(evidence)} if kind == "withdrawn" and design_of(evidence) else {}),
        **(extra or {}),
        "prev": None,
    }
    return _append(runs_root, entry)


def withdraw_claim(runs_root: Path, contract_id: str, reason: str) -> dict:
    """Append a withdrawal of `contract_id` (its evidence, if any, stays where it is)."""
    return record_entry(runs_root, Path(runs_root) / contract_id / EVIDENCE, "withdrawn", reason)


def backfill_index(runs_root: Path) -> list[dict]:
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
            record_entry(
                runs_root,
                evidence,
                "backfilled",
                f"evidence that predates the index, entered as found ({when})",
            )
        )
    return added


def _append(runs_root: Path, entry: dict) -> dict:
    path = index_path(runs_root)
    problem = index_location_problem(runs_root)
    if problem:
        raise ValueError(problem)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        created = not path.exists()
        # O_NOFOLLOW: a link put in place since the check_history above is refused, never written through
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
    """Raise a StorageError naming the index when `e` is a full disk or a read_index-only file or folder
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
def read_index(runs_root: Path) -> list[dict]:
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
    problem = index_location_problem(Path(runs_root))
    if problem:
        raise ValueError(problem)
    if os.path.lexists(path):
        _read_index(Path(runs_root))


def _entries(runs_root: Path) -> tuple[list[dict], list[tuple[int, str | None, str]]]:
    """(entries with their line number under `_line`, problems as (line number, contract id or None,
    text)), chain breaks included."""
    path = index_path(runs_root)
    where = _shown(runs_root)
    if not os.path.lexists(path) and not os.path.islink(runs_root):
        return [], []
    try:  # capped and type-checked as evidence is: a folder or FIFO here must not hang or crash a
        # reader, and a symbolic link is never followed
        data = _read_index(runs_root)
    except ValueError as e:
        return [], [(0, None, Problem(HISTORY_NOT_A_FILE, str(e)))]
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
        else:
            wrong = entry_problems(entry)
            if wrong:
                entry["_malformed"] = True  # readers skip what it says (certifications)
                problems.append(
                    (
                        number,
                        cid,
                        Problem(
                            HISTORY_MALFORMED,
                            f"{where} line {number} ({cid or '?'}, {entry['kind']}): {wrong[0]}"
                            + (f" (and {len(wrong) - 1} more)" if len(wrong) > 1 else "")
                            + "; the entry was not written by gates",
                        ),
                    )
                )
        if torn and number == len(raw_lines):
            problems.append(
                (
                    number,
                    cid,
                    f"{where} line {number} ({cid or '?'}) lacks its newline: an append "
                    f"was interrupted (the next `gates run` or `gates withdraw_claim` repairs it)",
                )
            )
        entries.append({**entry, "_line": number})
        prev_line, prev_id = raw, cid
    return entries, problems


def _is_text(v) -> bool:
    return isinstance(v, str)


def _is_sha(v) -> bool:
    return isinstance(v, str) and len(v) == 64 and all(c in "0123456789abcdef" for c in v)


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def tolerance_problem(tolerance) -> str | None:
    """Why a recorded tolerance is not {"abs": number >= 0, "rel": number >= 0}, or None."""
    if not isinstance(tolerance, dict):
        return f'tolerance is {_brief(tolerance)}; expected {{"abs": number, "rel": number}}'
    for key in ("abs", "rel"):
        value = tolerance.get(key)
        if not _is_number(value) or value < 0:
            return f"tolerance.{key} is {_brief(value)}; expected a finite number >= 0"
    return None


def _brief(value) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= 40 else text[:37] + "..."


def entry_problems(entry: dict) -> list[str]:
    """What is wrong with the fields of one claims-history entry (a known kind with every FIELD): the
    one validation every reader relies on (`gates verify`, `status`, `report`, the dashboard), so that a
    hand-edited field is a one-line problem, never a traceback. Each: "FIELD is X; expected Y"."""
    out = []
    kind = entry.get("kind")

    def want(field: str, ok, expected: str, optional: bool = False) -> None:
        if optional and field not in entry:
            return
        if not ok(entry.get(field)):
            out.append(f"{field} is {_brief(entry.get(field))}; expected {expected}")

    want("contract_id", _is_text, "a contract id")
    for field in ("gates_version", "engine_version", "time", "reason", "prev"):
        want(field, _is_text, "a string")
    want("verdict", lambda v: v is None or _is_text(v), "a verdict or null")
    want("contract_sha256", lambda v: v is None or _is_sha(v), "a sha256 (64 hex digits)")
    if kind == "withdrawn":
        want("evidence_sha256", lambda v: v is None, "null (a withdrawal vouches for no evidence)")
    else:
        want("evidence_sha256", _is_sha, "a sha256 (64 hex digits)")
    want("values_sha256", _is_sha, "a sha256 (64 hex digits)", optional=True)
    want("rederived_from", lambda v: isinstance(v, dict), "an object", optional=True)
    want("design", _is_design, "[study, [arm, ...], [[list, kind], ...]]", optional=True)
    if kind == "certified":
        want("code_sha256", _is_sha, "a sha256 (64 hex digits)")
        want(
            "code_files",
            lambda v: isinstance(v, dict) and v and all(map(_is_sha, v.values())),
            "an object of file -> sha256",
        )
        want("reran", _is_text, "a string")
        if "tolerance" in entry and (why := tolerance_problem(entry["tolerance"])):
            out.append(why)
        if "reran_runs" in entry:
            why = reran_runs_problem(entry["reran_runs"])
            if why:
                out.append(why)
    return out


def reran_runs_problem(reran) -> str | None:
    """Why a certified entry's `reran_runs` is not a list of {"arm", "seed", "metrics"} (metric ->
    number or null), or None."""
    if not isinstance(reran, list) or not reran:
        return f"reran_runs is {_brief(reran)}; expected the re-runs' values, a non-empty list"
    for i, run in enumerate(reran):
        ok = (
            isinstance(run, dict)
            and _is_text(run.get("arm"))
            and isinstance(run.get("seed"), int)
            and not isinstance(run.get("seed"), bool)
            and isinstance(run.get("metrics"), dict)
            and all(v is None or _is_number(v) for v in run["metrics"].values())
        )
        if not ok:
            return (
                f'reran_runs.{i} is {_brief(run)}; expected {{"arm": name, "seed": integer, '
                f'"metrics": {{name: number or null}}}}'
            )
    return None


def index_entries(runs_root: Path) -> list[dict]:
    """The history's readable entries, parsed once for a caller that asks several questions of it
    (`latest_entries`, `claim_attempts`), each with its line number under `_line`."""
    return _entries(Path(runs_root))[0]


def latest_entries(runs_root: Path, *, entries: list[dict] | None = None) -> dict[str, dict]:
    """contract id -> its latest_entries readable entry (with its line number under `_line`); `entries`: the
    history as parsed already (`index_entries`), else it is read_index."""
    found = {}
    for entry in index_entries(runs_root) if entries is None else entries:
        if isinstance(entry.get("contract_id"), str):
            found[entry["contract_id"]] = entry
    return found


def is_withdrawn(entry: dict | None) -> bool:
    return entry is not None and entry.get("kind") == "withdrawn"


# ---------------------------------------------------------------------------------- checking
def check_history(runs_root: Path, contracts: dict[str, Path]) -> dict[str, list[str]]:
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
    for cid, text in check_certifications(runs_root, entries).problems:
        add(cid, text)
    for cid, text in _contract_problems(entries, runs_root):
        add(cid, text)
    last = latest_entries(runs_root)
    tried = claim_attempts(runs_root)
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
                f"{evidence} disappeared without a withdrawal (latest_entries index entry: {said}){gone}; "
                f"expected the evidence, or `gates withdraw_claim {cid} --reason ...`",
            )
            continue
        try:
            actual = sha256_file(evidence)
        except ValueError:  # over its cap, or not a regular file: check_files says what is wrong
            continue
        if actual != entry.get("evidence_sha256"):
            add(
                cid,
                f"{evidence} changed without an index entry: sha256 {actual[:16]} != "
                f"{str(entry.get('evidence_sha256'))[:16]} of the latest_entries entry ({said}) in {where}; "
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
                    f"the latest_entries index entry ({said}) says {key} {entry.get(key)!r}, its evidence "
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
    supersedes (its own id included), so that the change of goalpost is on the record_entry."""
    state = None
    for e in _entries(Path(runs_root))[0]:
        if e.get("contract_id") == contract_id:
            state = _standing(state, e)
    return _change_problem(contract_id, state, sha256, supersedes)


def _standing(state: tuple | None, entry: dict) -> tuple | None:
    """(contract sha256, its line, withdrawn since) of an id's latest_entries attempt, after `entry`."""
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


# ---------------------------------------------------------------------------------- successors
CONDITION_LISTS = ("supported_if", "refuted_if")


def design_of(source: dict | None) -> list | None:
    """What a claim tests, never its wording: [study, [arm names], [[condition list, kind], ...]],
    from a contract's YAML mapping or from evidence (plain JSON); None when it does not say. Two claims
    with one design test the same arms of the same study with the same kinds of conditions (their
    bars, margins and claim text may differ: an easier bar is the same design)."""
    if not isinstance(source, dict) or not isinstance(source.get("study"), str):
        return None
    if isinstance(source.get("decision"), dict):  # a contract
        arms = source.get("arms")
        conditions = [
            (name, c.get("kind"))
            for name in CONDITION_LISTS
            for c in source["decision"].get(name) or []
            if isinstance(c, dict)
        ]
    else:  # evidence
        settings = source.get("settings")
        arms = settings.get("arm_configs") if isinstance(settings, dict) else None
        conditions = [
            (c.get("list_name"), c.get("kind"))
            for c in source.get("conditions") or []
            if isinstance(c, dict)
        ]
    if not isinstance(arms, dict) or not arms or not conditions:
        return None
    return [
        source["study"],
        sorted(map(str, arms)),
        sorted([str(a), str(b)] for a, b in conditions),
    ]


def _is_design(value) -> bool:
    return (
        isinstance(value, list)
        and len(value) == 3
        and _is_text(value[0])
        and isinstance(value[1], list)
        and all(map(_is_text, value[1]))
        and isinstance(value[2], list)
        and all(isinstance(c, list) and len(c) == 2 and all(map(_is_text, c)) for c in value[2])
    )


def successor_problem(
    runs_root: Path,
    contract_id: str,
    design: list | None,
    supersedes: str | None,
    entries: list[dict] | None = None,
) -> str | None:
    """Why the claim `contract_id` (of `design`, declaring `supersedes`) may not stand: a claim withdrawn
    before it was first recorded (or, not recorded yet, before now) has the same design, and its
    supersedes chain (what it declares, then what each evidence declares) does not reach it. Withdraw,
    then register the same experiment again under a new id unlinked, and the withdrawal would read_index as
    a fresh start; naming what it replaces puts the earlier attempt on its record_entry. None otherwise."""
    runs_root = Path(runs_root)
    if design is None:
        return None
    if entries is None:
        entries = _entries(runs_root)[0]
    first: int | None = None  # the line of this claim's first attempt
    withdrawn: dict[str, tuple[int, list | None]] = {}
    for e in entries:
        cid = e.get("contract_id")
        if not isinstance(cid, str):
            continue
        if cid == contract_id and e.get("kind") in ATTEMPT_KINDS and first is None:
            first = e["_line"]
        if e.get("kind") == "withdrawn":
            withdrawn[cid] = (e["_line"], e.get("design") if _is_design(e.get("design")) else None)
        elif e.get("kind") in ATTEMPT_KINDS:
            withdrawn.pop(cid, None)  # recorded anew since: standing again
    if not withdrawn:
        return None
    chain, at = set(), supersedes
    while isinstance(at, str) and at not in chain:
        chain.add(at)
        ev = read_json_object(runs_root / at / EVIDENCE, MAX_EVIDENCE_BYTES)
        at = ev.get("supersedes") if ev else None
    for cid, (line, said) in sorted(withdrawn.items()):
        if cid == contract_id or cid in chain or (first is not None and first < line):
            continue
        if said is None:
            said = design_of(read_json_object(runs_root / cid / EVIDENCE, MAX_EVIDENCE_BYTES))
        if said == design:
            return (
                f"it tests what withdrawn {cid} tested ({INDEX} line {line}: study {design[0]}, "
                f"arms {', '.join(design[1])}, the same kinds of conditions) without naming it: "
                f"declare `supersedes: {cid}` (the withdrawn attempt goes on its record_entry)"
            )
    return None


def _contract_problems(entries: list[dict], runs_root: Path) -> list[tuple[str, str]]:
    """(contract id, problem) for each attempt recorded under another contract than the attempt before
    it (`contract_change`); the latest_entries attempt's `supersedes` is read_index from its evidence (an older
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


# ---------------------------------------------------------------------------------- claim_attempts
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


# Certified entries before issue #39 carried no re-run values (`reran_runs`): such an entry counts only
# when the commit that added it is this one or an ancestor (the last commit whose `gates certify` wrote
# that format); added later, or where git cannot say when, it is not counted (CERTIFICATION_IGNORED).
LEGACY_CERTIFIED_UNTIL = "f1c68bcbd1eef13ad8616d691421631dad1b91c3"


def within_tolerance(a, b, abs_tol: float, rel_tol: float) -> bool:
    """A re-run value `a` against the recorded `b` (None: not finite, as evidence stores it)."""
    if a is None or b is None:
        return a is None and b is None
    if not (math.isfinite(a) and math.isfinite(b)):
        return a == b or (math.isnan(a) and math.isnan(b))
    return abs(a - b) <= abs_tol + rel_tol * abs(b)


@dataclass
class Certifications:
    """What the claims history's certified entries establish (`check_certifications`): `valid`
    (contract id -> its latest_entries certified entry that still concerns its evidence and holds: staleness
    is measured from its code), `problems` ((contract id, Problem) for entries that do not hold: the
    claim is lost) and `notes` (contract id -> why an entry was not counted)."""

    valid: dict[str, dict]
    problems: list[tuple[str, Problem]]
    notes: dict[str, str]


def certifications(runs_root: Path) -> dict[str, dict]:
    """contract id -> its latest_entries `certified` entry that still concerns its evidence (no attempt
    recorded since: a new attempt's evidence is measured against the code that computed it) and holds
    (`check_certifications`)."""
    return check_certifications(runs_root).valid


def check_certifications(runs_root: Path, entries: list[dict] | None = None) -> Certifications:
    """Check each claim's standing certified entry: a certification is what only a re-run produces,
    so it carries the re-runs' values (`reran_runs`), which must be the recorded runs' within the
    entry's tolerance, and its code fingerprint, which must be the code of the commit that added it
    (where the claims history and the code are one repository and the study's code is in it). An
    entry from before re-run values were recorded counts only when committed by LEGACY_CERTIFIED_UNTIL
    (or an ancestor); a malformed entry never counts (`entry_problems` names it)."""
    runs_root = Path(runs_root)
    if entries is None:
        entries = _entries(runs_root)[0]
    standing: dict[str, dict] = {}
    for e in entries:
        cid = e.get("contract_id")
        if not isinstance(cid, str):
            continue
        if e.get("kind") == "certified" and not e.get("_malformed"):
            standing[cid] = e
        elif e.get("kind") in ATTEMPT_KINDS:
            standing.pop(cid, None)
    found = Certifications({}, [], {})
    if not standing:
        return found
    commits = _line_commits(runs_root)
    for cid, e in standing.items():
        line = e["_line"]
        said = f"{INDEX} line {line} (certified {str(e.get('time'))[:10]})"
        commit = commits.get(line) if commits is not None else None
        if "reran_runs" not in e:
            if commit and _is_ancestor(runs_root, commit, LEGACY_CERTIFIED_UNTIL):
                found.valid[cid] = e
            else:
                when = (
                    "git cannot say when it was added"
                    if commit is None
                    else "it is not committed"
                    if not commit
                    else f"it was added in commit {commit[:12]}"
                )
                found.notes[cid] = (
                    f"{said} is not counted: it records no re-run values (the format before "
                    f"certifications carried them) and {when}; `gates certify` records a new one"
                )
            continue
        why = _reran_problem(runs_root, cid, e) or _code_problem(runs_root, e, commit)
        if why:
            found.problems.append((cid, Problem(CERTIFICATION_INVALID, f"{said}: {why}")))
        else:
            found.valid[cid] = e
    return found


def _reran_problem(runs_root: Path, cid: str, entry: dict) -> str | None:
    """Why the entry's re-run values are not the recorded runs' within its tolerance, or None."""
    why = tolerance_problem(entry.get("tolerance"))
    if why:
        return f"{why} (a certification records the tolerance it compared with)"
    ev = read_json_object(runs_root / cid / EVIDENCE, MAX_EVIDENCE_BYTES)
    if ev is None or not isinstance(ev.get("runs"), list):
        return None  # the evidence's own check_history says what is wrong with it
    recorded = {
        (r.get("arm"), r.get("seed")): r
        for r in ev["runs"]
        if isinstance(r, dict) and r.get("status") == "completed"
    }
    tol, seen = entry["tolerance"], set()
    for run in entry["reran_runs"]:
        key, name = (run["arm"], run["seed"]), f"{run['arm']}/seed {run['seed']}"
        if key in seen:
            return f"re-run {name} is listed twice"
        seen.add(key)
        if key not in recorded:
            return f"re-run {name} is no completed run of the evidence"
        metrics = recorded[key].get("metrics") if isinstance(recorded[key], dict) else None
        metrics = metrics if isinstance(metrics, dict) else {}
        if not run["metrics"]:
            return f"re-run {name} records no metric"
        for metric, value in run["metrics"].items():
            was = metrics.get(metric)
            if not (was is None or _is_number(was)) or not within_tolerance(
                value, was, tol["abs"], tol["rel"]
            ):
                return (
                    f"re-run {name}: {metric} {value} is not the recorded {_brief(was)} within "
                    f"abs {tol['abs']:g}, rel {tol['rel']:g}: the entry vouches for re-runs the "
                    f"evidence contradicts"
                )
    if entry.get("reran") != f"{len(seen)} of {len(recorded)} completed runs":
        return (
            f"reran says {_brief(entry.get('reran'))}, its re-run values are {len(seen)} of "
            f"{len(recorded)} completed runs"
        )
    return None


def _code_problem(runs_root: Path, entry: dict, commit: str | None) -> str | None:
    """Why the entry's code fingerprint is not the code of the commit that added it, or None (also
    when that cannot be told: not committed yet, no git, a study whose code is not in the repository
    of the claims history)."""
    from gates.record._provenance import files_at_commit, plugin_files
    from gates.study import study_module

    if not commit:
        return None
    ev = read_json_object(runs_root / str(entry.get("contract_id")) / EVIDENCE, MAX_EVIDENCE_BYTES)
    study = ev.get("study") if ev else None
    module = study_module(study) if isinstance(study, str) else None
    top = git("rev-parse", "--show-toplevel", root=index_path(runs_root).absolute().parent)
    if module is None or not top or plugin_files(module) is not None:
        return None
    if not (Path(top) / "gates").is_dir():  # the platform's code is elsewhere: not this history's
        return None
    at = files_at_commit(commit, module, Path(top))
    if at is None or at[0] == entry.get("code_sha256"):
        return None
    return (
        f"its code fingerprint {str(entry.get('code_sha256'))[:12]} is not the code of commit "
        f"{commit[:12]}, which added it ({at[0][:12]}): a certification is committed with the code "
        f"it was made under"
    )


def _line_commits(runs_root: Path) -> dict[int, str] | None:
    """line number of the claims history -> the commit that added it ("" for a line not committed
    yet), from `git blame`; None outside a git checkout (or where git cannot tell)."""
    folder = index_path(runs_root).absolute().parent
    if not folder.is_dir() or not git("rev-parse", "--show-toplevel", root=folder):
        return None
    blamed = git("blame", "--porcelain", "--", INDEX, root=folder)
    if blamed is None:
        return {}  # never committed: every line is new
    out = {}
    for row in blamed.splitlines():
        parts = row.split(" ")
        if len(parts) >= 3 and len(parts[0]) == 40 and parts[2].isdigit():
            out[int(parts[2])] = "" if set(parts[0]) == {"0"} else parts[0]
    return out


def _is_ancestor(runs_root: Path, commit: str, of: str) -> bool:
    folder = index_path(runs_root).absolute().parent
    return git("merge-base", "--is-ancestor", commit, of, root=folder) is not None


def claim_attempts(
    runs_root: Path, contract_id: str | None = None, *, entries: list[dict] | None = None
) -> dict[str, list[Attempt]]:
    """contract id -> its claim_attempts in order, from the claims history (or only `contract_id`'s). Every
    `recorded` or `backfilled` entry starts an attempt; a `rederived` entry updates its verdict and
    evidence hash; a `withdrawn` entry marks it withdrawn. `entries`: the history as parsed already
    (`index_entries`), else it is read_index."""
    out: dict[str, list[Attempt]] = {}
    for e in index_entries(runs_root) if entries is None else entries:
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
    """What the evidence's own `attempt` record_entry says that the claims history contradicts: its number,
    and the number and verdict of each earlier attempt (evidence from before claim_attempts were recorded has
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
            f"the evidence lists earlier claim_attempts {earlier}, the claims history {indexed}"
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
