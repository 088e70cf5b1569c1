"""Study registry: studies are found by name through the `gates.studies` entry-point group.

A contract names a study; it can never name an import path, so a contract cannot run arbitrary code.
"""

from __future__ import annotations

from functools import lru_cache
from importlib.metadata import entry_points

from gates.study import Study

GROUP = "gates.studies"


@lru_cache(maxsize=None)
def _entry_points() -> dict:
    return {ep.name: ep for ep in entry_points(group=GROUP)}


def study_names() -> list[str]:
    return sorted(_entry_points())


@lru_cache(maxsize=None)
def get_study(name: str) -> Study:
    """The registered study `name` (KeyError if none). Importing it may import torch."""
    eps = _entry_points()
    if name not in eps:
        raise KeyError(name)
    study_cls = eps[name].load()
    if not (isinstance(study_cls, type) and issubclass(study_cls, Study)):
        raise TypeError(f"entry point {name!r} in group {GROUP!r} is not a gates.study.Study subclass")
    return study_cls()


def study_module(name: str) -> str | None:
    """The module a registered study lives in (e.g. `models.c05_probe`), without importing it; None if
    no study has that name."""
    ep = _entry_points().get(name)
    return ep.value.split(":", 1)[0].strip() if ep is not None else None
