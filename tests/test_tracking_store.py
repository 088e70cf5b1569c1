"""The MLflow SQLite store survives an interrupted creation (issue #17, section 2).

Real stores, real processes: a process is SIGKILLed at the moment that used to break stores for good
(MLflow's batch migration has just created its `_alembic_tmp_*` table), two first runs start at once,
a write limit stands in for a full disk; then the next run must work, or a store that holds runs and
is damaged must give one line naming the file and the fix, and be left as it was.
"""

from __future__ import annotations

import os
import resource
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from gates.contract import load_contract
from gates.errors import UserError
from gates.record import open_client
from tests.conftest import ROOT, small_c05, write_contract
from tests.helpers import run_contract

# SIGKILL this process right after MLflow's batch migration created its temporary table: the moment
# a kill, a full disk or a second process used to leave `table _alembic_tmp_experiments already exists`
KILL_MID_MIGRATION = textwrap.dedent("""
    import os, signal, sys
    import sqlalchemy
    from sqlalchemy import event

    @event.listens_for(sqlalchemy.engine.Engine, "after_cursor_execute")
    def _kill_mid_migration(conn, cursor, statement, *args):
        if statement.lstrip().upper().startswith("CREATE TABLE _ALEMBIC_TMP_"):
            os.kill(os.getpid(), signal.SIGKILL)
""")


def python(code: str, cwd: Path, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("MLFLOW_TRACKING_URI", None)
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        **kw,
    )


def killed_mid_migration(code: str, cwd: Path) -> None:
    proc = python(KILL_MID_MIGRATION + code, cwd)
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stderr[-2000:])


def tiny_contract(folder: Path, contract_id: str = "c05-tiny") -> Path:
    """C05 at its smallest: 4 arms x 2 seeds x 20 steps (a few seconds)."""
    data = small_c05(id=contract_id)
    data["budget"] = {"steps": 20, "eval_every": 10}
    data["preflight"]["falsifiable_point"]["by_step"] = 20
    data["stop_rules"] = {"divergence": {"metrics": ["train_loss"]}}
    for cfg in data["arms"].values():
        cfg.update(train_trees=40, test_trees=20)
    return write_contract(folder, data, f"{contract_id}.yaml")


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(".mlflow.db."))


def is_complete(path: Path) -> bool:
    """Every table this MLflow expects, at its head revision (read with sqlite3, not through gates)."""
    import mlflow.store.db.utils as db_utils
    from mlflow.store.db.base_sql_model import Base

    with sqlite3.connect(path) as con:
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        version = (
            con.execute("SELECT version_num FROM alembic_version").fetchall()
            if "alembic_version" in tables
            else []
        )
    return set(Base.metadata.tables) <= tables and version == [
        (db_utils._get_latest_schema_revision(),)
    ]


@pytest.fixture(scope="module")
def store_with_runs(tmp_path_factory) -> Path:
    """A complete store holding one experiment with two runs (copied by the tests that damage it)."""
    path = tmp_path_factory.mktemp("store") / "mlflow.db"
    client = open_client(f"sqlite:///{path}")
    experiment = client.create_experiment("c05-tiny")
    for seed in (0, 1):
        run = client.create_run(experiment, run_name=f"arm/seed{seed}")
        client.log_metric(run.info.run_id, "test_acc", 1.0, step=20)
        client.set_terminated(run.info.run_id)
    return path


def test_gates_run_killed_while_mlflow_creates_tables_leaves_no_store_and_the_next_run_works(
    tmp_path, monkeypatch
):
    contract = tiny_contract(tmp_path)
    # the contract sits in the project folder itself: --contracts-dir . (gates run refuses one outside it)
    argv = [
        "gates",
        "run",
        contract.name,
        "--contracts-dir",
        ".",
        "--tracking-uri",
        "sqlite:///mlflow.db",
        "--json",
    ]
    killed_mid_migration(
        f"import sys\nfrom gates.cli import main\nsys.argv = {argv!r}\nmain()", tmp_path
    )
    assert not (tmp_path / "mlflow.db").exists()  # no store rather than half of one

    monkeypatch.chdir(tmp_path)  # the next run (in this process: the imports are paid already)
    evidence = run_contract(
        load_contract(contract.name), f"sqlite:///{tmp_path / 'mlflow.db'}", Path("runs")
    )
    assert len(evidence.runs) == 12 and (tmp_path / "runs" / "c05-tiny" / "evidence.json").is_file()
    assert is_complete(tmp_path / "mlflow.db")
    assert leftovers(tmp_path) == []  # the killed build's temporary store was removed


@pytest.fixture(scope="module")
def half_built(tmp_path_factory) -> Path:
    """The store plain MLflow (an older gates, `mlflow ui`) leaves when killed while it creates one."""
    folder = tmp_path_factory.mktemp("half-built")
    killed_mid_migration(
        "from mlflow import MlflowClient\nMlflowClient('sqlite:///mlflow.db').search_experiments()",
        folder,
    )
    assert (folder / "mlflow.db").is_file() and not is_complete(folder / "mlflow.db")
    return folder / "mlflow.db"


def test_a_half_built_store_that_holds_no_runs_is_rebuilt(half_built, tmp_path):
    path = tmp_path / "mlflow.db"
    shutil.copy(half_built, path)

    client = open_client(f"sqlite:///{path}")
    run = client.create_run(client.create_experiment("after"))
    client.log_metric(run.info.run_id, "x", 1.0)
    assert is_complete(path)
    assert [m.value for m in client.get_metric_history(run.info.run_id, "x")] == [1.0]


def test_two_first_runs_at_once_both_succeed(tmp_path):
    """Two processes open a new store at the same instant: one builds it, the other waits and uses it."""
    code = textwrap.dedent("""
        import sys, time
        from pathlib import Path
        from gates.record import open_client
        import mlflow.store.db.utils  # every import done before the start line
        Path("ready-" + sys.argv[1]).touch()
        while not Path("go").exists():
            time.sleep(0.002)
        open_client("sqlite:///mlflow.db").create_experiment(sys.argv[1])
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, name],
            cwd=tmp_path,
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in ("first", "second")
    ]
    deadline = time.monotonic() + 120
    while (
        not all((tmp_path / f"ready-{n}").exists() for n in ("first", "second"))
        and time.monotonic() < deadline
    ):
        time.sleep(0.01)
    (tmp_path / "go").touch()
    errors = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [e[-1500:] for e in errors]
    client = open_client(f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert {e.name for e in client.search_experiments()} >= {"first", "second"}


def test_a_full_disk_while_creating_leaves_no_store_and_one_line(tmp_path):
    """A file size limit (RLIMIT_FSIZE: writes past it fail, as on a full disk) while the store is built."""

    def limit():
        signal.signal(
            signal.SIGXFSZ, signal.SIG_IGN
        )  # a write past the limit fails with EFBIG instead
        resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))

    proc = python(
        "from gates.record import open_client\nfrom gates.errors import UserError\n"
        "try:\n    open_client('sqlite:///mlflow.db')\nexcept UserError as e:\n    print(e.render())\n"
        "    raise SystemExit(2)\n",
        tmp_path,
        preexec_fn=limit,
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mlflow.db: cannot create the MLflow store ("), (
        lines
    )
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "mlflow.db").exists() and leftovers(tmp_path) == []
    open_client(f"sqlite:///{tmp_path / 'mlflow.db'}").create_experiment(
        "after"
    )  # with room again, it is built


def _truncate(path: Path) -> None:
    os.truncate(path, path.stat().st_size // 2)


def _not_a_database(path: Path) -> None:
    path.write_bytes(b"these were the runs\n" * 1000)


def _half_migrated(path: Path) -> None:
    """An upgrade killed halfway: the schema already has later migrations' tables and columns, the
    recorded version is older, and a batch migration's temporary table is left behind."""
    import mlflow.store.db.utils as db_utils
    from alembic.script import ScriptDirectory

    revisions = [
        r.revision
        for r in ScriptDirectory.from_config(db_utils._get_alembic_config("")).walk_revisions()
    ]
    with sqlite3.connect(path) as con:
        con.execute("UPDATE alembic_version SET version_num = ?", (revisions[len(revisions) // 2],))
        con.execute("CREATE TABLE _alembic_tmp_experiments (experiment_id INTEGER)")


@pytest.mark.parametrize("damage", [_truncate, _not_a_database, _half_migrated])
def test_a_damaged_store_that_holds_runs_is_one_line_and_left_as_it_is(
    store_with_runs, tmp_path, damage
):
    path = tmp_path / "mlflow.db"
    shutil.copy(store_with_runs, path)
    damage(path)
    before = path.read_bytes()
    with pytest.raises(UserError) as info:
        open_client(f"sqlite:///{path}")
    text = info.value.render()
    assert len(text.splitlines()) == 1
    assert text.startswith(f"{path}: MLflow store ") and f"mv {path} {path}.damaged" in text, text
    if damage is _half_migrated:
        assert "holds 2 runs" in text, text
    assert path.read_bytes() == before  # never rebuilt or migrated in place
    assert leftovers(tmp_path) == []


def test_gates_run_on_a_truncated_store_is_one_line_exit_2(store_with_runs, tmp_path):
    tiny_contract(tmp_path)
    shutil.copy(store_with_runs, tmp_path / "mlflow.db")
    _truncate(tmp_path / "mlflow.db")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "gates",
            "run",
            "c05-tiny.yaml",
            "--contracts-dir",
            ".",
            "--tracking-uri",
            "sqlite:///mlflow.db",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: mlflow.db: MLflow store is truncated"), (
        lines
    )
    assert "mv mlflow.db mlflow.db.damaged" in lines[0]


def _older_store_with_a_run(path: Path) -> str:
    """A store at a schema halfway through MLflow's migrations, holding one run, as an older MLflow left it."""
    import mlflow.store.db.utils as db_utils
    import sqlalchemy
    from alembic import command
    from alembic.script import ScriptDirectory
    from mlflow.store.tracking.dbmodels.initial_models import Base as InitialBase
    from sqlalchemy.pool import NullPool

    revisions = [
        r.revision
        for r in ScriptDirectory.from_config(db_utils._get_alembic_config("")).walk_revisions()
    ]
    engine = sqlalchemy.create_engine(f"sqlite:///{path}", poolclass=NullPool)
    InitialBase.metadata.create_all(engine)
    config = db_utils._get_alembic_config(str(engine.url))
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, revisions[len(revisions) // 2])
    engine.dispose()
    with sqlite3.connect(path) as con:
        con.execute(
            "INSERT INTO experiments (experiment_id, name, artifact_location, lifecycle_stage) "
            "VALUES (1, 'old', ?, 'active')",
            (str(path.parent / "artifacts"),),
        )
        con.execute(
            "INSERT INTO runs (run_uuid, name, user_id, status, start_time, lifecycle_stage, artifact_uri, "
            "experiment_id, source_type) VALUES ('0123456789abcdef0123456789abcdef', 'old run', 'me', "
            "'FINISHED', 1000, 'active', ?, 1, 'LOCAL')",
            (str(path.parent / "artifacts" / "r"),),
        )
    return "0123456789abcdef0123456789abcdef"


def test_an_older_store_with_runs_is_upgraded_on_a_copy_and_a_kill_mid_upgrade_changes_nothing(
    tmp_path,
):
    path = tmp_path / "mlflow.db"
    run_id = _older_store_with_a_run(path)
    before = path.read_bytes()
    killed_mid_migration(
        "from gates.record import open_client\nopen_client('sqlite:///mlflow.db')", tmp_path
    )
    assert (
        path.read_bytes() == before
    )  # the upgrade ran on a copy; the kill left the store as it was

    client = open_client(f"sqlite:///{path}")
    assert [r.info.run_id for r in client.search_runs(["1"])] == [run_id]
    assert is_complete(path)
    assert leftovers(tmp_path) == []


def test_the_dashboard_never_builds_or_migrates_a_store(half_built, tmp_path):
    """A half-built store shown by the (read-only) dashboard: a note, and the file untouched."""
    from gates.dashboard.data import Store

    path = tmp_path / "mlflow.db"
    shutil.copy(half_built, path)
    before = path.read_bytes()
    client, why = Store(f"sqlite:///{path}").client()
    assert client is None and why.startswith(
        f"{path}: MLflow store is half-built and holds no runs: the next `gates run` rebuilds it"
    ), why
    assert path.read_bytes() == before
