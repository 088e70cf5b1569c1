"""Where a result came from: git commit and dirty flag, and a fingerprint of the code that ran."""

from __future__ import annotations

import hashlib
import re
import subprocess
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Callable

import gates

PROJECT_ROOT = Path(gates.__file__).resolve().parent.parent
CODE_PACKAGES = ("gates", "models")


@dataclass(frozen=True)
class Provenance:
    git_commit: str  # "unknown" outside a git checkout
    git_dirty: str  # "true" / "false" / "unknown"
    code_sha256: str  # sha256 over the source of gates/ and models/: what actually ran
    # relative path -> sha256 of each file code_sha256 covers (so a later change can be named)
    code_files: dict[str, str] = field(default_factory=dict, compare=False)

    def as_dict(self) -> dict:
        return asdict(self)

    @property
    def short(self) -> str:
        dirty = "+dirty" if self.git_dirty == "true" else ""
        return f"{self.git_commit[:12]}{dirty}"


def git(*args: str, root: Path | None = None) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=root or PROJECT_ROOT, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def code_sha256(study_module: str | None = None, root: Path | None = None) -> str:
    """Fingerprint of the code a run depends on: every file of `gates/`, plus the study's module and
    the `models` modules it imports (transitively). Editing one study does not invalidate another's
    finished runs; editing the platform or a shared module does."""
    return _fingerprint(root or PROJECT_ROOT, code_paths(study_module, root))[0]


def code_paths(study_module: str | None = None, root: Path | None = None) -> list[Path]:
    """The files `code_sha256` covers, in the order it hashes them."""
    root = root or PROJECT_ROOT
    files = sorted((root / "gates").rglob("*.py"))
    files += study_files(study_module, root) if study_module else sorted((root / "models").rglob("*.py"))
    return files


def code_files(study_module: str | None = None, root: Path | None = None) -> dict[str, str]:
    """relative path -> sha256 of each file `code_sha256` covers."""
    return _fingerprint(root or PROJECT_ROOT, code_paths(study_module, root))[1]


def _fingerprint(root: Path, files: list[Path]) -> tuple[str, dict[str, str]]:
    return _digest([(str(p.relative_to(root).as_posix()), p.read_bytes()) for p in files])


def _digest(named: list[tuple[str, bytes]]) -> tuple[str, dict[str, str]]:
    digest = hashlib.sha256()
    per_file = {}
    for name, data in named:
        digest.update(name.encode())
        digest.update(b"\0")
        digest.update(data)
        per_file[name] = hashlib.sha256(data).hexdigest()
    return digest.hexdigest(), per_file


_MODELS_IMPORT = re.compile(r"^\s*(?:from\s+models\.(\w+)\s+import|import\s+models\.(\w+)|from\s+models\s+import\s+(\w+))",
                            re.MULTILINE)


def study_files(module: str, root: Path | None = None) -> list[Path]:
    """`models/<module>.py` and the models modules it imports, transitively, with models/__init__.py."""
    root = root or PROJECT_ROOT

    def read(rel: str) -> str | None:
        path = root / rel
        return path.read_text(encoding="utf-8") if path.is_file() else None

    return [root / rel for rel in _study_closure(module, read)]


def _study_closure(module: str, read: Callable[[str], str | None]) -> list[str]:
    """Relative paths of the study module's files (see `study_files`), read through `read`."""
    seen: dict[str, None] = {}
    todo = ["models/__init__.py", f"models/{module.removeprefix('models.')}.py"]
    while todo:
        rel = todo.pop()
        if rel in seen:
            continue
        text = read(rel)
        if text is None:
            continue
        seen[rel] = None
        for groups in _MODELS_IMPORT.findall(text):
            todo.append(f"models/{next(g for g in groups if g)}.py")
    return sorted(seen)


def current(study_module: str | None = None) -> Provenance:
    commit = git("rev-parse", "HEAD") or "unknown"
    if commit == "unknown":
        dirty = "unknown"
    else:
        # only the code that runs counts: evidence in runs/, contracts and docs do not make it dirty
        status = git("status", "--porcelain", "--untracked-files=no", "--", *CODE_PACKAGES, "pyproject.toml")
        dirty = "unknown" if status is None else ("true" if status else "false")
    fingerprint, files = _fingerprint(PROJECT_ROOT, code_paths(study_module))
    return Provenance(commit, dirty, fingerprint, files)


# ---------------------------------------------------------------------------------- staleness
UNKNOWN_FILES = "unknown files"


@dataclass(frozen=True)
class Staleness:
    """Whether the code a claim's evidence was computed with has changed since (like `dvc status`)."""

    stale: bool
    files: tuple[str, ...] = ()  # changed, added or removed files; ("unknown files",) when not nameable
    note: str = ""  # how the files were found, when not from the evidence's own per-file hashes


def staleness(evidence: dict, study_module: str | None, root: Path | None = None) -> Staleness:
    """Compare the code fingerprint the evidence recorded (`code_sha256`) with today's files. The
    changed files come from the evidence's `code_files` (per-file sha256, recorded since the claims
    index) or, for older evidence, from the tree of its recorded `git_commit`."""
    root = root or PROJECT_ROOT
    recorded = evidence.get("code_sha256")
    if study_module is None:
        return Staleness(True, (UNKNOWN_FILES,), f"study {evidence.get('study')!r} is not registered any more")
    try:
        now_sha, now_files = _fingerprint(root, code_paths(study_module, root))
    except OSError as e:
        return Staleness(True, (UNKNOWN_FILES,), f"cannot read today's code: {e}")
    if now_sha == recorded:
        return Staleness(False)
    then, note = evidence.get("code_files"), ""
    if not isinstance(then, dict) or not then:
        commit = str(evidence.get("git_commit") or "unknown")
        at_commit = files_at_commit(commit, study_module, root)
        if at_commit is None:
            return Staleness(True, (UNKNOWN_FILES,), f"recorded commit {commit[:12]} is not in this repository")
        then_sha, then = at_commit
        note = f"compared with commit {commit[:12]}"
        if then_sha != recorded:
            note += (" (whose files do not hash to the recorded code sha256: the evidence was computed with "
                     "changes that were never committed)")
    changed = sorted(p for p in set(then) | set(now_files) if then.get(p) != now_files.get(p))
    if not changed:
        return Staleness(True, (UNKNOWN_FILES,), note)
    # Stale means the study's code changed: the models it trains and measures. The platform's files
    # (gates/) change with every feature; `gates verify` re-derives every verdict with today's engine,
    # and replays and audits re-run training, so a platform change alone is noted, not stale.
    study = [p for p in changed if not p.startswith("gates/")]
    platform = len(changed) - len(study)
    if platform:
        note = _join(note, f"{platform} platform file{'s' if platform > 1 else ''} in gates/ changed too")
    return Staleness(bool(study), tuple(study), note)


def _join(a: str, b: str) -> str:
    return f"{a}; {b}" if a else b


@lru_cache(maxsize=64)
def files_at_commit(commit: str, study_module: str, root: Path | None = None) -> tuple[str, dict[str, str]] | None:
    """(code sha256, per-file sha256) of the files `code_sha256` covers, as they were at `commit`;
    None when the commit is not available (not a git checkout, a shallow clone, an unknown commit)."""
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
    study = _study_closure(study_module, lambda rel: text[rel].decode("utf-8", "replace") if rel in text else None)
    return _digest([(p, text[p]) for p in gates_files + study])


def _cat_blobs(blobs: list[str], root: Path) -> dict[str, bytes] | None:
    """blob id -> content, read with one `git cat-file --batch`."""
    try:
        out = subprocess.run(["git", "cat-file", "--batch"], cwd=root, input="\n".join(blobs).encode() + b"\n",
                             capture_output=True, timeout=30)
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
        found[header[0].decode()] = data[end + 1:end + 1 + size]
        at = end + 1 + size + 1
    return found


def describe_stale(files: list[str], shown: int = 6) -> str:
    """The changed files, the study's own (models/) first, the platform's (gates/) counted beyond `shown`."""
    study = [f for f in files if not f.startswith("gates/")]
    platform = [f for f in files if f.startswith("gates/")]
    parts = study[:]
    if platform:
        rest = len(platform) - shown
        parts += platform[:shown] + ([f"{rest} {'more ' if shown else ''}in gates/"] if rest > 0 else [])
    return ", ".join(parts) or "unknown files"
