"""DeepSpeed JSON configs as text: read them, look keys up by dotted path, and change only the keys a knob sets.

:func:`rewrite` edits the user's file in place: a changed value's text is replaced where it stands, a new key
is inserted next to its siblings in their indentation, a removed key is cut out with its comma; everything else
(order, spacing, other keys' spelling of numbers such as ``5e8``) stays byte for byte. Unchanged content gives
the text itself. Where an in-place edit cannot be made (or would not parse back to the intended mapping) the
mapping is written out again as indented JSON.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from attune.errors import RecipeError

AUTO = "auto"
REMOVE = object()  # edit marker: drop the key (DeepSpeed's default applies)
_MISSING = object()


def load(path: str, text: str) -> dict[str, Any]:
    """The mapping a DeepSpeed config file holds (JSON; DeepSpeed also reads hjson, which attune does not)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise RecipeError(f"DeepSpeed config {path} is not JSON attune can read ({err}); write it as plain JSON "
                          "(no comments)") from None
    if not isinstance(data, dict):
        raise RecipeError(f"DeepSpeed config {path} must hold a JSON object, got {type(data).__name__}")
    return data


def lookup(data: Mapping[str, Any], path: str) -> tuple[bool, Any]:
    """``(found, value)`` of a dotted path (``zero_optimization.stage``)."""
    node: Any = data
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False, None
        node = node[part]
    return True, node


def get(data: Mapping[str, Any], path: str, default: Any = None) -> Any:
    found, value = lookup(data, path)
    return value if found else default


def flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Every leaf of a config as ``dotted path → value`` (lists and empty objects are leaves)."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, path + "."))
        else:
            out[path] = value
    return out


def number(value: Any) -> Any:
    """A config number as written or parsed (``5e8`` → 500000000): integral floats become ints."""
    if isinstance(value, float) and math.isfinite(value) and value == int(value):
        return int(value)
    return value


def applied(data: Mapping[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    """A deep copy of ``data`` with ``changes`` (dotted path → value or :data:`REMOVE`) applied."""
    out: dict[str, Any] = json.loads(json.dumps(data))
    node: dict[str, Any] | None  # None: a path to remove that is not there
    for path, value in changes.items():
        parts = path.split(".")
        node = out
        for part in parts[:-1]:
            if value is REMOVE and not isinstance(node.get(part), dict):
                node = None
                break
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        if node is None:
            continue
        if value is REMOVE:
            node.pop(parts[-1], None)
        else:
            node[parts[-1]] = value
    return out


# ------------------------------------------------------------------------------------------------ spans

@dataclass
class _Obj:
    open: int  # index of "{"
    close: int  # index of "}"
    members: list[tuple[str, int, int, int]] = field(default_factory=list)  # (key, key start, value start, end)


class _Scanner:
    """A JSON reader that records where every object and member value sits in the text."""

    _NUMBER = re.compile(r"-?(0|[1-9]\d*)(\.\d+)?([eE][-+]?\d+)?")

    def __init__(self, text: str) -> None:
        self.text = text
        self.objects: dict[str, _Obj] = {}
        self.values: dict[str, tuple[int, int]] = {}

    def ws(self, i: int) -> int:
        while i < len(self.text) and self.text[i] in " \t\r\n":
            i += 1
        return i

    def value(self, i: int, path: str) -> int:
        i = self.ws(i)
        ch = self.text[i]
        start = i
        if ch == "{":
            obj = _Obj(open=i, close=-1)
            i = self.ws(i + 1)
            if self.text[i] == "}":
                end = i + 1
            else:
                while True:
                    i = self.ws(i)
                    key_start = i
                    key, i = self.string(i)
                    i = self.ws(i)
                    assert self.text[i] == ":"
                    sub = f"{path}.{key}" if path else key
                    vstart = self.ws(i + 1)
                    i = self.value(vstart, sub)
                    obj.members.append((key, key_start, vstart, i))
                    i = self.ws(i)
                    if self.text[i] == ",":
                        i += 1
                        continue
                    assert self.text[i] == "}"
                    end = i + 1
                    break
            obj.close = end - 1
            self.objects[path] = obj
        elif ch == "[":
            i = self.ws(i + 1)
            n = 0
            if self.text[i] == "]":
                end = i + 1
            else:
                while True:
                    i = self.value(i, f"{path}[{n}]")
                    n += 1
                    i = self.ws(i)
                    if self.text[i] == ",":
                        i += 1
                        continue
                    assert self.text[i] == "]"
                    end = i + 1
                    break
        elif ch == '"':
            _, end = self.string(i)
        else:
            for word in ("true", "false", "null"):
                if self.text.startswith(word, i):
                    end = i + len(word)
                    break
            else:
                m = self._NUMBER.match(self.text, i)
                assert m is not None
                end = m.end()
        self.values[path] = (start, end)
        return end

    def string(self, i: int) -> tuple[str, int]:
        assert self.text[i] == '"'
        j = i + 1
        while self.text[j] != '"':
            j += 2 if self.text[j] == "\\" else 1
        return json.loads(self.text[i:j + 1]), j + 1


def _dump(value: Any) -> str:
    return json.dumps(value)


def _line_indent(text: str, at: int) -> str:
    line_start = text.rfind("\n", 0, at) + 1
    return text[line_start:at] if text[line_start:at].strip() == "" else ""


def _in_place(text: str, data: dict[str, Any], changes: Mapping[str, Any]) -> str | None:
    try:
        scan = _Scanner(text)
        scan.value(0, "")
    except (AssertionError, IndexError, ValueError):
        return None
    edits: list[tuple[int, int, str]] = []  # (start, end, replacement), applied from the back
    for path, value in changes.items():
        found, old = lookup(data, path)
        if value is REMOVE:
            if not found:
                continue
            parent, _, key = path.rpartition(".")
            obj = scan.objects.get(parent)
            if obj is None:
                return None
            idx = next((n for n, m in enumerate(obj.members) if m[0] == key), None)
            if idx is None:
                return None
            _, kstart, _, vend = obj.members[idx]
            if idx + 1 < len(obj.members):  # cut up to the next member's key
                edits.append((kstart, obj.members[idx + 1][1], ""))
            elif idx > 0:  # the last member: cut from the previous member's end
                edits.append((obj.members[idx - 1][3], vend, ""))
            else:
                edits.append((kstart, vend, ""))
            continue
        if found:
            if json.dumps(old) == json.dumps(value) and type(old) is type(value):
                continue
            span = scan.values.get(path)
            if span is None:
                return None
            edits.append((span[0], span[1], _dump(value)))
            continue
        # a new key: insert it into the deepest object on its path that exists
        parts = path.split(".")
        depth = len(parts) - 1
        while depth > 0 and ".".join(parts[:depth]) not in scan.objects:
            depth -= 1
        parent = ".".join(parts[:depth])
        obj = scan.objects.get(parent)
        if obj is None:
            return None
        if depth < len(parts) - 1 and lookup(data, parent + "." + parts[depth] if parent else parts[depth])[0]:
            return None  # the path runs through a non-object value
        nested: Any = value
        for part in reversed(parts[depth + 1:]):
            nested = {part: nested}
        member = f"{_dump(parts[depth])}: {_dump(nested)}"
        if obj.members:
            _, kstart, _, vend = obj.members[-1]
            indent = _line_indent(text, kstart)
            sep = f",\n{indent}" if indent else ", "
            edits.append((vend, vend, sep + member))
        else:
            close_indent = _line_indent(text, obj.close)
            if close_indent or "\n" in text[obj.open:obj.close]:
                edits.append((obj.open + 1, obj.close, f"\n{close_indent}  {member}\n{close_indent}"))
            else:
                edits.append((obj.open + 1, obj.close, member))
    out = text
    for start, end, replacement in sorted(edits, key=lambda e: (e[0], e[1]), reverse=True):
        out = out[:start] + replacement + out[end:]
    return out


def rewrite(path: str, text: str, changes: Mapping[str, Any]) -> str:
    """``text`` of config ``path`` with ``changes`` (dotted path → value, or :data:`REMOVE`) applied, in place
    where possible; an unchanged mapping gives ``text`` itself."""
    data = load(path, text)
    new = applied(data, changes)
    if json.dumps(new, sort_keys=True) == json.dumps(data, sort_keys=True):
        return text
    out = _in_place(text, data, changes)
    if out is not None:
        try:
            if json.dumps(json.loads(out), sort_keys=True) == json.dumps(new, sort_keys=True):
                return out
        except json.JSONDecodeError:
            pass
    return json.dumps(new, indent=2) + "\n"


__all__ = ["AUTO", "REMOVE", "applied", "flatten", "get", "load", "lookup", "number", "rewrite"]
