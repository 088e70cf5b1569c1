"""The record: MLflow tracking, evidence, the claims history and provenance.

What a run leaves behind and how it is read back: the MLflow store (`Tracker`, `open_client`),
`runs/<id>/evidence.json` and verdict.md (`write_evidence`, `read_evidence`, `render_report`),
evidence read as a frozen record (`Evidence`, holding the run and condition records of
gates.entities, in format `EVIDENCE_FORMAT`), as plain JSON (`raw_evidence`) or leniently, each
field typed and None where malformed (`raw_view`, `EvidenceView`), the hash-chained
claims history `runs/INDEX.jsonl` read as entries (`IndexEntry`, `read_index`) and appended to
(`record_entry`), checked (`check_history`) and read as attempts (`claim_attempts`), the code
fingerprint and staleness (`current_provenance`, `staleness`), attempts at a claim and claims that
share runs or a regime (`compare_reproduction`, `annotate_siblings`).

Private modules: `_tracking`, `_store`, `_evidence`, `_report`, the claims history's (`_index`: the
file and its entries; `_writer`: appending; `_history`: its checks; `_certified`: certifications;
`_attempt_log`: attempts as it records them; `_successors`: designs and supersession),
`_provenance`, `_attempts`, `_siblings`, `_family` (a claim's versions share one alpha), `_plots`,
`_files`, `_view` (evidence read leniently, for the readers that must not fail on a malformed
file), `_conditions` (a claim's conditions as a reviewer reads them: mirrors merged into one row,
what each result means for the claim), `_derive` (the one derivation of a claim's evidence from its
contract and recorded runs, pure: `derive`, what `gates run`, `gates rederive` and `gates verify` all
call).
"""

from typing import TYPE_CHECKING

from gates._face import lazy_face

# what type checkers and editors resolve; at run time each name loads on first use
if TYPE_CHECKING:
    from gates.record._attempt_log import Attempt, claim_attempts
    from gates.record._attempts import (
        RECORD,
        REPRODUCE,
        Recording,
        Reproduction,
        attempt_field,
        compare_reproduction,
        plan_recording,
    )
    from gates.record._certified import (
        CERTIFICATION_IGNORED,
        CERTIFICATION_INVALID,
        certifications,
        check_certifications,
        standing_code,
        within_tolerance,
    )
    from gates.record._conditions import (
        INVALIDATES,
        OTHER_SIDE,
        REFUTES,
        SOUND,
        SUPPORTS,
        UNDETERMINED,
        ConditionBar,
        ConditionRow,
        condition_difference,
        condition_label,
        condition_rows,
        condition_sentence,
        holding_side,
        term_short_names,
        term_values,
    )
    from gates.record._derive import (
        Derivation,
        best_trial,
        derive,
        is_converged,
        run_facts,
        tuned_config,
    )
    from gates.record._evidence import (
        EVIDENCE,
        EVIDENCE_FORMAT,
        REPORT,
        Evidence,
        PilotRecord,
        SettingsRecord,
        as_evidence,
        atomic_write_text,
        evidence_dir,
        raw_evidence,
        read_evidence,
        signature,
    )
    from gates.record._family import (
        Family,
        Version,
        attempt_verdicts,
        describe_family,
        family_errors,
        family_for,
        family_of,
    )
    from gates.record._files import parse_json, read_json
    from gates.record._history import check_history, contract_change
    from gates.record._index import (
        GENESIS,
        HISTORY_MALFORMED,
        HISTORY_NOT_A_FILE,
        INDEX,
        IndexEntry,
        RerunRecord,
        index_location_problem,
        index_path,
        is_withdrawn,
        latest_entries,
        require_index_file,
        sha256_file,
    )
    from gates.record._plots import condition_intervals, learning_curves, plotted_metrics
    from gates.record._provenance import (
        PROJECT_ROOT,
        Provenance,
        Staleness,
        code_files,
        code_sha256,
        current_provenance,
        describe_stale,
        git,
        refuse_uncommitted,
        staleness,
        watched_paths,
    )
    from gates.record._report import (
        converged_cell,
        interval_text,
        pilot_lines,
        render_report,
        write_evidence,
        write_report,
    )
    from gates.record._siblings import (
        RegimeLeft,
        annotate_siblings,
        describe_regime,
        describe_shared,
        shared_runs,
    )
    from gates.record._successors import design_of, link_supersession, successor_problem
    from gates.record._tracking import (
        ARMS_VIEW,
        WITHDRAWAL_TAGS,
        MLflowMetricSink,
        Tracker,
        base_tags,
        close_after_interrupt,
        finished_record,
        flatten_params,
        open_client,
        pilot_runs,
        resolve_uri,
        supersede_claim_run,
        withdraw_claim_run,
    )
    from gates.record._view import EvidenceView, raw_view
    from gates.record._writer import record_entry

# public name -> its private module, imported on first use
_FACE = {
    "ARMS_VIEW": "_tracking",
    "Attempt": "_attempt_log",
    "CERTIFICATION_IGNORED": "_certified",
    "CERTIFICATION_INVALID": "_certified",
    "ConditionBar": "_conditions",
    "ConditionRow": "_conditions",
    "Derivation": "_derive",
    "EVIDENCE": "_evidence",
    "EVIDENCE_FORMAT": "_evidence",
    "Evidence": "_evidence",
    "EvidenceView": "_view",
    "Family": "_family",
    "GENESIS": "_index",
    "HISTORY_MALFORMED": "_index",
    "HISTORY_NOT_A_FILE": "_index",
    "INDEX": "_index",
    "INVALIDATES": "_conditions",
    "IndexEntry": "_index",
    "MLflowMetricSink": "_tracking",
    "OTHER_SIDE": "_conditions",
    "PROJECT_ROOT": "_provenance",
    "PilotRecord": "_evidence",
    "Provenance": "_provenance",
    "RECORD": "_attempts",
    "REFUTES": "_conditions",
    "REPORT": "_evidence",
    "REPRODUCE": "_attempts",
    "Recording": "_attempts",
    "RegimeLeft": "_siblings",
    "Reproduction": "_attempts",
    "RerunRecord": "_index",
    "SOUND": "_conditions",
    "SUPPORTS": "_conditions",
    "SettingsRecord": "_evidence",
    "Staleness": "_provenance",
    "Tracker": "_tracking",
    "UNDETERMINED": "_conditions",
    "Version": "_family",
    "WITHDRAWAL_TAGS": "_tracking",
    "annotate_siblings": "_siblings",
    "as_evidence": "_evidence",
    "atomic_write_text": "_evidence",
    "attempt_field": "_attempts",
    "attempt_verdicts": "_family",
    "base_tags": "_tracking",
    "close_after_interrupt": "_tracking",
    "best_trial": "_derive",
    "certifications": "_certified",
    "check_certifications": "_certified",
    "standing_code": "_certified",
    "check_history": "_history",
    "claim_attempts": "_attempt_log",
    "code_files": "_provenance",
    "code_sha256": "_provenance",
    "compare_reproduction": "_attempts",
    "condition_difference": "_conditions",
    "condition_intervals": "_plots",
    "condition_label": "_conditions",
    "condition_rows": "_conditions",
    "condition_sentence": "_conditions",
    "contract_change": "_history",
    "converged_cell": "_report",
    "interval_text": "_report",
    "current_provenance": "_provenance",
    "derive": "_derive",
    "describe_family": "_family",
    "describe_regime": "_siblings",
    "describe_shared": "_siblings",
    "describe_stale": "_provenance",
    "design_of": "_successors",
    "evidence_dir": "_evidence",
    "family_errors": "_family",
    "family_for": "_family",
    "family_of": "_family",
    "flatten_params": "_tracking",
    "git": "_provenance",
    "holding_side": "_conditions",
    "index_location_problem": "_index",
    "index_path": "_index",
    "is_converged": "_derive",
    "is_withdrawn": "_index",
    "latest_entries": "_index",
    "learning_curves": "_plots",
    "link_supersession": "_successors",
    "open_client": "_tracking",
    "parse_json": "_files",
    "pilot_lines": "_report",
    "pilot_runs": "_tracking",
    "plan_recording": "_attempts",
    "plotted_metrics": "_plots",
    "raw_evidence": "_evidence",
    "raw_view": "_view",
    "read_evidence": "_evidence",
    "read_json": "_files",
    "record_entry": "_writer",
    "refuse_uncommitted": "_provenance",
    "render_report": "_report",
    "require_index_file": "_index",
    "resolve_uri": "_tracking",
    "run_facts": "_derive",
    "finished_record": "_tracking",
    "sha256_file": "_index",
    "shared_runs": "_siblings",
    "signature": "_evidence",
    "staleness": "_provenance",
    "successor_problem": "_successors",
    "supersede_claim_run": "_tracking",
    "term_short_names": "_conditions",
    "term_values": "_conditions",
    "tuned_config": "_derive",
    "watched_paths": "_provenance",
    "withdraw_claim_run": "_tracking",
    "within_tolerance": "_certified",
    "write_evidence": "_report",
    "write_report": "_report",
}
__all__ = sorted(_FACE)
__getattr__, __dir__ = lazy_face(__name__, _FACE)
