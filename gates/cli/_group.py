"""What every `gates` command group (`gates data`, `gates ci`) is made of: a Typer app configured as the
main one is (one-line errors from gates itself, no completion, plain help), and its console."""

from __future__ import annotations

import typer
from rich.console import Console


def command_group(help: str) -> typer.Typer:
    return typer.Typer(
        add_completion=False,
        no_args_is_help=True,
        pretty_exceptions_enable=False,
        rich_markup_mode=None,
        help=help,
    )


def group_console() -> Console:
    return Console(soft_wrap=True, highlight=False)
