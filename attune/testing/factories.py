"""Small valid recipes for tests."""

from __future__ import annotations

from typing import Any

from attune.recipe.model import Recipe


def tiny_recipe_dict(**knobs: Any) -> dict[str, Any]:
    return {
        "name": "tiny",
        "framework": "torch",
        "model": {"layers": 2, "hidden_size": 64, "heads": 4, "ffn_hidden_size": 256, "vocab_size": 256},
        "training": {"global_batch_size": 8, "seq_length": 32, "steps": 100,
                     "optimizer": {"name": "adamw", "lr": 1e-3}, "seed": 0},
        "resources": {"accelerator": "cpu", "nodes": 1, "devices_per_node": 2},
        "knobs": dict(knobs),
        "tuning": {"warmup_steps": 1, "measure_steps": 3, "baseline_repeats": 2},
    }


def tiny_recipe(**knobs: Any) -> Recipe:
    return Recipe.model_validate(tiny_recipe_dict(**knobs))
