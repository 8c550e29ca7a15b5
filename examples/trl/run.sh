#!/bin/sh
# A poor but common TRL SFT launch on CPU: one sequence per step, accumulation 8, activation checkpointing on (TRL's
# default). Build the model and data first: python make_tiny.py .
export OMP_NUM_THREADS=1
exec trl sft --model_name_or_path model --dataset_name data --dataset_text_field text --max_length 64 --per_device_train_batch_size 1 --gradient_accumulation_steps 8 --learning_rate 1e-4 --max_steps 1000 --seed 3 --packing False --use_cpu True --dataloader_num_workers 0
