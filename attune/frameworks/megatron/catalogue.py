"""Knob catalogue of Megatron-Core training (``framework: megatron``), as Megatron-LM, Megatron-Bridge and NeMo 2
drive it.

Knob names follow Megatron-Core / Megatron-Bridge config fields (``cfg.model.*``, ``cfg.ddp.*``); environment
variables are ``env.NAME``. Constraints reproduce the asserts of Megatron-LM ``validate_args``, MCore
``TransformerConfig.__post_init__``, ``parallel_state`` and ``num_microbatches_calculator``. Training-contract
settings (GBS, sequence length, LR, seed, precision, MoE routing) are not knobs: they live in ``recipe.training``
and the gate locks them.

Semantics: every layout knob that changes the data-parallel degree, the reduction order or kernel
boundaries is ``numerics_drift`` (same math, FP order may differ); FP8 and BF16 gradient reduction are
``numerics_changing`` and need ``training.numerics_opt_in``. Note that TP can change the padded vocabulary
(:func:`padded_vocab_size`); the gate must check that separately, since that is a model change.

``bucket_size`` is in **elements** (parameters), as ``DistributedDataParallelConfig.bucket_size``; ``None`` is
Megatron's default ``max(40_000_000, 1_000_000 * DP)``.

``make_vocab_size_divisible_by`` is a knob of the ``tensor_parallel`` coupling group: Megatron pads the vocabulary
to a multiple of ``make_vocab_size_divisible_by × TP``, so a TP move that would change the padded vocabulary (a
model change the gate refuses) can be completed with the divisor that keeps it (152064 pads to 152576 at TP=8
with 128; at TP=4 keeping 152576 needs 256). The gate verifies the padded size stays equal.

Versions: the knob names are Megatron-Core config fields, unchanged across :data:`VERSIONS` (MCore 0.12 to
0.20, the snapshot ``d98e8a6``); each native spelling (Megatron-LM flag, Bridge ``ConfigContainer`` key, NeMo 2
override) records its own versions in :mod:`attune.frameworks.megatron.formats`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from attune.frameworks.common import batch_split_problem
from attune.recipe.catalogue import Catalogue, Constraint, Knob, Semantics
from attune.sim.megatron_layout import (  # noqa: F401 - re-exported: the gate and the adapter read them here
    VOCAB_DIVISOR,
    data_parallel_size,
    expert_data_parallel_size,
    expert_tensor_parallel_size,
    model_parallel_size,
    num_microbatches,
    pad_vocab,
    padded_vocab_size,
    pipeline_split_layers,
    sequence_parallel_active,
    virtual_stages,
    world_size,
)

if TYPE_CHECKING:
    from attune.recipe.model import Recipe

P = Semantics.PRESERVING
D = Semantics.NUMERICS_DRIFT
N = Semantics.NUMERICS_CHANGING

MAKE_VOCAB_SIZE_DIVISIBLE_BY = 128
"""Megatron's default ``--make-vocab-size-divisible-by`` (``megatron/training/arguments.py``, ``vocab_utils.py``)."""
VERSIONS = ">=0.12,<0.21"
"""Megatron-Core versions the catalogue covers (0.12: ``core_r0.12.0``, the oldest release its examples name;
0.20: the ``d98e8a6`` snapshot its flags and defaults were checked against)."""
_DIVISORS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)

_PAR = (1, 2, 4, 8, 16, 32, 64)
_VPP = (None, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 24)

KNOBS = [
    # --- parallel layout -------------------------------------------------------------------------------
    Knob(name="tensor_model_parallel_size", type="int", values=(1, 2, 4, 8, 16), default=1, semantics=D,
         group="tensor_parallel",
         description="tensor parallel degree (TP): shards every layer's weights and GEMMs over TP GPUs; costs "
                     "2 all-gathers + 2 reduce-scatters per layer forward and backward, so keep it inside NVLink. "
                     "Addresses weight/activation memory. May change the padded vocab size (see padded_vocab_size)."),
    Knob(name=VOCAB_DIVISOR, type="int", values=_DIVISORS, default=MAKE_VOCAB_SIZE_DIVISIBLE_BY, semantics=P,
         group="tensor_parallel",
         description="the vocabulary is padded to a multiple of make_vocab_size_divisible_by × TP (Megatron "
                     "default 128): moved together with tensor_model_parallel_size so the padded vocabulary, part "
                     "of the model, stays the same (the gate checks it does). No speed effect of its own."),
    Knob(name="sequence_parallel", type="bool", values=(False, True), default=False, semantics=D,
         group="tensor_parallel",
         description="shard LayerNorm/dropout activations along the sequence over the TP group (Korthikanti "
                     "2022): activation memory 10+24/t -> 34/t per token; ignored (turned off) at TP=1."),
    Knob(name="tp_comm_overlap", type="bool", values=(False, True), default=False, semantics=D,
         group="tensor_parallel",
         description="Transformer Engine userbuffer overlap of TP all-gather/reduce-scatter with the GEMMs; needs "
                     "sequence_parallel and TP>1, and CUDA_DEVICE_MAX_CONNECTIONS=1 before Blackwell. Hides TP comm."),
    Knob(name="pipeline_model_parallel_size", type="int", values=(1, 2, 4, 8, 16, 32), default=1, semantics=D,
         group="pipeline",
         description="pipeline parallel degree (PP): splits the layers into stages; weights and optimizer "
                     "state /PP, adds the (PP-1)/m pipeline bubble and point-to-point activation transfers."),
    Knob(name="virtual_pipeline_model_parallel_size", type="choice", values=_VPP, default=None, semantics=D,
         group="pipeline",
         description="interleaved 1F1B: model chunks per pipeline rank (None = plain 1F1B). Divides the bubble by "
                     "v at the price of v times more P2P transfers and slightly more activation memory."),
    Knob(name="account_for_embedding_in_pipeline_split", type="bool", values=(False, True), default=False,
         semantics=D, group="pipeline",
         description="count the embedding as one layer when splitting layers over pipeline stages (uneven split "
                     "for e.g. 126 layers on PP=8); balances the first stage."),
    Knob(name="account_for_loss_in_pipeline_split", type="bool", values=(False, True), default=False,
         semantics=D, group="pipeline",
         description="count the LM head + loss as one layer when splitting layers over pipeline stages; "
                     "balances the last stage."),
    Knob(name="context_parallel_size", type="int", values=(1, 2, 4, 8, 16), default=1, semantics=D,
         description="context parallel degree (CP): splits the sequence over CP GPUs with a ring exchange of K/V "
                     "hidden behind attention; activations /CP. Pays off at long sequences (>= 8K)."),
    Knob(name="expert_model_parallel_size", type="int", values=_PAR, default=1, semantics=D,
         group="expert_parallel",
         description="expert parallel degree (EP, MoE only): spreads the routed experts over EP GPUs; two "
                     "all-to-alls (dispatch, combine) per MoE layer forward and backward. Keep EP*ETP in NVLink."),
    Knob(name="expert_tensor_parallel_size", type="choice", values=(None, 1, 2, 4, 8), default=None, semantics=D,
         group="expert_parallel",
         description="tensor parallel degree inside each expert (ETP; None = same as TP). Usually 1."),
    Knob(name="moe_token_dispatcher_type", type="choice", values=("allgather", "alltoall", "flex"),
         default="allgather", semantics=D, group="expert_parallel",
         description="how MoE tokens reach their experts: allgather (simple, good at small EP), alltoall "
                     "(for EP>1), flex (DeepEP/HybridEP kernels, best across nodes)."),
    Knob(name="micro_batch_size", type="int", values=(1, 2, 4, 8, 16), default=1, semantics=D,
         description="sequences per micro-batch with the global batch fixed: bigger GEMMs and fewer launches, "
                     "fewer micro-batches (bigger pipeline bubble share), more activation memory."),
    # --- recompute -------------------------------------------------------------------------------------
    Knob(name="recompute_granularity", type="choice", values=("none", "selective", "full"), default="none",
         semantics=P, group="recompute",
         description="activation recomputation: selective recomputes core attention (little memory gain with "
                     "flash attention), full recomputes whole layers (~+30% compute, activation memory -> layer "
                     "inputs only)."),
    Knob(name="recompute_method", type="choice", values=(None, "uniform", "block"), default=None, semantics=P,
         group="recompute",
         description="full recompute only: uniform checkpoints every recompute_num_layers layers; block "
                     "recomputes the first recompute_num_layers layers of each pipeline stage (chunk)."),
    Knob(name="recompute_num_layers", type="choice", values=(None, 1, 2, 4, 8, 16, 32), default=None, semantics=P,
         group="recompute",
         description="full recompute only: layers per checkpoint (uniform) or layers recomputed per stage (block)."),
    # --- data parallel / optimizer ---------------------------------------------------------------------
    Knob(name="use_distributed_optimizer", type="bool", values=(False, True), default=False, semantics=D,
         group="dp_overlap",
         description="ZeRO-1 distributed optimizer: shards FP32 master weights and Adam states over DP "
                     "(18 -> 6+12/DP bytes/param); gradients reduce-scatter, parameters all-gather."),
    Knob(name="overlap_grad_reduce", type="bool", values=(False, True), default=False, semantics=P,
         group="dp_overlap",
         description="start bucketed gradient reduction during the last micro-batch's backward; hides DP comm."),
    Knob(name="overlap_param_gather", type="bool", values=(False, True), default=False, semantics=P,
         group="dp_overlap",
         description="all-gather updated parameters during the next step's first forward; needs "
                     "use_distributed_optimizer and overlap_grad_reduce."),
    Knob(name="bucket_size", type="choice",
         values=(None, 10_000_000, 20_000_000, 40_000_000, 80_000_000, 160_000_000), default=None, semantics=D,
         group="dp_overlap",
         description="DDP gradient bucket size in parameters (elements), None = max(4e7, 1e6*DP). Smaller buckets "
                     "overlap earlier but pay more per-message latency; larger ones leave a longer exposed tail."),
    Knob(name="grad_reduce_in_bf16", type="bool", values=(False, True), default=False, semantics=N,
         numerics_class="bf16_grad_reduce", changing_values=(True,),
         description="reduce gradients in BF16 instead of FP32 (grad_reduce_in_fp32=False): halves DP bytes and "
                     "the gradient buffer. Changes numerics; needs numerics_opt_in: [bf16_grad_reduce]."),
    # --- precision -------------------------------------------------------------------------------------
    Knob(name="fp8", type="choice", values=(None, "hybrid"), default=None, semantics=N, numerics_class="fp8",
         changing_values=("hybrid",),
         description="FP8 linear layers via Transformer Engine (hybrid: E4M3 forward, E5M2 gradients, with FP8 "
                     "parameter all-gather): 1.2-1.5x on large GEMMs. Hopper or newer; needs numerics_opt_in: [fp8]."),
    # --- host overhead ---------------------------------------------------------------------------------
    Knob(name="enable_cuda_graph", type="bool", values=(False, True), default=False, semantics=D, compiles=(True,),
         description="capture transformer layers as CUDA graphs (TE RNG tracker): removes most per-kernel launch "
                     "cost; dropless MoE captures attention only. Costs a few GB (more with PP); not with full "
                     "recompute."),
    Knob(name="manual_gc", type="bool", values=(False, True), default=False, semantics=P,
         description="disable automatic Python GC and collect every 100 steps on all ranks at once, so GC pauses "
                     "stop stalling the collectives at random steps."),
    # --- environment -----------------------------------------------------------------------------------
    Knob(name="env.CUDA_DEVICE_MAX_CONNECTIONS", type="choice", values=("1", "8", "32"), default="8", semantics=P,
         group="tensor_parallel",
         description="hardware work queues per device (CUDA default 8). 1 keeps TP/CP communication ordered "
                     "ahead of compute on Hopper (required by tp_comm_overlap there); Blackwell prefers 32."),
    Knob(name="env.NCCL_NVLS_ENABLE", type="choice", values=("0", "1"), default="1", semantics=D,
         description="NVLink SHARP in-switch reductions (NCCL default on NVSwitch systems): faster intra-node "
                     "reductions, ~1-2 GB extra memory per GPU. NVIDIA perf scripts set 0 to save memory."),
    Knob(name="env.NCCL_P2P_NET_CHUNKSIZE", type="choice", values=("131072", "262144", "524288", "2097152"),
         default="131072", semantics=P,
         description="chunk size of NCCL point-to-point transfers over the network (bytes): larger chunks raise "
                     "pipeline-parallel send/recv bandwidth across nodes."),
    Knob(name="env.NVTE_FWD_LAYERNORM_SM_MARGIN", type="choice", values=("0", "8", "16", "20", "24"), default="0",
         semantics=P, group="ln_sm_margin",
         description="SMs Transformer Engine's persistent LayerNorm forward kernel leaves free so DP collectives "
                     "can run alongside it (a common cause of failed DP overlap); costs a little LN speed."),
    Knob(name="env.NVTE_BWD_LAYERNORM_SM_MARGIN", type="choice", values=("0", "8", "16", "20", "24"), default="0",
         semantics=P, group="ln_sm_margin",
         description="as NVTE_FWD_LAYERNORM_SM_MARGIN for the LayerNorm backward kernel."),
    Knob(name="env.TORCH_NCCL_AVOID_RECORD_STREAMS", type="choice", values=("0", "1"), default="0", semantics=P,
         description="free NCCL buffers without recordStream: lowers peak memory slightly."),
    Knob(name="env.PYTORCH_CUDA_ALLOC_CONF", type="choice", values=("", "expandable_segments:True"), default="",
         semantics=P,
         description="caching-allocator settings; expandable_segments removes most fragmentation (fixes "
                     "near-OOM at ~zero cost). Not with CUDA graphs."),
]


# --------------------------------------------------------------------------------------------------------
# Derived quantities (the layout arithmetic lives beside the performance model, :mod:`attune.sim.megatron_layout`)
# --------------------------------------------------------------------------------------------------------

def divisors_keeping(vocab: int, padded: int, tp: int) -> list[int]:
    """Values of ``make_vocab_size_divisible_by`` that pad ``vocab`` to exactly ``padded`` at ``tp``."""
    return [d for d in _DIVISORS if pad_vocab(vocab, d, tp) == padded]


# --------------------------------------------------------------------------------------------------------
# Constraints
# --------------------------------------------------------------------------------------------------------

def _divisors(n: int, candidates: tuple[int, ...]) -> list[int]:
    return [c for c in candidates if c and n % c == 0]


def _heads_tp(r: Recipe) -> str | None:
    assert r.model is not None  # a megatron recipe has a model section (Recipe validation)
    tp, heads = int(r.knob("tensor_model_parallel_size")), r.model.heads
    if heads % tp:
        return (f"model.heads ({heads}) must be divisible by tensor_model_parallel_size ({tp}); "
                f"legal TP here: {_divisors(heads, (1, 2, 4, 8, 16))}")
    return None


def _kv_groups_tp(r: Recipe) -> str | None:
    assert r.model is not None  # a megatron recipe has a model section (Recipe validation)
    tp, g = int(r.knob("tensor_model_parallel_size")), r.model.num_kv_groups
    if g % tp and tp % g:
        return (f"model.kv_groups ({g}) and tensor_model_parallel_size ({tp}) must divide one another "
                f"(MCore TransformerConfig); pick TP in {[t for t in (1, 2, 4, 8, 16) if g % t == 0 or t % g == 0]}")
    return None


def _layers_pp(r: Recipe) -> str | None:
    assert r.model is not None  # a megatron recipe has a model section (Recipe validation)
    pp, n = int(r.knob("pipeline_model_parallel_size")), pipeline_split_layers(r)
    if n % pp:
        return (f"model.layers ({r.model.layers}, {n} counted with embedding/loss accounting) must be divisible by "
                f"pipeline_model_parallel_size ({pp}); legal PP: {_divisors(n, (1, 2, 4, 8, 16, 32))}, or toggle "
                "account_for_embedding_in_pipeline_split / account_for_loss_in_pipeline_split")
    return None


def _vpp(r: Recipe) -> str | None:
    v = r.knob("virtual_pipeline_model_parallel_size")
    if v is None:
        return None
    pp = int(r.knob("pipeline_model_parallel_size"))
    if pp <= 1:
        return (f"virtual_pipeline_model_parallel_size ({v}) needs pipeline_model_parallel_size > 1 (is {pp}); "
                "set it to None or raise PP")
    per_stage = pipeline_split_layers(r) // pp
    if per_stage % int(v):
        return (f"layers per pipeline stage ({per_stage}) must be divisible by "
                f"virtual_pipeline_model_parallel_size ({v}); legal: {_divisors(per_stage, _VPP[1:])} or None")
    m = num_microbatches(r)
    if m < pp or m % pp:
        return (f"the interleaved schedule needs the number of micro-batches ({m} = global_batch_size / "
                f"(micro_batch_size * DP)) to be a multiple of pipeline_model_parallel_size ({pp}); lower "
                "micro_batch_size or set virtual_pipeline_model_parallel_size to None")
    return None


def _world(r: Recipe) -> str | None:
    w, mp = world_size(r), model_parallel_size(r)
    if w % mp:
        return (f"world size ({w} = resources.nodes * devices_per_node) must be divisible by "
                f"tensor_model_parallel_size * pipeline_model_parallel_size * context_parallel_size ({mp}); "
                "change TP, PP or CP")
    return None


def _batch(r: Recipe) -> str | None:
    if world_size(r) % model_parallel_size(r):
        return None  # reported by world_divisible
    return batch_split_problem(r, data_parallel_size(r))


def _seq_cp(r: Recipe) -> str | None:
    assert r.training is not None  # a megatron recipe has a training section (Recipe validation)
    cp, s = int(r.knob("context_parallel_size")), r.training.seq_length
    if cp > 1 and s % (2 * cp):
        return (f"training.seq_length ({s}) must be divisible by 2 * context_parallel_size ({2 * cp}) for "
                "load-balanced causal context parallelism; lower context_parallel_size")
    return None


def _experts_ep(r: Recipe) -> str | None:
    ep = int(r.knob("expert_model_parallel_size"))
    if ep == 1:
        return None
    assert r.model is not None  # a megatron recipe has a model section (Recipe validation)
    if not r.model.is_moe:
        return f"expert_model_parallel_size ({ep}) needs an MoE model (model.moe_experts); set it to 1"
    if r.model.moe_experts % ep:  # type: ignore[operator]
        return (f"model.moe_experts ({r.model.moe_experts}) must be divisible by expert_model_parallel_size "
                f"({ep}); legal EP: {_divisors(r.model.moe_experts or 1, _PAR)}")
    return None


def _expert_world(r: Recipe) -> str | None:
    grid = expert_tensor_parallel_size(r) * int(r.knob("expert_model_parallel_size")) * int(
        r.knob("pipeline_model_parallel_size"))
    if world_size(r) % grid:
        return (f"world size ({world_size(r)}) must be divisible by expert_tensor_parallel_size * "
                f"expert_model_parallel_size * pipeline_model_parallel_size ({grid}); lower EP or ETP")
    return None


def _sp_required(r: Recipe) -> str | None:
    tp = int(r.knob("tensor_model_parallel_size"))
    if tp > 1 and not r.knob("sequence_parallel") and int(r.knob("expert_model_parallel_size")) > 1:
        return (f"expert_model_parallel_size > 1 with tensor_model_parallel_size ({tp}) > 1 requires "
                "sequence_parallel: true (MCore); set sequence_parallel: true")
    return None


def _tp_overlap(r: Recipe) -> str | None:
    if not r.knob("tp_comm_overlap"):
        return None
    if int(r.knob("tensor_model_parallel_size")) <= 1 or not r.knob("sequence_parallel"):
        return ("tp_comm_overlap needs sequence_parallel: true and tensor_model_parallel_size > 1; "
                "set sequence_parallel: true (and TP > 1) or tp_comm_overlap: false")
    if r.resources.accelerator in ("a100-80gb", "h100-sxm-80gb", "h200") and r.knob(
            "env.CUDA_DEVICE_MAX_CONNECTIONS") != "1":
        return ("tp_comm_overlap on pre-Blackwell GPUs needs env.CUDA_DEVICE_MAX_CONNECTIONS: '1' "
                f"(is {r.knob('env.CUDA_DEVICE_MAX_CONNECTIONS')!r}); set it to '1'")
    return None


def _param_gather(r: Recipe) -> str | None:
    if r.knob("overlap_param_gather") and not (r.knob("use_distributed_optimizer") and r.knob("overlap_grad_reduce")):
        return ("overlap_param_gather needs use_distributed_optimizer: true and overlap_grad_reduce: true "
                "(Megatron-LM assert); enable both or set overlap_param_gather: false")
    return None


def _recompute(r: Recipe) -> str | None:
    g, meth, n = r.knob("recompute_granularity"), r.knob("recompute_method"), r.knob("recompute_num_layers")
    if g != "full":
        if meth is not None or n is not None:
            return (f"recompute_method ({meth}) and recompute_num_layers ({n}) apply only to "
                    f"recompute_granularity: full (is {g!r}); set both to None")
        return None
    if meth is None or n is None:
        return ("recompute_granularity: full needs recompute_method (uniform or block) and recompute_num_layers; "
                "e.g. recompute_method: uniform, recompute_num_layers: 1")
    per_chunk = pipeline_split_layers(r) // int(r.knob("pipeline_model_parallel_size")) // virtual_stages(r)
    if int(n) > max(1, per_chunk):
        return (f"recompute_num_layers ({n}) exceeds the layers per pipeline chunk ({per_chunk}); lower it")
    return None


def _graphs(r: Recipe) -> str | None:
    if not r.knob("enable_cuda_graph"):
        return None
    if r.knob("recompute_granularity") == "full":
        return ("enable_cuda_graph (layer-scoped graphs) does not work with recompute_granularity: full; "
                "turn one of them off")
    if r.knob("env.PYTORCH_CUDA_ALLOC_CONF"):
        return ("enable_cuda_graph is incompatible with env.PYTORCH_CUDA_ALLOC_CONF expandable_segments; "
                "set env.PYTORCH_CUDA_ALLOC_CONF: ''")
    return None


def _fp8(r: Recipe) -> str | None:
    if r.knob("fp8") is None:
        return None
    if r.resources.accelerator in ("a100-80gb", "cpu"):
        return f"fp8 needs Hopper or newer GPUs (resources.accelerator is {r.resources.accelerator}); set fp8: None"
    assert r.training is not None  # a megatron recipe has a training section (Recipe validation)
    if r.training.precision not in ("bf16", "fp8"):
        return (f"fp8 runs on top of BF16 mixed precision; training.precision is {r.training.precision!r} "
                "(a contract field) — set fp8: None")
    return None


CONSTRAINTS = [
    Constraint("heads_divisible_by_tp", ("tensor_model_parallel_size",), _heads_tp, "heads % TP == 0"),
    Constraint("kv_groups_vs_tp", ("tensor_model_parallel_size",), _kv_groups_tp,
               "kv_groups % TP == 0 or TP % kv_groups == 0"),
    Constraint("layers_divisible_by_pp", ("pipeline_model_parallel_size", "account_for_embedding_in_pipeline_split",
                                          "account_for_loss_in_pipeline_split"), _layers_pp,
               "(layers [+emb] [+loss]) % PP == 0"),
    Constraint("virtual_pipeline_valid", ("virtual_pipeline_model_parallel_size", "pipeline_model_parallel_size",
                                          "micro_batch_size"), _vpp,
               "VPP needs PP>1, (layers/PP) % VPP == 0 and micro-batches % PP == 0"),
    Constraint("world_divisible", ("tensor_model_parallel_size", "pipeline_model_parallel_size",
                                   "context_parallel_size"), _world, "world % (TP*PP*CP) == 0"),
    Constraint("global_batch_divisible", ("micro_batch_size", "tensor_model_parallel_size",
                                          "pipeline_model_parallel_size", "context_parallel_size"), _batch,
               "GBS % (MBS*DP) == 0"),
    Constraint("seq_divisible_by_cp", ("context_parallel_size",), _seq_cp, "seq % (2*CP) == 0"),
    Constraint("experts_divisible_by_ep", ("expert_model_parallel_size",), _experts_ep, "experts % EP == 0"),
    Constraint("expert_world_divisible", ("expert_model_parallel_size", "expert_tensor_parallel_size",
                                          "pipeline_model_parallel_size"), _expert_world,
               "world % (ETP*EP*PP) == 0"),
    Constraint("sequence_parallel_required", ("sequence_parallel", "expert_model_parallel_size"), _sp_required,
               "EP>1 with TP>1 needs SP"),
    Constraint("tp_comm_overlap_requirements", ("tp_comm_overlap", "sequence_parallel",
                                                "env.CUDA_DEVICE_MAX_CONNECTIONS"), _tp_overlap,
               "tp_comm_overlap needs SP, TP>1 and CUDA_DEVICE_MAX_CONNECTIONS=1 on Hopper"),
    Constraint("param_gather_needs_dist_opt", ("overlap_param_gather", "use_distributed_optimizer",
                                               "overlap_grad_reduce"), _param_gather,
               "overlap_param_gather needs the distributed optimizer and overlap_grad_reduce"),
    Constraint("recompute_consistent", ("recompute_granularity", "recompute_method", "recompute_num_layers"),
               _recompute, "method/num_layers only with full recompute"),
    Constraint("cuda_graph_compatible", ("enable_cuda_graph", "recompute_granularity", "env.PYTORCH_CUDA_ALLOC_CONF"),
               _graphs, "CUDA graphs: no full recompute, no expandable segments"),
    Constraint("fp8_supported", ("fp8",), _fp8, "FP8 needs Hopper+ and BF16 base precision"),
]


#: coupling groups one change may move together where one alone is predicted infeasible (the gate's exception to one
#: group per step): fewer pipeline stages with the distributed optimizer or with more expert sharding, less TP with
#: more EP, less recompute with a smaller micro-batch or with more context parallelism (long context), less TP or
#: fewer pipeline stages with a smaller micro-batch (the layouts NeMo's auto-configurator sweeps together)
COUPLED_GROUPS = (("pipeline", "dp_overlap"), ("pipeline", "expert_parallel"), ("tensor_parallel", "expert_parallel"),
                  ("recompute", "micro_batch_size"), ("recompute", "context_parallel_size"),
                  # EP up shards the experts' weights, grads and optimizer state: the memory a bigger micro-batch needs
                  ("expert_parallel", "micro_batch_size"),
                  # TP or PP down holds more of the model per device: a smaller micro-batch frees the activations
                  ("tensor_parallel", "micro_batch_size"), ("pipeline", "micro_batch_size"),
                  # fewer pipeline stages with more TP: the same model-parallel size, the layout the auto-configurator
                  # sweeps (TP×PP) when the stages alone would not fit
                  ("tensor_parallel", "pipeline"))


def memory_model(r: Recipe) -> tuple[float, float] | None:
    """Predicted (peak GB, device capacity GB) of a recipe, from the simulator's memory model."""
    from attune.sim.hardware import get_hardware
    from attune.sim.megatron import simulate

    try:
        res = simulate(r)
        cap = get_hardware(r.resources.accelerator).hbm_capacity_bytes / 1e9
    except (ValueError, KeyError, ZeroDivisionError):
        return None
    if r.resources.device_memory_gb is not None:
        cap = min(cap, r.resources.device_memory_gb)
    return res.peak_memory_gb, cap


def build() -> Catalogue:
    """Build the Megatron knob catalogue."""
    knobs = {k.name: k.model_copy(update={"versions": k.versions or VERSIONS}) for k in KNOBS}
    return Catalogue(framework="megatron", knobs=knobs, constraints=list(CONSTRAINTS), version="mcore-0.20",
                     versions=VERSIONS, coupled_groups=COUPLED_GROUPS, memory_model=memory_model)


