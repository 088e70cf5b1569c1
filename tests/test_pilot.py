"""Pilots on the record (issue #42): `gates pilot` trains a draft contract's arms on seeds no contract can
use, records them in MLflow as pilots, and `gates check` and the verdict list them (what was known
before the contract was registered)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gates.contract import PILOT_SEED_BASE
from gates.record import open_client
from tests.conftest import git, small_c05, write_contract
from tests.helpers import gates

pytestmark = pytest.mark.usefixtures("one_thread")


def test_pilots_run_on_their_own_seeds_and_stay_on_the_record(workdir):
    git(workdir, "init", "-q")
    path = write_contract(workdir / "contracts", small_c05(id="c05-pilot"), "c05-pilot.yaml")
    result = gates(
        workdir, "pilot", str(path), "--arm", "subheap_kernel", "--steps", "20", "--seeds", "2"
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 pilot runs of this contract id" in result.stdout
    assert not any((workdir / "runs").iterdir())  # a pilot writes nothing under runs/

    client = open_client(f"sqlite:///{workdir / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("c05-pilot")
    runs = client.search_runs([experiment.experiment_id])
    roles = sorted(r.data.tags["gates.role"] for r in runs)
    assert roles == ["pilot", "run", "run"]
    seeds = sorted(
        int(r.data.tags["gates.seed"]) for r in runs if r.data.tags["gates.role"] == "run"
    )
    assert seeds == [PILOT_SEED_BASE, PILOT_SEED_BASE + 1]

    checked = json.loads(gates(workdir, "check", str(path), "--json").stdout)
    assert [(p["arm"], p["steps"], p["before_registration"]) for p in checked["pilots"]] == [
        ("subheap_kernel", 20, None),  # the contract is not committed yet
    ] * 2

    git(workdir, "add", "contracts")
    git(workdir, "commit", "-qm", "register c05-pilot")
    result = gates(workdir, "run", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "reused 0 of 12 runs" in result.stdout  # a pilot run is never a contract's
    evidence = json.loads((workdir / "runs" / "c05-pilot" / "evidence.json").read_text())
    assert [p["before_registration"] for p in evidence["pilots"]] == [True, True]
    assert {p["contract_sha256"] for p in evidence["pilots"]} == {evidence["contract_sha256"]}
    report = (workdir / "runs" / "c05-pilot" / "verdict.md").read_text()
    assert "## Pilots (what was known before)" in report
    assert "2 before the contract was first committed" in report
    assert gates(workdir, "verify").returncode == 0


def test_a_pilot_of_an_unknown_arm_or_beyond_the_budget_is_refused(workdir):
    path = write_contract(workdir / "contracts", small_c05(id="c05-pilot"), "c05-pilot.yaml")
    for args, said in (
        (("--arm", "nope"), "no arm named 'nope'"),
        (("--steps", "61"), "--steps 61 is outside 1..60"),
    ):
        result = gates(workdir, "pilot", str(path), *args)
        assert result.returncode == 2 and said in result.stderr, result.stderr
        assert "Traceback" not in result.stderr
    assert not (workdir / "mlflow.db").exists()  # refused before any store is opened


def checked_in_process(workdir: Path, path: Path) -> str:
    """`gates check PATH`'s output, then whether it imported MLflow (whose import takes seconds)."""
    script = (
        "import sys\nfrom gates.cli import main\n"
        f"sys.argv = ['gates', 'check', {str(path)!r}]\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "print('mlflow imported' if 'mlflow' in sys.modules else 'mlflow not imported')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=workdir, capture_output=True, text=True
    )
    return done.stdout


def test_check_of_a_contract_never_piloted_does_not_import_mlflow(workdir):
    """Listing pilots costs `gates check` nothing when there are none: one read-only query of the
    SQLite store, MLflow left unimported."""
    open_client(f"sqlite:///{workdir / 'mlflow.db'}").create_experiment("other")
    path = write_contract(workdir / "contracts", small_c05(id="c05-never"), "c05-never.yaml")
    out = checked_in_process(workdir, path)
    assert "ready to run" in out and "mlflow not imported" in out, out


def test_check_lists_pilots_from_a_sqlite_store_without_importing_mlflow(workdir):
    """The pilots are read from the SQLite store with read-only queries, as MLflow would list them:
    a deleted pilot run is left out."""
    path = write_contract(workdir / "contracts", small_c05(id="c05-piloted"), "c05-piloted.yaml")
    result = gates(workdir, "pilot", str(path), "--arm", "subheap_kernel", "--steps", "20")
    assert result.returncode == 0, result.stdout + result.stderr
    client = open_client(f"sqlite:///{workdir / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("c05-piloted").experiment_id
    (pilot,) = client.search_runs([experiment], "tags.`gates.role` = 'run'")
    out = checked_in_process(workdir, path)
    assert "mlflow not imported" in out and "1 pilot run of this contract id" in out, out
    assert "| subheap_kernel | 2147483648 | 20 | this one | completed |" in out, out
    client.delete_run(pilot.info.run_id)
    out = checked_in_process(workdir, path)
    assert "ready to run" in out and "pilot run" not in out, out
