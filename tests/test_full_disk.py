"""A full disk or a store or folder that cannot be written ends a gates command in one line naming the
file and what to free or change, exit 1, never a traceback; nothing is left half-written and a
re-run with room again completes (issue #28 item 6, "Bad files and full disks").

Real processes throughout: faults injected at the write calls of evidence.json and the claims index
(a driver patches os.replace / os.fsync / os.write before `gates` starts), a real SQLite store made
full by `PRAGMA max_page_count`, read-only folders (chmod), and a real 2 MB tmpfs where one can be
mounted. A full disk while a study runs is no failed run: the run stops instead of recording one.
"""

from __future__ import annotations

import errno
import os
import shutil
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gates.contract import load_contract
from gates.errors import DISK_FULL, READ_ONLY, StorageError, storage_error
from gates.record import EVIDENCE, REPORT, open_client, read_evidence, render_report
from tests.conftest import ROOT
from tests.helpers import gates, run_contract
from tests.test_tracking_store import tiny_contract

pytestmark = pytest.mark.usefixtures("one_thread")

CLAIM = "c05-tiny"
RUN = ["run", f"contracts/{CLAIM}.yaml", "--json"]

# `gates` in a process whose os.<call> fails with ENOSPC, without a file name (the writer must name
# the file itself), for the file descriptors or paths FAULT_WHEN picks; "short" lets half a write in.
DRIVER = textwrap.dedent("""
    import errno, os, sys
    CALL, WHEN, HOW = os.environ["FAULT_CALL"], os.environ["FAULT_WHEN"], os.environ["FAULT_HOW"]
    real = getattr(os, CALL)

    def target(args):
        first = args[0]
        if isinstance(first, int):  # a file descriptor: the file it is open on
            first = os.readlink(f"/proc/self/fd/{first}")
        return str(args[1] if CALL == "replace" else first)

    def fault(*args, **kw):
        if WHEN in target(args):
            if HOW == "short" and CALL == "write" and len(args[1]) > 1:
                return real(args[0], args[1][: len(args[1]) // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(*args, **kw)

    setattr(os, CALL, fault)
    from gates.cli._app import main
    sys.argv = ["gates", *sys.argv[1:]]
    main()
""")

# `gates` in a process whose SQLAlchemy connections cap the database at CAP_PAGES pages: SQLite itself
# then fails a write that would grow it (SQLITE_FULL), as on a full disk
CAPPED = textwrap.dedent("""
    import os, sys
    import sqlalchemy
    from sqlalchemy import event

    @event.listens_for(sqlalchemy.engine.Engine, "connect")
    def _cap(dbapi_connection, connection_record):
        dbapi_connection.execute(f"PRAGMA max_page_count = {int(os.environ['CAP_PAGES'])}")

    from gates.cli._app import main
    sys.argv = ["gates", *sys.argv[1:]]
    main()
""")


def _env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), **extra}
    env.pop("MLFLOW_TRACKING_URI", None)  # the project's own store: sqlite:///mlflow.db
    return env


def one_line(done: subprocess.CompletedProcess, start: str) -> str:
    """The one line a storage error gives: exit 1, nothing else on stderr, no traceback."""
    assert done.returncode == 1, done.stderr[-3000:]
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert lines[0].startswith(f"error: {start}"), lines[0]
    return lines[0]


def new_project(folder: Path) -> Path:
    (folder / "contracts").mkdir(parents=True)
    (folder / "runs").mkdir()
    tiny_contract(folder / "contracts", CLAIM)
    return folder


def snapshot(project: Path) -> dict[str, bytes]:
    """Every file under runs/ (temporaries included), by path."""
    runs = project / "runs"
    return {
        str(p.relative_to(runs)): p.read_bytes() for p in sorted(runs.rglob("*")) if p.is_file()
    }


def completes(project: Path, *args: str) -> None:
    """With room again, the run completes and writes its record."""
    done = gates(project, *RUN, *args)
    assert done.returncode == 0, done.stderr[-3000:]
    folder = project / "runs" / CLAIM
    assert (folder / REPORT).read_text() == render_report(read_evidence(folder / EVIDENCE))


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Path:
    """A project whose tiny claim is recorded (evidence, verdict.md, index; its runs in mlflow.db). Tests
    change copies of it (conftest's `project`): a re-run reuses its store's runs."""
    project = new_project(tmp_path_factory.mktemp("recorded") / "project")
    done = gates(project, *RUN)
    assert done.returncode == 0, done.stderr[-3000:]
    return project


# ---------------------------------------------------------------------------------- recognising
def _sqlite_full() -> sqlite3.Error:
    con = sqlite3.connect(":memory:")
    con.execute("PRAGMA max_page_count = 2")
    con.execute("CREATE TABLE t (x)")
    try:
        con.execute("INSERT INTO t VALUES (zeroblob(100000))")
    except sqlite3.Error as e:
        return e
    raise AssertionError("SQLite accepted a row past max_page_count")


def _sqlite_read_only(folder: Path) -> sqlite3.Error:
    path = folder / "ro.db"
    sqlite3.connect(path).execute("CREATE TABLE t (x)").connection.commit()
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        con.execute("INSERT INTO t VALUES (1)")
    except sqlite3.Error as e:
        return e
    raise AssertionError("SQLite wrote to a read-only connection")


def _sqlite_cannot_open(folder: Path) -> sqlite3.Error:
    try:
        sqlite3.connect(folder / "no such folder" / "x.db")
    except sqlite3.Error as e:
        return e
    raise AssertionError("SQLite opened a file in a missing folder")


def _raised(outer: type[Exception], inner: BaseException, how: str) -> BaseException:
    """`outer` raised from `inner` (`how` = cause) or while handling it (context)."""
    try:
        try:
            raise inner
        except BaseException as e:
            if how == "cause":
                raise outer("wrapped") from e
            raise outer("wrapped")  # noqa: B904 (the implicit context is what is tested)
    except outer as e:
        return e


@pytest.mark.parametrize(
    "number, code",
    [("ENOSPC", DISK_FULL), ("EDQUOT", DISK_FULL), ("EROFS", READ_ONLY), ("EACCES", READ_ONLY)],
)
def test_storage_errors_are_recognised_by_errno_with_the_file(number, code):
    error = OSError(getattr(errno, number), os.strerror(getattr(errno, number)), "runs/x.json")
    for wrapped in (error, _raised(RuntimeError, error, "cause"), _raised(KeyError, error, "ctx")):
        found = storage_error(wrapped)
        assert isinstance(found, StorageError) and (found.code, found.path) == (code, "runs/x.json")
        assert len(found.render().splitlines()) == 1 and number in found.render()
    assert storage_error(error, "runs/INDEX.jsonl").path == "runs/INDEX.jsonl"  # the caller's file


def test_other_errors_are_not_storage_errors():
    assert storage_error(OSError(errno.ENOENT, "No such file or directory", "x")) is None
    assert storage_error(OSError(errno.EIO, "Input/output error")) is None
    assert storage_error(ValueError("x")) is None
    # the words of a full disk, without its code, are not one: only codes are read
    assert storage_error(RuntimeError("database or disk is full")) is None
    assert storage_error(OSError("No space left on device")) is None


@pytest.mark.parametrize(
    "make, code, name",
    [
        (_sqlite_full, DISK_FULL, "SQLITE_FULL"),
        (_sqlite_read_only, READ_ONLY, "SQLITE_READONLY"),
        (_sqlite_cannot_open, READ_ONLY, "SQLITE_CANTOPEN"),
    ],
)
def test_sqlite_errors_are_recognised_by_their_code_through_sqlalchemy_and_mlflow(
    make, code, name, tmp_path
):
    import sqlalchemy.exc
    from mlflow.exceptions import MlflowException

    error = make() if make is _sqlite_full else make(tmp_path)
    found = storage_error(error)
    assert found is not None and found.code == code and name in found.detail
    # as MLflow raises it: MlflowException from SQLAlchemy's OperationalError around the sqlite3 error
    wrapped = sqlalchemy.exc.OperationalError("INSERT ...", {}, error)
    try:
        try:
            raise wrapped
        except sqlalchemy.exc.OperationalError as e:
            raise MlflowException(str(e)) from e
    except MlflowException as e:
        mlflow_error = e
    found = storage_error(mlflow_error)
    assert found is not None and found.code == code


def test_a_database_error_names_the_store_it_was_writing(tmp_path):
    """SQLAlchemy's errors do not say which database failed: open_client has them say it."""
    import sqlalchemy
    from sqlalchemy import event, text

    open_client(f"sqlite:///{tmp_path / 'mlflow.db'}")  # installs the naming of database errors
    engine = sqlalchemy.create_engine(f"sqlite:///{tmp_path / 'other.db'}")
    event.listen(
        engine, "connect", lambda con, _: con.execute("PRAGMA max_page_count = 2")
    )  # this engine's database holds two pages at most
    with pytest.raises(sqlalchemy.exc.OperationalError) as info:
        with engine.begin() as con:
            con.execute(text("CREATE TABLE t (x)"))
            con.execute(text("INSERT INTO t VALUES (zeroblob(100000))"))
    engine.dispose()
    found = storage_error(info.value)
    assert found is not None and found.code == DISK_FULL
    assert found.path == str(tmp_path / "other.db")


# ---------------------------------------------------------------------------------- evidence, index
@pytest.mark.parametrize(
    "call, when",
    [("replace", f"{CLAIM}/{EVIDENCE}"), ("fsync", f"/.{EVIDENCE}."), ("write", "INDEX.jsonl")],
)
def test_a_full_disk_while_recording_keeps_the_old_evidence_and_index(project, call, when):
    """A new attempt whose evidence (rename, sync) or index entry cannot be written: one line naming
    the file, exit 1; evidence.json, verdict.md and the index as they were, no temporary left."""
    before = snapshot(project)
    done = gates(
        project,
        *RUN,
        "--record",
        "--reason",
        "recorded again",
        script=DRIVER,
        env={"FAULT_CALL": call, "FAULT_WHEN": when, "FAULT_HOW": "raise"},
    )
    named = "runs/INDEX.jsonl" if call == "write" else f"runs/{CLAIM}/{EVIDENCE}"
    line = one_line(done, f"{named}: cannot write (disk_full: ENOSPC")
    assert "free space" in line
    after = snapshot(project)
    if call == "write":  # the new pair is in place before the index entry that vouches for it
        for name in (EVIDENCE, REPORT):
            after.pop(f"{CLAIM}/{name}"), before.pop(f"{CLAIM}/{name}")
    assert after == before  # no temporary, nothing half-written


@pytest.mark.parametrize("how", ["raise", "short"])
def test_a_full_disk_while_appending_to_the_index_leaves_it_as_it_was(project, how):
    """`gates withdraw` on a full disk: a failed or short append is cut off (no torn line)."""
    before = snapshot(project)
    done = gates(
        project,
        "withdraw",
        CLAIM,
        "--reason",
        "no longer claimed",
        script=DRIVER,
        env={"FAULT_CALL": "write", "FAULT_WHEN": "INDEX.jsonl", "FAULT_HOW": how},
    )
    one_line(done, "runs/INDEX.jsonl: cannot write (disk_full: ENOSPC")
    assert snapshot(project) == before
    done = gates(project, "withdraw", CLAIM, "--reason", "no longer claimed")
    assert done.returncode == 0, done.stderr[-3000:]


# ---------------------------------------------------------------------------------- the MLflow store
def test_a_full_mlflow_store_mid_run_is_one_line_and_the_rerun_completes(tmp_path):
    """A real SQLite store that cannot grow (SQLITE_FULL) while the runs are logged: one line naming the
    store, no evidence, the store intact; with the cap lifted, the run completes."""
    project = new_project(tmp_path / "project")
    store = project / "mlflow.db"
    open_client(f"sqlite:///{store}")  # built before the cap: its schema takes most of its pages
    with sqlite3.connect(store) as con:
        pages = con.execute("PRAGMA page_count").fetchone()[0]
    done = gates(project, *RUN, script=CAPPED, env={"CAP_PAGES": str(pages + 15)})
    one_line(done, "mlflow.db: cannot write (disk_full: SQLITE_FULL")
    assert '"event": "run"' in done.stdout  # it failed mid-run, after runs had finished
    assert '"status": "failed"' not in done.stdout  # no run recorded as the study's failure
    assert not (project / "runs" / CLAIM).exists() and snapshot(project) == {}
    with sqlite3.connect(store) as con:
        assert con.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    completes(project)


def test_a_full_disk_while_a_study_runs_stops_the_run_instead_of_failing_it(tmp_path, monkeypatch):
    """ENOSPC from inside a run (a file the study writes) is not the study's failure: the run stops
    with that error, nothing is recorded, and the runs before it stay finished in MLflow."""
    project = new_project(tmp_path / "project")
    monkeypatch.chdir(project)
    loaded = load_contract(project / "contracts" / f"{CLAIM}.yaml")
    study_cls = type(loaded.study)
    real = study_cls.run
    arms = list(loaded.arm_configs)

    def run(self, cfg, seed, reporter):
        if seed == 1 and cfg == loaded.arm_configs[arms[-1]]:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(project / "checkpoint.pt"))
        return real(self, cfg, seed, reporter)

    # on the class, not the registry's shared instance (see tests/test_audit.py's thread test)
    monkeypatch.setattr(study_cls, "run", run)
    uri = f"sqlite:///{project / 'mlflow.db'}"
    with pytest.raises(OSError) as info:
        run_contract(loaded, uri, project / "runs")
    found = storage_error(info.value)
    assert found is not None and found.path == str(project / "checkpoint.pt")
    assert not (project / "runs" / CLAIM).exists()
    client = open_client(uri)
    experiment = client.get_experiment_by_name(CLAIM).experiment_id
    statuses = [r.data.tags.get("gates.status") for r in client.search_runs([experiment])]
    assert "failed" not in statuses and statuses.count("completed") >= len(arms), statuses


# ---------------------------------------------------------------------------------- read-only
def _unprivileged() -> tuple[str, ...]:
    """How to run `gates` so that a chmod restricts it: as is for a user; for root (whom chmod does not
    restrict), in a new user namespace without a mapping (no capability over the files here)."""
    if os.geteuid() != 0:
        return ()
    unshare = shutil.which("unshare")
    if unshare is None or subprocess.run([unshare, "-U", "true"]).returncode != 0:
        pytest.skip("running as root, where chmod does not restrict, and unshare -U is unavailable")
    return (unshare, "-U")


def test_a_read_only_runs_folder_is_one_line(project):
    prefix = _unprivileged()
    runs = project / "runs"
    before = snapshot(project)
    runs.chmod(0o555)
    try:
        done = gates(project, *RUN, "--record", "--reason", "again", prefix=prefix)
    finally:
        runs.chmod(0o755)
    line = one_line(done, f"runs/.{CLAIM}.lock: cannot write (read_only: EACCES")
    assert "make it writable" in line
    assert snapshot(project) == before


def test_a_read_only_claim_folder_after_the_runs_is_one_line_and_the_rerun_records(project):
    """The runs are done (reused here) when the claim's folder refuses the new evidence: one line naming
    the file, the old pair kept; writable again, the attempt is recorded."""
    prefix = _unprivileged()
    folder = project / "runs" / CLAIM
    before = snapshot(project)
    folder.chmod(0o555)
    try:
        done = gates(project, *RUN, "--record", "--reason", "again", prefix=prefix)
    finally:
        folder.chmod(0o755)
    one_line(done, f"runs/{CLAIM}/{REPORT}: cannot write (read_only: EACCES")
    assert snapshot(project) == before
    completes(project, "--record", "--reason", "again")
    assert read_evidence(folder / EVIDENCE).attempt.number == 2


# ---------------------------------------------------------------------------------- a real full disk
TMPFS = textwrap.dedent("""
    set -u
    mount -t tmpfs -o size=2m tmpfs "$1" || exit 77
    cp -r contracts "$1/" && mkdir "$1/runs" && cp fresh.db "$1/mlflow.db" && cd "$1" || exit 3
    free=$(df -B1 --output=avail . | tail -1)
    head -c $((free - 150000)) /dev/zero > filler 2> /dev/null  # 150 kB left: a few runs' worth
    "$2" -m gates run contracts/c05-tiny.yaml --json > "$3/out1" 2> "$3/err1"; echo $? > "$3/rc1"
    ls -A runs > "$3/runs1"
    rm filler
    "$2" -m gates run contracts/c05-tiny.yaml --json > "$3/out2" 2> "$3/err2"; echo $? > "$3/rc2"
    cat runs/c05-tiny/verdict.md > "$3/verdict2"
""")


def test_a_real_full_tmpfs_is_one_line_and_the_rerun_completes(tmp_path):
    """A 2 MB tmpfs (mounted in a private mount namespace; skipped where none can be) filled up while
    the runs are logged: one line naming the store; with the space freed, the run completes."""
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("no unshare here to mount a tmpfs in a private namespace")
    project = new_project(tmp_path / "project")
    open_client(f"sqlite:///{project / 'fresh.db'}")
    (project / "mnt").mkdir()
    out = tmp_path / "out"
    out.mkdir()
    done = subprocess.run(
        [unshare, "-rm", "sh", "-c", TMPFS, "sh", str(project / "mnt"), sys.executable, str(out)],
        cwd=project,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode == 77 or not (out / "rc1").exists():
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()[-300:]}")
    first = subprocess.CompletedProcess([], int((out / "rc1").read_text()), "", "")
    first.stderr = (out / "err1").read_text()
    # the store, most likely; an artifact or the evidence, if the disk filled up there first
    assert "cannot write (disk_full: " in one_line(first, "")
    assert (out / "runs1").read_text() == ""  # no evidence, no index, no temporary
    assert (out / "rc2").read_text().strip() == "0", (out / "err2").read_text()[-3000:]
    assert (out / "verdict2").read_text().startswith("#")
