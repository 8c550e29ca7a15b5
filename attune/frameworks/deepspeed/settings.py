"""The effective settings of a deepspeed recipe's launch: its DeepSpeed config, resolved the way DeepSpeed (and,
under the HF Trainer, ``HfTrainerDeepSpeedConfig``) resolves it.

Two modes:

- **plain**: a DeepSpeed script (``deepspeed.initialize(config=...)`` / ``--deepspeed_config ds.json``). The batch
  triple follows DeepSpeed's ``_set_batch_related_parameters``: any two of ``train_batch_size``,
  ``train_micro_batch_size_per_gpu`` and ``gradient_accumulation_steps`` give the third (``train_batch_size`` alone
  means no accumulation). ``"auto"`` means DeepSpeed's default (its config models drop ``"auto"`` values).
- **hf**: an HF Trainer script given ``--deepspeed ds.json``. ``"auto"`` values are filled from the
  ``TrainingArguments`` flags as transformers 5.24's ``trainer_config_process`` / ``trainer_config_finalize`` fill
  them: micro-batch from ``--per_device_train_batch_size``, accumulation from ``--gradient_accumulation_steps``,
  ``train_batch_size`` from their product with the world size, ``gradient_clipping`` from ``--max_grad_norm``, the
  optimizer's ``lr``/``betas``/``eps``/``weight_decay`` from ``--learning_rate``, ``--adam_beta1/2``,
  ``--adam_epsilon``, ``--weight_decay``, the scheduler's ``warmup_max_lr``/``warmup_min_lr``/``warmup_num_steps``/
  ``total_num_steps`` from ``--learning_rate``, 0, ``--warmup_steps`` and ``--max_steps``, and ``fp16``/``bf16``
  ``enabled`` from ``--fp16``/``--bf16``. Numeric values must match the flags (HF refuses the run otherwise).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from attune.errors import RecipeError
from attune.frameworks.deepspeed import catalogue as cat
from attune.frameworks.deepspeed import config as dsconfig
from attune.frameworks.deepspeed.config import AUTO
from attune.frameworks.deepspeed.launch import ParsedLaunch, parse

if TYPE_CHECKING:
    from attune.recipe.model import NativeLaunch, Recipe

#: HF TrainingArguments flags the hf mode reads (defaults of transformers 5.24)
HF_DEFAULTS: dict[str, tuple[str, Any]] = {
    "per_device_train_batch_size": ("int", 8), "gradient_accumulation_steps": ("int", 1),
    "learning_rate": ("float", 5e-5), "adam_beta1": ("float", 0.9), "adam_beta2": ("float", 0.999),
    "adam_epsilon": ("float", 1e-8), "weight_decay": ("float", 0.0), "max_grad_norm": ("float", 1.0),
    "warmup_steps": ("float", 0), "max_steps": ("int", -1), "fp16": ("bool", False), "bf16": ("bool", False),
    "fp16_full_eval": ("bool", False), "bf16_full_eval": ("bool", False),
}


def hf_value(native: dict[str, Any], name: str) -> Any:
    """A TrainingArguments flag of the launch, typed, with HF's default where it is not given."""
    from attune.frameworks.hf import settings as hfs

    kind, default = HF_DEFAULTS[name]
    if name not in native:
        return hfs.to_number(default) if kind == "float" else default
    return hfs.typed(name, kind, native[name])


@dataclass(frozen=True)
class Settings:
    """What one launch runs: its parsed form, its config (raw and resolved), batch layout and own knob values."""

    parsed: ParsedLaunch
    mode: str  # plain | hf
    config_path: str | None
    raw: dict[str, Any]  # the config as written
    resolved: dict[str, Any]  # "auto" filled (hf mode) and the batch triple resolved
    version: str | None
    micro: int
    accumulation: int
    nproc: int
    nnodes: int
    knob_values: dict[str, Any]
    auto_knobs: tuple[str, ...]  # knobs whose key is "auto" (hf: filled from the model; pinned)
    nproc_editable: bool
    nproc_fixed_by: str
    train_batch_stated: int  # train_batch_size as the config states (or resolves) it
    problem: str | None = None  # why DeepSpeed (or the HF Trainer) would refuse the batch sizes, if it would

    @property
    def world(self) -> int:
        return self.nproc * self.nnodes

    @property
    def train_batch(self) -> int:
        """Samples per optimizer step (the config's train_batch_size)."""
        return self.train_batch_stated

    @property
    def native(self) -> dict[str, Any]:
        return self.parsed.settings()

    def spelling(self, knob: str) -> str:
        """The key path a config knob has in this config (an alias where the config uses one)."""
        for name in (knob, *cat.ALIASES.get(knob, ())):
            if dsconfig.lookup(self.raw, name)[0]:
                return name
        return knob


def _int(path: str, value: Any) -> int:
    value = dsconfig.number(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise RecipeError(f"launch.files: DeepSpeed config {path} is {value!r}; attune needs a positive integer")
    return value


def _batch(raw: dict[str, Any], world: int, hf: dict[str, Any] | None) -> tuple[int, int, int, str | None]:
    """(train_batch_size, micro, accumulation, problem) as DeepSpeed (and HF, for hf launches) resolve them.

    A config whose stated triple disagrees (DeepSpeed or the HF Trainer would refuse to start) is read as stated,
    with the problem: the importer and preflight refuse it, the gate compares its train_batch_size as contract."""
    def value(key: str) -> Any:
        found, v = dsconfig.lookup(raw, key)
        if not found or v is None:
            return None
        if v == AUTO:
            return AUTO
        return _int(key, v)

    tb, mb, gas = value(cat.TRAIN_BATCH), value(cat.MICRO), value(cat.ACCUMULATION)
    if hf is not None:
        pd, acc = hf_value(hf, "per_device_train_batch_size"), hf_value(hf, "gradient_accumulation_steps")
        if not isinstance(pd, int) or not isinstance(acc, int) or pd < 1 or acc < 1:
            raise RecipeError(f"--per_device_train_batch_size ({pd}) and --gradient_accumulation_steps ({acc}) must "
                              "be positive integers")
        for key, got, want in ((cat.MICRO, mb, pd), (cat.ACCUMULATION, gas, acc), (cat.TRAIN_BATCH, tb, pd * acc * world)):
            if got not in (None, AUTO) and got != want:
                stated = tb if isinstance(tb, int) else pd * acc * world
                return stated, pd, acc, (f"launch.files: the DeepSpeed config has {key} {got} but the TrainingArguments "
                                         f"give {want}; the HF Trainer refuses that mismatch: set it to \"auto\"")
        return pd * acc * world, pd, acc, None
    if AUTO in (tb, mb, gas):
        raise RecipeError("launch.files: \"auto\" batch sizes are filled by the HF Trainer; a plain DeepSpeed script "
                          "needs numbers for train_batch_size / train_micro_batch_size_per_gpu / "
                          "gradient_accumulation_steps")
    if tb is not None and mb is not None and gas is not None:
        if tb != mb * gas * world:
            return tb, mb, gas, (f"launch.files: train_batch_size {tb} != {cat.MICRO} {mb} × {cat.ACCUMULATION} {gas} "
                                 f"× {world} processes; DeepSpeed refuses that config")
    elif tb is not None and mb is not None:
        gas = tb // (mb * world)
    elif tb is not None and gas is not None:
        mb = tb // world // gas
    elif mb is not None and gas is not None:
        tb = mb * gas * world
    elif tb is not None:
        gas, mb = 1, tb // world
    elif mb is not None:
        gas, tb = 1, mb * world
    else:
        raise RecipeError("launch.files: the DeepSpeed config sets neither train_batch_size nor "
                          "train_micro_batch_size_per_gpu; DeepSpeed needs one of them")
    assert tb is not None and mb is not None and gas is not None
    if mb < 1 or gas < 1 or tb != mb * gas * world:
        return tb, max(mb, 1), max(gas, 1), (f"launch.files: train_batch_size {tb} does not split into micro-batches "
                                             f"of {mb} × {gas} accumulation × {world} processes; DeepSpeed refuses "
                                             "that config")
    return tb, mb, gas, None


def _resolve_hf(raw: dict[str, Any], hf: dict[str, Any], tb: int, mb: int, gas: int) -> dict[str, Any]:
    """``raw`` with its "auto" values filled from the TrainingArguments (what the HF Trainer hands DeepSpeed)."""
    lr = hf_value(hf, "learning_rate")
    max_steps = hf_value(hf, "max_steps")
    warmup = hf_value(hf, "warmup_steps")
    if isinstance(warmup, (int, float)) and isinstance(max_steps, int) and max_steps > 0:
        warmup_steps = math.ceil(warmup * max_steps) if 0 < warmup < 1 else int(warmup)
    else:
        warmup_steps = warmup
    fills = {
        cat.MICRO: mb, cat.ACCUMULATION: gas, cat.TRAIN_BATCH: tb,
        "gradient_clipping": hf_value(hf, "max_grad_norm"),
        "optimizer.params.lr": lr,
        "optimizer.params.betas": [hf_value(hf, "adam_beta1"), hf_value(hf, "adam_beta2")],
        "optimizer.params.eps": hf_value(hf, "adam_epsilon"),
        "optimizer.params.weight_decay": hf_value(hf, "weight_decay"),
        "scheduler.params.warmup_min_lr": 0, "scheduler.params.warmup_max_lr": lr,
        "scheduler.params.warmup_num_steps": max(1, warmup_steps) if isinstance(warmup_steps, int) else warmup_steps,
        "scheduler.params.total_num_steps": max_steps if isinstance(max_steps, int) and max_steps > 0
        else "auto (the Trainer's step count)",
        "fp16.enabled": bool(hf_value(hf, "fp16") or hf_value(hf, "fp16_full_eval")),
        "bf16.enabled": bool(hf_value(hf, "bf16") or hf_value(hf, "bf16_full_eval")),
    }
    changes = {path: v for path, v in fills.items() if dsconfig.get(raw, path) == AUTO}
    return dsconfig.applied(raw, changes)


def _knob_values(resolved: dict[str, Any], mb: int, nproc: int,
                 env: dict[str, str]) -> tuple[dict[str, Any], tuple[str, ...]]:
    knobs: dict[str, Any] = {cat.MICRO: mb, cat.NPROC: nproc}
    auto: list[str] = []
    for knob in cat.CONFIG_KNOBS:
        if knob == cat.MICRO:
            continue
        value: Any = cat.DEFAULTS[knob]
        for name in (knob, *cat.ALIASES.get(knob, ())):
            found, v = dsconfig.lookup(resolved, name)
            if found:
                if v == AUTO:
                    auto.append(knob)
                else:
                    value = dsconfig.number(v)
                break
        knobs[knob] = value
    knobs[cat.OMP_ENV] = str(env.get("OMP_NUM_THREADS", ""))
    return knobs, tuple(auto)


def read_launch(launch: NativeLaunch, *, accelerator: str = "cpu", devices_per_node: int = 1) -> Settings:
    """The settings of a native launch; :class:`RecipeError` when it cannot be read."""
    parsed = parse(launch.argv, files=tuple(launch.files))
    path = parsed.config_path
    if path is None:
        raise RecipeError("launch.argv: the launch names no DeepSpeed config (--deepspeed_config ds.json, "
                          "--deepspeed ds.json or --ds_config ds.json)")
    if path not in launch.files:
        if path.lstrip().startswith("{"):
            raise RecipeError("launch.argv: an inline JSON DeepSpeed config on the command line is not supported; "
                              "put it in a file")
        raise RecipeError(f"launch.files: the launch reads its DeepSpeed config from {path}, but the recipe does not "
                          f"carry that file; re-import the launch (attune import) or add launch.files[{path!r}] "
                          "with the file's text")
    raw = dsconfig.load(path, launch.files[path])
    native = parsed.settings()
    hf = is_hf(parsed, raw)
    if hf:  # the Trainer reads its flags with HfArgumentParser: an abbreviation sets another field than it reads
        from attune.frameworks.hf.settings import refuse_abbreviations

        refuse_abbreviations(parsed.options)
    default_nproc = int(launch.env.get("LOCAL_SIZE", "0") or 0) or (1 if accelerator == "cpu" else devices_per_node)
    nproc = parsed.nproc(default=default_nproc)
    nnodes = parsed.nnodes
    tb, mb, gas, problem = _batch(raw, nproc * nnodes, native if hf else None)
    resolved = _resolve_hf(raw, native, tb, mb, gas) if hf else raw
    knobs, auto = _knob_values(resolved, mb, nproc, dict(launch.env))
    editable, fixed_by = True, ""
    if parsed.launcher == "deepspeed":
        for name in ("include", "exclude", "hostfile", "H", "i", "e"):
            opt = parsed.launcher_option(name)
            if opt is not None:
                editable, fixed_by = False, opt.spelling
                break
    return Settings(parsed=parsed, mode="hf" if hf else "plain", config_path=path, raw=raw, resolved=resolved,
                    version=launch.framework_version, micro=mb, accumulation=gas, nproc=nproc, nnodes=nnodes,
                    knob_values=knobs, auto_knobs=auto if hf else (), nproc_editable=editable,
                    nproc_fixed_by=fixed_by, train_batch_stated=tb, problem=problem)


def is_hf(parsed: ParsedLaunch, raw: dict[str, Any]) -> bool:
    """True for an HF Trainer launch: the config comes by ``--deepspeed PATH`` and the launch has Trainer flags,
    or the config holds "auto" values (only the HF Trainer fills those)."""
    if any(v == AUTO for v in dsconfig.flatten(raw).values()):
        return True
    native = parsed.settings()
    opt = parsed.config_option
    return opt is not None and opt.name == "deepspeed" and any(
        k in native for k in ("output_dir", "per_device_train_batch_size", "max_steps", "num_train_epochs"))


def read(recipe: Recipe) -> Settings:
    if recipe.launch is None:
        raise RecipeError("launch: required for framework deepspeed")
    return read_launch(recipe.launch, accelerator=recipe.resources.accelerator,
                       devices_per_node=recipe.resources.devices_per_node)


__all__ = ["HF_DEFAULTS", "Settings", "hf_value", "is_hf", "read", "read_launch"]
