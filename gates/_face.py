"""A package's public face, imported lazily (PEP 562).

Each subpackage of gates lists its public names in `_FACE` (name -> the private module that defines
it under that name); a name is imported from its private module on first use. Each `__init__` also
imports its names under `TYPE_CHECKING`, so type checkers and go-to-definition find the definitions
(tests/test_architecture.py keeps that block and `_FACE` the same). So `gates status`, which needs the
claims check and not the verdict engine, never imports scipy, Optuna or MLflow through a package
whose other modules need them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable


def lazy_face(
    package: str, face: dict[str, str]
) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """(`__getattr__`, `__dir__`) for the package named `package` with public names `face`."""
    namespace = importlib.import_module(package).__dict__

    def __getattr__(name: str) -> object:
        try:
            module = face[name]
        except KeyError:
            raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        namespace[name] = value  # the next lookup finds it without this function
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(face))

    return __getattr__, __dir__
