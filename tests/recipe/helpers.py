"""Shared helpers of the recipe tests: a Megatron recipe of Llama 3 8B shape, with knobs, scale and model to vary."""

from __future__ import annotations

from attune.recipe.model import Recipe

LLAMA8B = dict(family="llama3", layers=32, hidden_size=4096, heads=32, kv_groups=8, ffn_hidden_size=14336,
               vocab_size=128256)


def make(knobs=None, *, nodes=1, gbs=128, seq=8192, model=None, accelerator="h100-sxm-80gb", precision="bf16"):
    """A Megatron recipe of ``model`` (Llama 3 8B by default) on ``nodes`` nodes of 8 ``accelerator`` devices."""
    return Recipe.model_validate({
        "framework": "megatron", "model": model or LLAMA8B,
        "training": {"global_batch_size": gbs, "seq_length": seq, "steps": 10, "optimizer": {"lr": 1e-4},
                     "precision": precision},
        "resources": {"accelerator": accelerator, "nodes": nodes, "devices_per_node": 8},
        "knobs": knobs or {},
    })
