"""``PATH=VALUE`` edits of a recipe mapping, as typed on the command line (``--set knobs.micro_batch_size=4``).

:func:`apply_sets` is pure: it returns a new mapping and never validates the result (the gate does).

Paths:

- ``knobs.NAME=VALUE`` sets a knob. Knob names may themselves contain dots (``knobs.env.OMP_NUM_THREADS=2``):
  everything after ``knobs.`` is the name.
- ``NAME=VALUE`` where ``NAME``'s first segment is not a top-level recipe field (``name``, ``framework``,
  ``model``, ``training``, ``resources``, ``knobs``, ``tuning``) is shorthand for ``knobs.NAME=VALUE``.
- Any other dotted path walks nested mappings (``training.optimizer.lr=1e-3``), creating missing ones.

VALUE is read with YAML scalar rules (``4`` → int, ``true`` → bool, ``null`` → None, ``[a, b]`` → list),
plus two fixes for what people type: exponent floats without a dot (``1e-3``, which YAML 1.1 reads as a
string) become floats, and a knob whose legal values are all strings (``env.*`` knobs: ``"0"``, ``"1"``)
keeps the text as typed, so ``knobs.env.TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1`` means ``"1"``, not ``1``.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

import yaml

from attune.errors import AttuneError
from attune.recipe.catalogue import Catalogue, get_catalogue

TOP_LEVEL = ("name", "framework", "model", "training", "launch", "resources", "knobs", "tuning")
_FLOAT = re.compile(r"^[-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)$")


class SetError(AttuneError):
    """A ``--set PATH=VALUE`` assignment is malformed (bad syntax, or a path through a non-mapping)."""


def parse_set(text: str) -> tuple[str, str]:
    """Split ``PATH=VALUE`` into its path and raw value text; raise :class:`SetError` if malformed."""
    if not isinstance(text, str) or "=" not in text:
        raise SetError(f"--set {text!r}: expected PATH=VALUE, e.g. knobs.micro_batch_size=4 or "
                       "training.optimizer.lr=1e-3")
    path, _, raw = text.partition("=")
    path = path.strip()
    if not path or any(not seg.strip() for seg in path.split(".")):
        raise SetError(f"--set {text!r}: the path {path!r} has an empty segment; write dotted field names such "
                       "as training.global_batch_size")
    if path == "knobs":
        raise SetError(f"--set {text!r}: name the knob, e.g. knobs.micro_batch_size=4")
    return path, raw


def parse_value(raw: str, path: str = "") -> Any:
    """A VALUE read with YAML scalar rules (plus ``1e-3`` as a float); raise :class:`SetError` if unparsable, naming
    ``path`` (the setting it was for) where given."""
    text = raw.strip()
    where = f"--set {path}: " if path else ""
    if _FLOAT.match(text):
        return float(text)
    if re.fullmatch(r"[-+]?0\d+", text.replace("_", "")):
        raise SetError(f"{where}value {raw!r} has a leading zero, which YAML reads as octal; write "
                       f"{text.lstrip('+-').lstrip('0') or '0'} (or quote it if you mean text)")
    try:
        return yaml.safe_load(text) if text else ""
    except yaml.YAMLError as err:
        example = f"{path or 'knobs.NAME'}=" + (json.dumps(raw) if path else '"text"')
        raise SetError(f"{where}value {raw!r} is not a YAML scalar ({str(err).splitlines()[0]}); quote it, "
                       f"e.g. '{example}'") from None


def apply_sets(
    recipe_dict: Mapping[str, Any],
    sets: Iterable[str] | Mapping[str, Any],
    *,
    catalogue: Catalogue | None = None,
) -> dict[str, Any]:
    """A deep copy of ``recipe_dict`` with every assignment applied, in order.

    ``sets`` is either ``PATH=VALUE`` strings or a mapping ``path → value`` (values used as given).
    ``catalogue`` decides knob value coercion; by default the catalogue of the recipe's framework.
    Raises :class:`SetError` for a malformed assignment or a path that runs through a non-mapping.
    """
    out: dict[str, Any] = copy.deepcopy(dict(recipe_dict))
    if catalogue is None:
        try:
            catalogue = get_catalogue(str(out.get("framework", "torch")), out.get("launch"))
        except KeyError:
            catalogue = None
    items: list[tuple[str, Any, str | None]] = []
    if isinstance(sets, Mapping):
        for path, value in sets.items():
            items.append((str(path), value, None))
    else:
        if isinstance(sets, str):
            raise SetError(f"sets must be a list of PATH=VALUE strings, got the single string {sets!r}")
        for text in sets:
            path, raw = parse_set(text)
            items.append((path, parse_value(raw, path), raw))
    for path, value, given in items:
        _assign(out, path, value, given, catalogue)
    return out


def _assign(out: dict[str, Any], path: str, value: Any, raw: str | None, catalogue: Catalogue | None) -> None:
    head = path.split(".", 1)[0]
    # a native setting of the framework, in its own name: learning_rate on an hf launch; on a recipe with a native
    # launch also a model./training. path that is no field of attune's section (training.seq_len of torchtitan,
    # model.context_parallel_size of a Megatron-Bridge config)
    section = out.get(head)
    rest = path.split(".")[1] if "." in path else ""
    native_name = head not in TOP_LEVEL or (
        head in ("model", "training") and isinstance(out.get("launch"), dict)
        and (section is None or (isinstance(section, dict) and rest not in section)))
    if native_name and (catalogue is None or path not in catalogue) and _set_native(out, path, value):
        return
    if head == "knobs" or head not in TOP_LEVEL:
        name = path.removeprefix("knobs.") if head == "knobs" else path
        knobs = out.get("knobs")
        if knobs is None:
            knobs = out["knobs"] = {}
        if not isinstance(knobs, dict):
            raise SetError(f"--set {path}: the recipe's knobs section is {type(knobs).__name__}, not a mapping")
        knobs[name] = _coerce_knob(name, value, raw, catalogue)
        return
    parts = path.split(".")
    node: Any = out
    for i, part in enumerate(parts[:-1]):
        nxt = node.get(part)
        if nxt is None:
            nxt = node[part] = {}
        if not isinstance(nxt, dict):
            where = ".".join(parts[: i + 1])
            raise SetError(f"--set {path}: {where} is {nxt!r}, not a section with fields; set {where} itself")
        node = nxt
    node[parts[-1]] = value


def _set_native(out: dict[str, Any], name: str, value: Any) -> bool:
    """Let the recipe's framework apply ``name=value`` to its native launch (True if it knows the setting)."""
    from attune import frameworks

    fw_name = out.get("framework", "torch")
    if not isinstance(fw_name, str) or fw_name not in frameworks.names():
        return False
    handled: bool = frameworks.get(fw_name).set_native(out, name, value)
    return handled


def _coerce_knob(name: str, value: Any, raw: str | None, catalogue: Catalogue | None) -> Any:
    if raw is None or catalogue is None or name not in catalogue:
        return value
    legal = catalogue[name].values
    if legal and all(isinstance(v, str) for v in legal) and not isinstance(value, str):
        return raw.strip()
    return value
