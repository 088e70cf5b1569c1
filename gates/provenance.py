"""Where a result came from: git commit and dirty flag, and a fingerprint of the code that ran."""

from __future__ import annotations

import hashlib
import re
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

import gates

PROJECT_ROOT = Path(gates.__file__).resolve().parent.parent
CODE_PACKAGES = ("gates", "models")


@dataclass(frozen=True)
class Provenance:
    git_commit: str  # "unknown" outside a git checkout
    git_dirty: str  # "true" / "false" / "unknown"
    code_sha256: str  # sha256 over the source of gates/ and models/: what actually ran

    def as_dict(self) -> dict:
        return asdict(self)

    @property
    def short(self) -> str:
        dirty = "+dirty" if self.git_dirty == "true" else ""
        return f"{self.git_commit[:12]}{dirty}"


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def code_sha256(study_module: str | None = None) -> str:
    """Fingerprint of the code a run depends on: every file of `gates/`, plus the study's module and
    the `models` modules it imports (transitively). Editing one study does not invalidate another's
    finished runs; editing the platform or a shared module does."""
    files = sorted((PROJECT_ROOT / "gates").rglob("*.py"))
    files += study_files(study_module) if study_module else sorted((PROJECT_ROOT / "models").rglob("*.py"))
    digest = hashlib.sha256()
    for path in files:
        digest.update(str(path.relative_to(PROJECT_ROOT)).encode())
        digest.update(b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()


_MODELS_IMPORT = re.compile(r"^\s*(?:from\s+models\.(\w+)\s+import|import\s+models\.(\w+)|from\s+models\s+import\s+(\w+))",
                            re.MULTILINE)


def study_files(module: str) -> list[Path]:
    """`models/<module>.py` and the models modules it imports, transitively, with models/__init__.py."""
    root = PROJECT_ROOT / "models"
    seen: set[Path] = set()
    todo = [root / "__init__.py", root / f"{module.removeprefix('models.')}.py"]
    while todo:
        path = todo.pop()
        if path in seen or not path.is_file():
            continue
        seen.add(path)
        for groups in _MODELS_IMPORT.findall(path.read_text(encoding="utf-8")):
            todo.append(root / f"{next(g for g in groups if g)}.py")
    return sorted(seen)


def current(study_module: str | None = None) -> Provenance:
    commit = _git("rev-parse", "HEAD") or "unknown"
    if commit == "unknown":
        dirty = "unknown"
    else:
        # only the code that runs counts: evidence in runs/, contracts and docs do not make it dirty
        status = _git("status", "--porcelain", "--untracked-files=no", "--", *CODE_PACKAGES, "pyproject.toml")
        dirty = "unknown" if status is None else ("true" if status else "false")
    return Provenance(commit, dirty, code_sha256(study_module))
