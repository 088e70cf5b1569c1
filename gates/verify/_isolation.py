"""One commit's code, run alone: a clean checkout of a commit and a fresh process that imports the
project from it and nothing else (`gates certify`'s re-run under the code a claim stands on, and
benchmarks/training_throughput.py's two sides).

A checkout is `git archive COMMIT` (the whole tree) unpacked into a temporary folder, as a user would
have it. The process (`python .../_isolation.py --code CHECKOUT ...`, a script: this file imports
nothing of the project, so running it loads no `gates` of today) isolates itself before anything of
the project is imported (`isolate`): it drops the editable install's finder (`__editable__*.pth`,
which maps `gates` and `gates.models` to the folder the project was installed from) and any source
tree of the project from `sys.path`, puts the checkout first, lays out its packages as that commit's
pyproject.toml installs them (`gates.models` = models/ since the namespace move; a top-level `models`
before it), and makes the installed metadata (the `gates.studies` entry points) that commit's
(`write_metadata`). Afterwards `imported_from` checks that every loaded module of the project
(gates*, models*) and every entry point lies inside the checkout, and fails otherwise.

The re-run (`--rerun REQUEST.json`): the study named, from the checkout's entry point, trained bare
(`NullReporter`, no MLflow, no stop rule) on the CPU thread count given, with the config as the
contract wrote it (fields the commit's Config fills in itself are left out); its final metrics are the
last line of stdout, as JSON (non-finite values as null, as evidence stores them).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

PROJECT = ("gates", "models", "dashboard")  # the top-level names the project's code has had
DISTRIBUTION = "treeheap-gates"
STUDIES = "gates.studies"  # the entry-point group


def checkout(root: Path, ref: str, into: Path) -> tuple[Path, str]:
    """`git archive REF` (the whole tree) of the repository at `root`, unpacked into `into`:
    (folder, commit). Raises RuntimeError (git's message) where git or REF is missing."""
    commit = subprocess.run(
        ["git", "rev-parse", "--verify", f"{ref}^{{commit}}"],
        cwd=root,
        capture_output=True,
        text=True,
    )
    if commit.returncode != 0:
        raise RuntimeError(f"no commit {ref} in {root}: {commit.stderr.strip()[:200]}")
    archive = subprocess.run(
        ["git", "archive", commit.stdout.strip()], cwd=root, capture_output=True
    )
    if archive.returncode != 0:
        raise RuntimeError(f"git archive {ref}: {archive.stderr.decode().strip()[:200]}")
    into.mkdir(parents=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    write_metadata(into)
    return into, commit.stdout.strip()


def layout(code: Path) -> dict:
    """How the commit's pyproject.toml installs its packages: {"mapped": {package: folder}} from
    [tool.setuptools.package-dir] (e.g. gates.models = models), "hidden": the folders installed only
    under another name (no top-level `models` then), "entry_points" and "version"."""
    import tomllib

    project = tomllib.loads((code / "pyproject.toml").read_text())
    package_dir = project.get("tool", {}).get("setuptools", {}).get("package-dir", {})
    mapped = {name: str(code / folder) for name, folder in package_dir.items() if name}
    hidden = sorted(
        {folder.split("/")[0] for name, folder in package_dir.items() if name and name != folder}
    )
    return {
        "mapped": mapped,
        "hidden": hidden,
        "version": project["project"]["version"],
        "entry_points": project["project"].get("entry-points", {}),
    }


def write_metadata(code: Path) -> None:
    """A dist-info of the commit in its checkout (first on sys.path in the isolated process, so
    importlib.metadata finds it before the installed one): its version and its entry points, as
    installing it would record them."""
    found = layout(code)
    info = code / f"{DISTRIBUTION.replace('-', '_')}-{found['version']}.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {DISTRIBUTION}\nVersion: {found['version']}\n"
    )
    (info / "entry_points.txt").write_text(
        "".join(
            f"[{group}]\n"
            + "".join(f"{name} = {target}\n" for name, target in points.items())
            + "\n"
            for group, points in found["entry_points"].items()
        )
    )


def _editable(thing) -> bool:
    module = getattr(thing, "__module__", None) or type(thing).__module__
    return "__editable__" in (module or "")


def _project_root(entry: str) -> bool:
    """A sys.path entry holding a source tree of the project (the installed repository, another
    checkout): never wanted. Site-packages stays: an installed (not editable) copy there is shadowed
    by the checkout, and `imported_from` checks after the run."""
    try:
        folder = Path(entry or ".").resolve()
    except OSError:
        return False
    return (folder / "pyproject.toml").exists() and (folder / "gates" / "__init__.py").exists()


class _Layout:
    """A meta-path finder with the commit's package-dir mapping (gates.models -> <checkout>/models, as
    the installed layout has it), refusing the folders installed only under another name."""

    def __init__(self, mapped: dict, hidden: list):
        self.mapped, self.hidden = mapped, set(hidden)

    def find_spec(self, fullname, path=None, target=None):
        import importlib.util

        if fullname in self.hidden:
            raise ModuleNotFoundError(
                f"No module named {fullname!r} (installed as gates.{fullname})"
            )
        if fullname in self.mapped:
            folder = Path(self.mapped[fullname])
            return importlib.util.spec_from_file_location(
                fullname, folder / "__init__.py", submodule_search_locations=[str(folder)]
            )
        return None


def isolate(code: Path) -> None:
    """Make this process import the project from `code` alone (see the module docstring)."""
    import importlib

    loaded = [m for m in sys.modules if m.split(".")[0] in PROJECT]
    if loaded:
        raise RuntimeError(f"the project was imported before isolating: {loaded}")
    here = str(Path(__file__).resolve().parent)  # a script's folder is sys.path[0]: gates/verify
    sys.meta_path[:] = [f for f in sys.meta_path if not _editable(f)]
    sys.path_hooks[:] = [h for h in sys.path_hooks if not _editable(h)]
    sys.path[:] = [
        p
        for p in sys.path
        if "__editable__" not in p and not _project_root(p) and os.path.abspath(p or ".") != here
    ]
    sys.path.insert(0, str(code))
    found = layout(code)
    sys.meta_path.insert(0, _Layout(found["mapped"], found["hidden"]))
    sys.path_importer_cache.clear()
    importlib.invalidate_caches()


def imported_from(code: Path, study: str | None) -> dict:
    """The resolved files of gates, the studies package and `study`'s module; raises where any loaded
    module of the project or any `gates.studies` entry point lies outside `code`."""
    import importlib.util
    from importlib.metadata import entry_points

    code = code.resolve()
    outside = []
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        if name.split(".")[0] in PROJECT and file and not Path(file).resolve().is_relative_to(code):
            outside.append(f"{name}: {file}")
    for point in entry_points(group=STUDIES):
        spec = importlib.util.find_spec(point.module)
        if spec is None or not Path(spec.origin).resolve().is_relative_to(code):
            outside.append(f"entry point {point.name} = {point.value}: {spec and spec.origin}")
    if outside:
        raise RuntimeError(f"code from outside the checkout {code}:\n" + "\n".join(outside))
    files = {}
    for name in ("gates", "gates.models", "models"):
        module = sys.modules.get(name)
        if module is not None:
            files[name] = str(Path(module.__file__).resolve())
    if study is not None:
        files[study] = str(Path(sys.modules[study].__file__).resolve())
    return files


def run_isolated(code: Path, args: list[str], script: Path | None = None) -> dict:
    """Run `script` (default: this file) with `args` in a fresh process that imports the project from
    the checkout `code` alone; the JSON of its last stdout line. Raises RuntimeError with its stderr's
    end when it fails."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    command = [sys.executable, str(script or Path(__file__).resolve()), "--code", str(code), *args]
    done = subprocess.run(command, env=env, capture_output=True, text=True, cwd=code)
    if done.returncode != 0:
        raise RuntimeError(done.stderr.strip()[-2000:] or f"exit {done.returncode}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def rerun_at(
    root: Path,
    commit: str,
    study: str,
    config: dict,
    seed: int,
    steps: int,
    eval_every: int,
    threads: int | None,
) -> dict[str, float | None]:
    """Train one run bare under the code of `commit` (a clean checkout of the repository at `root`)
    in a process of its own: the final metrics (non-finite as None)."""
    request = {
        "study": study,
        "config": config,
        "seed": seed,
        "steps": steps,
        "eval_every": eval_every,
        "threads": threads,
    }
    with tempfile.TemporaryDirectory(prefix="gates-reference-") as tmp:
        code, _ = checkout(Path(root), commit, Path(tmp) / "code")
        (Path(tmp) / "request.json").write_text(json.dumps(request))
        return run_isolated(code, ["--rerun", str(Path(tmp) / "request.json")])["metrics"]


def _rerun(code: Path, request: dict) -> dict:
    """In the isolated process: the requested run under the checkout's code."""
    from importlib.metadata import entry_points

    from gates.study import Budget, NullReporter, cpu_threads

    points = {p.name: p for p in entry_points(group=STUDIES)}
    if request["study"] not in points:
        raise RuntimeError(f"study {request['study']!r} is not registered at this commit")
    study = points[request["study"]].load()()
    config = study.Config.model_validate(request["config"])
    budget = Budget(request["steps"], request["eval_every"])
    with cpu_threads(request["threads"]):
        final = study.run(config, request["seed"], NullReporter(budget))
    metrics = {}
    for name, value in dict(final).items():
        value = float(value)
        metrics[name] = value if math.isfinite(value) else None
    module = points[request["study"]].module
    return {"metrics": metrics, "imports": imported_from(code, module)}


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--code", type=Path, required=True)
    parser.add_argument("--rerun", type=Path, required=True)
    args = parser.parse_args()
    isolate(args.code)
    print(json.dumps(_rerun(args.code, json.loads(args.rerun.read_text()))))
