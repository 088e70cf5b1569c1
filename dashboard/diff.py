"""What changed between two versions of a contract: their YAML mappings compared field by field.

A field is a path to a value: mapping keys joined by dots, list items by index
(`decision.supported_if[0].margin`); a list of plain values (`seeds: [0, 1, 2]`, a pattern) is one
value, so a changed seed list reads as one change, old -> new; so is a section present in one
version only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

CHANGED, ADDED, REMOVED = "changed", "added", "removed"


@dataclass(frozen=True)
class Change:
    path: str
    kind: str  # changed | added | removed
    old: object = None  # absent when added
    new: object = None  # absent when removed


def contract_diff(old: dict, new: dict) -> list[Change]:
    """The fields that differ, in the newer contract's order (a removed field where it stood in the
    older one); a mapping or list present on one side only is one change (`convergence` added)."""
    out: list[Change] = []
    _diff(old, new, "", out)
    return out


def _nested(value) -> bool:
    """A mapping, or a list holding mappings or lists: compared item by item."""
    return isinstance(value, dict) or (
        isinstance(value, list) and any(isinstance(x, (dict, list)) for x in value)
    )


def _diff(old, new, path: str, out: list[Change]) -> None:
    if isinstance(old, dict) and isinstance(new, dict):
        keys = _merged_order(list(old), list(new))
        where = {k: f"{path}.{k}" if path else str(k) for k in keys}
    elif isinstance(old, list) and isinstance(new, list) and (_nested(old) or _nested(new)):
        keys = list(range(max(len(old), len(new))))
        where = {i: f"{path}[{i}]" for i in keys}
        old, new = dict(enumerate(old)), dict(enumerate(new))
    else:
        if not _same(old, new):
            out.append(Change(path, CHANGED, old, new))
        return
    for k in keys:
        if k not in old:
            out.append(Change(where[k], ADDED, new=new[k]))
        elif k not in new:
            out.append(Change(where[k], REMOVED, old=old[k]))
        else:
            _diff(old[k], new[k], where[k], out)


def _merged_order(old: list, new: list) -> list:
    """The newer keys in their order, each older-only key after the key that preceded it there."""
    order = list(new)
    for i, key in enumerate(old):
        if key not in order:
            previous = next((k for k in reversed(old[:i]) if k in order), None)
            order.insert(order.index(previous) + 1 if previous is not None else 0, key)
    return order


def _same(a, b) -> bool:
    """Equal as YAML values (1 and 1.0 are the same number; True is not 1)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return a == b


def shown(value) -> str:
    """A value as one line of text: strings as written, the rest as JSON (numbers, lists, a whole
    section added or removed, null)."""
    if isinstance(value, str) and value.strip():
        return value
    return json.dumps(value, ensure_ascii=False, default=str)
