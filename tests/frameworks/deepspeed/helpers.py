"""Recipes of DeepSpeed launches for the tests: write a config, import a command line the way `attune import
--framework deepspeed` does."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from attune import frameworks
from attune.recipe.io import parse_recipe
from attune.recipe.model import Recipe
from attune.testing.logs import feed as feed  # re-exported for the tests here

FIXTURES = Path(__file__).parent / "fixtures"
EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "deepspeed"

#: the example's poor launch and config (examples/deepspeed/run.sh, ds_config.json)
POOR = ["deepspeed", "--num_gpus", "1", "train.py", "--deepspeed_config", "ds_config.json"]
POOR_CONFIG = (EXAMPLE / "ds_config.json").read_text()

#: an HF Trainer launch under DeepSpeed, its config with "auto" values (the HF integration docs' ZeRO-2 template)
HF_ARGV = ["deepspeed", "--num_gpus", "2", "train.py", "--deepspeed", "ds_zero2.json", "--output_dir", "out",
           "--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "2", "--learning_rate", "3e-4",
           "--max_steps", "1000", "--warmup_steps", "50", "--weight_decay", "0.01", "--seed", "7", "--bf16", "True"]
HF_CONFIG = """{
    "bf16": {"enabled": "auto"},
    "optimizer": {
        "type": "AdamW",
        "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto", "torch_adam": true}
    },
    "scheduler": {
        "type": "WarmupDecayLR",
        "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto", "warmup_num_steps": "auto",
                   "total_num_steps": "auto"}
    },
    "zero_optimization": {
        "stage": 2,
        "overlap_comm": true,
        "contiguous_gradients": true,
        "reduce_bucket_size": "auto",
        "allgather_bucket_size": 200000000
    },
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
    "steps_per_print": 2000,
    "wall_clock_breakdown": false
}
"""


def ds() -> Any:
    return frameworks.get("deepspeed")


def write(tmp: Path, name: str, config: str | dict[str, Any]) -> Path:
    text = config if isinstance(config, str) else json.dumps(config, indent=2) + "\n"
    (tmp / name).write_text(text)
    (tmp / "train.py").write_text("# a DeepSpeed training script\n")
    return tmp


def imported(argv: list[str] | str, cwd: Path, *, env: dict[str, str] | None = None, **options: Any) -> dict[str, Any]:
    argv = argv.split() if isinstance(argv, str) else list(argv)
    options.setdefault("devices_per_node", 8)
    options.setdefault("framework_version", "0.19.8")
    return ds().import_launch(argv, cwd=Path(cwd), env=env if env is not None else {"DS_ACCELERATOR": "cpu"},
                              options=options)


def recipe(argv: list[str] | str, cwd: Path, **options: Any) -> Recipe:
    return parse_recipe(imported(argv, cwd, **options))


def poor(tmp: Path, **options: Any) -> Recipe:
    """The example's poor launch, imported from a copy of its config in ``tmp``."""
    write(tmp, "ds_config.json", POOR_CONFIG)
    return recipe(POOR, tmp, **options)


def hf_recipe(tmp: Path, config: str = HF_CONFIG, argv: list[str] | None = None, **options: Any) -> Recipe:
    write(tmp, "ds_zero2.json", config)
    return recipe(argv or HF_ARGV, tmp, **options)


def with_config(r: Recipe, text: str) -> dict[str, Any]:
    """``r`` as a mapping whose DeepSpeed config reads ``text`` instead (a candidate that edits the config)."""
    data = r.model_dump(mode="python")
    (path,) = list(data["launch"]["files"])
    data["launch"]["files"][path] = text
    return data


def with_argv(r: Recipe, argv: list[str]) -> dict[str, Any]:
    data = r.model_dump(mode="python")
    data["launch"]["argv"] = list(argv)
    return data
