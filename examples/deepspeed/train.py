#!/usr/bin/env python
"""Train a tiny GPT with DeepSpeed, the way a user's own DeepSpeed script does it.

Nothing is downloaded: the model is a small decoder-only transformer in plain PyTorch and the data are
synthetic, deterministic token sequences (sample ``i`` is an arithmetic progression modulo the vocabulary,
start and stride drawn from seed ``i``, so the loss really falls). Which samples make up optimizer step ``s``
depends only on ``s`` and the config's ``train_batch_size``: however DeepSpeed splits the batch into
micro-batches and processes, every step sees the same samples.

    deepspeed --num_gpus 1 train.py --deepspeed_config ds_config.json
    torchrun --standalone --nproc_per_node 2 train.py --deepspeed_config ds_config.json

On a machine without GPUs set ``DS_ACCELERATOR=cpu``; the process group is gloo, and the config's optimizer
should say ``"torch_adam": true`` (DeepSpeed's fused CPU Adam needs a compiled op). The script prints its loss
(``step N loss X``, averaged over the processes) after every optimizer step; DeepSpeed itself prints none.
"""

from __future__ import annotations

import argparse
import math

import deepspeed
import torch
import torch.nn.functional as F
from deepspeed.accelerator import get_accelerator
from torch import nn


class Block(nn.Module):
    def __init__(self, d: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, ffn), nn.Linear(ffn, d)
        self.heads = heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(a)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class TinyGPT(nn.Module):
    def __init__(self, vocab: int, d: int, layers: int, heads: int, ffn: int, seq_len: int) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq_len, d)
        self.blocks = nn.ModuleList(Block(d, heads, ffn) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tok(ids[:, :-1]) + self.pos(torch.arange(ids.shape[1] - 1))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln(x))
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


def sample(i: int, seq_len: int, vocab: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(i)
    start, stride = torch.randint(0, vocab, (2,), generator=g).tolist()
    return (start + (stride % 16 + 1) * torch.arange(seq_len + 1)) % vocab


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--local_rank", type=int, default=-1, help="set by the deepspeed launcher")
    parser.add_argument("--steps", type=int, default=100_000, help="optimizer steps")
    parser.add_argument("--seed", type=int, default=1234, help="model-initialisation seed")
    parser.add_argument("--seq_len", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--d_model", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--log_interval", type=int, default=1, help="print the loss every N optimizer steps")
    parser = deepspeed.add_config_arguments(parser)  # --deepspeed, --deepspeed_config
    args = parser.parse_args()

    deepspeed.init_distributed(dist_backend="gloo" if get_accelerator().device_name() == "cpu" else None)
    torch.manual_seed(args.seed)
    model = TinyGPT(args.vocab, args.d_model, args.layers, args.heads, 4 * args.d_model, args.seq_len)
    params = sum(p.numel() for p in model.parameters())  # before ZeRO-3 partitions them
    engine, _, _, _ = deepspeed.initialize(args=args, model=model, model_parameters=model.parameters())
    rank, world = engine.global_rank, engine.world_size
    micro, accum, batch = (engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps(),
                           engine.train_batch_size())
    if rank == 0:
        print(f"TinyGPT: {params / 1e6:.2f}M parameters; batch {batch} = {micro} micro × {accum} accumulation × "
              f"{world} processes", flush=True)

    for step in range(args.steps):
        total = torch.zeros(())
        for m in range(accum):
            first = step * batch + (m * world + rank) * micro  # this process's samples of this micro-batch
            ids = torch.stack([sample(first + j, args.seq_len, args.vocab) for j in range(micro)]).to(engine.device)
            loss = engine(ids)
            engine.backward(loss)
            engine.step()
            total += loss.detach().float().cpu() / accum
        if (step + 1) % args.log_interval == 0:
            if world > 1:
                torch.distributed.all_reduce(total)
                total /= world
            if rank == 0:
                value = total.item()
                print(f"step {step + 1} loss {value:.6f}" if math.isfinite(value) else f"step {step + 1} loss {value}",
                      flush=True)


if __name__ == "__main__":
    main()
