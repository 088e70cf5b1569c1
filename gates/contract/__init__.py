"""The hypothesis contract: its schema, loading and hashing.

`load_contract(path)` validates a YAML contract against `Contract` (pydantic, frozen) and the study's
arm configs, and returns a `LoadedContract` with its sha256; every error names file, line and field.
`gates new`'s skeleton (`write`, `placeholders`) and the capped YAML reader live here too.

Private modules: `_schema` (models, loading, hashing, reference checks), `_yaml` (safe, capped YAML
with line numbers), `_template` (the `gates new` skeleton).
"""

from gates._face import lazy_face

# public name -> (private module, its name there), imported on first use
_FACE = {
    "Compare": ("_schema", "Compare"),
    "Contract": ("_schema", "Contract"),
    "Control": ("_schema", "Control"),
    "Convergence": ("_schema", "Convergence"),
    "Decision": ("_schema", "Decision"),
    "FutilityRule": ("_schema", "FutilityRule"),
    "LoadedContract": ("_schema", "LoadedContract"),
    "MAX_CONTRACT_BYTES": ("_schema", "MAX_CONTRACT_BYTES"),
    "MIN_VERDICT_SEEDS": ("_schema", "MIN_VERDICT_SEEDS"),
    "PILOT_SEED_BASE": ("_schema", "PILOT_SEED_BASE"),
    "Replay": ("_schema", "Replay"),
    "SLUG": ("_schema", "SLUG"),
    "Sequential": ("_schema", "Sequential"),
    "SpaceParam": ("_schema", "SpaceParam"),
    "StopRules": ("_schema", "StopRules"),
    "Threshold": ("_schema", "Threshold"),
    "Trend": ("_schema", "Trend"),
    "arms_under_test": ("_schema", "arms_under_test"),
    "canonical_json": ("_schema", "canonical_json"),
    "condition_terms": ("_schema", "condition_terms"),
    "is_contiguous": ("_schema", "is_contiguous"),
    "load_contract": ("_schema", "load_contract"),
    "load_contract_cached": ("_schema", "load_contract_cached"),
    "load_yaml": ("_yaml", "load_yaml"),
    "metric_locs": ("_schema", "metric_locs"),
    "placeholders": ("_template", "placeholders"),
    "read_capped": ("_yaml", "read_capped"),
    "require_filled": ("_template", "require_filled"),
    "write": ("_template", "write"),
}
__all__ = sorted(_FACE)
__getattr__, __dir__ = lazy_face(__name__, _FACE)
