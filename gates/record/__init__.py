"""The record: MLflow tracking, evidence, the claims history and provenance.

What a run leaves behind and how it is read back: the MLflow store (`Tracker`, `open_client`),
`runs/<id>/evidence.json` and verdict.md (`write_evidence`, `read_evidence`, `render_report`),
evidence read as a frozen record (`Evidence`, with its `RunRecord`s and `ConditionRecord`s, in
format `EVIDENCE_FORMAT`) or as plain JSON (`raw_evidence`), the hash-chained claims history
`runs/INDEX.jsonl` (`record_entry`, `check_history`, `claim_attempts`), the code fingerprint and
staleness (`current_provenance`, `staleness`), attempts at a claim and claims that share runs or a
regime (`compare_reproduction`, `annotate_siblings`).

Private modules: `_tracking`, `_store`, `_evidence`, `_report`, `_history`, `_provenance`,
`_attempts`, `_siblings`, `_plots`, `_files`.
"""

from gates._face import lazy_face

# public name -> (private module, its name there), imported on first use
_FACE = {
    "AttemptRecord": ("_evidence", "AttemptRecord"),
    "ConditionRecord": ("_evidence", "ConditionRecord"),
    "EVIDENCE": ("_evidence", "EVIDENCE"),
    "EVIDENCE_FORMAT": ("_evidence", "FORMAT"),
    "Evidence": ("_evidence", "Evidence"),
    "GENESIS": ("_history", "GENESIS"),
    "INDEX": ("_history", "INDEX"),
    "MLflowMetricSink": ("_tracking", "MLflowMetricSink"),
    "PROJECT_ROOT": ("_provenance", "PROJECT_ROOT"),
    "Provenance": ("_provenance", "Provenance"),
    "RECORD": ("_attempts", "RECORD"),
    "REPORT": ("_evidence", "REPORT"),
    "REPRODUCE": ("_attempts", "REPRODUCE"),
    "Recording": ("_attempts", "Recording"),
    "RegimeLeft": ("_siblings", "RegimeLeft"),
    "Reproduction": ("_attempts", "Reproduction"),
    "RunRecord": ("_evidence", "RunRecord"),
    "SettingsRecord": ("_evidence", "SettingsRecord"),
    "Staleness": ("_provenance", "Staleness"),
    "Tracker": ("_tracking", "Tracker"),
    "annotate_siblings": ("_siblings", "annotate"),
    "as_evidence": ("_evidence", "as_evidence"),
    "atomic_write_text": ("_evidence", "atomic_write_text"),
    "atomic_writer": ("_evidence", "atomic_writer"),
    "attempt_field": ("_attempts", "attempt_field"),
    "backfill_index": ("_history", "backfill"),
    "certifications": ("_history", "certifications"),
    "check_history": ("_history", "check"),
    "claim_attempts": ("_history", "attempts"),
    "code_files": ("_provenance", "code_files"),
    "code_sha256": ("_provenance", "code_sha256"),
    "compare_reproduction": ("_attempts", "compare"),
    "condition_intervals": ("_plots", "condition_intervals"),
    "current_provenance": ("_provenance", "current"),
    "describe_regime": ("_siblings", "describe_regime"),
    "describe_shared": ("_siblings", "describe_shared"),
    "describe_stale": ("_provenance", "describe_stale"),
    "devices_of": ("_evidence", "devices_of"),
    "evidence_dir": ("_evidence", "evidence_dir"),
    "files_at_commit": ("_provenance", "files_at_commit"),
    "flatten_params": ("_tracking", "flatten"),
    "git": ("_provenance", "git"),
    "index_path": ("_history", "index_path"),
    "is_withdrawn": ("_history", "is_withdrawn"),
    "latest_entries": ("_history", "latest"),
    "learning_curves": ("_plots", "learning_curves"),
    "line_sha256": ("_history", "line_sha256"),
    "link_supersession": ("_history", "link_supersession"),
    "open_client": ("_tracking", "open_client"),
    "plan_recording": ("_attempts", "plan_recording"),
    "plotted_metrics": ("_plots", "plotted_metrics"),
    "raw_evidence": ("_evidence", "raw_evidence"),
    "read_evidence": ("_evidence", "read_evidence"),
    "read_index": ("_history", "read"),
    "record_entry": ("_history", "record"),
    "regime_of": ("_siblings", "regime_of"),
    "render_report": ("_report", "render_report"),
    "resolve_uri": ("_tracking", "resolve_uri"),
    "run_summary": ("_tracking", "run_summary"),
    "sha256_file": ("_history", "sha256_file"),
    "shared_runs": ("_siblings", "shared_runs"),
    "signature": ("_evidence", "signature"),
    "staleness": ("_provenance", "staleness"),
    "study_files": ("_provenance", "study_files"),
    "watched_paths": ("_provenance", "watched_paths"),
    "withdraw_claim": ("_history", "withdraw"),
    "write_evidence": ("_report", "write_evidence"),
    "write_report": ("_report", "write_report"),
}
__all__ = sorted(_FACE)
__getattr__, __dir__ = lazy_face(__name__, _FACE)
