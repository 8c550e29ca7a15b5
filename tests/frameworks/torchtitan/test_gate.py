"""Held-out gate checks on an imported torchtitan job: contract settings in torchtitan's own names are refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from attune.commands.gate import app
from attune.gate import apply_sets, evaluate
from attune.recipe.io import recipe_to_dict
from tests.frameworks.torchtitan.helpers import recipe, registry_argv, toml_argv


def verdict(r, *sets):
    return evaluate(r, apply_sets(r.model_dump(mode="python"), list(sets)))


@pytest.mark.parametrize("setting, field", [
    ("optimizer.lr=1e-3", "launch.args.optimizer.lr"),
    ("lr=1e-3", "launch.args.optimizer.lr"),
    ("training.lr=1e-3", "launch.args.optimizer.lr"),  # torchtitan spells its learning rate optimizer.lr
    ("training.seq_len=4096", "launch.args.training.seq_len"),
    ("training.steps=10", "launch.args.training.steps"),
    ("training.global_batch_size=16", "torchtitan.tokens_per_step"),
    ("lr_scheduler.warmup_steps=10", "launch.args.lr_scheduler.warmup_steps"),
    ("model.flavor=70B", "launch.args.model.flavor"),
    ("debug.seed=7", "launch.args.debug.seed"),
])
def test_contract_settings_are_refused(setting, field):
    v = verdict(recipe(), setting)
    assert not v.admitted and field in {r.field for r in v.reasons}, [r.render() for r in v.reasons]


def test_the_default_global_batch_makes_dp_moves_contract_changes():
    # registry form: num_tokens_per_train_step -1 = local batch × DP degree; TP 2 → 4 halves DP, so the batch
    r = recipe(registry_argv())
    v = evaluate(r, r.with_knobs(tensor_parallel_degree=4))
    assert not v.admitted and v.reasons[0].field == "torchtitan.tokens_per_step"
    # the TOML example fixes the global batch at 8: the same move only changes the accumulation
    t = recipe(toml_argv())
    assert evaluate(t, t.with_knobs(tensor_parallel_degree=4)).admitted
    assert evaluate(t, t.with_knobs(compile=True)).admitted


def test_knob_in_native_name_is_the_knob():
    assert verdict(recipe(), "parallelism.tensor_parallel_degree=4").admitted
    assert verdict(recipe(), "compile=true").admitted


def test_gate_check_cli(tmp_path: Path):
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe_to_dict(recipe()), sort_keys=False))
    out = CliRunner().invoke(app, ["check", str(path), "--set", "optimizer.lr=1e-3"])
    assert out.exit_code == 1 and "launch.args.optimizer.lr" in out.output, out.output
