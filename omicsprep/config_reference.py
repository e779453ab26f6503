"""The configuration's reference (``config/README.md``): every key with its default, allowed values and meaning.

Generated from the JSON schema (``config/schemas/config.schema.yaml``), so that the two
cannot drift apart (``tests/test_config_reference.py`` compares the file with this output)::

    python -m omicsprep.config_reference > config/README.md
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import yaml

from omicsprep.configuration import read_yaml

SCHEMA = Path(__file__).resolve().parent.parent / "config" / "schemas" / "config.schema.yaml"
NO_DEFAULT = "—"

HEADER = f"""\
# Configuration reference

Every key of the workflow's configuration, with its default, the values it allows and its
meaning. Generated from `config/schemas/config.schema.yaml` by
`python -m omicsprep.config_reference > config/README.md`: edit the schema, not this file.
`config/config.yaml` is the shipped config; a key it leaves out takes the default shown here
(a value it sets overrides it). {NO_DEFAULT} means no default: the key is absent unless set.
"""


def config_reference(schema: dict) -> str:
    """The Markdown reference of a configuration schema: a table of keys per top-level section.

    Parameters
    ----------
    schema
        The configuration's JSON schema, as read from YAML: an object whose ``properties``
        are the top-level keys; ``$ref`` may point into it (``#/definitions/<name>``).

    Returns
    -------
    str
        A header, then a ``## General`` table of the top-level keys that are not sections,
        and a ``##`` heading per section (a top-level mapping with ``properties``) with its
        description and a table ``| key | default | allowed | meaning |`` of every key inside,
        nested mappings included, by dotted path.
    """
    general: list[str] = []
    sections: list[str] = []
    for name, node in schema.get("properties", {}).items():
        node = _resolved(node, schema)
        if "properties" not in node:
            general.append(_row(name, node))
            continue
        rows = [row for key, child in node["properties"].items() for row in _rows(f"{name}.{key}", child, schema)]
        description = f"{_text(node['description'])}\n\n" if node.get("description") else ""
        sections.append(f"## {name}\n\n{description}{_table(rows)}")
    if general:
        sections.insert(0, f"## General\n\nTop-level keys that are not sections.\n\n{_table(general)}")
    return "\n".join([HEADER, *sections])


def _resolved(node: dict, schema: dict) -> dict:
    """``node`` with its ``$ref`` (a JSON pointer into ``schema``) replaced by its target; its own keys win."""
    if "$ref" not in node:
        return node
    reference = node["$ref"]
    if not reference.startswith("#"):
        raise ValueError(f"only references inside the schema are resolved, not {reference!r}")
    target: Any = schema
    for part in reference[1:].split("/")[1:]:
        target = target[part.replace("~1", "/").replace("~0", "~")]
    own = {key: value for key, value in node.items() if key != "$ref"}
    return {**_resolved(target, schema), **own}


def _rows(path: str, node: dict, schema: dict) -> list[str]:
    """The table rows of key ``path`` and, for a mapping with ``properties``, of the keys inside it."""
    node = _resolved(node, schema)
    rows = [_row(path, node)]
    for key, child in node.get("properties", {}).items():
        rows.extend(_rows(f"{path}.{key}", child, schema))
    return rows


def _row(path: str, node: dict) -> str:
    """One table row: the key, its default, what it allows, its description."""
    default = _code(_value(node["default"])) if "default" in node else NO_DEFAULT
    cells = [_code(path), default, _allowed(node), _text(node.get("description", ""))]
    return "| " + " | ".join(cells) + " |"


def _table(rows: list[str]) -> str:
    """A Markdown table of ``rows`` under the header ``key | default | allowed | meaning``."""
    return "\n".join(["| key | default | allowed | meaning |", "| --- | --- | --- | --- |", *rows]) + "\n"


def _allowed(node: dict) -> str:
    """What a key allows, in words: its type with its range or its choices, a list's items, a mapping's values."""
    if "enum" in node:
        return "one of " + ", ".join(_code(_value(choice)) for choice in node["enum"])
    types = node.get("type", [])
    types = [types] if isinstance(types, str) else list(types)
    nullable = "null" in types
    types = [name for name in types if name != "null"]
    if types == ["array"]:
        text = "list"
        if "items" in node:
            text += f" of {_allowed(node['items'])}"
        if counts := _counts(node.get("minItems"), node.get("maxItems")):
            text += f"; {counts}"
    elif types == ["object"]:
        extra = node.get("additionalProperties", True)
        if "properties" in node:
            text = "mapping (keys below)"
        elif isinstance(extra, dict):
            text = f"mapping of any key to {_allowed(extra)}"
        else:
            text = "mapping"
    else:
        text = " or ".join(types) or "any"
        if bounds := _bounds(node):
            text += f" {bounds}"
    return f"{text}, or {_code('null')}" if nullable else text


def _bounds(node: dict) -> str:
    """A number's range: ``≥ 0``, ``> 0``, ``≤ 1``, or an interval such as ``in (0, 1]``."""
    low = ("[", node["minimum"]) if "minimum" in node else ("(", node.get("exclusiveMinimum"))
    high = ("]", node["maximum"]) if "maximum" in node else (")", node.get("exclusiveMaximum"))
    if low[1] is not None and high[1] is not None:
        return f"in {low[0]}{low[1]}, {high[1]}{high[0]}"
    if low[1] is not None:
        return f"{'≥' if low[0] == '[' else '>'} {low[1]}"
    if high[1] is not None:
        return f"{'≤' if high[0] == ']' else '<'} {high[1]}"
    return ""


def _counts(least: int | None, most: int | None) -> str:
    """How many items a list takes: ``2 items``, ``at least 1 item``, ``1 to 3 items``, or nothing when free."""

    def items(count: int) -> str:
        return f"{count} item" if count == 1 else f"{count} items"

    if least is not None and least == most:
        return items(least)
    if least and most is not None:
        return f"{least} to {items(most)}"
    if least:
        return f"at least {items(least)}"
    return f"at most {items(most)}" if most is not None else ""


def _value(value: Any) -> str:
    """A value as written in the YAML config: a string bare unless YAML would read it otherwise, others as JSON."""
    if isinstance(value, str) and value:
        try:
            if read_yaml(value) == value:
                return value
        except yaml.YAMLError:
            pass
    return json.dumps(value, ensure_ascii=False)


def _code(text: str) -> str:
    """``text`` as inline code in a table cell (its ``|`` escaped, fenced by more backticks than it holds)."""
    fence = "`" * (max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    padding = " " if text.startswith("`") or text.endswith("`") else ""
    escaped = text.replace("|", r"\|")
    return f"{fence}{padding}{escaped}{padding}{fence}"


def _text(text: str) -> str:
    """A description as one line of a table cell: spaces collapsed; ``|``, ``<`` and ``*`` escaped."""
    text = " ".join(text.split())
    return text.replace("|", r"\|").replace("<", "&lt;").replace("*", r"\*")


def main() -> None:
    """Print the reference of ``config/schemas/config.schema.yaml`` (the checkout's) as UTF-8."""
    text = config_reference(read_yaml(SCHEMA.read_text(encoding="utf-8")))
    sys.stdout.flush()
    sys.stdout.buffer.write(text.encode())
    sys.stdout.buffer.flush()


if __name__ == "__main__":
    main()
