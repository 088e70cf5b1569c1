"""The `gates` command line (typer): `main` is the console script.

Private modules: `_app` (the commands), `_data` (`gates data`).
"""

from gates._face import lazy_face

# public name -> (private module, its name there), imported on first use
_FACE = {
    "app": ("_app", "app"),
    "check": ("_app", "check"),
    "data_app": ("_data", "data_app"),
    "main": ("_app", "main"),
}
__all__ = sorted(_FACE)
__getattr__, __dir__ = lazy_face(__name__, _FACE)
