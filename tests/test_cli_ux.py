"""The command line's manners (issue #27): `-h` on every command, `--version`, `--json` on check and
studies, errors as JSON under --json, `gates status` readable at 80 columns with whole ids, `gates
check` without scipy.stats or MLflow (nor torch, for a study that does not import it), and the whole
run's progress ("run k of N done") during `gates run`."""

from __future__ import annotations

import errno
import json
import shutil

import tomllib
from typer.main import get_command
from typer.testing import CliRunner

from gates import __version__
from gates.cli import app
from tests.conftest import ROOT, copy_claims, small_c05, write_contract
from tests.helpers import gates, run_main
from tests.test_cli_fast import run_cli
from tests.test_plugin_study import EXAMPLE, install_dist


def command_paths(command, path=()) -> list[tuple[str, ...]]:
    """Every command of the app, `data` and its subcommands included, as the words that run it (not
    the hidden ones: the retired `gates worker` answers anything, -h too, with one line)."""
    found = [path]
    for name, sub in getattr(command, "commands", {}).items():
        if not sub.hidden:
            found += command_paths(sub, (*path, name))
    return found


# ---------------------------------------------------------------------------------- help, version
def test_every_command_answers_short_help():
    paths = command_paths(get_command(app))
    assert ("check",) in paths and ("data", "fetch") in paths
    for path in paths:
        done = CliRunner().invoke(app, [*path, "-h"])
        assert done.exit_code == 0, (path, done.output)
        assert "Usage:" in done.output and "-h, --help" in done.output, (path, done.output)


def test_version(monkeypatch, capsys):
    code, stdout, _ = run_main(monkeypatch, capsys, "--version")
    assert code == 0 and stdout == f"gates {__version__}\n"


# ---------------------------------------------------------------------------------- --json
def test_check_json_is_the_report(workdir):
    contract = write_contract(workdir / "contracts", small_c05(), "c05-small.yaml")
    done = CliRunner().invoke(app, ["check", str(contract), "--json"])
    assert done.exit_code == 0, done.output
    report = json.loads(done.stdout)
    assert report["id"] == "c05-small" and report["ready"] is True and report["errors"] == []
    assert {"sha256", "claim", "study", "arms", "seeds", "budget", "gates", "decision"} <= set(
        report
    )
    assert {"notes", "rule_flags", "controls", "seeds_for_80pct_power"} <= set(report)
    arms = report["preflight"]["arms"]
    assert set(arms) == set(report["arms"]) and arms["flat_address"]["params_ratio"] == 1.0
    assert all(isinstance(m["params"], int) for m in arms.values())

    refused = small_c05()
    refused["preflight"]["compute_cost"]["max_ratio"] = 1.0  # the arms' sizes differ more
    contract = write_contract(workdir / "contracts", refused, "c05-small.yaml")
    done = CliRunner().invoke(app, ["check", str(contract), "--json"])
    assert done.exit_code != 0
    report = json.loads(done.stdout)  # one JSON document: the report and its refusals
    assert report["ready"] is False and report["errors"]
    assert {e["code"] for e in report["errors"]} == {"user_error"}
    assert report["errors"][0]["field"] == "preflight.compute_cost.max_ratio"


def test_studies_json():
    done = CliRunner().invoke(app, ["studies", "--json"])
    assert done.exit_code == 0, done.output
    rows = {r["name"]: r for r in json.loads(done.stdout)}
    c05 = rows["c05_probe"]
    assert c05["class"] == "gates.models.c05_probe:C05ProbeStudy"
    assert c05["module"] == "gates.models.c05_probe" and c05["distribution"].startswith("treeheap")
    assert c05["metrics"] is None  # the listing imports no study
    done = CliRunner().invoke(app, ["studies", "c05_probe", "--json"])
    (c05,) = json.loads(done.stdout)
    assert c05["metrics"]["test_acc"] == {
        "direction": "higher",
        "role": "test",
        "low": 0.0,
        "high": 1.0,
        "scale": "linear",
        "chance": None,
        "unit": None,
        "linear_reason": None,
        "estimand": "median",  # what a condition on it estimates unless it declares otherwise
    }


def test_an_error_under_json_is_json_on_stdout(workdir, monkeypatch, capsys):
    code, stdout, stderr = run_main(monkeypatch, capsys, "check", "missing.yaml", "--json")
    error = json.loads(stdout)["error"]
    assert code == 2 and error["code"] == "user_error" and error["file"] == "missing.yaml"
    assert stderr.startswith("error: missing.yaml: ")  # people still read the line
    code, stdout, _ = run_main(monkeypatch, capsys, "check", "missing.yaml")
    assert code == 2 and stdout == ""  # without --json: nothing on stdout

    code, stdout, _ = run_main(monkeypatch, capsys, "studies", "c05_prob", "--json")
    error = json.loads(stdout)["error"]
    assert code == 2 and error["field"] == "NAME" and "did you mean 'c05_probe'" in error["message"]

    code, stdout, stderr = run_main(monkeypatch, capsys, "status", "--bogus", "--json")
    error = json.loads(stdout)["error"]
    assert code == 2 and error["code"] == "usage_error" and "--bogus" in error["message"]
    assert "No such option" in stderr

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", "runs/INDEX.jsonl")

    import gates.verify

    monkeypatch.setattr(gates.verify, "claims", full_disk)
    code, stdout, stderr = run_main(monkeypatch, capsys, "status", "--json")
    error = json.loads(stdout)["error"]
    assert code == 1 and error["code"] == "disk_full" and error["file"] == "runs/INDEX.jsonl"
    assert stderr.startswith("error: runs/INDEX.jsonl: cannot write (disk_full")


# ---------------------------------------------------------------------------------- status
LONG_IDS = (
    "c05-structural-probe",
    "c05-structural-probe-v2",
    "c05-structural-probe-tuned",
    "c05-sequential-early",
    "treeheap-source-causal",
)


def test_status_at_80_columns_keeps_every_id_whole(tmp_path):
    project = copy_claims(tmp_path, *LONG_IDS)
    for view in ((), ("-v",)):  # one line per claim; the details, a block per claim
        done = gates(project, "status", *view, columns=80)
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        assert [line for line in lines if len(line) > 80] == []
        for contract_id in LONG_IDS:
            assert any(line.split()[:1] == [contract_id] for line in lines), (contract_id, lines)
        assert "…" not in done.stdout
    assert "superseded by c05-structural-probe-v2" in done.stdout  # the notes are there
    wide = gates(project, "status", "--details", columns=200)
    assert "┃ contract" in wide.stdout  # a wide terminal keeps the table


# ---------------------------------------------------------------------------------- check's imports
def test_check_imports_no_scipy_stats_nor_mlflow_nor_a_torch_the_study_does_not(tmp_path):
    """A study without torch (examples/my_study, installed in a site folder) is checked without torch;
    no check imports scipy.stats, MLflow or Optuna. A C05 contract still imports torch: its study module
    does at its top (as every study of this repository's does), which the platform cannot avoid."""
    site = tmp_path / "site"
    project = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())["project"]
    install_dist(
        site, project["name"], project["version"], project["entry-points"]["gates.studies"]
    )
    shutil.copytree(EXAMPLE / "my_study", site / "my_study")
    (tmp_path / "plugin" / "contracts").mkdir(parents=True)
    shutil.copy(EXAMPLE / "contracts" / "circle-quadratic.yaml", tmp_path / "plugin" / "contracts")
    done, imported = run_cli(
        tmp_path / "plugin",
        "check",
        "contracts/circle-quadratic.yaml",
        "--runs-dir",
        "runs",
        pythonpath=[site, ROOT],
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ready to run" in done.stdout
    assert not [m for m in imported if m.split(".")[0] in ("torch", "mlflow", "optuna")], imported
    assert "scipy.stats" not in imported, imported

    (tmp_path / "c05" / "contracts").mkdir(parents=True)
    write_contract(tmp_path / "c05" / "contracts", small_c05(), "c05-small.yaml")
    done, imported = run_cli(
        tmp_path / "c05", "check", "contracts/c05-small.yaml", "--runs-dir", "runs"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "torch" in imported  # by gates.models.c05_probe, at its top
    assert "scipy.stats" not in imported and "mlflow" not in imported, imported


# ---------------------------------------------------------------------------------- run's progress
def test_run_says_run_k_of_n_and_json_progress_events(workdir):
    write_contract(workdir / "contracts", small_c05(), "c05-small.yaml")
    run = ("run", "contracts/c05-small.yaml", "--tracking-uri", "sqlite:///mlflow.db")
    done = gates(workdir, *run)
    assert done.returncode == 0, done.stderr[-3000:]
    said = [line for line in done.stdout.splitlines() if line.startswith("run ")]
    assert [line.split(" done")[0] for line in said] == [f"run {k} of 12" for k in range(1, 13)]
    assert all(" elapsed" in line for line in said)
    assert any(line.endswith(" left") for line in said)  # the pace of the runs trained so far

    again = gates(workdir, *run, "--json")  # reproduces the record: every run reused
    assert again.returncode == 0, again.stderr[-3000:]
    events = [json.loads(line) for line in again.stdout.splitlines()]
    progress = [e for e in events if e["event"] == "progress"]
    assert [e["done"] for e in progress] == list(range(1, 13))
    assert {e["planned"] for e in progress} == {12} and progress[-1]["reused"] == 12
    assert {"elapsed_s", "eta_s", "not_run", "at_most"} <= set(progress[-1])
