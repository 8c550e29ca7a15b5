"""Knob catalogue of torchtitan jobs (``framework: torchtitan``), with each knob's spelling in both launch forms.

Forms (pytorch/torchtitan; tags ``v0.2.0``–``v0.2.2`` and main ``b5bcd76``):

- **TOML job file** (0.2.x): ``torchrun [...] -m torchtitan.train --job.config_file llama3_8b.toml [--section.key
  value ...]``; the ``JobConfig`` schema of 0.2.0–0.2.2 is :data:`TOML_SCHEMA`;
- **Python config function** (main after ``9810191``, "TOML to Python Dataclass Registry", #2386; its
  ``assets/version.txt`` still says 0.2.2): ``torchrun [...] -m torchtitan.train --module llama3 --config llama3_8b
  [--section.key value ...]``; the ``--section.option`` flags are frozen there ("will not grow"), the config
  function sets the rest.

The batch knob is ``local_batch_size`` (sequences per data-parallel rank per micro-batch): ``training.local_batch_
size`` in 0.2.x, ``training.num_tokens_per_microbatch_per_dp_rank`` (= local batch × ``max_context_length``) on main.
The global batch stays fixed: 0.2.x ``training.global_batch_size`` (-1: local batch × DP degree), main
``training.num_tokens_per_train_step`` (-1: the same in tokens). With -1, any move that changes the DP degree (TP,
PP, CP) changes the global batch, a contract change the gate refuses; give the global batch explicitly to free them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from attune.recipe.catalogue import Catalogue, Constraint, Knob, Semantics

if TYPE_CHECKING:
    from attune.recipe.model import Recipe

D = Semantics.NUMERICS_DRIFT
P = Semantics.PRESERVING
VERSIONS = ">=0.2,<0.3"
"""torchtitan versions covered: the 0.2.x releases (TOML) and main after 0.2.2 (whose package version is 0.2.2)."""

TP = "tensor_parallel_degree"
PP = "pipeline_parallel_degree"
CP = "context_parallel_degree"
DP_SHARD = "data_parallel_shard_degree"
DP_REPLICATE = "data_parallel_replicate_degree"
LOCAL_BATCH = "local_batch_size"
AC = "activation_checkpoint"
COMPILE = "compile"
ASYNC_TP = "async_tensor_parallel"
RESHARD = "fsdp_reshard_after_forward"
PP_SCHEDULE = "pipeline_parallel_schedule"

#: knob → native dotted key per form (``toml``: 0.2.x job config; ``registry``: main's CLI), and its default there
SPELLINGS: dict[str, dict[str, tuple[str, Any]]] = {
    TP: {"toml": ("parallelism.tensor_parallel_degree", 1), "registry": ("parallelism.tensor_parallel_degree", 1)},
    PP: {"toml": ("parallelism.pipeline_parallel_degree", 1),
         "registry": ("parallelism.pipeline_parallel_degree", 1)},
    CP: {"toml": ("parallelism.context_parallel_degree", 1), "registry": ("parallelism.context_parallel_degree", 1)},
    DP_SHARD: {"toml": ("parallelism.data_parallel_shard_degree", -1),
               "registry": ("parallelism.data_parallel_shard_degree", -1)},
    DP_REPLICATE: {"toml": ("parallelism.data_parallel_replicate_degree", 1),
                   "registry": ("parallelism.data_parallel_replicate_degree", 1)},
    LOCAL_BATCH: {"toml": ("training.local_batch_size", 8),
                  "registry": ("training.num_tokens_per_microbatch_per_dp_rank", 16384)},
    AC: {"toml": ("activation_checkpoint.mode", "selective")},
    COMPILE: {"toml": ("compile.enable", False), "registry": ("compile.enable", False)},
    ASYNC_TP: {"toml": ("parallelism.enable_async_tensor_parallel", False),
               "registry": ("compile.enable_async_tensor_parallel", False)},
    RESHARD: {"toml": ("parallelism.fsdp_reshard_after_forward", "default"),
              "registry": ("parallelism.fsdp_reshard_after_forward", "default")},
    PP_SCHEDULE: {"toml": ("parallelism.pipeline_parallel_schedule", "1F1B"),
                  "registry": ("parallelism.pipeline_parallel_schedule", "1F1B")},
}

_DEG = (1, 2, 4, 8, 16, 32)
KNOBS = [
    Knob(name=TP, type="int", values=(1, 2, 4, 8), default=1, semantics=D, group="tensor_parallel",
         versions=VERSIONS,
         description="tensor parallel degree (parallelism.tensor_parallel_degree): shards attention/MLP over TP "
                     "GPUs (with sequence parallel); keep it inside NVLink. Lowers memory, adds TP collectives."),
    Knob(name=ASYNC_TP, type="bool", values=(False, True), default=False, semantics=D, group="tensor_parallel",
         versions=VERSIONS,
         description="async TP: overlap TP collectives with the GEMMs (micro-pipelining); needs TP>1 and compile "
                     "(0.2.x parallelism.enable_async_tensor_parallel, main compile.enable_async_tensor_parallel)."),
    Knob(name=PP, type="int", values=(1, 2, 4, 8), default=1, semantics=D, group="pipeline", versions=VERSIONS,
         description="pipeline parallel degree: splits the layers into stages; saves memory, adds a bubble."),
    Knob(name=PP_SCHEDULE, type="choice", values=("1F1B", "Interleaved1F1B", "GPipe", "InterleavedZeroBubble",
                                                  "ZBVZeroBubble"),
         default="1F1B", semantics=D, group="pipeline", versions=VERSIONS,
         description="pipeline schedule (parallelism.pipeline_parallel_schedule); only matters with PP>1."),
    Knob(name=CP, type="int", values=(1, 2, 4, 8), default=1, semantics=D, versions=VERSIONS,
         description="context parallel degree: splits long sequences over CP GPUs (ring attention)."),
    Knob(name=DP_SHARD, type="int", values=(-1, *_DEG), default=-1, semantics=D, group="data_parallel",
         versions=VERSIONS,
         description="FSDP shard degree (-1: every GPU left after TP/PP/CP/replicate)."),
    Knob(name=DP_REPLICATE, type="int", values=_DEG, default=1, semantics=D, group="data_parallel",
         versions=VERSIONS,
         description="DDP replicate degree (HSDP when combined with sharding): less FSDP communication, more memory."),
    Knob(name=RESHARD, type="choice", values=("default", "always", "never"), default="default", semantics=P,
         group="data_parallel", versions=VERSIONS,
         description="free gathered parameters after the forward ('always'), keep them ('never': less "
                     "communication, more memory) or the default (no reshard for the last stage / PP)."),
    Knob(name=LOCAL_BATCH, type="int", values=(1, 2, 4, 8, 16), default=8, semantics=D, versions=VERSIONS,
         description="sequences per data-parallel rank per micro-batch with the global batch fixed (0.2.x "
                     "training.local_batch_size; main training.num_tokens_per_microbatch_per_dp_rank in tokens)."),
    Knob(name=AC, type="choice", values=("none", "selective", "full"), default="selective", semantics=P,
         group="activation_checkpoint", versions=VERSIONS,
         description="activation checkpointing (activation_checkpoint.mode, 0.2.x): full recomputes every layer "
                     "(~+30% compute, least memory), selective recomputes per-op, none stores everything."),
    Knob(name=COMPILE, type="bool", values=(False, True), default=False, semantics=D, versions=VERSIONS,
         description="torch.compile the model and loss (compile.enable): fused kernels, fewer launches; costs "
                     "compile time at start."),
]

#: llama3 flavors (torchtitan/models/llama3/__init__.py @ v0.2.2): layers, heads, KV heads
FLAVORS: dict[str, dict[str, int]] = {
    "debugmodel": {"layers": 6, "heads": 16, "kv_heads": 16, "dim": 256, "vocab": 2048},
    "8B": {"layers": 32, "heads": 32, "kv_heads": 8, "dim": 4096, "vocab": 128256},
    "70B": {"layers": 80, "heads": 64, "kv_heads": 8, "dim": 8192, "vocab": 128256},
    "405B": {"layers": 126, "heads": 128, "kv_heads": 8, "dim": 16384, "vocab": 128256},
}


def _world(r: Recipe) -> int:
    return r.resources.nodes * r.resources.devices_per_node


def dp_degree(r: Recipe) -> int:
    """Data-parallel degree (replicate × shard, shard -1 filled from the world size)."""
    tp, pp, cp = int(r.knob(TP)), int(r.knob(PP)), int(r.knob(CP))
    rep, shard = int(r.knob(DP_REPLICATE)), int(r.knob(DP_SHARD))
    if shard == -1:
        shard = max(1, _world(r) // (tp * pp * cp * rep))
    return rep * shard


def _grid(r: Recipe) -> str | None:
    tp, pp, cp = int(r.knob(TP)), int(r.knob(PP)), int(r.knob(CP))
    rep, shard = int(r.knob(DP_REPLICATE)), int(r.knob(DP_SHARD))
    world = _world(r)
    if shard == -1:
        if world % (tp * pp * cp * rep):
            return (f"world size {world} (resources.nodes × devices_per_node) must be divisible by "
                    f"{TP} × {PP} × {CP} × {DP_REPLICATE} ({tp * pp * cp * rep}); change one of them")
        return None
    if tp * pp * cp * rep * shard != world:
        return (f"{DP_REPLICATE} × {DP_SHARD} × {TP} × {PP} × {CP} ({rep * shard * tp * pp * cp}) must equal the "
                f"world size {world} (torchtitan ParallelDims); set {DP_SHARD}: -1 to fill it")
    return None


def _flavor(r: Recipe) -> dict[str, int] | None:
    from attune.frameworks.torchtitan.launch import read_recipe

    try:
        job = read_recipe(r)
    except Exception:  # noqa: BLE001 - reported by the framework's check()
        return None
    return FLAVORS.get(str(job.flavor)) if job.model_name == "llama3" else None


def _heads(r: Recipe) -> str | None:
    f = _flavor(r)
    tp = int(r.knob(TP))
    if f is None or tp == 1:
        return None
    if f["heads"] % tp or (f["kv_heads"] % tp and tp % f["kv_heads"]):
        return (f"{TP} {tp}: the model's {f['heads']} heads / {f['kv_heads']} KV heads do not split over {tp} ranks")
    return None


def _layers(r: Recipe) -> str | None:
    f = _flavor(r)
    pp = int(r.knob(PP))
    if f is None or pp == 1 or f["layers"] >= pp:
        return None
    return f"{PP} {pp} exceeds the model's {f['layers']} layers"


def _async(r: Recipe) -> str | None:
    if r.knob(ASYNC_TP) and (int(r.knob(TP)) <= 1 or not r.knob(COMPILE)):
        return f"{ASYNC_TP} needs {TP} > 1 and {COMPILE}: true (torchtitan asserts both)"
    return None


def _batch(r: Recipe) -> str | None:
    from attune.frameworks.torchtitan.launch import read_recipe

    try:
        job = read_recipe(r)
    except Exception:  # noqa: BLE001
        return None
    gbs = job.explicit_global_batch
    if gbs is None:
        return None
    per = int(r.knob(LOCAL_BATCH)) * dp_degree(r)
    if gbs % per:
        return (f"the global batch ({gbs} sequences) must be divisible by {LOCAL_BATCH} ({r.knob(LOCAL_BATCH)}) × "
                f"data-parallel degree ({dp_degree(r)}) for whole gradient-accumulation steps")
    return None


CONSTRAINTS = [
    Constraint("parallel_grid", (TP, PP, CP, DP_SHARD, DP_REPLICATE), _grid, "dp_rep × dp_shard × TP × PP × CP = world"),
    Constraint("heads_divisible_by_tp", (TP,), _heads, "heads and KV heads split over TP"),
    Constraint("layers_cover_pp", (PP,), _layers, "PP ≤ layers"),
    Constraint("async_tp_needs_tp_and_compile", (ASYNC_TP, TP, COMPILE), _async, "async TP: TP>1 and compile"),
    Constraint("global_batch_divisible", (LOCAL_BATCH, TP, PP, CP, DP_SHARD, DP_REPLICATE), _batch,
               "global batch % (local batch × DP) == 0"),
]


def build() -> Catalogue:
    return Catalogue(framework="torchtitan", knobs={k.name: k for k in KNOBS}, constraints=list(CONSTRAINTS),
                     version="torchtitan-0.2", versions=VERSIONS)


__all__ = ["AC", "ASYNC_TP", "COMPILE", "CP", "DP_REPLICATE", "DP_SHARD", "FLAVORS", "KNOBS", "LOCAL_BATCH", "PP",
           "PP_SCHEDULE", "RESHARD", "SPELLINGS", "TP", "VERSIONS", "build", "dp_degree"]
