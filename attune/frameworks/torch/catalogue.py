"""Knob catalogue of attune's reference trainer (``framework: torch``).

Measured on a 2-core CPU (see README): DDP over 2 processes beats 1 process × 2 threads by 7–23 %,
activation checkpointing costs 6–27 %, micro-batch 1 costs ~10 % against 4, torch.compile gains 3–8 %.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from attune.frameworks.common import batch_split_problem, processes_fit_problem
from attune.recipe.catalogue import Catalogue, Constraint, Knob, Semantics

if TYPE_CHECKING:
    from attune.recipe.model import Recipe

D = Semantics.NUMERICS_DRIFT
P = Semantics.PRESERVING

KNOBS = [
    Knob(name="micro_batch_size", type="int", values=(1, 2, 4, 8, 16, 32, 64), default=1, semantics=D,
         group="batch_split",
         description="sequences per forward/backward; gradient accumulation is derived so the global batch "
                     "stays fixed. Larger means bigger GEMMs and fewer launches, more activation memory."),
    Knob(name="nproc_per_node", type="int", values=(1, 2, 4, 8, 16), default=1, semantics=D, group="batch_split",
         description="data-parallel processes per node (torchrun --nproc_per_node); each processes a "
                     "slice of the global batch, gradients are all-reduced."),
    Knob(name="dp_strategy", type="choice", values=("ddp", "fsdp", "fsdp_no_reshard"), default="ddp", semantics=D,
         description="data-parallel wrapper: DDP replicates parameters; FSDP (fully_shard) shards them and "
                     "re-gathers per layer (fsdp_no_reshard keeps them gathered after forward, ZeRO-2-like)."),
    Knob(name="ddp_bucket_cap_mb", type="int", values=(1, 5, 10, 25, 50, 100), default=25, semantics=D,
         description="DDP gradient bucket size in MB: smaller buckets start all-reduce earlier (more overlap), "
                     "larger ones make fewer, bigger messages."),
    Knob(name="activation_checkpointing", type="choice", values=("none", "selective", "full"), default="none",
         semantics=P,
         description="recompute activations in backward instead of storing them: selective recomputes the MLP, "
                     "full recomputes whole blocks. Saves memory, costs compute."),
    Knob(name="compile_mode", type="choice", values=("none", "default", "max-autotune-no-cudagraphs"),
         default="none", semantics=D, compiles=("default", "max-autotune-no-cudagraphs"),
         description="torch.compile mode for the model (none disables). Fuses kernels; the first step pays "
                     "compilation."),
    Knob(name="intra_op_threads", type="int", values=(0, 1, 2, 4, 8, 16), default=0, semantics=D,
         description="torch intra-op threads per process (0: cores divided by processes)."),
    Knob(name="optimizer_impl", type="choice", values=("for_loop", "foreach", "fused"), default="foreach",
         semantics=D,
         description="optimizer kernel implementation: per-tensor loop, multi-tensor foreach, or fused."),
    Knob(name="dataloader_workers", type="int", values=(0, 1, 2, 4), default=0, semantics=P,
         description="background data-loader worker processes (0: load in the training process)."),
    Knob(name="matmul_precision", type="choice", values=("highest", "high", "medium"), default="highest",
         semantics=Semantics.NUMERICS_CHANGING, numerics_class="tf32", changing_values=("high", "medium"),
         description="torch.set_float32_matmul_precision: high/medium let fp32 matmuls run in TF32/BF16. "
                     "Changes numerics by design; needs numerics_opt_in: [tf32]."),
    Knob(name="env.TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", type="choice", values=("0", "1"), default="0",
         semantics=Semantics.NUMERICS_CHANGING, numerics_class="tf32", changing_values=("1",),
         description="environment variable that forces TF32 in cuBLAS fp32 matmuls. Needs numerics_opt_in: [tf32]."),
    Knob(name="env.OMP_NUM_THREADS", type="choice", values=("", "1", "2", "4", "8", "16"), default="",
         semantics=D, description="OpenMP threads of each process ('' leaves it to torchrun)."),
]


def _dp_degree(r: Recipe) -> int:
    return int(r.knob("nproc_per_node")) * r.resources.nodes


def _batch_divisible(r: Recipe) -> str | None:
    return batch_split_problem(r, _dp_degree(r))


def _procs_fit(r: Recipe) -> str | None:
    return processes_fit_problem(r, "nproc_per_node")


def _threads_fit(r: Recipe) -> str | None:
    t, n = int(r.knob("intra_op_threads")), int(r.knob("nproc_per_node"))
    if r.resources.accelerator == "cpu" and t * n > 2 * r.resources.devices_per_node:
        return (f"intra_op_threads ({t}) × nproc_per_node ({n}) oversubscribes the "
                f"{r.resources.devices_per_node} CPU slots more than twice; lower intra_op_threads")
    return None


CONSTRAINTS = [
    Constraint("global_batch_divisible", ("micro_batch_size", "nproc_per_node"), _batch_divisible,
               "global batch = micro-batch × data-parallel × accumulation"),
    Constraint("processes_fit_devices", ("nproc_per_node",), _procs_fit,
               "one process per device slot"),
    Constraint("threads_fit_cores", ("intra_op_threads", "nproc_per_node"), _threads_fit,
               "threads × processes within twice the CPU slots"),
]


def build() -> Catalogue:
    return Catalogue(framework="torch", knobs={k.name: k for k in KNOBS}, constraints=list(CONSTRAINTS),
                     versions=">=2.4")
