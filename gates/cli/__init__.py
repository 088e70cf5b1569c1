"""The `gates` command line (typer): `main` is the console script.

Private modules: `_app` (the app, its registration of the commands, `main`), `commands/` (one module
per command and per command group), `_printers` (what the commands print), `_progress` (a run's
progress, for people and as JSON lines), `_common` (shared options, consoles and errors), `_group`
(what a command group is made of).
"""

from gates._face import lazy_face

# public name -> (private module, its name there), imported on first use
_FACE = {
    "app": ("_app", "app"),
    "check": ("commands.check", "check"),
    "data_app": ("commands.data", "data_app"),
    "main": ("_app", "main"),
}
__all__ = sorted(_FACE)
__getattr__, __dir__ = lazy_face(__name__, _FACE)
