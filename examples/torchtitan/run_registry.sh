#!/bin/bash
# The same model in torchtitan main's Python config form (after #2386, "TOML to Python Dataclass Registry"):
# MODULE=llama3 CONFIG=llama3_8b ./run_train.sh runs this; --section.option flags still override the function.
export PYTORCH_ALLOC_CONF=expandable_segments:True
exec torchrun --nproc_per_node=8 --rdzv_backend c10d --rdzv_endpoint=localhost:0 --local-ranks-filter 0 --role rank \
    --tee 3 -m torchtitan.train --module llama3 --config llama3_8b --parallelism.tensor_parallel_degree 2
