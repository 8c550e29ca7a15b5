#!/bin/bash
# NeMo 2's published Llama-3 8B pretraining recipe (`--factory llama3_8b`: NVIDIA/NeMo
# nemo/collections/llm/recipes/llama3_8b.py — 8 GPUs, GBS 512, MBS 1, seq 8192, TP1 PP1 CP2, lr 3e-4),
# launched with the override line of the NeMo docs (`trainer.strategy.tensor_model_parallel_size=2`).
# Import it: python make_recipe.py llama3_8b.sh, then attune tune recipe.yaml --backend sim --budget 20
exec nemo llm pretrain --factory llama3_8b trainer.strategy.tensor_model_parallel_size=2 \
    trainer.strategy.context_parallel_size=2 data.micro_batch_size=1 data.global_batch_size=512 -y
