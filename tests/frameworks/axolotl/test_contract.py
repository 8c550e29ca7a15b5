"""The gate protects an axolotl launch in axolotl's own names: sample_packing, sequence_len, learning_rate, the
global batch (micro_batch_size × gradient_accumulation_steps × processes) and every other key frozen."""

from __future__ import annotations

import pytest

from attune.gate import effective_contract, evaluate
from attune.gate.verdict import ReasonCode
from attune.recipe.catalogue import Semantics
from tests.frameworks.axolotl.helpers import CLI, ax, example_text, recipe, set_line, with_argv, with_file


def refused(v, field):
    assert not v.admitted, v
    return next(r for r in v.reasons if r.field == field)


@pytest.mark.parametrize("key,value,field", [
    ("sample_packing", "false", "axolotl.sample_packing"),
    ("sequence_len", "4096", "axolotl.sequence_len"),
    ("learning_rate", "0.0001", "axolotl.learning_rate"),
    ("lora_r", "8", "axolotl.lora_r"),
    ("num_epochs", "2", "axolotl.num_epochs"),
    ("optimizer", "adamw_torch", "axolotl.optimizer"),
    ("train_on_inputs", "true", "axolotl.train_on_inputs"),
    ("seed", "3", "axolotl.seed"),
])
def test_contract_changes_in_the_config_are_refused(tmp_path, key, value, field):
    base = recipe(tmp_path)
    reason = refused(evaluate(base, with_file(base, set_line(example_text(), key, value))), field)
    assert reason.code == ReasonCode.CONTRACT and "training contract" in reason.message


@pytest.mark.parametrize("option,field", [("--no-sample-packing", "axolotl.sample_packing"),
                                          ("--sequence-len=1024", "axolotl.sequence_len"),
                                          ("--learning-rate=3e-4", "axolotl.learning_rate")])
def test_contract_changes_on_the_command_line_are_refused(tmp_path, option, field):
    base = recipe(tmp_path)
    v = evaluate(base, with_argv(base, [*CLI, option]))
    assert refused(v, field).code == ReasonCode.CONTRACT and v.semantics is Semantics.CONTRACT


@pytest.mark.parametrize("key,value", [("micro_batch_size", "4"), ("gradient_accumulation_steps", "4")])
def test_editing_the_batch_split_in_the_config_changes_the_global_batch(tmp_path, key, value):
    base = recipe(tmp_path, devices_per_node=4)
    reason = refused(evaluate(base, with_file(base, set_line(example_text(), key, value))),
                     "axolotl.global_batch_size")
    assert "4" in reason.message and "8" in reason.message and "micro_batch_size" in reason.message


def test_more_processes_with_the_same_split_change_the_global_batch(tmp_path):
    base = recipe(tmp_path, devices_per_node=4)
    v = evaluate(base, with_argv(base, [*CLI, "--", "--num_processes", "2"]))
    assert "axolotl.global_batch_size" in {r.field for r in v.reasons} and not v.admitted


def test_knob_moves_that_keep_the_global_batch_are_admitted(tmp_path):
    base = recipe(tmp_path, devices_per_node=4)
    moved = base.with_knobs(micro_batch_size=1, nproc_per_node=2)
    v = evaluate(base, moved)
    assert v.admitted and v.changed_groups == ["batch_split"] and v.owed == ["loss_equivalence"]
    assert effective_contract(moved)["axolotl.global_batch_size"] == effective_contract(base)[
        "axolotl.global_batch_size"] == 4
    v = evaluate(base, base.with_knobs(gradient_checkpointing=False))
    assert v.admitted and v.semantics is Semantics.PRESERVING


def test_other_keys_are_frozen_and_defaults_are_axolotls(tmp_path):
    base = recipe(tmp_path)
    reason = refused(evaluate(base, with_file(base, set_line(example_text(), "flash_attention", "false"))),
                     "axolotl.flash_attention")
    assert "frozen" in reason.message
    c = ax().contract(base)
    assert c["axolotl.lr_scheduler"].value == "cosine" and c["axolotl.bf16"].value == "auto"
    assert c["axolotl.tf32"].value is False and c["axolotl.seed"].value is None
    # the defaults: a key written with axolotl's default is no change
    text = set_line(example_text(), "shuffle_merged_datasets", "true")
    assert evaluate(base, with_file(base, text)).admitted
    # an unset sample_packing is off: dropping `sample_packing: true` is a change, writing false when unset is not
    unset = example_text().replace("sample_packing: true\n", "")
    assert not evaluate(base, with_file(base, unset)).admitted
    off = recipe(tmp_path / "off", text=unset)
    assert effective_contract(off)["axolotl.sample_packing"] is False
    assert evaluate(off, with_file(off, unset + "sample_packing: false\n")).admitted
