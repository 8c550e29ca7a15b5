#!/bin/sh
# The deliberately poor launch attune starts from: one sequence per forward/backward (32 micro-steps for a global
# batch of 32 sequences), no compilation, one OpenMP thread. max_iters is long: attune ends each trial after the
# steps it measures, and max_iters (which sets the learning-rate schedule) is contract.
#   attune tune --framework command --knobs knobs.yaml --devices-per-node 2 --budget 0.1 --script run.sh
export OMP_NUM_THREADS=1
exec python train.py --batch_size=1 --gradient_accumulation_steps=32 --compile=False --max_iters=5000
