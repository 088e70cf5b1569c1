"""What the `gates` commands share: the consoles, the options several commands take, the errors only the
command line raises, and the parsing of a tolerance option. Imports nothing heavy (stdlib, typer, rich):
`gates --help` imports every command's module."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from gates.errors import UserError, UserErrors

out = Console(soft_wrap=True)  # long lines (signatures, paths) stay whole for copy and grep
err = Console(stderr=True, highlight=False, soft_wrap=True)

RUNS_DIR = typer.Option(
    Path("runs"), "--runs-dir", help="Where evidence is written and read (committed)."
)
CONTRACTS_DIR = typer.Option(
    Path("contracts"), "--contracts-dir", help="Where contracts are looked up."
)
JOBS = typer.Option(
    1,
    "--jobs",
    min=1,
    help="Run the arm x seed jobs (and tuning trials) in this many local processes; each computes on "
    "--threads (default: the machine's cores divided among the jobs; reproducing: the recorded "
    "count), so every run's numbers are a single-process run's.",
)
THREADS = typer.Option(
    None,
    "--threads",
    min=1,
    help="CPU threads torch computes with (default: torch's own, "
    "one per core; reproducing a recorded claim: the count its runs recorded). Each run records "
    "its count; an audit or replay re-runs it on that count, as its sums depend on it.",
)
TRACKING_URI = typer.Option(
    None,
    "--tracking-uri",
    help="MLflow store for the learning curves (default: "
    "$MLFLOW_TRACKING_URI, else sqlite:///mlflow.db); a missing store only hides the curves.",
)
MLFLOW_UI = typer.Option(
    "http://127.0.0.1:5000", "--mlflow-ui", help="MLflow UI address the run links point to."
)


class ReportedErrors(UserErrors):
    """Errors a command's --json output already holds: main() says them on stderr only (and exits 2),
    so that stdout stays one JSON document."""


class Retired(UserError):
    """A command or option that is gone, naming what replaced it: main() prints it as
    `error[CODE]: ...` (the code is what a script that called it matches on) and exits 2."""

    def __init__(self, code: str, message: str, *, field: str | None = None):
        self.code = code  # per instance: each retired thing has its own
        super().__init__(message, field=field)


def sigterm_as_interrupt(*_):
    raise KeyboardInterrupt


def parse_tolerance(text: str | None, option: str) -> tuple[float, float] | None:
    """ABS,REL of a tolerance option (None when not given)."""
    if text is None:
        return None
    try:
        parsed = tuple(float(x) for x in text.split(","))
    except ValueError:
        parsed = ()
    if len(parsed) != 2 or not all(0 <= x < float("inf") for x in parsed):
        raise UserError(
            f"{text!r} is not ABS,REL: expected two finite numbers >= 0 (e.g. 0.01,0.01)",
            field=option,
        )
    return parsed
