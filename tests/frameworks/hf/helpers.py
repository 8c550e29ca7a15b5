"""Recipes of HF launches for the tests: import a command line the way `attune import --framework hf` does."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from attune import frameworks
from attune.recipe.io import parse_recipe
from attune.recipe.model import Recipe
from attune.testing.logs import feed as feed  # re-exported for the tests here
from attune.testing.trials import backend as backend  # re-exported for the tests here
from attune.testing.trials import request as request

FIXTURES = Path(__file__).parent / "fixtures"
EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "hf-trainer"



def cmd(text: str) -> list[str]:
    """A command line written as one string, split on spaces."""
    return text.split()


POOR = cmd("python train.py --per_device_train_batch_size 1 --gradient_accumulation_steps 16 "
           "--gradient_checkpointing True --dataloader_num_workers 0 --max_steps 10000 --learning_rate 5e-4 "
           "--seed 0 --use_cpu True")


def hf() -> Any:
    return frameworks.get("hf")


def imported(argv: list[str] | str, cwd: Path | str = ".", *, env: dict[str, str] | None = None,
             **options: Any) -> dict[str, Any]:
    argv = argv.split() if isinstance(argv, str) else list(argv)
    options.setdefault("devices_per_node", 8)
    options.setdefault("framework_version", "5.24.0")
    return hf().import_launch(argv, cwd=Path(cwd), env=env or {}, options=options)


def recipe(argv: list[str] | str, cwd: Path | str = ".", **options: Any) -> Recipe:
    return parse_recipe(imported(argv, cwd, **options))


def with_argv(r: Recipe, argv: list[str] | str) -> dict[str, Any]:
    """``r`` as a mapping whose launch runs ``argv`` instead (a candidate that edits the user's command)."""
    data = r.model_dump(mode="python")
    data["launch"]["argv"] = argv.split() if isinstance(argv, str) else list(argv)
    return data





def example_copy(tmp_path: Path) -> Path:
    """A copy of examples/hf-trainer in ``tmp_path`` (so a trial's leftovers are findable)."""
    work = tmp_path / "hf-trainer"
    shutil.copytree(EXAMPLE, work, ignore=shutil.ignore_patterns("out", "trainer_output", "__pycache__"))
    return work


def example_recipe(tmp_path: Path, **knobs: Any) -> Recipe:
    """The example's poor launch, run from a copy of the example in ``tmp_path`` (so leftovers are findable)."""
    r = recipe(POOR, example_copy(tmp_path), tokens_per_sample=128, devices_per_node=2)
    return r.with_knobs(**{"env.OMP_NUM_THREADS": "1", **knobs})
