"""`gates check CONTRACT`: the preflight report, nothing trained (gates.execution.check_contract)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from gates.cli._common import CONTRACTS_DIR, RUNS_DIR, ReportedErrors, out
from gates.cli._printers import check_json, print_check
from gates.errors import UserErrors


def check(
    contract: Path = typer.Argument(..., help="Contract YAML file."),
    runs_dir: Path = RUNS_DIR,
    contracts_dir: Path = CONTRACTS_DIR,
    as_json: bool = typer.Option(
        False,
        "--json",
        help="Print the report as one JSON object: id, sha256, claim, study, arms, seeds, budget, "
        "preflight (per arm: params, flops and their ratios to the baseline; notes), gates, "
        "seeds_for_80pct_power, decision, sequential, tuning, controls, notes, family, rule_flags, "
        "errors (the preflight's refusals, as error objects) and ready; exit 2 when not ready.",
    ),
    tracking_uri: str | None = typer.Option(
        None,
        "--tracking-uri",
        help="MLflow store whose pilot runs of the contract are listed (default: $MLFLOW_TRACKING_URI, "
        "else sqlite:///mlflow.db when it exists).",
    ),
):
    """Validate a contract and print its preflight report (parameter counts, FLOPs, the five gates, whether
    each condition can reach significance with its seeds), without training anything. A contract with
    evidence recorded under older rules is shown with the rules it predates instead of refused; a
    contract outside the contracts folder is refused, as `gates run` refuses it."""
    from gates.design import rule_flags
    from gates.execution import check_contract
    from gates.inference import estimand_notes, predictions

    # the checks `gates run` and `gates verify` apply too (gates.execution.check_contract)
    loaded, report = check_contract(contract, runs_dir, contracts_dir)
    c = loaded.contract
    power = predictions(c, [], [])["predicted_ablation"]["seeds_for_80pct_power"]
    notes = estimand_notes(c.decision, len(c.seeds), loaded.study.metrics)
    flags = rule_flags(loaded)
    pilots = _pilots(loaded, tracking_uri if isinstance(tracking_uri, str) else None)
    if as_json:
        report_json = check_json(loaded, report, power, notes, flags)
        report_json["pilots"] = [p.as_dict() for p in pilots]
        print(json.dumps(report_json, indent=2))
        if report.errors:
            raise ReportedErrors(report.errors)
        return
    print_check(loaded, report, power, notes, flags)
    if pilots:
        from gates.record import pilot_lines

        out.print("pilots (what was known before):", markup=False)
        for line in pilot_lines(pilots, loaded.sha256):
            out.print(f"  {line}", markup=False)
    if report.errors:
        raise UserErrors(report.errors)
    out.print("[green]ready to run[/]")


def _pilots(loaded, tracking_uri: str | None) -> list:
    """The contract's pilot runs (`gates pilot`) in the store `tracking_uri` (default: $MLFLOW_TRACKING_URI,
    else sqlite:///mlflow.db); none where that store does not exist (a check never creates one)."""
    from gates.record import pilot_runs, resolve_uri

    return pilot_runs(resolve_uri(tracking_uri), loaded.contract.id, loaded.path)
