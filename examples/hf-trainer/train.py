#!/usr/bin/env python
"""Train a small Llama from scratch with the HuggingFace ``Trainer``, the way a user's own script does it.

Nothing is downloaded: the model is built from a ``LlamaConfig`` and the data are synthetic, deterministic token
sequences (each sample is an arithmetic progression modulo the vocabulary, so the loss really falls).

    python train.py --output_dir out --max_steps 20 --per_device_train_batch_size 4 --use_cpu True
    python train.py args.json          # every argument from a JSON file (or args.yaml)
    torchrun --standalone --nproc_per_node 2 train.py --use_cpu True ...

``--use_cpu True`` makes accelerate pick the gloo backend under torchrun on a machine without GPUs.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.data import Dataset
from transformers import (
    HfArgumentParser,
    LlamaConfig,
    LlamaForCausalLM,
    Trainer,
    TrainingArguments,
    default_data_collator,
    set_seed,
)


@dataclass
class ModelArguments:
    vocab_size: int = field(default=512, metadata={"help": "vocabulary of the synthetic tokens"})
    hidden_size: int = field(default=128, metadata={"help": "model width"})
    intermediate_size: int = field(default=384, metadata={"help": "MLP inner width"})
    num_hidden_layers: int = field(default=4, metadata={"help": "decoder layers"})
    num_attention_heads: int = field(default=4, metadata={"help": "attention heads"})
    seq_len: int = field(default=128, metadata={"help": "tokens per training sample"})
    num_samples: int = field(default=1_000_000, metadata={"help": "size of the synthetic training set"})


@dataclass
class DataArguments:
    read_latency_ms: float = field(default=0.0, metadata={
        "help": "simulated storage latency: milliseconds each batch read waits (0: none). Makes a data-bound job "
                "for demos and tests; the wait is a sleep, so its share of a step does not move with CPU load"})


class SlowStorageCollator:
    """HF's default collator, after waiting ``latency_s`` per batch, as a read from slow storage would."""

    def __init__(self, latency_s: float) -> None:
        self.latency_s = latency_s

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        time.sleep(self.latency_s)
        return default_data_collator(features)


class ProgressionDataset(Dataset):
    """Sample ``i``: ``(start + stride * t) mod vocab`` for ``t < seq_len``, start and stride drawn from seed ``i``."""

    def __init__(self, num_samples: int, seq_len: int, vocab_size: int) -> None:
        self.num_samples, self.seq_len, self.vocab_size = num_samples, seq_len, vocab_size

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(i)
        start, stride = torch.randint(0, self.vocab_size, (2,), generator=g).tolist()
        ids = (start + (stride % 16 + 1) * torch.arange(self.seq_len)) % self.vocab_size
        return {"input_ids": ids, "labels": ids.clone()}


def parse() -> tuple[ModelArguments, DataArguments, TrainingArguments]:
    parser = HfArgumentParser((ModelArguments, DataArguments, TrainingArguments))
    if len(sys.argv) == 2 and sys.argv[1].endswith(".json"):
        return parser.parse_json_file(json_file=os.path.abspath(sys.argv[1]))
    if len(sys.argv) == 2 and sys.argv[1].endswith((".yaml", ".yml")):
        return parser.parse_yaml_file(yaml_file=os.path.abspath(sys.argv[1]))
    return parser.parse_args_into_dataclasses()


def main() -> None:
    model_args, data_args, training_args = parse()
    set_seed(training_args.seed)
    config = LlamaConfig(vocab_size=model_args.vocab_size, hidden_size=model_args.hidden_size,
                         intermediate_size=model_args.intermediate_size,
                         num_hidden_layers=model_args.num_hidden_layers,
                         num_attention_heads=model_args.num_attention_heads,
                         max_position_embeddings=model_args.seq_len, tie_word_embeddings=False)
    model = LlamaForCausalLM(config)
    if training_args.process_index == 0:
        params = sum(p.numel() for p in model.parameters())
        print(f"LlamaForCausalLM: {params / 1e6:.2f}M parameters, world size {training_args.world_size}",
              flush=True)
    data = ProgressionDataset(model_args.num_samples, model_args.seq_len, model_args.vocab_size)
    collator = SlowStorageCollator(data_args.read_latency_ms / 1000) if data_args.read_latency_ms > 0 else None
    Trainer(model=model, args=training_args, train_dataset=data, data_collator=collator).train()


if __name__ == "__main__":
    main()
