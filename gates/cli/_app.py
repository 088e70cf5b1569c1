"""The `gates` command line: the Typer app, its global options, the commands registered in the order
`gates --help` lists them (each in its own module under gates/cli/commands/), and `main`, which turns
every error into one line.

Commands that only list (`--help`, `status`, `studies`) import no study and no verdict engine: they
answer in a fraction of a second (benchmarks/cli_latency.py).

Exit codes: 0 success; 1 a claim lost its evidence (verify), a run was interrupted, or a full disk or
an unwritable file or store (one line naming it: gates.errors.storage_error); 2 bad input (a one-line
error naming file:line: field: what is expected, never a traceback). Under --json an error is also one
JSON object on stdout ({"error": {"code", "message", ...}}, main()).
"""

from __future__ import annotations

import importlib
import json
import sys

import typer

from gates.cli._common import ReportedErrors, Retired
from gates.errors import UserError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},  # inherited by every command
    help="Falsification-gated experiments: a hypothesis contract fixes, before any training step, what "
    "result would support or refute a claim; `gates run` trains its arms x seeds into MLflow, halts "
    "hopeless runs and writes an honest verdict with its evidence to runs/<id>/.",
)

# gates/cli/commands/<name>.py defines the function <name>; listed in this order by `gates --help`
COMMANDS = (
    "new",
    "check",
    "pilot",
    "run",
    "worker",  # retired: hidden, says so in one line
    "verify",
    "rederive",
    "certify",
    "status",
    "withdraw",
    "render",
    "dashboard",
    "report",
    "schema",
    "studies",
)
# command groups: gates/cli/commands/<name>.py defines the Typer app <name>_app
GROUPS = ("data", "ci")


def _register() -> None:
    for name in COMMANDS:
        module = importlib.import_module(f"gates.cli.commands.{name}")
        # a module may set its command's click settings (the retired worker takes any argument)
        settings = getattr(module, "SETTINGS", None)
        app.command(
            name,
            hidden=name == "worker",
            context_settings=settings,
            add_help_option=settings is None,
        )(getattr(module, name))
    for name in GROUPS:
        module = importlib.import_module(f"gates.cli.commands.{name}")
        app.add_typer(getattr(module, f"{name}_app"), name=name)


def _print_version(asked: bool) -> None:
    if asked:
        from gates import __version__

        print(f"gates {__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    version: bool = typer.Option(
        False,
        "--version",
        is_eager=True,
        callback=_print_version,
        help="Print the version (gates X.Y.Z) and exit.",
    ),
):
    # no docstring: the app's help is the Typer's `help=`, which a callback's docstring would replace
    pass


_register()


def main() -> None:
    """The console script. No error shows a traceback: a user error (a UserError, or the command line
    itself) is one line per error on stderr and exit 2; a full disk or an unwritable file or store one
    line and exit 1. Under --json (of a command that has it) the error is also one JSON object on
    stdout, its last line, so that a program reading stdout reads JSON either way: {"error": {"code",
    "message", ...}} (gates.errors: UserError.as_dict, StorageError.as_dict; code "usage_error" for the
    command line)."""
    from typer.main import get_command

    from gates.errors import USAGE_ERROR, storage_error

    args = sys.argv[1:]
    command = get_command(app)
    as_json = _asks_json(command, args)
    try:
        code = command.main(args=args, standalone_mode=False)
    except UserError as e:  # (errors the command's JSON already holds are not printed twice)
        # a retired command or option is named by its code, what a script that called it matches on
        said = f"error[{e.code}]" if isinstance(e, Retired) else "error"
        _fail(e.render(), e.as_dict(), 2, as_json and not isinstance(e, ReportedErrors), said)
    except _CLICK_ERROR as e:  # an unknown option, a missing argument, no command
        if as_json:
            param = getattr(e, "param", None)
            field = param.opts[0] if getattr(param, "opts", None) else getattr(param, "name", None)
            error = {"code": USAGE_ERROR, "message": e.format_message(), "field": field}
            print(json.dumps({"error": error}), flush=True)
        e.show()  # usage and message, as click prints them
        sys.exit(e.exit_code)
    except typer.Abort:
        sys.stderr.write("Aborted!\n")
        sys.exit(1)
    except Exception as e:  # a full disk or an unwritable store, wherever it struck: exit 1
        found = storage_error(e)
        if found is None:
            raise
        _fail(found.render(), found.as_dict(), 1, as_json)
    sys.exit(code if isinstance(code, int) else 0)  # typer.Exit(n) comes back as n


# click's exceptions as this typer raises them: newer typer vendors click (its exceptions derive from
# typer.TyperException), older typer raises click's own
try:
    _CLICK_ERROR = typer.TyperException
except AttributeError:
    from click import ClickException as _CLICK_ERROR


def _asks_json(command, args: list[str]) -> bool:
    """Whether the command line runs, with --json, a command that has --json (its errors are then JSON
    too). The command is found as click finds it: the first words that name commands (the app's own
    options take no value); a `--` ends the options."""
    words = args[: args.index("--")] if "--" in args else args
    for word in words:
        sub = getattr(command, "commands", {}).get(word)
        if sub is not None:
            command = sub
        elif not word.startswith("-"):
            break
    return "--json" in words and any("--json" in getattr(p, "opts", ()) for p in command.params)


def _fail(text: str, error: dict, code: int, as_json: bool, said: str = "error") -> None:
    if as_json:
        print(json.dumps({"error": error}), flush=True)
    for line in text.splitlines():  # plain writes: one line per error, never wrapped
        sys.stderr.write(f"{said}: {line}\n")
    sys.exit(code)
