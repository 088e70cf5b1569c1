"""MkDocs hook: the contract reference's field tables, rendered from the code at build time.

`docs/contract.md` holds the marker below; this hook replaces it with one table per model of
`gates.contract.Contract.model_json_schema()` (what `gates schema` prints): every field with its type,
whether it is required or its default, its constraints and its description. The tables cannot drift
from the schema: a field added, removed or re-described in `gates/contract/_schema.py` shows in the
next `mkdocs build`. Named in mkdocs.yml (`hooks:`); docs/hooks/ is excluded from the site.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

MARKER = "<!-- gates:contract-schema -->"
PAGE = "contract.md"

# Constraint keywords of JSON Schema, as they are written in a table cell.
_BOUNDS = {
    "minimum": ">= {}",
    "exclusiveMinimum": "> {}",
    "maximum": "<= {}",
    "exclusiveMaximum": "< {}",
    "minLength": "at least {} character(s)",
    "maxLength": "at most {} characters",
    "minItems": "at least {} item(s)",
    "maxItems": "at most {} items",
    "minProperties": "at least {} entry(ies)",
    "maxProperties": "at most {} entries",
    "pattern": "matches `{}`",
}

_AT_LEAST_ONE = ("minLength", "minItems", "minProperties")


def _anchor(name: str) -> str:
    return "schema-" + name.lower()


def _code(value) -> str:
    return "`" + json.dumps(value) + "`"


def _cell(text: str) -> str:
    """A table cell: one line, pipes escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _type(schema: dict) -> str:
    """A field's type in words, with links to the tables of the models it names."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{_anchor(name)})"
    if "const" in schema:
        return _code(schema["const"])
    if "enum" in schema:
        return " or ".join(_code(v) for v in schema["enum"])
    for key in ("anyOf", "oneOf"):
        if key in schema:
            options = [s for s in schema[key] if s.get("type") != "null"]
            text = " or ".join(_type(s) for s in options)
            return text + " or null" if len(options) < len(schema[key]) else text
    kind = schema.get("type")
    if kind == "array":
        return "list of " + _type(schema.get("items", {}))
    if kind == "object":
        values = schema.get("additionalProperties")
        if isinstance(values, dict) and values:
            return "map of name to " + _type(values)
        return "mapping"
    names = {"string": "text", "integer": "integer", "number": "number", "boolean": "boolean"}
    return names.get(kind, kind or "any")


def _constraints(schema: dict) -> list[str]:
    """The bounds of a field and of the non-null options of a union."""
    found = [
        "non-empty" if key in _AT_LEAST_ONE and schema[key] == 1 else fmt.format(schema[key])
        for key, fmt in _BOUNDS.items()
        if key in schema
    ]
    for option in schema.get("anyOf", []):
        if option.get("type") != "null" and "$ref" not in option:
            found += _constraints(option)
    items = schema.get("items")
    if isinstance(items, dict) and "$ref" not in items and "oneOf" not in items:
        found += [f"each {text}" for text in _constraints(items)]
    return found


def _model_table(name: str, model: dict, title: str) -> list[str]:
    lines = [f"### {title} {{#{_anchor(name)}}}", ""]
    if model.get("description"):
        lines += [" ".join(model["description"].split()), ""]
    if model.get("additionalProperties") is False:
        lines += ["Unknown fields are refused.", ""]
    required = set(model.get("required", []))
    lines += [
        "| field | type | required / default | constraints | description |",
        "|---|---|---|---|---|",
    ]
    for field, schema in model.get("properties", {}).items():
        need = "required" if field in required else "default " + _code(schema.get("default"))
        if field not in required and "default" not in schema:
            need = "optional"
        cells = [
            f"`{field}`",
            _type(schema),
            need,
            "; ".join(_constraints(schema)) or "",
            schema.get("description", ""),
        ]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return lines + [""]


def _refs(schema) -> list[str]:
    """The models a schema names, in the order they first appear."""
    found: list[str] = []
    if isinstance(schema, dict):
        if "$ref" in schema:
            found.append(schema["$ref"].rsplit("/", 1)[-1])
        for key, value in schema.items():
            if key != "discriminator":
                found += _refs(value)
    elif isinstance(schema, list):
        for value in schema:
            found += _refs(value)
    return found


def render(schema: dict) -> str:
    """Markdown tables for a contract schema: the top level, then each model as first named."""
    defs = schema.get("$defs", {})
    order: list[str] = []
    queue = _refs(schema.get("properties", {}))
    while queue:
        name = queue.pop(0)
        if name not in order and name in defs:
            order.append(name)
            queue += _refs(defs[name].get("properties", {}))
    order += sorted(set(defs) - set(order))
    lines = _model_table("contract", schema, "The contract (top level)")
    for name in order:
        lines += _model_table(name, defs[name], f"`{name}`")
    return "\n".join(lines)


def contract_schema(config) -> dict:
    root = str(Path(config["config_file_path"]).resolve().parent)
    if root not in sys.path:  # the checkout's gates, also when it is not installed
        sys.path.insert(0, root)
    from gates.contract import Contract

    return Contract.model_json_schema()


def on_page_markdown(markdown, page, config, files, **kwargs):
    if page.file.src_uri != PAGE:
        return markdown
    if MARKER not in markdown:
        raise ValueError(f"docs/{PAGE} lost its marker {MARKER}: the schema tables have no place")
    return markdown.replace(MARKER, render(contract_schema(config)))
