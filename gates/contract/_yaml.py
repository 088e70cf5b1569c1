"""Safe YAML loading that remembers the line of every field.

Only plain data is built: any tag that would construct an object (`!!python/object`, custom `!tags`)
is refused, duplicate keys are refused, the size is capped by the bytes actually read (and only a
regular file is read: never a device, FIFO or folder), a control character is refused at its line,
and aliases are bounded (a "billion laughs" file cannot blow up memory). Returns the data and a map
from field path to line.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from gates.errors import UserError

# Tags a plain-data YAML file may carry (implicit or explicit); everything else builds objects.
_PLAIN_TAGS = {
    "tag:yaml.org,2002:" + t
    for t in ("str", "int", "float", "bool", "null", "map", "seq", "timestamp")
}
# libyaml's parser (same nodes and line marks) is ~10x faster; PyYAML's pure-Python one where absent
_COMPOSER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
MAX_ALIASES = 50
MAX_NODES = 100_000
MAX_DEPTH = 40


def read_capped(path: Path, max_bytes: int) -> bytes:
    """The bytes of a regular file, at most `max_bytes` of them: ValueError (what is wrong, one line)
    otherwise. The cap is real (max_bytes + 1 bytes are read, whatever size the file reports: /dev/zero
    and /proc files report none), and a FIFO, device or folder is refused before any read (opened
    without blocking, so a FIFO with no writer cannot hang the reader)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    except OSError as e:
        raise ValueError(f"cannot read file: {e.strerror or e}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = (
                "a folder"
                if stat.S_ISDIR(mode)
                else "a FIFO"
                if stat.S_ISFIFO(mode)
                else "a device"
                if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
                else "a socket"
                if stat.S_ISSOCK(mode)
                else "a special file"
            )
            raise ValueError(f"{kind}, not a regular file; expected a regular file")
        chunks, left = [], max_bytes + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    except OSError as e:
        raise ValueError(f"cannot read file: {e.strerror or e}") from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > max_bytes:
        raise ValueError(f"file is larger than {max_bytes} bytes; expected at most {max_bytes}")
    return data


def load_yaml(path: Path, max_bytes: int) -> tuple[Any, dict[tuple, int]]:
    shown = str(path)
    try:
        raw = read_capped(Path(path), max_bytes)
    except ValueError as e:
        raise UserError(str(e), file=shown) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise UserError(
            f"cannot read file as UTF-8 text: byte 0x{raw[e.start]:02x} is not UTF-8; expected "
            f"UTF-8 text",
            file=shown,
            line=line,
        ) from None
    return parse_yaml(text, shown)


def parse_yaml(text: str, shown: str = "<string>") -> tuple[Any, dict[tuple, int]]:
    try:
        root = yaml.compose(text, Loader=_COMPOSER)
    except (
        yaml.reader.ReaderError
    ) as e:  # a character YAML does not allow: no mark, only a position
        position = e.position if isinstance(e.position, int) else 0
        line = text.count("\n", 0, position) + 1
        char = (
            e.character
            if isinstance(e.character, str)
            else chr(e.character)
            if isinstance(e.character, int)
            else "?"
        )
        raise UserError(
            f"invalid YAML: character U+{ord(char):04X} is not allowed (a control character); "
            f"expected printable text (write it as an escape in a double-quoted string)",
            file=shown,
            line=line,
        ) from None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark else None
        raise UserError(
            f"invalid YAML: {_one_line(e.problem or e)}", file=shown, line=line
        ) from None
    except yaml.YAMLError as e:
        raise UserError(f"invalid YAML: {_one_line(e)}", file=shown) from None
    if root is None:
        raise UserError("file is empty; expected a contract mapping", file=shown, line=1)
    builder = _Builder(shown)
    data = builder.build(root, ())
    return data, builder.lines


def _one_line(what) -> str:
    return "; ".join(part.strip() for part in str(what).splitlines() if part.strip())


class _Builder:
    def __init__(self, shown: str):
        self.shown = shown
        self.lines: dict[tuple, int] = {}
        self.seen: set[int] = set()
        self.alias_uses = 0
        self.nodes = 0
        self.scalars = yaml.SafeLoader(
            ""
        )  # PyYAML's safe scalar resolution (ints, floats, bools, null)

    def fail(self, node: Node, msg: str):
        raise UserError(msg, file=self.shown, line=node.start_mark.line + 1)

    def build(self, node: Node, path: tuple) -> Any:
        self.nodes += 1
        if self.nodes > MAX_NODES:
            self.fail(
                node,
                f"too many values (aliases expand to more than {MAX_NODES}); expected a small contract",
            )
        if len(path) > MAX_DEPTH:
            self.fail(node, f"nested deeper than {MAX_DEPTH} levels (a recursive alias?)")
        if id(node) in self.seen:  # reached again: this is an alias (*name) of an anchored node
            self.alias_uses += 1
            if self.alias_uses > MAX_ALIASES:
                self.fail(node, f"more than {MAX_ALIASES} alias uses; write the values out")
        self.seen.add(id(node))
        self.lines.setdefault(path, node.start_mark.line + 1)
        if node.tag not in _PLAIN_TAGS:
            self.fail(node, f"YAML tag {node.tag!r} is not allowed; contracts hold plain data only")
        if isinstance(node, ScalarNode):
            return self.scalars.construct_object(node, deep=True)
        if isinstance(node, SequenceNode):
            return [self.build(child, path + (i,)) for i, child in enumerate(node.value)]
        if isinstance(node, MappingNode):
            out: dict = {}
            for key_node, value_node in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    self.fail(key_node, "merge keys ('<<') are not allowed; write the fields out")
                if not isinstance(key_node, ScalarNode):
                    self.fail(key_node, "mapping keys must be plain scalars")
                key = self.build(key_node, path + ("<key>",))
                if isinstance(key, (list, dict)) or key is None:
                    self.fail(key_node, "mapping keys must be plain scalars")
                key = str(key) if not isinstance(key, (int, str)) else key
                if key in out:
                    self.fail(key_node, f"duplicate key {key!r}; each field may appear once")
                self.lines[path + (key,)] = key_node.start_mark.line + 1
                out[key] = self.build(value_node, path + (key,))
            self.lines.pop(path + ("<key>",), None)
            return out
        self.fail(node, "unsupported YAML node")
