"""The `gates` command line (typer): `main` is the console script.

Private modules: `_app` (the app, its registration of the commands, `main`), `commands/` (one module
per command and per command group), `_printers` (what the commands print), `_progress` (a run's
progress, for people and as JSON lines), `_common` (shared options, consoles and errors), `_group`
(what a command group is made of).
"""

from typing import TYPE_CHECKING

from gates._face import lazy_face

# what type checkers and editors resolve; at run time each name loads on first use
if TYPE_CHECKING:
    from gates.cli._app import app, main
    from gates.cli.commands.check import check

# public name -> its private module, imported on first use
_FACE = {
    "app": "_app",
    "check": "commands.check",
    "main": "_app",
}
__all__ = sorted(_FACE)
__getattr__, __dir__ = lazy_face(__name__, _FACE)
