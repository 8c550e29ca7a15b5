"""Knob catalogue of HuggingFace ``Trainer`` launches (``framework: hf``): ``TrainingArguments`` flags and the
launcher's process count, with the contract settings and their HF defaults.

Flag names and defaults checked against the installed transformers 5.24.0 (``HfArgumentParser`` of
``TrainingArguments``) and the wheels of 4.40.0, 4.45.0, 4.50.0, 4.54.0, 4.55.0, 4.56.0, 4.57.6, 5.12.0, 5.18.0,
5.21.0, 5.22.0, 5.22.2 and 5.23.0:

- activation checkpointing is ``--gradient_checkpointing`` up to 5.22; 5.23 added ``--activation_checkpointing``
  and kept ``--gradient_checkpointing`` as a deprecated alias (FutureWarning, "will be removed in v6");
- the default ``optim`` is ``adamw_torch`` up to 4.54 and, from 4.55, ``adamw_torch_fused`` when torch ≥ 2.8;
- ``warmup_ratio`` is its own setting in 4.x, a deprecated alias of a fractional ``warmup_steps`` in 5.12 and gone
  by 5.18 (``warmup_steps`` below 1 is a fraction of the run there).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from attune.frameworks.common import processes_fit_problem
from attune.recipe.catalogue import Catalogue, Constraint, Knob, Semantics

if TYPE_CHECKING:
    from attune.recipe.model import Recipe

D = Semantics.NUMERICS_DRIFT
P = Semantics.PRESERVING
VERSIONS = ">=4.40,<6"

PER_DEVICE = "per_device_train_batch_size"
ACCUMULATION = "gradient_accumulation_steps"
NPROC = "nproc_per_node"
CHECKPOINTING = "gradient_checkpointing"
CHECKPOINTING_V5 = "activation_checkpointing"  # transformers >= 5.23
OPTIM = "optim"
ADAMW = ("adamw_torch", "adamw_torch_fused")
#: every ``OptimizerNames`` value of transformers 5.24 (the knob moves only between the AdamW implementations;
#: the rest are listed so a launch with another optimizer imports, and its optimizer stays as it is)
OTHER_OPTIMIZERS = (
    "adamw_torch_xla", "adamw_torch_npu_fused", "adafactor", "adamw_anyprecision", "adamw_torch_4bit",
    "adamw_torch_8bit", "ademamix", "sgd", "adagrad", "adamw_bnb_8bit", "adamw_8bit", "ademamix_8bit", "lion_8bit",
    "lion_32bit", "paged_adamw_32bit", "paged_adamw_8bit", "paged_ademamix_32bit", "paged_ademamix_8bit",
    "paged_lion_32bit", "paged_lion_8bit", "rmsprop", "rmsprop_bnb", "rmsprop_bnb_8bit", "rmsprop_bnb_32bit",
    "galore_adamw", "galore_adamw_8bit", "galore_adafactor", "galore_adamw_layerwise", "galore_adamw_8bit_layerwise",
    "galore_adafactor_layerwise", "lomo", "adalomo", "grokadamw", "schedule_free_radam", "schedule_free_adamw",
    "schedule_free_sgd", "apollo_adamw", "apollo_adamw_layerwise", "stable_adamw",
)
OMP_ENV = "env.OMP_NUM_THREADS"

#: knob → the TrainingArguments flag it sets (nproc_per_node and env knobs are the launcher's / environment's)
FLAG_KNOBS = (PER_DEVICE, CHECKPOINTING, "dataloader_num_workers", OPTIM, "torch_compile", "ddp_bucket_cap_mb",
              "ddp_find_unused_parameters", "dataloader_pin_memory")
#: flags a knob controls (they are not frozen: the knob's value is the setting)
KNOB_FLAGS = frozenset({*FLAG_KNOBS, CHECKPOINTING_V5, ACCUMULATION})

#: contract settings with their HF defaults and value types (the defaults have been the same from 4.40 to 5.24)
CONTRACT: dict[str, tuple[str, Any]] = {
    "learning_rate": ("float", 5e-5),
    "lr_scheduler_type": ("str", "linear"),
    "warmup_steps": ("float", 0),
    "warmup_ratio": ("float", 0.0),
    "weight_decay": ("float", 0.0),
    "max_steps": ("int", -1),
    "num_train_epochs": ("float", 3.0),
    "seed": ("int", 42),
    "data_seed": ("int?", None),
    "bf16": ("bool", False),
    "fp16": ("bool", False),
    "tf32": ("bool?", None),
    "max_grad_norm": ("float", 1.0),
    "adam_beta1": ("float", 0.9),
    "adam_beta2": ("float", 0.999),
    "adam_epsilon": ("float", 1e-8),
}

KNOBS = [
    Knob(name=PER_DEVICE, type="int", values=(1, 2, 4, 8, 16, 32, 64), default=8, semantics=D, group="batch_split",
         description="--per_device_train_batch_size: sequences per forward/backward on each process. "
                     "--gradient_accumulation_steps is derived so the global batch (per-device × accumulation × "
                     "processes) stays fixed. Larger means bigger GEMMs and fewer launches, more activation memory."),
    Knob(name=NPROC, type="int", values=(1, 2, 4, 8), default=1, semantics=D, group="batch_split",
         description="data-parallel processes per node: torchrun --nproc_per_node, accelerate launch "
                     "--num_processes; a python launch with more than one becomes python -m torch.distributed.run "
                     "--standalone --nproc_per_node N. Each process takes a slice of the global batch; gradients "
                     "are all-reduced (gloo on CPU)."),
    Knob(name=CHECKPOINTING, type="bool", values=(False, True), default=False, semantics=P, versions=VERSIONS,
         description="recompute activations in backward instead of storing them (saves memory, costs compute). "
                     "The flag is --gradient_checkpointing in transformers 4.40-5.22; 5.23 renamed it "
                     "--activation_checkpointing and keeps --gradient_checkpointing as a deprecated alias until "
                     "v6. attune edits the name the launch already uses, else the one its version prefers. TRL's "
                     "configs (trl sft ...) turn it on by default."),
    Knob(name="dataloader_num_workers", type="int", values=(0, 1, 2, 4), default=0, semantics=D,
         description="--dataloader_num_workers: background data-loader processes per training process "
                     "(0 loads batches in the training loop). Owes the loss-equivalence check: a dataset that draws "
                     "from the global random generator (augmentation, random crops, masking) draws other numbers "
                     "in worker processes, so workers are not preserving for every script."),
    Knob(name=OPTIM, type="choice", values=(*ADAMW, *OTHER_OPTIMIZERS), default="adamw_torch_fused", semantics=D,
         description="--optim: the AdamW implementation, adamw_torch (foreach) or adamw_torch_fused (one fused "
                     "kernel). Only these two are interchangeable: a launch with another optimizer keeps it. "
                     "Default: adamw_torch_fused from transformers 4.55 with torch >= 2.8, else adamw_torch."),
    Knob(name="torch_compile", type="bool", values=(False, True), default=False, semantics=D, compiles=(True,),
         description="--torch_compile: compile the model with torch.compile (inductor). Fuses kernels; the first "
                     "step pays the compilation (minutes on CPU)."),
    Knob(name="ddp_bucket_cap_mb", type="choice", values=(None, 5, 10, 25, 50, 100), default=None, semantics=D,
         description="--ddp_bucket_cap_mb: DDP gradient bucket size in MB (null: the HF/PyTorch default, 25). "
                     "Smaller buckets start the all-reduce earlier, larger ones make fewer messages. Multi-process "
                     "only."),
    Knob(name="ddp_find_unused_parameters", type="choice", values=(None, False, True), default=None, semantics=P,
         description="--ddp_find_unused_parameters (null: HF's default, true unless activation checkpointing is "
                     "on). True costs an extra traversal of the autograd graph every step; false fails loudly if "
                     "the model really has unused parameters. Multi-process only."),
    Knob(name="dataloader_pin_memory", type="bool", values=(False, True), default=True, semantics=P,
         description="--dataloader_pin_memory: page-locked host batches for faster host-to-GPU copies "
                     "(no effect on CPU; --use_cpu turns it off)."),
    Knob(name=OMP_ENV, type="choice", values=("", "1", "2", "4", "8", "16"), default="", semantics=D,
         description="OpenMP threads per process ('' lets attune use the CPU slots divided by the processes)."),
]


def _launch_problem(r: Recipe) -> tuple[Any, str | None]:
    from attune.frameworks.hf import settings

    try:
        return settings.read(r), None
    except Exception as err:  # noqa: BLE001 - reported by Framework.check; constraints stay quiet
        return None, str(err)


def _batch_divisible(r: Recipe) -> str | None:
    s, _ = _launch_problem(r)
    if s is None:
        return None
    pd, world = int(r.knob(PER_DEVICE)), int(r.knob(NPROC)) * s.nnodes
    if s.global_batch % (pd * world) == 0:
        return None
    legal = [m for m in r.catalogue[PER_DEVICE].values if isinstance(m, int) and s.global_batch % (m * world) == 0]
    procs = [n for n in r.catalogue[NPROC].values if isinstance(n, int) and s.global_batch % (pd * n * s.nnodes) == 0]
    return (f"the launch's global batch ({s.global_batch} = {s.per_device} per device × {s.accumulation} "
            f"accumulation × {s.world} processes) must be divisible by {PER_DEVICE} ({pd}) × processes ({world}) "
            f"so {ACCUMULATION} can keep it; legal {PER_DEVICE} here: {legal}, legal {NPROC} here: {procs}")


def _procs_fit(r: Recipe) -> str | None:
    return processes_fit_problem(r, NPROC)


def _optimizer_family(r: Recipe) -> str | None:
    s, _ = _launch_problem(r)
    if s is None:
        return None
    new, own = r.knob(OPTIM), s.knob_values.get(OPTIM)
    if new == own or (new in ADAMW and own in ADAMW):
        return None
    return (f"--optim {own} → {new} changes the optimizer, which decides what is learned; only the AdamW "
            f"implementations {', '.join(ADAMW)} are interchangeable; restore {OPTIM} to {own}")


def _compile_flags(r: Recipe) -> str | None:
    s, _ = _launch_problem(r)
    if s is None or r.knob("torch_compile") or not s.compile_forced:
        return None
    return ("the launch sets --torch_compile_mode or --torch_compile_backend, which turn torch_compile on in HF; "
            "torch_compile cannot be false for it")


def _threads_fit(r: Recipe) -> str | None:
    t, n = r.knob(OMP_ENV), int(r.knob(NPROC))
    if r.resources.accelerator == "cpu" and t and int(t) * n > 2 * r.resources.devices_per_node:
        return (f"{OMP_ENV} ({t}) × {NPROC} ({n}) oversubscribes the {r.resources.devices_per_node} CPU slots "
                "more than twice; lower it")
    return None


CONSTRAINTS = [
    Constraint("global_batch_divisible", (PER_DEVICE, NPROC), _batch_divisible,
               "global batch = per-device batch × accumulation × processes, accumulation derived"),
    Constraint("processes_fit_devices", (NPROC,), _procs_fit, "one process per device slot"),
    Constraint("optimizer_family_fixed", (OPTIM,), _optimizer_family,
               "only the AdamW implementations are interchangeable"),
    Constraint("compile_flags_consistent", ("torch_compile",), _compile_flags,
               "--torch_compile_mode/--torch_compile_backend imply torch_compile"),
    Constraint("threads_fit_cores", (OMP_ENV, NPROC), _threads_fit, "threads × processes within twice the CPU slots"),
]


def build() -> Catalogue:
    return Catalogue(framework="hf", knobs={k.name: k for k in KNOBS}, constraints=list(CONSTRAINTS),
                     versions=VERSIONS)
