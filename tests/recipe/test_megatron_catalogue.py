"""Tests of the Megatron knob catalogue: semantics classes, constraint messages, derived quantities."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from attune.frameworks.megatron import catalogue as mc
from attune.recipe.catalogue import Semantics, get_catalogue
from tests.recipe.helpers import LLAMA8B, make


def test_catalogue_registered_with_env_knobs():
    cat = get_catalogue("megatron")
    for name in ("tensor_model_parallel_size", "virtual_pipeline_model_parallel_size", "bucket_size",
                 "env.CUDA_DEVICE_MAX_CONNECTIONS", "env.NCCL_NVLS_ENABLE", "env.NCCL_P2P_NET_CHUNKSIZE",
                 "env.NVTE_FWD_LAYERNORM_SM_MARGIN", "moe_token_dispatcher_type", "enable_cuda_graph"):
        assert name in cat
    for k in cat.knobs.values():
        assert k.default in k.values, k.name


def test_semantics_classes():
    cat = get_catalogue("megatron")
    assert cat["fp8"].semantics_of("hybrid") is Semantics.NUMERICS_CHANGING
    assert cat["fp8"].numerics_class == "fp8"
    assert cat["grad_reduce_in_bf16"].semantics_of(True) is Semantics.NUMERICS_CHANGING
    assert cat["grad_reduce_in_bf16"].numerics_class == "bf16_grad_reduce"
    assert cat["tensor_model_parallel_size"].semantics is Semantics.NUMERICS_DRIFT
    assert cat["recompute_granularity"].semantics is Semantics.PRESERVING
    assert cat["manual_gc"].semantics is Semantics.PRESERVING
    # contract fields are not knobs
    for name in ("global_batch_size", "seq_length", "seed", "precision"):
        assert name not in cat
    assert cat["recompute_method"].coupling_group == cat["recompute_granularity"].coupling_group


@pytest.mark.parametrize("knobs, kwargs, fragment", [
    ({"tensor_model_parallel_size": 8}, {"model": {**LLAMA8B, "hidden_size": 6144, "heads": 48, "kv_groups": 12}},
     "kv_groups"),
    ({"pipeline_model_parallel_size": 4}, {"model": {**LLAMA8B, "layers": 30}}, "model.layers"),
    ({"tensor_model_parallel_size": 4, "pipeline_model_parallel_size": 4}, {}, "world size"),
    ({"micro_batch_size": 16}, {"gbs": 64}, "global_batch_size"),
    ({"context_parallel_size": 4}, {"seq": 8196}, "seq_length"),
    ({"virtual_pipeline_model_parallel_size": 2}, {}, "pipeline_model_parallel_size > 1"),
    ({"pipeline_model_parallel_size": 2, "virtual_pipeline_model_parallel_size": 3}, {}, "divisible by"),
    ({"tp_comm_overlap": True, "tensor_model_parallel_size": 2}, {}, "sequence_parallel"),
    ({"tp_comm_overlap": True, "tensor_model_parallel_size": 2, "sequence_parallel": True}, {},
     "CUDA_DEVICE_MAX_CONNECTIONS"),
    ({"overlap_param_gather": True, "overlap_grad_reduce": True}, {}, "use_distributed_optimizer"),
    ({"recompute_method": "uniform"}, {}, "recompute_granularity"),
    ({"recompute_granularity": "full"}, {}, "recompute_method"),
    ({"enable_cuda_graph": True, "recompute_granularity": "full", "recompute_method": "uniform",
      "recompute_num_layers": 1}, {}, "enable_cuda_graph"),
    ({"expert_model_parallel_size": 2}, {}, "MoE"),
    ({"fp8": "hybrid"}, {"accelerator": "a100-80gb"}, "Hopper"),
])
def test_constraint_messages_name_fields_and_fix(knobs, kwargs, fragment):
    with pytest.raises(ValidationError) as err:
        make(knobs, **kwargs)
    assert fragment in str(err.value)


def test_heads_message_lists_legal_tp():
    model = {**LLAMA8B, "heads": 24, "kv_groups": 24, "hidden_size": 3072}
    with pytest.raises(ValidationError) as err:
        make({"tensor_model_parallel_size": 16}, nodes=2, model=model)
    assert "model.heads (24)" in str(err.value) and "legal TP" in str(err.value)


def test_moe_constraints():
    moe = {**LLAMA8B, "family": "mixtral", "moe_experts": 8, "moe_top_k": 2, "vocab_size": 32000}
    make({"expert_model_parallel_size": 8}, model=moe)
    with pytest.raises(ValidationError, match="moe_experts"):
        make({"expert_model_parallel_size": 16}, nodes=2, model=moe)
    with pytest.raises(ValidationError, match="requires sequence_parallel"):
        make({"expert_model_parallel_size": 2, "tensor_model_parallel_size": 2}, model=moe)


def test_derived_helpers():
    r = make({"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 2, "micro_batch_size": 2,
              "sequence_parallel": True}, nodes=2)
    assert mc.world_size(r) == 16
    assert mc.data_parallel_size(r) == 4
    assert mc.num_microbatches(r) == 16
    assert mc.padded_vocab_size(r) == 128256      # multiple of 256
    assert mc.padded_vocab_size(make({"tensor_model_parallel_size": 4})) == 128512
    assert mc.padded_vocab_size(make({"tensor_model_parallel_size": 8})) == 129024
    assert mc.expert_tensor_parallel_size(r) == 2


def test_uneven_pipeline_split_with_accounting():
    model = {**LLAMA8B, "layers": 30}
    with pytest.raises(ValidationError):
        make({"pipeline_model_parallel_size": 8}, model=model)
    make({"pipeline_model_parallel_size": 8, "account_for_embedding_in_pipeline_split": True,
          "account_for_loss_in_pipeline_split": True}, model=model)
