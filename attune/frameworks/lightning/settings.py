"""The native settings of a lightning recipe's launch: what its flags and config files say, and its batch layout."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from attune.errors import RecipeError
from attune.frameworks.lightning import catalogue as cat
from attune.frameworks.lightning.launch import ParsedLaunch, canonical, parse

if TYPE_CHECKING:
    from attune.recipe.model import Recipe


@dataclass(frozen=True)
class Settings:
    """What one launch runs: its parsed form, effective settings and batch layout (as the CLI would read them)."""

    parsed: ParsedLaunch
    native: dict[str, Any]
    batch: int
    accumulation: int
    devices: int
    nodes: int
    precision: Any
    workers: int | None

    @property
    def global_batch(self) -> int:
        return self.batch * self.accumulation * self.devices * self.nodes

    @property
    def knob_values(self) -> dict[str, Any]:
        """The knobs' values as the launch has them."""
        return {cat.BATCH: self.batch, cat.DEVICES: self.devices, cat.WORKERS: self.workers,
                cat.PRECISION: self.precision}

    def value(self, name: str) -> Any:
        """A contract setting's effective value, canonical (Lightning's default where the launch does not set it)."""
        if name == cat.PRECISION:
            return self.precision
        return canonical(self.native.get(name, cat.CONTRACT.get(name)))


def _int(name: str, value: Any, *, minimum: int = 1) -> int:
    v = canonical(value)
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise RecipeError(f"launch: --{name} {value!r}: attune needs a whole number of at least {minimum} here; write "
                          f"e.g. --{name} {max(minimum, 1)}")
    return v


def device_count(value: Any, accelerator: str) -> int:
    """Processes per node a ``trainer.devices`` value starts (``auto`` / -1 on a CPU: one)."""
    v = canonical(value)
    if v is None or v == "auto" or v == -1:
        if accelerator == "cpu":
            return 1
        raise RecipeError(f"launch: --{cat.DEVICES} {value if value is not None else 'auto'} on a "
                          f"{accelerator} recipe: attune needs the number of devices the job uses; write "
                          f"--{cat.DEVICES} N in the command")
    if isinstance(v, list):
        return max(1, len(v))
    if isinstance(v, str) and "," in v:
        return max(1, len([x for x in v.split(",") if x.strip()]))
    return _int(cat.DEVICES, v)


@functools.lru_cache(maxsize=256)
def _read(argv: tuple[str, ...], files: tuple[tuple[str, str], ...], accelerator: str) -> Settings:
    p = parse(argv, dict(files))
    native = dict(p.settings)
    if cat.BATCH not in native:
        raise RecipeError(f"launch: the command does not set {cat.BATCH}; attune needs the batch per process as the "
                          f"launch states it: add --{cat.BATCH} N (your data module's batch_size) to the command or "
                          "its config file")
    batch = _int(cat.BATCH, native[cat.BATCH])
    acc = _int(cat.ACCUMULATION, native.get(cat.ACCUMULATION, 1))
    devices = device_count(native.get(cat.DEVICES), accelerator)
    nodes = _int(cat.NODES, native.get(cat.NODES, 1))
    workers_raw = native.get(cat.WORKERS)
    workers = None if workers_raw is None else _int(cat.WORKERS, workers_raw, minimum=0)
    return Settings(parsed=p, native=native, batch=batch, accumulation=acc, devices=devices, nodes=nodes,
                    precision=cat.normal_precision(native.get(cat.PRECISION)), workers=workers)


def read_launch(launch: Any, accelerator: str = "cpu") -> Settings:
    """The settings of a :class:`~attune.recipe.model.NativeLaunch` (or its mapping)."""
    if isinstance(launch, Mapping):
        argv, files = launch.get("argv") or (), launch.get("files") or {}
    else:
        argv, files = launch.argv, launch.files
    return _read(tuple(str(a) for a in argv), tuple(sorted(dict(files).items())), accelerator)


def read(recipe: Recipe) -> Settings:
    if recipe.launch is None:
        raise RecipeError("launch: required for framework lightning")
    return read_launch(recipe.launch, recipe.resources.accelerator)


__all__ = ["Settings", "device_count", "read", "read_launch"]
