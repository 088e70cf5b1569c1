"""Where a result came from: git commit and dirty flag, and a fingerprint of the code that ran."""

from __future__ import annotations

import hashlib
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


def code_sha256() -> str:
    """Fingerprint of the installed platform and studies (path + content of every .py file)."""
    digest = hashlib.sha256()
    for package in CODE_PACKAGES:
        root = PROJECT_ROOT / package
        for path in sorted(root.rglob("*.py")):
            digest.update(str(path.relative_to(PROJECT_ROOT)).encode())
            digest.update(b"\0")
            digest.update(path.read_bytes())
    return digest.hexdigest()


def current() -> Provenance:
    commit = _git("rev-parse", "HEAD") or "unknown"
    if commit == "unknown":
        dirty = "unknown"
    else:
        # evidence in runs/ and local stores do not make the code dirty
        status = _git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)runs")
        dirty = "unknown" if status is None else ("true" if status else "false")
    return Provenance(commit, dirty, code_sha256())
