"""The gate protects a LLaMA-Factory launch in LLaMA-Factory's own names: packing, cutoff_len, learning_rate and the
rest of the contract, the global batch, and every other key of the config frozen."""

from __future__ import annotations

import pytest

from attune.gate import effective_contract, evaluate
from attune.gate.verdict import ReasonCode
from attune.recipe.catalogue import Semantics
from tests.frameworks.llamafactory.helpers import CLI, example_text, lf, recipe, set_line, with_argv, with_file


def refused(v, field):
    assert not v.admitted, v
    reason = next(r for r in v.reasons if r.field == field)
    return reason


@pytest.mark.parametrize("key,value,field", [
    ("packing", "true", "llamafactory.packing"),
    ("neat_packing", "true", "llamafactory.packing"),  # neat_packing turns packing on
    ("cutoff_len", "4096", "llamafactory.cutoff_len"),
    ("learning_rate", "2.0e-4", "llamafactory.learning_rate"),
    ("stage", "pt", "llamafactory.packing"),  # pre-training packs by default
    ("template", "qwen", "llamafactory.template"),
    ("lora_rank", "16", "llamafactory.lora_rank"),
    ("seed", "7", "llamafactory.seed"),
])
def test_contract_changes_in_the_config_are_refused(tmp_path, key, value, field):
    base = recipe(tmp_path)
    reason = refused(evaluate(base, with_file(base, set_line(example_text(), key, value))), field)
    assert reason.code == ReasonCode.CONTRACT and "training contract" in reason.message


@pytest.mark.parametrize("override,field", [("packing=true", "llamafactory.packing"),
                                            ("cutoff_len=1024", "llamafactory.cutoff_len"),
                                            ("learning_rate=1e-3", "llamafactory.learning_rate")])
def test_contract_changes_on_the_command_line_are_refused(tmp_path, override, field):
    base = recipe(tmp_path)
    v = evaluate(base, with_argv(base, [*CLI, override]))
    assert refused(v, field).code == ReasonCode.CONTRACT and v.semantics is Semantics.CONTRACT


def test_a_contract_key_written_with_its_value_or_default_is_no_change(tmp_path):
    base = recipe(tmp_path)
    text = set_line(set_line(example_text(), "cutoff_len", "2048"), "weight_decay", "0.0")
    v = evaluate(base, with_file(base, set_line(text, "learning_rate", "1e-4")))  # 1e-4 == 1.0e-4 for OmegaConf
    assert v.admitted, v.reasons


def test_editing_the_accumulation_changes_the_global_batch(tmp_path):
    base = recipe(tmp_path)
    reason = refused(evaluate(base, with_file(base, set_line(example_text(), "gradient_accumulation_steps", "4"))),
                     "llamafactory.global_batch_size")
    assert "8" in reason.message and "4" in reason.message
    assert "per_device_train_batch_size" in reason.message  # the hint: change the knob instead


def test_other_keys_are_frozen(tmp_path):
    base = recipe(tmp_path)
    reason = refused(evaluate(base, with_file(base, set_line(example_text(), "preprocessing_num_workers", "4"))),
                     "llamafactory.preprocessing_num_workers")
    assert "frozen" in reason.message
    v = evaluate(base, with_file(base, example_text() + "neftune_noise_alpha: 5\n"))
    assert not v.admitted and "llamafactory.keys" in {r.field for r in v.reasons}
    v = evaluate(base, with_argv(base, ["lmf", *CLI[1:]]))
    assert not v.admitted and "launch.launcher" in {r.field for r in v.reasons}


def test_knob_moves_are_admitted_with_their_semantics(tmp_path):
    base = recipe(tmp_path, devices_per_node=4)
    v = evaluate(base, base.with_knobs(per_device_train_batch_size=4))
    assert v.admitted and v.semantics is Semantics.NUMERICS_DRIFT and v.owed == ["loss_equivalence"]
    v = evaluate(base, base.with_knobs(disable_gradient_checkpointing=True))
    assert v.admitted and v.semantics is Semantics.PRESERVING and v.owed == []
    v = evaluate(base, base.with_knobs(nproc_per_node=2, per_device_train_batch_size=2))
    assert v.admitted and v.changed_groups == ["batch_split"]
    assert effective_contract(base.with_knobs(nproc_per_node=2, per_device_train_batch_size=2))[
        "llamafactory.global_batch_size"] == 8


def knobs_data(r, **knobs):
    """``r`` as a mapping with ``knobs`` set (unvalidated: a candidate a constraint refuses)."""
    data = r.model_dump(mode="python")
    data["knobs"] = {**data["knobs"], **knobs}
    return data


def test_a_split_that_does_not_divide_the_global_batch_is_refused(tmp_path):
    base = recipe(tmp_path, devices_per_node=4)
    v = evaluate(base, knobs_data(base, per_device_train_batch_size=16))
    assert not v.admitted and any("global batch (8 = 1 per_device_train_batch_size" in r.message for r in v.reasons)


def test_flash_attention_and_liger_are_refused_on_cpu(tmp_path):
    base = recipe(tmp_path)
    for knobs in ({"flash_attn": "fa2"}, {"enable_liger_kernel": True}):
        v = evaluate(base, knobs_data(base, **knobs))
        assert not v.admitted and any("GPU" in r.message for r in v.reasons)
    gpu = recipe(tmp_path, accelerator="h100-sxm-80gb", devices_per_node=1)
    assert evaluate(gpu, gpu.with_knobs(flash_attn="fa2")).admitted


def test_the_contract_lists_keys_with_llamafactory_defaults(tmp_path):
    c = lf().contract(recipe(tmp_path))
    assert c["llamafactory.seed"].value == 42 and c["llamafactory.stage"].value == "sft"
    assert c["llamafactory.neat_packing"].value is False and c["llamafactory.max_steps"].value == -1
    assert c["llamafactory.global_batch_size"].kind == "derived"
    assert not any(k.endswith(("per_device_train_batch_size", "gradient_accumulation_steps",
                               "disable_gradient_checkpointing", "dataloader_num_workers")) for k in c)
