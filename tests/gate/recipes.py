"""Base recipes the gate corpus starts from, as plain mappings (copied before every use)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]

_TINY = yaml.safe_load((ROOT / "examples" / "tiny-gpt-cpu.yaml").read_text())

_TINY_OPTIN = copy.deepcopy(_TINY)
_TINY_OPTIN["training"]["numerics_opt_in"] = ["tf32"]

#: a Llama-3-style dense model on one 8-GPU H100 node; vocab 128256 is a multiple of 128·2 but not 128·4
_MEGATRON: dict[str, Any] = {
    "name": "llama3-1b-h100",
    "framework": "megatron",
    "model": {"family": "llama3", "layers": 16, "hidden_size": 2048, "heads": 16, "kv_groups": 8,
              "ffn_hidden_size": 8192, "vocab_size": 128256},
    "training": {"global_batch_size": 64, "seq_length": 4096, "steps": 1000,
                 "optimizer": {"name": "adamw", "lr": 3.0e-4, "weight_decay": 0.1, "grad_clip": 1.0},
                 "schedule": {"name": "cosine", "warmup_steps": 100}, "seed": 1234, "precision": "bf16"},
    "resources": {"accelerator": "h100-sxm-80gb", "nodes": 1, "devices_per_node": 8},
    "knobs": {},
}

_MEGATRON_OPTIN = copy.deepcopy(_MEGATRON)
_MEGATRON_OPTIN["training"]["numerics_opt_in"] = ["fp8", "bf16_grad_reduce"]

_MEGATRON_MOE = copy.deepcopy(_MEGATRON)
_MEGATRON_MOE["name"] = "moe-8x-h100"
_MEGATRON_MOE["model"].update({"family": "mixtral", "moe_experts": 8, "moe_top_k": 2, "moe_ffn_hidden_size": 4096})

BASES: dict[str, dict[str, Any]] = {
    "tiny": _TINY,
    "tiny_optin": _TINY_OPTIN,
    "megatron": _MEGATRON,
    "megatron_optin": _MEGATRON_OPTIN,
    "megatron_moe": _MEGATRON_MOE,
}


def base(name: str) -> dict[str, Any]:
    """A fresh copy of base recipe ``name``."""
    return copy.deepcopy(BASES[name])
