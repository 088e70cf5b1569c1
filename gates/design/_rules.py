"""Design rules: what a contract must get right before any run for its verdict to mean anything.

A verdict can be computed correctly and still test nothing: a bar every arm at chance clears, a
baseline that fails by construction, a comparator handicapped by a setting nobody declared, seeds
picked after a private run. Each rule here refuses a class of such designs at `gates check` (one line
naming the file, line and field). Rules came after some contracts were recorded: a contract without
evidence must follow them (`require_current_rules`), a recorded one keeps loading and
verifying and is flagged wherever it is shown ("recorded under older rules: ...").

`rule_errors(loaded)` runs them all on a loaded contract (`check_rules` on its parts).
"""

from __future__ import annotations

import weakref
from pathlib import Path

from gates.contract import Contract, LoadedContract
from gates.design._arm_rules import _ArmRules
from gates.design._claim_rules import _ClaimRules
from gates.design._metric_rules import _MetricRules
from gates.errors import UserError, UserErrors
from gates.study import Study

# each rule's short name, which ends its messages "(rule: ...)" and names it in flags of recorded contracts
RULES = {
    "roles": "decisions read only test and cost metrics, controls also validation ones",
    "ranges_and_chance": "no bar outside the arm's range or cleared by an arm at chance",
    "scales": "metrics compared on their declared scale and unit",
    "estimands": "each condition estimates what the claim's words name, by a test valid on its metrics",
    "controls": "a positive control asserts its arm works",
    "negative_controls": "a negative control's bar lies between chance and the positive controls' bars",
    "negative_results": "negative results need a working arm",
    "blind_comparators": "no claim to beat an arm blind by construction",
    "non_inferiority": "a non-inferiority margin within the smallest effect of interest and a tenth of the range",
    "compute": "an arm asserted to beat another costs at most twice its parameters and FLOPs",
    "ceilings": "no bar beyond a known ceiling",
    "comparisons": "compared arms differ only in the declared factor",
    "identical_arms": "no two arms with one config",
    "prediction": "conditions follow the predicted direction",
    "falsifiable_point": "supported_if bars at least as strict as the falsifiable point",
    "refutation": "each refutation mirrors a supported_if condition or says what it refutes",
    "futility": "futility rules halt only arms under test",
    "seeds": "seeds are a count",
    "reported": "conditions read metrics the arm reports",
    "tuning": "tuning searches only declared hyperparameters",
    "convergence": "a training study's contract judges convergence",
    "reachable": "conditions can reach significance with the seeds",
}


def rule_errors(loaded: LoadedContract) -> list[UserError]:
    """The design rules this contract breaks, each an error at its file, line and field (computed once
    per loaded contract). Rules added after a contract was recorded may flag it: a contract without
    evidence must break none (`require_current_rules`); a recorded one keeps loading and is flagged
    wherever it is shown (`rule_flags`)."""
    if loaded not in _REVIEWED:
        _REVIEWED[loaded] = check_rules(
            loaded.contract, loaded.study, loaded.arm_configs, loaded.error
        )
    return _REVIEWED[loaded]


def rule_flags(loaded: LoadedContract) -> list[str]:
    """`rule_errors` as lines ("field: message (rule: name)"), as evidence records them."""
    return [f"{e.field}: {e.message}" if e.field else e.message for e in rule_errors(loaded)]


def require_current_rules(loaded: LoadedContract, runs_root: Path) -> None:
    """Refuse a contract that breaks a rule, unless its evidence was recorded before the rule."""
    errors = rule_errors(loaded)
    if errors and not loaded.recorded_in(runs_root):
        raise UserErrors(errors)


_REVIEWED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def check_rules(contract: Contract, study: Study, arm_configs: dict, err) -> list[UserError]:
    """Every design rule's errors for this contract (empty when it follows them all)."""
    rules = _Rules(contract, study, arm_configs, err)
    for name, rule in RULES.items():
        rules.current = rule
        getattr(rules, name)()
    return rules.errors


class _Rules(_MetricRules, _ArmRules, _ClaimRules):
    """Every rule, each a method named as in RULES, by group: what conditions assert on metrics
    (gates/design/_metric_rules.py), what they assert of arms (gates/design/_arm_rules.py), the claim
    and its plan (gates/design/_claim_rules.py), on what the contract and study give
    (gates/design/_rule_base.py)."""
