"""Fixtures of the trainer tests: a small recipe and helpers that run the trainer in-process or as processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from attune.recipe.model import Recipe
from attune.trainer.config import TrialSpec

REPO = Path(__file__).resolve().parents[2]
SMALL: dict[str, Any] = {
    "name": "small",
    "model": {"layers": 2, "hidden_size": 64, "heads": 4, "kv_groups": 2, "ffn_hidden_size": 128, "vocab_size": 256},
    "training": {"global_batch_size": 8, "seq_length": 32, "steps": 100, "optimizer": {"lr": 1e-3},
                 "schedule": {"warmup_steps": 2}},
    "resources": {"devices_per_node": 2},
    "knobs": {"micro_batch_size": 2, "intra_op_threads": 1},
}


def small_recipe(knobs: dict[str, Any] | None = None, resources: dict[str, Any] | None = None,
                 **training: Any) -> Recipe:
    """The small test recipe with some knobs, resources and training-contract fields changed."""
    data = json.loads(json.dumps(SMALL))
    data["knobs"].update(knobs or {})
    data["resources"].update(resources or {})
    data["training"].update(training)
    return Recipe.model_validate(data)


class Runner:
    """Runs the trainer on a recipe: ``inproc`` calls ``run_trial`` here, ``proc`` launches the CLI / torchrun."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp, self.count = tmp_path, 0

    @staticmethod
    def records(out_dir: Path, rank: int = 0) -> list[dict[str, Any]]:
        """The JSON records a rank wrote."""
        return [json.loads(line) for line in (out_dir / f"rank{rank}.jsonl").read_text().splitlines()]

    @staticmethod
    def losses(records: list[dict[str, Any]]) -> list[float]:
        """The step losses of a record list."""
        return [r["loss"] for r in records if r["event"] == "step"]

    def spec(self, recipe: Recipe, steps: int) -> TrialSpec:
        self.count += 1
        return TrialSpec(recipe=recipe, max_steps=steps, out_dir=str(self.tmp / f"run{self.count}"))

    def inproc(self, recipe: Recipe, steps: int = 4) -> tuple[int, list[dict[str, Any]]]:
        from attune.trainer.train import run_trial

        spec = self.spec(recipe, steps)
        code = run_trial(spec)
        return code, self.records(Path(spec.out_dir))

    def proc(self, recipe: Recipe, steps: int = 4, nproc: int = 0, env: dict[str, str] | None = None,
             timeout: float = 120, wait: bool = True) -> Any:
        """Run as a subprocess (``nproc > 0``: under torchrun); returns (rc, out_dir) or the Popen if not wait."""
        spec = self.spec(recipe, steps)
        path = self.tmp / f"spec{self.count}.json"
        path.write_text(spec.model_dump_json())
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc)]
        cmd = [*(launcher if nproc else [sys.executable]), "-m", "attune.trainer.train", "--spec", str(path)]
        full_env = {**os.environ, "OMP_NUM_THREADS": "1", "TORCHINDUCTOR_CACHE_DIR": str(self.tmp / "inductor"),
                    "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p),
                    **(env or {})}
        if not wait:  # its stderr goes to <out_dir>.stderr, for a test to wait on what it logs
            with open(f"{spec.out_dir}.stderr", "wb") as err:
                return subprocess.Popen(cmd, env=full_env, cwd=self.tmp, stdout=subprocess.DEVNULL,
                                        stderr=err), Path(spec.out_dir)
        res = subprocess.run(cmd, env=full_env, cwd=self.tmp, capture_output=True, text=True, timeout=timeout)
        return res.returncode, Path(spec.out_dir), res.stderr


@pytest.fixture
def runner(tmp_path: Path) -> Runner:
    return Runner(tmp_path)


@pytest.fixture
def recipe() -> Callable[..., Recipe]:
    return small_recipe
