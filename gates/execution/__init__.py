"""Execution: a contract's plan of jobs, one driver, several backends.

`run_plan` runs a contract (preflight, tuning, arm x seed runs look by look, the verdict, evidence)
with its jobs in this process, in N local processes (`jobs=N`) or as Ray tasks (`executor="ray"`);
`execute`, `run_contract`, `run_processes` and `run_ray` are its former names, kept as thin wrappers.
The stop rules (`StopRuleEngine`) halt hopeless runs as the reporter hears their metrics.

Private modules: `_executor`, `_tasks` (the driver), `_jobs` (one job), `_processes`, `_ray`, `_plan`,
`_runner`, `_tuning`, `_stop_rules`, `_reporter`, `_preflight`, `_check`, `_locks`, `_allocator`.
"""

from gates._face import lazy_face

# public name -> (private module, its name there), imported on first use
_FACE = {
    "PlatformReporter": ("_reporter", "PlatformReporter"),
    "ProcessBackend": ("_processes", "ProcessBackend"),
    "RayJobError": ("_ray", "RayJobError"),
    "TaskError": ("_tasks", "TaskError"),
    "StopRuleEngine": ("_stop_rules", "StopRuleEngine"),
    "StopRulePruner": ("_tuning", "StopRulePruner"),
    "StudyInterfaceError": ("_runner", "StudyInterfaceError"),
    "TrialRules": ("_tuning", "TrialRules"),
    "admit": ("_check", "admit"),
    "check_contract": ("_check", "check_contract"),
    "check_existing_evidence": ("_runner", "check_existing_evidence"),
    "contract_errors": ("_check", "contract_errors"),
    "contract_lock": ("_locks", "contract_lock"),
    "convergence": ("_stop_rules", "convergence"),
    "default_storage": ("_tuning", "default_storage"),
    "distributions": ("_tuning", "distributions"),
    "execute": ("_executor", "execute"),
    "import_ray": ("_ray", "import_ray"),
    "is_converged": ("_stop_rules", "is_converged"),
    "job_threads": ("_processes", "job_threads"),
    "load_checked": ("_check", "load_checked"),
    "open_study": ("_tuning", "open_study"),
    "preflight": ("_preflight", "preflight"),
    "rederive": ("_runner", "rederive"),
    "require_family": ("_check", "require_family"),
    "require_in_contracts": ("_check", "require_in_contracts"),
    "retain_freed_memory": ("_allocator", "retain_freed_memory"),
    "returned_metrics": ("_runner", "returned_metrics"),
    "run_contract": ("_executor", "run_contract"),
    "run_pilot": ("_pilot", "run_pilot"),
    "run_plan": ("_executor", "run_plan"),
    "EXECUTORS": ("_executor", "EXECUTORS"),
    "pilot_seeds": ("_pilot", "pilot_seeds"),
    "run_processes": ("_executor", "run_processes"),
    "run_ray": ("_executor", "run_ray"),
    "starting_local_instance": ("_ray", "starting_local_instance"),
    "run_tuning_trial": ("_tuning", "run_tuning_trial"),
    "threads_per_job": ("_processes", "threads_per_job"),
    "skipped_record": ("_runner", "skipped_record"),
    "tune": ("_tuning", "tune"),
    "tuned_config": ("_tuning", "tuned_config"),
}
__all__ = sorted(_FACE)
__getattr__, __dir__ = lazy_face(__name__, _FACE)
