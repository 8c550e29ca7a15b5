#!/bin/sh
# The deliberately poor launch attune starts from: one process, one sequence per forward/backward (16
# accumulation steps for a global batch of 16), activation checkpointing on although memory is plentiful,
# data loaded in the training loop. max_steps is large: attune ends each trial after the steps it measures.
# One OpenMP thread per process (on a small shared CPU box two threads busy-wait and can be 5-40x slower).
export OMP_NUM_THREADS=1
exec python train.py --per_device_train_batch_size 1 --gradient_accumulation_steps 16 \
    --gradient_checkpointing True --dataloader_num_workers 0 --max_steps 10000 --learning_rate 5e-4 \
    --warmup_steps 100 --lr_scheduler_type cosine --weight_decay 0.01 --seed 0 --use_cpu True \
    --output_dir out --logging_steps 50 --save_steps 1000 --report_to none
