"""Attempts at a claim: whether a `gates run` records a new one or reproduces the recorded one.

Every recording of a contract's evidence is an attempt, and every attempt stays on the record: the
claims history (runs/INDEX.jsonl) has one `recorded` entry per attempt, and the evidence of attempt N
carries `attempt: {number: N, reason, earlier: [...]}` with the verdict and the why of each earlier
attempt, which verdict.md, `gates status` and the dashboard show ("attempt 2; earlier: attempt 1
invalid ...").

`gates run` on a contract that already has evidence (same contract hash, indexed, not withdrawn)
does not record by default: it reproduces the recorded attempt (its runs are reused from MLflow or
trained again) and compares the verdict and the per-seed metrics with the record, writing nothing
under runs/. Recording another attempt is a deliberate act: `--record --reason TEXT`, and the reason
is kept in the history. This closes the forking path of re-running a contract until it passes, and
lets the quickstart run a recorded contract end to end on a fresh clone without changing a tracked
file.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from gates.contract import read_capped
from gates.errors import UserError
from gates.record import _evidence as ledger
from gates.record._attempt_log import Attempt, claim_attempts
from gates.record._files import MAX_EVIDENCE_BYTES
from gates.record._index import index_entries, is_withdrawn, latest_entries

RECORD, REPRODUCE = "record", "reproduce"
WHY_SHOWN = 3  # reasons of an earlier attempt kept in the new evidence


@dataclass
class Recording:
    """What a `gates run` will do with its verdict: record attempt `number`, or reproduce `recorded`."""

    mode: str  # RECORD | REPRODUCE
    number: int  # the attempt this run records (RECORD), or the attempt it reproduces (REPRODUCE)
    reason: str = ""
    recorded: ledger.Evidence | None = (
        None  # the evidence on disk (REPRODUCE: the attempt reproduced)
    )
    # RECORD: summaries of the earlier attempts
    earlier: list[ledger.EarlierAttemptRecord] = field(default_factory=list)
    family: object = None  # the claim family (gates.record.Family) the verdict is judged at


def plan_recording(
    loaded, runs_root: Path, *, record: bool = False, reason: str | None = None
) -> Recording:
    """Decide before any training whether this run records a new attempt or reproduces the recorded
    one; UserError (exit 2) for flags that do not fit the claim's state, and for recording from files
    no commit holds (`refuse_uncommitted`). Its `family`: the contract's claim family (the alpha its
    verdict is judged at) for the attempt this run records or reproduces (`family_for`)."""
    recording = _plan(loaded, runs_root, record, reason)
    if recording.mode == RECORD:
        from gates.record._provenance import refuse_uncommitted

        refuse_uncommitted(loaded.path, type(loaded.study).__module__, "record")
    from gates.record._family import attempt_verdicts, family_for

    # a later attempt is judged at what the earlier ones left
    before = (
        [e.verdict for e in recording.earlier]
        if recording.mode == RECORD
        else attempt_verdicts(recording.recorded)[:-1]
    )
    recording.family = family_for(loaded, runs_root, before)
    return recording


def _plan(loaded, runs_root: Path, record: bool, reason: str | None) -> Recording:
    reason = (reason or "").strip()
    if reason and not record:
        raise UserError(
            "--reason goes with --record (it says why another attempt is recorded)",
            field="--reason",
        )
    path = ledger.evidence_dir(runs_root, loaded.id) / ledger.EVIDENCE
    # the claim's files read once each: the history parsed once for its attempts and latest entry, the
    # evidence's bytes read once for its record and their hash
    entries = index_entries(runs_root)
    found = claim_attempts(runs_root, loaded.id, entries=entries).get(loaded.id, [])
    latest = latest_entries(runs_root, entries=entries).get(loaded.id)
    current, sha256 = _readable(path)
    vouched = (
        current is not None
        and latest is not None
        and not is_withdrawn(latest)
        and latest.evidence_sha256 == sha256
    )
    if not vouched:
        # nothing recorded, withdrawn, unreadable, or written but not indexed (a run killed in between):
        # this run records; an interrupted attempt is completed under its own number, with its reason
        interrupted = current.attempt if current is not None else None
        if (
            not reason
            and latest is not None
            and not is_withdrawn(latest)
            and interrupted is not None
            and interrupted.number == len(found) + 1
        ):
            reason = str(interrupted.reason or "")
        return Recording(RECORD, len(found) + 1, reason, earlier=_earlier(found, current, sha256))
    if current.contract_sha256 != loaded.sha256:
        return Recording(
            RECORD, len(found) + 1, reason, earlier=_earlier(found, current, sha256)
        )  # refused by the runner
    if not record:
        return Recording(REPRODUCE, len(found), recorded=current)
    if not reason:
        raise UserError(
            f"{loaded.id} already has evidence (attempt {len(found)}, {current.verdict}, recorded "
            f"{current.created_at}); recording another attempt needs --reason TEXT (kept in the "
            f"claims history), or a new contract id",
            file=str(loaded.path),
            field="--record",
        )
    from gates.record._family import successors

    later = successors(runs_root, loaded.id)
    if later:  # its alpha would be spent after a later version was judged on what it left
        raise UserError(
            f"{loaded.id} is superseded by recorded {', '.join(later)}, judged at the alpha this version "
            f"left: another attempt here would spend it twice; expected a new attempt of the latest "
            f"version ({later[-1]}), or a new version superseding it",
            file=str(loaded.path),
            field="--record",
        )
    return Recording(RECORD, len(found) + 1, reason, earlier=_earlier(found, current, sha256))


def _readable(path: Path) -> tuple[ledger.Evidence | None, str | None]:
    """(the evidence at `path`, the sha256 of its bytes), from one read; (None, None) when it is
    unreadable or no evidence."""
    try:
        raw = read_capped(path, MAX_EVIDENCE_BYTES)
        return ledger.parse_evidence(raw), hashlib.sha256(raw).hexdigest()
    except (ValueError, OSError):
        return None, None


def _earlier(
    found: list[Attempt], current: ledger.Evidence | None, sha256: str | None
) -> list[ledger.EarlierAttemptRecord]:
    """Summaries of the attempts in the history, each with its why: from the evidence on disk
    (`current`, its bytes hashing to `sha256`) for the latest (when it is that attempt's: its bytes are
    the ones indexed), and from that evidence's own list for the ones before it."""
    own = current is not None and bool(found) and found[-1].evidence_sha256 == sha256
    carried = {}
    if current is not None and current.attempt is not None:
        for a in current.attempt.earlier:
            carried[a.number] = list(a.why)
    out = []
    for a in found:
        why = carried.get(a.number, [])
        if own and a is found[-1] and not why:
            why = list(current.reasons)[:WHY_SHOWN]
        summary = {
            "number": a.number,
            "verdict": a.verdict,
            "recorded": a.time,
            "reason": a.reason,
            "contract_sha256": a.contract_sha256,
            "withdrawn": a.withdrawn,
            "why": why,
        }
        out.append(ledger.EarlierAttemptRecord.model_validate(summary))
    return out


def attempt_field(recording: Recording) -> dict:
    """evidence.json's `attempt` for the attempt being recorded."""
    earlier = [e.as_dict() for e in recording.earlier]
    return {"number": recording.number, "reason": recording.reason, "earlier": earlier}


def describe(attempt: ledger.AttemptRecord | None) -> list[str]:
    """verdict.md's lines for an evidence's `attempt` (none for a first attempt without history)."""
    if attempt is None or attempt.number <= 1 and not attempt.earlier:
        return []
    lines = [
        f"Attempt {attempt.number} at this claim"
        + (f", recorded because: {attempt.reason}" if attempt.reason else "")
        + "; earlier:",
        "",
    ]
    for a in attempt.earlier:
        head = f"- attempt {a.number}: **{str(a.verdict or '-').upper()}**, recorded {a.recorded}"
        if a.reason:
            head += f" (because: {a.reason})"
        if a.withdrawn:
            head += f"; withdrawn: {a.withdrawn}"
        lines.append(head)
        lines += [f"  - {w}" for w in a.why]
    return lines + [""]


# ---------------------------------------------------------------------------------- reproducing
@dataclass
class Reproduction:
    """A re-run of a recorded attempt, compared with its record."""

    attempt: int
    recorded_at: str
    recorded_verdict: str
    verdict: str
    runs_compared: int  # runs completed both in the record and now, whose metrics are compared
    runs_missing: list[str]  # arm/seed in the record without a counterpart now, or the reverse
    status_changed: list[str]  # arm/seed whose status differs
    max_abs_diff: (
        float | None
    )  # over every metric of every run both have (machine metrics left out)
    max_rel_diff: float | None
    largest: str  # where the largest relative difference is

    @property
    def reproduces(self) -> bool:
        return self.verdict == self.recorded_verdict

    def as_dict(self) -> dict:
        return {**asdict(self), "reproduces": self.reproduces}

    def lines(self) -> list[str]:
        head = (
            f"reproduced: {self.verdict.upper()}, as recorded (attempt {self.attempt}, recorded {self.recorded_at})"
            if self.reproduces
            else f"does NOT reproduce: this run gives {self.verdict.upper()}, the record says "
            f"{self.recorded_verdict.upper()} (attempt {self.attempt}, recorded {self.recorded_at})"
        )
        out = [head]
        if self.max_rel_diff == 0:
            out.append(
                f"per-seed metrics of the {self.runs_compared} runs completed in both: identical to the record"
            )
        elif self.max_rel_diff is not None:
            out.append(
                f"per-seed metrics of the {self.runs_compared} runs completed in both: largest difference "
                f"from the record "
                f"{self.max_rel_diff:.2%} relative, {self.max_abs_diff:.3g} absolute ({self.largest})"
            )
        if self.status_changed:
            out.append(f"status differs from the record: {', '.join(self.status_changed[:6])}")
        if self.runs_missing:
            out.append(f"runs not in both: {', '.join(self.runs_missing[:6])}")
        return out


def compare_reproduction(
    recorded: ledger.Evidence, fresh: ledger.Evidence, attempt: int, machine_metrics=frozenset()
) -> Reproduction:
    """The fresh evidence of a re-run against the recorded evidence."""
    old = {(r.arm, r.seed): r for r in recorded.runs}
    new = {(r.arm, r.seed): r for r in fresh.runs}
    missing = [f"{a}/seed {s}" for a, s in sorted(set(old) ^ set(new), key=str)]
    changed, worst, compared = [], (None, None, ""), 0
    for key in sorted(set(old) & set(new), key=str):
        a, b = old[key], new[key]
        if a.status != b.status:
            changed.append(f"{key[0]}/seed {key[1]} {a.status} -> {b.status}")
        if a.status != "completed" or b.status != "completed":
            continue
        compared += 1
        for name, value in a.metrics.items():
            now = b.metrics.get(name)
            if name in machine_metrics or not _finite(value) or not _finite(now):
                continue
            diff = abs(now - value)
            rel = diff / max(abs(value), 1e-12)
            if worst[1] is None or rel > worst[1]:
                worst = (
                    diff,
                    rel,
                    f"{key[0]}/seed {key[1]} {name} {now:.6g} vs recorded {value:.6g}",
                )
    return Reproduction(
        attempt,
        recorded.created_at,
        recorded.verdict,
        fresh.verdict,
        compared,
        missing,
        changed,
        worst[0],
        worst[1],
        worst[2],
    )


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
