"""A tiny GPT trained with PyTorch Lightning's LightningCLI: the kind of script people write, on a CPU.

``python train.py fit --config config.yaml --data.batch_size 8 ...``: LightningCLI builds the command line from
the two classes below (``--model.*`` from :class:`TinyGPT`, ``--data.*`` from :class:`TokenData`) and from
``Trainer`` (``--trainer.*``). The data are synthetic and deterministic (each sample is generated from its own
index: a noisy periodic token pattern a small model can learn), so nothing is downloaded and every run, with any
number of processes or data-loader workers, sees the same samples in the same order.
"""

from __future__ import annotations

import math

import torch
from lightning.pytorch import LightningDataModule, LightningModule
from lightning.pytorch.cli import LightningCLI
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Tokens(Dataset):
    """``samples`` sequences of ``seq_len + 1`` tokens; sample ``i`` depends only on ``seed`` and ``i``."""

    def __init__(self, samples: int, seq_len: int, vocab_size: int, seed: int) -> None:
        self.samples, self.seq_len, self.vocab_size, self.seed = samples, seq_len, vocab_size, seed

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
        period = int(torch.randint(2, 9, (1,), generator=g))
        start = torch.randint(0, self.vocab_size, (period,), generator=g)
        seq = start.repeat(self.seq_len // period + 2)[: self.seq_len + 1]
        noise = torch.rand(self.seq_len + 1, generator=g) < 0.1
        seq = torch.where(noise, torch.randint(0, self.vocab_size, (self.seq_len + 1,), generator=g), seq)
        return seq[:-1], seq[1:]


class TokenData(LightningDataModule):
    """The synthetic token stream, served in order (no shuffling: every layout sees the same samples)."""

    def __init__(self, batch_size: int = 8, num_workers: int = 0, seq_len: int = 64, vocab_size: int = 256,
                 samples: int = 1_000_000, seed: int = 1234) -> None:
        super().__init__()
        self.batch_size, self.num_workers = batch_size, num_workers
        self.data = Tokens(samples, seq_len, vocab_size, seed)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.data, batch_size=self.batch_size, num_workers=self.num_workers, shuffle=False,
                          persistent_workers=self.num_workers > 0)


class Block(nn.Module):
    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.attn = nn.MultiheadAttention(d_model, n_heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class TinyGPT(LightningModule):
    """A decoder-only transformer (pre-norm blocks, learned positions), AdamW with linear warm-up then cosine."""

    def __init__(self, vocab_size: int = 256, seq_len: int = 64, d_model: int = 64, n_layers: int = 2,
                 n_heads: int = 4, learning_rate: float = 1e-3, weight_decay: float = 0.01,
                 warmup_steps: int = 100, total_steps: int = 10_000) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.tok = nn.Embedding(vocab_size, d_model)
        self.pos = nn.Embedding(seq_len, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_heads) for _ in range(n_layers))
        self.ln = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size, bias=False)
        self.register_buffer("mask", torch.triu(torch.ones(seq_len, seq_len, dtype=torch.bool), 1), persistent=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for block in self.blocks:
            x = block(x, self.mask[:t, :t])
        return self.head(self.ln(x))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.cross_entropy(self.forward(x).flatten(0, 1), y.flatten())
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self) -> dict:
        hp = self.hparams
        opt = torch.optim.AdamW(self.parameters(), lr=hp.learning_rate, weight_decay=hp.weight_decay)

        def factor(step: int) -> float:
            if step < hp.warmup_steps:
                return (step + 1) / hp.warmup_steps
            done = min(1.0, (step - hp.warmup_steps) / max(1, hp.total_steps - hp.warmup_steps))
            return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * done))

        sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def main() -> None:
    LightningCLI(TinyGPT, TokenData)


if __name__ == "__main__":
    main()
