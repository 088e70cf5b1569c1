"""Verification: does every recorded claim still hold its evidence?

`claims` lists every claim checked as far as the files go (evidence, contract hash, claims history,
staleness: what `gates status` and the dashboard show); `verify` adds the re-derivation of every
verdict (`check_claim` for one), re-runs the contracts marked for replay and spot-checks recorded
runs by re-running them (the audit); `certify` re-runs a claim's runs under today's code.

Private modules: `_claim` (a claim's check and its problems), `_claims` (every claim, the files
phase), `_verify` (the re-derive phase), `_audit` (spot checks by re-running runs), `_certify`
(re-running a claim's runs to check it against today's code), `_replay` (a replay and `gates check`'s
refusals: the one module that asks gates.execution), `_workflow` (the CI workflow `gates ci init`
writes into a researcher's project).
"""

from typing import TYPE_CHECKING

from gates._face import lazy_face

# what type checkers and editors resolve; at run time each name loads on first use
if TYPE_CHECKING:
    from gates.verify._audit import MIN_LEFT_S, SAFETY_FACTOR, choose, estimate, machine_bound
    from gates.verify._certify import certify
    from gates.verify._claim import (
        AUDIT,
        CONTRACT_AMBIGUOUS,
        CONTRACT_EDITED,
        CONTRACT_ID_CHANGED,
        CONTRACT_INVALID,
        CONTRACT_MISSING,
        CONTRACT_UNLOADABLE,
        CONVERGENCE,
        DERIVED,
        EVIDENCE_FOREIGN,
        EVIDENCE_MISSING,
        EVIDENCE_UNREADABLE,
        HISTORY,
        MACHINE_BOUND,
        NOT_RUN,
        REPLAY,
        RUNS,
        SETTINGS,
        STALE,
        TUNING,
        UNAUDITED,
        UNCONFIRMED,
        UNLINKED_SUCCESSOR,
        VERDICT,
        VERDICT_MD,
        ClaimCheck,
        Problem,
    )
    from gates.verify._claims import claims, find_contracts
    from gates.verify._verify import check_claim, verify
    from gates.verify._workflow import WORKFLOW_PATH, workflow

# public name -> its private module, imported on first use
_FACE = {
    "AUDIT": "_claim",
    "CONTRACT_AMBIGUOUS": "_claim",
    "CONTRACT_EDITED": "_claim",
    "CONTRACT_ID_CHANGED": "_claim",
    "CONTRACT_INVALID": "_claim",
    "CONTRACT_MISSING": "_claim",
    "CONTRACT_UNLOADABLE": "_claim",
    "CONVERGENCE": "_claim",
    "ClaimCheck": "_claim",
    "DERIVED": "_claim",
    "EVIDENCE_FOREIGN": "_claim",
    "EVIDENCE_MISSING": "_claim",
    "EVIDENCE_UNREADABLE": "_claim",
    "HISTORY": "_claim",
    "MACHINE_BOUND": "_claim",
    "MIN_LEFT_S": "_audit",
    "NOT_RUN": "_claim",
    "Problem": "_claim",
    "REPLAY": "_claim",
    "RUNS": "_claim",
    "SAFETY_FACTOR": "_audit",
    "SETTINGS": "_claim",
    "STALE": "_claim",
    "TUNING": "_claim",
    "UNAUDITED": "_claim",
    "UNCONFIRMED": "_claim",
    "UNLINKED_SUCCESSOR": "_claim",
    "VERDICT": "_claim",
    "VERDICT_MD": "_claim",
    "WORKFLOW_PATH": "_workflow",
    "certify": "_certify",
    "check_claim": "_verify",
    "choose": "_audit",
    "claims": "_claims",
    "estimate": "_audit",
    "find_contracts": "_claims",
    "machine_bound": "_audit",
    "verify": "_verify",
    "workflow": "_workflow",
}
__all__ = sorted(_FACE)
__getattr__, __dir__ = lazy_face(__name__, _FACE)
