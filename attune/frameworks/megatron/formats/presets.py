"""Published recipes a launch can name without spelling them out: NeMo 2 ``--factory`` names and Megatron-Bridge
``--recipe`` functions, as the settings their Python code sets (attune cannot import NeMo or Bridge here).

Each preset is the flattened mapping of the config the function builds (``section.field: value``) for the fields
attune reads; the launch's own overrides are applied on top. Only what the cited source sets is listed; a field it
leaves to the framework default is absent (the format's default applies). A recipe name not listed here cannot be
imported from its name: give its settings (for Bridge, a ``--config-file`` dump of the ``ConfigContainer``).
"""

from __future__ import annotations

from typing import Any

# ------------------------------------------------------------------------------------------------ NeMo 2

_NEMO_ADAM = {  # nemo/collections/llm/recipes/optim/adam.py: distributed_fused_adam_with_cosine_annealing(max_lr=3e-4)
    "optim.config.optimizer": "adam", "optim.config.lr": 3e-4, "optim.config.weight_decay": 0.1,
    "optim.config.adam_beta1": 0.9, "optim.config.adam_beta2": 0.95, "optim.config.adam_eps": 1e-5,
    "optim.config.use_distributed_optimizer": True, "optim.config.clip_grad": 1.0,
    "optim.config.bf16": True, "optim.lr_scheduler.warmup_steps": 2000, "optim.lr_scheduler.min_lr": 3e-5,
}
_LLAMA3_8B = {"model.config.num_layers": 32, "model.config.hidden_size": 4096, "model.config.num_attention_heads": 32,
              "model.config.num_query_groups": 8, "model.config.ffn_hidden_size": 14336,
              "model.config.seq_length": 8192, "model.config.share_embeddings_and_output_weights": False,
              "model.config.gated_linear_unit": True}
_LLAMA3_70B = {**_LLAMA3_8B, "model.config.num_layers": 80, "model.config.hidden_size": 8192,
               "model.config.num_attention_heads": 64, "model.config.ffn_hidden_size": 28672}

#: NeMo 2 ``nemo llm pretrain --factory NAME``: NVIDIA/NeMo ``nemo/collections/llm/recipes/llama3_8b.py``
#: (@ 0061796) and ``llama3_70b.py`` (@ 0189a3b); the trainer's ``bf16_mixed()`` plugin reduces gradients in FP32;
#: the Llama-3 tokenizer has 128256 tokens (``Llama3Config8B``/``70B`` take it from the tokenizer)
NEMO_FACTORIES: dict[str, dict[str, Any]] = {
    "llama3_8b": {
        **_LLAMA3_8B, **_NEMO_ADAM, "model.config.vocab_size": 128256, "model._target_": "Llama3Config8B",
        "trainer.strategy.tensor_model_parallel_size": 1, "trainer.strategy.pipeline_model_parallel_size": 1,
        "trainer.strategy.virtual_pipeline_model_parallel_size": None, "trainer.strategy.context_parallel_size": 2,
        "trainer.strategy.sequence_parallel": False, "trainer.num_nodes": 1, "trainer.devices": 8,
        "trainer.max_steps": 1168251, "trainer.log_every_n_steps": 10, "trainer.val_check_interval": 2000,
        "trainer.limit_val_batches": 32, "trainer.plugins.grad_reduce_in_fp32": True,
        "data.seq_length": 8192, "data.global_batch_size": 512, "data.micro_batch_size": 1,
    },
    "llama3_70b": {
        **_LLAMA3_70B, **_NEMO_ADAM, "model.config.vocab_size": 128256, "model._target_": "Llama3Config70B",
        "trainer.strategy.tensor_model_parallel_size": 4, "trainer.strategy.pipeline_model_parallel_size": 4,
        "trainer.strategy.virtual_pipeline_model_parallel_size": 5, "trainer.strategy.context_parallel_size": 2,
        "trainer.strategy.sequence_parallel": True, "trainer.strategy.ddp.overlap_grad_reduce": True,
        "trainer.strategy.ddp.overlap_param_gather": True, "trainer.strategy.ddp.grad_reduce_in_fp32": True,
        "trainer.num_nodes": 4, "trainer.devices": 8, "trainer.max_steps": 1168251,
        "trainer.log_every_n_steps": 10, "trainer.val_check_interval": 2000, "trainer.limit_val_batches": 32,
        "trainer.plugins.grad_reduce_in_fp32": True,
        "data.seq_length": 8192, "data.global_batch_size": 512, "data.micro_batch_size": 1,
    },
}

# ------------------------------------------------------------------------------------------------ Megatron-Bridge

_BRIDGE_COMMON = {  # src/megatron/bridge/recipes/common.py _pretrain_common (@ 067f987)
    "optimizer.optimizer": "adam", "optimizer.lr": 3e-4, "optimizer.min_lr": 3e-5, "optimizer.weight_decay": 0.1,
    "optimizer.adam_beta1": 0.9, "optimizer.adam_beta2": 0.95, "optimizer.adam_eps": 1e-5,
    "optimizer.clip_grad": 1.0, "optimizer.use_distributed_optimizer": True, "optimizer.bf16": True,
    "scheduler.lr_decay_style": "cosine", "rng.seed": 1234, "dataset.mock": True,
    "ddp.use_distributed_optimizer": True, "ddp.overlap_grad_reduce": True, "ddp.overlap_param_gather": True,
    "mixed_precision.bf16": True,
}
_BRIDGE_PERF = {  # src/megatron/bridge/perf_recipes/_common.py _benchmark_common + _perf_precision("bf16")
    "train.train_iters": 50, "train.eval_iters": 0, "train.manual_gc": True, "train.manual_gc_interval": 100,
    "checkpoint.save": None, "checkpoint.load": None, "logger.log_interval": 1,
    "scheduler.lr_decay_iters": 50, "scheduler.lr_warmup_iters": 10,
    "mixed_precision.grad_reduce_in_fp32": False, "ddp.grad_reduce_in_fp32": False,
    "model.cross_entropy_fusion_impl": "te", "model.moe_token_dispatcher_type": "alltoall",
    "model.should_pad_vocab": True, "tokenizer.vocab_size": 128256, "model.vocab_size": 128256,
    "model.cuda_graph_impl": "none", "model.recompute_granularity": None,
}
_BRIDGE_LLAMA3_8B = {  # AutoBridge.from_hf_pretrained("meta-llama/Meta-Llama-3-8B") model fields
    "model._target_": "megatron.bridge.models.llama.llama_provider.Llama3ModelProvider",
    "model.num_layers": 32, "model.hidden_size": 4096, "model.num_attention_heads": 32, "model.num_query_groups": 8,
    "model.ffn_hidden_size": 14336, "model.gated_linear_unit": True, "model.share_embeddings_and_output_weights": False,
    "model.seq_length": 8192, "dataset.seq_length": 8192,
}
_BRIDGE_LLAMA3_70B = {**_BRIDGE_LLAMA3_8B, "model.num_layers": 80, "model.hidden_size": 8192,
                      "model.num_attention_heads": 64, "model.ffn_hidden_size": 28672}
_PERF_ENV_H100 = {  # cfg.env_vars of the H100 perf recipes (COMMON_PERF_ENV_VARS + the recipe's own)
    "TORCH_NCCL_HIGH_PRIORITY": "1", "CUDA_DEVICE_MAX_CONNECTIONS": "1", "NCCL_GRAPH_REGISTER": "0",
    "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "TORCH_NCCL_AVOID_RECORD_STREAMS": "1",
    "NCCL_NVLS_ENABLE": "0", "NVTE_BWD_LAYERNORM_SM_MARGIN": "20", "NVTE_FWD_LAYERNORM_SM_MARGIN": "20",
}

#: Megatron-Bridge ``run_recipe.py --recipe NAME``: ``src/megatron/bridge/perf_recipes/llama/h100/llama3.py``
#: (@ 067f987) on top of ``recipes/llama/h100/llama3.py`` (the 2-GPU 8B / 32-GPU 70B base recipes)
BRIDGE_RECIPES: dict[str, dict[str, Any]] = {
    "llama3_8b_pretrain_8gpu_h100_bf16_config": {
        **_BRIDGE_COMMON, **_BRIDGE_LLAMA3_8B, **_BRIDGE_PERF,
        "model.tensor_model_parallel_size": 1, "model.pipeline_model_parallel_size": 1,
        "model.context_parallel_size": 2, "model.virtual_pipeline_model_parallel_size": None,
        "model.sequence_parallel": False, "train.global_batch_size": 128, "train.micro_batch_size": 1,
        "comm_overlap.tp_comm_overlap": False,
    },
    "llama3_70b_pretrain_64gpu_h100_bf16_config": {
        **_BRIDGE_COMMON, **_BRIDGE_LLAMA3_70B, **_BRIDGE_PERF,
        "model.tensor_model_parallel_size": 4, "model.pipeline_model_parallel_size": 4,
        "model.context_parallel_size": 2, "model.virtual_pipeline_model_parallel_size": 5,
        "model.sequence_parallel": True, "train.global_batch_size": 256, "train.micro_batch_size": 1,
        "comm_overlap.tp_comm_overlap": True, "optimizer.overlap_param_gather_with_optimizer_step": True,
    },
}
#: the environment each Bridge perf recipe asks its launcher to set (``cfg.env_vars``)
BRIDGE_ENV: dict[str, dict[str, str]] = {
    "llama3_8b_pretrain_8gpu_h100_bf16_config": _PERF_ENV_H100,
    "llama3_70b_pretrain_64gpu_h100_bf16_config": {**_PERF_ENV_H100, "NCCL_P2P_NET_CHUNKSIZE": "2097152"},
}

__all__ = ["BRIDGE_ENV", "BRIDGE_RECIPES", "NEMO_FACTORIES"]
