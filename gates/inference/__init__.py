"""The verdict engine: statistics from per-seed metrics to a verdict.

`decide` judges a decision and its controls over a fixed set of seeds; `judge_sequential` look by
look with alpha spending; `judge_claim` is what every caller (a run, verify, rederive) goes through.
Nothing here trains, tracks or writes: the input is the runs as records (`RunRecord`, what
evidence.json stores), converted once by the caller.

The verdict it reaches, its conditions and its other parts are entities (gates.entities: `Verdict`,
`ConditionRecord`, `HaltRecord`, `LostValueRecord`, `NotRunRecord`, `BeyondCeilingRecord`,
`LookRecord`), built here and read by attribute; a condition's ceiling is the contract's `CeilingRef`.

Private modules: `_verdict` (`decide`: each condition, the families, the verdict), `_effects` (a
condition as effects: estimand, scale, test), `_statistics` (the tests, intervals, seeds needed),
`_results` (the engine's version, a verdict's signature and wording), `_validity` (lost values, arms
not run as designed, ceilings), `_reachability` (whether the seeds can reach a verdict),
`_sequential` (group-sequential looks), `_judging` (a contract's claim: fixed or sequential,
ceilings, tuning edges).
"""

from typing import TYPE_CHECKING

from gates._face import lazy_face

# what type checkers and editors resolve; at run time each name loads on first use
if TYPE_CHECKING:
    from gates.inference._effects import ESTIMANDS, condition_estimand, log_able
    from gates.inference._judging import claim_inputs, judge, judge_claim, tuning_edges
    from gates.inference._reachability import estimand_notes, supportable, unreachable
    from gates.inference._results import ENGINE_VERSION
    from gates.inference._sequential import (
        judge_sequential,
        next_look,
        pocock,
        spent,
        stopping_seeds,
    )
    from gates.inference._statistics import BOOTSTRAP_RESAMPLES, holm
    from gates.inference._verdict import decide, predictions

# public name -> its private module, imported on first use
_FACE = {
    "BOOTSTRAP_RESAMPLES": "_statistics",
    "ENGINE_VERSION": "_results",
    "ESTIMANDS": "_effects",
    "claim_inputs": "_judging",
    "condition_estimand": "_effects",
    "decide": "_verdict",
    "estimand_notes": "_reachability",
    "holm": "_statistics",
    "judge": "_judging",
    "judge_claim": "_judging",
    "judge_sequential": "_sequential",
    "log_able": "_effects",
    "next_look": "_sequential",
    "pocock": "_sequential",
    "predictions": "_verdict",
    "spent": "_sequential",
    "stopping_seeds": "_sequential",
    "supportable": "_reachability",
    "tuning_edges": "_judging",
    "unreachable": "_reachability",
}
__all__ = sorted(_FACE)
__getattr__, __dir__ = lazy_face(__name__, _FACE)
