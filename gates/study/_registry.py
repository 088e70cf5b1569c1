"""Study registry: studies are found by name through the `gates.studies` entry-point group.

A contract names a study; it can never name an import path, so a contract cannot run arbitrary code.
Any installed distribution may register studies, this repository's own (pyproject.toml) or a
researcher's package (see examples/my_study):

    [project.entry-points."gates.studies"]
    my_study = "my_pkg.study:MyStudy"

Names and modules come from the installed metadata without importing anything (`study_entries`,
`study_module`); `get_study` imports the study (which may import torch) and checks that it keeps
the interface (gates.study.Study), raising a `StudyError` that names the study otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib.metadata import entry_points

from gates.errors import UserError
from gates.study._api import Metric, Study, StudyConfig

GROUP = "gates.studies"


class StudyError(UserError):
    """A registered study that cannot be used: it fails to import, or breaks the Study interface."""


@dataclass(frozen=True)
class StudyEntry:
    """A registered study as the installed metadata states it (nothing imported)."""

    name: str
    value: str  # "module:Class"
    distribution: str | None  # the installed distribution that registers it, with its version

    @property
    def module(self) -> str:
        return self.value.split(":", 1)[0].strip()


def _distribution(ep) -> str | None:
    dist = getattr(ep, "dist", None)
    if dist is None:
        return None
    try:
        return f"{dist.name} {dist.version}"
    except Exception:  # metadata without a name or version
        return None


@cache
def _scan() -> tuple[dict, dict]:
    """(name -> entry point, name -> the differing values other distributions register for it)."""
    found, clashes = {}, {}
    for ep in entry_points(group=GROUP):
        if ep.name in found and found[ep.name].value != ep.value:
            clashes.setdefault(
                ep.name, [f"{found[ep.name].value} ({_distribution(found[ep.name]) or '?'})"]
            )
            clashes[ep.name].append(f"{ep.value} ({_distribution(ep) or '?'})")
            continue
        found.setdefault(ep.name, ep)
    return found, clashes


def _entry_points() -> dict:
    return _scan()[0]


def refresh() -> None:
    """Forget what was found and loaded: the next lookup reads the installed metadata again (after a
    `pip install` in the same process, or a test that adds a distribution to sys.path)."""
    _scan.cache_clear()
    get_study.cache_clear()


def study_names() -> list[str]:
    return sorted(_entry_points())


def study_entries() -> list[StudyEntry]:
    """Every registered study from the installed metadata, sorted by name; imports nothing."""
    return [
        StudyEntry(name, ep.value, _distribution(ep))
        for name, ep in sorted(_entry_points().items())
    ]


@cache
def get_study(name: str) -> Study:
    """The registered study `name` (KeyError if none). Importing it may import torch. A study that
    cannot be imported or breaks the interface is a StudyError naming it."""
    found, clashes = _scan()
    if name not in found:
        raise KeyError(name)
    ep = found[name]
    where = f"study {name!r} ({ep.value}"
    where += f", from {_distribution(ep)})" if _distribution(ep) else ")"
    if name in clashes:
        raise StudyError(
            f"study {name!r} is registered by several installed distributions with different "
            f"classes: {'; '.join(clashes[name])}; expected one (uninstall or rename one of them)"
        )
    try:
        study_cls = ep.load()
    except Exception as e:  # ImportError, or whatever the module raises on import
        raise StudyError(
            f"{where} cannot be imported: {type(e).__name__}: {_first_line(e)}"
        ) from None
    problems = interface_problems(study_cls, name)
    if problems:
        raise StudyError(f"{where} breaks the study interface: {'; '.join(problems)}")
    try:
        return study_cls()
    except Exception as e:
        raise StudyError(
            f"{where} cannot be created: {type(e).__name__}: {_first_line(e)}"
        ) from None


def interface_problems(study_cls, name: str) -> list[str]:
    """What a registered class lacks of the Study interface (empty when it is a usable study)."""
    if not (isinstance(study_cls, type) and issubclass(study_cls, Study)):
        return [f"{study_cls!r} is not a gates.study.Study subclass"]
    problems = []
    declared = getattr(study_cls, "name", None)
    if declared != name:
        problems.append(
            f"class attribute name = {declared!r}; expected name = {name!r}, the name it is "
            f"registered under"
            if declared is not None
            else f"no class attribute `name`; expected name = {name!r}"
        )
    config = getattr(study_cls, "Config", None)
    if not (isinstance(config, type) and issubclass(config, StudyConfig)):
        problems.append(
            "no class attribute `Config` subclassing gates.study.StudyConfig (the arm config model)"
        )
    metrics = getattr(study_cls, "metrics", None)
    if not isinstance(metrics, dict) or not metrics:
        problems.append(
            "no metric declarations: expected a class attribute `metrics = {name: gates.study.Metric("
            "direction, role, low, high)}` listing every metric `run` reports and returns"
        )
    else:
        bad = [
            str(k)
            for k, v in metrics.items()
            if not isinstance(k, str) or not isinstance(v, Metric)
        ]
        if bad:
            problems.append(
                f"metrics {', '.join(bad)} are not declared as gates.study.Metric (direction, role, "
                f"range)"
            )
    for method in ("run", "param_count"):
        if getattr(study_cls, method, None) is getattr(Study, method):
            problems.append(
                f"no `{method}` method (gates.study.Study.{method} must be implemented)"
            )
    return problems


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else "(no message)"


def study_module(name: str) -> str | None:
    """The module a registered study lives in (e.g. `models.c05_probe`), without importing it; None if
    no study has that name."""
    ep = _entry_points().get(name)
    return ep.value.split(":", 1)[0].strip() if ep is not None else None
