"""Safe YAML loading that remembers the line of every field.

Only plain data is built: any tag that would construct an object (`!!python/object`, custom `!tags`)
is refused, duplicate keys are refused, the file size is capped and aliases are bounded (a
"billion laughs" file cannot blow up memory). Returns the data and a map from field path to line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from gates.errors import UserError

# Tags a plain-data YAML file may carry (implicit or explicit); everything else builds objects.
_PLAIN_TAGS = {
    "tag:yaml.org,2002:" + t for t in ("str", "int", "float", "bool", "null", "map", "seq", "timestamp")
}
# libyaml's parser (same nodes and line marks) is ~10x faster; PyYAML's pure-Python one where absent
_COMPOSER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
MAX_ALIASES = 50
MAX_NODES = 100_000
MAX_DEPTH = 40


def load_yaml(path: Path, max_bytes: int) -> tuple[Any, dict[tuple, int]]:
    shown = str(path)
    try:
        size = path.stat().st_size
    except OSError as e:
        raise UserError(f"cannot read file: {e.strerror or e}", file=shown) from None
    if size > max_bytes:
        raise UserError(f"file is {size} bytes; expected at most {max_bytes}", file=shown)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"cannot read file as UTF-8 text: {e}", file=shown) from None
    return parse_yaml(text, shown)


def parse_yaml(text: str, shown: str = "<string>") -> tuple[Any, dict[tuple, int]]:
    try:
        root = yaml.compose(text, Loader=_COMPOSER)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark else None
        raise UserError(f"invalid YAML: {e.problem or e}", file=shown, line=line) from None
    except yaml.YAMLError as e:
        raise UserError(f"invalid YAML: {e}", file=shown) from None
    if root is None:
        raise UserError("file is empty; expected a contract mapping", file=shown, line=1)
    builder = _Builder(shown)
    data = builder.build(root, ())
    return data, builder.lines


class _Builder:
    def __init__(self, shown: str):
        self.shown = shown
        self.lines: dict[tuple, int] = {}
        self.seen: set[int] = set()
        self.alias_uses = 0
        self.nodes = 0
        self.scalars = yaml.SafeLoader("")  # PyYAML's safe scalar resolution (ints, floats, bools, null)

    def fail(self, node: Node, msg: str):
        raise UserError(msg, file=self.shown, line=node.start_mark.line + 1)

    def build(self, node: Node, path: tuple) -> Any:
        self.nodes += 1
        if self.nodes > MAX_NODES:
            self.fail(node, f"too many values (aliases expand to more than {MAX_NODES}); expected a small contract")
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
