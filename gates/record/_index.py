"""The claims history read back: `runs/INDEX.jsonl` and its entries (`IndexEntry`), as MLflow's
`entities` hand out runs: an append-only, hash-chained file of one JSON object per line:

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

Parsing (`parse_index`) checks the chain and each entry's fields (`entry_problems`) on the JSON as
written; the chain hashes each line's own bytes, never a re-serialisation of the entity. Appending is
gates.record._writer's, the checks gates.record._history's.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from gates.contract import read_capped
from gates.errors import Problem
from gates.record._files import (
    MAX_EVIDENCE_BYTES,
    MAX_INDEX_BYTES,
    as_mapping,
    as_text,
    parse_json,
)

INDEX = "INDEX.jsonl"
GENESIS = "0" * 64
KINDS = ("recorded", "rederived", "withdrawn", "backfilled", "certified")
ATTEMPT_KINDS = ("recorded", "backfilled")  # the kinds that start an attempt at a claim
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
    "reran_elsewhere",
)  # what a `certified` entry adds (`reran_runs`: each re-run's values, since issue #39;
# `reran_elsewhere`, when any: runs recorded on another machine that re-ran as the code the claim
# stood on re-runs them here, not counted in `reran`)
# what later entries add: the recorded values' hash (every kind but `withdrawn`) and, on a `rederived`
# entry, the engine and rules the evidence had before (what changed, so re-deriving was due)
ADDED_FIELDS = ("values_sha256", "rederived_from", "design")  # design: a withdrawal's (design_of)
EVIDENCE = "evidence.json"  # = gates.record._evidence.EVIDENCE (which pulls in pydantic)

# Problem codes of the claims history (gates.errors.Problem: what readers match on, never the text);
# every other history problem is gates.verify's HISTORY. Each loses the claims concerned.
HISTORY_NOT_A_FILE = "history_not_a_file"  # a symbolic link (never followed), folder, FIFO, too big
HISTORY_MALFORMED = "history_malformed"  # an entry whose fields are not what the kind writes


@dataclass(frozen=True)
class RerunRecord:
    """One re-run a `certified` entry lists (`reran_runs`): its arm, seed and the values it gave
    (metric -> number or null), checked where the line is parsed (`reran_runs_problem`)."""

    arm: str
    seed: int
    metrics: dict[str, float | None]
    commit: str | None = (
        None  # `reran_elsewhere`: the commit whose re-run here it was compared with
    )

    @classmethod
    def from_json(cls, data: dict) -> RerunRecord:
        """The re-run a checked `reran_runs` item holds (`reran_runs_problem` found nothing wrong)."""
        return cls(
            arm=data["arm"],
            seed=data["seed"],
            metrics=dict(data["metrics"]),
            commit=data.get("commit"),
        )

    def as_dict(self) -> dict:
        """The re-run as the entry writes it."""
        out = {"arm": self.arm, "seed": self.seed, "metrics": dict(self.metrics)}
        return out if self.commit is None else out | {"commit": self.commit}


def _reran_runs(value, commit: bool = False, empty: bool = False) -> tuple[RerunRecord, ...] | None:
    """An entry's `reran_runs` (`reran_elsewhere`: `commit`; `empty` where a list may be) as records,
    or None where it is absent or not what a certification writes (`reran_runs_problem` names it and
    marks the entry malformed)."""
    if value is None or reran_runs_problem(value, commit=commit, empty=empty) is not None:
        return None
    return tuple(RerunRecord.from_json(run) for run in value)


@dataclass(frozen=True)
class IndexEntry:
    """One entry of the claims history as read back: each field as the entry wrote it, or None where
    it is absent or of another type (a hand-edited field: `parse_index` names it, and `malformed`
    says readers must not rely on it); `line`, its 1-based line number in the file; `data`, the JSON
    object exactly as parsed (what a forger or a test edits; never re-serialised into the chain,
    which hashes the line's own bytes)."""

    line: int
    data: dict = field(repr=False)
    kind: str | None = None
    contract_id: str | None = None
    contract_sha256: str | None = None
    evidence_sha256: str | None = None
    verdict: str | None = None
    gates_version: str | None = None
    engine_version: str | None = None
    time: str | None = None
    reason: str | None = None
    prev: str | None = None
    values_sha256: str | None = None  # every kind but `withdrawn`, since issue #28
    rederived_from: dict | None = None  # a `rederived` entry's engine and rules before
    design: list | None = None  # a withdrawal's design (`design_of`), when well formed
    # a `certified` entry's code fingerprint, which runs it re-ran and their values, and the tolerance
    code_sha256: str | None = None
    code_files: dict | None = None
    reran: str | None = None
    tolerance: dict | None = None
    reran_runs: tuple[RerunRecord, ...] | None = None  # checked: each (arm, seed, metrics)
    # runs from other kernels judged against a re-run under the code the claim stood on, not counted
    reran_elsewhere: tuple[RerunRecord, ...] = ()
    malformed: bool = False  # a field is not what its kind writes (`entry_problems`)

    @classmethod
    def from_json(cls, data: dict, line: int, *, malformed: bool = False) -> IndexEntry:
        """The entry the parsed line `data` holds (a JSON object), at line `line`."""
        texts = {
            k: as_text(data.get(k)) for k in (*FIELDS, "values_sha256", "code_sha256", "reran")
        }
        return cls(
            line=line,
            data=data,
            **texts,
            rederived_from=as_mapping(data.get("rederived_from")),
            design=data.get("design") if is_design(data.get("design")) else None,
            code_files=as_mapping(data.get("code_files")),
            tolerance=as_mapping(data.get("tolerance")),
            reran_runs=_reran_runs(data.get("reran_runs"), empty="reran_elsewhere" in data),
            reran_elsewhere=_reran_runs(data.get("reran_elsewhere"), commit=True) or (),
            malformed=malformed,
        )

    @property
    def is_attempt(self) -> bool:
        """Whether this entry starts an attempt at its claim (`recorded` or `backfilled`)."""
        return self.kind in ATTEMPT_KINDS


def index_path(runs_root: Path) -> Path:
    return Path(runs_root) / INDEX


def shown_index(runs_root: Path) -> str:
    """The index as messages name it: runs/INDEX.jsonl in a project, else its path."""
    path = index_path(runs_root)
    return f"runs/{INDEX}" if path.parent.name == "runs" else str(path)


def index_location_problem(runs_root: Path) -> str | None:
    """One line when the claims history is not a file of the repository itself: the file, or the runs
    folder it is in, is a symbolic link (its target, anywhere, would be read as the history; git keeps
    the link, not the file). A link is never followed. None otherwise (a missing index included)."""
    runs_root = Path(runs_root)
    for path, what in ((runs_root, "its folder"), (index_path(runs_root), "it")):
        if os.path.islink(path):
            try:
                target = os.readlink(path)
            except OSError:
                target = "?"
            return (
                f"{shown_index(runs_root)}: {what} is a symbolic link (to {target}), never followed; "
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
        raise ValueError(f"{shown_index(runs_root)}: {e}") from None


def sha256_file(path: Path, max_bytes: int = MAX_EVIDENCE_BYTES) -> str:
    """sha256 of a regular file's bytes (read_capped: ValueError for a folder, FIFO or huge file)."""
    return hashlib.sha256(read_capped(Path(path), max_bytes)).hexdigest()


def line_sha256(line: bytes) -> str:
    return hashlib.sha256(line).hexdigest()


# ---------------------------------------------------------------------------------- reading
def read_index(runs_root: Path) -> list[IndexEntry]:
    """Every entry, in order; ValueError naming the line when a line is not a JSON object. An
    index that does not exist yet is empty."""
    entries, problems = parse_index(Path(runs_root))
    unreadable = [p for p in problems if p[1] is None]
    if unreadable:
        raise ValueError(unreadable[0][2])
    return entries


def require_index_file(runs_root: Path) -> None:
    """ValueError (one line) unless the claims history is absent or a readable regular file within
    its cap: what a command that will append to it checks first (a run, before any training)."""
    path = index_path(Path(runs_root))
    problem = index_location_problem(Path(runs_root))
    if problem:
        raise ValueError(problem)
    if os.path.lexists(path):
        _read_index(Path(runs_root))


def parse_index(runs_root: Path) -> tuple[list[IndexEntry], list[tuple[int, str | None, str]]]:
    """(the readable entries, problems as (line number, contract id or None, text)), chain breaks
    included."""
    path = index_path(runs_root)
    where = shown_index(runs_root)
    if not os.path.lexists(path) and not os.path.islink(runs_root):
        return [], []
    try:  # capped and type-checked as evidence is: a folder or FIFO here must not hang or crash a
        # reader, and a symbolic link is never followed
        data = _read_index(runs_root)
    except ValueError as e:
        return [], [(0, None, Problem(HISTORY_NOT_A_FILE, str(e)))]
    entries, problems = _parsed(where, data)
    return list(entries), list(problems)


@functools.lru_cache(maxsize=8)
def _parsed(where: str, data: bytes) -> tuple[tuple[IndexEntry, ...], tuple]:
    """The history's bytes parsed and its chain checked, once per content: a command asks for the
    history in several places (admission, the recording's plan, the family, the run's checks) and
    re-reads its bytes each time (they grow with each entry), but parses them once. Entries are
    frozen, so every reader can share them."""
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
        malformed = False
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
            malformed = bool(wrong)  # readers skip what it says (certifications)
            if wrong:
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
                    f"was interrupted (the next `gates run` or `gates withdraw` repairs it)",
                )
            )
        entries.append(IndexEntry.from_json(entry, number, malformed=malformed))
        prev_line, prev_id = raw, cid
    return tuple(entries), tuple(problems)


def index_entries(runs_root: Path) -> list[IndexEntry]:
    """The history's readable entries, parsed once for a caller that asks several questions of it
    (`latest_entries`, `claim_attempts`)."""
    return parse_index(Path(runs_root))[0]


def latest_entries(
    runs_root: Path, *, entries: list[IndexEntry] | None = None
) -> dict[str, IndexEntry]:
    """contract id -> its latest readable entry; `entries`: the history as parsed already
    (`index_entries`), else it is read."""
    found = {}
    for entry in index_entries(runs_root) if entries is None else entries:
        if entry.contract_id is not None:
            found[entry.contract_id] = entry
    return found


def is_withdrawn(entry: IndexEntry | None) -> bool:
    return entry is not None and entry.kind == "withdrawn"


# ---------------------------------------------------------------------------------- an entry's fields
def is_text(v) -> bool:
    return isinstance(v, str)


def is_sha(v) -> bool:
    return isinstance(v, str) and len(v) == 64 and all(c in "0123456789abcdef" for c in v)


def is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def is_design(value) -> bool:
    """Whether `value` is a design as `design_of` gives it: [study, [arm, ...], [[list, kind], ...]]."""
    return (
        isinstance(value, list)
        and len(value) == 3
        and is_text(value[0])
        and isinstance(value[1], list)
        and all(map(is_text, value[1]))
        and isinstance(value[2], list)
        and all(isinstance(c, list) and len(c) == 2 and all(map(is_text, c)) for c in value[2])
    )


def brief(value) -> str:
    """A value as a one-line message quotes it: JSON, cut at 40 characters."""
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= 40 else text[:37] + "..."


def tolerance_problem(tolerance) -> str | None:
    """Why a recorded tolerance is not {"abs": number >= 0, "rel": number >= 0}, or None."""
    if not isinstance(tolerance, dict):
        return f'tolerance is {brief(tolerance)}; expected {{"abs": number, "rel": number}}'
    for key in ("abs", "rel"):
        value = tolerance.get(key)
        if not is_number(value) or value < 0:
            return f"tolerance.{key} is {brief(value)}; expected a finite number >= 0"
    return None


def entry_problems(entry: dict) -> list[str]:
    """What is wrong with the fields of one claims-history entry (a known kind with every FIELD), read
    on the JSON as written: the one validation every reader relies on (`gates verify`, `status`,
    `report`, the dashboard), so that a hand-edited field is a one-line problem, never a traceback.
    Each: "FIELD is X; expected Y"."""
    out = []
    kind = entry.get("kind")

    def want(field: str, ok, expected: str, optional: bool = False) -> None:
        if optional and field not in entry:
            return
        if not ok(entry.get(field)):
            out.append(f"{field} is {brief(entry.get(field))}; expected {expected}")

    want("contract_id", is_text, "a contract id")
    for name in ("gates_version", "engine_version", "time", "reason", "prev"):
        want(name, is_text, "a string")
    want("verdict", lambda v: v is None or is_text(v), "a verdict or null")
    want("contract_sha256", lambda v: v is None or is_sha(v), "a sha256 (64 hex digits)")
    if kind == "withdrawn":
        want("evidence_sha256", lambda v: v is None, "null (a withdrawal vouches for no evidence)")
    else:
        want("evidence_sha256", is_sha, "a sha256 (64 hex digits)")
    want("values_sha256", is_sha, "a sha256 (64 hex digits)", optional=True)
    want("rederived_from", lambda v: isinstance(v, dict), "an object", optional=True)
    want("design", is_design, "[study, [arm, ...], [[list, kind], ...]]", optional=True)
    if kind == "certified":
        want("code_sha256", is_sha, "a sha256 (64 hex digits)")
        want(
            "code_files",
            lambda v: isinstance(v, dict) and v and all(map(is_sha, v.values())),
            "an object of file -> sha256",
        )
        want("reran", is_text, "a string")
        if "tolerance" in entry and (why := tolerance_problem(entry["tolerance"])):
            out.append(why)
        # a certification re-runs something: reran_runs may be empty only beside reran_elsewhere
        elsewhere = "reran_elsewhere" in entry
        if "reran_runs" in entry:
            why = reran_runs_problem(entry["reran_runs"], empty=elsewhere)
            if why:
                out.append(why)
        if elsewhere:
            why = reran_runs_problem(entry["reran_elsewhere"], "reran_elsewhere", commit=True)
            if why:
                out.append(why)
    return out


def reran_runs_problem(
    reran, field: str = "reran_runs", commit: bool = False, empty: bool = False
) -> str | None:
    """Why a certified entry's `reran_runs` (or `reran_elsewhere`, each with the "commit" its re-run
    was compared with) is not a list of {"arm", "seed", "metrics"} (metric -> number or null),
    non-empty unless `empty`, or None."""
    if not isinstance(reran, list) or not (reran or empty):
        return f"{field} is {brief(reran)}; expected the re-runs' values, a non-empty list"
    for i, run in enumerate(reran):
        ok = (
            isinstance(run, dict)
            and is_text(run.get("arm"))
            and isinstance(run.get("seed"), int)
            and not isinstance(run.get("seed"), bool)
            and isinstance(run.get("metrics"), dict)
            and all(v is None or is_number(v) for v in run["metrics"].values())
            and (
                not commit
                or (is_text(run.get("commit")) and re.fullmatch(r"[0-9a-f]{40}", run["commit"]))
            )
        )
        if not ok:
            also = ', "commit": a 40-digit sha' if commit else ""
            return (
                f'{field}.{i} is {brief(run)}; expected {{"arm": name, "seed": integer, '
                f'"metrics": {{name: number or null}}{also}}}'
            )
    return None
