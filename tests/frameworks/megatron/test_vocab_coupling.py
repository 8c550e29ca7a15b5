"""``make_vocab_size_divisible_by`` is a knob of TP's coupling group: a TP move that would change the padded
vocabulary (a model change) is completed with the divisor that keeps it, as one coupled change the gate verifies —
in the catalogue, the playbook's coupled completion, the simulator and the rendered launch."""

from __future__ import annotations

from typing import Any

from attune.frameworks.megatron import catalogue as mc
from attune.gate import evaluate
from attune.policies.playbook import PlaybookPolicy
from attune.recipe.catalogue import get_catalogue
from attune.recipe.io import parse_recipe
from attune.recipe.model import Recipe
from attune.sim import simulate
from tests.agent.helpers import context
from tests.frameworks.megatron.helpers import changed_tokens, megatron, mlm

QWEN72B = {"family": "qwen2", "layers": 80, "hidden_size": 8192, "heads": 64, "kv_groups": 8,
           "ffn_hidden_size": 29568, "vocab_size": 152064}


def qwen(knobs: dict[str, Any] | None = None) -> Recipe:
    return parse_recipe({
        "name": "qwen2.5-72b-h100x32", "framework": "megatron", "model": QWEN72B,
        "training": {"global_batch_size": 256, "seq_length": 4096, "steps": 1000, "optimizer": {"lr": 3e-4},
                     "precision": "bf16"},
        "resources": {"accelerator": "h100-sxm-80gb", "nodes": 4, "devices_per_node": 8},
        "knobs": {"tensor_model_parallel_size": 8, "sequence_parallel": True, "pipeline_model_parallel_size": 4,
                  "use_distributed_optimizer": True, **(knobs or {})},
    })


def test_the_divisor_is_a_knob_of_the_tensor_parallel_group():
    cat = get_catalogue("megatron")
    k = cat[mc.VOCAB_DIVISOR]
    assert k.default == 128 and 256 in k.values and k.coupling_group == cat["tensor_model_parallel_size"].coupling_group


def test_padded_vocabulary_follows_the_knob():
    r = qwen()
    assert mc.padded_vocab_size(r) == 152576  # 152064 → multiple of 128 × 8
    assert mc.padded_vocab_size(r.with_knobs(tensor_model_parallel_size=4)) == 152064  # multiple of 512: a change
    assert mc.padded_vocab_size(r.with_knobs(tensor_model_parallel_size=4, make_vocab_size_divisible_by=256)) == 152576
    assert mc.divisors_keeping(152064, 152576, 4) == [256]


def test_gate_refuses_tp_alone_and_admits_it_with_the_divisor():
    r = qwen()
    alone = evaluate(r, r.with_knobs(tensor_model_parallel_size=4))
    assert not alone.admitted and alone.reasons[0].field == "model.padded_vocab_size"
    assert "make_vocab_size_divisible_by 256" in alone.reasons[0].message  # the fix names the completion
    both = evaluate(r, r.with_knobs(tensor_model_parallel_size=4, make_vocab_size_divisible_by=256))
    assert both.admitted and both.changed_groups == ["tensor_parallel"] and both.owed == ["loss_equivalence"]
    # the divisor alone may move only where the padded size stays
    assert not evaluate(r, r.with_knobs(make_vocab_size_divisible_by=256)).admitted  # 152064 → 154624 at TP=8
    assert evaluate(r, r.with_knobs(make_vocab_size_divisible_by=64)).admitted is False  # 152064 at TP=8


def test_playbook_completes_the_tp_move_with_the_divisor():
    r = qwen()
    ctx = context(r)
    change = PlaybookPolicy()._admissible_change(ctx, "tensor_model_parallel_size", 4)
    assert change == {"tensor_model_parallel_size": 4, "make_vocab_size_divisible_by": 256}
    assert evaluate(r, r.with_knobs(**change)).admitted


def test_simulator_times_the_padded_vocabulary_of_the_knob():
    r = qwen({"tensor_model_parallel_size": 4})
    wide = r.with_knobs(make_vocab_size_divisible_by=1024)  # pads 152064 to 155648 at TP=4
    assert mc.padded_vocab_size(wide) == 155648
    assert simulate(wide).model_flops_per_token > simulate(r).model_flops_per_token


def test_rendered_launch_carries_the_divisor_flag():
    r = mlm()  # Llama-3 8B, TP=1, vocab 128256 (a multiple of 256, not of 512)
    launch = megatron().render(r.with_knobs(tensor_model_parallel_size=4, make_vocab_size_divisible_by=64,
                                            sequence_parallel=True))
    removed, added = changed_tokens(list(r.launch.argv), list(launch.argv))
    assert removed == ["1"] and added == ["4", "--make-vocab-size-divisible-by", "64"]
    assert evaluate(r, r.with_knobs(tensor_model_parallel_size=4)).admitted is False
    assert evaluate(r, r.with_knobs(tensor_model_parallel_size=4, make_vocab_size_divisible_by=64)).admitted
