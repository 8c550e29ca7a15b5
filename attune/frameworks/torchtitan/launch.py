"""torchtitan launches read and edited token by token (no torchtitan import): the two forms of
:mod:`attune.frameworks.torchtitan.catalogue`, their settings, and one-setting edits of the command line or the TOML
job file.

A setting is a dotted key (``parallelism.tensor_parallel_degree``). The TOML file gives the base, ``--section.key
value`` flags take precedence (torchtitan's ``ConfigManager``: TOML loaded first, tyro CLI on top). Booleans on the
command line are tyro flags (``--compile.enable`` / ``--compile.no-enable``, or ``--compile.enable True``).
"""

from __future__ import annotations

import functools
import json
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any

from attune.errors import RecipeError
from attune.frameworks.megatron import argv as av
from attune.frameworks.torchtitan import catalogue as cat

if TYPE_CHECKING:
    from attune.recipe.model import NativeLaunch, Recipe

ENTRY = ("torchtitan.train", "torchtitan/train.py")

# the JobConfig fields of torchtitan v0.2.0, v0.2.1 and v0.2.2 (torchtitan/config/job_config.py at those tags),
# flattened; a TOML key outside this set is not of the covered versions
TOML_SCHEMA = frozenset({
    'activation_checkpoint.debug', 'activation_checkpoint.determinism_check', 'activation_checkpoint.early_stop',
    'activation_checkpoint.memory_budget', 'activation_checkpoint.mode',
    'activation_checkpoint.per_op_sac_force_recompute_mm_shapes_by_fqns',
    'activation_checkpoint.preserve_rng_state', 'activation_checkpoint.selective_ac_option',
    'activation_checkpoint.visualize_memory_budget_pareto', 'checkpoint.async_mode',
    'checkpoint.create_seed_checkpoint', 'checkpoint.enable', 'checkpoint.enable_first_step_checkpoint',
    'checkpoint.enable_ft_dataloader_checkpoints', 'checkpoint.exclude_from_loading', 'checkpoint.export_dtype',
    'checkpoint.folder', 'checkpoint.initial_load_in_hf', 'checkpoint.initial_load_in_hf_quantized',
    'checkpoint.initial_load_model_only', 'checkpoint.initial_load_path', 'checkpoint.interval',
    'checkpoint.keep_latest_k', 'checkpoint.last_save_in_hf', 'checkpoint.last_save_model_only',
    'checkpoint.load_only', 'checkpoint.load_step', 'comm.init_timeout_seconds', 'comm.mode',
    'comm.save_traces_file_prefix', 'comm.save_traces_folder', 'comm.trace_buf_size', 'comm.train_timeout_seconds',
    'compile.backend', 'compile.components', 'compile.enable', 'debug.deterministic',
    'debug.deterministic_warn_only', 'debug.moe_force_load_balance', 'debug.seed',
    'experimental.custom_args_module', 'experimental.custom_import', 'fault_tolerance.enable',
    'fault_tolerance.group_size', 'fault_tolerance.min_replica_size', 'fault_tolerance.process_group',
    'fault_tolerance.process_group_timeout_ms', 'fault_tolerance.replica_id', 'fault_tolerance.semi_sync_method',
    'job.config_file', 'job.custom_config_module', 'job.description', 'job.dump_folder', 'job.print_config',
    'job.save_config_file', 'lr_scheduler.decay_ratio', 'lr_scheduler.decay_type', 'lr_scheduler.min_lr_factor',
    'lr_scheduler.total_steps', 'lr_scheduler.warmup_steps', 'memory_estimation.disable_fake_mode',
    'memory_estimation.enable', 'metrics.disable_color_printing', 'metrics.enable_tensorboard',
    'metrics.enable_wandb', 'metrics.log_freq', 'metrics.save_for_all_ranks', 'metrics.save_tb_folder',
    'model.converters', 'model.flavor', 'model.hf_assets_path', 'model.name', 'model.print_after_conversion',
    'model.tokenizer_path', 'optimizer.beta1', 'optimizer.beta2', 'optimizer.early_step_in_backward',
    'optimizer.eps', 'optimizer.implementation', 'optimizer.lr', 'optimizer.name', 'optimizer.weight_decay',
    'parallelism.context_parallel_degree', 'parallelism.context_parallel_load_balancer',
    'parallelism.context_parallel_rotate_method', 'parallelism.data_parallel_replicate_degree',
    'parallelism.data_parallel_shard_degree', 'parallelism.disable_loss_parallel',
    'parallelism.enable_async_tensor_parallel', 'parallelism.enable_compiled_autograd',
    'parallelism.expert_parallel_comm_backend', 'parallelism.expert_parallel_degree',
    'parallelism.expert_tensor_parallel_degree', 'parallelism.fsdp_reshard_after_forward',
    'parallelism.module_fqns_per_model_part', 'parallelism.pipeline_parallel_degree',
    'parallelism.pipeline_parallel_expert_parallel_overlap',
    'parallelism.pipeline_parallel_first_stage_less_layers', 'parallelism.pipeline_parallel_last_stage_less_layers',
    'parallelism.pipeline_parallel_layers_per_stage', 'parallelism.pipeline_parallel_microbatch_size',
    'parallelism.pipeline_parallel_schedule', 'parallelism.pipeline_parallel_schedule_csv',
    'parallelism.tensor_parallel_degree', 'profiling.enable_memory_snapshot', 'profiling.enable_profiling',
    'profiling.profile_freq', 'profiling.profiler_active', 'profiling.profiler_warmup',
    'profiling.save_memory_snapshot_folder', 'profiling.save_traces_folder', 'quantize.grouped_mm.float8.fqns',
    'quantize.grouped_mm.mx.fqns', 'quantize.grouped_mm.mx.recipe_name', 'quantize.linear.float8.emulate',
    'quantize.linear.float8.enable_fsdp_float8_all_gather', 'quantize.linear.float8.filter_fqns',
    'quantize.linear.float8.precompute_float8_dynamic_scale_for_fsdp', 'quantize.linear.float8.recipe_name',
    'quantize.linear.mx.filter_fqns', 'quantize.linear.mx.mxfp8_dim1_cast_kernel_choice',
    'quantize.linear.mx.recipe_name', 'training.dataloader.num_workers', 'training.dataloader.persistent_workers',
    'training.dataloader.pin_memory', 'training.dataloader.prefetch_factor', 'training.dataset',
    'training.dataset_path', 'training.debug_moe_force_load_balance', 'training.deterministic', 'training.dtype',
    'training.enable_cpu_offload', 'training.gc_debug', 'training.gc_freq', 'training.global_batch_size',
    'training.local_batch_size', 'training.max_norm', 'training.mixed_precision_param',
    'training.mixed_precision_reduce', 'training.seed', 'training.seq_len', 'training.steps',
    'validation.dataloader.num_workers', 'validation.dataloader.persistent_workers',
    'validation.dataloader.pin_memory', 'validation.dataloader.prefetch_factor', 'validation.dataset',
    'validation.dataset_path', 'validation.enable', 'validation.freq', 'validation.local_batch_size',
    'validation.seq_len', 'validation.steps'
})

#: settings that decide what is learned (every other non-knob setting is frozen)
CONTRACT_PREFIXES = ("optimizer.", "lr_scheduler.", "model.", "quantize.", "validation.dataset")
CONTRACT_KEYS = frozenset({
    "training.dataset", "training.dataset_path", "training.global_batch_size", "training.seq_len", "training.max_norm",
    "training.steps", "training.dtype", "training.mixed_precision_param", "training.mixed_precision_reduce",
    "training.seed", "training.deterministic", "training.num_tokens_per_train_step", "training.max_context_length",
    "debug.seed", "debug.deterministic", "debug.moe_force_load_balance", "module", "config",
    "optimizer.lr", "optimizer.name", "optimizer.eps", "optimizer.weight_decay", "optimizer.beta1", "optimizer.beta2",
    "lr_scheduler.warmup_steps", "lr_scheduler.decay_ratio", "lr_scheduler.decay_type", "lr_scheduler.min_lr_factor",
    "model.name", "model.flavor", "model.converters",
})
#: ``--set NAME=VALUE`` short names
ALIASES = {"lr": "optimizer.lr", "seq_len": "training.seq_len", "steps": "training.steps",
           "global_batch_size": "training.global_batch_size", "seed": "debug.seed", "max_norm": "training.max_norm",
           "warmup_steps": "lr_scheduler.warmup_steps"}

#: Python config functions attune can read from their name (main @ b5bcd76 ``torchtitan/models/llama3/
#: config_registry.py``); only the fields attune reads
REGISTRY: dict[str, dict[str, Any]] = {
    "llama3.llama3_8b": {
        "model.name": "llama3", "model.flavor": "8B", "optimizer.name": "AdamW", "optimizer.lr": 3e-4,
        "optimizer.beta1": 0.9, "optimizer.beta2": 0.95, "optimizer.eps": 1e-8, "optimizer.weight_decay": 0.1,
        "training.num_tokens_per_microbatch_per_dp_rank": 8192, "training.max_context_length": 8192,
        "training.num_tokens_per_train_step": -1, "training.steps": 1000, "training.max_norm": 1.0,
        "activation_checkpoint.mode": "selective", "metrics.log_freq": 10, "metrics.enable_tensorboard": True,
        "checkpoint.interval": 500, "profiling.enable_profiling": True, "profiling.profile_freq": 100,
        "validation.freq": 500, "validation.steps": 1200,
    },
    "llama3.llama3_debugmodel": {
        "model.name": "llama3", "model.flavor": "debugmodel", "optimizer.name": "AdamW", "optimizer.lr": 8e-4,
        "training.num_tokens_per_microbatch_per_dp_rank": 8 * 2048, "training.max_context_length": 2048,
        "training.num_tokens_per_train_step": -1, "training.steps": 10, "activation_checkpoint.mode": "selective",
        "metrics.log_freq": 1,
    },
}


@dataclass(frozen=True)
class Job:
    """One torchtitan launch as attune reads it."""

    form: str  # toml | registry
    argv: tuple[str, ...]
    launch: av.Launch
    options: tuple[av.Option, ...]
    cli: dict[str, Any]  # key → value from the command line
    cli_options: dict[str, av.Option]  # key → the option that sets it
    toml_path: str | None
    toml_text: str | None
    settings: dict[str, Any]  # every setting: TOML (or the config function) under the command line
    knobs: dict[str, Any]
    world: int
    nodes: int
    nproc: int | None
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def model_name(self) -> str:
        return str(self.settings.get("model.name", "llama3"))

    @property
    def flavor(self) -> str:
        return str(self.settings.get("model.flavor", "debugmodel"))

    @property
    def seq_len(self) -> int:
        key = "training.seq_len" if self.form == "toml" else "training.max_context_length"
        return int(self.settings.get(key, 2048))

    @property
    def explicit_global_batch(self) -> int | None:
        """The global batch in sequences where the launch fixes it (``None``: -1, local batch × DP degree)."""
        if self.form == "toml":
            g = int(self.settings.get("training.global_batch_size", -1))
            return None if g == -1 else g
        t = int(self.settings.get("training.num_tokens_per_train_step", -1))
        return None if t == -1 else t // self.seq_len

    def knob_keys(self) -> dict[str, str]:
        return {k: s[self.form][0] for k, s in cat.SPELLINGS.items() if self.form in s}


def _key(name: str) -> tuple[str, bool | None]:
    """``compile.no-enable`` → (``compile.enable``, False); ``job.config-file`` → ``job.config_file``."""
    parts = name.split(".")
    last = parts[-1]
    negated = None
    if last.startswith(("no-", "no_")) and len(parts) > 1:
        last, negated = last[3:], False
    parts = [p.replace("-", "_") for p in [*parts[:-1], last]]
    return ".".join(parts), negated


def _value(opt: av.Option, negated: bool | None) -> Any:
    if negated is not None:
        return negated
    if not opt.values:
        return True
    if len(opt.values) == 1:
        return av.to_scalar(opt.values[0])
    return [av.to_scalar(v) for v in opt.values]


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in data.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, dict):
            out.update(flatten(v, key))
        else:
            out[key] = v
    return out


def detect(argv: Sequence[str]) -> bool:
    try:
        launch = av.split(argv)
    except RecipeError:
        return False
    return launch.script in ENTRY or PurePosixPath(launch.script).as_posix().endswith("torchtitan/train.py")


def config_file(argv: Sequence[str]) -> str | None:
    launch = av.split(argv)
    opts, _, _ = av.scan(launch.argv, launch.args_start)
    for o in opts:
        if _key(o.name)[0] == "job.config_file" and o.values:
            return str(o.values[0])
    return None


def parse(argv: Sequence[str], files: Mapping[str, str], *, version: str | None = None) -> Job:
    """Read a torchtitan launch; :class:`RecipeError` for what attune cannot read or does not cover."""
    argv = tuple(str(a) for a in argv)
    if not detect(argv):
        raise RecipeError(f"`{' '.join(argv)}` is not a torchtitan launch; accepted forms:", [
            "torchrun [...] -m torchtitan.train --job.config_file JOB.toml [--section.key value ...] (torchtitan 0.2.x)",
            "torchrun [...] -m torchtitan.train --module MODEL --config FUNCTION [--section.key value ...] (main)"])
    launch = av.split(argv)
    opts, _, positionals = av.scan(argv, launch.args_start)
    if positionals:
        raise RecipeError(f"`{argv[positionals[0]]}` in the torchtitan arguments is no --section.key flag")
    cli: dict[str, Any] = {}
    cli_options: dict[str, av.Option] = {}
    for o in opts:
        key, negated = _key(o.name)
        cli[key] = _value(o, negated)
        cli_options[key] = o
    toml_path = next((str(cli[k]) for k in ("job.config_file",) if k in cli), None)
    registry = "module" in cli or "config" in cli
    if toml_path and registry:
        raise RecipeError("the launch gives both --job.config_file and --module/--config; torchtitan takes one")
    notes: list[str] = []
    if toml_path:
        form = "toml"
        if av.version_in(version, ">=0.3") is True:
            raise RecipeError(f"torchtitan {version} has no TOML job files (main replaced them with Python config "
                              "functions in #2386, after 0.2.2); attune covers TOML for 0.2.x only — launch it with "
                              "--module/--config, or give the 0.2.x version the file is for")
        if toml_path not in files:
            raise RecipeError(f"--job.config_file {toml_path}: attune needs the file's text to read the launch (it "
                              "cannot read files inside a container image); import it where the file is")
        try:
            base = flatten(tomllib.loads(files[toml_path]))
        except tomllib.TOMLDecodeError as err:
            raise RecipeError(f"{toml_path} is not valid TOML: {err}") from None
        unknown = sorted(k for k in [*base, *cli] if k not in TOML_SCHEMA)
        if unknown:
            hint = (" (training.batch_size is torchtitan 0.1's name; 0.2 calls it training.local_batch_size)"
                    if "training.batch_size" in unknown else "")
            raise RecipeError(f"{toml_path}: settings {', '.join(unknown)} are not in the job-config schema of "
                              f"torchtitan 0.2.0-0.2.2 that attune covers{hint}; a job for another version, which "
                              "attune will not guess at")
    else:
        form = "registry"
        module, function = cli.get("module"), cli.get("config")
        if module is None or function is None:
            raise RecipeError("the launch names no job: give --job.config_file JOB.toml (0.2.x) or --module MODEL "
                              "--config FUNCTION (main)")
        name = f"{module}.{function}"
        if name not in REGISTRY:
            raise RecipeError(f"--module {module} --config {function}: attune cannot run Python config functions "
                              f"(no torchtitan here) and knows only {', '.join(sorted(REGISTRY))}; save the config "
                              "(--debug.save_config_file) and describe it with --section.key flags, or use a known one")
        base = dict(REGISTRY[name])
        notes.append(f"settings of {name} read from attune's table of main @ b5bcd76")
    settings = {**base, **cli}
    nproc = launch.nproc
    nodes = launch.nnodes
    world = nodes * (nproc or 1)
    knobs: dict[str, Any] = {}
    for knob, spell in cat.SPELLINGS.items():
        if form not in spell:
            k_default = cat.build()[knob].default
            knobs[knob] = settings.get(spell.get("toml", ("", k_default))[0], k_default)
            continue
        key, default = spell[form]
        knobs[knob] = settings.get(key, default)
    if form == "registry":
        tokens = int(knobs[cat.LOCAL_BATCH])
        seq = int(settings.get("training.max_context_length", 2048))
        if tokens % seq:
            raise RecipeError(f"training.num_tokens_per_microbatch_per_dp_rank {tokens} is not a whole number of "
                              f"{seq}-token sequences; attune's local_batch_size knob counts sequences")
        knobs[cat.LOCAL_BATCH] = tokens // seq
    return Job(form=form, argv=argv, launch=launch, options=tuple(opts), cli=cli, cli_options=cli_options,
               toml_path=toml_path, toml_text=files.get(toml_path) if toml_path else None, settings=settings,
               knobs=knobs, world=world, nodes=nodes, nproc=nproc, notes=tuple(notes))


@functools.lru_cache(maxsize=256)
def _cached(argv: tuple[str, ...], files: tuple[tuple[str, str], ...], version: str | None) -> Job:
    return parse(argv, dict(files), version=version)


def read(launch: NativeLaunch | Mapping[str, Any]) -> Job:
    if isinstance(launch, Mapping):
        argv, files, version = launch.get("argv") or (), launch.get("files") or {}, launch.get("framework_version")
    else:
        argv, files, version = launch.argv, launch.files, launch.framework_version
    return _cached(tuple(str(a) for a in argv), tuple(sorted((str(k), str(v)) for k, v in dict(files).items())),
                   version)


def read_recipe(recipe: Recipe) -> Job:
    if recipe.launch is None:
        raise RecipeError("launch: required")
    return read(recipe.launch)


def kind_of(key: str) -> str:
    return "contract" if key in CONTRACT_KEYS or key.startswith(CONTRACT_PREFIXES) else "frozen"


def resolve(name: str, job: Job) -> str | None:
    key, _ = _key(name.lstrip("-"))
    if key in job.settings or key in CONTRACT_KEYS or (job.form == "toml" and key in TOML_SCHEMA):
        return key
    if key in ALIASES:
        return ALIASES[key]
    leaf = key.rsplit(".", 1)[-1]
    ends = [k for k in job.settings if k.rsplit(".", 1)[-1] == leaf]
    if len(ends) == 1:
        return ends[0]  # e.g. training.lr, which torchtitan spells optimizer.lr
    return ALIASES.get(leaf)


# ---------------------------------------------------------------------------------------------- editing

def toml_literal(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_literal(v) for v in value) + "]"
    return json.dumps(str(value))


def toml_set(path: str, text: str, dotted: str, value: Any) -> str:
    """``text`` with ``dotted`` set to ``value`` in place (the key's own line), every other byte kept."""
    table, _, key = dotted.rpartition(".")
    lines = text.splitlines(keepends=True)
    current = ""
    for i, line in enumerate(lines):
        stripped = line.strip()
        header = re.match(r"^\[([^\[\]]+)\]\s*(#.*)?$", stripped)
        if header:
            current = header.group(1).strip()
            continue
        m = re.match(r"^(\s*)" + re.escape(key) + r"(\s*=\s*)(.*?)(\s*#.*)?$", line.rstrip("\r\n"))
        if m and current == table:
            newline = "\n" if line.endswith("\n") else ""
            lines[i] = f"{m.group(1)}{key}{m.group(2)}{toml_literal(value)}{m.group(4) or ''}{newline}"
            out = "".join(lines)
            expected = flatten(tomllib.loads(text))
            expected[dotted] = value
            if flatten(tomllib.loads(out)) == expected:
                return out
            break
    raise RecipeError(f"{path}: cannot change {dotted} in place")


def cli_tokens(opt: av.Option | None, key: str, value: Any) -> tuple[str, list[str]]:
    """The spelling and value tokens of setting ``key`` to ``value`` on the command line."""
    if isinstance(value, bool):
        section, _, leaf = key.rpartition(".")
        if opt is not None and opt.values:  # written with an explicit value: keep that style
            return opt.spelling, ["True" if value else "False"]
        return (f"--{key}" if value else f"--{section}.no-{leaf}" if section else f"--no-{leaf}"), []
    if isinstance(value, list):
        return (opt.spelling if opt is not None else f"--{key}"), [str(v) for v in value]
    return (opt.spelling if opt is not None and not opt.name.split(".")[-1].startswith("no") else f"--{key}"), \
        [repr(value) if isinstance(value, float) else str(value)]


def edit(job: Job, assignments: Mapping[str, Any], *, in_files: bool = True) -> tuple[list[str], dict[str, str]]:
    """The launch with each ``key → value`` set: in place where the command line sets it, in the TOML file where it
    does (``in_files``), else appended as ``--key value``; ``av.REMOVE`` drops a command-line setting."""
    e = av.Edit(list(job.argv))
    files: dict[str, str] = {job.toml_path: job.toml_text} if job.toml_path and job.toml_text is not None else {}
    toml_keys = flatten(tomllib.loads(job.toml_text)) if job.toml_text is not None else {}
    for key, value in assignments.items():
        opt = job.cli_options.get(key)
        if value is av.REMOVE:
            if opt is not None:
                e.replace[opt.start] = (opt.end, [])
            continue
        if opt is not None:
            spelling, tokens = cli_tokens(opt, key, value)
            e.replace[opt.start] = (opt.end, [f"{spelling}={tokens[0]}"] if opt.inline and len(tokens) == 1
                                    else [spelling, *tokens])
        elif in_files and job.toml_path is not None and key in toml_keys:
            files[job.toml_path] = toml_set(job.toml_path, files[job.toml_path], key, value)
        else:
            spelling, tokens = cli_tokens(None, key, value)
            e.append.extend([spelling, *tokens])
    return e.result(), files


def native_value(job: Job, knob: str, value: Any) -> Any:
    if knob == cat.LOCAL_BATCH and job.form == "registry":
        return int(value) * job.seq_len
    return value


def tokens_per_step(job: Job, knobs: Mapping[str, Any], world: int) -> int:
    """Tokens per optimizer step: the explicit global batch, else local batch × DP degree (× sequence length)."""
    g = job.explicit_global_batch
    if g is None:
        tp, pp, cp = int(knobs[cat.TP]), int(knobs[cat.PP]), int(knobs[cat.CP])
        rep, shard = int(knobs[cat.DP_REPLICATE]), int(knobs[cat.DP_SHARD])
        if shard == -1:
            shard = max(1, world // (tp * pp * cp * rep))
        g = int(knobs[cat.LOCAL_BATCH]) * rep * shard
    return g * job.seq_len


__all__ = ["ALIASES", "CONTRACT_KEYS", "REGISTRY", "TOML_SCHEMA", "Job", "config_file", "detect", "edit", "kind_of",
           "native_value", "parse", "read", "read_recipe", "resolve", "tokens_per_step", "toml_set"]

