"""`attune tune imported.yaml --backend sim --budget B` tunes an imported Megatron-LM recipe on the simulator, and the
best recipe renders to the user's launch with exactly the kept changes."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from typer.testing import CliRunner

from attune.cli import _mount_optional, app
from attune.recipe.io import load_recipe, recipe_to_dict
from tests.frameworks.megatron.helpers import changed_tokens, megatron, mlm


def test_tune_an_imported_megatron_lm_recipe_on_the_simulator(tmp_path: Path):
    r = mlm("llama3_70b_h100_fp8.sh")
    path = tmp_path / "imported.yaml"
    path.write_text(yaml.safe_dump(recipe_to_dict(r), sort_keys=False))
    _mount_optional()
    out = CliRunner().invoke(app, ["tune", str(path), "--backend", "sim", "--budget", "200", "--out",
                                   str(tmp_path / "run")])
    assert out.exit_code == 0, out.output
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert result["speedup"] > 1.05, result
    best = load_recipe(tmp_path / "run" / "best-recipe.yaml")
    assert best.launch == r.launch  # the user's launch travels with the recipe
    kept = result["best_changes"]
    removed, added = changed_tokens(list(r.launch.argv), list(megatron().render(best).argv))
    assert removed and added and len(removed) <= 2 * len(kept), (kept, removed, added)
