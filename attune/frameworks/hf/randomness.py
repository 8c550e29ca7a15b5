"""What in an HF launch draws random numbers per micro-batch, so that another split of the global batch (per-device
batch, processes) trains on another random stream: the model's dropout, NEFTune's embedding noise, LoRA's dropout.

Such a change is not a re-association of the same sums: its losses differ from the first step on, before any update,
by far more than rounding (issue 37, a tiny GPT-2 with dropout under ``trl sft``: 2.75e-3 at step 1 against a loss
resolution of 2.4e-7; with every dropout at 0 the two layouts agreed to 5e-7). :func:`hazards` names the causes ahead
of any trial; the step-0 loss comparison decides.

The model's settings are read the way the scripts read them, without importing transformers:

- ``--config_name`` (a directory holding ``config.json``, or the file itself) or else ``--model_name_or_path`` (a
  local directory), relative to the launch's directory: its ``config.json`` (``save_pretrained`` writes every
  value; a key a hand-written file lacks has the default of its ``model_type``);
- ``--model_type`` without either (``run_clm.py`` training from scratch): that type's defaults, with
  ``--config_overrides key=value,...`` applied (``PretrainedConfig.update_from_string``);
- a model type's defaults come from the installed transformers' ``models/<type>/configuration_<type>.py``, read
  with :mod:`ast`: the class attributes of 5.x (``resid_pdrop: float | int = 0.1``) or the ``__init__`` defaults of
  4.x. A hub model id (not a local directory) cannot be read here: nothing is said about it.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import math
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

from attune.errors import RecipeError
from attune.frameworks.hf.settings import to_bool

#: name endings of config keys that are a dropout probability (``resid_pdrop``, ``hidden_dropout_prob``,
#: ``attention_dropout``, ``dropout_rate``, ...) or LayerDrop's (``layerdrop``)
_DROPOUT_ENDINGS = ("dropout", "dropout_prob", "dropout_rate", "pdrop", "layerdrop")
#: dropouts of heads a causal-LM training step does not run (GPT-2's double-heads summary, classification heads)
_UNUSED_PREFIXES = ("summary_", "classifier", "cls_")


def is_dropout_key(name: str) -> bool:
    return name.endswith(_DROPOUT_ENDINGS) and not name.startswith(_UNUSED_PREFIXES)


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def dropouts(config: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """The dropout probabilities of a model config mapping (one level of nested configs, e.g. ``text_config``)."""
    out: dict[str, float] = {}
    for key, value in config.items():
        if isinstance(value, Mapping) and not prefix:
            out.update(dropouts(value, f"{key}."))
        elif is_dropout_key(str(key)) and (number := _number(value)) is not None:
            out[f"{prefix}{key}"] = number
    return out


@lru_cache(maxsize=32)
def type_defaults(model_type: str) -> tuple[tuple[str, float], ...]:
    """The dropout defaults of ``model_type``'s config class in the installed transformers (empty where it or the
    type cannot be found)."""
    try:
        spec = importlib.util.find_spec("transformers")
    except (ImportError, ValueError):
        return ()
    if spec is None or spec.origin is None:
        return ()
    name = model_type.replace("-", "_")
    path = Path(spec.origin).parent / "models" / name / f"configuration_{name}.py"
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return ()
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
        found = _class_defaults(cls)
        if found.pop("model_type", None) == model_type:
            return tuple(sorted((k, v) for k, v in found.items() if isinstance(v, float)))
    return ()


def _class_defaults(cls: ast.ClassDef) -> dict[str, Any]:
    """``model_type`` and the numeric dropout defaults of a config class: its class attributes (5.x) or its
    ``__init__`` keyword defaults (4.x)."""
    out: dict[str, Any] = {}
    for node in cls.body:
        target, value = None, None
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            target, value = node.target.id, node.value
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            target, value = node.targets[0].id, node.value
        if target is None or not isinstance(value, ast.Constant):
            if isinstance(node, ast.FunctionDef) and node.name == "__init__":
                out.update(_init_defaults(node))
            continue
        if target == "model_type" and isinstance(value.value, str):
            out["model_type"] = value.value
        elif is_dropout_key(target) and (number := _number(value.value)) is not None:
            out[target] = number
    return out


def _init_defaults(init: ast.FunctionDef) -> dict[str, float]:
    args = init.args
    positional = args.args[len(args.args) - len(args.defaults):]
    pairs = [*zip(positional, args.defaults), *zip(args.kwonlyargs, args.kw_defaults)]
    return {a.arg: n for a, d in pairs if is_dropout_key(a.arg) and isinstance(d, ast.Constant)
            and (n := _number(d.value)) is not None}


def _overrides(text: str) -> dict[str, str]:
    """``--config_overrides`` (``n_embd=10,resid_pdrop=0.2``) as ``PretrainedConfig.update_from_string`` splits it."""
    return dict(part.split("=", 1) for part in str(text).split(",") if "=" in part)


def model_dropouts(native: Mapping[str, Any], cwd: Path) -> tuple[dict[str, float], str] | None:
    """The dropout probabilities of the model a launch trains and where they were read, or None where attune
    cannot read the model's config (a hub id, no model flags)."""
    config: dict[str, Any] | None = None
    source = ""
    for flag in ("config_name", "model_name_or_path"):
        value = native.get(flag)
        if not isinstance(value, str) or not value:
            continue
        path = Path(value) if Path(value).is_absolute() else cwd / value
        path = path / "config.json" if path.is_dir() else path
        try:
            config = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(config, dict):
            source = f"--{flag} {value}"
            break
        config = None
    model_type = config.get("model_type") if config is not None else native.get("model_type")
    if config is None and not isinstance(model_type, str):
        return None
    found = dict(type_defaults(model_type)) if isinstance(model_type, str) else {}
    if config is not None:
        found.update(dropouts(config))
    else:
        source = f"--model_type {model_type} (its defaults)"
    overrides = native.get("config_overrides")
    if isinstance(overrides, str) and overrides:
        found.update({k: n for k, v in _overrides(overrides).items()
                      if is_dropout_key(k) and (n := _number(v)) is not None})
        source += " and --config_overrides"
    return found, source


def hazards(native: Mapping[str, Any], cwd: Path, *, trl: str | None = None) -> list[str]:
    """Why another split of the global batch would train on another random stream, one line per cause (empty:
    none that attune can read)."""
    out: list[str] = []
    read = model_dropouts(native, cwd)
    if read is not None:
        active = {k: v for k, v in sorted(read[0].items()) if v > 0}
        if active:
            listed = ", ".join(f"{k}={v:g}" for k, v in active.items())
            out.append(f"the model's dropout ({listed}; from {read[1]}) draws masks per micro-batch: a per-device "
                       "batch (or process count) change draws another random stream")
    alpha = _number(native.get("neftune_noise_alpha"))
    if alpha:
        out.append(f"NEFTune (neftune_noise_alpha={alpha:g}) draws embedding noise per micro-batch, scaled by its "
                   "padded length: a per-device batch (or process count) change draws another random stream")
    if trl is not None and _on("use_peft", native.get("use_peft", False)):
        lora = _number(native.get("lora_dropout", 0.05))  # TRL's ModelConfig default
        if lora:
            out.append(f"LoRA's dropout (lora_dropout={lora:g}) draws masks per micro-batch: a per-device batch (or "
                       "process count) change draws another random stream")
    return out


def _on(name: str, value: Any) -> bool:
    try:
        return to_bool(name, value)
    except RecipeError:
        return False  # not a boolean: the script refuses it; nothing to warn about here


__all__ = ["dropouts", "hazards", "is_dropout_key", "model_dropouts", "type_defaults"]
