"""Megatron-Core's layout arithmetic: the quantities a recipe's parallel settings imply (world and data-parallel
sizes, micro-batches per step, pipeline split, padded vocabulary), as Megatron derives them. The performance model
(:mod:`attune.sim.megatron`) and the Megatron framework's catalogue, gate rules and constraints all read these."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from attune.recipe.model import Recipe

#: Megatron's ``--make-vocab-size-divisible-by``: the vocabulary is padded to a multiple of it times TP
VOCAB_DIVISOR = "make_vocab_size_divisible_by"


def world_size(r: Recipe) -> int:
    """Number of GPUs: ``resources.nodes * resources.devices_per_node``."""
    return r.resources.nodes * r.resources.devices_per_node


def model_parallel_size(r: Recipe) -> int:
    """GPUs holding one dense model replica: TP * PP * CP."""
    return (int(r.knob("tensor_model_parallel_size")) * int(r.knob("pipeline_model_parallel_size"))
            * int(r.knob("context_parallel_size")))


def data_parallel_size(r: Recipe) -> int:
    """Dense data-parallel degree ``world // (TP*PP*CP)`` (0 if the world is smaller than one replica)."""
    return world_size(r) // model_parallel_size(r)


def expert_tensor_parallel_size(r: Recipe) -> int:
    """Effective ETP: the knob, or TP when it is unset (MCore default)."""
    etp = r.knob("expert_tensor_parallel_size")
    return int(r.knob("tensor_model_parallel_size")) if etp is None else int(etp)


def expert_data_parallel_size(r: Recipe) -> int:
    """Data-parallel degree of expert parameters, ``world // (ETP*EP*PP)`` (MCore parallel folding)."""
    return world_size(r) // (expert_tensor_parallel_size(r) * int(r.knob("expert_model_parallel_size"))
                             * int(r.knob("pipeline_model_parallel_size")))


def num_microbatches(r: Recipe) -> int:
    """Micro-batches per step per DP rank: ``GBS // (MBS * DP)``."""
    dp = max(1, data_parallel_size(r))
    assert r.training is not None  # a megatron recipe has a training section (Recipe validation)
    return r.training.global_batch_size // (int(r.knob("micro_batch_size")) * dp)


def virtual_stages(r: Recipe) -> int:
    """Model chunks per pipeline rank (1 without interleaving)."""
    v = r.knob("virtual_pipeline_model_parallel_size")
    return 1 if v is None else int(v)


def pipeline_split_layers(r: Recipe) -> int:
    """Layers counted when splitting over pipeline stages (layers, +1 embedding, +1 loss if accounted)."""
    assert r.model is not None  # a megatron recipe has a model section (Recipe validation)
    return (r.model.layers + int(bool(r.knob("account_for_embedding_in_pipeline_split")))
            + int(bool(r.knob("account_for_loss_in_pipeline_split"))))


def padded_vocab_size(r: Recipe, *, divisible_by: int | None = None, tp: int | None = None) -> int:
    """Vocabulary padded to a multiple of ``make_vocab_size_divisible_by * TP`` (Megatron
    ``vocab_utils._vocab_size_with_padding``); the divisor and TP are the recipe's knobs unless given."""
    d = int(r.knob(VOCAB_DIVISOR)) if divisible_by is None else divisible_by
    t = int(r.knob("tensor_model_parallel_size")) if tp is None else tp
    assert r.model is not None  # a megatron recipe has a model section (Recipe validation)
    return pad_vocab(r.model.vocab_size, d, t)


def pad_vocab(vocab: int, divisible_by: int, tp: int) -> int:
    """``vocab`` rounded up to a multiple of ``divisible_by * tp``."""
    multiple = divisible_by * tp
    return ((vocab + multiple - 1) // multiple) * multiple


def sequence_parallel_active(r: Recipe) -> bool:
    """Whether sequence parallelism is in effect (Megatron turns it off at TP=1)."""
    return bool(r.knob("sequence_parallel")) and int(r.knob("tensor_model_parallel_size")) > 1
