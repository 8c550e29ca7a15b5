"""Change one value of a block-style YAML file in place (every other byte of the file kept).

Config dumps (Megatron-Bridge's ``ConfigContainer.to_yaml`` / ``save_config_filepath``) are block mappings, one
``key: value`` per line, nested by indentation. :func:`set_value` finds the line of a dotted path and rewrites its
value only; the result is re-parsed and compared with the expected mapping, so an edit that cannot be made in place
raises instead of writing a different file.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import yaml

from attune.errors import RecipeError

_KEY = re.compile(r"^(?P<indent>[ ]*)(?P<key>[A-Za-z_][\w.-]*|'[^']*'|\"[^\"]*\")[ ]*:(?P<rest>.*)$")


def load(path: str, text: str) -> dict[str, Any]:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise RecipeError(f"{path} is not valid YAML: {str(err).splitlines()[0]}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise RecipeError(f"{path} must hold a mapping of config sections, got {type(data).__name__}")
    return data


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` → ``{"a.b": 1}`` (lists and scalars are leaves)."""
    out: dict[str, Any] = {}
    if isinstance(data, dict):
        for k, v in data.items():
            key = f"{prefix}.{k}" if prefix else str(k)
            if isinstance(v, dict) and v:
                out.update(flatten(v, key))
            else:
                out[key] = v
    return out


def get(data: dict[str, Any], dotted: str) -> tuple[bool, Any]:
    node: Any = data
    for part in dotted.split("."):
        if isinstance(node, dict) and part in node:
            node = node[part]
        else:
            return False, None
    return True, node


def _with(data: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    out = copy.deepcopy(data)
    node = out
    parts = dotted.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value
    return out


def set_value(path: str, text: str, dotted: str, value: Any) -> str:
    """``text`` with the value at ``dotted`` replaced by ``value`` (the key must be present, as a scalar)."""
    data = load(path, text)
    found, old = get(data, dotted)
    if not found or isinstance(old, (dict, list)):
        raise RecipeError(f"{path}: {dotted} is not a value of the file")
    parts = dotted.split(".")
    lines = text.splitlines(keepends=True)
    stack: list[tuple[int, str]] = []  # (indent, key) of the enclosing mappings
    for i, line in enumerate(lines):
        m = _KEY.match(line.rstrip("\r\n"))
        if not m or line.lstrip().startswith("#"):
            continue
        indent = len(m.group("indent"))
        key = m.group("key").strip("'\"")
        while stack and stack[-1][0] >= indent:
            stack.pop()
        here = [k for _, k in stack] + [key]
        if here == parts:
            rest = m.group("rest")
            comment = re.search(r"[ \t]+#.*$", rest)
            tail = comment.group(0) if comment and not _quoted(rest) else ""
            newline = "\n" if line.endswith("\n") else ""
            lines[i] = f"{m.group('indent')}{m.group('key')}: {_scalar(value)}{tail}{newline}"
            out = "".join(lines)
            if load(path, out) != _with(data, dotted, value):
                break
            return out
        stack.append((indent, key))
    raise RecipeError(f"{path}: cannot change {dotted} in place (it is not a plain `key: value` line)")


def _quoted(rest: str) -> bool:
    s = rest.strip()
    return s[:1] in ("'", '"')


def _scalar(value: Any) -> str:
    text: str = yaml.safe_dump(value, default_flow_style=True, width=10_000).strip()
    return text[:-4].rstrip() if text.endswith("\n...") else text.removesuffix("...").strip()


__all__ = ["flatten", "get", "load", "set_value"]
