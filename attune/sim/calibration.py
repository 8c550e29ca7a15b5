"""NVIDIA-published Megatron/NeMo throughputs as recipes, and the simulator's error against them.

Rows come from NVIDIA's dgxc-benchmarking v25.04 (``741c886``, NeMo 25.02.01 container, H100; v25.02 ``8f5cbb3``
for the Nemotron4-340B VP) and the NeMo 25.02 DGX-B200 performance summary, plus the GPT3-175B H100 row of the
NeMo 25.02 DGX-H100 performance summary. Every row uses NVIDIA's
performance-recipe settings: distributed optimizer with grad/param overlap, BF16 gradient reduction, SP and
TP comm overlap when TP>1, manual GC, NVLS off, 2 MiB PP chunks, FP8 "hybrid" for FP8 rows. Rows with FSDP or
head dimensions our ModelSpec cannot express (Qwen3) are left out.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from attune.recipe.model import Recipe
from attune.sim.model import SimResult, simulate

MODELS: dict[str, dict[str, Any]] = {
    # Llama 3 / 3.1 (Meta model cards; HF config.json)
    "llama3-8b": dict(family="llama3", layers=32, hidden_size=4096, heads=32, kv_groups=8, ffn_hidden_size=14336,
                      vocab_size=128256),
    "llama3-70b": dict(family="llama3", layers=80, hidden_size=8192, heads=64, kv_groups=8, ffn_hidden_size=28672,
                       vocab_size=128256),
    "llama3-405b": dict(family="llama3", layers=126, hidden_size=16384, heads=128, kv_groups=8,
                        ffn_hidden_size=53248, vocab_size=128256),
    # Nemotron-4 (arXiv:2402.16819, 2406.11704): squared-ReLU MLP, GQA 8
    "nemotron4-15b": dict(family="nemotron", layers=32, hidden_size=6144, heads=48, kv_groups=8,
                          ffn_hidden_size=24576, vocab_size=256000),
    "nemotron4-340b": dict(family="nemotron", layers=96, hidden_size=18432, heads=96, kv_groups=8,
                           ffn_hidden_size=73728, vocab_size=256000),
    # GPT-3 175B (Brown et al. 2020), GPT-2 BPE vocabulary
    "gpt3-175b": dict(family="gpt", layers=96, hidden_size=12288, heads=96, ffn_hidden_size=49152,
                      vocab_size=50257),
    # Mixtral 8x7B (Mistral AI model card)
    "mixtral-8x7b": dict(family="mixtral", layers=32, hidden_size=4096, heads=32, kv_groups=8,
                         ffn_hidden_size=14336, vocab_size=32000, moe_experts=8, moe_top_k=2,
                         moe_ffn_hidden_size=14336),
}


@dataclass(frozen=True)
class CalibrationRow:
    """One published throughput with the exact layout that produced it."""

    name: str
    model: str
    accelerator: str
    gpus: int
    precision: str          # "bf16" or "fp8"
    gbs: int
    mbs: int
    seq: int
    tp: int
    pp: int
    cp: int
    vp: int | None
    ep: int
    tokens_per_s_per_gpu: float
    source: str

    def recipe(self, **knob_overrides: Any) -> Recipe:
        """The row as a ``framework: megatron`` recipe (knob overrides make its neighbours)."""
        m = MODELS[self.model]
        split_emb = m["layers"] % self.pp != 0
        knobs: dict[str, Any] = {
            "tensor_model_parallel_size": self.tp, "pipeline_model_parallel_size": self.pp,
            "context_parallel_size": self.cp, "virtual_pipeline_model_parallel_size": self.vp,
            "expert_model_parallel_size": self.ep, "micro_batch_size": self.mbs,
            "sequence_parallel": self.tp > 1, "tp_comm_overlap": self.tp > 1,
            "use_distributed_optimizer": True, "overlap_grad_reduce": True, "overlap_param_gather": True,
            "grad_reduce_in_bf16": True, "fp8": "hybrid" if self.precision == "fp8" else None,
            "manual_gc": True, "env.NCCL_NVLS_ENABLE": "0",
            "env.CUDA_DEVICE_MAX_CONNECTIONS": "32" if self.accelerator == "b200" else "1",
            "env.NCCL_P2P_NET_CHUNKSIZE": "2097152",
            "env.NVTE_FWD_LAYERNORM_SM_MARGIN": "16", "env.NVTE_BWD_LAYERNORM_SM_MARGIN": "16",
            "account_for_embedding_in_pipeline_split": split_emb,
            "account_for_loss_in_pipeline_split": split_emb,
        }
        if self.ep > 1:
            knobs["expert_tensor_parallel_size"] = 1
            knobs["moe_token_dispatcher_type"] = "alltoall"
        knobs.update(knob_overrides)
        if knobs["tensor_model_parallel_size"] == 1:
            knobs["tp_comm_overlap"] = False
            knobs["sequence_parallel"] = False
        return Recipe.model_validate({
            "name": self.name, "framework": "megatron", "model": m,
            "training": {"global_batch_size": self.gbs, "seq_length": self.seq, "steps": 50,
                         "optimizer": {"name": "adamw", "lr": 3e-4}, "precision": "bf16",
                         "numerics_opt_in": ["fp8", "bf16_grad_reduce"]},
            "resources": {"accelerator": self.accelerator, "nodes": self.gpus // 8, "devices_per_node": 8},
            "knobs": knobs,
        })


_DGXC = "dgxc-benchmarking v25.04 (741c886), NeMo 25.02.01, knobs-and-sim.md §3.2"
_B200 = "NeMo 25.02 DGX-B200 performance summary, knobs-and-sim.md §3.4"
R = CalibrationRow
ROWS: tuple[CalibrationRow, ...] = (
    R("llama3-8b-bf16-h100", "llama3-8b", "h100-sxm-80gb", 8, "bf16", 128, 1, 8192, 1, 1, 2, None, 1, 10682, _DGXC),
    R("llama3-8b-fp8-h100", "llama3-8b", "h100-sxm-80gb", 8, "fp8", 128, 1, 8192, 1, 1, 2, None, 1, 14049, _DGXC),
    R("llama3-70b-bf16-h100", "llama3-70b", "h100-sxm-80gb", 64, "bf16", 128, 1, 8192, 4, 4, 2, 5, 1, 1118, _DGXC),
    R("llama3-70b-fp8-h100", "llama3-70b", "h100-sxm-80gb", 64, "fp8", 128, 1, 8192, 4, 8, 1, 5, 1, 1662, _DGXC),
    R("llama3-405b-bf16-h100", "llama3-405b", "h100-sxm-80gb", 512, "bf16", 256, 1, 8192, 8, 8, 2, 8, 1, 207, _DGXC),
    R("llama3-405b-fp8-h100", "llama3-405b", "h100-sxm-80gb", 512, "fp8", 256, 1, 8192, 8, 8, 2, 8, 1, 331, _DGXC),
    R("nemotron4-15b-bf16-h100", "nemotron4-15b", "h100-sxm-80gb", 64, "bf16", 256, 2, 4096, 2, 1, 1, None, 1, 6136,
      _DGXC),
    R("nemotron4-15b-fp8-h100", "nemotron4-15b", "h100-sxm-80gb", 64, "fp8", 256, 2, 4096, 2, 1, 1, None, 1, 8275,
      _DGXC),
    R("nemotron4-340b-bf16-h100", "nemotron4-340b", "h100-sxm-80gb", 256, "bf16", 64, 1, 4096, 8, 8, 1, 12, 1, 235,
      _DGXC),
    R("nemotron4-340b-fp8-h100", "nemotron4-340b", "h100-sxm-80gb", 256, "fp8", 64, 1, 4096, 8, 8, 1, 12, 1, 350,
      _DGXC),
    R("gpt3-175b-fp8-h100", "gpt3-175b", "h100-sxm-80gb", 512, "fp8", 2048, 2, 2048, 4, 8, 1, 6, 1, 866,
      "NeMo 25.02 DGX-H100 performance summary, knobs-and-sim.md §3.1"),
    R("llama3-8b-fp8-b200", "llama3-8b", "b200", 8, "fp8", 128, 2, 8192, 1, 1, 1, None, 1, 26006, _B200),
    R("llama3-70b-fp8-b200", "llama3-70b", "b200", 64, "fp8", 128, 1, 8192, 2, 4, 2, 5, 1, 3062, _B200),
    R("llama3-405b-fp8-b200", "llama3-405b", "b200", 128, "fp8", 64, 1, 8192, 4, 8, 2, 8, 1, 625, _B200),
    R("nemotron4-15b-fp8-b200", "nemotron4-15b", "b200", 64, "fp8", 256, 2, 4096, 1, 1, 1, None, 1, 14760, _B200),
    R("nemotron4-340b-fp8-b200", "nemotron4-340b", "b200", 128, "fp8", 32, 1, 4096, 8, 4, 1, 12, 1, 602, _B200),
    R("gpt3-175b-fp8-b200", "gpt3-175b", "b200", 512, "fp8", 2048, 2, 2048, 4, 4, 1, 6, 1, 1600, _B200),
    R("mixtral-8x7b-fp8-b200", "mixtral-8x7b", "b200", 64, "fp8", 256, 2, 4096, 1, 1, 1, None, 8, 15457, _B200),
)


@dataclass(frozen=True)
class CalibrationResult:
    """A published row, the simulator's prediction for it and the relative error."""

    row: CalibrationRow
    predicted: SimResult
    error: float   # (predicted - published) / published on tokens/s/GPU; +inf if predicted OOM


def calibrate(rows: tuple[CalibrationRow, ...] = ROWS) -> list[CalibrationResult]:
    """Simulate every published row and return (row, prediction, relative error)."""
    out = []
    for row in rows:
        res = simulate(row.recipe())
        err = float("inf") if res.outcome != "succeeded" else (
            res.tokens_per_s_per_device - row.tokens_per_s_per_gpu) / row.tokens_per_s_per_gpu
        out.append(CalibrationResult(row=row, predicted=res, error=err))
    return out


def median_abs_error(results: list[CalibrationResult]) -> float:
    """Median of |relative error| over the results."""
    return statistics.median(abs(r.error) for r in results)


def format_table(results: list[CalibrationResult]) -> str:
    """A plain-text table of the calibration (for reports)."""
    lines = [f"{'row':28s} {'published':>10s} {'predicted':>10s} {'error':>8s} {'mem GB':>7s} {'MFU':>6s}"]
    for r in results:
        lines.append(f"{r.row.name:28s} {r.row.tokens_per_s_per_gpu:10.0f} "
                     f"{r.predicted.tokens_per_s_per_device:10.0f} {r.error * 100:7.1f}% "
                     f"{r.predicted.peak_memory_gb:7.1f} {r.predicted.mfu * 100:5.1f}%")
    lines.append(f"median |error| = {median_abs_error(results) * 100:.1f}%")
    return "\n".join(lines)
