"""Benchmark suites: a directory of ``framework: megatron`` recipe YAML files, each with its search space.

A suite is named by a directory path or by the name of a directory under ``benchmarks/`` of this repository
(``--suite suite`` is ``benchmarks/suite``). Every ``*.yaml`` file in it is one benchmark case; its
``tuning.search_space`` is the knob space every tuner searches and the oracle enumerates. A file whose
recipe name ends in ``-nvidia`` starts from NVIDIA's published performance settings; the others start from a
plausible but untuned recipe.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from attune.errors import AttuneError
from attune.recipe.io import load_recipe
from attune.recipe.model import Recipe

REPO_BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@dataclass(frozen=True)
class Case:
    """One benchmark case: a starting recipe and where it came from."""

    name: str
    path: Path
    recipe: Recipe

    @property
    def origin(self) -> str:
        return "nvidia-published" if self.name.endswith("-nvidia") else "untuned"


def resolve_suite(name_or_dir: str | Path) -> Path:
    """The directory of a suite given as a path or as a name under ``benchmarks/``."""
    p = Path(name_or_dir)
    if p.is_dir():
        return p
    named = REPO_BENCHMARKS / str(name_or_dir)
    if named.is_dir():
        return named
    known = sorted(d.name for d in REPO_BENCHMARKS.iterdir() if d.is_dir()) if REPO_BENCHMARKS.is_dir() else []
    raise AttuneError(f"no benchmark suite {str(name_or_dir)!r}: not a directory, and not one of {known} "
                      f"under {REPO_BENCHMARKS}")


def load_suite(name_or_dir: str | Path, *, only: list[str] | None = None, limit: int | None = None) -> list[Case]:
    """The cases of a suite, sorted by file name; ``only`` keeps the named recipes, ``limit`` the first N."""
    d = resolve_suite(name_or_dir)
    cases = []
    for path in sorted(d.glob("*.yaml")):
        recipe = load_recipe(path)
        if recipe.framework != "megatron":
            raise AttuneError(f"{path}: benchmark recipes must be framework: megatron (the simulator's model)")
        if not recipe.tuning.search_space:
            raise AttuneError(f"{path}: set tuning.search_space; the oracle enumerates it exhaustively")
        cases.append(Case(name=recipe.name, path=path, recipe=recipe))
    if only:
        missing = sorted(set(only) - {c.name for c in cases})
        if missing:
            raise AttuneError(f"suite {d} has no recipe named {', '.join(missing)}; it has "
                              f"{', '.join(c.name for c in cases)}")
        cases = [c for c in cases if c.name in only]
    if limit is not None:
        cases = cases[:limit]
    if not cases:
        raise AttuneError(f"suite {d} holds no recipe (*.yaml)")
    return cases
