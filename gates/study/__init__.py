"""The API a study implements and the platform's lookup of studies.

A study subclasses `Study` (its `Config`, `metrics`, `run(config, seed, reporter)`) and talks to the
platform only through the `Reporter` it is handed, as an Optuna objective talks through its trial.
Studies are registered under the entry-point group `gates.studies` and found by name
(`get_study`), never by a path named in a contract.

Private modules: `_api` (Study, Metric, Reporter, budgets and devices), `_registry` (entry points).
"""

from gates._face import lazy_face

# public name -> (private module, its name there), imported on first use
_FACE = {
    "Budget": ("_api", "Budget"),
    "CONTROL_ROLES": ("_api", "CONTROL_ROLES"),
    "Ceiling": ("_api", "Ceiling"),
    "DECISION_ROLES": ("_api", "DECISION_ROLES"),
    "Device": ("_api", "Device"),
    "DeviceConfig": ("_api", "DeviceConfig"),
    "Direction": ("_api", "Direction"),
    "Halt": ("_api", "Halt"),
    "Metric": ("_api", "Metric"),
    "NullReporter": ("_api", "NullReporter"),
    "ROLES": ("_api", "ROLES"),
    "Reporter": ("_api", "Reporter"),
    "Role": ("_api", "Role"),
    "SCALES": ("_api", "SCALES"),
    "Scale": ("_api", "Scale"),
    "Study": ("_api", "Study"),
    "StudyConfig": ("_api", "StudyConfig"),
    "StudyError": ("_registry", "StudyError"),
    "cpu_threads": ("_api", "cpu_threads"),
    "device_environment": ("_api", "device_environment"),
    "device_unavailable": ("_api", "device_unavailable"),
    "get_study": ("_registry", "get_study"),
    "nonnegative": ("_api", "nonnegative"),
    "positive": ("_api", "positive"),
    "proportion": ("_api", "proportion"),
    "recorded_threads": ("_api", "recorded_threads"),
    "refresh": ("_registry", "refresh"),
    "resolve_device": ("_api", "resolve_device"),
    "study_entries": ("_registry", "study_entries"),
    "study_module": ("_registry", "study_module"),
    "study_names": ("_registry", "study_names"),
}
__all__ = sorted(_FACE)
__getattr__, __dir__ = lazy_face(__name__, _FACE)
