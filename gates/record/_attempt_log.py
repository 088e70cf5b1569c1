"""The attempts at each claim, as the claims history records them (`claim_attempts`): every
`recorded` or `backfilled` entry starts one, later entries re-derive or withdraw it; and what a claim's
evidence says of its attempts that the history contradicts (`attempt_problems`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gates.record._index import INDEX, IndexEntry, index_entries
from gates.record._view import EvidenceView


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


def claim_attempts(
    runs_root: Path, contract_id: str | None = None, *, entries: list[IndexEntry] | None = None
) -> dict[str, list[Attempt]]:
    """contract id -> its attempts in order, from the claims history (or only `contract_id`'s). Every
    `recorded` or `backfilled` entry starts an attempt; a `rederived` entry updates its verdict and
    evidence hash; a `withdrawn` entry marks it withdrawn. `entries`: the history as parsed already
    (`index_entries`), else it is read."""
    out: dict[str, list[Attempt]] = {}
    for e in index_entries(runs_root) if entries is None else entries:
        cid = e.contract_id
        if cid is None or (contract_id is not None and cid != contract_id):
            continue
        found = out.setdefault(cid, [])
        if e.is_attempt:
            found.append(
                Attempt(
                    len(found) + 1,
                    e.verdict,
                    e.time,
                    e.contract_sha256,
                    e.evidence_sha256,
                    (e.reason or "") if e.kind == "recorded" else "",
                )
            )
        elif found and e.kind == "rederived":
            found[-1].verdict, found[-1].evidence_sha256 = e.verdict, e.evidence_sha256
            found[-1].rederived += 1
        elif found and e.kind == "withdrawn":
            found[-1].withdrawn = e.reason or "no reason given"
    return out


def attempt_problems(evidence: EvidenceView, found: list[Attempt]) -> list[str]:
    """What the evidence's own `attempt` record says that the claims history contradicts: its number,
    and the number and verdict of each earlier attempt (evidence from before attempts were recorded has
    no `attempt` and is not checked)."""
    said = evidence.attempt
    if said is None:
        return []
    problems = []
    if said.number != len(found):
        problems.append(
            f"the evidence says it is attempt {said.number}, the claims history ({INDEX}) has "
            f"{len(found)} attempt{'s' * (len(found) != 1)} of this claim: an attempt is missing from "
            f"one of them"
        )
    earlier, indexed = list(said.earlier), [(a.number, a.verdict) for a in found[:-1]]
    if earlier != indexed:
        problems.append(
            f"the evidence lists earlier attempts {earlier}, the claims history {indexed}"
        )
    return problems
