"""Commands that answer at once: `gates --help`, `gates status` and `gates studies` import no study (no
torch), no verdict engine (no scipy) and no MLflow; `gates status` still says what `gates verify` says
about each recorded claim's verdict, hash, history and code (rules: as the evidence recorded them). The
claims are frozen copies (tests/fixtures/claims) in a temp project, never the repository's runs/."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import FIXTURE_CLAIMS
from tests.helpers import gates

ROOT = Path(__file__).resolve().parent.parent
HEAVY = (
    "torch",
    "scipy",
    "mlflow",
    "optuna",
    "sklearn",
    "gates.models",
    "gates.inference",  # the verdict engine
    "gates.verify._verify",  # the re-derivation phase of a claim's check
)

# runs the CLI's main() as the console script does, then reports which heavy modules were imported
DRIVER = """
import json, sys
sys.argv = ["gates", *json.loads(sys.argv[1])]
from gates.cli import main
try:
    main()
except SystemExit as e:
    code = e.code
else:
    code = 0
heavy = sorted({m for m in sys.modules if any(m == h or m.startswith(h + ".") for h in HEAVY)})
sys.stderr.write("IMPORTED " + json.dumps(heavy) + "\\n")
sys.exit(code or 0)
""".replace("HEAVY", repr(HEAVY))


def run_cli(cwd: Path, *args: str, **options) -> tuple[subprocess.CompletedProcess, list[str]]:
    """`gates ARGS` in `cwd` through DRIVER (tests.helpers.gates, its options): the process and the heavy
    modules it imported."""
    done = gates(cwd, json.dumps(list(args)), script=DRIVER, timeout=300, **options)
    marker = [line for line in done.stderr.splitlines() if line.startswith("IMPORTED ")]
    assert marker, done.stderr[-3000:]
    return done, json.loads(marker[-1].removeprefix("IMPORTED "))


@pytest.fixture(scope="module")
def claims(make_project) -> Path:
    """A project holding every frozen claim, brought to today's engine (read only: for tests that change
    nothing; `project` below is a fresh copy per test)."""
    return make_project(claims=True, name="claims")


@pytest.mark.parametrize("args", [("--help",), ("status",), ("status", "--json"), ("studies",)])
def test_listing_commands_import_no_study_and_no_engine(claims, args):
    done, imported = run_cli(claims, *args)
    assert done.returncode == 0, done.stderr
    assert imported == [], f"gates {' '.join(args)} imported {imported}"


def test_status_lists_every_recorded_claim_as_verify_sees_it(claims):
    """The quick listing against `--full` (gates.verify, every study imported) on recorded claims (the
    frozen copies: evidence with and without per-file code hashes, a supersedes pair, an invalid, a
    sequential and a non-C05 claim, rule flags): the same claims, verdicts, statuses, hash checks, history,
    supersedes chain and staleness; the rules a contract predates are the ones its evidence recorded."""
    quick, imported = run_cli(claims, "status", "--json")
    assert quick.returncode == 0 and imported == []
    full, imported_full = run_cli(claims, "status", "--json", "--full")
    assert full.returncode == 0 and "torch" in imported_full  # the full check does load the studies
    rows, checked = json.loads(quick.stdout), {r["id"]: r for r in json.loads(full.stdout)}
    assert [r["id"] for r in rows] == list(checked)
    assert (
        len([r for r in rows if r["recorded"]])
        == len(list((claims / "runs").glob("*/evidence.json")))
        == len(FIXTURE_CLAIMS)
        >= 8
    )
    assert {r["status"] for r in rows} == {
        "ok"
    }  # the copies hold their evidence under today's engine
    for row in rows:
        want = checked[row["id"]]
        for key in (
            "verdict",
            "status",
            "hash_ok",
            "stale",
            "stale_files",
            "stale_note",
            "withdrawn",
            "withdrawal",
            "superseded_by",
            "supersedes",
            "recorded",
            "problems",
        ):
            assert row[key] == want[key], (row["id"], key)
        evidence = claims / "runs" / row["id"] / "evidence.json"
        if evidence.exists():
            assert row["rule_flags"] == json.loads(evidence.read_text()).get("rule_flags", [])
    assert checked["c05-structural-probe"]["superseded_by"] == ["c05-structural-probe-v2"]
    assert checked["c05-structural-probe-v2"]["supersedes"] == "c05-structural-probe"
    table, _ = run_cli(claims, "status")
    assert (
        "c05-structural-probe-v2" in table.stdout
        and "`gates verify` also re-derives every verdict" in table.stdout
    )


@pytest.fixture
def project(make_project):
    """A copy of the frozen claims (contracts, evidence and their claims history) to change."""
    return make_project(claims=True)


def status_rows(project: Path, *extra: str) -> tuple[dict, list[str]]:
    done, imported = run_cli(project, "status", "--json", *extra)
    assert done.returncode == 0, done.stderr
    return {r["id"]: r for r in json.loads(done.stdout)}, imported


def test_status_names_an_edited_contract_and_takes_a_rewritten_but_equal_one(project):
    path = project / "contracts" / "c05-structural-probe-v2.yaml"
    original = path.read_text()
    path.write_text(
        "# a comment changes nothing\n" + original.replace("  steps: 300", "  steps: 300  # same")
    )
    rows, imported = status_rows(project)
    assert rows["c05-structural-probe-v2"]["hash_ok"] is True and imported == []

    # written differently but the same contract once the study's config has read it (1 for 1.0): the
    # quick hash cannot tell, so status loads that contract with its study and finds it unchanged
    path.write_text(original.replace("sigma: 1.0,", "sigma: 1,"))
    rows, imported = status_rows(project)
    assert (
        rows["c05-structural-probe-v2"]["hash_ok"] is True
        and rows["c05-structural-probe-v2"]["status"] == "ok"
    )
    assert "torch" in imported

    path.write_text(original.replace("value: 0.95}", "value: 0.9}", 1))
    rows, _ = status_rows(project)
    row = rows["c05-structural-probe-v2"]
    assert row["hash_ok"] is False and row["status"] == "lost"
    assert row["problems"][0].startswith(
        "contracts/c05-structural-probe-v2.yaml was edited after its evidence: sha256 "
    )
    full, _ = status_rows(project, "--full")
    assert full["c05-structural-probe-v2"]["problems"][0] == row["problems"][0]  # verify's words
    table, _ = run_cli(project, "status", "-v")
    row = r"c05-structural-probe-v2\s+│ inconclusive\s+│ [-0-9]+\s+│ no\s+│"  # hash ok: no
    assert re.search(row, table.stdout), table.stdout
    assert (
        "contracts/c05-structural-probe-v2.yaml was" in table.stdout
    )  # the problem, in the notes column


def test_status_names_missing_duplicate_and_unindexed(project):
    (project / "contracts" / "c05-not-converged.yaml").unlink()
    shutil.copy(
        project / "contracts" / "c05-baseline-control.yaml", project / "contracts" / "copy.yaml"
    )
    evidence = project / "runs" / "twin-tree-toy" / "evidence.json"
    evidence.write_text(evidence.read_text().replace('"created_at": "', '"created_at": "1', 1))
    rows, imported = status_rows(project)
    full, _ = status_rows(project, "--full")
    assert imported == []
    for cid, words in (
        ("c05-not-converged", "contract 'c05-not-converged' is missing"),
        ("c05-baseline-control", "all have id 'c05-baseline-control'"),
        ("twin-tree-toy", "changed without an index entry"),
    ):
        assert rows[cid]["status"] == "lost" and words in " ".join(rows[cid]["problems"]), (
            cid,
            rows[cid],
        )
        assert set(rows[cid]["problems"]) <= set(full[cid]["problems"]), (
            cid
        )  # verify's words (it finds more)
    assert rows["c05-sequential-early"]["status"] == "ok"  # the others are untouched


def test_studies_lists_from_metadata_and_shows_metrics_on_request():
    done, imported = run_cli(ROOT, "studies")
    assert done.returncode == 0 and imported == []
    assert "c05_probe: gates.models.c05_probe:C05ProbeStudy (treeheap-gates 0.1.0)" in done.stdout
    detail, imported = run_cli(ROOT, "studies", "c05_probe")
    assert detail.returncode == 0 and "gates.models" in imported
    assert "test_acc: higher, test, range [0, 1]" in detail.stdout and "bif_lm" not in detail.stdout
    unknown, _ = run_cli(ROOT, "studies", "c05_prob")
    assert unknown.returncode == 2
    assert "error: NAME: unknown study 'c05_prob' (did you mean 'c05_probe'?)" in unknown.stderr


def test_cli_latency_benchmark_writes_its_json(claims, tmp_path):
    out = tmp_path / "latency.json"
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "cli_latency.py"),
            "--repeats",
            "1",
            "--json",
            str(out),
            "--cwd",
            str(claims),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    results = json.loads(out.read_text())
    assert set(results["commands"]) == {"gates --help", "gates status", "gates studies"}
    assert results["claims"] == len(FIXTURE_CLAIMS) and all(
        r["median_s"] > 0 for r in results["commands"].values()
    )
    assert "gates status" in done.stdout and "median" in done.stdout
