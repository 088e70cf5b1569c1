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

from gates._face import lazy_face

# public name -> (private module, its name there), imported on first use
_FACE = {
    "WORKFLOW_PATH": ("_workflow", "WORKFLOW_PATH"),
    "workflow": ("_workflow", "workflow"),
    "workflow_commands": ("_workflow", "workflow_commands"),
    "AUDIT": ("_claim", "AUDIT"),
    "CONTRACT_AMBIGUOUS": ("_claim", "CONTRACT_AMBIGUOUS"),
    "CONTRACT_EDITED": ("_claim", "CONTRACT_EDITED"),
    "CONTRACT_ID_CHANGED": ("_claim", "CONTRACT_ID_CHANGED"),
    "CONTRACT_INVALID": ("_claim", "CONTRACT_INVALID"),
    "CONTRACT_MISSING": ("_claim", "CONTRACT_MISSING"),
    "CONTRACT_UNLOADABLE": ("_claim", "CONTRACT_UNLOADABLE"),
    "CONVERGENCE": ("_claim", "CONVERGENCE"),
    "Candidate": ("_audit", "Candidate"),
    "Certification": ("_certify", "Certification"),
    "ClaimCheck": ("_claim", "ClaimCheck"),
    "DERIVED": ("_claim", "DERIVED"),
    "EVIDENCE_FOREIGN": ("_claim", "EVIDENCE_FOREIGN"),
    "EVIDENCE_MISSING": ("_claim", "EVIDENCE_MISSING"),
    "EVIDENCE_UNREADABLE": ("_claim", "EVIDENCE_UNREADABLE"),
    "HISTORY": ("_claim", "HISTORY"),
    "MACHINE_BOUND": ("_claim", "MACHINE_BOUND"),
    "MIN_LEFT_S": ("_audit", "MIN_LEFT_S"),
    "NOT_RUN": ("_claim", "NOT_RUN"),
    "Problem": ("_claim", "Problem"),
    "REPLAY": ("_claim", "REPLAY"),
    "SAFETY_FACTOR": ("_audit", "SAFETY_FACTOR"),
    "RUNS": ("_claim", "RUNS"),
    "SETTINGS": ("_claim", "SETTINGS"),
    "STALE": ("_claim", "STALE"),
    "TUNING": ("_claim", "TUNING"),
    "UNAUDITED": ("_claim", "UNAUDITED"),
    "UNLINKED_SUCCESSOR": ("_claim", "UNLINKED_SUCCESSOR"),
    "VERDICT": ("_claim", "VERDICT"),
    "VERDICT_MD": ("_claim", "VERDICT_MD"),
    "certify": ("_certify", "certify"),
    "check_claim": ("_verify", "check_claim"),
    "choose": ("_audit", "choose"),
    "claims": ("_claims", "claims"),
    "fresh_seed": ("_audit", "fresh_seed"),
    "estimate": ("_audit", "estimate"),
    "find_contracts": ("_claims", "find_contracts"),
    "machine_bound": ("_audit", "machine_bound"),
    "rerun": ("_audit", "rerun"),
    "verify": ("_verify", "verify"),
}
__all__ = sorted(_FACE)
__getattr__, __dir__ = lazy_face(__name__, _FACE)
