"""User-facing errors: one line each, naming the file, the line, the field and what is expected."""

from __future__ import annotations

import os

# What a program reading `--json` output matches on (the "code" of an error object), never the message.
USER_ERROR = "user_error"  # UserError: exit 2
# the command line itself (an unknown option, a missing argument): exit 2
USAGE_ERROR = "usage_error"


class UserError(Exception):
    """A mistake in the user's input. The CLI prints it without a traceback and exits with 2."""

    code = USER_ERROR

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        line: int | None = None,
        field: str | None = None,
    ):
        self.message = message
        self.file = file
        self.line = line
        self.field = field
        super().__init__(self.render())

    def render(self) -> str:
        where = ""
        if self.file:
            where = f"{self.file}:{self.line}: " if self.line else f"{self.file}: "
        what = f"{self.field}: " if self.field else ""
        return f"{where}{what}{self.message}"

    def as_dict(self) -> dict:
        """The error as `gates ... --json` prints it: {"code", "message", "file", "line", "field"}."""
        return {
            "code": self.code,
            "message": self.message,
            "file": self.file,
            "line": self.line,
            "field": self.field,
        }


class UserErrors(UserError):
    """Several user errors found at once (all of a contract's validation errors, say)."""

    def __init__(self, errors: list[UserError]):
        self.errors = errors
        super().__init__("\n".join(e.render() for e in errors))

    def render(self) -> str:  # each error stays on its own line
        return "\n".join(e.render() for e in self.errors)

    def as_dict(self) -> dict:  # the first error's fields, and every one in `errors`
        first = self.errors[0].as_dict() if self.errors else super().as_dict()
        return {**first, "errors": [e.as_dict() for e in self.errors]}


# ---------------------------------------------------------------------------------- problems
class Problem(str):
    """A problem with a claim: its message (a str, as every command prints it) and `code`, what a
    reader matches on (the dashboard's hash status, CI filters), never the English text."""

    code: str

    def __new__(cls, code: str, message: str) -> Problem:
        self = super().__new__(cls, message)
        self.code = code
        return self

    def __reduce__(self):
        return (Problem, (self.code, str(self)))


def did_you_mean(name: str, choices) -> str:
    """' (did you mean 'x'?)' for a near miss, else ''."""
    import difflib

    close = difflib.get_close_matches(str(name), [str(c) for c in choices], n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


# ---------------------------------------------------------------------------------- storage
# A full disk or a store or folder that cannot be written is neither the user's input (exit 2) nor a
# study's failure (a failed run in the evidence): the command stops and says in one line which file and
# what to free or change (exit 1). Recognised by error codes, never by an exception's English text.
DISK_FULL = "disk_full"
READ_ONLY = "read_only"
# errno names, looked up where the platform has them
_ERRNOS = ("ENOSPC", "EDQUOT", "EROFS", "EACCES")
# SQLite primary result codes (sqlite.org/rescode.html; an extended code keeps its primary in the low
# byte): SQLITE_FULL, SQLITE_READONLY, SQLITE_CANTOPEN
_SQLITE = {13: DISK_FULL, 8: READ_ONLY, 14: READ_ONLY}
_SQLITE_BUSY = (5, 6)  # SQLITE_BUSY, SQLITE_LOCKED
# set on a database error by gates.record: the file of the database it was writing
DATABASE_ATTR = "gates_database"


class StorageError(Exception):
    """The disk is full, or a file, folder or store cannot be written. The CLI prints it in one line
    without a traceback and exits with 1. `code`: DISK_FULL or READ_ONLY; `path`: the file or store
    being written (None when nothing names it); `detail`: the system's or SQLite's own words."""

    def __init__(self, code: str, path: str | None, detail: str):
        self.code = code
        self.path = path
        self.detail = detail
        super().__init__(self.render())

    def render(self) -> str:
        where = f"{self.path}: " if self.path else ""
        if self.code == DISK_FULL:
            fix = "free space on its disk (or quota)"
        else:
            fix = "make it writable for this user (its file, folder and file system)"
        return (
            f"{where}cannot write ({self.code}: {self.detail}); {fix}, then run the command again "
            f"(what was written before is kept)"
        )

    def as_dict(self) -> dict:
        """The error as `gates ... --json` prints it (`file`: the file or store it names)."""
        return {
            "code": self.code,
            "message": self.render(),
            "file": self.path,
            "detail": self.detail,
        }


def storage_error(exc: BaseException, path=None) -> StorageError | None:
    """A StorageError when `exc`, or any exception it was raised from or while handling (`__cause__`,
    `__context__`, SQLAlchemy's `orig`: MLflow wraps SQLAlchemy, which wraps sqlite3), is a full disk
    or quota (ENOSPC, EDQUOT, SQLITE_FULL) or an unwritable target (EROFS, EACCES, SQLITE_READONLY,
    SQLITE_CANTOPEN); else None. `path`: the file being written, when the caller knows it (it names
    the error before the exception's own file name: a temporary file's, say)."""
    import errno

    errnos = {getattr(errno, n): n for n in _ERRNOS if hasattr(errno, n)}
    for e in _causes(exc):
        if isinstance(e, StorageError):
            return e
        if isinstance(e, OSError) and e.errno in errnos:
            code = DISK_FULL if errnos[e.errno] in ("ENOSPC", "EDQUOT") else READ_ONLY
            named = e.filename2 if e.filename2 is not None else e.filename
            detail = f"{errnos[e.errno]}, {e.strerror or e}"
            return StorageError(code, _name(path if path is not None else named), detail)
        sqlite_code = getattr(e, "sqlite_errorcode", None)  # sqlite3.Error (Python >= 3.11)
        if isinstance(sqlite_code, int) and sqlite_code & 0xFF in _SQLITE:
            name = getattr(e, "sqlite_errorname", None) or f"SQLite error {sqlite_code}"
            named = path if path is not None else getattr(e, DATABASE_ATTR, None)
            return StorageError(_SQLITE[sqlite_code & 0xFF], _name(named), f"{name}, {e}")
    return None


def store_busy(exc: BaseException) -> bool:
    """Whether `exc`, or any exception it was raised from or while handling, is SQLite's "database is
    locked" (SQLITE_BUSY, SQLITE_LOCKED): another connection held the database, and trying again may
    succeed (MLflow raises it as TEMPORARILY_UNAVAILABLE, as it does every SQLAlchemy OperationalError)."""
    return any(
        isinstance(code := getattr(e, "sqlite_errorcode", None), int)
        and code & 0xFF in _SQLITE_BUSY
        for e in _causes(exc)
    )


def _causes(exc: BaseException):
    """`exc`, then each exception it was raised from or while handling (`__cause__`, `__context__`,
    SQLAlchemy's `orig`: MLflow wraps SQLAlchemy, which wraps sqlite3), each once."""
    seen: set[int] = set()
    todo = [exc]
    while todo:
        e = todo.pop(0)
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        todo += [e.__cause__, e.__context__, getattr(e, "orig", None)]


def _name(path) -> str | None:
    if path is None:
        return None
    return os.fsdecode(path) if isinstance(path, (str, bytes, os.PathLike)) else str(path)
