"""Design rules: what a contract must get right before any run for its verdict to mean anything.

`rule_errors(loaded)` applies every rule (each message ends "(rule: name)"); a contract without
evidence must break none (`require_current_rules`), a recorded one is flagged (`rule_flags`). The
rules read the contract and ask the verdict engine what its seeds can reach, so they sit above both.

Private modules: `_rules` (the list of rules and running them), `_metric_rules`, `_arm_rules`,
`_claim_rules` (the rules by group), `_rule_base` (what every rule reads).
"""

from typing import TYPE_CHECKING

from gates._face import lazy_face

# what type checkers and editors resolve; at run time each name loads on first use
if TYPE_CHECKING:
    from gates.design._rules import require_current_rules, rule_flags

# public name -> its private module, imported on first use
_FACE = {
    "require_current_rules": "_rules",
    "rule_flags": "_rules",
}
__all__ = sorted(_FACE)
__getattr__, __dir__ = lazy_face(__name__, _FACE)
