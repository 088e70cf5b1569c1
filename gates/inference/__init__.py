"""The verdict engine: statistics from per-seed metrics to a verdict.

`decide` judges a decision and its controls over a fixed set of seeds; `judge_sequential` look by
look with alpha spending; `judge_claim` is what every caller (a run, verify, rederive) goes through.
Nothing here trains, tracks or writes: the input is the runs as evidence.json stores them.

Private modules: `_verdict` (tests, intervals, families, reasons), `_sequential` (group-sequential
looks), `_judging` (a contract's claim: fixed or sequential, ceilings, tuning edges).
"""

from gates._face import lazy_face

# public name -> (private module, its name there), imported on first use
_FACE = {
    "BOOTSTRAP_RESAMPLES": ("_verdict", "BOOTSTRAP_RESAMPLES"),
    "ENGINE_VERSION": ("_verdict", "ENGINE_VERSION"),
    "Verdict": ("_verdict", "Verdict"),
    "claim_inputs": ("_judging", "claim_inputs"),
    "decide": ("_verdict", "decide"),
    "ESTIMANDS": ("_verdict", "ESTIMANDS"),
    "condition_estimand": ("_verdict", "condition_estimand"),
    "condition_test": ("_verdict", "condition_test"),
    "estimand_notes": ("_verdict", "estimand_notes"),
    "log_able": ("_verdict", "log_able"),
    "holm": ("_verdict", "holm"),
    "json_safe": ("_verdict", "json_safe"),
    "judge": ("_judging", "judge"),
    "judge_claim": ("_judging", "judge_claim"),
    "judge_sequential": ("_sequential", "judge_sequential"),
    "next_look": ("_sequential", "next_look"),
    "obrien_fleming": ("_sequential", "obrien_fleming"),
    "pocock": ("_sequential", "pocock"),
    "predictions": ("_verdict", "predictions"),
    "spent": ("_sequential", "spent"),
    "stopping_seeds": ("_sequential", "stopping_seeds"),
    "supportable": ("_verdict", "supportable"),
    "tuning_edges": ("_judging", "tuning_edges"),
    "unreachable": ("_verdict", "unreachable"),
}
__all__ = sorted(_FACE)
__getattr__, __dir__ = lazy_face(__name__, _FACE)
