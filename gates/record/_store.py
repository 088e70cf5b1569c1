"""The embedded MLflow SQLite store, created all-or-nothing and checked before MLflow opens it.

MLflow builds a new SQLite store in place, one schema migration after another (a few seconds; each
migration commits on its own). A kill, a full disk or a second process doing the same at that moment
used to leave `mlflow.db` half-migrated, and every later run died with `table ... already exists`.
Here a missing store is built under a temporary name in the same folder and renamed into place, under
a file lock (`<name>-gates.lock` beside it) so that two first runs do not race: an interruption leaves
either no store or a complete one. A half-built store left by an older version that holds no runs is
rebuilt the same way; one at an older schema that holds runs is upgraded on a copy, renamed into place
when the upgrade succeeds. A store that holds runs and cannot be used (truncated, not a database,
half-migrated) is a one-line error naming the path and the fix; it is never touched.

Only `sqlite:` URIs are handled; tracking servers and other databases are MLflow's business.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import sqlite3
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from gates.errors import UserError
from gates.record._files import fsync_dir

HEADER = b"SQLite format 3\x00"
JOURNALS = ("-journal", "-wal", "-shm")
BUILDING = ".building"

# states of a store file
MISSING, COMPLETE, PARTIAL, DAMAGED = "missing", "complete", "partial", "damaged"


class StoreError(UserError):
    """An MLflow SQLite store that cannot be used as it is: one line, with the path and the fix."""


def sqlite_path(uri: str) -> Path | None:
    """The file of a `sqlite:` tracking URI; None for other URIs and in-memory databases."""
    if not uri.startswith("sqlite:"):
        return None
    from sqlalchemy.engine import make_url

    database = make_url(uri).database
    if not database or database == ":memory:" or database.startswith("file:"):
        return None
    return Path(database)


@dataclass
class Inspection:
    state: str  # MISSING, COMPLETE, PARTIAL or DAMAGED
    runs: int = 0  # runs the store holds (PARTIAL; -1 when they cannot be counted)
    detail: str = ""  # what is wrong, for the error message


@lru_cache(maxsize=1)
def _schema() -> tuple[str, frozenset[str]]:
    """(head revision, table names) of the schema this MLflow writes."""
    import mlflow.store.db.utils as db_utils  # imports every ORM model, so the table list is complete
    from mlflow.store.db.base_sql_model import Base

    return db_utils._get_latest_schema_revision(), frozenset(Base.metadata.tables)


def _truncated(path: Path) -> str | None:
    """'is truncated (...)' when the file is shorter than its header says (read after SQLite opened it,
    which rolls back a hot journal first), else None."""
    try:
        with path.open("rb") as f:
            header = f.read(100)
        size = path.stat().st_size
    except OSError:
        return None
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    pages = int.from_bytes(header[28:32], "big")
    valid = (
        header[24:28] == header[92:96]
    )  # the in-header page count is valid (SQLite >= 3.7.0 writers)
    if valid and pages and size < pages * page_size:
        return f"is truncated ({size} bytes; its header says {pages * page_size})"
    return None


@lru_cache(maxsize=1)
def _initial_tables() -> frozenset[str]:
    """Tables of MLflow's first schema (a half-built store may hold some that later migrations drop)."""
    from mlflow.store.tracking.dbmodels.initial_models import Base as InitialBase

    return frozenset(InitialBase.metadata.tables)


def inspect(path: Path) -> Inspection:
    """What state the store file at `path` is in (reads only; SQLite rolls back a hot journal)."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return Inspection(MISSING)
    except OSError as e:
        return Inspection(DAMAGED, -1, f"cannot be read ({e.strerror or e})")
    if size == 0:
        return Inspection(MISSING)  # created and never written: holds nothing
    try:
        with path.open("rb") as f:
            header = f.read(100)
    except OSError as e:
        return Inspection(DAMAGED, -1, f"cannot be read ({e.strerror or e})")
    if not header.startswith(HEADER):
        return Inspection(DAMAGED, -1, "is not an SQLite database")
    head, expected = _schema()
    try:
        con = sqlite3.connect(path, timeout=30)
        try:
            tables = {
                row[0] for row in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            }
            version = None
            if "alembic_version" in tables:
                rows = con.execute("SELECT version_num FROM alembic_version").fetchall()
                version = rows[0][0] if len(rows) == 1 else None
            complete = (
                version == head
                and expected <= tables
                and not any(t.startswith("_alembic_tmp_") for t in tables)
            )
            runs = (
                0
                if complete or "runs" not in tables
                else con.execute("SELECT count(*) FROM runs").fetchone()[0]
            )
        finally:
            con.close()
    except (sqlite3.Error, OSError) as e:
        return Inspection(DAMAGED, -1, _truncated(path) or f"cannot be read as a database ({e})")
    truncated = _truncated(path)
    if truncated:
        return Inspection(DAMAGED, -1, truncated)
    if complete:
        return Inspection(COMPLETE)
    foreign = sorted(
        t
        for t in tables - expected - _initial_tables() - {"alembic_version"}
        if not t.startswith(("_alembic_tmp_", "sqlite_"))
    )
    if foreign:  # someone else's database: never rebuilt or upgraded here
        return Inspection(DAMAGED, -1, f"is not an MLflow store (it has a table {foreign[0]!r})")
    missing = sorted(expected - tables)
    leftovers = sorted(t for t in tables if t.startswith("_alembic_tmp_"))
    what = [f"schema version {version or 'none'} (this MLflow writes {head})"]
    if missing:
        what.append(f"{len(missing)} table(s) missing, e.g. {missing[0]}")
    if leftovers:
        what.append(f"an interrupted migration's {leftovers[0]}")
    return Inspection(PARTIAL, runs, "; ".join(what))


def ensure(uri: str, *, create: bool = True) -> None:
    """Make sure the SQLite store of `uri` is complete before MLflow opens it (nothing for other URIs).
    `create`: build a missing or half-built store (else, e.g. for the read-only dashboard, say so).
    StoreError (a UserError: one line, exit 2) when the store cannot be used."""
    path = sqlite_path(uri)
    if path is None:
        return
    found = inspect(path)
    if found.state == COMPLETE:
        return  # the common case: no lock, no writes
    if not create:
        _refuse(path, uri, found, readonly=True)
    with _locked(path):
        found = inspect(path)  # another process may have built it while this one waited
        if found.state == COMPLETE:
            return
        _clean_leftovers(path)
        if found.state == MISSING or (found.state == PARTIAL and found.runs == 0):
            _build(path, uri, None)
        elif found.state == PARTIAL:
            _build(path, uri, found)  # an older schema that holds runs: upgrade a copy
        else:
            _refuse(path, uri, found)


def _refuse(path: Path, uri: str, found: Inspection, readonly: bool = False):
    if found.state == MISSING:
        raise StoreError("MLflow store not found; `gates run` creates it", file=str(path))
    if found.state == PARTIAL and readonly:  # the dashboard reads; it never builds or upgrades
        if found.runs == 0:
            raise StoreError(
                f"MLflow store is half-built and holds no runs: the next `gates run` rebuilds it "
                f"({found.detail})",
                file=str(path),
            )
        raise StoreError(
            f"MLflow store is at an older schema or half-migrated and holds {found.runs} runs: the next "
            f"`gates run` upgrades a copy of it, or says what to do ({found.detail})",
            file=str(path),
        )
    runs = {-1: "", 0: " and holds no runs"}.get(found.runs, f" and holds {found.runs} runs")
    fix = _FIX.format(path=path)
    if found.detail.startswith(
        "cannot be read ("
    ):  # permissions, an I/O error: the file may be fine
        fix = "expected a file this user can read and write (check its permissions and the disk)"
    raise StoreError(f"MLflow store {found.detail}{runs}; {fix}", file=str(path))


_FIX = (
    "restore it from a backup, or move it aside (mv {path} {path}.damaged) and re-run: `gates run` starts a "
    "new store there and retrains the runs it lacks (evidence in runs/ is kept)"
)


@contextlib.contextmanager
def _locked(path: Path):
    """An exclusive lock on `<store>-gates.lock` beside the store, held while it is created."""
    lock = path.parent / f"{path.name}-gates.lock"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as e:
        raise StoreError(
            f"cannot create the MLflow store's lock file {lock} ({e.strerror or e}); expected a "
            f"writable folder",
            file=str(path),
        ) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _siblings(path: Path, name: str) -> list[Path]:
    return [path.parent / (name + suffix) for suffix in ("", *JOURNALS)]


def _clean_leftovers(path: Path) -> None:
    """Temporary stores of builds that were killed (only ever called under the lock)."""
    for tmp in path.parent.glob(f".{path.name}.*{BUILDING}*"):
        with contextlib.suppress(OSError):
            tmp.unlink()


def _build(path: Path, uri: str, upgrade: Inspection | None) -> None:
    """A complete store under a temporary name in the same folder, then renamed onto `path`: a new one,
    or (`upgrade`) a copy of the present one brought to this MLflow's schema."""
    import mlflow.store.db.utils as db_utils
    import sqlalchemy
    from sqlalchemy.pool import NullPool

    tmp = path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}{BUILDING}"
    engine = None
    try:
        if upgrade is not None:
            with (
                contextlib.closing(sqlite3.connect(path, timeout=30)) as src,
                contextlib.closing(sqlite3.connect(tmp)) as dst,
            ):
                src.backup(dst)
        engine = sqlalchemy.create_engine(f"sqlite:///{tmp}", poolclass=NullPool)
        if upgrade is None or not db_utils._all_tables_exist(engine):
            db_utils._initialize_tables(
                engine
            )  # MLflow's own creation: initial tables, then every migration
        else:
            db_utils._upgrade_db(engine)
        engine.dispose()
        engine = None
        built = inspect(tmp)
        if built.state != COMPLETE:
            raise RuntimeError(f"the new store is incomplete: {built.detail}")
        with tmp.open("rb") as f:
            os.fsync(f.fileno())
        for stale in _siblings(path, path.name)[1:]:  # a hot journal must never meet the new file
            with contextlib.suppress(FileNotFoundError):
                stale.unlink()
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except BaseException as e:
        if engine is not None:
            engine.dispose()
        for leftover in _siblings(tmp, tmp.name):
            with contextlib.suppress(OSError):
                leftover.unlink()
        if not isinstance(e, Exception):
            raise  # KeyboardInterrupt, SystemExit: nothing was renamed, the store is as it was
        reason = " ".join(str(getattr(e, "orig", None) or e).split())[:300]
        if upgrade is not None:
            raise StoreError(
                f"MLflow store is half-migrated or damaged ({upgrade.detail}; upgrading a copy "
                f"failed: {reason}) and holds {upgrade.runs} runs, left as they are; "
                f"{_FIX.format(path=path)}",
                file=str(path),
            ) from None
        raise StoreError(
            f"cannot create the MLflow store ({reason}); expected a writable folder with free "
            f"space (or --tracking-uri elsewhere); nothing was left behind",
            file=str(path),
        ) from None
