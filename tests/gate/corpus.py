"""The gate corpus: proposed changes as data, each with the verdict the gate must give.

Each record: ``id``, ``base`` (a name in :mod:`tests.gate.recipes`), ``sets`` (``PATH=VALUE`` strings, as on
the CLI), ``admitted``, and either ``code`` (a reason code the refusal must carry, plus optionally
``field``, the field it must name) or ``owed`` (the exact checks an admitted change owes).
"""

from __future__ import annotations

from typing import Any

LE = ["loss_equivalence"]


def ok(id: str, base: str, sets: list[str], owed: list[str]) -> dict[str, Any]:
    return {"id": id, "base": base, "sets": sets, "admitted": True, "owed": owed}


def no(id: str, base: str, sets: list[str], code: str, field: str | None = None) -> dict[str, Any]:
    return {"id": id, "base": base, "sets": sets, "admitted": False, "code": code, "field": field}


CORPUS: list[dict[str, Any]] = [
    # ---- torch: preserving / drifting knobs are admitted --------------------------------------------------
    ok("torch-mbs-2", "tiny", ["micro_batch_size=2"], LE),
    ok("torch-mbs-8-knobs-path", "tiny", ["knobs.micro_batch_size=8"], LE),
    ok("torch-nproc-2", "tiny", ["nproc_per_node=2"], LE),
    ok("torch-coupled-batch-split", "tiny", ["micro_batch_size=2", "nproc_per_node=2"], LE),
    ok("torch-ckpt-none", "tiny", ["activation_checkpointing=none"], []),
    ok("torch-ckpt-selective", "tiny", ["activation_checkpointing=selective"], []),
    ok("torch-dataloader-workers", "tiny", ["dataloader_workers=2"], []),
    ok("torch-compile", "tiny", ["compile_mode=default"], LE),
    ok("torch-optimizer-fused", "tiny", ["optimizer_impl=fused"], LE),
    ok("torch-threads-2", "tiny", ["intra_op_threads=2"], LE),
    ok("torch-fsdp", "tiny", ["dp_strategy=fsdp"], LE),
    ok("torch-bucket", "tiny", ["ddp_bucket_cap_mb=5"], LE),
    ok("torch-env-omp", "tiny", ["env.OMP_NUM_THREADS=2"], LE),
    ok("torch-matmul-highest-is-default", "tiny", ["matmul_precision=highest"], []),
    ok("torch-kv-groups-equal-heads-is-same-model", "tiny", ["model.kv_groups=4"], []),
    ok("torch-rename-is-not-contract", "tiny", ["name=renamed"], []),
    ok("torch-tuning-is-not-contract", "tiny", ["tuning.measure_steps=10"], []),
    ok("torch-nothing-changed", "tiny", [], []),
    # ---- torch: numerics-changing knobs need the owner's opt-in -------------------------------------------
    no("torch-tf32-matmul-high", "tiny", ["matmul_precision=high"], "numerics_not_opted_in", "knobs.matmul_precision"),
    no("torch-tf32-matmul-medium", "tiny", ["matmul_precision=medium"], "numerics_not_opted_in"),
    no("torch-tf32-env", "tiny", ["env.TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1"], "numerics_not_opted_in",
       "knobs.env.TORCH_ALLOW_TF32_CUBLAS_OVERRIDE"),
    ok("torch-optin-matmul-high", "tiny_optin", ["matmul_precision=high"], LE),
    ok("torch-optin-tf32-env", "tiny_optin", ["env.TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1"], LE),
    no("torch-self-granted-opt-in", "tiny", ["training.numerics_opt_in=[tf32]", "matmul_precision=high"],
       "opt_in_changed", "training.numerics_opt_in"),
    no("torch-widened-opt-in", "tiny_optin", ["training.numerics_opt_in=[tf32, fp8]"], "invalid_recipe",
       "training.numerics_opt_in"),  # fp8 is no numerics class of the torch catalogue
    # ---- torch: direct contract edits ---------------------------------------------------------------------
    no("torch-lr", "tiny", ["training.optimizer.lr=1e-3"], "contract", "training.optimizer.lr"),
    no("torch-global-batch", "tiny", ["training.global_batch_size=16"], "contract", "training.global_batch_size"),
    no("torch-seq", "tiny", ["training.seq_length=512"], "contract", "training.seq_length"),
    no("torch-init-seed", "tiny", ["training.seed=1"], "contract", "training.seed"),
    no("torch-data-seed", "tiny", ["training.data.seed=7"], "contract", "training.data.seed"),
    no("torch-data-order", "tiny", ["training.data.order=shuffled"], "contract", "training.data.order"),
    no("torch-precision", "tiny", ["training.precision=bf16"], "contract", "training.precision"),
    no("torch-dropout", "tiny", ["training.dropout=0.1"], "contract", "training.dropout"),
    no("torch-steps", "tiny", ["training.steps=2000"], "contract", "training.steps"),
    no("torch-warmup", "tiny", ["training.schedule.warmup_steps=100"], "contract", "training.schedule.warmup_steps"),
    no("torch-schedule", "tiny", ["training.schedule.name=linear"], "contract", "training.schedule.name"),
    no("torch-weight-decay", "tiny", ["training.optimizer.weight_decay=0.1"], "contract"),
    no("torch-no-clip", "tiny", ["training.optimizer.grad_clip=null"], "contract", "training.optimizer.grad_clip"),
    no("torch-betas", "tiny", ["training.optimizer.betas=[0.9, 0.999]"], "contract", "training.optimizer.betas"),
    no("torch-optimizer-name", "tiny", ["training.optimizer.name=sgd"], "contract", "training.optimizer.name"),
    no("torch-layers", "tiny", ["model.layers=8"], "contract", "model.layers"),
    no("torch-vocab", "tiny", ["model.vocab_size=8192"], "contract", "model.vocab_size"),
    no("torch-width", "tiny", ["model.hidden_size=512"], "contract", "model.hidden_size"),
    no("torch-gqa", "tiny", ["model.kv_groups=2"], "contract", "model.kv_groups"),
    no("torch-tied", "tiny", ["model.tied_embeddings=true"], "contract", "model.tied_embeddings"),
    no("torch-framework", "tiny", ["framework=megatron"], "contract", "framework"),
    # ---- torch: indirect and sneaky changes ---------------------------------------------------------------
    no("torch-mbs-not-dividing", "tiny", ["micro_batch_size=16"], "constraint"),
    no("torch-mbs-illegal", "tiny", ["micro_batch_size=3"], "illegal_value", "knobs.micro_batch_size"),
    no("torch-mbs-up-gbs-down", "tiny", ["micro_batch_size=2", "training.global_batch_size=4"], "contract",
       "training.global_batch_size"),
    no("torch-mbs-and-gbs-both-up", "tiny", ["micro_batch_size=16", "training.global_batch_size=16"], "contract",
       "training.global_batch_size"),
    no("torch-same-tokens-per-step", "tiny", ["training.seq_length=512", "training.global_batch_size=4"],
       "contract", "training.seq_length"),
    no("torch-precision-plus-knob", "tiny", ["training.precision=bf16", "compile_mode=default"], "contract",
       "training.precision"),
    no("torch-unknown-knob", "tiny", ["foo=1"], "unknown_knob", "knobs.foo"),
    no("torch-unknown-env-tf32", "tiny", ["env.NVIDIA_TF32_OVERRIDE=1"], "unknown_knob"),
    no("torch-unknown-fused-adam", "tiny", ["knobs.fused_adam=true"], "unknown_knob"),
    no("torch-two-groups", "tiny", ["micro_batch_size=2", "activation_checkpointing=none"], "multiple_groups"),
    no("torch-two-groups-drift", "tiny", ["compile_mode=default", "optimizer_impl=fused"], "multiple_groups"),
    no("torch-knob-plus-resources", "tiny", ["compile_mode=default", "resources.devices_per_node=4"],
       "multiple_groups"),
    ok("torch-more-devices", "tiny", ["resources.devices_per_node=4"], LE),
    no("torch-procs-exceed-devices", "tiny", ["nproc_per_node=4"], "constraint"),
    no("torch-threads-oversubscribe", "tiny", ["intra_op_threads=16"], "constraint"),
    no("torch-invalid-contract-type", "tiny", ["training.global_batch_size=abc"], "invalid_recipe",
       "training.global_batch_size"),
    no("torch-tokens-without-path", "tiny", ["training.data.source=tokens"], "invalid_recipe"),
    # ---- megatron: layout knobs ---------------------------------------------------------------------------
    ok("mcore-tp-2-keeps-vocab", "megatron", ["tensor_model_parallel_size=2"], LE),
    no("mcore-tp-4-pads-vocab", "megatron", ["tensor_model_parallel_size=4"], "contract", "model.padded_vocab_size"),
    no("mcore-tp-8-pads-vocab", "megatron", ["tensor_model_parallel_size=8"], "contract", "model.padded_vocab_size"),
    no("mcore-tp-16-kv-groups", "megatron", ["tensor_model_parallel_size=16"], "constraint"),
    ok("mcore-pp-2", "megatron", ["pipeline_model_parallel_size=2"], LE),
    ok("mcore-cp-2", "megatron", ["context_parallel_size=2"], LE),
    no("mcore-cp-16-world", "megatron", ["context_parallel_size=16"], "constraint"),
    no("mcore-two-groups", "megatron", ["tensor_model_parallel_size=2", "pipeline_model_parallel_size=2"],
       "multiple_groups"),
    ok("mcore-recompute-selective", "megatron", ["recompute_granularity=selective"], []),
    ok("mcore-distributed-optimizer", "megatron", ["use_distributed_optimizer=true"], LE),
    ok("mcore-overlap-grad-reduce", "megatron", ["overlap_grad_reduce=true"], []),
    ok("mcore-manual-gc", "megatron", ["manual_gc=true"], []),
    ok("mcore-nvls-off", "megatron", ["env.NCCL_NVLS_ENABLE=0"], LE),
    ok("mcore-ln-sm-margin", "megatron", ["env.NVTE_FWD_LAYERNORM_SM_MARGIN=16"], []),
    ok("mcore-mbs-2", "megatron", ["micro_batch_size=2"], LE),
    no("mcore-mbs-not-dividing", "megatron", ["micro_batch_size=16"], "constraint"),
    no("mcore-mbs-up-gbs-down", "megatron", ["micro_batch_size=2", "training.global_batch_size=32"], "contract",
       "training.global_batch_size"),
    no("mcore-vocab-divisor-changes-padding", "megatron", ["make_vocab_size_divisible_by=1024"], "contract",
       "model.padded_vocab_size"),
    ok("mcore-vocab-divisor-keeps-padding", "megatron", ["make_vocab_size_divisible_by=64"], []),
    ok("mcore-tp-4-with-vocab-divisor", "megatron", ["tensor_model_parallel_size=4", "make_vocab_size_divisible_by=64"],
       LE),
    no("mcore-fp8-no-opt-in", "megatron", ["fp8=hybrid"], "numerics_not_opted_in", "knobs.fp8"),
    no("mcore-bf16-grad-reduce-no-opt-in", "megatron", ["grad_reduce_in_bf16=true"], "numerics_not_opted_in"),
    ok("mcore-fp8-opted-in", "megatron_optin", ["fp8=hybrid"], LE),
    ok("mcore-bf16-grad-reduce-opted-in", "megatron_optin", ["grad_reduce_in_bf16=true"], LE),
    no("mcore-precision-fp8-contract", "megatron_optin", ["training.precision=fp8"], "contract",
       "training.precision"),
    no("mcore-lr-min-ratio", "megatron", ["training.schedule.min_lr_ratio=0.0"], "contract"),
    ok("mcore-moe-ep-2", "megatron_moe", ["expert_model_parallel_size=2"], LE),
    no("mcore-moe-ep-16", "megatron_moe", ["expert_model_parallel_size=16"], "constraint"),
    no("mcore-moe-top-k", "megatron_moe", ["model.moe_top_k=1"], "contract", "model.moe_top_k"),
    no("mcore-moe-experts", "megatron_moe", ["model.moe_experts=16"], "contract", "model.moe_experts"),
]
