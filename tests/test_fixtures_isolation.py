"""No test reads the repository's runs/ folder (issue #23): `gates run`, users and re-derivations by a
newer verdict engine rewrite it. Tests that need recorded claims copy the frozen ones in
tests/fixtures/claims (tests.conftest.copy_claims / frozen_evidence); this file keeps it so, and keeps
the frozen copies frozen."""

from __future__ import annotations

import ast
import hashlib
import json
import re
from pathlib import Path

import pytest

from tests.conftest import FIXTURE_CLAIMS, FIXTURE_CONTRACTS, FIXTURE_RUNS, FIXTURES, ROOT

TESTS = ROOT / "tests"
ROOTISH = r"\w*ROOT\w*|Path\(__file__\)(?:\.resolve\(\))?\.(?:parent\.parent|parents\[1\])"
# the repository's runs folder reached from a name for the repository root (ROOT, PROJECT_ROOT,
# Path(__file__).parent.parent): ROOT / "runs", ROOT.joinpath("runs"), os.path.join(ROOT, "runs")
PATTERNS = [
    re.compile(rf"(?:{ROOTISH})\s*/\s*f?[\"']runs\b"),
    re.compile(rf"(?:{ROOTISH})\s*\.joinpath\(\s*f?[\"']runs\b"),
    re.compile(rf"join\(\s*(?:str\()?(?:{ROOTISH})\)?\s*,\s*f?[\"']runs\b"),
]
# gates commands that read runs/ in their working directory (or the default --runs-dir)
READS_RUNS = {
    "check",
    "run",
    "verify",
    "rederive",
    "status",
    "withdraw",
    "render",
    "dashboard",
    "report",
}


def _is_root(node: ast.AST) -> bool:
    if isinstance(node, ast.Name):
        return node.id.endswith("ROOT")
    if isinstance(node, ast.Attribute):
        return node.attr.endswith("ROOT")
    return False


def _strings(node: ast.AST) -> set[str]:
    return {
        n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)
    }


def offences(source: str, name: str = "<test>") -> list[str]:
    """Where `source` reads the repository's runs/: a path to it, a chdir into the repository root, or a
    gates command that reads runs/ started in the repository root (cwd=ROOT, or ROOT as the folder
    argument of a helper such as run_cli(ROOT, "status"))."""
    found = []
    for number, line in enumerate(source.splitlines(), 1):
        if any(p.search(line) for p in PATTERNS):
            found.append(f"{name}:{number}: {line.strip()}")
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        callee = (
            node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        )
        if callee == "chdir" and node.args and _is_root(node.args[0]):
            found.append(f"{name}:{node.lineno}: chdir into the repository root")
        in_root = any(k.arg == "cwd" and _is_root(k.value) for k in node.keywords) or any(
            _is_root(a) for a in node.args
        )
        if in_root and callee != "chdir" and _strings(node) & READS_RUNS:
            commands = ", ".join(sorted(_strings(node) & READS_RUNS))
            found.append(
                f"{name}:{node.lineno}: `gates {commands}` in the repository root reads its runs/"
            )
    found += _aliases(ast.parse(source), name)
    return found


def _aliases(tree: ast.AST, name: str) -> list[str]:
    """`root = provenance.PROJECT_ROOT` then `root / "runs"`, within one function (or the module)."""
    found = []
    functions = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)

    def own_nodes(
        scope: ast.AST,
    ) -> list[ast.AST]:  # the scope's nodes, not those of functions inside it
        nodes, todo = [], list(ast.iter_child_nodes(scope))
        while todo:
            node = todo.pop()
            nodes.append(node)
            if not isinstance(node, functions):
                todo.extend(ast.iter_child_nodes(node))
        return nodes

    for scope in [tree] + [n for n in ast.walk(tree) if isinstance(n, functions)]:
        body = own_nodes(scope)
        aliases = {
            t.id
            for n in body
            if isinstance(n, ast.Assign) and _is_root(n.value)
            for t in n.targets
            if isinstance(t, ast.Name)
        }
        for n in body:
            if (
                isinstance(n, ast.BinOp)
                and isinstance(n.op, ast.Div)
                and isinstance(n.left, ast.Name)
                and n.left.id in aliases
                and isinstance(n.right, ast.Constant)
                and str(n.right.value).split("/")[0] == "runs"
            ):
                found.append(
                    f"{name}:{n.lineno}: {n.left.id} / {n.right.value!r} (the repository root's runs/)"
                )
    return found


def test_no_test_reads_the_repositorys_runs_folder():
    found = []
    for path in sorted(TESTS.rglob("*.py")):
        if path == Path(__file__).resolve():
            continue
        found += offences(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))
    assert found == [], (
        "tests must not read the repository's runs/ (it is rewritten by `gates run`, users and "
        "new verdict engines); copy frozen claims with tests.conftest.copy_claims instead:\n"
        + "\n".join(found)
    )


@pytest.mark.parametrize(
    "snippet",
    [
        'ev = json.loads((ROOT / "runs" / "c05" / "evidence.json").read_text())',
        'for p in sorted((provenance.PROJECT_ROOT / "runs").glob("*/evidence.json")): pass',
        'x = Path(__file__).resolve().parent.parent / "runs"',
        'x = ROOT.joinpath("runs", "c05")',
        'x = os.path.join(ROOT, "runs")',
        'done = subprocess.run([sys.executable, "-m", "gates", "status", "--json"], cwd=ROOT)',
        'done, imported = run_cli(ROOT, "status", "--json")',
        "monkeypatch.chdir(ROOT)",
        'def f():\n    root = provenance.PROJECT_ROOT\n    return sorted((root / "runs").glob("*"))',
        'site = Site(ROOT / "runs", ROOT / "contracts", "sqlite://", "http://127.0.0.1:5000")',
    ],
)
def test_the_scan_finds_each_way_of_reading_it(snippet):
    assert offences(snippet), snippet


@pytest.mark.parametrize(
    "snippet",
    [
        'runs = tmp_path / "runs"',
        'evidence = project / "runs" / "c05" / "evidence.json"',
        'run_contract(loaded, uri, root / "runs")',
        'data = yaml.safe_load((ROOT / "contracts" / "c05.yaml").read_text())',
        'done, imported = run_cli(ROOT, "studies")',
        'done = subprocess.run([sys.executable, "-c", code], cwd=ROOT)',
        'done = subprocess.run([sys.executable, "-m", "gates", "status"], cwd=project)',
        'def f(tmp_path):\n    root = tmp_path / "p"\n    return root / "runs"',
        'def f():\n    root = ROOT\n\ndef g(root):\n    return root / "runs"',
    ],
)
def test_the_scan_leaves_temporary_projects_alone(snippet):
    assert offences(snippet) == [], snippet


# ------------------------------------------------------------------------------ the frozen claims
def test_the_frozen_claims_are_unchanged():
    """Every file under tests/fixtures/claims is the one listed in its SHA256SUMS, and nothing else is
    there (no runs/INDEX.jsonl: a subset of the history is no chain; copy_claims builds one)."""
    listed = {}
    for line in (FIXTURES / "SHA256SUMS").read_text().splitlines():
        digest, name = line.split(maxsplit=1)
        listed[name] = digest
    present = {
        str(p.relative_to(FIXTURES)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(FIXTURES.rglob("*"))
        if p.is_file() and p.name != "SHA256SUMS"
    }
    assert present == listed, (
        "tests/fixtures/claims changed: frozen copies are never rewritten "
        "(tests/fixtures/README.md)"
    )


def test_each_frozen_claim_is_a_contract_and_its_evidence():
    assert len(FIXTURE_CLAIMS) >= 8
    assert sorted(p.name for p in FIXTURE_RUNS.iterdir()) == list(FIXTURE_CLAIMS)
    from gates.contract import load_contract

    for contract_id in FIXTURE_CLAIMS:
        ev = json.loads((FIXTURE_RUNS / contract_id / "evidence.json").read_text())
        assert (FIXTURE_RUNS / contract_id / "verdict.md").is_file()
        loaded = load_contract(FIXTURE_CONTRACTS / f"{contract_id}.yaml")
        assert (ev["contract_id"], ev["contract_sha256"]) == (contract_id, loaded.sha256), (
            contract_id
        )
