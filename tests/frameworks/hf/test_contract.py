"""The gate protects an HF launch: contract settings, the global batch and every other native setting."""

from __future__ import annotations

import pytest

from attune.gate import effective_contract, equivalent_layout, evaluate
from attune.gate.verdict import ReasonCode
from attune.recipe.catalogue import Semantics
from tests.frameworks.hf.helpers import POOR, hf, recipe, with_argv


def swap(argv: list[str], flag: str, value: str) -> list[str]:
    out = list(argv)
    out[out.index(flag) + 1] = value
    return out


@pytest.mark.parametrize("flag,value,field", [
    ("--learning_rate", "1e-3", "launch.args.learning_rate"),
    ("--seed", "1", "launch.args.seed"),
    ("--max_steps", "20000", "launch.args.max_steps"),
])
def test_contract_changes_are_refused(flag, value, field):
    base = recipe(POOR)
    v = evaluate(base, with_argv(base, swap(POOR, flag, value)))
    assert not v.admitted
    reason = next(r for r in v.reasons if r.field == field)
    assert reason.code == ReasonCode.CONTRACT and "training contract" in reason.message
    assert "restore it" in reason.message and v.semantics is Semantics.CONTRACT


def test_contract_flags_added_with_their_default_are_no_change():
    base = recipe(POOR)
    v = evaluate(base, with_argv(base, [*POOR, "--weight_decay", "0.0", "--lr_scheduler_type", "linear",
                                        "--adam_beta2=0.999", "--bf16", "False", "--learning_rate", "0.0005"]))
    assert v.admitted, v.reasons


@pytest.mark.parametrize("flag,default", [("--lr_scheduler_type", "cosine"), ("--warmup_steps", "10"),
                                          ("--bf16", "True"), ("--weight_decay", "0.1"), ("--max_grad_norm", "0.5"),
                                          ("--data_seed", "3"), ("--num_train_epochs", "1")])
def test_adding_a_contract_flag_that_differs_from_the_default_is_refused(flag, default):
    base = recipe(POOR)
    v = evaluate(base, with_argv(base, [*POOR, flag, default]))
    assert not v.admitted and f"launch.args.{flag[2:]}" in {r.field for r in v.reasons}


def test_frozen_flags_cannot_change_appear_or_vanish():
    base = recipe([*POOR, "--label_smoothing_factor", "0.1", "--output_dir", "out"])
    argv = list(base.launch.argv)
    v = evaluate(base, with_argv(base, swap(argv, "--label_smoothing_factor", "0.2")))
    reason = next(r for r in v.reasons if r.field == "launch.args.label_smoothing_factor")
    assert "frozen" in reason.message and not v.admitted
    v = evaluate(base, with_argv(base, [*argv, "--neftune_noise_alpha", "5"]))
    assert not v.admitted and "launch.options" in {r.field for r in v.reasons}
    v = evaluate(base, with_argv(base, argv[:-2]))  # --output_dir removed
    assert not v.admitted and "launch.options" in {r.field for r in v.reasons}


def test_script_launcher_and_environment_are_frozen():
    base = recipe(POOR)
    v = evaluate(base, with_argv(base, ["python", "other.py", *POOR[2:]]))
    assert "launch.script" in {r.field for r in v.reasons}
    v = evaluate(base, with_argv(base, ["python3", *POOR[1:]]))
    assert "launch.launcher" in {r.field for r in v.reasons}
    data = base.model_dump(mode="python")
    data["launch"]["env"] = {"ACCELERATE_MIXED_PRECISION": "bf16"}
    assert "launch.env" in {r.field for r in evaluate(base, data).reasons}


def test_editing_the_launchs_own_accumulation_changes_the_global_batch():
    base = recipe(POOR)
    v = evaluate(base, with_argv(base, swap(POOR, "--gradient_accumulation_steps", "8")))
    reason = next(r for r in v.reasons if r.field == "hf.global_batch_size")
    assert "16" in reason.message and "8" in reason.message and not v.admitted


def test_knob_moves_are_admitted_with_their_semantics():
    base = recipe(POOR)
    v = evaluate(base, base.with_knobs(per_device_train_batch_size=4))
    assert v.admitted and v.semantics is Semantics.NUMERICS_DRIFT and v.owed == ["loss_equivalence"]
    v = evaluate(base, base.with_knobs(gradient_checkpointing=False))
    assert v.admitted and v.semantics is Semantics.PRESERVING and v.owed == []
    v = evaluate(base, base.with_knobs(nproc_per_node=2, per_device_train_batch_size=2))
    assert v.admitted and v.changed_groups == ["batch_split"]
    assert effective_contract(base)["hf.global_batch_size"] == 16
    assert effective_contract(base.with_knobs(nproc_per_node=2, per_device_train_batch_size=2))[
        "hf.global_batch_size"] == 16


def test_contract_lists_every_native_setting():
    base = recipe([*POOR, "--output_dir", "out", "--report_to", "none"])
    c = hf().contract(base)
    kinds = {k: f.kind for k, f in c.items()}
    assert kinds["launch.args.learning_rate"] == "contract" and c["launch.args.learning_rate"].value == 5e-4
    assert c["launch.args.warmup_steps"].value == 0 and c["launch.args.seed"].value == 0
    assert kinds["hf.global_batch_size"] == "derived"
    assert c["launch.options"].value == ["output_dir", "report_to", "use_cpu"]
    assert {"launch.args.output_dir", "launch.args.use_cpu", "launch.script", "launch.launcher"} <= set(c)
    assert not any(k.endswith(("per_device_train_batch_size", "gradient_accumulation_steps",
                               "gradient_checkpointing", "dataloader_num_workers")) for k in c)


def test_tokens_per_step_and_equivalent_layout():
    assert recipe(POOR).tokens_per_step is None
    r = recipe(POOR, tokens_per_sample=128)
    assert r.tokens_per_step == 16 * 128
    assert equivalent_layout(r) == {"per_device_train_batch_size": 2}
