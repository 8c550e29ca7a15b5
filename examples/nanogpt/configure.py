"""Command-line settings for train.py, read the way nanoGPT reads its own (its convention; this is our code).

``apply(globals(), sys.argv[1:])`` walks the arguments in order:

- a word without ``--`` names a config file: Python, executed over the settings (``batch_size = 4``);
- ``--name=value`` sets one existing setting; the value is read as a Python literal where it is one (``4``,
  ``False``, ``6e-4``), else kept as text, and must have the type of the setting's current value.

A later argument overrides an earlier one. ``--name value`` (with a space), an unknown name or a value of the wrong
type stops the script with a message naming the setting.
"""
from __future__ import annotations

import ast
from collections.abc import MutableMapping, Sequence
from typing import Any


def _parse(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def _run_config(settings: MutableMapping[str, Any], path: str) -> None:
    with open(path, encoding="utf-8") as f:
        source = f.read()
    print(f"Overriding config with {path}:")
    print(source)
    exec(compile(source, path, "exec"), settings)  # noqa: S102 - a config file is Python the user wrote


def apply(settings: MutableMapping[str, Any], args: Sequence[str]) -> None:
    """Apply config files and ``--name=value`` overrides from ``args`` to ``settings`` (a module's globals)."""
    for arg in args:
        if not arg.startswith("--"):
            _run_config(settings, arg)
            continue
        name, eq, text = arg[2:].partition("=")
        if not eq:
            raise SystemExit(f"{arg}: write --{name}=VALUE (one word)")
        if name not in settings:
            raise SystemExit(f"--{name}: no such setting in train.py")
        value, current = _parse(text), settings[name]
        if type(value) is not type(current):
            raise SystemExit(f"--{name}={text}: train.py's {name} is {current!r} (type {type(current).__name__}); "
                             f"give a value of that type")
        print(f"Overriding: {name} = {value}")
        settings[name] = value
