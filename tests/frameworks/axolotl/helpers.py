"""Recipes of axolotl launches for the tests: a LoRA config of ours in axolotl's keys, imported the way `attune import
--framework axolotl` does, and small YAML helpers."""

from __future__ import annotations

import difflib
import shutil
from pathlib import Path
from typing import Any

import yaml

from attune import frameworks
from attune.recipe.io import parse_recipe
from attune.recipe.model import Recipe
from attune.testing.logs import feed as feed  # re-exported for the tests here

FIXTURES = Path(__file__).parent / "fixtures"
EXAMPLE = "lora-packed.yml"  # our own packed LoRA config (fixtures/SOURCES.md)
CLI = ["axolotl", "train", EXAMPLE]


def ax() -> Any:
    return frameworks.get("axolotl")


def example_dir(tmp_path: Path, text: str | None = None) -> Path:
    """A directory holding the example config (or ``text`` under its name)."""
    work = tmp_path / "ax"
    work.mkdir(parents=True, exist_ok=True)
    if text is None:
        shutil.copy(FIXTURES / EXAMPLE, work / EXAMPLE)
    else:
        (work / EXAMPLE).write_text(text)
    return work


def example_text() -> str:
    return (FIXTURES / EXAMPLE).read_text()


def imported(tmp_path: Path, argv: list[str] | None = None, *, env: dict[str, str] | None = None,
             text: str | None = None, **options: Any) -> dict[str, Any]:
    options.setdefault("devices_per_node", 8)
    options.setdefault("framework_version", "0.19.0")
    return ax().import_launch(argv or CLI, cwd=example_dir(tmp_path, text), env=env or {}, options=options)


def recipe(tmp_path: Path, argv: list[str] | None = None, **kw: Any) -> Recipe:
    return parse_recipe(imported(tmp_path, argv, **kw))


def load(text: str) -> dict[str, Any]:
    """A config's mapping as axolotl reads it (yaml.safe_load)."""
    return dict(yaml.safe_load(text))


def changed_keys(before: str, after: str) -> dict[str, tuple[Any, Any]]:
    old, new = load(before), load(after)
    return {k: (old.get(k), new.get(k)) for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)}


def changed_lines(before: str, after: str) -> list[str]:
    """The lines that differ, as ``-old`` / ``+new``."""
    return [ln for ln in difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=0)
            if ln[:1] in "+-" and not ln.startswith(("---", "+++"))]


def with_file(r: Recipe, text: str) -> dict[str, Any]:
    """``r`` as a mapping whose config file holds ``text`` instead (a candidate that edits the user's config)."""
    data = r.model_dump(mode="python")
    path = next(iter(data["launch"]["files"]))
    data["launch"]["files"][path] = text
    return data


def with_argv(r: Recipe, argv: list[str]) -> dict[str, Any]:
    data = r.model_dump(mode="python")
    data["launch"]["argv"] = list(argv)
    return data


def set_line(text: str, key: str, value: str) -> str:
    """``text`` with the top-level line of ``key`` set to ``value`` (appended when absent)."""
    lines = text.splitlines(keepends=True)
    for i, line in enumerate(lines):
        if line.startswith(f"{key}:"):
            lines[i] = f"{key}: {value}\n"
            return "".join(lines)
    return text + f"{key}: {value}\n"
