"""torchtitan launches for the tests: a Llama-3 8B job in both forms (examples/torchtitan: our TOML job file, and
main's registry config by name)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from attune import frameworks
from attune.recipe.io import parse_recipe
from attune.recipe.model import Recipe
from tests.frameworks.megatron.helpers import argv_of, env_of

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "torchtitan"
FIXTURES = Path(__file__).parent / "fixtures"


def titan() -> Any:
    return frameworks.get("torchtitan")


def toml_argv() -> list[str]:
    return argv_of(EXAMPLE / "run_toml.sh")


def registry_argv() -> list[str]:
    return argv_of(EXAMPLE / "run_registry.sh")


def imported(argv: list[str], cwd: Path = EXAMPLE, version: str | None = "0.2.2", **options: Any) -> dict[str, Any]:
    return titan().import_launch(argv, cwd=cwd, env=env_of(EXAMPLE / "run_toml.sh"),
                                 options={"framework_version": version, **options})


def recipe(argv: list[str] | None = None, **options: Any) -> Recipe:
    return parse_recipe(imported(argv or toml_argv(), **options))
