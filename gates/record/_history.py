"""The claims history checked (`check_history`, run by `gates verify`, whose `_lineage` adds that
the file only grew across git commits): entries that vouch for other per-seed values than their
attempt recorded, a second contract under one id (`contract_change`), a broken chain (a line edited,
removed or moved: the next line's `prev` no longer matches), evidence whose bytes differ from the
latest entry for its id (changed without an entry that says so, or a `gates run` killed between
writing the evidence and indexing it: re-running it repairs that), and evidence or a contract that
has entries but is gone without a withdrawal. The chain cannot show a history re-chained or
regenerated whole: that is what the committed file's git history shows (docs/verify.md, the threat
model).

The history's format and its entries (`IndexEntry`) are gates.record._index's; appending is
gates.record._writer's; certifications, attempts and successors have their own modules
(gates.record._certified, gates.record._attempt_log, gates.record._successors).
"""

from __future__ import annotations

from pathlib import Path

from gates.record._attempt_log import attempt_problems, claim_attempts
from gates.record._certified import check_certifications
from gates.record._index import (
    EVIDENCE,
    INDEX,
    IndexEntry,
    index_path,
    is_withdrawn,
    latest_entries,
    parse_index,
    sha256_file,
)
from gates.record._view import raw_view


# ---------------------------------------------------------------------------------- checking
def check_history(runs_root: Path, contracts: dict[str, Path]) -> dict[str, list[str]]:
    """contract id -> what is wrong with its history (ids without problems are absent).

    `contracts`: contract id -> file, for the contracts that load (gates.verify.find_contracts). A
    problem that belongs to no readable entry (a garbled line) is given to the entries around it."""
    runs_root = Path(runs_root)
    entries, problems = parse_index(runs_root)
    out: dict[str, list[str]] = {}

    def add(cid: str, text: str) -> None:
        if text not in out.setdefault(cid, []):
            out[cid].append(text)

    by_line = {e.line: e.contract_id for e in entries if e.contract_id is not None}
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
    last = latest_entries(runs_root, entries=entries)
    tried = claim_attempts(runs_root, entries=entries)
    where = f"runs/{INDEX}" if runs_root.name == "runs" else str(index_path(runs_root))
    for cid, entry in sorted(last.items()):
        evidence = runs_root / cid / EVIDENCE
        said = f"line {entry.line}, {entry.kind} {entry.time}"
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
        try:
            actual = sha256_file(evidence)
        except ValueError:  # over its cap, or not a regular file: check_files says what is wrong
            continue
        if actual != entry.evidence_sha256:
            add(
                cid,
                f"{evidence} changed without an index entry: sha256 {actual[:16]} != "
                f"{str(entry.evidence_sha256)[:16]} of the latest entry ({said}) in {where}; "
                f"evidence is rewritten only by `gates run` (which indexes it; re-running an "
                f"interrupted one repairs this) or with a `rederived` entry that says why",
            )
            continue
        ev = raw_view(evidence)
        if ev is None:
            continue  # the byte hash matched: the evidence is what was indexed; check_claim says what is wrong
        for key, said_there, said_here in (
            ("verdict", entry.verdict, ev.verdict),
            ("contract_sha256", entry.contract_sha256, ev.contract_sha256),
        ):
            if said_here != said_there:
                add(
                    cid,
                    f"the latest index entry ({said}) says {key} {said_there!r}, its evidence "
                    f"{said_here!r}: the entry was edited",
                )
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


def _values_problems(entries: list[IndexEntry]) -> list[tuple[str, str]]:
    """(contract id, problem) for each `rederived` or `certified` entry whose values hash differs from
    the one its attempt was recorded with: those entries vouch for new evidence bytes but never for
    new per-seed values (entries from before values were hashed pin nothing until one does)."""
    pinned: dict[str, tuple[str, int]] = {}
    out = []
    for e in entries:
        cid, kind, values = e.contract_id, e.kind, e.values_sha256
        if cid is None:
            continue
        if e.is_attempt:
            pinned.pop(cid, None)
            if isinstance(values, str):
                pinned[cid] = (values, e.line)
        elif kind in ("rederived", "certified"):
            if cid not in pinned:
                if isinstance(values, str):
                    pinned[cid] = (values, e.line)
                continue
            want, line = pinned[cid]
            if values != want:
                out.append(
                    (
                        cid,
                        f"{INDEX} line {e.line} ({kind}) vouches for per-seed values (sha256 "
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
    for e in parse_index(Path(runs_root))[0]:
        if e.contract_id == contract_id:
            state = _standing(state, e)
    return _change_problem(contract_id, state, sha256, supersedes)


def _standing(state: tuple | None, entry: IndexEntry) -> tuple | None:
    """(contract sha256, its line, withdrawn since) of an id's latest attempt, after `entry`."""
    if entry.is_attempt:
        return entry.contract_sha256, entry.line, False
    if entry.kind == "withdrawn" and state is not None:
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


def _contract_problems(entries: list[IndexEntry], runs_root: Path) -> list[tuple[str, str]]:
    """(contract id, problem) for each attempt recorded under another contract than the attempt before
    it (`contract_change`); the latest attempt's `supersedes` is read from its evidence (an older
    attempt's evidence is gone: only its withdrawal is checked)."""
    last_attempt = {
        e.contract_id: e.line for e in entries if e.is_attempt and e.contract_id is not None
    }
    out, states = [], {}
    for e in entries:
        cid = e.contract_id
        if cid is None:
            continue
        if e.is_attempt:
            supersedes = "(not checked)"
            if e.line == last_attempt[cid]:
                ev = raw_view(runs_root / cid / EVIDENCE)
                supersedes = ev.supersedes if ev is not None else None
            why = _change_problem(cid, states.get(cid), str(e.contract_sha256), supersedes)
            if why:
                out.append((cid, f"line {e.line}: {why}"))
        states[cid] = _standing(states.get(cid), e)
    return out


def _evidence_ids(runs_root: Path) -> list[str]:
    return sorted(p.parent.name for p in runs_root.glob(f"*/{EVIDENCE}"))
