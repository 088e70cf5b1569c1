"""User-facing errors: one line each, naming the file, the line, the field and what is expected."""

from __future__ import annotations


class UserError(Exception):
    """A mistake in the user's input. The CLI prints it without a traceback and exits with 2."""

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


class UserErrors(UserError):
    """Several user errors found at once (all of a contract's validation errors, say)."""

    def __init__(self, errors: list[UserError]):
        self.errors = errors
        super().__init__("\n".join(e.render() for e in errors))

    def render(self) -> str:  # each error stays on its own line
        return "\n".join(e.render() for e in self.errors)


def did_you_mean(name: str, choices) -> str:
    """' (did you mean 'x'?)' for a near miss, else ''."""
    import difflib

    close = difflib.get_close_matches(str(name), [str(c) for c in choices], n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""
