"""Execution: a contract's plan of jobs, one driver, several backends.

`run_plan` runs a contract (preflight, tuning, arm x seed runs look by look, the verdict, evidence)
with its jobs in this process, in N local processes (`jobs=N`) or as Ray tasks (`executor="ray"`):
the one entry point every command, test and benchmark runs a plan through.
The stop rules (`StopRuleEngine`) halt hopeless runs as the reporter hears their metrics.

Private modules: `_executor`, `_tasks` (the driver), `_jobs` (one job), `_job` (a job and its
context's description, as they travel to a task), `_processes`, `_ray`, `_plan`, `_runner` (the
parent run, finish, rederive), `_study_run` (one arm x seed run of the study), `_tuning`,
`_stop_rules`, `_reporter`, `_preflight`, `_check`, `_locks`, `_allocator`.
"""

from typing import TYPE_CHECKING

from gates._face import lazy_face

# what type checkers and editors resolve; at run time each name loads on first use
if TYPE_CHECKING:
    from gates.execution._allocator import retain_freed_memory
    from gates.execution._check import (
        admit,
        check_contract,
        contract_errors,
        load_checked,
        require_in_contracts,
    )
    from gates.execution._executor import EXECUTORS, check_executor, run_plan
    from gates.execution._pilot import run_pilot
    from gates.execution._preflight import preflight
    from gates.execution._processes import ProcessBackend, job_threads, redeliver_interrupts
    from gates.execution._ray import starting_local_instance
    from gates.execution._reporter import PlatformReporter
    from gates.execution._runner import rederive
    from gates.execution._stop_rules import StopRuleEngine, convergence, is_converged
    from gates.execution._tasks import TaskError
    from gates.execution._tuning import (
        StopRulePruner,
        distributions,
        run_tuning_trial,
        tune,
        tuned_config,
    )

# public name -> its private module, imported on first use
_FACE = {
    "EXECUTORS": "_executor",
    "PlatformReporter": "_reporter",
    "ProcessBackend": "_processes",
    "StopRuleEngine": "_stop_rules",
    "StopRulePruner": "_tuning",
    "TaskError": "_tasks",
    "admit": "_check",
    "check_contract": "_check",
    "check_executor": "_executor",
    "contract_errors": "_check",
    "convergence": "_stop_rules",
    "distributions": "_tuning",
    "is_converged": "_stop_rules",
    "job_threads": "_processes",
    "redeliver_interrupts": "_processes",
    "load_checked": "_check",
    "preflight": "_preflight",
    "rederive": "_runner",
    "require_in_contracts": "_check",
    "retain_freed_memory": "_allocator",
    "run_pilot": "_pilot",
    "run_plan": "_executor",
    "run_tuning_trial": "_tuning",
    "starting_local_instance": "_ray",
    "tune": "_tuning",
    "tuned_config": "_tuning",
}
__all__ = sorted(_FACE)
__getattr__, __dir__ = lazy_face(__name__, _FACE)
