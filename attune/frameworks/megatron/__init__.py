"""Megatron-Core training as NeMo 2 / Megatron-Bridge drive it (``framework: megatron``), on the framework seam.

Its recipes are tuned against the simulator (:mod:`attune.sim`, which models Megatron); importing native
launches (Megatron-LM flags, Bridge YAML, NeMo 2 overrides) arrives with the Megatron-family issue.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from attune import frameworks
from attune.frameworks.base import ContractField, Framework, Rule, Tier
from attune.frameworks.common import GLOBAL_BATCH_HINT, micro_batch_layout, micro_batch_rules
from attune.frameworks.megatron import catalogue as _catalogue

if TYPE_CHECKING:
    from attune.recipe.catalogue import Catalogue
    from attune.recipe.model import Recipe

_MEM = "memory_capacity"

RULES = {
    **micro_batch_rules(),
    ("tensor_model_parallel_size", "up"): Rule(Tier.FIT, 0.0, {_MEM: 0.3}, memory=-1),
    ("tensor_model_parallel_size", "down"): Rule(Tier.SCALE, 0.06, {"communication:tp": 0.2, "host_overhead": 0.1},
                                                 (_MEM,), memory=+1),
    ("pipeline_model_parallel_size", "up"): Rule(Tier.FIT, 0.0, {_MEM: 0.25}, memory=-1),
    ("pipeline_model_parallel_size", "down"): Rule(Tier.SCALE, 0.05, {"pipeline_bubble": 0.2, "communication:pp": 0.1},
                                                   (_MEM,), memory=+1),
    ("virtual_pipeline_model_parallel_size", "up"): Rule(Tier.OVERLAP, 0.02, {"pipeline_bubble": 0.15}),
    ("virtual_pipeline_model_parallel_size", "down"): Rule(Tier.OVERLAP, 0.0, {"communication:pp": 0.05}),
    ("context_parallel_size", "up"): Rule(Tier.FIT, 0.0, {_MEM: 0.25}, memory=-1),
    ("context_parallel_size", "down"): Rule(Tier.SCALE, 0.05, {"communication:cp": 0.15}, (_MEM,), memory=+1),
    ("expert_model_parallel_size", "up"): Rule(Tier.SCALE, 0.04, {_MEM: 0.2}, memory=-1),
    ("expert_model_parallel_size", "down"): Rule(Tier.SCALE, 0.02, {"communication:ep": 0.15}, (_MEM,), memory=+1),
    ("moe_token_dispatcher_type", "up"): Rule(Tier.OVERLAP, 0.03, {"communication:ep": 0.12}),
    ("recompute_granularity", "down"): Rule(Tier.FIT, 0.2, {"compute_bound": 0.25}, (_MEM,), memory=+1),
    ("recompute_granularity", "up"): Rule(Tier.FIT, 0.0, {_MEM: 0.3}, memory=-1),
    ("use_distributed_optimizer", "enable"): Rule(Tier.FIT, 0.01, {_MEM: 0.3, "communication:dp": 0.04}, memory=-1),
    ("overlap_grad_reduce", "enable"): Rule(Tier.OVERLAP, 0.05, {"communication:dp": 0.15}),
    ("overlap_param_gather", "enable"): Rule(Tier.OVERLAP, 0.03, {"communication:dp": 0.1}),
    ("bucket_size", "up"): Rule(Tier.OVERLAP, 0.01, {"communication:dp": 0.03}),
    ("bucket_size", "down"): Rule(Tier.OVERLAP, 0.01, {"communication:dp": 0.03}),
    ("tp_comm_overlap", "enable"): Rule(Tier.OVERLAP, 0.04, {"communication:tp": 0.15}),
    ("sequence_parallel", "enable"): Rule(Tier.FIT, 0.02, {_MEM: 0.15, "communication:tp": 0.03}, memory=-1),
    ("grad_reduce_in_bf16", "enable"): Rule(Tier.OVERLAP, 0.03, {"communication:dp": 0.1}, memory=-1),
    ("fp8", "up"): Rule(Tier.MICRO, 0.25, {"compute_bound": 0.35}),
    ("enable_cuda_graph", "enable"): Rule(Tier.MICRO, 0.03, {"host_overhead": 0.15}, (_MEM,), cost=1.5, memory=+1),
    ("manual_gc", "enable"): Rule(Tier.MICRO, 0.01, {"host_overhead": 0.03}),
    ("env.NCCL_NVLS_ENABLE", "down"): Rule(Tier.FIT, 0.0, {_MEM: 0.05}, memory=-1),
    ("env.PYTORCH_CUDA_ALLOC_CONF", "up"): Rule(Tier.FIT, 0.0, {_MEM: 0.1}, memory=-1),
    ("env.TORCH_NCCL_AVOID_RECORD_STREAMS", "up"): Rule(Tier.FIT, 0.0, {_MEM: 0.03}, memory=-1),
    ("env.NVTE_FWD_LAYERNORM_SM_MARGIN", "up"): Rule(Tier.OVERLAP, 0.005, {"communication:dp": 0.03}),
    ("env.NVTE_BWD_LAYERNORM_SM_MARGIN", "up"): Rule(Tier.OVERLAP, 0.005, {"communication:dp": 0.03}),
    ("env.NCCL_P2P_NET_CHUNKSIZE", "up"): Rule(Tier.OVERLAP, 0.005, {"communication:pp": 0.05}),
}


class MegatronFramework(Framework):
    name = "megatron"
    title = "Megatron-Core (NeMo 2 / Megatron-Bridge knob names)"
    versions = ">=0.14"
    backends = ("sim",)
    rules = RULES
    field_hints = {"training.global_batch_size": GLOBAL_BATCH_HINT.format(knob="micro_batch_size")}

    def catalogue(self) -> Catalogue:
        return _catalogue.build()

    def equivalent_layout(self, recipe: Recipe) -> dict[str, Any] | None:
        return micro_batch_layout(recipe)

    def contract(self, recipe: Recipe) -> dict[str, ContractField]:
        """Megatron pads the vocabulary to a multiple of ``make_vocab_size_divisible_by × TP``: a model change."""
        base = _catalogue.MAKE_VOCAB_SIZE_DIVISIBLE_BY
        padded = _catalogue.padded_vocab_size(recipe)
        vocab = recipe.model.vocab_size
        same_tp = [tp for tp in recipe.catalogue["tensor_model_parallel_size"].values
                   if isinstance(tp, int) and -(-vocab // (base * tp)) * base * tp == padded]
        fix = (f"The padded vocabulary must stay {padded} (model.vocab_size {vocab} padded to a multiple of "
               f"{base} × tensor_model_parallel_size); tensor_model_parallel_size values that keep it: {same_tp}. "
               f"To allow other TP sizes, the owner can make model.vocab_size a multiple of {base} × the largest TP "
               "in the baseline recipe")
        return {"model.padded_vocab_size": ContractField(
            value=padded, kind="derived", depends_on=("knobs.tensor_model_parallel_size", "model.vocab_size"),
            fix=fix)}


FRAMEWORK = frameworks.register(MegatronFramework())
