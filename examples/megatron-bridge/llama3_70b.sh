#!/bin/bash
# NVIDIA's Llama-3 70B BF16 performance recipe (64 H100, 8 nodes: run on each with its node rank) as a Megatron-Bridge
# YAML config. Import: python make_recipe.py llama3_70b.sh
exec torchrun --nproc_per_node 8 --nnodes 8 tutorials/recipes/llama/02_pretrain_with_yaml.py \
    --config-file llama3_70b_pretrain_64gpu_h100_bf16.yaml
