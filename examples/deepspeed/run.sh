#!/bin/sh
# The deliberately poor launch attune starts from: one process, one sample per forward/backward (32
# accumulation steps for train_batch_size 32), ZeRO stage 3 although one process has nothing to partition, with
# tiny communication buckets, no prefetch, no overlap and every parameter partitioned (persistence threshold 0).
# The script trains for 100000 steps: attune ends each trial after the steps it measures.
export DS_ACCELERATOR=cpu
exec deepspeed --num_gpus 1 train.py --deepspeed_config ds_config.json
