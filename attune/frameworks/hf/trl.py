"""TRL training commands (``trl sft ...`` and friends) on the hf framework: their dataclasses, defaults and contract.

TRL's trainers are HuggingFace ``Trainer`` subclasses whose configs (``SFTConfig``, ``DPOConfig``, ...) extend
``TrainingArguments``, so a TRL launch gets hf's knobs, render, trials and log parsing. What differs, read from trl
1.16.0's own source:

- **the launch** (``trl/cli/main.py``, ``trl/cli/commands/training.py``): ``trl <command> ARGS`` parses ARGS with
  the command's ``TrlParser`` (``parse_args_and_config(return_remaining_strings=True)``); every flag that is not a
  field of the command's dataclasses (``--num_processes 2``, ``--multi_gpu``, ``--accelerate_config zero2``, also
  unknown keys of the ``--config`` YAML) is an argument of ``accelerate launch``, which TRL then runs on
  ``trl/scripts/<command>.py`` with the remaining flags (``trl/cli/accelerate_launcher.py``). ``--accelerate_config``
  names a file or one of the configs packaged in ``trl/accelerate_configs`` and becomes accelerate's
  ``--config_file`` (``trl/cli/accelerate_config.py``). The commands that train are listed in
  ``trl/cli/commands/__init__.py``; the scripts also run as ``python trl/scripts/sft.py ...`` / ``accelerate launch
  .../trl/scripts/sft.py ...`` / ``python -m trl.scripts.sft ...`` (each has an ``if __name__ == "__main__"``);
- **the config file** (``TrlParser.parse_args_and_config`` in ``trl/scripts/utils.py``): ``--config FILE.yaml``
  (exactly that spelling: TRL looks the token up with ``args.index("--config")``) holds a mapping whose values become
  the parser's defaults, so a command-line flag overrides it; its ``env:`` mapping is exported into the environment;
- **the defaults**: ``trl/trainer/base_config.py`` (``_BaseConfig``, the base of every TRL config) overrides
  ``gradient_checkpointing`` (true), ``logging_steps`` (10) and ``bf16`` (``None``, which ``__post_init__`` makes
  ``not fp16``); each config sets its own ``learning_rate`` (``SFTConfig`` 2e-5, ``DPOConfig`` 1e-6, ...). The
  contract uses these where a launch does not set a field; ``tests/frameworks/hf/test_trl.py`` checks every pinned
  default against the installed dataclasses;
- **the contract**: TRL's own settings that decide what is learned (:data:`CONTRACT`).

Field names are read from the installed trl's source with :mod:`ast` (nothing imported, like
:mod:`attune.frameworks.hf.fields`): the command's script names its dataclasses in ``dataclass_types = (...)``.
"""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from attune.frameworks.hf.fields import training_argument_fields

PINNED_VERSION = "1.16.0"
#: the ``trl`` subcommands that train (``trl/cli/commands/__init__.py`` of trl 1.16: ``env`` and ``vllm-serve``
#: do not)
COMMANDS = ("distillation", "dpo", "grpo", "kto", "reward", "rloo", "sft")
#: the TRL parser's own flag for the YAML config (``TrlParser.parse_args_and_config``)
CONFIG_FLAG = "config"
#: flags of ``trl <command>`` that TRL rewrites for accelerate (``resolve_accelerate_config_argument``)
ACCELERATE_CONFIG_FLAGS = ("accelerate_config", "config_file")

#: ``learning_rate`` default of each command's config class (``trl/trainer/<command>_config.py``)
LEARNING_RATE = {"sft": 2e-5, "dpo": 1e-6, "grpo": 1e-6, "kto": 1e-6, "reward": 1e-4, "rloo": 1e-6,
                 "distillation": 1e-6}
#: TrainingArguments defaults every TRL config overrides (``trl/trainer/base_config.py``, ``_BaseConfig``); ``bf16``
#: ``None`` resolves to ``not fp16`` in ``_BaseConfig.__post_init__``
BASE_DEFAULTS: dict[str, Any] = {"gradient_checkpointing": True, "logging_steps": 10, "bf16": None}

#: settings shared by every TRL command's script (``ScriptArguments`` / ``DatasetMixtureConfig`` in
#: ``trl/scripts/utils.py``, ``ModelConfig`` in ``trl/trainer/model_config.py``): which data, which model, which
#: weights are trained (LoRA / quantisation) and in what precision the model is loaded
SHARED_CONTRACT: dict[str, tuple[str, Any]] = {
    "dataset_name": ("str?", None),
    "dataset_config": ("str?", None),
    "dataset_train_split": ("str", "train"),
    "dataset_streaming": ("bool", False),
    "datasets": ("list", []),  # DatasetMixtureConfig (a list of dataset mappings; the YAML config only)
    "streaming": ("bool", False),
    "test_split_size": ("float?", None),
    "model_name_or_path": ("str?", None),
    "model_revision": ("str", "main"),
    "dtype": ("str?", "float32"),
    "use_peft": ("bool", False),
    "lora_r": ("int", 16),
    "lora_alpha": ("int", 32),
    "lora_dropout": ("float", 0.05),
    "lora_target_modules": ("list?", None),
    "lora_target_parameters": ("list?", None),
    "lora_modules_to_save": ("list?", None),
    "lora_task_type": ("str", "CAUSAL_LM"),
    "use_rslora": ("bool", False),
    "use_dora": ("bool", False),
    "load_in_8bit": ("bool", False),
    "load_in_4bit": ("bool", False),
    "bnb_4bit_quant_type": ("str", "nf4"),
    "use_bnb_nested_quant": ("bool", False),
    "neftune_noise_alpha": ("float?", None),  # TrainingArguments: noise added to the embeddings in training
}

#: ``SFTConfig`` settings (``trl/trainer/sft_config.py``) that decide what is learned: how the text is tokenized,
#: truncated, packed and which tokens carry the loss. ``padding_free`` is among them: without packing it stops
#: ``max_length`` from being enforced (``SFTTrainer.__init__`` warns so, trl 1.16 ``trl/trainer/sft_trainer.py``),
#: and with an attention implementation that ignores ``position_ids`` (eager / sdpa) flattened sequences attend to
#: each other, so it changes the loss, not only the speed.
SFT_CONTRACT: dict[str, tuple[str, Any]] = {
    "packing": ("bool", False),
    "packing_strategy": ("str", "bfd"),
    "padding_free": ("bool", False),
    "max_length": ("int?", 1024),
    "truncation_mode": ("str", "keep_start"),
    "completion_only_loss": ("bool?", None),
    "assistant_only_loss": ("bool", False),
    "dataset_text_field": ("str", "text"),
    "dataset_kwargs": ("str?", None),
    "loss_type": ("str", "nll"),
    "eos_token": ("str?", None),
    "pad_token": ("str?", None),
    "chat_template_path": ("str?", None),
    "shuffle_dataset": ("bool", False),
    "model_init_kwargs": ("str?", None),
}
CONTRACT_BY_COMMAND: dict[str, dict[str, tuple[str, Any]]] = {"sft": SFT_CONTRACT}


def command_of(launcher: str, script: str, module: bool) -> str | None:
    """The TRL training command a launch runs: ``trl sft`` (launcher ``trl``), ``.../trl/scripts/sft.py``, or the
    module ``trl.scripts.sft``; None for any other script."""
    if launcher == "trl":
        return script if script in COMMANDS else None
    if module:
        head, _, name = script.rpartition(".")
        return name if head == "trl.scripts" and name in COMMANDS else None
    path = PurePosixPath(script)
    if path.suffix == ".py" and path.stem in COMMANDS and path.parent.parts[-2:] == ("trl", "scripts"):
        return path.stem
    return None


def contract(command: str, hf_contract: Mapping[str, tuple[str, Any]]) -> dict[str, tuple[str, Any]]:
    """The contract settings of a TRL command with their TRL defaults: hf's contract with the defaults TRL's configs
    override, the shared script/model settings, and the command's own (SFT's; the other commands' own fields are
    frozen verbatim where a launch sets them)."""
    out = dict(hf_contract)
    out["learning_rate"] = ("float", LEARNING_RATE.get(command, hf_contract["learning_rate"][1]))
    out["bf16"] = ("bool?", None)  # None: not fp16 (``_BaseConfig.__post_init__``)
    out.update(SHARED_CONTRACT)
    out.update(CONTRACT_BY_COMMAND.get(command, {}))
    return out


def knob_default(command: str | None, name: str, hf_default: Any) -> Any:
    """A knob flag's default under the command's config (``_BaseConfig`` turns activation checkpointing on)."""
    if command is None or name != "gradient_checkpointing":
        return hf_default
    return BASE_DEFAULTS[name]


# ---------------------------------------------------------------------------------------------- field names

def _trl_root() -> Path | None:
    try:
        spec = importlib.util.find_spec("trl")
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent


def _classes(paths: Sequence[Path]) -> dict[str, ast.ClassDef]:
    out: dict[str, ast.ClassDef] = {}
    for path in paths:
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (OSError, SyntaxError, UnicodeDecodeError):
            continue
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                out.setdefault(node.name, node)
    return out


def _own_fields(cls: ast.ClassDef) -> dict[str, bool]:
    """A class body's dataclass fields → whether each is a boolean defaulting to true (``HfArgumentParser`` then
    also accepts ``--no_<name>``)."""
    names: dict[str, bool] = {}
    for stmt in cls.body:
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            continue
        call = stmt.value
        default: ast.expr | None = call
        if isinstance(call, ast.Call) and getattr(call.func, "id", getattr(call.func, "attr", "")) == "field":
            if any(k.arg == "init" and isinstance(k.value, ast.Constant) and k.value.value is False
                   for k in call.keywords):
                continue
            default = next((k.value for k in call.keywords if k.arg == "default"), None)
        true_bool = "bool" in ast.unparse(stmt.annotation) and isinstance(default, ast.Constant) \
            and default.value is True
        names[stmt.target.id] = true_bool
    return names


def fields(command: str) -> frozenset[str] | None:
    """Every flag name (field) of the dataclasses ``trl/scripts/<command>.py`` parses, from the installed trl's
    source; None where trl (or the command's script) is not installed here."""
    found = _fields(command)
    return found[0] if found is not None else None


def no_forms(command: str) -> frozenset[str]:
    """The command's boolean fields that default to true, which ``HfArgumentParser`` also takes as ``--no_<name>``
    (``gradient_checkpointing`` among them: ``_BaseConfig`` turns it on); ``_BaseConfig``'s where trl is not
    installed here."""
    found = _fields(command)
    return found[1] if found is not None else frozenset({"gradient_checkpointing"})


@lru_cache(maxsize=16)
def _fields(command: str) -> tuple[frozenset[str], frozenset[str]] | None:
    root = _trl_root()
    if root is None or command not in COMMANDS:
        return None
    script = root / "scripts" / f"{command}.py"
    try:
        tree = ast.parse(script.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "dataclass_types"
                                                for t in node.targets) and isinstance(node.value, ast.Tuple):
            names = [e.id for e in node.value.elts if isinstance(e, ast.Name)]
    if not names:
        return None
    sources = [script, root / "scripts" / "utils.py", *sorted((root / "trainer").glob("*.py"))]
    classes = _classes(sources)
    out: dict[str, bool] = {}

    def collect(name: str, seen: frozenset[str]) -> bool:
        if name == "TrainingArguments":
            from attune.frameworks.hf.fields import true_boolean_fields

            out.update({f: f in true_boolean_fields() for f in training_argument_fields()})
            return True
        cls = classes.get(name)
        if cls is None or name in seen:
            return False
        for base in cls.bases:
            base_name = base.id if isinstance(base, ast.Name) else base.attr if isinstance(base, ast.Attribute) else ""
            if base_name and base_name != "object":
                collect(base_name, seen | {name})
        out.update(_own_fields(cls))
        return True

    if not all(collect(n, frozenset()) for n in names):
        return None
    return frozenset(out), frozenset(k for k, v in out.items() if v)


def is_field(command: str, name: str) -> bool:
    """Whether ``--name`` is one of the command's own flags (a field, or ``no_<field>`` of a true boolean), not an
    argument TRL hands to ``accelerate launch``. Without trl installed here every flag counts as TRL's except the
    accelerate options attune knows."""
    known = fields(command)
    if known is None:
        from attune.frameworks.cmdline import ACCELERATE_SWITCHES

        return name not in ACCELERATE_SWITCHES and name not in _ACCELERATE_VALUE_OPTIONS
    return name in known or (name.startswith("no_") and name[3:] in no_forms(command))


#: accelerate launch options that take a value, recognised among ``trl <command>`` flags where trl is not installed
_ACCELERATE_VALUE_OPTIONS = frozenset({"num_processes", "num_machines", "machine_rank", "main_process_ip",
                                       "main_process_port", "mixed_precision", "config_file", "accelerate_config",
                                       "gpu_ids", "dynamo_backend", "deepspeed_config_file", "zero_stage",
                                       "fsdp_version", "rdzv_backend"})


def load_config(path: str, text: str) -> dict[str, Any]:
    """The mapping of a TRL ``--config`` YAML file, as ``TrlParser.parse_args_and_config`` reads it."""
    from attune.errors import RecipeError

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise RecipeError(f"TRL config file {path} does not parse: {err}") from None
    if not isinstance(data, dict):
        raise RecipeError(f"TRL config file {path} must hold a YAML mapping (TRL refuses anything else), got "
                          f"{type(data).__name__}")
    env = data.get("env")
    if env is not None and not isinstance(env, dict):
        raise RecipeError(f"TRL config file {path}: `env` must be a mapping of variable names to values (TRL refuses "
                          "anything else)")
    return data


def packaged_accelerate_config(name: str) -> dict[str, Any] | None:
    """A config packaged in ``trl/accelerate_configs`` (``--accelerate_config multi_gpu``), read from the installed
    trl; None where it is not there."""
    root = _trl_root()
    if root is None:
        return None
    path = root / "accelerate_configs" / f"{name}.yaml"
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) else None


__all__ = ["ACCELERATE_CONFIG_FLAGS", "BASE_DEFAULTS", "COMMANDS", "CONFIG_FLAG", "LEARNING_RATE", "PINNED_VERSION",
           "SFT_CONTRACT", "SHARED_CONTRACT", "command_of", "contract", "fields", "is_field",
           "knob_default", "load_config", "no_forms", "packaged_accelerate_config"]
