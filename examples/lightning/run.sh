#!/bin/sh
# The deliberately poor launch attune starts from: one process, one sequence per forward/backward (32
# accumulation steps for a global batch of 32), data loaded in the training loop. trainer.max_steps (in
# config.yaml) is large: attune ends each trial after the steps it measures and never touches it.
# One OpenMP thread per process (on a small shared CPU box two threads busy-wait and can be much slower).
export OMP_NUM_THREADS=1
exec python train.py fit --config config.yaml --trainer.devices 1 --data.batch_size 1 \
    --trainer.accumulate_grad_batches 32 --data.num_workers 0
