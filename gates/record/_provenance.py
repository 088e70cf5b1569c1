"""Where a result came from: git commit and dirty flag, and a fingerprint of the code that ran.

The fingerprint (`code_sha256`, per file `code_files`) covers every file of this repository's `gates/`
and the study's own code, wherever it is installed:

- a study in this repository's `models/` folder (installed as `gates.models`): its module and the
  modules of that package it imports, transitively, with the `__init__.py` of every package on the
  way, named `models/<path>.py` (imports written `gates.models.x` or, at older commits, `models.x`);
- a study from any other package (registered by another distribution, `examples/my_study`): every
  `*.py` file of its top-level package, recursively, or the single file of a top-level module, named
  relative to the sys.path entry that holds it (`my_study/study.py`, `faulty_study.py`), so the name
  does not depend on where it is installed. Which one is decided by where the top-level package's
  files are (`importlib.util.find_spec`, which imports nothing), never by its name: a researcher's
  own package called `models` is fingerprinted by its own files.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import subprocess
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

import gates
from gates.errors import UserError

if TYPE_CHECKING:
    from gates.record._index import IndexEntry
    from gates.record._view import EvidenceView

PROJECT_ROOT = Path(gates.__file__).resolve().parent.parent
CODE_PACKAGES = ("gates", "models")


@dataclass(frozen=True)
class Provenance:
    git_commit: str  # "unknown" outside a git checkout
    git_dirty: str  # "true" / "false" / "unknown"
    code_sha256: str  # sha256 over the source of gates/ and the study's code: what actually ran
    # relative path -> sha256 of each file code_sha256 covers (so a later change can be named)
    code_files: dict[str, str] = field(default_factory=dict, compare=False)
    # the installed distribution that registers the study and the top-level package its code is in,
    # e.g. "gates-my-study 0.1.0 (my_study)", "treeheap-gates 0.1.0 (models)"; see `study_package`
    study_package: str | None = field(default=None, compare=False)

    def as_dict(self) -> dict:
        return asdict(self)

    @property
    def short(self) -> str:
        dirty = "+dirty" if self.git_dirty == "true" else ""
        return f"{self.git_commit[:12]}{dirty}"


def git(*args: str, root: Path | None = None) -> str | None:
    try:
        out = subprocess.run(
            ["git", *args], cwd=root or PROJECT_ROOT, capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def code_sha256(study_module: str | None = None, root: Path | None = None) -> str:
    """Fingerprint of the code a run depends on: every file of `gates/`, plus the study's own code (this
    repository's study module and the `models` modules it imports, transitively; or every file of the
    package a study from elsewhere is in: see the module docstring). Editing one study does not
    invalidate another's finished runs; editing the platform or a shared module does."""
    return _fingerprint(code_named(study_module, root))[0]


def code_paths(study_module: str | None = None, root: Path | None = None) -> list[Path]:
    """The files `code_sha256` covers, in the order it hashes them."""
    return [path for _, path in code_named(study_module, root)]


def code_files(study_module: str | None = None, root: Path | None = None) -> dict[str, str]:
    """relative name -> sha256 of each file `code_sha256` covers."""
    return _fingerprint(code_named(study_module, root))[1]


def code_named(study_module: str | None = None, root: Path | None = None) -> list[tuple[str, Path]]:
    """(name, path) of each file `code_sha256` covers, in the order it hashes them: `gates/...` and
    this repository's `models/...` relative to `root`, a study package from elsewhere by its import
    name (`my_study/study.py`). Without a study module: gates/ and all of models/."""
    root = root or PROJECT_ROOT
    files = sorted((root / "gates").rglob("*.py"))
    if study_module:
        plugin = plugin_files(study_module)
        if plugin is not None:
            return [(_rel(p, root), p) for p in files] + plugin
        files += study_files(study_module, root)
    else:
        files += sorted((root / "models").rglob("*.py"))
    return [(_rel(p, root), p) for p in files]


def _rel(path: Path, root: Path) -> str:
    return str(path.relative_to(root).as_posix())


def plugin_files(study_module: str) -> list[tuple[str, Path]] | None:
    """(name, path) of the files of a study module that is not in this repository's `models` package:
    every `*.py` of its top-level package (recursively, no __pycache__), named `<package>/<path in
    it>`, or its top-level module's file, named by its file name; sorted by name. None for a study of
    this repository's `models` package (fingerprinted by its import closure, `study_files`).

    Decided by where the top-level package's files are, found without importing it (the module
    already imported in this process, when it is, is the one that ran): a `models` package anywhere
    but PROJECT_ROOT/models is another package. A `models` that cannot be found is taken as this
    repository's (its files are then missing, which staleness names). A study module in `gates` has
    no files beyond gates/, which is always covered; one that cannot be found has none."""
    module = study_module.strip()
    if module == "gates.models" or module.startswith("gates.models."):
        return None
    top = module.partition(".")[0]
    if top == "gates":
        return []
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError, AttributeError):  # a broken finder, a module without __spec__
        spec = None
    if spec is None:
        return None if top == "models" else []
    locations = [Path(p) for p in (spec.submodule_search_locations or [])]
    if locations:
        if top == "models" and any(_same_dir(d, PROJECT_ROOT / "models") for d in locations):
            return None
        named: dict[str, Path] = {}
        for folder in locations:  # several for a namespace package; the first holding a name wins
            for path in sorted(folder.rglob("*.py")):
                rel = path.relative_to(folder)
                if "__pycache__" not in rel.parts and path.is_file():
                    named.setdefault(f"{top}/{rel.as_posix()}", path)
        return sorted(named.items())
    if spec.has_location and spec.origin and Path(spec.origin).is_file():
        return [(Path(spec.origin).name, Path(spec.origin))]
    return []  # built in, frozen, or in a zip: no files to read


def _same_dir(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return False


def study_package(study_module: str | None) -> str | None:
    """Where the study's code came from, from the installed metadata (nothing imported): the
    distribution that registers a study in this module (entry-point group `gates.studies`) with its
    version, and the top-level package the code is in, e.g. "gates-my-study 0.1.0 (my_study)",
    "treeheap-gates 0.1.0 (models)"; just the package ("my_study") when no installed distribution
    registers the module; None without a study module."""
    if not study_module:
        return None
    from gates.study import study_entries

    top = study_module.strip().partition(".")[0]
    dists = [
        e.distribution
        for e in study_entries()
        if e.module == study_module.strip() and e.distribution
    ]
    return f"{dists[0]} ({top})" if dists else top


def watched_paths(root: Path | None = None) -> list[Path]:
    """Every file the fingerprint of some registered study covers: gates/, all of models/ and the
    files of each study package from elsewhere (what a cache of staleness must watch; nothing
    imported)."""
    from gates.study import study_entries

    root = root or PROJECT_ROOT
    files = list((root / "gates").rglob("*.py")) + list((root / "models").rglob("*.py"))
    seen = set()
    for entry in study_entries():
        top = entry.module.partition(".")[0]
        if top not in seen:
            seen.add(top)
            files += [path for _, path in plugin_files(entry.module) or []]
    return files


def _fingerprint(named: list[tuple[str, Path]]) -> tuple[str, dict[str, str]]:
    return _digest([(name, path.read_bytes()) for name, path in named])


def _digest(named: list[tuple[str, bytes]]) -> tuple[str, dict[str, str]]:
    digest = hashlib.sha256()
    per_file = {}
    for name, data in named:
        digest.update(name.encode())
        digest.update(b"\0")
        digest.update(data)
        per_file[name] = hashlib.sha256(data).hexdigest()
    return digest.hexdigest(), per_file


# an import of this repository's study package: `gates.models.x.y` (or `models.x.y`, as files at
# commits before the package moved under the platform's namespace wrote it), `from ... import a, b`
_MODELS_IMPORT = re.compile(
    r"^[ \t]*(?:from[ \t]+(?:gates\.)?models((?:\.\w+)*)[ \t]+import[ \t]+\(?([\w \t,]*)"
    r"|import[ \t]+(?:gates\.)?models((?:\.\w+)+))",
    re.MULTILINE,
)


def _module_candidates(parts: list[str]) -> list[str]:
    """The files importing `models.<parts>` may execute: the `__init__.py` of models/ and of each
    package on the way, and the module itself as `<path>.py` or `<path>/__init__.py` (whichever
    exists; the closure skips files that do not)."""
    folders = ["models", *("models/" + "/".join(parts[:i]) for i in range(1, len(parts) + 1))]
    found = [f"{folder}/__init__.py" for folder in folders]
    if parts:
        found.append(f"models/{'/'.join(parts)}.py")
    return found


def study_files(module: str, root: Path | None = None) -> list[Path]:
    """The files of a study in this repository's models/ (see the module docstring)."""
    root = root or PROJECT_ROOT

    def read(rel: str) -> str | None:
        path = root / rel
        return path.read_text(encoding="utf-8") if path.is_file() else None

    return [root / rel for rel in _study_closure(module, read)]


def _study_closure(module: str, read: Callable[[str], str | None]) -> list[str]:
    """Relative paths of the study module's files (see `study_files`), read through `read`."""
    name = module.strip().removeprefix("gates.").removeprefix("models").lstrip(".")
    parts = name.split(".") if name else []
    # a module that is not in this tree (read at an older commit: models/x.py before it became the
    # package models/x/ with x/study.py) is looked for as the module above it, where its code was
    while parts and not any(
        read(rel) is not None
        for rel in (f"models/{'/'.join(parts)}.py", f"models/{'/'.join(parts)}/__init__.py")
    ):
        parts = parts[:-1]
    seen: dict[str, None] = {}
    todo = _module_candidates(parts)
    while todo:
        rel = todo.pop()
        if rel in seen:
            continue
        text = read(rel)
        if text is None:
            continue
        seen[rel] = None
        for from_path, names, import_path in _MODELS_IMPORT.findall(text):
            parts = [p for p in (from_path or import_path).split(".") if p]
            todo += _module_candidates(parts)
            if not import_path:  # `from pkg import a`: a may be a module
                for imported in (n.split()[0] for n in names.split(",") if n.split()):
                    if imported.isidentifier():  # `a as b`: the module is a
                        todo += _module_candidates([*parts, imported])
    return sorted(seen)


def current_provenance(study_module: str | None = None) -> Provenance:
    commit = git("rev-parse", "HEAD") or "unknown"
    if commit == "unknown":
        dirty = "unknown"
    else:
        # only the code that runs counts: evidence in runs/, contracts and docs do not make it dirty
        status = git(
            "status", "--porcelain", "--untracked-files=no", "--", *CODE_PACKAGES, "pyproject.toml"
        )
        dirty = "unknown" if status is None else ("true" if status else "false")
    fingerprint, files = _fingerprint(code_named(study_module))
    return Provenance(commit, dirty, fingerprint, files, study_package(study_module))


# ---------------------------------------------------------------------------------- uncommitted
# Set to record from uncommitted files anyway (the platform's own test suite, a scratch project):
# the evidence then says `+dirty`, and its fingerprint makes the claim stale until its code is
# committed as it ran (or the claim is certified under committed code).
ALLOW_UNCOMMITTED = "GATES_ALLOW_UNCOMMITTED"


def uncommitted(paths: list[Path], *, outside_git: bool = True) -> list[str]:
    """Of these files, those no commit holds as they are: untracked or ignored, changed since HEAD
    (staged or not), or in no git work tree (unless not `outside_git`: an installed distribution's
    files, whose version and fingerprint say what they are), each as `<path> (untracked)`,
    `(changed)` or `(in no git repository)`, relative to the current directory when under it."""
    by_repo: dict[Path, list[Path]] = {}
    tops: dict[Path, str | None] = {}  # folder -> its work tree (one git call per folder)
    found = []
    for path in paths:
        path = Path(path).resolve()
        if path.parent not in tops:
            tops[path.parent] = git("rev-parse", "--show-toplevel", root=path.parent)
        top = tops[path.parent]
        if top is not None:
            by_repo.setdefault(Path(top), []).append(path)
        elif outside_git:
            found.append(f"{_shown(path)} (in no git repository)")
    for top, files in by_repo.items():
        names = [str(f.relative_to(top.resolve())) for f in files]
        tracked = git("ls-files", "--full-name", "--", *names, root=top)
        tracked = set((tracked or "").splitlines())
        # `git diff HEAD` fails without a commit: then nothing is committed
        changed = git("diff", "--name-only", "HEAD", "--", *names, root=top)
        changed = set(changed.splitlines()) if changed is not None else set(names)
        for file, name in zip(files, names):
            what = "untracked" if name not in tracked else "changed" if name in changed else None
            if what:
                found.append(f"{_shown(file)} ({what})")
    return found


def refuse_uncommitted(contract_path: Path, study_module: str | None, doing: str) -> None:
    """Before a command records (`doing`: "record", "certify"), refuse (UserError, exit 2) when the
    contract file or a file of the study's code fingerprint is not committed as it is, so that the
    commit the evidence names holds what produced it; in this repository and a researcher's own
    project alike (unless ALLOW_UNCOMMITTED is set: see above)."""
    if os.environ.get(ALLOW_UNCOMMITTED, "") not in ("", "0"):
        return
    found = uncommitted([Path(contract_path)]) + uncommitted(
        code_paths(study_module), outside_git=False
    )
    if found:
        shown = ", ".join(found[:5]) + (f" and {len(found) - 5} more" if len(found) > 5 else "")
        raise UserError(
            f"cannot {doing} from files no commit holds: {shown}; expected them committed, so the "
            f"evidence names a commit with the code that produced it (reproducing a recorded claim "
            f"runs from any tree)",
            file=str(contract_path),
        )


def _shown(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


# ---------------------------------------------------------------------------------- staleness
UNKNOWN_FILES = "unknown files"


@dataclass(frozen=True)
class Staleness:
    """Whether the code a claim's evidence was computed with has changed since (like `dvc status`)."""

    stale: bool
    files: tuple[
        str, ...
    ] = ()  # changed, added or removed files; ("unknown files",) when not nameable
    note: str = ""  # how the files were found, when not from the evidence's own per-file hashes


def staleness(
    evidence: EvidenceView | dict,
    study_module: str | None,
    root: Path | None = None,
    today: dict | None = None,
    certified: IndexEntry | None = None,
) -> Staleness:
    """Compare the code fingerprint the evidence recorded (`code_sha256`) with today's files. The
    changed files come from the evidence's `code_files` (per-file sha256, recorded since the claims
    index) or, for older evidence, from the tree of its recorded `git_commit`. `certified`: the
    claim's latest certification (a claims-history entry whose re-runs under later code reproduced
    the evidence, with that code's `code_sha256` and `code_files`): staleness is measured from it.
    `today`: a dict the caller keeps across the claims it checks at once, so each study's files are
    read and hashed once."""
    from gates.record._view import as_view

    root = root or PROJECT_ROOT
    ev = as_view(evidence)
    recorded, then = ev.code_sha256, ev.code_files
    if certified is not None:
        recorded, then = certified.code_sha256, certified.code_files
    if study_module is None:
        return Staleness(True, (UNKNOWN_FILES,), f"study {ev.study!r} is not registered any more")
    today = {} if today is None else today
    try:
        if (study_module, root) not in today:
            today[(study_module, root)] = _fingerprint(code_named(study_module, root))
        now_sha, now_files = today[(study_module, root)]
    except OSError as e:
        return Staleness(True, (UNKNOWN_FILES,), f"cannot read today's code: {e}")
    if now_sha == recorded:
        return Staleness(False)
    note = ""
    if not isinstance(then, dict) or not then:
        commit = str(ev.git_commit or "unknown")
        at_commit = files_at_commit(commit, study_module, root)
        if at_commit is None:
            return Staleness(
                True, (UNKNOWN_FILES,), f"recorded commit {commit[:12]} is not in this repository"
            )
        then_sha, then = at_commit
        note = f"compared with commit {commit[:12]}"
        if then_sha != recorded:
            note += (
                " (whose files do not hash to the recorded code sha256: the evidence was computed with "
                "changes that were never committed)"
            )
    changed = sorted(p for p in set(then) | set(now_files) if then.get(p) != now_files.get(p))
    if not changed:
        return Staleness(True, (UNKNOWN_FILES,), note)
    plugin = plugin_files(study_module)
    if plugin and not set(then) & {name for name, _ in plugin}:
        top = study_module.strip().partition(".")[0]
        note = _join(
            note,
            f"recorded before the code of the study's package {top} was fingerprinted: its code "
            f"then is unknown",
        )
    # Stale means the study's code changed: the models it trains and measures. The platform's files
    # (gates/) change with every feature; `gates verify` re-derives every verdict with today's engine,
    # and replays and audits re-run training, so a platform change alone is noted, not stale.
    study = [p for p in changed if not p.startswith("gates/")]
    platform = len(changed) - len(study)
    if platform:
        note = _join(
            note, f"{platform} platform file{'s' if platform > 1 else ''} in gates/ changed too"
        )
    return Staleness(bool(study), tuple(study), note)


def _join(a: str, b: str) -> str:
    return f"{a}; {b}" if a else b


@lru_cache(maxsize=64)
def files_at_commit(
    commit: str, study_module: str, root: Path | None = None
) -> tuple[str, dict[str, str]] | None:
    """(code sha256, per-file sha256) of the files `code_sha256` covers, as they were at `commit`;
    None when the commit is not available (not a git checkout, a shallow clone, an unknown commit).
    Only this repository's files (gates/ and the `models` closure): a study package from elsewhere is
    not in its history, and evidence without per-file hashes predates fingerprinting one anyway."""
    root = root or PROJECT_ROOT
    if not re.fullmatch(r"[0-9a-f]{7,40}", commit):
        return None
    listing = git("ls-tree", "-r", "--full-tree", commit, "--", "gates", "models", root=root)
    if listing is None:
        return None
    blobs = {}
    for line in listing.splitlines():
        meta, _, path = line.partition("\t")
        parts = meta.split()
        if len(parts) == 3 and parts[1] == "blob" and path.endswith(".py"):
            blobs[path] = parts[2]
    contents = _cat_blobs(list(blobs.values()), root)
    if contents is None:
        return None
    text = {path: contents[blob] for path, blob in blobs.items() if blob in contents}
    gates_files = sorted(p for p in text if p.startswith("gates/"))
    study = _study_closure(
        study_module, lambda rel: text[rel].decode("utf-8", "replace") if rel in text else None
    )
    return _digest([(p, text[p]) for p in gates_files + study])


def _cat_blobs(blobs: list[str], root: Path) -> dict[str, bytes] | None:
    """blob id -> content, read with one `git cat-file --batch`."""
    try:
        out = subprocess.run(
            ["git", "cat-file", "--batch"],
            cwd=root,
            input="\n".join(blobs).encode() + b"\n",
            capture_output=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    data, found, at = out.stdout, {}, 0
    while at < len(data):
        end = data.index(b"\n", at)
        header = data[at:end].split()
        if len(header) != 3:  # "<id> missing"
            at = end + 1
            continue
        size = int(header[2])
        found[header[0].decode()] = data[end + 1 : end + 1 + size]
        at = end + 1 + size + 1
    return found


def describe_stale(files: list[str], shown: int = 6) -> str:
    """The changed files, the study's own (models/, or its package's from elsewhere) first, the
    platform's (gates/) counted beyond `shown`."""
    study = [f for f in files if not f.startswith("gates/")]
    platform = [f for f in files if f.startswith("gates/")]
    parts = study[:]
    if platform:
        rest = len(platform) - shown
        parts += platform[:shown] + (
            [f"{rest} {'more ' if shown else ''}in gates/"] if rest > 0 else []
        )
    return ", ".join(parts) or "unknown files"
