"""Execution: a contract's plan of jobs run in one process or by workers on a shared queue.

`execute` runs a contract (preflight, tuning, arm x seed runs look by look, the verdict, evidence);
`run_distributed` and `Worker` do the same through an Optuna storage, `run_ray` as Ray tasks,
`run_processes` in N local processes; the stop rules (`StopRuleEngine`) halt hopeless runs as the
reporter hears their metrics.

Private modules: `_plan`, `_runner`, `_distributed`, `_tasks`, `_ray`, `_processes`, `_tuning`,
`_stop_rules`, `_reporter`, `_preflight`, `_check`, `_locks`, `_allocator`.
"""

from gates._face import lazy_face

# public name -> (private module, its name there), imported on first use
_FACE = {
    "DeadJobs": ("_distributed", "DeadJobs"),
    "PlatformReporter": ("_reporter", "PlatformReporter"),
    "ProcessBackend": ("_processes", "ProcessBackend"),
    "RayJobError": ("_ray", "RayJobError"),
    "TaskError": ("_tasks", "TaskError"),
    "StopRuleEngine": ("_stop_rules", "StopRuleEngine"),
    "StopRulePruner": ("_tuning", "StopRulePruner"),
    "StudyInterfaceError": ("_runner", "StudyInterfaceError"),
    "TrialRules": ("_tuning", "TrialRules"),
    "Worker": ("_distributed", "Worker"),
    "admit": ("_check", "admit"),
    "check_contract": ("_check", "check_contract"),
    "check_existing_evidence": ("_runner", "check_existing_evidence"),
    "contract_errors": ("_check", "contract_errors"),
    "contract_lock": ("_locks", "contract_lock"),
    "convergence": ("_stop_rules", "convergence"),
    "default_storage": ("_tuning", "default_storage"),
    "describe_enqueued": ("_distributed", "describe"),
    "distributions": ("_tuning", "distributions"),
    "execute": ("_runner", "execute"),
    "grace_seconds": ("_distributed", "grace_seconds"),
    "import_ray": ("_ray", "import_ray"),
    "is_converged": ("_stop_rules", "is_converged"),
    "job_threads": ("_processes", "job_threads"),
    "load_checked": ("_check", "load_checked"),
    "open_storage": ("_distributed", "open_storage"),
    "open_study": ("_tuning", "open_study"),
    "preflight": ("_preflight", "preflight"),
    "rederive": ("_runner", "rederive"),
    "require_family": ("_check", "require_family"),
    "require_in_contracts": ("_check", "require_in_contracts"),
    "retain_freed_memory": ("_allocator", "retain_freed_memory"),
    "returned_metrics": ("_runner", "returned_metrics"),
    "run_contract": ("_runner", "run_contract"),
    "run_distributed": ("_distributed", "run_distributed"),
    "run_pilot": ("_pilot", "run_pilot"),
    "pilot_seeds": ("_pilot", "pilot_seeds"),
    "run_processes": ("_processes", "run_processes"),
    "run_ray": ("_ray", "run_ray"),
    "starting_local_instance": ("_ray", "starting_local_instance"),
    "run_tuning_trial": ("_tuning", "run_tuning_trial"),
    "threads_per_job": ("_processes", "threads_per_job"),
    "skipped_record": ("_runner", "skipped_record"),
    "tune": ("_tuning", "tune"),
    "tuned_config": ("_tuning", "tuned_config"),
}
__all__ = sorted(_FACE)
__getattr__, __dir__ = lazy_face(__name__, _FACE)
