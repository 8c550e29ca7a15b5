"""The native settings of an hf recipe's launch: what its flags (or args file) say, typed with HF's defaults."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from attune.errors import RecipeError
from attune.frameworks.cmdline import Option
from attune.frameworks.discover import installed_version
from attune.frameworks.hf import catalogue as cat
from attune.frameworks.hf import trl
from attune.frameworks.hf.launch import ParsedLaunch, parse

if TYPE_CHECKING:
    from attune.recipe.model import NativeLaunch, Recipe

_TRUE = ("yes", "true", "t", "y", "1")
_FALSE = ("no", "false", "f", "n", "0")


def version_tuple(version: str | None) -> tuple[int, ...] | None:
    if not version:
        return None
    out = []
    for part in version.split(".")[:3]:
        digits = "".join(ch for ch in part if ch.isdigit())
        if not digits:
            break
        out.append(int(digits))
    return tuple(out) or None


def default_optim(transformers_version: str | None) -> str:
    """HF's default ``optim``: ``adamw_torch_fused`` from 4.55 when torch ≥ 2.8, else ``adamw_torch``."""
    tv = version_tuple(transformers_version)
    if tv is not None and tv < (4, 55):
        return "adamw_torch"
    torch = version_tuple(installed_version("torch"))
    return "adamw_torch" if torch is not None and torch < (2, 8) else "adamw_torch_fused"


def checkpointing_flag(transformers_version: str | None) -> str:
    """The activation-checkpointing flag a version prefers (``activation_checkpointing`` from 5.23)."""
    tv = version_tuple(transformers_version)
    return cat.CHECKPOINTING_V5 if tv is not None and tv >= (5, 23) else cat.CHECKPOINTING


def to_bool(name: str, raw: Any) -> bool:
    if raw is None:  # a bare flag
        return True
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, (int, float)):
        return bool(raw)
    text = str(raw).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise RecipeError(f"--{name} {raw}: expected a boolean (True/False, yes/no, 1/0)")


def to_int(name: str, raw: Any) -> int:
    try:
        if isinstance(raw, bool) or raw is None:
            raise ValueError
        value = float(raw) if not isinstance(raw, int) else raw
        if value != int(value):
            raise ValueError
        return int(value)
    except (TypeError, ValueError, OverflowError):  # 1e400 is inf: no integer
        raise RecipeError(f"--{name} {raw}: expected an integer") from None


def to_number(raw: Any) -> Any:
    """A float setting as a number (integral floats as int, so 1e-3 and 0.001 compare equal, 3 and 3.0 too)."""
    value = float(raw)
    if math.isfinite(value) and value == int(value):
        return int(value)
    return value


def typed(name: str, kind: str, raw: Any) -> Any:
    """A contract setting's value, typed; an unparsable value is kept as text (then compared as text)."""
    if kind.endswith("?") and (raw is None or (isinstance(raw, str) and raw.strip().lower() == "none")):
        if raw is None and kind == "bool?":
            return True  # ``--tf32`` written bare
        return None
    try:
        if kind.startswith("bool"):
            return to_bool(name, raw)
        if kind.startswith("int"):
            return to_int(name, raw)
        if kind.startswith("float"):
            return to_number(raw)
    except (RecipeError, TypeError, ValueError):
        return str(raw)
    if kind.startswith("list") and not isinstance(raw, list):  # ``--lora_target_modules q_proj``: one item
        raw = [raw]
    if isinstance(raw, list):
        return [str(v) for v in raw]
    return str(raw) if raw is not None else None


@dataclass(frozen=True)
class Settings:
    """What one launch runs: its parsed form, native settings, batch layout and its own knob values."""

    parsed: ParsedLaunch
    native: dict[str, Any]  # raw, as written (args file: as parsed)
    version: str | None
    per_device: int
    accumulation: int
    nproc: int
    nnodes: int
    knob_values: dict[str, Any]
    compile_forced: bool
    use_cpu: bool
    #: the contract settings with their defaults: hf's, or a TRL command's (:func:`attune.frameworks.hf.trl.contract`)
    contract_table: dict[str, tuple[str, Any]]

    @property
    def trl(self) -> str | None:
        """The TRL training command the launch runs (``sft``, ...), else None."""
        return self.parsed.trl

    @property
    def world(self) -> int:
        return self.nproc * self.nnodes

    @property
    def global_batch(self) -> int:
        return self.per_device * self.accumulation * self.world

    def contract_value(self, name: str) -> Any:
        kind, default = self.contract_table[name]
        if name not in self.native:
            if name == "bf16" and self.trl is not None:  # TRL's _BaseConfig.__post_init__: bf16 = not fp16
                return self.contract_value("fp16") is not True
            return to_number(default) if kind == "float" and default is not None else default
        return typed(name, kind, self.native[name])


def refuse_abbreviations(options: Iterable[Option], command: str | None = None) -> None:
    """:class:`RecipeError` naming every flag ``HfArgumentParser`` would expand as an abbreviation of a
    TrainingArguments option (of a TRL command's options, for a TRL launch: its ``TrlParser`` is an
    ``HfArgumentParser``; attune reads flags by their full names only)."""
    from attune.frameworks.hf.fields import abbreviation_problems
    from attune.frameworks.hf.launch import NO_FORMS

    names: frozenset[str] | None = None
    if command is not None and trl.fields(command) is not None:
        own = trl.fields(command) or frozenset()
        names = own | {f"no_{n}" for n in trl.no_forms(command)} | {trl.CONFIG_FLAG}
    pairs = [(o.name, o.spelling) for o in options]
    problems = abbreviation_problems(pairs, NO_FORMS) if names is None else \
        abbreviation_problems(pairs, NO_FORMS, options=names)
    if problems:
        what = f"`trl {command}` flags" if command is not None else "TrainingArguments flags"
        raise RecipeError(f"the launch abbreviates {what}:", problems)


def read_launch(launch: NativeLaunch) -> Settings:
    """The settings of a native launch; :class:`RecipeError` when it cannot be read."""
    parsed = parse(launch.argv, launch.files)
    if parsed.args_file is not None and parsed.file_args is None:
        raise RecipeError(f"launch.files: the launch reads its arguments from {parsed.args_file}, but the recipe "
                          f"does not carry that file; re-import the launch (attune import) or add "
                          f"launch.files[{parsed.args_file!r}] with the file's text")
    if parsed.trl_config is not None and parsed.trl_config_settings is None:
        path = parsed.trl_config.values[0]
        raise RecipeError(f"launch.files: the launch reads TRL settings from --config {path}, but the recipe does not "
                          f"carry that file; re-import the launch (attune import) or add launch.files[{path!r}] "
                          "with the file's text")
    if parsed.file_args is None:  # flags (an args file's keys must match exactly: HF refuses any other)
        # ``trl COMMAND``: TRL's parser sees every flag first (argparse expands abbreviations before the rest goes
        # to accelerate), so the accelerate options are checked too
        refuse_abbreviations((*parsed.default_args, *parsed.options,
                              *(parsed.launcher_options if parsed.launcher == "trl" else ())), parsed.trl)
    native = parsed.settings()
    if parsed.file_args is not None:  # in an args file, null means "not set"; on a command line, a bare flag
        native = {k: v for k, v in native.items() if v is not None}
    version = launch.framework_version

    def get_bool(name: str, default: Any) -> Any:  # a bare flag (raw None) is true
        return to_bool(name, native[name]) if name in native else default

    def get_int(name: str, default: Any) -> Any:
        raw = native.get(name)
        return default if raw is None or str(raw) == "None" else to_int(name, raw)

    per_device = get_int(cat.PER_DEVICE, 8)
    accumulation = get_int(cat.ACCUMULATION, 1)
    if per_device < 1 or accumulation < 1:
        raise RecipeError(f"--{cat.PER_DEVICE} ({per_device}) and --{cat.ACCUMULATION} ({accumulation}) must be "
                          "at least 1")
    # HF reads activation_checkpointing where it is set, else its deprecated alias gradient_checkpointing
    ckpt = get_bool(cat.CHECKPOINTING_V5, None)
    if ckpt is None:  # TRL's configs default it to true
        ckpt = get_bool(cat.CHECKPOINTING, trl.knob_default(parsed.trl, cat.CHECKPOINTING, False))
    compile_forced = any(str(native[k]) != "None" for k in ("torch_compile_mode", "torch_compile_backend")
                         if k in native)
    optim = native.get(cat.OPTIM)
    nproc, nnodes = parsed.nproc, parsed.nnodes
    if parsed.launcher == "torchrun":  # torchrun reads options it is not given from PET_* (a PyTorchJob sets them)
        pet_nproc, pet_nodes = launch.env.get("PET_NPROC_PER_NODE", ""), launch.env.get("PET_NNODES", "")
        if parsed.launcher_option("nproc_per_node") is None and pet_nproc.isdigit() and int(pet_nproc) > 0:
            nproc = int(pet_nproc)
        if parsed.launcher_option("nnodes") is None and pet_nodes.partition(":")[0].isdigit():
            nnodes = max(1, int(pet_nodes.partition(":")[0]))
    knobs: dict[str, Any] = {
        cat.PER_DEVICE: per_device,
        cat.NPROC: nproc,
        cat.CHECKPOINTING: ckpt,
        "dataloader_num_workers": get_int("dataloader_num_workers", 0),
        cat.OPTIM: str(optim) if optim is not None else default_optim(version),
        "torch_compile": get_bool("torch_compile", False) or compile_forced,
        "ddp_bucket_cap_mb": get_int("ddp_bucket_cap_mb", None),
        "ddp_find_unused_parameters": get_bool("ddp_find_unused_parameters", None),
        "dataloader_pin_memory": get_bool("dataloader_pin_memory", True),
        cat.OMP_ENV: str(launch.env.get("OMP_NUM_THREADS", "")),
    }
    use_cpu = get_bool("use_cpu", False) or get_bool("no_cuda", False) or \
        (parsed.launcher in ("accelerate", "trl") and parsed.launcher_switch("cpu"))
    table = trl.contract(parsed.trl, cat.CONTRACT) if parsed.trl is not None else cat.CONTRACT
    return Settings(parsed=parsed, native=native, version=version, per_device=per_device, accumulation=accumulation,
                    nproc=nproc, nnodes=nnodes, knob_values=knobs, compile_forced=compile_forced,
                    use_cpu=bool(use_cpu), contract_table=table)


def read(recipe: Recipe) -> Settings:
    if recipe.launch is None:
        raise RecipeError("launch: required for framework hf")
    return read_launch(recipe.launch)
