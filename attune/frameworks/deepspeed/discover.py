"""Every setting the installed DeepSpeed's config reader accepts, read from DeepSpeed itself.

Two kinds of definitions make up a DeepSpeed training config (``deepspeed.runtime.config.DeepSpeedConfig``):

- **pydantic models** mounted at a key (``zero_optimization`` → ``DeepSpeedZeroConfig`` with its offload
  sub-models, ``fp16``/``bf16`` → the precision configs, ``compile``, the monitors, ...): every field is listed by
  the name a config file uses (its alias), with its annotation, default and docstring;
- **keys looked up by hand** (``train_batch_size``, ``gradient_clipping``, ``optimizer``, ``activation_checkpointing.*``,
  ``flops_profiler.*``, ...): found by running the installed ``DeepSpeedConfig`` on a mapping that records every key
  it reads (and the default it reads it with), section by section. Keys of removed features that DeepSpeed only
  looks for to refuse them are left out.

``python -m attune.frameworks.deepspeed.discover --write-schema`` records the result in ``schema.py``, which the
catalogue's exploratory knobs are built from without importing deepspeed; a test checks it matches the installed
version.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from typing import Any

from attune.frameworks.discover import (
    REQUIRED,
    Discovery,
    Setting,
    classify,
    from_pydantic,
    installed_version,
    jsonable,
    require,
)

#: config keys read through one pydantic model each (from deepspeed 0.19.8's getters in runtime/config.py)
MOUNTS: dict[str, str] = {
    "zero_optimization": "deepspeed.runtime.zero.config:DeepSpeedZeroConfig",
    "fp16": "deepspeed.runtime.precision_config:DeepSpeedFP16Config",
    "bf16": "deepspeed.runtime.precision_config:DeepSpeedBF16Config",
    "compile": "deepspeed.compile.config:CompileConfig",
    "comms_logger": "deepspeed.comm.config:CommsLoggerConfig",
    "tensorboard": "deepspeed.monitor.config:TensorBoardConfig",
    "wandb": "deepspeed.monitor.config:WandbConfig",
    "csv_monitor": "deepspeed.monitor.config:CSVConfig",
    "comet": "deepspeed.monitor.config:CometConfig",
    "timers.throughput": "deepspeed.utils.config:DeepSpeedThroughputTimerConfig",
    "hybrid_engine": "deepspeed.runtime.config:HybridEngineConfig",
    "tensor_parallel": "deepspeed.runtime.tensor_parallel.config:TPTrainingConfig",
    "weight_quantization": "deepspeed.inference.config:WeightQuantConfig",
}
#: config keys that are other names of a mounted section
LEGACY_NAMES = {"bfloat16": "bf16"}
_MAX_DEPTH = 3


def _load(ref: str) -> Any:
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


class _Keys:
    def __init__(self, owner: _Recorder) -> None:
        self.owner = owner

    def __contains__(self, key: object) -> bool:
        self.owner.note(str(key), "<in>")
        return dict.__contains__(self.owner, key)

    def __iter__(self) -> Any:
        return iter(dict.keys(self.owner))

    def __len__(self) -> int:
        return dict.__len__(self.owner)


class _Recorder(dict[str, Any]):
    """A config mapping that records every key read from it (``get`` with its default, ``[]``, ``in``)."""

    def __init__(self, data: dict[str, Any], path: str, reads: list[tuple[str, Any]]) -> None:
        super().__init__(data)
        self.path, self.reads = path, reads

    def note(self, key: str, default: Any) -> None:
        self.reads.append((self.path + key, default))

    def get(self, key: Any, *default: Any) -> Any:
        self.note(str(key), default[0] if default else None)
        return super().get(key, *default)

    def __getitem__(self, key: Any) -> Any:
        self.note(str(key), "<in>")
        return super().__getitem__(key)

    def __contains__(self, key: object) -> bool:
        self.note(str(key), "<in>")
        return super().__contains__(key)

    def keys(self) -> Any:
        return _Keys(self)


def _run(config: dict[str, Any]) -> None:
    from deepspeed.runtime.config import DeepSpeedConfig

    try:
        DeepSpeedConfig(config)
    except Exception:  # noqa: BLE001, S110 - probing: a section that is not a mapping fails further on, after its reads
        pass


def _probe(path: str, reads: list[tuple[str, Any]], data: dict[str, Any] | None = None) -> dict[str, Any]:
    """Keys read under ``path`` when the config holds a recording mapping there (``{}`` and ``{enabled: true}``)."""
    found: dict[str, Any] = {}
    for seed in ({}, {"enabled": True}) if data is None else (data,):
        reads.clear()
        parts = path.split(".")
        node: dict[str, Any] = _Recorder(dict(seed), path + ".", reads)
        for i in range(len(parts) - 1, 0, -1):
            node = {parts[i]: node}
            node = _Recorder(node, ".".join(parts[:i]) + ".", reads)
        _run({"train_batch_size": 1, parts[0]: node})
        for key, default in reads:
            if key.startswith(path + ".") and key not in found:
                found[key] = default
    return found


def _traced() -> list[tuple[str, Any, bool]]:
    """(key path, default, is a section) of every key DeepSpeedConfig reads by hand, depth first."""
    from deepspeed.runtime import config as dsc

    removed = set(getattr(dsc, "_REMOVED_TOP_LEVEL_CONFIG_KEYS", {}))
    reads: list[tuple[str, Any]] = []
    _run(_Recorder({"train_batch_size": 1}, "", reads))
    top: dict[str, Any] = {}
    for key, default in reads:
        top.setdefault(key, default)
    mounted_top = {m.split(".")[0] for m in MOUNTS}
    out: list[tuple[str, Any, bool]] = []

    def walk(path: str, default: Any, depth: int) -> None:
        nested = _probe(path, reads) if depth < _MAX_DEPTH else {}
        children = {k: v for k, v in nested.items() if k.count(".") == path.count(".") + 1}
        out.append((path, default, bool(children)))
        for key, sub_default in children.items():
            walk(key, sub_default, depth + 1)

    for key, default in top.items():
        if key in removed or key in mounted_top or key in LEGACY_NAMES:
            continue
        walk(key, default, 1)
    # sections with mounts below them (``timers.throughput``): the keys read beside the mount
    for mount in MOUNTS:
        if "." in mount:
            head = mount.split(".")[0]
            if not any(p == head for p, _, _ in out):
                out.append((head, {}, True))
    return out


def _kind(default: Any) -> str:
    if default is None or default == "<in>":
        return "unknown"
    if isinstance(default, bool):
        return "bool"
    if isinstance(default, int):
        return "int"
    if isinstance(default, float):
        return "float"
    if isinstance(default, str):
        return "str"
    if isinstance(default, dict):
        return "dict"
    if isinstance(default, (list, tuple)):
        return "list"
    return type(default).__name__


def raw_settings() -> list[Setting]:
    """Every setting of the installed DeepSpeed's training config, unclassified."""
    require("deepspeed", "deepspeed")
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    out: list[Setting] = []
    for key, default, section in _traced():
        typ = "section" if section else _kind(default)
        if not section and key.rsplit(".", 1)[-1] == "type" and default == "<in>":
            typ = "str"
        if key in ("optimizer.params", "scheduler.params"):
            typ = "dict"
        out.append(Setting(name=key, type=typ, default=None if default == "<in>" or section else jsonable(default),
                           source="deepspeed.runtime.config.DeepSpeedConfig (keys it reads)"))
    for key in ("optimizer.params", "scheduler.params"):  # free-form: passed to the optimizer / scheduler as given
        if not any(s.name == key for s in out):
            out.append(Setting(name=key, type="dict", default=None,
                               source="deepspeed.runtime.config.DeepSpeedConfig (keys it reads)",
                               description="keyword arguments of the optimizer / scheduler (free-form)"))
    for key, ref in MOUNTS.items():
        model = _load(ref)
        out.append(Setting(name=key, type="section", default=None, source=f"{model.__module__}.{model.__qualname__}",
                           description=f"the {model.__qualname__} model"))
        out.extend(from_pydantic(model, prefix=key + "."))
    for legacy, name in LEGACY_NAMES.items():
        out.append(Setting(name=legacy, type="section", default=None,
                           source="deepspeed.runtime.precision_config (read where bf16 is absent)",
                           description=f"legacy name of the {name} section"))
    seen: set[str] = set()
    unique = []
    for s in out:
        if s.name not in seen:
            seen.add(s.name)
            unique.append(s)
    return sorted(unique, key=lambda s: s.name)


def classifier(setting: Setting) -> tuple[str, str | None, str | None]:
    from attune.frameworks.deepspeed import catalogue as cat

    knobs = {k.name: k for k in cat.KNOBS}
    names = (setting.name, *setting.aliases)
    for knob, aliases in ((k, (k, *cat.ALIASES.get(k, ()))) for k in knobs):
        if any(n in aliases for n in names):
            return "knob", knobs[knob].semantics.value, knob
    if setting.name == cat.ACCUMULATION:
        return "derived", cat.D.value, cat.MICRO
    head = setting.name.split(".")[0]
    if head in cat.CONTRACT_KEYS or setting.name in cat.CONTRACT_KEYS:
        return "contract", "contract", None
    return "unclassified", None, None


def launcher_settings() -> list[Setting]:
    """The curated knobs that are no config key: the launcher's process count and the OpenMP threads."""
    from attune.frameworks.deepspeed import catalogue as cat

    return [Setting(name=cat.NPROC, type="int", default=1, source="launcher (deepspeed --num_gpus, torchrun "
                    "--nproc_per_node, accelerate launch --num_processes)", classification="knob",
                    semantics=cat.D.value, knob=cat.NPROC),
            Setting(name=cat.OMP_ENV, type="str", default="", source="environment", classification="knob",
                    semantics=cat.D.value, knob=cat.OMP_ENV)]


def discover(framework: Any = None) -> Discovery:
    """Every setting of the installed DeepSpeed's training config, classified against the deepspeed catalogue."""
    settings = classify(raw_settings(), classifier)
    sources = sorted({s.source for s in settings})
    return Discovery(framework="deepspeed", version=installed_version("deepspeed"), sources=tuple(sources),
                     settings=(*settings, *launcher_settings()))


def write_schema(path: Path | None = None) -> Path:
    """Record the installed DeepSpeed's settings in ``schema.py`` (the exploratory knobs' source)."""
    path = path or Path(__file__).with_name("schema.py")
    settings = raw_settings()
    sources = sorted({s.source for s in settings})
    rows = "\n".join(f"    ({s.name!r}, {s.type!r}, {s.default!r}, {sources.index(s.source)}, {tuple(s.choices)!r}, "
                     f"{s.minimum!r}, {tuple(s.aliases)!r})," for s in settings)
    version = installed_version("deepspeed")
    text = (f'"""The settings of deepspeed {version}\'s training config, as :mod:`attune.frameworks.deepspeed.discover`\n'
            "reads them (generated by ``python -m attune.frameworks.deepspeed.discover --write-schema``; do not edit).\n\n"
            "Rows: (name, type, default, source index, choices, minimum, aliases).\n"
            '"""\n\nfrom __future__ import annotations\n\nfrom attune.frameworks.discover import Setting\n\n'
            f"VERSION = {version!r}\n"
            "SOURCES = (\n" + "".join(f"    {s!r},\n" for s in sources) + ")\n"
            "# fmt: off\n"
            "ROWS: tuple[tuple[str, str, object, int, tuple[object, ...], float | None, tuple[str, ...]], ...] = (\n"
            + rows + "\n)\n# fmt: on\n\n\n"
            "def settings() -> list[Setting]:\n"
            "    return [Setting(name=n, type=t, default=d, source=SOURCES[s], choices=c, minimum=m, aliases=a)\n"
            "            for n, t, d, s, c, m, a in ROWS]\n")
    path.write_text(text)
    return path


def main(argv: list[str]) -> int:
    if argv == ["--write-schema"]:
        print(write_schema())
        return 0
    d = discover()
    print(d.counts())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

__all__ = ["LEGACY_NAMES", "MOUNTS", "REQUIRED", "classifier", "discover", "raw_settings", "write_schema"]
