"""The gate protects a Lightning launch: contract settings in Lightning's own names (on the command line, in the
config file, through ``--set``), the global batch, precision without an owner opt-in, and every other setting."""

from __future__ import annotations

import pytest

from attune.gate import effective_contract, equivalent_layout, evaluate
from attune.gate.sets import apply_sets
from attune.gate.verdict import ReasonCode
from attune.recipe.catalogue import Semantics
from attune.recipe.io import parse_recipe
from tests.frameworks.lightning.helpers import POOR, imported, lightning, recipe, swap, with_argv


@pytest.mark.parametrize("flags,field", [
    (["--trainer.precision", "bf16-mixed"], "launch.args.trainer.precision"),
    (["--trainer.precision=16-mixed"], "launch.args.trainer.precision"),
    (["--model.learning_rate", "2e-3"], "launch.args.model.learning_rate"),
    (["--trainer.max_steps", "20000"], "launch.args.trainer.max_steps"),
    (["--seed_everything", "1"], "launch.args.seed_everything"),
    (["--trainer.gradient_clip_val", "0.5"], "launch.args.trainer.gradient_clip_val"),
    (["--trainer.max_epochs", "3"], "launch.args.trainer.max_epochs"),
    (["--data.seq_len", "64"], "launch.args.data.seq_len"),
])
def test_contract_changes_in_lightnings_own_names_are_refused(flags, field):
    base = recipe(POOR)
    v = evaluate(base, with_argv(base, [*POOR, *flags]))
    assert not v.admitted and v.semantics is Semantics.CONTRACT
    reason = next(r for r in v.reasons if r.field == field)
    assert reason.code == ReasonCode.CONTRACT and "restore it" in reason.message


def test_contract_settings_restated_with_their_value_are_no_change():
    base = recipe(POOR)
    v = evaluate(base, with_argv(base, [*POOR, "--model.learning_rate", "0.001", "--trainer.precision", "32",
                                        "--trainer.max_steps=10000", "--seed_everything", "0"]))
    assert v.admitted, v.reasons


def test_a_new_optimizer_or_model_setting_is_refused():
    base = recipe(POOR)
    for flags in (["--optimizer.lr", "0.1"], ["--model.n_heads", "2"], ["--lr_scheduler", "StepLR"]):
        v = evaluate(base, with_argv(base, [*POOR, *flags]))
        assert not v.admitted and "launch.learning_settings" in {r.field for r in v.reasons}, flags


def test_a_changed_config_file_is_refused():
    base = recipe(POOR)
    data = base.model_dump(mode="python")
    data["launch"]["files"]["config.yaml"] = data["launch"]["files"]["config.yaml"].replace("max_steps: 10000",
                                                                                            "max_steps: 500")
    fields = {r.field for r in evaluate(base, data).reasons}
    assert {"launch.args.trainer.max_steps", "launch.config_files"} <= fields


def test_precision_is_a_numerics_change_the_owner_must_opt_in_to():
    base = recipe(POOR)
    v = evaluate(base, base.with_knobs(**{"trainer.precision": "bf16-mixed"}))
    assert not v.admitted and v.reasons[0].code == ReasonCode.NUMERICS_NOT_OPTED_IN
    assert "precision" in v.reasons[0].message
    data = imported(POOR)
    data["launch"]["numerics_opt_in"] = ["precision"]
    owned = parse_recipe(data)
    v = evaluate(owned, owned.with_knobs(**{"trainer.precision": "bf16-mixed"}))
    assert v.admitted and v.owed == ["loss_equivalence"]
    assert list(lightning().render(owned.with_knobs(**{"trainer.precision": "bf16-mixed"})).argv) == \
        [*POOR, "--trainer.precision", "bf16-mixed"]


@pytest.mark.parametrize("assignment,field", [
    ("model.learning_rate=2e-3", "launch.args.model.learning_rate"),
    ("trainer.max_steps=5", "launch.args.trainer.max_steps"),
    ("seed_everything=3", "launch.args.seed_everything"),
    ("trainer.accumulate_grad_batches=8", "lightning.global_batch_size"),
    ("trainer.log_every_n_steps=1", "launch.args.trainer.log_every_n_steps"),
])
def test_set_in_lightnings_names_is_refused(assignment, field):
    base = recipe(POOR)
    v = evaluate(base, apply_sets(base.model_dump(mode="python"), [assignment]))
    assert not v.admitted and field in {r.field for r in v.reasons}, v.reasons


def test_editing_the_launchs_own_layout_changes_the_global_batch():
    base = recipe(POOR)
    v = evaluate(base, with_argv(base, swap(POOR, "--trainer.accumulate_grad_batches", "8")))
    reason = next(r for r in v.reasons if r.field == "lightning.global_batch_size")
    assert "32" in reason.message and "8" in reason.message and not v.admitted


def test_frozen_settings_script_and_subcommand():
    base = recipe(POOR)
    v = evaluate(base, with_argv(base, [*POOR, "--trainer.log_every_n_steps", "1"]))
    assert "frozen" in next(r for r in v.reasons if r.field == "launch.args.trainer.log_every_n_steps").message
    v = evaluate(base, with_argv(base, [*POOR, "--trainer.benchmark", "true"]))
    assert "launch.options" in {r.field for r in v.reasons}
    v = evaluate(base, with_argv(base, ["python", "other.py", *POOR[2:]]))
    assert "launch.script" in {r.field for r in v.reasons}


def test_knob_moves_are_admitted_with_their_semantics():
    base = recipe(POOR)
    v = evaluate(base, base.with_knobs(**{"data.batch_size": 8}))
    assert v.admitted and v.semantics is Semantics.NUMERICS_DRIFT and v.owed == ["loss_equivalence"]
    assert effective_contract(base.with_knobs(**{"data.batch_size": 8}))["lightning.global_batch_size"] == 32
    v = evaluate(base, base.with_knobs(**{"data.num_workers": 2}))
    assert v.admitted and v.changed_groups == ["data.num_workers"]
    data = base.model_dump(mode="python")
    data["knobs"]["data.batch_size"] = 64  # more than the global batch of 32
    v = evaluate(base, data)
    assert not v.admitted and "global batch (32" in v.reasons[0].message


def test_contract_lists_every_native_setting():
    c = lightning().contract(recipe(POOR))
    kinds = {k: f.kind for k, f in c.items()}
    assert kinds["launch.args.model.learning_rate"] == "contract" and c["launch.args.model.learning_rate"].value == 1e-3
    assert c["launch.args.seed_everything"].value == 0 and c["launch.args.trainer.precision"].value == "32-true"
    assert c["launch.args.trainer.max_steps"].value == 10000 and kinds["lightning.global_batch_size"] == "derived"
    assert kinds["launch.args.trainer.log_every_n_steps"] == "frozen"
    assert not any(k.endswith(("data.batch_size", "accumulate_grad_batches", "trainer.devices", "num_workers"))
                   for k in c)


def test_tokens_per_step_and_equivalent_layout():
    assert recipe(POOR).tokens_per_step is None
    r = recipe(POOR, tokens_per_sample=128)
    assert r.tokens_per_step == 32 * 128
    assert equivalent_layout(r) == {"data.batch_size": 2}
