"""Held-out gate checks on imported native Megatron recipes: a contract setting changed in the framework's own
names is refused, through ``attune.gate.evaluate`` and through ``attune gate check RECIPE --set NAME=VALUE``."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from attune.commands.gate import app
from attune.gate import apply_sets, evaluate
from attune.recipe.io import recipe_to_dict
from tests.frameworks.megatron.helpers import bridge_yaml, mlm, nemo

CONTRACT = "contract"


def verdict(recipe, *sets):
    return evaluate(recipe, apply_sets(recipe.model_dump(mode="python"), list(sets)))


def fields(v):
    return {r.field for r in v.reasons if r.code == CONTRACT}


@pytest.mark.parametrize("setting, field", [
    ("lr=1e-3", "launch.args.lr"),
    ("--lr=1e-3", "launch.args.lr"),
    ("global-batch-size=256", "training.global_batch_size"),
    ("seq-length=4096", "training.seq_length"),
    ("moe-expert-capacity-factor=1.0", "launch.args.moe-expert-capacity-factor"),
    ("seed=7", "launch.args.seed"),
    ("train-samples=1000", "launch.args.train-samples"),
    ("hidden-dropout=0.1", "launch.args.hidden-dropout"),
    ("no-mmap-bin-files=false", "launch.options"),  # a frozen setting the launch has, removed
    ("tokenizer-type=GPT2BPETokenizer", "launch.args.tokenizer-type"),
])
def test_megatron_lm_contract_settings_are_refused(setting, field):
    v = verdict(mlm(), setting)
    assert not v.admitted and field in fields(v), [r.render() for r in v.reasons]


def test_refusal_names_the_native_setting_and_both_values():
    v = verdict(mlm(), "lr=1e-3")
    msg = next(r.message for r in v.reasons if r.field == "launch.args.lr")
    assert "0.00015" in msg and "0.001" in msg and "training contract" in msg


@pytest.mark.parametrize("setting, field", [
    ("optimizer.lr=1e-3", "launch.args.optimizer.lr"),
    ("lr=1e-3", "launch.args.optimizer.lr"),
    ("train.global_batch_size=64", "launch.args.train.global_batch_size"),
    ("dataset.seq_length=4096", "launch.args.dataset.seq_length"),
    ("model.moe_expert_capacity_factor=1.0", "launch.args.model.moe_expert_capacity_factor"),
    ("rng.seed=7", "launch.args.rng.seed"),
])
def test_bridge_contract_settings_are_refused(setting, field):
    v = verdict(bridge_yaml(), setting)
    assert not v.admitted and field in fields(v), [r.render() for r in v.reasons]


@pytest.mark.parametrize("setting, field", [
    ("optim.config.lr=1e-3", "launch.args.optim.config.lr"),
    ("lr=1e-3", "launch.args.optim.config.lr"),
    ("data.global_batch_size=256", "launch.args.data.global_batch_size"),
    ("data.seq_length=4096", "launch.args.data.seq_length"),
    ("trainer.max_steps=10", "launch.args.trainer.max_steps"),
])
def test_nemo2_contract_settings_are_refused(setting, field):
    v = verdict(nemo(), setting)
    assert not v.admitted and field in fields(v), [r.render() for r in v.reasons]


@pytest.mark.parametrize("make, setting", [
    (mlm, "tensor-model-parallel-size=2"),  # a knob in its native spelling is the knob
    (mlm, "micro_batch_size=2"),
    (bridge_yaml, "model.context_parallel_size=1"),
    (nemo, "trainer.strategy.pipeline_model_parallel_size=2"),
])
def test_knobs_in_native_names_are_knob_moves(make, setting):
    assert verdict(make(), setting).admitted


def test_baseline_numerics_are_taken_as_given():
    # NVIDIA's recipes already reduce gradients in BF16 (and the MLM one trains FP8) without an opt-in: the baseline
    # is not refused, and a move that leaves those settings alone is admitted
    for r in (mlm(), bridge_yaml()):
        assert r.knob("grad_reduce_in_bf16") is True and r.numerics_opt_in == ()
        assert evaluate(r, r).admitted
        assert evaluate(r, r.with_knobs(micro_batch_size=2 if r.knob("micro_batch_size") == 1 else 1)).admitted
    # a launch that reduces in FP32 may not start reducing in BF16 without the owner's opt-in
    n = nemo()
    assert n.knob("grad_reduce_in_bf16") is False
    v = evaluate(n, n.with_knobs(grad_reduce_in_bf16=True))
    assert not v.admitted and v.reasons[0].code == "numerics_not_opted_in"


def test_gate_check_cli_refuses_a_native_contract_change(tmp_path: Path):
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe_to_dict(mlm()), sort_keys=False))
    runner = CliRunner()
    refused = runner.invoke(app, ["check", str(path), "--set", "lr=1e-3"])
    assert refused.exit_code == 1, refused.output
    assert "launch.args.lr" in refused.output and "REFUSED" in refused.output.upper()
    admitted = runner.invoke(app, ["check", str(path), "--set", "micro_batch_size=2"])
    assert admitted.exit_code == 0, admitted.output
