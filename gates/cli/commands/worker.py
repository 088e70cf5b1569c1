"""`gates worker`: retired with the PostgreSQL queue it served. Ray runs a contract's jobs on a cluster
(`gates run CONTRACT --executor ray --ray-address HOST:6379`); the command stays, hidden from
`gates --help`, only to say so in one line (exit 2) to whoever still starts it, whatever it is given."""

from __future__ import annotations

import typer

from gates.cli._common import Retired
from gates.cli.commands.run import CLUSTER_DOC, ON_RAY

# any arguments and options (even --help) reach the command, which refuses them all in one line
SETTINGS = {"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": []}


def worker(args: list[str] | None = typer.Argument(None, hidden=True)):
    """Retired: the queue of `gates worker`s gave way to Ray (gates run CONTRACT --executor ray)."""
    raise Retired(
        "worker_retired",
        f"`gates worker` is retired with its PostgreSQL queue; expected Ray to run the jobs on a "
        f"cluster: `{ON_RAY}` (see {CLUSTER_DOC})",
    )
