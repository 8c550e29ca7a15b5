#!/bin/bash
# NVIDIA's Llama-3 8B BF16 performance recipe (8 H100) as a Megatron-Bridge YAML config, launched with the tutorial's
# YAML entry point (NVIDIA-NeMo/Megatron-Bridge tutorials/recipes/llama/02_pretrain_with_yaml.py, run from the
# Bridge repository). The same recipe by name: scripts/training/run_recipe.py --recipe
# llama3_8b_pretrain_8gpu_h100_bf16_config. Import: python make_recipe.py llama3_8b.sh
exec torchrun --nproc_per_node 8 --nnodes 1 tutorials/recipes/llama/02_pretrain_with_yaml.py \
    --config-file llama3_8b_pretrain_8gpu_h100_bf16.yaml
