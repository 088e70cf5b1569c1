"""`gates studies [NAME...]`: the registered studies, from entry-point metadata (nothing imported
unless their metrics are asked for)."""

from __future__ import annotations

import json

import typer

from gates.cli._common import ReportedErrors, out
from gates.errors import UserError, UserErrors


def studies(
    names: list[str] | None = typer.Argument(
        None, help="Show these studies' metrics (imports them)."
    ),
    metrics: bool = typer.Option(
        False, "--metrics", help="Show every study's metrics (imports each study, and so torch)."
    ),
    as_json: bool = typer.Option(
        False,
        "--json",
        help="Print a JSON list, per study: name, class, module, distribution, and with names or "
        "--metrics its doc and metrics (name -> direction, role, low, high, scale, chance, unit; "
        "null without: nothing imported); a study that cannot be used has an `error` object.",
    ),
):
    """List the registered studies: name, class and the installed distribution that registers it (from the
    entry-point metadata, nothing imported). With names or --metrics: each study's metrics (name: better
    direction, role, range). A decision may read only `test` and `cost` metrics; stop rules may read any role."""
    from dataclasses import asdict

    from gates.errors import did_you_mean
    from gates.study import StudyError, get_study, study_entries

    entries = {e.name: e for e in study_entries()}
    for name in names or []:
        if name not in entries:
            raise UserError(
                f"unknown study {name!r}{did_you_mean(name, entries)}; registered: "
                f"{', '.join(entries) or 'none'}",
                field="NAME",
            )
    shown = names or list(entries)
    rows = [
        {
            "name": e.name,
            "class": e.value,
            "module": e.value.split(":", 1)[0].strip(),
            "distribution": e.distribution,
            "doc": None,
            "metrics": None,
        }
        for e in (entries[n] for n in shown)
    ]
    broken = []
    if names or metrics:  # only then a study is imported
        for row in rows:
            try:
                s = get_study(row["name"])
            except StudyError as e:
                broken.append(e)
                row["error"] = e.as_dict()
                continue
            doc = (s.__doc__ or "").strip().splitlines()
            row["doc"] = doc[0] if doc else ""
            row["metrics"] = {
                m: {**asdict(metric), "estimand": metric.default_estimand}
                for m, metric in s.metrics.items()
            }
    if as_json:
        print(json.dumps(rows, indent=2))
        if broken:
            raise ReportedErrors(broken)
        return
    if not names and not metrics:
        for e in entries.values():
            out.print(
                f"{e.name}: {e.value}" + (f" ({e.distribution})" if e.distribution else ""),
                markup=False,
                highlight=False,
            )
        out.print(
            "metrics: `gates studies NAME` or `gates studies --metrics`; arm config: `gates schema --study NAME`",
            markup=False,
            highlight=False,
            style="dim",
        )
        return
    for row in rows:
        if "error" in row:  # could not be used: said after the others
            continue
        out.print(f"[bold]{row['name']}[/]: {row['doc']}", highlight=False)
        out.print(
            f"  class: {row['class']}"
            + (f" ({row['distribution']})" if row["distribution"] else ""),
            markup=False,
            highlight=False,
        )
        out.print("  metrics:", markup=False)
        for m, metric in get_study(row["name"]).metrics.items():
            out.print(f"    {m}: {metric.describe()}", markup=False)
    if broken:
        raise UserErrors(broken)
