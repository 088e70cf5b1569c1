"""The architecture as the guide draws it, checked on the source: packages in layers with a small
public face each, no import cycle (imports inside functions counted), gates/ free of torch and Ray at
module level, models/ free of MLflow."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# lowest first: a package may import from its own layer and the layers before it, never after
LAYERS = [
    "errors",
    "entities",
    "study",
    "contract",
    "inference",
    "design",
    "record",
    "execution",
    "verify",
    "cli",
]
PACKAGES = [p for p in LAYERS if (ROOT / "gates" / p / "__init__.py").is_file()]


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT / "gates").with_suffix("")
    parts = [p for p in rel.parts if p != "__init__"]
    return ".".join(["gates", *parts])


def _imports(path: Path, top_level_only: bool = False) -> list[tuple[int, str]]:
    """(line, imported module) of every import in the file (`from a import b` gives a.b and a)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    nodes = tree.body if top_level_only else ast.walk(tree)
    found = []
    for node in nodes:
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
            found += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
    return found


def _platform_files() -> list[Path]:
    return sorted(p for p in (ROOT / "gates").rglob("*.py") if "__pycache__" not in p.parts)


def _package_of(module: str) -> str | None:
    parts = module.split(".")
    if len(parts) >= 2 and parts[0] == "gates":
        return parts[1] if parts[1] in LAYERS else None
    return None


def test_no_import_cycle_between_platform_modules():
    modules = {_module_name(p): p for p in _platform_files()}
    graph = {
        name: {
            m
            for _, imported in _imports(path)
            for m in (imported, imported.rpartition(".")[0])
            if m in modules and m != name
        }
        for name, path in modules.items()
    }
    # a package's __init__ only names its private modules (imported lazily, by name): not an edge
    for name in graph:
        if (
            ROOT / "gates" / name.removeprefix("gates.").replace(".", "/") / "__init__.py"
        ).is_file():
            graph[name] = set()
    state, cycles = {}, []

    def visit(node, stack):
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                cycles.append(" -> ".join(stack[stack.index(nxt) :] + [nxt]))
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert not cycles, cycles


def test_packages_import_only_lower_layers():
    wrong = []
    for path in _platform_files():
        mine = _package_of(_module_name(path))
        if mine is None:
            continue
        for line, imported in _imports(path):
            theirs = _package_of(imported)
            if theirs and LAYERS.index(theirs) > LAYERS.index(mine):
                wrong.append(f"{path.relative_to(ROOT)}:{line}: {mine} imports {imported}")
    assert not wrong, wrong


def test_other_code_uses_a_package_s_public_face_only():
    """Outside a package (another package, the dashboard, the studies, the examples), only the names
    its face exports are imported: never `gates.<package>._<module>`. (Tests and benchmarks may reach
    inside: a benchmark of the verdict engine's levels switches off its seeds-needed search.)"""
    wrong = []
    for folder in ("gates", "models", "dashboard", "examples"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            mine = _package_of(_module_name(path)) if folder == "gates" else None
            for line, imported in _imports(path):
                parts = imported.split(".")
                if (
                    len(parts) >= 3
                    and parts[0] == "gates"
                    and parts[1] in PACKAGES
                    and parts[2].startswith("_")
                    and parts[1] != mine
                ):
                    wrong.append(f"{path.relative_to(ROOT)}:{line}: {imported}")
    assert not wrong, wrong


@pytest.mark.parametrize("package", PACKAGES)
def test_every_public_name_resolves(package):
    module = importlib.import_module(f"gates.{package}")
    assert module.__all__, package
    for name in module.__all__:
        assert getattr(module, name) is not None, f"gates.{package}.{name}"


# heavy or optional: imported inside the functions that need them (Ray is an optional extra)
NOT_AT_MODULE_LEVEL = ("torch", "ray")


def test_gates_never_imports_torch_or_ray_at_module_level():
    wrong = [
        f"{path.relative_to(ROOT)}:{line}: {imported}"
        for path in _platform_files()
        for line, imported in _imports(path, top_level_only=True)
        if imported.split(".")[0] in NOT_AT_MODULE_LEVEL
    ]
    assert not wrong, wrong


def test_models_never_import_mlflow():
    wrong = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in sorted((ROOT / "models").rglob("*.py"))
        for line, imported in _imports(path)
        if imported.split(".")[0] == "mlflow"
    ]
    assert not wrong, wrong


def test_every_import_of_a_platform_name_resolves():
    """Imports inside functions run only when the function does: each `from gates... import name`
    anywhere in the code, the benchmarks and the examples names something that exists."""
    wrong = []
    for folder in ("gates", "models", "dashboard", "benchmarks", "examples", "tests"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if not (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module):
                    continue
                if node.module.split(".")[0] != "gates":
                    continue
                try:
                    module = importlib.import_module(node.module)
                except ImportError as e:
                    wrong.append(f"{path.relative_to(ROOT)}:{node.lineno}: {e}")
                    continue
                for alias in node.names:
                    if alias.name == "*" or hasattr(module, alias.name):
                        continue
                    try:  # a submodule
                        importlib.import_module(f"{node.module}.{alias.name}")
                    except ImportError:
                        wrong.append(
                            f"{path.relative_to(ROOT)}:{node.lineno}: {node.module} has no {alias.name}"
                        )
    assert not wrong, wrong


# verify re-derives a verdict through gates.record.derive (below execution), as `gates run` and `gates
# rederive` do; only a replay (a `gates run` into a throwaway store) and `gates check`'s refusals (one
# implementation of them) ask the runner, from one module
VERIFY_ASKS_EXECUTION = {
    "gates/verify/_replay.py": {
        "ProcessBackend",
        "contract_errors",
        "job_threads",
        "run_plan",
    }
}


def test_verify_imports_execution_only_to_replay():
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / "gates" / "verify").rglob("*.py")):
        for _, imported in _imports(path):
            if _package_of(imported) == "execution" and imported != "gates.execution":
                found.setdefault(str(path.relative_to(ROOT)), set()).add(
                    imported.removeprefix("gates.execution.")
                )
    assert found == VERIFY_ASKS_EXECUTION


def test_one_derivation_for_run_rederive_and_verify():
    """`finish` (gates run), `rederive` (gates rederive) and verify's re-derivation call
    gates.record.derive, and only it calls the verdict engine on a claim (`judge_claim`)."""
    judging = {
        str(path.relative_to(ROOT))
        for path in _platform_files()
        if "judge_claim(" in path.read_text(encoding="utf-8")
        and path.name not in ("_judging.py", "__init__.py")
    }
    assert judging == {"gates/record/_derive.py"}
    callers = {}
    for path in _platform_files():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef):
                calls = {
                    c.func.id
                    for c in ast.walk(node)
                    if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)
                }
                if "derive" in calls:
                    callers.setdefault(str(path.relative_to(ROOT)), set()).add(node.name)
    assert callers == {
        "gates/execution/_runner.py": {"finish", "rederive"},
        "gates/verify/_verify.py": {"check_claim"},
    }


# a module stays readable in one sitting: past this, it holds more than one thing and splits by them
MODULE_LINES = 800


def test_no_platform_module_is_over_800_lines():
    long = {
        str(path.relative_to(ROOT)): n
        for path in _platform_files()
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MODULE_LINES
    }
    assert not long, long


def test_each_command_lives_in_its_own_module_under_cli_commands():
    """Every command on `gates` (and in its groups, `gates data`, `gates ci`) is defined in a module of
    gates/cli/commands/, one module per top-level command or group."""
    from typer.main import get_command

    from gates.cli import app

    owners: dict[str, str] = {}
    wrong = []
    for name, command in get_command(app).commands.items():
        # a group's commands (typer may vendor click: a group is what has commands)
        leaves = list(getattr(command, "commands", {}).values()) or [command]
        modules = {leaf.callback.__module__ for leaf in leaves}
        expected = f"gates.cli.commands.{name}"
        if modules != {expected}:
            wrong.append(f"{name}: {sorted(modules)}, expected {expected}")
        owners[name] = expected
    assert not wrong, wrong
    assert len(set(owners.values())) == len(owners)


def _face_of(package: str) -> tuple[dict[str, str], dict[str, str]]:
    """(`_FACE`: name -> private module, the TYPE_CHECKING block's imports: name -> module) of a
    package's `__init__`."""
    tree = ast.parse((ROOT / "gates" / package / "__init__.py").read_text(encoding="utf-8"))
    face, checked = {}, {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "_FACE":
            face = ast.literal_eval(node.value)
        if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING":
            for imp in node.body:
                assert isinstance(imp, ast.ImportFrom), package
                prefix = f"gates.{package}."
                assert imp.module.startswith(prefix), imp.module
                for alias in imp.names:
                    assert alias.asname is None, f"gates.{package}: {alias.name} renamed"
                    checked[alias.name] = imp.module[len(prefix) :]
    return face, checked


@pytest.mark.parametrize("package", PACKAGES)
def test_every_face_names_its_exports_for_type_checkers(package):
    """Each public name is imported under TYPE_CHECKING from the module that defines it under that
    very name (so go-to-definition lands on it; no export is renamed), and the lazy face loads the
    same names from the same modules."""
    face, checked = _face_of(package)
    assert face and face == checked, set(face.items()) ^ set(checked.items())


# a module or object of the platform named in prose: `gates.<module path>` (dotted) or a file path
_DOTTED_NAME = re.compile(r"(?<![\w/.\"'-])gates(?:\.[A-Za-z_]\w*)+")
_FILE_NAME = re.compile(r"(?<![\w.-])(?:gates|dashboard|benchmarks)/[\w/.-]*\.py\b")
# names that look like modules and are not: MLflow tags the platform writes, the entry-point group
_NOT_MODULES = {"gates.verdict", "gates.status", "gates.pilot", "gates.studies"}


def _module_like(ref: str) -> bool:
    """Whether `ref` names a module of gates (today's, or one from before the package split)."""
    modules = set(PACKAGES) | {p.stem for p in _platform_files()} | _FLAT_MODULES
    return ref.split(".")[1] in modules and ref not in _NOT_MODULES


# gates' modules before the package split, so prose still naming them is found
_FLAT_MODULES = set(
    "allocator attempts audit data_cli distributed files history judging ledger locks plan plots "
    "preflight provenance registry reporter rules runner sequential siblings store tracking tuning "
    "verdict yamlsafe claims".split()
)


def _resolves(ref: str) -> bool:
    parts = ref.split(".")
    for i in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            if not hasattr(found, attr):
                return False
            found = getattr(found, attr)
        return True
    return False


def test_prose_names_only_modules_that_exist():
    """Docstrings, comments and docs name today's modules: a reader following `gates.record._history`
    or gates/execution/_plan.py finds it (names from before the package split, or of a retired
    module, fail here)."""
    texts = [
        *_platform_files(),
        *sorted((ROOT / "dashboard").rglob("*.py")),
        *sorted((ROOT / "benchmarks").glob("*.py")),
        *sorted((ROOT / "docs").rglob("*.md")),
        ROOT / "README.md",
    ]
    wrong = []
    for path in texts:
        if "__pycache__" in path.parts:
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            where = f"{path.relative_to(ROOT)}:{number}"
            for m in _DOTTED_NAME.finditer(line):
                ref = m.group(0)
                if ref.startswith("gates.models.") or ref.endswith((".py", ".md", ".yaml")):
                    continue
                if _module_like(ref) and not _resolves(ref):
                    wrong.append(f"{where}: {ref}")
            wrong += [
                f"{where}: {m.group(0)}"
                for m in _FILE_NAME.finditer(line)
                if not (ROOT / m.group(0)).exists()
            ]
    assert not wrong, wrong


def test_one_entry_point_runs_a_plan():
    """A contract's plan runs through gates.execution.run_plan alone, whichever backend runs its jobs:
    the driver (`tasks.drive`) is called from run_plan and from Ray's `drive_on_ray` (connected to
    its cluster first), which only run_plan calls; the face offers no other way in."""
    import gates.execution

    callers: dict[str, set[str]] = {"drive": set(), "drive_on_ray": set()}
    for path in _platform_files():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "attr", getattr(node.func, "id", None))
                if name in callers:
                    callers[name].add(str(path.relative_to(ROOT)))
    assert callers == {
        "drive": {"gates/execution/_executor.py", "gates/execution/_ray.py"},
        "drive_on_ray": {"gates/execution/_executor.py"},
    }
    runs_a_plan = {n for n in gates.execution.__all__ if n.startswith(("run_", "execute"))}
    assert runs_a_plan - {"run_pilot", "run_tuning_trial"} == {"run_plan"}


# Records are read by attribute (issue #41): a string key naming a field of a record (gates.entities,
# the evidence's records) is read only where JSON becomes a record or a record meets JSON
RECORD_BOUNDARY = {
    "gates/entities/": "the records themselves",
    "gates/record/_evidence.py": "evidence.json's schema and the migrations of older formats",
    "gates/record/_index.py": "a claims-history line parsed and checked",
    "gates/record/_view.py": "the lenient view of evidence that may be malformed",
    "gates/record/_tracking.py": "MLflow's tags to and from records",
    "gates/record/_derive.py": "the derivation's JSON: a new run's facts laid out, evidence.json out",
    "gates/verify/_verify.py": "re-derived values compared with the JSON stored",
    "gates/verify/_isolation.py": "a re-run's request and metrics, JSON between two processes",
}
# keys that name a record's field but are read here from other data: (module, key) -> what data
NOT_RECORDS = {
    ("gates/cli/_printers.py", "seeds"): "a sequential design's planned looks (gates check)",
    ("gates/cli/_printers.py", "alpha_spent"): "a sequential design's planned looks",
    ("gates/cli/_printers.py", "lost"): "claims grouped by their check's status",
    ("gates/cli/_printers.py", "params"): "a preflight's parameter counts",
    ("gates/cli/commands/data.py", "description"): "a corpus's catalogue row",
    ("gates/contract/_errors.py", "type"): "pydantic's validation error",
    ("gates/contract/_load.py", "contract_sha256"): "a contract's own check, below the record",
    ("gates/execution/_preflight.py", "params"): "a study's parameter counts",
    ("gates/execution/_study_run.py", "where"): "a traceback's innermost frame",
    ("gates/execution/_tuning.py", "mlflow_run_id"): "an Optuna trial's user attributes",
    ("gates/execution/_tuning.py", "halt_reason"): "an Optuna trial's user attributes",
    ("gates/execution/_tuning.py", "seconds"): "an Optuna trial's user attributes",
    ("gates/record/_successors.py", "study"): "a contract's YAML",
    ("gates/record/_successors.py", "arms"): "a contract's YAML",
    ("gates/record/_successors.py", "kind"): "a contract's YAML",
    ("gates/verify/_claims.py", "arms"): "a contract's YAML",
    ("gates/verify/_claims.py", "supersedes"): "a contract's YAML",
}


def _record_fields() -> set[str]:
    import inspect

    import gates.entities as entities
    from gates.record import Evidence

    models = [getattr(entities, name) for name in entities.__all__] + [Evidence]
    return {
        name
        for model in models
        if inspect.isclass(model)
        for name in getattr(model, "model_fields", {})
    }


def _key_reads(path: Path, keys: set[str]):
    """(line, key) of each `x["key"]` and `x.get("key")` read in a module."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        key = None
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            if isinstance(node.slice, ast.Constant):
                key = node.slice.value
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr == "get" and node.args and isinstance(node.args[0], ast.Constant):
                key = node.args[0].value
        if isinstance(key, str) and key in keys:
            yield node.lineno, key


def test_records_are_read_by_attribute_outside_the_serialisation_boundary():
    keys = _record_fields()
    assert {"arm", "seed", "status", "metrics", "estimate", "verdict"} <= keys
    reads = []
    for path in _platform_files():
        name = str(path.relative_to(ROOT))
        if any(name.startswith(b) for b in RECORD_BOUNDARY):
            continue
        reads += [
            f"{name}:{line}: [{key!r}]"
            for line, key in _key_reads(path, keys)
            if (name, key) not in NOT_RECORDS
        ]
    assert not reads, "\n".join(reads)
    # every allowance is still needed: one no read names goes
    used = {
        (str(p.relative_to(ROOT)), key) for p in _platform_files() for _, key in _key_reads(p, keys)
    }
    assert set(NOT_RECORDS) <= used, set(NOT_RECORDS) - used


def test_the_architecture_page_lists_each_package_and_its_private_modules():
    """docs/architecture.md's table of packages, lowest layer first, is the code's: every package in
    its layer's order, each with exactly its private modules."""
    rows = re.findall(
        r"^\| `gates\.(\w+)` \|.*\| (.*) \|$",
        (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8"),
        flags=re.MULTILINE,
    )
    assert [pkg for pkg, _ in rows] == LAYERS
    for pkg, modules in rows:
        folder = ROOT / "gates" / pkg
        actual = {p.stem for p in folder.glob("_*.py") if p.stem != "__init__"}
        listed = set(re.findall(r"`(_\w+)`", modules))
        assert listed == actual, (pkg, sorted(actual - listed), sorted(listed - actual))
