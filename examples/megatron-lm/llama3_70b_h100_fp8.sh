#!/bin/bash
# NVIDIA's Llama-3 70B FP8 performance settings for 64 H100 GPUs (8 nodes), as Megatron-LM flags: the layout of
# the FP8 performance table in NVIDIA/Megatron-LM examples/llama/README.md (TP 4, PP 8, CP 1, VP 5, GBS 128, MBS 1,
# seq 8192: 1621 tokens/s/GPU), written with the flags of examples/llama/train_llama3_8b_h100_fp8.sh and the
# architecture of Meta's Llama-3 70B (80 layers, hidden 8192, FFN 28672, 64 heads, 8 KV groups, RoPE 500000).
# Interleaving is given as layers per virtual stage (80 / 8 stages / 5 chunks = 2), as NeMo's perf scripts do.
# Run it on every node (NODE_RANK 0..7); attune imports the command of one node: python make_recipe.py llama3_70b_h100_fp8.sh
export CUDA_DEVICE_MAX_CONNECTIONS=1
exec torchrun --nproc_per_node 8 --nnodes 8 --node_rank 0 --master_addr node0 --master_port 6000 \
    pretrain_gpt.py \
    --use-mcore-models --num-layers 80 --hidden-size 8192 --ffn-hidden-size 28672 --num-attention-heads 64 \
    --group-query-attention --num-query-groups 8 --kv-channels 128 --seq-length 8192 \
    --max-position-embeddings 8192 --position-embedding-type rope --rotary-base 500000 --rotary-percent 1.0 \
    --attention-dropout 0.0 --hidden-dropout 0.0 --swiglu --init-method-std 0.008 --attention-backend fused \
    --normalization RMSNorm --untie-embeddings-and-output-weights --disable-bias-linear \
    --micro-batch-size 1 --global-batch-size 128 --train-samples 1953125000 --lr-decay-samples 1949218748 \
    --lr-warmup-samples 3906252 --lr 0.00015 --min-lr 0.00001 --lr-decay-style cosine --clip-grad 1.0 \
    --weight-decay 0.1 --adam-beta1 0.9 --adam-beta2 0.95 --bf16 --grad-reduce-in-bf16 \
    --cross-entropy-loss-fusion --manual-gc \
    --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather \
    --fp8-format hybrid --fp8-amax-history-len 1024 --fp8-amax-compute-algo max --fp8-param-gather \
    --tensor-model-parallel-size 4 --pipeline-model-parallel-size 8 --num-layers-per-virtual-pipeline-stage 2 \
    --context-parallel-size 1 --sequence-parallel --tp-comm-overlap \
    --mock-data --tokenizer-type NullTokenizer --vocab-size 128256 --split 99,1,0 --num-workers 1 \
    --log-interval 1 --eval-iters 32 --eval-interval 100 --save-interval 1000 --log-throughput \
    --ckpt-format torch_dist --distributed-timeout-minutes 60 --save checkpoints/llama3_70b_fp8 \
    --load checkpoints/llama3_70b_fp8
