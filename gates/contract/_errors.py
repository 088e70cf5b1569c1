"""A validation error in the contract's own words: where it is in the YAML file (`_dotted`: the field
path, `_line_for`: its line) and what it says (`_explain`, with a did-you-mean from the fields the model
has there, `_fields_at`).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from gates.contract._conditions import Compare, Threshold, Trend
from gates.errors import did_you_mean


# ---------------------------------------------------------------------------------- error helpers
def _dotted(loc: tuple) -> str:
    # pydantic's validator and union-tag steps are not fields of the YAML
    return ".".join(
        str(p)
        for p in loc
        if not str(p).startswith(("function-after", "tagged-union"))
        and (not isinstance(p, str) or _keep(p))
    )


def _line_for(lines: dict[tuple, int], loc: tuple) -> int | None:
    """The line of the deepest part of `loc` that the YAML file has (a missing field: its parent)."""
    loc = tuple(p for p in loc if not isinstance(p, str) or p in _keep(p))
    for n in range(len(loc), -1, -1):
        if loc[:n] in lines:
            return lines[loc[:n]]
    return None


def _keep(p: str) -> str:
    # pydantic puts union tags ('threshold', 'compare', 'trend') into error locations; the YAML does not
    return p if p not in ("threshold", "compare", "trend") else ""


def _explain(error: dict, root: type[BaseModel]) -> str:
    kind, msg, loc = error["type"], error["msg"], tuple(error["loc"])
    if kind == "extra_forbidden":
        known = _fields_at(root, loc[:-1])
        hint = did_you_mean(loc[-1], known) if known else ""
        expected = f"; expected one of: {', '.join(known)}" if known and not hint else ""
        return f"unknown field{hint}{expected}"
    if kind == "missing":
        return "required field is missing"
    if kind == "union_tag_invalid":
        return "unknown condition kind; expected one of: threshold, compare, trend"
    if kind == "union_tag_not_found":
        return "a condition needs a 'kind': threshold, compare or trend"
    if kind == "literal_error":
        return f"{msg}, got {error.get('input')!r}"
    got = error.get("input")
    if kind == "value_error" and isinstance(got, (dict, list)) and msg:
        # our own check of a whole section or list: its message names the values; "got dict" adds nothing
        return msg[0].lower() + msg[1:]
    shown = repr(got) if not isinstance(got, (dict, list)) else type(got).__name__
    return f"{msg[0].lower() + msg[1:]}, got {shown}" if msg else f"invalid value {shown}"


def _fields_at(model: type[BaseModel], loc: tuple) -> list[str]:
    """The field names of the model found at `loc` under `model` (best effort, for hints)."""
    import typing

    current: Any = model
    for part in loc:
        if isinstance(current, type) and issubclass(current, BaseModel):
            if part in current.model_fields:
                current = current.model_fields[part].annotation
            elif part in ("threshold", "compare", "trend"):
                current = {"threshold": Threshold, "compare": Compare, "trend": Trend}[part]
            else:
                return []
        else:
            args = [a for a in typing.get_args(current) if a is not type(None)]
            models = [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]
            if models:
                current = models[0]
                if part in current.model_fields:
                    current = current.model_fields[part].annotation
            elif args:
                current = args[-1]
    while not (isinstance(current, type) and issubclass(current, BaseModel)):
        args = [a for a in typing.get_args(current) if a is not type(None)]
        models = [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]
        if not args:
            return []
        current = models[0] if models else args[-1]
    return list(current.model_fields)
