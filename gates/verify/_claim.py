"""A claim's check: what `gates verify`, `gates status` and the dashboard say of one recorded claim.

`ClaimCheck` holds its status (ok, lost, pending, withdrawn), its problems and what the claims history
and the code say of it; each `Problem` is a message with a code, what readers match on.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gates.errors import Problem  # defined there: the record layer codes its problems too
from gates.record import RegimeLeft

# Problem codes. The files phase (`check_files`): the evidence, the contract file and its hash.
EVIDENCE_UNREADABLE = "evidence_unreadable"  # not valid evidence (shape, JSON, size)
EVIDENCE_FOREIGN = "evidence_foreign"  # records another contract id
EVIDENCE_MISSING = "evidence_missing"  # a contract named on the command line has none
CONTRACT_AMBIGUOUS = "contract_ambiguous"  # several contract files have the id
CONTRACT_MISSING = "contract_missing"  # no contract file has the id
CONTRACT_UNLOADABLE = "contract_unloadable"  # the contract file no longer loads
CONTRACT_ID_CHANGED = "contract_id_changed"
CONTRACT_EDITED = "contract_edited"  # its sha256 is not the recorded one
NOT_RUN = "not_run"  # a contract without evidence (pending)
# a contract of the folder without evidence that `gates check` refuses (a typo, a wrong arm, bad
# seeds, an unknown study, broken YAML): status "broken", which fails `gates verify`
CONTRACT_INVALID = "contract_invalid"
# The re-derive phase (`check_claim`): what the recorded per-seed values and today's code say.
RUNS = "runs"  # not exactly the contract's arms x seeds
CONVERGENCE = "convergence"
SETTINGS = "settings"  # settings, claim text or gate-5 point are not the contract's
VERDICT = "verdict"  # the recorded verdict does not re-derive
DERIVED = "derived"  # a derived value (estimate, interval, p-value, reasons) does not re-derive
VERDICT_MD = "verdict_md"  # verdict.md is not the rendering of the evidence
TUNING = "tuning"
REPLAY = "replay"  # a replayed contract does not reproduce
# Around both: the claims history, the code, the audit.
HISTORY = "history"  # runs/INDEX.jsonl does not vouch for the evidence
STALE = "stale"  # the code changed since the evidence (a problem only with --strict-code)
AUDIT = "audit"  # a re-run of a recorded run did not reproduce it
# an audited run stopped before its end: the audit's time could not finish it (a failure only
# with `gates verify --audit-strict`)
UNAUDITED = "unaudited"
# a replay or audit that did not reproduce runs computed on another machine's CPU kernels or torch
# (gates.verify._audit.other_machine): rounding or a changed record, no re-run here can tell which;
# reported, not lost (a failure only with `gates verify --audit-strict`)
UNCONFIRMED = "unconfirmed"
# a claim whose conditions read machine metrics (wall-clock speed, memory: `Study.machine_metrics`):
# no replay or audit re-checks those on another machine; reported, never a failure
MACHINE_BOUND = "machine_bound"
# a claim on the study of a withdrawn one, saying nearly the same, that does not declare it supersedes
# it (withdraw, then re-register an easier version unlinked): reported, not lost, until it declares
UNLINKED_SUCCESSOR = "unlinked_successor"
# the claim family its evidence records (earlier versions, the alpha each spent, its own level) is not
# what the record of its earlier versions gives (gates.record.family_of)
FAMILY = "family"
# codes that stop the files phase before the contract's hash is compared
BEFORE_HASH = {
    EVIDENCE_UNREADABLE,
    EVIDENCE_FOREIGN,
    EVIDENCE_MISSING,
    CONTRACT_AMBIGUOUS,
    CONTRACT_MISSING,
    CONTRACT_UNLOADABLE,
    CONTRACT_ID_CHANGED,
}


@dataclass
class ClaimCheck:
    contract_id: str
    status: (
        str  # "ok" | "lost" | "pending" | "broken" (a contract that does not check) | "withdrawn"
    )
    verdict: str | None = None
    created_at: str | None = None
    problems: list[Problem] = field(default_factory=list)
    replayed: bool = False
    hash_ok: bool | None = (
        None  # the contract's sha256 against the recorded one; None: not compared
    )
    rederived: bool = False  # the re-derive phase ran (`gates verify`, `gates status --full`)
    # the claims history and the code, filled in by `claims` (gates.record._history,
    # gates.record._provenance, gates.verify._audit)
    withdrawn: bool = (
        False  # the index's latest entry for this id is a withdrawal (status "withdrawn")
    )
    withdrawal: str | None = None  # its reason and time
    supersedes: str | None = None  # the id this contract replaces
    family: str | None = (
        None  # its claim family as its evidence records it (gates.record.describe_family)
    )
    superseded_by: list[str] = field(
        default_factory=list
    )  # ids of the contracts that replace this one
    stale: bool = False  # the code the evidence was computed with has changed since
    stale_files: list[str] = field(
        default_factory=list
    )  # which files ("unknown files" when not nameable)
    stale_note: str = ""
    # the latest certification (`gates certify`): when, which runs were re-run, under which code, why
    certified: str | None = None
    rule_flags: list[str] = field(default_factory=list)  # rules the recorded contract predates
    audited: list[str] = field(
        default_factory=list
    )  # runs re-run by a spot-check audit, with their outcome
    attempts: int = 0  # attempts at this claim in the claims history (gates.record.claim_attempts)
    earlier: list[str] = field(
        default_factory=list
    )  # each earlier attempt in a line ("attempt 1 invalid (...)")
    shared_runs: dict[str, list[str]] = field(
        default_factory=dict
    )  # other claim -> runs it ran too (gates.record._siblings)
    regime_left: RegimeLeft | None = None  # a superseded sibling left this claim's regime

    def add(self, code: str, message: str) -> None:
        self.problems.append(Problem(code, message))

    def lose(self, code: str, messages: list[str]) -> None:
        """Add problems under one code; any problem loses the claim."""
        for message in messages:
            self.add(code, message)
        if messages:
            self.status = "lost"

    @property
    def codes(self) -> list[str]:
        return [p.code for p in self.problems]

    def as_dict(self) -> dict:
        return self.__dict__.copy()
