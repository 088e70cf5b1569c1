"""`gates` as tests run it: in a process of its own, as a user runs it (`gates`), or in this process
(`run_main`, its output through pytest's capsys)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def gates(
    cwd: Path,
    *args: str,
    env: dict[str, str] | None = None,
    columns: int = 250,
    pythonpath: Sequence[Path | str] = (ROOT,),
    site: Path | None = None,
    script: str | None = None,
    prefix: Sequence[str] = (),
    safe_path: bool = True,
    timeout: float = 600,
    **run_options,
) -> subprocess.CompletedProcess:
    """`gates ARGS` in `cwd`, in a process of its own: (returncode, stdout, stderr) as text.

    env: variables added to (or replacing) this process's. columns: the terminal width rich lays out for
    (wide: tables unwrapped). pythonpath: the folders of PYTHONPATH, in order (ROOT: this platform).
    site: a folder where study packages are installed (their dist-info), put first on PYTHONPATH, and
    the studies' cache (TREEHEAP_GATES_CACHE) in cwd/cache, the test's own. script: Python code run
    instead of `python -m gates`, ARGS in its sys.argv (a driver that changes something, then calls
    gates.cli.main). prefix: a command that starts it (e.g. unshare). safe_path: PYTHONSAFEPATH, the
    working folder not put on sys.path, as the `gates` script does not put it there (a project with a
    folder named gates/ must not shadow the platform). The project's own MLflow store is used
    (sqlite:///mlflow.db): a MLFLOW_TRACKING_URI of the caller's is not passed on. run_options:
    subprocess.run's (preexec_fn)."""
    environ = {**os.environ, "COLUMNS": str(columns)}
    environ.pop("MLFLOW_TRACKING_URI", None)
    if site is not None:
        pythonpath = [site, *pythonpath]
        environ["TREEHEAP_GATES_CACHE"] = str(Path(cwd) / "cache")
    environ["PYTHONPATH"] = os.pathsep.join(map(str, pythonpath))
    if safe_path:
        environ["PYTHONSAFEPATH"] = "1"
    environ.update(env or {})
    launch = [sys.executable, "-c", script] if script else [sys.executable, "-m", "gates"]
    return subprocess.run(
        [*prefix, *launch, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env=environ,
        timeout=timeout,
        **run_options,
    )


def run_main(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    """`gates ARGS` through gates.cli.main() in this process, as the console script calls it: (exit code,
    stdout, stderr)."""
    from gates.cli import main

    monkeypatch.setattr(sys, "argv", ["gates", *args])
    with pytest.raises(SystemExit) as exit_:
        main()
    said = capsys.readouterr()
    return exit_.value.code, said.out, said.err
