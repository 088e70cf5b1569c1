"""Issue #23: a study from another installed package is part of its claims' code fingerprint.

`code_sha256` / `code_files` cover every file of the study's top-level package wherever it is installed,
named by its import name (`my_study/study.py`), so that editing the package makes its claims stale in
`gates status` and `gates verify` (and the dashboard watches its files). A package that happens to be
called `models` outside this repository is fingerprinted by its own files, not by this repository's
models/ closure. Each test works on its own copy of the site folder, in a subprocess whose sys.path
starts with it (the test process's own imports never decide where a package is)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import tomllib

from gates.record import PROJECT_ROOT, code_files
from gates.record._provenance import study_files
from tests.helpers import gates
from tests.test_plugin_study import CONTRACT, EXAMPLE, install_dist

# prints the fingerprint of a study module as the platform computes it, from a process whose sys.path
# starts with the site folder (PYTHONPATH, as `gates` runs there)
FINGERPRINT = """
import json, sys
from gates.record import _provenance as provenance
from gates.dashboard.data import _code_files

module = sys.argv[1]
package = getattr(provenance, "study_package", lambda module: None)(module)  # (issue #23: absent before)
print(json.dumps({"sha": provenance.code_sha256(module), "files": provenance.code_files(module),
                  "package": package, "watched": sorted(map(str, _code_files()))}))
"""

MODELS_PLUGIN = {  # a researcher's own package that happens to be called `models`
    "models/__init__.py": '"""Not this repository\'s models package."""\n',
    "models/circle.py": "from models.helpers import NOISE\n\nSTUDY = NOISE\n",
    "models/helpers.py": "NOISE = 0.05\n",
    "models/unrelated.py": "OTHER = 1\n",  # not imported by the study: covered all the same (whole package)
    "models/sub/__init__.py": "",
    "models/__pycache__/leftover.py": "IGNORED = 1\n",  # never fingerprinted
}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    """A site folder of this module's own, never edited: examples/my_study installed (its entry points from
    its own pyproject.toml). Tests edit copies of it (`site_copy`)."""
    site = tmp_path_factory.mktemp("pristine-site")
    project = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())["project"]
    install_dist(
        site, project["name"], project["version"], project["entry-points"]["gates.studies"]
    )
    shutil.copytree(
        EXAMPLE / "my_study", site / "my_study", ignore=shutil.ignore_patterns("__pycache__")
    )
    return site


@pytest.fixture
def site_copy(pristine, tmp_path) -> Path:
    site = tmp_path / "site"
    shutil.copytree(pristine, site)
    return site


def fingerprint(site: Path, cwd: Path, module: str) -> dict:
    done = gates(cwd, module, script=FINGERPRINT, site=site)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def own(files: dict) -> dict:
    """The study's part of code_files (everything but the platform's gates/)."""
    return {name: sha for name, sha in files.items() if not name.startswith("gates/")}


def test_the_example_study_package_is_fingerprinted_by_its_import_names(site_copy, tmp_path):
    study = site_copy / "my_study" / "study.py"
    before = fingerprint(site_copy, tmp_path, "my_study.study")
    assert own(before["files"]) == {
        "my_study/__init__.py": sha256(site_copy / "my_study" / "__init__.py"),
        "my_study/study.py": sha256(study),
    }
    assert before["package"] == "gates-my-study 0.1.0 (my_study)"
    assert (
        str(study) in before["watched"]
    )  # the dashboard re-checks its claims when the package changes

    study.write_text(
        study.read_text().replace("rng.random(n) < noise", "rng.random(n) < noise / 2")
    )
    after = fingerprint(site_copy, tmp_path, "my_study.study")
    assert after["sha"] != before["sha"]
    assert {n for n in before["files"] if before["files"][n] != after["files"].get(n)} == {
        "my_study/study.py"
    }

    # the names do not depend on where the package is installed: another copy hashes the same
    elsewhere = tmp_path / "elsewhere" / "site-packages"
    shutil.copytree(site_copy, elsewhere)
    assert fingerprint(elsewhere, tmp_path, "my_study.study")["sha"] == after["sha"]


def test_editing_the_installed_study_package_makes_its_claim_stale(site_copy, tmp_path):
    root = tmp_path / "project"
    (root / "contracts").mkdir(parents=True)
    shutil.copy(CONTRACT, root / "contracts")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    done = gates(
        root, "run", "contracts/circle-quadratic.yaml", "--tracking-uri", uri, site=site_copy
    )
    assert done.returncode == 0, done.stdout + done.stderr
    recorded = json.loads((root / "runs" / "circle-quadratic" / "evidence.json").read_text())
    assert "my_study/study.py" in recorded["code_files"]

    def status() -> dict:
        shown = gates(root, "status", "--json", site=site_copy)
        assert shown.returncode in (0, 1), shown.stderr
        return {r["id"]: r for r in json.loads(shown.stdout)}["circle-quadratic"]

    assert status()["stale"] is False

    study = site_copy / "my_study" / "study.py"
    original = study.read_bytes()
    study.write_text(
        study.read_text().replace("rng.random(n) < noise", "rng.random(n) < noise / 2")
    )
    row = status()
    assert row["stale"] is True and row["stale_files"] == ["my_study/study.py"]
    verified = gates(root, "verify", site=site_copy)
    assert verified.returncode == 0, (
        verified.stdout + verified.stderr
    )  # stale is noted, the claim holds
    assert "note: stale: code changed since its evidence: my_study/study.py" in verified.stdout
    strict = gates(root, "verify", "--strict-code", site=site_copy)
    assert (
        strict.returncode == 1
        and "stale (--strict-code): the code changed since its evidence: my_study/study.py"
        in strict.stdout
    )

    (site_copy / "my_study" / "extra.py").write_text("HELPER = 1\n")  # a file added to the package
    assert status()["stale_files"] == ["my_study/extra.py", "my_study/study.py"]

    study.write_bytes(original)  # back to what ran, the extra file gone: current again
    (site_copy / "my_study" / "extra.py").unlink()
    assert status()["stale"] is False

    (site_copy / "my_study" / "__init__.py").unlink()  # a file removed from the package
    row = status()
    assert row["stale"] is True and row["stale_files"] == ["my_study/__init__.py"]


def test_a_package_called_models_outside_this_repository_is_fingerprinted_by_its_own_files(
    tmp_path,
):
    site = tmp_path / "site"
    for rel, text in MODELS_PLUGIN.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(text)
    install_dist(site, "gates-circle-models", "0.2.0", {"circle": "models.circle:CircleStudy"})

    found = fingerprint(site, tmp_path, "models.circle")
    expected = {rel: sha256(site / rel) for rel in MODELS_PLUGIN if "__pycache__" not in rel}
    assert own(found["files"]) == expected  # the whole package, none of this repository's models/
    assert found["package"] == "gates-circle-models 0.2.0 (models)"
    (site / "models" / "unrelated.py").write_text("OTHER = 2\n")
    changed = fingerprint(site, tmp_path, "models.circle")
    assert changed["sha"] != found["sha"] and own(changed["files"])[
        "models/unrelated.py"
    ] == sha256(site / "models" / "unrelated.py")

    # where `models` is this repository's (this test process), a study keeps its import closure
    closure = [
        p.relative_to(PROJECT_ROOT).as_posix() for p in study_files("gates.models.c05_probe")
    ]
    assert sorted(own(code_files("gates.models.c05_probe"))) == closure


# evidence recorded before issue #23 for a study from elsewhere: its fingerprint covered gates/ and
# this repository's models/__init__.py, none of the study package's files
OLD_EVIDENCE = """
import hashlib, json
from gates.record import _provenance as provenance

files = {k: v for k, v in provenance.code_files("my_study.study").items() if k.startswith("gates/")}
files["models/__init__.py"] = hashlib.sha256((provenance.PROJECT_ROOT / "models/__init__.py").read_bytes()).hexdigest()
found = provenance.staleness({"study": "my_study", "code_sha256": "0" * 64, "code_files": files}, "my_study.study")
print(json.dumps({"stale": found.stale, "files": found.files, "note": found.note}))
"""


def test_evidence_recorded_before_the_package_was_fingerprinted_is_stale_and_says_so(
    pristine, tmp_path
):
    done = gates(tmp_path, script=OLD_EVIDENCE, site=pristine)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["stale"] is True
    assert found["files"] == ["models/__init__.py", "my_study/__init__.py", "my_study/study.py"]
    assert found["note"] == (
        "recorded before the code of the study's package my_study was fingerprinted: its "
        "code then is unknown"
    )
