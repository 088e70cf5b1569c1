"""Issue #23: the platform's guarantees hold on a researcher's own study, installed from a package of its
own and run in a project of its own (the README's example, examples/my_study, and a copy with a bug).

- a study whose arm raises in every run stops early, and the verdict is invalid (never supported,
  refuted or inconclusive), naming the arm, the counts and the first error's last frame;
- fixing the bug and running again does not reuse the runs of the old code, reproduces and compares
  instead of overwriting, and records a new attempt only with --record --reason; every attempt stays
  visible in the evidence, verdict.md, the claims history and `gates status`;
- a contract outside the project's contracts folder is refused; `gates check` refuses a contract edited
  after its evidence; a re-run says what it reused and writes nothing under runs/.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import tomllib

from tests.helpers import gates
from tests.test_plugin_study import CONTRACT, EXAMPLE, install_dist

ROOT = Path(__file__).resolve().parent.parent

# the example study with a bug in one arm: it raises on every run while BUG is True
BUGGY = '''
from my_study.study import MyStudy

BUG = True


class BuggyStudy(MyStudy):
    """The example study; its quadratic arm crashes while BUG is set."""

    name = "circle_bug"

    def run(self, config, seed, reporter):
        if BUG and config.features == "quadratic":
            raise ValueError(f"features of shape {(400, 6)} do not match the weights (5,)")
        return super().run(config, seed, reporter)
'''


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """A site folder with examples/my_study installed and a package `circle_bug` (its own distribution)."""
    site = tmp_path_factory.mktemp("trust-site")
    project = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())["project"]
    install_dist(
        site, project["name"], project["version"], project["entry-points"]["gates.studies"]
    )
    shutil.copytree(
        EXAMPLE / "my_study", site / "my_study", ignore=shutil.ignore_patterns("__pycache__")
    )
    (site / "circle_bug").mkdir()
    (site / "circle_bug" / "__init__.py").write_text("")
    (site / "circle_bug" / "study.py").write_text(BUGGY)
    install_dist(site, "circle-bug", "0.1.0", {"circle_bug": "circle_bug.study:BuggyStudy"})
    return site


def project(tmp_path: Path, study: str = "my_study", contract_id: str = "circle-quadratic") -> Path:
    root = tmp_path / "project"
    (root / "contracts").mkdir(parents=True)
    text = CONTRACT.read_text().replace("id: circle-quadratic", f"id: {contract_id}")
    (root / "contracts" / f"{contract_id}.yaml").write_text(
        text.replace("study: my_study", f"study: {study}")
    )
    return root


def run(site: Path, root: Path, contract_id: str, *args: str):
    return gates(
        root,
        "run",
        f"contracts/{contract_id}.yaml",
        "--tracking-uri",
        f"sqlite:///{root / 'mlflow.db'}",
        *args,
        site=site,
    )


def evidence(root: Path, contract_id: str) -> dict:
    return json.loads((root / "runs" / contract_id / "evidence.json").read_text())


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under runs/ (the lock file left aside)."""
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted((root / "runs").rglob("*"))
        if p.is_file() and not p.name.endswith(".lock")
    }


@pytest.fixture(scope="module")
def buggy(site, tmp_path_factory) -> dict:
    """circle-bug run once with the bug in place: its first attempt."""
    root = project(tmp_path_factory.mktemp("buggy"), "circle_bug", "circle-bug")
    first = run(site, root, "circle-bug")
    return {"root": root, "first": first}


def test_an_arm_that_fails_every_run_stops_early_and_the_verdict_is_invalid(buggy):
    assert buggy["first"].returncode == 0, buggy["first"].stderr
    ev = evidence(buggy["root"], "circle-bug")
    assert ev["verdict"] == "invalid"
    quadratic = [r for r in ev["runs"] if r["arm"] == "quadratic"]
    assert [r["status"] for r in quadratic] == ["failed"] * 3 + [
        "skipped"
    ] * 3  # stop_rules.failures: 3 in a row
    assert all(
        r["mlflow_run_id"] is None and r["metrics"] == {} for r in quadratic[3:]
    )  # never started
    error = quadratic[0]["error"]
    assert error["type"] == "ValueError" and re.fullmatch(
        r"circle_bug/study\.py:\d+", error["where"]
    )
    reason = next(r for r in ev["reasons"] if r.startswith("arm quadratic did not run as designed"))
    assert (
        "0 of 6 runs completed (3 failed, 3 not run after its arm kept failing); first error: "
        f"{error['where']}: ValueError: features of shape (400, 6) do not match the weights (5,)"
    ) in reason
    assert ev["not_run"][0]["arm"] == "quadratic" and ev["settle"][0].startswith(
        "arm quadratic: find and fix"
    )
    # messages count completed runs as they are: linear completed all 6 of its runs
    assert all(r["status"] == "completed" for r in ev["runs"] if r["arm"] == "linear")
    assert not any(
        "only 0 completed seeds of arm linear" in line for line in json.dumps(ev).split('"')
    )
    assert (
        "INVALID  circle-bug" in buggy["first"].stdout
        and "reused 0 of 12 runs, trained 9, 3 not run" in buggy["first"].stdout
    )


def test_fixing_the_bug_keeps_the_first_attempt_on_the_record(site, buggy, tmp_path):
    """Fixing the study's code and running again trains every run anew (its code changed), compares with the
    record instead of replacing it, and records a second attempt only with a reason; the first stays visible."""
    fixed_site = tmp_path / "site"
    shutil.copytree(site, fixed_site)
    source = fixed_site / "circle_bug" / "study.py"
    source.write_text(source.read_text().replace("BUG = True", "BUG = False"))
    root = tmp_path / "project"
    shutil.copytree(buggy["root"], root)
    (root / "mlflow.db").unlink()  # the copy's store points elsewhere; keep to this project's own
    shutil.copy(buggy["root"] / "mlflow.db", root / "mlflow.db")
    before = snapshot(root)

    status = json.loads(gates(root, "status", "--json", site=fixed_site).stdout)[0]
    assert status["stale"] is True and status["stale_files"] == ["circle_bug/study.py"]

    again = run(fixed_site, root, "circle-bug")
    assert again.returncode == 1, (
        again.stdout + again.stderr
    )  # the record does not reproduce under the new code
    assert "reused 0 of 12 runs, trained 12; 6 runs recorded under other code" in again.stdout
    assert (
        "does NOT reproduce: this run gives SUPPORTED, the record says INVALID (attempt 1"
        in again.stdout
    )
    assert snapshot(root) == before  # nothing written under runs/

    no_reason = run(fixed_site, root, "circle-bug", "--record")
    assert no_reason.returncode == 2 and "Traceback" not in no_reason.stderr
    assert len(no_reason.stderr.splitlines()) == 1 and "needs --reason" in no_reason.stderr

    recorded = run(
        fixed_site,
        root,
        "circle-bug",
        "--record",
        "--reason",
        "fixed the shape bug in circle_bug/study.py",
    )
    assert recorded.returncode == 0, recorded.stderr
    assert (
        "reused 12 of 12 runs, trained 0" in recorded.stdout
        and "recorded attempt 2" in recorded.stdout
    )
    ev = evidence(root, "circle-bug")
    assert ev["verdict"] == "supported" and ev["attempt"]["number"] == 2
    assert ev["attempt"]["reason"] == "fixed the shape bug in circle_bug/study.py"
    first = ev["attempt"]["earlier"][0]
    assert first["number"] == 1 and first["verdict"] == "invalid"
    assert any("arm quadratic did not run as designed" in line for line in first["why"])
    report = (root / "runs" / "circle-bug" / "verdict.md").read_text()
    assert "Attempt 2 at this claim, recorded because: fixed the shape bug" in report
    assert "- attempt 1: **INVALID**" in report
    index = [json.loads(line) for line in (root / "runs" / "INDEX.jsonl").read_text().splitlines()]
    assert [(e["kind"], e["verdict"], e["reason"]) for e in index] == [
        ("recorded", "invalid", ""),
        ("recorded", "supported", "fixed the shape bug in circle_bug/study.py"),
    ]
    listed = json.loads(gates(root, "status", "--json", site=fixed_site).stdout)[0]
    assert listed["attempts"] == 2 and listed["earlier_attempts"][0].startswith("attempt 1 invalid")
    table = gates(root, "status", "-v", site=fixed_site)
    assert "attempt 2; earlier: attempt 1 invalid" in " ".join(table.stdout.split())
    verified = gates(root, "verify", site=fixed_site)
    assert verified.returncode == 0 and "ok circle-bug: supported" in verified.stdout, (
        verified.stdout
    )


def test_an_attempt_hidden_from_the_evidence_is_caught(buggy, tmp_path):
    """The evidence's own account of the attempts must agree with the claims history: evidence that calls
    itself attempt 1 while the history holds two attempts of the claim loses it."""
    from gates.record import check_history, record_entry

    root = tmp_path / "project"
    shutil.copytree(buggy["root"], root)
    path = root / "runs" / "circle-bug" / "evidence.json"
    assert check_history(root / "runs", {}).get("circle-bug") is None
    record_entry(root / "runs", path, "recorded", "a second attempt whose evidence hides the first")
    problems = " ".join(check_history(root / "runs", {})["circle-bug"])
    assert (
        "the evidence says it is attempt 1, the claims history (INDEX.jsonl) has 2 attempts"
        in problems
    )


@pytest.fixture(scope="module")
def recorded(site, tmp_path_factory) -> dict:
    """The README's example contract run once in a project of its own."""
    root = project(tmp_path_factory.mktemp("example"))
    first = run(site, root, "circle-quadratic")
    assert first.returncode == 0, first.stderr
    return {"root": root, "first": first}


def test_the_example_contract_follows_the_design_rules_and_is_supported(recorded):
    ev = evidence(recorded["root"], "circle-quadratic")
    assert ev["verdict"] == "supported" and ev["attempt"] == {
        "number": 1,
        "reason": "",
        "earlier": [],
    }
    assert ev["design"]["blind"]["linear"].startswith("A linear boundary is a line")
    report = (recorded["root"] / "runs" / "circle-quadratic" / "verdict.md").read_text()
    assert "- linear fails by construction: A linear boundary is a line" in report
    assert all(r["converged"] for r in ev["runs"])
    assert "reused 0 of 12 runs, trained 12" in recorded["first"].stdout


def test_a_rerun_reproduces_says_what_it_reused_and_writes_nothing(site, recorded):
    root = recorded["root"]
    before = snapshot(root)
    again = run(site, root, "circle-quadratic")
    assert again.returncode == 0, again.stderr
    assert "reused 12 of 12 runs, trained 0" in again.stdout
    assert "reproduced: SUPPORTED, as recorded (attempt 1" in again.stdout
    assert (
        "per-seed metrics of the 12 runs completed in both: identical to the record" in again.stdout
    )
    assert snapshot(root) == before  # no new created_at, no new history line
    as_json = run(site, root, "circle-quadratic", "--json")
    events = [json.loads(line) for line in as_json.stdout.splitlines()]
    reuse = next(e for e in events if e["event"] == "reuse")
    assert (reuse["reused"], reuse["trained"], reuse["total"]) == (12, 0, 12)
    final = events[-1]
    assert (
        final["mode"] == "reproduce"
        and final["recorded"] is False
        and final["reproduction"]["reproduces"]
    )
    assert snapshot(root) == before


def test_a_contract_outside_the_contracts_folder_is_refused(site, recorded, tmp_path):
    outside = tmp_path / "elsewhere.yaml"
    outside.write_text(CONTRACT.read_text().replace("id: circle-quadratic", "id: circle-elsewhere"))
    done = gates(
        recorded["root"],
        "run",
        str(outside),
        "--tracking-uri",
        f"sqlite:///{recorded['root'] / 'mlflow.db'}",
        site=site,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert len(done.stderr.splitlines()) == 1
    assert "outside the project's contracts folder contracts/" in done.stderr
    assert "expected contracts/circle-elsewhere.yaml" in done.stderr
    assert not (recorded["root"] / "runs" / "circle-elsewhere").exists()


def test_check_refuses_a_contract_edited_after_its_evidence(site, recorded, tmp_path):
    root = tmp_path / "project"
    shutil.copytree(recorded["root"], root)
    path = root / "contracts" / "circle-quadratic.yaml"
    path.write_text(path.read_text().replace("value: 0.85}", "value: 0.8}", 1))
    for command in (
        ("check", "contracts/circle-quadratic.yaml"),
        (
            "run",
            "contracts/circle-quadratic.yaml",
            "--tracking-uri",
            f"sqlite:///{root / 'mlflow.db'}",
        ),
    ):
        done = gates(root, *command, site=site)
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert "edited after its evidence" in done.stderr and "ready to run" not in done.stdout


def test_the_quickstart_reproduces_a_recorded_claim_with_cpu_torch():
    """The README's first command installs CPU torch from the CPU wheel index and runs a contract whose
    evidence is committed, so it reproduces and compares that claim and writes no tracked file."""
    readme = (ROOT / "README.md").read_text().splitlines()
    assert readme[2] == "```bash"
    first = readme[3]
    assert first.startswith(
        "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu && "
    )
    contract = re.search(r"gates run (contracts/[\w.-]+\.yaml)( --[\w-]+( \w+)?)*$", first).group(1)
    contract_id = Path(contract).stem
    committed = subprocess.run(
        ["git", "ls-files", "--error-unmatch", f"runs/{contract_id}/evidence.json", contract],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert committed.returncode == 0, (
        committed.stderr
    )  # a recorded claim: `gates run` reproduces it
