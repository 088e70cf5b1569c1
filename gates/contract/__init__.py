"""The hypothesis contract: its schema, loading and hashing.

`load_contract(path)` validates a YAML contract against `Contract` (pydantic, frozen) and the study's
arm configs, and returns a `LoadedContract` with its sha256; every error names file, line and field.
`gates new`'s skeleton (`write`, `placeholders`) and the capped YAML reader live here too.

Private modules: `_schema` (the contract's sections and `Contract`), `_conditions` (the decision: its
conditions and controls), `_tuning` (the tuning section), `_bounds` (the strict base model, bounds,
seeds, canonical JSON), `_load` (loading and hashing), `_references` (what a contract names exists),
`_errors` (validation errors in the contract's words), `_yaml` (safe, capped YAML with line numbers),
`_template` (the `gates new` skeleton).
"""

from typing import TYPE_CHECKING

from gates._face import lazy_face

# what type checkers and editors resolve; at run time each name loads on first use
if TYPE_CHECKING:
    from gates.contract._bounds import (
        MIN_VERDICT_SEEDS,
        PILOT_SEED_BASE,
        SLUG,
        canonical_json,
        is_contiguous,
    )
    from gates.contract._conditions import (
        CeilingRef,
        Compare,
        Control,
        Decision,
        Threshold,
        Trend,
        arms_under_test,
        condition_terms,
        metric_locs,
    )
    from gates.contract._load import (
        MAX_CONTRACT_BYTES,
        LoadedContract,
        load_contract,
        load_contract_cached,
    )
    from gates.contract._schema import (
        Contract,
        Convergence,
        FutilityRule,
        Replay,
        Sequential,
        StopRules,
    )
    from gates.contract._template import placeholders, require_filled, write
    from gates.contract._tuning import SpaceParam
    from gates.contract._yaml import load_yaml, read_capped

# public name -> its private module, imported on first use
_FACE = {
    "CeilingRef": "_conditions",
    "Compare": "_conditions",
    "Contract": "_schema",
    "Control": "_conditions",
    "Convergence": "_schema",
    "Decision": "_conditions",
    "FutilityRule": "_schema",
    "LoadedContract": "_load",
    "MAX_CONTRACT_BYTES": "_load",
    "MIN_VERDICT_SEEDS": "_bounds",
    "PILOT_SEED_BASE": "_bounds",
    "Replay": "_schema",
    "SLUG": "_bounds",
    "Sequential": "_schema",
    "SpaceParam": "_tuning",
    "StopRules": "_schema",
    "Threshold": "_conditions",
    "Trend": "_conditions",
    "arms_under_test": "_conditions",
    "canonical_json": "_bounds",
    "condition_terms": "_conditions",
    "is_contiguous": "_bounds",
    "load_contract": "_load",
    "load_contract_cached": "_load",
    "load_yaml": "_yaml",
    "metric_locs": "_conditions",
    "placeholders": "_template",
    "read_capped": "_yaml",
    "require_filled": "_template",
    "write": "_template",
}
__all__ = sorted(_FACE)
__getattr__, __dir__ = lazy_face(__name__, _FACE)
