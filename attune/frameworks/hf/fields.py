"""The ``TrainingArguments`` field names of the installed transformers, and how ``HfArgumentParser`` reads flags.

The names come from the installed package's own source (``transformers/training_args.py``, read with :mod:`ast`:
nothing is imported, so this is as fast as a file read). Where transformers is not installed (a recipe read on a
machine without the training environment), the field names of the pinned version stand in, and say so.

``HfArgumentParser`` is an ``argparse.ArgumentParser``: it accepts any unambiguous **prefix** of an option
(``--per_device_train 1`` sets ``--per_device_train_batch_size``), and each field also has a dashed spelling. An
abbreviation can be read only against every option of the user's script, which attune cannot see without running
it; :func:`abbreviation_problems` names each flag that would be one, so the launch is refused with the fix
(write the full name) instead of being read with HF's default for the field it sets.
"""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path

#: TrainingArguments fields of transformers 5.24.0 (the pinned version), for machines without transformers
PINNED_VERSION = "5.24.0"
PINNED_FIELDS = frozenset(["accelerator_config", "activation_checkpointing", "activation_checkpointing_kwargs", "adam_beta1", "adam_beta2", "adam_epsilon", "auto_find_batch_size", "average_tokens_across_devices", "batch_eval_metrics", "bf16", "bf16_full_eval", "data_seed", "dataloader_drop_last", "dataloader_in_order", "dataloader_multiprocessing_context", "dataloader_num_workers", "dataloader_persistent_workers", "dataloader_pin_memory", "dataloader_prefetch_factor", "ddp_backend", "ddp_broadcast_buffers", "ddp_bucket_cap_mb", "ddp_find_unused_parameters", "ddp_static_graph", "ddp_timeout", "debug", "deepspeed", "disable_tqdm", "do_eval", "do_predict", "do_train", "enable_jit_checkpoint", "eval_accumulation_steps", "eval_delay", "eval_do_concat_batches", "eval_on_start", "eval_steps", "eval_strategy", "eval_use_gather_object", "fp16", "fp16_full_eval", "fsdp", "fsdp_config", "full_determinism", "gradient_accumulation_steps", "gradient_checkpointing", "gradient_checkpointing_kwargs", "greater_is_better", "hub_always_push", "hub_model_id", "hub_private_repo", "hub_revision", "hub_strategy", "hub_token", "ignore_data_skip", "include_for_metrics", "include_num_input_tokens_seen", "label_names", "label_smoothing_factor", "learning_rate", "length_column_name", "liger_kernel_config", "load_best_model_at_end", "local_rank", "log_level", "log_level_replica", "log_on_each_node", "logging_first_step", "logging_nan_inf_filter", "logging_steps", "logging_strategy", "lr_scheduler_kwargs", "lr_scheduler_type", "max_grad_norm", "max_steps", "metric_for_best_model", "neftune_noise_alpha", "num_train_epochs", "optim", "optim_args", "optim_target_modules", "output_dir", "parallelism_config", "per_device_eval_batch_size", "per_device_train_batch_size", "prediction_loss_only", "project", "push_to_hub", "remove_unused_columns", "report_to", "restore_callback_states_from_checkpoint", "resume_from_checkpoint", "run_name", "save_on_each_node", "save_only_model", "save_steps", "save_strategy", "save_total_limit", "seed", "skip_memory_metrics", "tf32", "torch_compile", "torch_compile_backend", "torch_compile_mode", "torch_empty_cache_steps", "trackio_bucket_id", "trackio_space_id", "trackio_static_space_id", "train_sampling_strategy", "use_cache", "use_cpu", "use_liger_kernel", "warmup_steps", "weight_decay"])


@lru_cache(maxsize=1)
def _installed() -> tuple[frozenset[str], frozenset[str], str] | None:
    """(fields, boolean fields defaulting to true, source) of the installed transformers, or None."""
    try:
        spec = importlib.util.find_spec("transformers")
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / "training_args.py"
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "TrainingArguments"), None)
    if cls is None:
        return None
    names: set[str] = set()
    true_bools: set[str] = set()
    for stmt in cls.body:
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            continue
        if _init_false(stmt.value):
            continue
        names.add(stmt.target.id)
        if "bool" in ast.unparse(stmt.annotation) and _default(stmt.value) is True:
            true_bools.add(stmt.target.id)
    if not names:
        return None
    return frozenset(names), frozenset(true_bools), str(path)


def _field_call(value: ast.expr | None) -> ast.Call | None:
    if isinstance(value, ast.Call) and getattr(value.func, "id", getattr(value.func, "attr", "")) == "field":
        return value
    return None


def _init_false(value: ast.expr | None) -> bool:
    call = _field_call(value)
    return call is not None and any(k.arg == "init" and isinstance(k.value, ast.Constant) and k.value.value is False
                                    for k in call.keywords)


def _default(value: ast.expr | None) -> object:
    call = _field_call(value)
    if call is not None:
        value = next((k.value for k in call.keywords if k.arg == "default"), None)
    return value.value if isinstance(value, ast.Constant) else None


def training_argument_fields() -> frozenset[str]:
    """Every ``TrainingArguments`` field the installed transformers has (the pinned version's where none is)."""
    found = _installed()
    return found[0] if found is not None else PINNED_FIELDS


def true_boolean_fields() -> frozenset[str]:
    """The installed TrainingArguments' boolean fields that default to true (empty where none is installed)."""
    found = _installed()
    return found[1] if found is not None else frozenset()


def fields_source() -> str:
    found = _installed()
    return found[2] if found is not None else f"transformers {PINNED_VERSION} (not installed here)"


def option_names(no_forms: Iterable[str]) -> frozenset[str]:
    """The option names ``HfArgumentParser`` gives TrainingArguments (dashes read as underscores): each field,
    and ``no_<field>`` for the boolean fields that default to true."""
    found = _installed()
    true_bools = set(found[1]) if found is not None else set()
    fields = training_argument_fields()
    return frozenset(fields | {f"no_{n}" for n in (true_bools | set(no_forms)) if n in fields})


def abbreviation_problems(names: Iterable[str | tuple[str, str]], no_forms: Iterable[str], *,
                          options: frozenset[str] | None = None) -> list[str]:
    """A message for each flag name that is not a TrainingArguments option but a prefix of exactly one: argparse
    expands it to that option unless the script defines an option of exactly that name, and attune cannot tell
    which. (A prefix of several options is refused by argparse as ambiguous, so in a launch that runs it is the
    script's own option: a frozen setting, not an abbreviation.) ``names``: normalised names, or (name, spelling as
    written) pairs."""
    options = options if options is not None else option_names(no_forms)  # a TRL command's own where given
    problems = []
    pairs = [(n, f"--{n}") if isinstance(n, str) else n for n in names]
    for name, spelling in dict.fromkeys(pairs):
        if name in options or not name:
            continue
        expands = [o for o in options if o.startswith(name)]
        if len(expands) != 1:
            continue
        problems.append(f"{spelling} is an abbreviation: HfArgumentParser (argparse) reads it as --{expands[0]} "
                        f"unless your script defines {spelling} itself, and attune cannot tell which; write "
                        f"--{expands[0]} (or rename your script's own option) and import again")
    return problems


__all__ = ["PINNED_FIELDS", "PINNED_VERSION", "abbreviation_problems", "fields_source", "option_names",
           "training_argument_fields", "true_boolean_fields"]
