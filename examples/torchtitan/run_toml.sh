#!/bin/bash
# A Llama-3 8B torchtitan 0.2.x job (llama3_8b.toml, our own TOML job file), launched the way torchtitan's
# run_train.sh launches it, on one 8-GPU node with TP 2 from the command line.
# Its global batch is torchtitan's default (-1: local batch × data-parallel degree), so a layout move that changes the
# DP degree changes the global batch and attune's gate refuses it; give --training.global_batch_size to free them.
export PYTORCH_ALLOC_CONF=expandable_segments:True
exec torchrun --nproc_per_node=8 --rdzv_backend c10d --rdzv_endpoint=localhost:0 --local-ranks-filter 0 --role rank \
    --tee 3 -m torchtitan.train --job.config_file llama3_8b.toml --parallelism.tensor_parallel_degree 2 \
    --training.global_batch_size 8
