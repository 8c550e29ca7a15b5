"""Analytical step-time and memory model of Megatron-Core training on a cluster of 8-GPU nodes: the Megatron
framework's performance model, which its ``Framework.simulate`` runs (the simulator's backend asks for it).

The model follows published sources, named with each part:

* FLOPs and GEMM shapes per layer (Narayanan et al. SC'21; MCore ``num_floating_point_operations``), each GEMM
  timed against the dtype peak times a size-dependent efficiency ``eff_max * f/(f + f_half)`` (small GEMMs
  do not fill the GPU: wave quantisation, launch latency; Calculon's size-bucketed efficiencies have the
  same shape), flash attention at its own ceiling, element-wise ops as HBM traffic.
* Communication as ring alpha-beta on a two-level topology (NVLink inside a node, InfiniBand across nodes,
  with ``k`` ranks of a group per node sharing ``k`` rail NICs), with per-knob overlap.
* 1F1B and interleaved pipeline schedules with bubble and stage imbalance (Narayanan et al.).
* DP reduce-scatter / all-gather (distributed optimizer) or all-reduce, with bucketed overlap.
* Host launch overhead (exposed only where the CPU is slower than the GPU), which CUDA graphs remove.
* Memory: bytes/param of MLM ``theoretical_memory_usage.py`` and per-layer activations of Korthikanti et al.
  2022 / MCore (``s*b*h*(18 + 4F/h)/t``) with recompute and pipeline in-flight factors; a hard OOM cliff.

No per-row correction factors exist: every constant below is a physical property of the hardware or the
software stack, documented where it is defined.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from attune.sim import megatron_layout as mc
from attune.sim.hardware import Hardware, get_hardware
from attune.sim.model import NOISE_SIGMA, SimResult

if TYPE_CHECKING:
    from attune.recipe.model import Recipe

GATED_FAMILIES = ("llama", "mixtral", "mistral", "qwen", "deepseek", "gemma")
"""Families whose MLP is gated (SwiGLU: FC1 produces 2F). Others (gpt, nemotron) use a plain 2-matrix MLP."""

# Software-stack constants (documented physical assumptions, identical for every recipe).
HOST_S_PER_KERNEL = 12e-6
"""CPU time per launched op in eager PyTorch + Megatron/TE (dispatch + launch), ~10-20 us."""
GRAPH_LAUNCH_S = 20e-6
"""Replay of one captured CUDA graph."""
STEP_FIXED_HOST_S = 0.015
"""Per-step host work: data loader, loss/grad-norm reductions, logging, optimizer launch."""
GC_PAUSE_S = 0.15
"""A Python gen-2 collection pause; unaligned pauses stall the collectives of every rank."""
GC_RATE_PER_RANK = 0.004
"""Chance per rank and step that automatic GC pauses it (so many ranks make a stall likely every step)."""
MANUAL_GC_INTERVAL = 100
EW_TRAFFIC_EFF = 0.85
"""Fraction of HBM bandwidth element-wise kernels reach."""
OPT_BYTES_PER_PARAM = 18.0
"""Adam step traffic per parameter (read/write FP32 master, m, v; read grad; write BF16 param) (§5.4)."""
BASE_OVERHEAD_GB = 2.5
"""CUDA context, cuBLAS/cuDNN workspaces and NCCL buffers per GPU."""
@dataclass(frozen=True)
class _Layout:
    """Derived sizes of one recipe (see ``knobs-and-sim.md`` §5 notation)."""

    L: int
    h: int
    H: int
    G: int
    d: int
    F: int
    F1: int
    gated: bool
    V: int
    s: int
    b: int
    t: int
    p: int
    v: int
    c: int
    e: int
    et: int
    D: int
    ED: int
    m: int
    world: int
    sp: bool
    moe: bool
    E: int
    topk: int
    Fm: int
    tied: bool


def _layout(r: Recipe) -> _Layout:
    assert r.model is not None and r.training is not None  # a megatron recipe has both (Recipe validation)
    gated = r.model.family.lower().startswith(GATED_FAMILIES)
    F = r.model.ffn_hidden_size
    moe = r.model.is_moe
    Fm = r.model.moe_ffn_hidden_size or F
    return _Layout(
        L=r.model.layers, h=r.model.hidden_size, H=r.model.heads, G=r.model.num_kv_groups,
        d=r.model.hidden_size // r.model.heads, F=F, F1=2 * F if gated else F, gated=gated,
        V=mc.padded_vocab_size(r), s=r.training.seq_length, b=int(r.knob("micro_batch_size")),
        t=int(r.knob("tensor_model_parallel_size")), p=int(r.knob("pipeline_model_parallel_size")),
        v=mc.virtual_stages(r), c=int(r.knob("context_parallel_size")),
        e=int(r.knob("expert_model_parallel_size")), et=mc.expert_tensor_parallel_size(r),
        D=mc.data_parallel_size(r), ED=max(1, mc.expert_data_parallel_size(r)), m=mc.num_microbatches(r),
        world=mc.world_size(r), sp=mc.sequence_parallel_active(r), moe=moe,
        E=r.model.moe_experts or 1, topk=r.model.moe_top_k or 1, Fm=Fm, tied=r.model.tied_embeddings,
    )


# ----------------------------------------------------------------------------------------------------------
# FLOPs and parameters
# ----------------------------------------------------------------------------------------------------------

def model_flops_per_token(r: Recipe) -> float:
    """Model FLOPs per token, fwd+bwd, causal attention (MCore ``num_floating_point_operations``, §5.1)."""
    x = _layout(r)
    attn_lin = x.h * (x.H * x.d + 2 * x.G * x.d) + x.H * x.d * x.h
    core = x.H * x.d * x.s  # causal: QK^T and PV halved
    mlp = x.topk * x.h * x.Fm * (3 if x.gated else 2) + x.h * x.E if x.moe else x.h * x.F * (3 if x.gated else 2)
    return 6.0 * (x.L * (attn_lin + core + mlp) + x.h * x.V)


def _layer_params(x: _Layout) -> tuple[float, float]:
    """(dense, expert) parameters of one transformer layer (unsharded)."""
    attn = x.h * x.d * (2 * x.H + 2 * x.G) + 2 * x.h
    if x.moe:
        return attn + x.h * x.E, x.E * x.h * x.Fm * (3 if x.gated else 2)
    return attn + x.h * x.F * (3 if x.gated else 2), 0.0


# ----------------------------------------------------------------------------------------------------------
# Kernel and collective timing
# ----------------------------------------------------------------------------------------------------------

def _gemm_time(hw: Hardware, M: float, N: float, K: float, fp8: bool) -> float:
    """Seconds for one GEMM: FLOPs / (peak * eff_max * f/(f+f_half) * min-dim factor)."""
    flops = 2.0 * M * N * K
    if flops <= 0:
        return 0.0
    peak, eff = (hw.peak_fp8, hw.gemm_eff_fp8) if fp8 and hw.peak_fp8 else (hw.peak_bf16, hw.gemm_eff_bf16)
    f_half = 1.5e9 * peak / 989.4e12  # half efficiency at ~1.5 GFLOP on H100 BF16, scaling with the peak
    dmin = min(M, N, K)
    eta = eff * flops / (flops + f_half) * dmin / (dmin + 48.0)
    return flops / (peak * eta)


def _mem_time(hw: Hardware, nbytes: float) -> float:
    return nbytes / (hw.hbm_bw * EW_TRAFFIC_EFF)


def _group_bw(hw: Hardware, size: int, stride: int) -> tuple[float, float]:
    """(bus bandwidth per GPU, per-hop latency) of a group of ``size`` ranks spaced ``stride`` apart."""
    gpn = hw.gpus_per_node
    if size <= 1:
        return hw.nvlink_bw, 0.0
    if size * stride <= gpn:
        return hw.nvlink_bw, hw.nvlink_alpha_s
    per_node = max(1, min(size, gpn // stride)) if stride < gpn else 1
    return min(hw.nvlink_bw, per_node * hw.ib_bw), hw.ib_alpha_s


def _coll(kind: str, nbytes: float, n: int, bw: float, alpha: float) -> float:
    """Ring alpha-beta time of a collective over ``n`` ranks with message ``nbytes`` (§5.3)."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    lat = alpha * (1 + math.log2(n))  # NCCL switches to tree/LL protocols at small sizes
    if kind == "ar":
        return 2 * (n - 1) / n * nbytes / bw + 2 * lat
    return (n - 1) / n * nbytes / bw + lat


# ----------------------------------------------------------------------------------------------------------
# Per-layer, per-micro-batch costs on one GPU
# ----------------------------------------------------------------------------------------------------------

@dataclass
class _LayerCost:
    fwd: float = 0.0          # GPU compute, forward
    bwd: float = 0.0          # GPU compute, backward
    attn_fwd: float = 0.0     # core attention forward (selective recompute replays it)
    tp_fwd: float = 0.0       # exposed TP comm
    tp_bwd: float = 0.0
    cp_fwd: float = 0.0
    cp_bwd: float = 0.0
    ep_fwd: float = 0.0
    ep_bwd: float = 0.0
    kernels: float = 0.0      # launched ops fwd+bwd
    graphable_kernels: float = 0.0
    gemm_s: float = 0.0       # time in tensor-core GEMMs/attention (for tensor_active)
    mem_s: float = 0.0        # time in memory-bound kernels (for dram_active)
    nvlink_bytes: float = 0.0
    ib_bytes: float = 0.0


def _layer_cost(r: Recipe, x: _Layout, hw: Hardware) -> _LayerCost:
    k = r.effective_knobs
    fp8 = k["fp8"] is not None and hw.peak_fp8 is not None
    lc = _LayerCost()
    n = x.b * x.s / x.c                     # tokens per micro-batch on this rank's sequence shard
    n_sh = n / x.t if (x.sp or x.t == 1) else n   # tokens per rank in the sequence-parallel regions
    qkv_n = (x.H + 2 * x.G) * x.d / x.t
    # --- dense GEMMs (attention projections, and MLP unless MoE) -----------------------------------------
    shapes = [(n, qkv_n, x.h), (n, x.h, x.H * x.d / x.t)]
    if not x.moe:
        shapes += [(n, x.F1 / x.t, x.h), (n, x.h, x.F / x.t)]
    g_f = sum(_gemm_time(hw, M, N, K, fp8) for M, N, K in shapes)
    # backward: dgrad + wgrad, each the forward's size
    g_b = sum(_gemm_time(hw, M, K, N, fp8) + _gemm_time(hw, K, N, M, fp8) for M, N, K in shapes)
    ew_bytes = 0.0
    if fp8:  # cast inputs and output-grads to FP8 (read 2 B, write 1 B, + transpose for wgrad)
        ew_bytes += sum(3.0 * M * K for M, N, K in shapes) + sum(4.0 * M * N for M, N, K in shapes)
    # --- MoE experts ----------------------------------------------------------------------------------------
    if x.moe:
        tok = n_sh * x.topk                              # token-expert pairs this rank computes (balanced)
        local_e = max(1, x.E // x.e)
        M_e = tok * x.et / local_e                       # tokens per local expert (ETP gathers et shards)
        eshapes = [(M_e, x.Fm * (2 if x.gated else 1) / x.et, x.h), (M_e, x.h, x.Fm / x.et)]
        ef = local_e * sum(_gemm_time(hw, M, N, K, fp8) for M, N, K in eshapes)
        eb = local_e * sum(_gemm_time(hw, M, K, N, fp8) + _gemm_time(hw, K, N, M, fp8) for M, N, K in eshapes)
        router = _gemm_time(hw, n_sh, x.E, x.h, False)
        g_f += ef + router
        g_b += eb + 2 * router
        ew_bytes += 4 * tok * x.h * 2 + tok * x.Fm / x.et * 2 * (3 if x.gated else 1)  # permute/unpermute, act
        if fp8:
            ew_bytes += sum(7.0 * M * K for M, N, K in eshapes) * local_e
    # --- core attention (flash), causal ------------------------------------------------------------------
    attn_flops = 2.0 * x.b * (x.s / x.c) * x.s * x.H / x.t * x.d   # 4*b*sq*skv*H*d * 1/2 causal
    attn_eta = hw.attn_eff * x.s / (x.s + 512.0) * (0.9 if x.c > 1 else 1.0)
    a_f = attn_flops / (hw.peak_bf16 * attn_eta)
    a_b = 2.5 * attn_flops / (hw.peak_bf16 * attn_eta * 0.85)    # bwd: 2.5x FLOPs at lower efficiency
    # --- element-wise: norms, residuals, RoPE, activation function -----------------------------------------
    ew_bytes += n_sh * x.h * 2 * 16 + n * qkv_n * 2 * 2
    if not x.moe:
        ew_bytes += n * x.F / x.t * 2 * (3 if x.gated else 2)
    margin = (int(cast(str, k["env.NVTE_FWD_LAYERNORM_SM_MARGIN"]))
              + int(cast(str, k["env.NVTE_BWD_LAYERNORM_SM_MARGIN"])))
    ln_slow = 1.0 + 0.5 * margin / 2 / hw.sms   # LN kernels lose the reserved SMs (about half their time)
    e_f = _mem_time(hw, ew_bytes) * ln_slow
    e_b = 2.0 * e_f
    tp_overlap = bool(k["tp_comm_overlap"])
    sm_tax = 1.04 if tp_overlap else 1.0       # userbuffer kernels take SMs from the GEMMs
    lc.fwd = g_f * sm_tax + a_f + e_f
    lc.bwd = g_b * sm_tax + a_b + e_b
    lc.attn_fwd = a_f
    lc.gemm_s = g_f + g_b + a_f + a_b
    lc.mem_s = e_f + e_b
    ordered = k["env.CUDA_DEVICE_MAX_CONNECTIONS"] == "1" or hw.fp8_transformer_engine_gen >= 2
    # --- TP / SP ------------------------------------------------------------------------------------------
    if x.t > 1:
        bw, alpha = _group_bw(hw, x.t, 1)
        if k["env.NCCL_NVLS_ENABLE"] == "1" and x.t <= hw.gpus_per_node:
            bw *= hw.nvls_speedup
        M_act = n * x.h * (1 if fp8 and tp_overlap else 2)
        per = _coll("ag", M_act, x.t, bw, alpha)
        tp_f = 4 * per                       # 2 AG + 2 RS (or 2 AR without SP: same bytes)
        tp_b = 4 * per
        if tp_overlap:
            lc.tp_fwd, lc.tp_bwd = 0.15 * tp_f, 0.15 * tp_b      # ~1/num_split of the RS chunks stays exposed
        else:
            lc.tp_fwd = tp_f
            lc.tp_bwd = tp_b * (0.5 if ordered else 1.0)         # bwd AG overlaps dgrad when streams are ordered
        vol = 8 * (x.t - 1) / x.t * n * x.h * 2
        if x.t <= hw.gpus_per_node:
            lc.nvlink_bytes += vol
        else:
            lc.ib_bytes += vol
    # --- CP (p2p ring of K/V chunks hidden behind attention) ---------------------------------------------
    if x.c > 1:
        bw, alpha = _group_bw(hw, x.c, x.t)
        g_loc = max(1.0, x.G / x.t)
        kv = 2 * x.b * (x.s / x.c) * g_loc * x.d * 2
        step = kv / bw + alpha
        a_step_f, a_step_b = a_f / x.c, a_b / x.c
        hide = 1.0 if ordered else 0.0
        lc.cp_fwd = (x.c - 1) * max(0.0, step - hide * a_step_f) + step * 0.25
        lc.cp_bwd = (x.c - 1) * max(0.0, 2 * step - hide * a_step_b) + step * 0.5
        if x.t * x.c <= hw.gpus_per_node:
            lc.nvlink_bytes += 3 * (x.c - 1) * kv
        else:
            lc.ib_bytes += 3 * (x.c - 1) * kv
    # --- EP dispatch / combine ---------------------------------------------------------------------------
    # Any expert-parallel group (EP, TP, or expert-TP alone: ETP shards every expert, so the group's tokens
    # are gathered to each shard and the outputs reduce-scattered back) pays for moving tokens.
    if x.moe and (x.e > 1 or x.t > 1 or x.et > 1):
        disp = k["moe_token_dispatcher_type"]
        grp = x.e * x.et
        tok_bytes = n_sh * x.h * 2
        if disp == "allgather":
            bw, alpha = _group_bw(hw, grp, 1)
            one = _coll("ag", tok_bytes * grp, grp, bw, alpha) + _coll("rs", tok_bytes * grp, grp, bw, alpha)
            vol = 2 * (grp - 1) * tok_bytes
            ep = one
        else:
            sent = n_sh * x.topk * x.h * 2 * (x.e - 1) / max(1, x.e)
            on_node = min(1.0, (hw.gpus_per_node / x.et - 1) / max(1, x.e - 1)) if x.e > 1 else 1.0
            inter_bw = hw.ib_bw * (1.3 if disp == "flex" else 1.0)   # DeepEP NVLink forwarding + RDMA
            alpha = hw.ib_alpha_s if grp > hw.gpus_per_node else hw.nvlink_alpha_s
            if disp == "flex":
                alpha *= 0.5
            a2a = max(sent * on_node / hw.nvlink_bw, sent * (1 - on_node) / inter_bw) + 2 * alpha
            ep = 2 * a2a
            vol = 2 * sent
            if x.et > 1:
                bw2, al2 = _group_bw(hw, x.et, 1)
                ep += 2 * _coll("ag", tok_bytes * x.topk * x.et, x.et, bw2, al2)
        lc.ep_fwd, lc.ep_bwd = ep, ep
        if grp <= hw.gpus_per_node:
            lc.nvlink_bytes += 2 * vol
        else:
            lc.ib_bytes += 2 * vol
    # --- kernel count (host side) ------------------------------------------------------------------------
    kf = 24.0 + (4 if x.t > 1 else 0) + (3 * x.c if x.c > 1 else 0) + (12 if fp8 else 0)
    kmoe = (30.0 + 2 * max(1, x.E // x.e)) if x.moe else 0.0
    lc.kernels = 3.0 * (kf + kmoe)
    lc.graphable_kernels = 3.0 * kf     # dropless MoE: only attention (dense part) is captured
    return lc


# ----------------------------------------------------------------------------------------------------------
# Memory
# ----------------------------------------------------------------------------------------------------------

def _act_bytes_per_layer(r: Recipe, x: _Layout) -> float:
    """Stored activations of one layer for one micro-batch (MCore/Korthikanti with flash attention)."""
    tokens = x.s / x.c * x.b
    ffn_ratio = (x.topk * x.Fm + 0.5 * x.topk * x.h) / x.h if x.moe else x.F / x.h
    if x.sp or x.t == 1:
        per_tok = x.h * (18 + 4 * ffn_ratio) / x.t
    else:
        per_tok = x.h * (10 + (8 + 4 * ffn_ratio) / x.t)
    if r.knob("fp8") is not None:  # TE saves the four GEMM inputs as FP8 (1 byte instead of 2)
        per_tok -= x.h * (3 + (x.topk * x.Fm if x.moe else x.F) / x.h) / x.t
    return tokens * per_tok


def _memory(r: Recipe, x: _Layout, hw: Hardware, stage_layers: list[int]) -> dict[str, float]:
    k = r.effective_knobs
    fp8 = k["fp8"] is not None
    dense_l, exp_l = _layer_params(x)
    emb = x.V * x.h
    g_bytes = 2.0 if k["grad_reduce_in_bf16"] else 4.0
    w_bytes = 1.0 if fp8 else 2.0  # FP8 recipes keep FP8 model weights (fp8_param_gather), FP32 master copies
    if k["use_distributed_optimizer"]:
        bpp_d, bpp_e = w_bytes + g_bytes + 12.0 / max(1, x.D), w_bytes + g_bytes + 12.0 / x.ED
    else:
        bpp_d = bpp_e = w_bytes + g_bytes + 12.0
    act_l = _act_bytes_per_layer(r, x)
    gran = k["recompute_granularity"]
    per_chunk = max(1, stage_layers[0] // x.v)
    if gran == "full":
        nrl = int(k["recompute_num_layers"] or 1)
        inp = x.s / x.c * x.b * x.h * 2 / (x.t if x.sp else 1)
        if k["recompute_method"] == "uniform":
            stored_per_layer = inp / nrl
            transient = nrl * act_l
        else:
            frac = min(nrl, per_chunk) / per_chunk
            stored_per_layer = frac * inp + (1 - frac) * act_l
            transient = act_l  # block: each of the first n layers is its own checkpoint
    else:
        stored_per_layer, transient = act_l, 0.0
    if x.p == 1:
        inflight = 1.0
    elif x.v == 1:
        inflight = float(min(x.m, x.p))
    else:
        inflight = x.p * (1 + (x.p - 1) / (x.p * x.v))
    best: dict[str, float] = {}
    for i, nl in enumerate(stage_layers):
        first, last = i == 0, i == len(stage_layers) - 1
        params_d = nl * dense_l / x.t + (emb / x.t if first else 0) + (
            emb / x.t if last and (not x.tied or x.p > 1) else 0)
        params_e = nl * exp_l / (x.e * x.et)
        states = params_d * bpp_d + params_e * bpp_e
        # stage i holds fewer in-flight micro-batches than the first (1F1B: p - i)
        infl = inflight if x.p == 1 else max(1.0, inflight * (x.p - i) / x.p)
        acts = nl * stored_per_layer * infl + transient
        if last:
            acts += x.s / x.c * x.b * x.V / x.t * 6.0        # logits (bf16) + fused cross-entropy workspace
        if first:
            acts += x.s / x.c * x.b * x.h * 2 * infl
        frag = 0.01 if k["env.PYTORCH_CUDA_ALLOC_CONF"] else 0.03
        extra = BASE_OVERHEAD_GB * 1e9 + acts * frag
        if k["enable_cuda_graph"]:
            extra += 2.0e9 + (4.0e9 if x.p > 1 else 0.0)
        if k["env.NCCL_NVLS_ENABLE"] == "1" and x.t * x.c > 1:
            extra += 1.5e9
        if k["env.TORCH_NCCL_AVOID_RECORD_STREAMS"] == "0":
            extra += 0.5e9
        if k["tp_comm_overlap"]:
            extra += 3 * x.b * x.s / x.c * x.h * 2
        total = states + acts + extra
        if not best or total > best["total"]:
            best = {"weights_grads_optimizer": states, "activations": acts, "overheads": extra, "total": total,
                    "stage": float(i)}
    return {kk: vv / 1e9 if kk != "stage" else vv for kk, vv in best.items()}


# ----------------------------------------------------------------------------------------------------------
# Step time
# ----------------------------------------------------------------------------------------------------------

def _stage_layers(r: Recipe, x: _Layout) -> list[int]:
    per = mc.pipeline_split_layers(r) // x.p
    out = [per] * x.p
    out[0] -= int(bool(r.knob("account_for_embedding_in_pipeline_split")))
    out[-1] -= int(bool(r.knob("account_for_loss_in_pipeline_split")))
    return out


def simulate(recipe: Recipe, *, seed: int | None = None, noise_sigma: float = NOISE_SIGMA) -> SimResult:
    """Simulate one steady-state training step of a ``framework: megatron`` recipe.

    Deterministic (the model's mean) when ``seed`` is None; with a seed, the step time carries multiplicative
    log-normal run-to-run noise of sigma ``noise_sigma`` (default ``NOISE_SIGMA``). Raises ``ValueError`` for a non-megatron recipe or an
    accelerator that cannot be simulated.
    """
    if recipe.framework != "megatron":
        raise ValueError(f"recipe.framework is {recipe.framework!r}; the simulator models framework: megatron")
    hw = get_hardware(recipe.resources.accelerator)
    x = _layout(recipe)
    k = recipe.effective_knobs
    fp8 = k["fp8"] is not None and hw.peak_fp8 is not None
    stages = _stage_layers(recipe, x)
    mem = _memory(recipe, x, hw, stages)
    cap = hw.hbm_capacity_bytes / 1e9
    if recipe.resources.device_memory_gb is not None:
        cap = min(cap, recipe.resources.device_memory_gb)
    flops_tok = model_flops_per_token(recipe)

    lc = _layer_cost(recipe, x, hw)
    n = x.b * x.s / x.c
    # LM head + loss (last stage) and embedding (first stage), per micro-batch
    head_f = _gemm_time(hw, n, x.V / x.t, x.h, False) + _mem_time(hw, n * x.V / x.t * 6)
    head_b = 2 * _gemm_time(hw, n, x.V / x.t, x.h, False) + _mem_time(hw, n * x.V / x.t * 4)
    emb_fb = _mem_time(hw, n * x.h * 2 * 3)
    if x.t > 1:  # vocab-parallel logits need small all-reduces; embedding output reduce-scatter
        bw, al = _group_bw(hw, x.t, 1)
        emb_fb += 2 * _coll("rs", n * x.h * 2, x.t, bw, al)
    gran = k["recompute_granularity"]

    def recompute_per_layer(nl: int) -> float:
        if gran == "selective":
            return lc.attn_fwd
        if gran == "full":
            per_chunk = max(1, nl // x.v)
            frac = 1.0 if k["recompute_method"] == "uniform" else (
                min(int(cast(int, k["recompute_num_layers"])), per_chunk) / per_chunk)
            return frac * (lc.fwd + lc.tp_fwd + lc.cp_fwd + lc.ep_fwd)
        return 0.0

    # PP point-to-point per micro-batch per chunk boundary
    p2p = 0.0
    if x.p > 1:
        nbytes = n * x.h * 2 / (x.t if x.sp else 1)
        cross = x.t * x.c * x.D >= hw.gpus_per_node
        if cross:
            chunk = float(cast(str, k["env.NCCL_P2P_NET_CHUNKSIZE"]))
            bw = hw.ib_bw * chunk / (chunk + 96 * 1024)   # per-chunk handshake overhead over the network
            alpha = hw.ib_alpha_s
        else:
            bw, alpha = hw.nvlink_bw, hw.nvlink_alpha_s
        t_one = nbytes / bw + alpha
        overlap = 0.6 if x.v > 1 else 0.3             # interleaved schedule overlaps p2p with compute
        p2p = 2 * x.v * t_one * (1 - overlap)

    use_graph = bool(k["enable_cuda_graph"])
    stage_times, stage_host, comp_parts = [], [], []
    for i, nl in enumerate(stages):
        gpu = nl * (lc.fwd + lc.bwd + recompute_per_layer(nl))
        comm = nl * (lc.tp_fwd + lc.tp_bwd + lc.cp_fwd + lc.cp_bwd + lc.ep_fwd + lc.ep_bwd)
        if i == len(stages) - 1:
            gpu += head_f + head_b
        if i == 0:
            gpu += emb_fb
        kernels = nl * lc.kernels * (1.3 if gran == "full" else 1.0) + 40
        if use_graph:
            host = nl * (lc.kernels - lc.graphable_kernels) * HOST_S_PER_KERNEL + nl * 3 * GRAPH_LAUNCH_S * x.v
            host += 40 * HOST_S_PER_KERNEL
        else:
            host = kernels * HOST_S_PER_KERNEL
        host_exposed = max(0.0, host - (gpu + comm)) + (0.0003 if not use_graph else 0.0001)
        stage_times.append(gpu + comm + p2p + host_exposed)
        stage_host.append(host_exposed)
        comp_parts.append((gpu, comm, nl))
    tmax = max(stage_times)
    imax = stage_times.index(tmax)
    if x.p == 1:
        pipe = x.m * tmax
    elif x.v == 1:
        pipe = (x.m - 1) * tmax + sum(stage_times)
    else:
        pipe = x.m * tmax + (sum(stage_times) - tmax) / x.v
    bubble = pipe - x.m * tmax

    # --- DP: gradient reduce-scatter / all-reduce and parameter all-gather --------------------------------
    dense_l, exp_l = _layer_params(x)
    nl0 = stages[0]
    p_dense = (nl0 * dense_l + x.V * x.h) / x.t
    p_exp = nl0 * exp_l / (x.e * x.et)
    g_bytes = 2.0 if k["grad_reduce_in_bf16"] else 4.0
    p_bytes = 1.0 if fp8 else 2.0
    dist = bool(k["use_distributed_optimizer"])
    bucket = float(k["bucket_size"] or max(40_000_000, 1_000_000 * x.D))
    margin_on = (int(cast(str, k["env.NVTE_FWD_LAYERNORM_SM_MARGIN"]))
                 + int(cast(str, k["env.NVTE_BWD_LAYERNORM_SM_MARGIN"])) > 0)
    ovl_eff = (0.9 if margin_on else 0.7) * (0.92 if (k["env.CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
                                                      and hw.fp8_transformer_engine_gen >= 2) else 1.0)

    def dp_times(params: float, n_ranks: int, stride: int) -> tuple[float, float, float, float]:
        if n_ranks <= 1 or params <= 0:
            return 0.0, 0.0, 0.0, 0.0
        bw, alpha = _group_bw(hw, n_ranks, stride)
        if k["env.NCCL_NVLS_ENABLE"] == "1" and n_ranks * stride <= hw.gpus_per_node:
            bw *= hw.nvls_speedup
        nb = max(1, math.ceil(params / bucket))
        if dist:
            rs = sum(_coll("rs", min(bucket, params - j * bucket) * g_bytes, n_ranks, bw, alpha) for j in range(nb))
            ag = sum(_coll("ag", min(bucket, params - j * bucket) * p_bytes, n_ranks, bw, alpha) for j in range(nb))
            last_rs = _coll("rs", min(bucket, params) * g_bytes, n_ranks, bw, alpha)
            last_ag = _coll("ag", min(bucket, params) * p_bytes, n_ranks, bw, alpha)
        else:
            rs = sum(_coll("ar", min(bucket, params - j * bucket) * g_bytes, n_ranks, bw, alpha) for j in range(nb))
            ag = last_ag = 0.0
            last_rs = _coll("ar", min(bucket, params) * g_bytes, n_ranks, bw, alpha)
        return rs, ag, last_rs, last_ag

    rs_d, ag_d, lrs_d, lag_d = dp_times(p_dense, x.D, x.t * x.c)
    rs_e, ag_e, lrs_e, lag_e = dp_times(p_exp, x.ED, x.e * x.et)
    rs, ag, lrs, lag = rs_d + rs_e, ag_d + ag_e, max(lrs_d, lrs_e), max(lag_d, lag_e)
    gpu0, comm0, _ = comp_parts[0]
    per_mb_bwd = (gpu0 + comm0) * 2 / 3
    per_mb_fwd = (gpu0 + comm0) / 3
    if k["overlap_grad_reduce"]:
        window = per_mb_bwd * (x.v if x.v > 1 else 1) / max(1, x.v) + (bubble / 2 if x.p > 1 else 0)
        rs_exposed = max(lrs, rs - window * ovl_eff)
    else:
        rs_exposed = rs
    if k["overlap_param_gather"]:
        ag_exposed = max(lag, ag - per_mb_fwd * ovl_eff)
    else:
        ag_exposed = ag
    dp_exposed = rs_exposed + ag_exposed
    dp_bytes = (x.D - 1) / max(1, x.D) * p_dense * (g_bytes + (p_bytes if dist else g_bytes)) + (
        (x.ED - 1) / x.ED * p_exp * (g_bytes + p_bytes))

    # --- optimizer step ---------------------------------------------------------------------------------
    shard = (p_dense / max(1, x.D) + p_exp / x.ED) if dist else (p_dense + p_exp)
    optimizer = _mem_time(hw, shard * OPT_BYTES_PER_PARAM) + _mem_time(hw, (p_dense + p_exp) * g_bytes) + 0.003

    # --- host: fixed per-step work and GC ---------------------------------------------------------------
    if k["manual_gc"]:
        gc = GC_PAUSE_S / MANUAL_GC_INTERVAL
    else:
        gc = GC_PAUSE_S * (1 - (1 - GC_RATE_PER_RANK) ** x.world)
    host_fixed = STEP_FIXED_HOST_S + gc

    step = pipe + dp_exposed + optimizer + host_fixed
    gpu_i, comm_i, nl_i = comp_parts[imax]
    breakdown = {
        "compute": x.m * gpu_i,
        "recompute": x.m * nl_i * recompute_per_layer(nl_i),
        "tp_comm": x.m * nl_i * (lc.tp_fwd + lc.tp_bwd),
        "cp_comm": x.m * nl_i * (lc.cp_fwd + lc.cp_bwd),
        "ep_comm": x.m * nl_i * (lc.ep_fwd + lc.ep_bwd),
        "pp_p2p": x.m * p2p,
        "pp_bubble": bubble,
        "dp_exposed": dp_exposed,
        "optimizer": optimizer,
        "host_overhead": x.m * stage_host[imax] + host_fixed,
    }
    breakdown["compute"] -= breakdown["recompute"]
    if seed is not None:
        step *= math.exp(random.Random(seed).gauss(0.0, noise_sigma))
    assert recipe.training is not None  # a megatron recipe has one (Recipe validation)
    tokens = recipe.training.global_batch_size * x.s
    tps = tokens / step / x.world
    peak = mem["total"]
    mfu_peak = hw.peak_bf16
    busy = x.m * (gpu_i + comm_i) + optimizer
    signals = {
        "sm_active": min(1.0, (busy + 0.8 * dp_exposed) / step),
        "tensor_active": min(1.0, x.m * nl_i * lc.gemm_s * 0.75 / step),
        "dram_active": min(1.0, (x.m * nl_i * lc.mem_s + optimizer + 0.25 * x.m * nl_i * lc.gemm_s) / step),
        "nvlink_bytes": x.m * nl_i * lc.nvlink_bytes * (1 + (gran == "full")) + (
            dp_bytes if x.D * x.t * x.c <= hw.gpus_per_node else 0.0),
        "ib_bytes": x.m * nl_i * lc.ib_bytes + (dp_bytes if x.D * x.t * x.c > hw.gpus_per_node else 0.0) + (
            x.m * 2 * x.v * n * x.h * 2 / (x.t if x.sp else 1) if x.p > 1 else 0.0),
        "fb_used_gb": peak,
    }
    signals["pcie_bytes"] = signals["ib_bytes"] + tokens / x.world * 8   # NIC traffic crosses PCIe + input ids
    if peak > cap:
        return SimResult(outcome="oom", step_time_s=None, tokens_per_s_per_device=0.0, peak_memory_gb=peak,
                         breakdown=breakdown, memory_gb=mem, signals={**signals, "fb_used_gb": cap},
                         model_flops_per_token=flops_tok, params_per_device_b=params_per_device_b(recipe),
                         message=f"needs {peak:.1f} GB on pipeline stage {int(mem['stage'])}, device has {cap:.1f} GB")
    return SimResult(outcome="succeeded", step_time_s=step, tokens_per_s_per_device=tps, peak_memory_gb=peak,
                     breakdown=breakdown, memory_gb=mem, signals=signals, mfu=tps * flops_tok / mfu_peak,
                     model_flops_per_token=flops_tok, params_per_device_b=params_per_device_b(recipe))


def params_per_device_b(recipe: Recipe) -> float:
    """Rough parameters per device in billions (for the simulated backend's initialisation time only)."""
    params = model_flops_per_token(recipe) / 6.0  # ~ active parameters incl. attention-score term; good enough
    return params / 1e9 / max(1, recipe.resources.devices) * max(1, int(recipe.knob("tensor_model_parallel_size")))
