"""The verdict engine: statistics from per-seed metrics to a verdict.

`decide` judges a decision and its controls over a fixed set of seeds; `judge_sequential` look by
look with alpha spending; `judge_claim` is what every caller (a run, verify, rederive) goes through.
Nothing here trains, tracks or writes: the input is the runs as evidence.json stores them.

Private modules: `_verdict` (tests, intervals, families, reasons), `_sequential` (group-sequential
looks), `_judging` (a contract's claim: fixed or sequential, ceilings, tuning edges).
"""

from typing import TYPE_CHECKING

from gates._face import lazy_face

# what type checkers and editors resolve; at run time each name loads on first use
if TYPE_CHECKING:
    from gates.inference._judging import claim_inputs, judge, judge_claim, tuning_edges
    from gates.inference._sequential import (
        judge_sequential,
        next_look,
        obrien_fleming,
        pocock,
        spent,
        stopping_seeds,
    )
    from gates.inference._verdict import (
        BOOTSTRAP_RESAMPLES,
        ENGINE_VERSION,
        ESTIMANDS,
        Verdict,
        condition_estimand,
        condition_test,
        decide,
        estimand_notes,
        holm,
        json_safe,
        log_able,
        predictions,
        supportable,
        unreachable,
    )

# public name -> its private module, imported on first use
_FACE = {
    "BOOTSTRAP_RESAMPLES": "_verdict",
    "ENGINE_VERSION": "_verdict",
    "ESTIMANDS": "_verdict",
    "Verdict": "_verdict",
    "claim_inputs": "_judging",
    "condition_estimand": "_verdict",
    "condition_test": "_verdict",
    "decide": "_verdict",
    "estimand_notes": "_verdict",
    "holm": "_verdict",
    "json_safe": "_verdict",
    "judge": "_judging",
    "judge_claim": "_judging",
    "judge_sequential": "_sequential",
    "log_able": "_verdict",
    "next_look": "_sequential",
    "obrien_fleming": "_sequential",
    "pocock": "_sequential",
    "predictions": "_verdict",
    "spent": "_sequential",
    "stopping_seeds": "_sequential",
    "supportable": "_verdict",
    "tuning_edges": "_judging",
    "unreachable": "_verdict",
}
__all__ = sorted(_FACE)
__getattr__, __dir__ = lazy_face(__name__, _FACE)
