"""The PostgreSQL queue is retired for Ray: `gates worker` (whatever it is given) and `gates run
--storage/--no-wait/--heartbeat` say so in one line naming `--executor ray`, exit 2, before any
contract is read; under --json the error is also the usual JSON object on stdout."""

from __future__ import annotations

import json

import pytest

from tests.helpers import run_main


@pytest.mark.parametrize(
    "args",
    [
        (),
        ("--storage", "postgresql://user:pw@host/db"),
        ("--storage", "sqlite:///q.db", "--max-jobs", "1", "--idle-exit", "5", "--threads", "2"),
        ("--help",),
    ],
)
def test_gates_worker_is_one_line_naming_ray(monkeypatch, capsys, args):
    code, out, err = run_main(monkeypatch, capsys, "worker", *args)
    assert code == 2 and out == ""
    (line,) = err.splitlines()
    assert line.startswith("error[worker_retired]: ")
    assert "gates run CONTRACT --executor ray --ray-address HOST:6379" in line
    assert "docs/distributed.md" in line


@pytest.mark.parametrize(
    "flags",
    [
        ("--storage", "postgresql://user:pw@host/db"),
        ("--no-wait",),
        ("--heartbeat", "5"),
    ],
)
def test_gates_run_queue_flags_are_one_line_naming_ray(monkeypatch, capsys, tmp_path, flags):
    missing = tmp_path / "contracts" / "nothing.yaml"  # refused before the contract is read
    code, out, err = run_main(monkeypatch, capsys, "run", str(missing), *flags)
    assert code == 2 and out == ""
    (line,) = err.splitlines()
    assert line.startswith(f"error[storage_retired]: {flags[0]}: ")
    assert "--executor ray" in line


def test_gates_run_storage_under_json_is_an_error_object(monkeypatch, capsys, tmp_path):
    code, out, err = run_main(
        monkeypatch,
        capsys,
        "run",
        str(tmp_path / "c.yaml"),
        "--storage",
        "sqlite:///q.db",
        "--json",
    )
    assert code == 2
    (error,) = [json.loads(line)["error"] for line in out.splitlines()]
    assert error["code"] == "storage_retired" and error["field"] == "--storage"
    assert "--executor ray" in error["message"]
    assert err.startswith("error[storage_retired]: --storage: ")


def test_the_retired_worker_is_hidden_from_help(monkeypatch, capsys):
    code, out, _ = run_main(monkeypatch, capsys, "--help")
    assert code == 0 and "worker" not in out and "--storage" not in out
    code, out, _ = run_main(monkeypatch, capsys, "run", "--help")
    assert code == 0 and "--storage" not in out and "--heartbeat" not in out
    assert "--optuna-storage" in out and "--executor" in out
