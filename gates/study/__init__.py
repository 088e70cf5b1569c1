"""The API a study implements and the platform's lookup of studies.

A study subclasses `Study` (its `Config`, `metrics`, `run(config, seed, reporter)`) and talks to the
platform only through the `Reporter` it is handed, as an Optuna objective talks through its trial.
Studies are registered under the entry-point group `gates.studies` and found by name
(`get_study`), never by a path named in a contract.

Private modules: `_api` (Study, Metric, Reporter, budgets and devices), `_registry` (entry points).
"""

from typing import TYPE_CHECKING

from gates._face import lazy_face

# what type checkers and editors resolve; at run time each name loads on first use
if TYPE_CHECKING:
    from gates.study._api import (
        CONTROL_ROLES,
        DECISION_ROLES,
        ROLES,
        SCALES,
        Budget,
        Ceiling,
        Device,
        DeviceConfig,
        Direction,
        Halt,
        Metric,
        NullReporter,
        Reporter,
        Role,
        Scale,
        Study,
        StudyConfig,
        cpu_threads,
        device_environment,
        device_unavailable,
        nonnegative,
        positive,
        proportion,
        recorded_threads,
        resolve_device,
    )
    from gates.study._registry import (
        StudyError,
        get_study,
        refresh,
        study_entries,
        study_module,
        study_names,
    )

# public name -> its private module, imported on first use
_FACE = {
    "Budget": "_api",
    "CONTROL_ROLES": "_api",
    "Ceiling": "_api",
    "DECISION_ROLES": "_api",
    "Device": "_api",
    "DeviceConfig": "_api",
    "Direction": "_api",
    "Halt": "_api",
    "Metric": "_api",
    "NullReporter": "_api",
    "ROLES": "_api",
    "Reporter": "_api",
    "Role": "_api",
    "SCALES": "_api",
    "Scale": "_api",
    "Study": "_api",
    "StudyConfig": "_api",
    "StudyError": "_registry",
    "cpu_threads": "_api",
    "device_environment": "_api",
    "device_unavailable": "_api",
    "get_study": "_registry",
    "nonnegative": "_api",
    "positive": "_api",
    "proportion": "_api",
    "recorded_threads": "_api",
    "refresh": "_registry",
    "resolve_device": "_api",
    "study_entries": "_registry",
    "study_module": "_registry",
    "study_names": "_registry",
}
__all__ = sorted(_FACE)
__getattr__, __dir__ = lazy_face(__name__, _FACE)
