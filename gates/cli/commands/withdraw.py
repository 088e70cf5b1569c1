"""`gates withdraw ID --reason TEXT`: a recorded claim withdrawn in the claims history."""

from __future__ import annotations

from pathlib import Path

import typer

from gates.cli._common import RUNS_DIR, out
from gates.errors import UserError


def withdraw(
    contract_id: str = typer.Argument(..., help="Id of the recorded claim to withdraw."),
    reason: str = typer.Option(
        ..., "--reason", help="Why it is withdrawn (recorded in the index)."
    ),
    runs_dir: Path = RUNS_DIR,
    tracking_uri: str | None = typer.Option(
        None,
        "--tracking-uri",
        help="MLflow store whose parent run of the claim is tagged withdrawn (default: "
        "$MLFLOW_TRACKING_URI, else sqlite:///mlflow.db); never the store the evidence names.",
    ),
):
    """Withdraw a recorded claim: append a `withdrawn` entry with the reason to runs/INDEX.jsonl. Its
    evidence and contract stay (they may be removed afterwards); status, the dashboard and verify show
    it as withdrawn, never as lost. Running the contract again records it anew. Its MLflow parent run
    is tagged withdrawn (`gates.verdict = withdrawn`) in your store (`--tracking-uri`, else
    $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db) when it can be reached; the store the evidence
    recorded is never connected to."""
    from gates.record import (
        EVIDENCE,
        INDEX,
        evidence_dir,
        index_path,
        is_withdrawn,
        latest_entries,
        record_entry,
        require_index_file,
        resolve_uri,
        withdraw_claim_run,
    )

    if not reason.strip():
        raise UserError("--reason is empty; expected why the claim is withdrawn", field="--reason")
    try:
        require_index_file(runs_dir)
    except ValueError as e:
        raise UserError(str(e), field="--runs-dir") from None
    latest = latest_entries(runs_dir).get(contract_id)
    evidence = evidence_dir(runs_dir, contract_id) / EVIDENCE
    if latest is None and not evidence.is_file():
        raise UserError(
            f"no recorded claim {contract_id!r} in {runs_dir} (no evidence, no index entry); "
            f"expected the id of a claim with evidence",
            field="contract_id",
        )
    if is_withdrawn(latest):
        raise UserError(
            f"{contract_id} is already withdrawn ({INDEX} line {latest.line}, "
            f"{latest.time}: {latest.reason})",
            field="contract_id",
        )
    try:
        record_entry(runs_dir, evidence, "withdrawn", reason.strip())
    except (OSError, ValueError) as e:
        raise UserError(
            f"cannot append to {index_path(runs_dir)}: {e}", field="--runs-dir"
        ) from None
    out.print(
        f"withdrawn {contract_id}: {reason.strip()} ({index_path(runs_dir)})",
        markup=False,
        highlight=False,
    )
    # after the entry: the claims history is the record, the MLflow parent run's tags only a view
    note = withdraw_claim_run(evidence, reason.strip(), resolve_uri(tracking_uri))
    if note:
        out.print(f"{note}; the withdrawal stands", markup=False, highlight=False)
