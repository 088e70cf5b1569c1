"""The hypothesis contract: its schema, loading and hashing.

`load_contract(path)` validates a YAML contract against `Contract` (pydantic, frozen) and the study's
arm configs, and returns a `LoadedContract` with its sha256; every error names file, line and field.
`gates new`'s skeleton (`write`, `placeholders`) and the capped YAML reader live here too.

Private modules: `_schema` (models, loading, hashing, reference checks), `_yaml` (safe, capped YAML
with line numbers), `_template` (the `gates new` skeleton).
"""

from typing import TYPE_CHECKING

from gates._face import lazy_face

# what type checkers and editors resolve; at run time each name loads on first use
if TYPE_CHECKING:
    from gates.contract._schema import (
        MAX_CONTRACT_BYTES,
        MIN_VERDICT_SEEDS,
        PILOT_SEED_BASE,
        SLUG,
        Compare,
        Contract,
        Control,
        Convergence,
        Decision,
        FutilityRule,
        LoadedContract,
        Replay,
        Sequential,
        SpaceParam,
        StopRules,
        Threshold,
        Trend,
        arms_under_test,
        canonical_json,
        condition_terms,
        is_contiguous,
        load_contract,
        load_contract_cached,
        metric_locs,
    )
    from gates.contract._template import placeholders, require_filled, write
    from gates.contract._yaml import load_yaml, read_capped

# public name -> its private module, imported on first use
_FACE = {
    "Compare": "_schema",
    "Contract": "_schema",
    "Control": "_schema",
    "Convergence": "_schema",
    "Decision": "_schema",
    "FutilityRule": "_schema",
    "LoadedContract": "_schema",
    "MAX_CONTRACT_BYTES": "_schema",
    "MIN_VERDICT_SEEDS": "_schema",
    "PILOT_SEED_BASE": "_schema",
    "Replay": "_schema",
    "SLUG": "_schema",
    "Sequential": "_schema",
    "SpaceParam": "_schema",
    "StopRules": "_schema",
    "Threshold": "_schema",
    "Trend": "_schema",
    "arms_under_test": "_schema",
    "canonical_json": "_schema",
    "condition_terms": "_schema",
    "is_contiguous": "_schema",
    "load_contract": "_schema",
    "load_contract_cached": "_schema",
    "load_yaml": "_yaml",
    "metric_locs": "_schema",
    "placeholders": "_template",
    "read_capped": "_yaml",
    "require_filled": "_template",
    "write": "_template",
}
__all__ = sorted(_FACE)
__getattr__, __dir__ = lazy_face(__name__, _FACE)
