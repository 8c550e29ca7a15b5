"""Deterministic training data: which sample each rank reads at each micro-step, and its tokens.

The global sample stream is fixed by the training contract alone. Optimizer step ``s`` consumes stream
positions ``[s·G, (s+1)·G)`` (``G`` = global batch). Rank ``r`` of ``w`` takes the contiguous slice
``[r·G/w, (r+1)·G/w)`` of that step and cuts it into micro-batches in order. So sample ``i`` of step ``s``
is the same whatever the micro-batch size, process count or number of data-loader workers.

A stream position maps to a sample index: itself (``order: sequential``) or through a seeded permutation
of each epoch (``order: shuffled``). A sample is ``seq_length + 1`` tokens (inputs plus shifted targets):
generated from ``(data.seed, index)`` for ``source: synthetic``, or cut from a token file for ``source: tokens``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from functools import lru_cache

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from attune.recipe.model import DataSpec, Recipe

log = logging.getLogger(__name__)

#: fraction of synthetic tokens replaced by uniform noise
NOISE = 0.1


def rank_slice(global_batch: int, world: int, rank: int) -> range:
    """The positions within one global batch that ``rank`` of ``world`` processes (contiguous)."""
    if world <= 0 or not 0 <= rank < world:
        raise ValueError(f"rank {rank} is not in a world of {world}")
    if global_batch % world:
        raise ValueError(f"global batch {global_batch} is not divisible by the world size {world}")
    per = global_batch // world
    return range(rank * per, (rank + 1) * per)


def micro_batch_positions(step: int, micro: int, global_batch: int, micro_batch: int,
                          world: int, rank: int) -> range:
    """Stream positions of micro-batch ``micro`` of optimizer ``step`` (0-based) on ``rank``."""
    local = rank_slice(global_batch, world, rank)
    if len(local) % micro_batch:
        raise ValueError(f"per-rank batch {len(local)} is not divisible by micro-batch {micro_batch}")
    if not 0 <= micro < len(local) // micro_batch:
        raise ValueError(f"micro-step {micro} out of range for {len(local) // micro_batch} micro-steps")
    start = step * global_batch + local.start + micro * micro_batch
    return range(start, start + micro_batch)


class SampleSource:
    """Maps stream positions to samples of ``seq_length + 1`` tokens (int64)."""

    def __init__(self, data: DataSpec, seq_length: int, vocab_size: int, epoch_size: int) -> None:
        self.data, self.seq_length, self.vocab_size = data, seq_length, vocab_size
        self.tokens: np.ndarray | None = None
        if data.source == "tokens":
            self.tokens = _load_tokens(str(data.path))
            epoch_size = len(self.tokens) // (seq_length + 1)
            if epoch_size == 0:
                raise ValueError(f"token file {data.path} holds {len(self.tokens)} tokens, fewer than one "
                                 f"sequence of {seq_length + 1}")
        self.epoch_size = epoch_size

    def index(self, position: int) -> int:
        """The sample index at a stream position (after shuffling, wrapping into further epochs)."""
        epoch, within = divmod(position, self.epoch_size)
        if self.data.order == "sequential":
            return within if self.tokens is not None else position
        return int(_permutation(self.data.seed, epoch, self.epoch_size)[within])

    def sample(self, position: int) -> np.ndarray:
        """The ``seq_length + 1`` tokens at a stream position."""
        i, n = self.index(position), self.seq_length + 1
        if self.tokens is not None:
            seq = np.asarray(self.tokens[i * n:(i + 1) * n], dtype=np.int64)
            if seq.min() < 0 or seq.max() >= self.vocab_size:
                raise ValueError(f"token file {self.data.path}: sample {i} holds ids outside [0, {self.vocab_size})")
            return seq
        # noisy affine sequence: start + stride·t (mod vocab), 10 % of tokens replaced by noise
        rng = np.random.default_rng([self.data.seed, i])
        start, stride = rng.integers(0, self.vocab_size), rng.integers(1, 7)
        seq = (start + stride * np.arange(n, dtype=np.int64)) % self.vocab_size
        noise = rng.random(n) < NOISE
        return np.where(noise, rng.integers(0, self.vocab_size, n), seq)

    def batch(self, positions: range) -> torch.Tensor:
        """A ``[len(positions), seq_length + 1]`` int64 tensor."""
        return torch.from_numpy(np.stack([self.sample(p) for p in positions]))


@lru_cache(maxsize=4)
def _permutation(seed: int, epoch: int, size: int) -> np.ndarray:
    return np.random.default_rng([seed, epoch, 1]).permutation(size)


def _load_tokens(path: str) -> np.ndarray:
    """A 1-D token array: ``.npy`` via ``np.load`` (memory-mapped), anything else as raw uint16 (nanoGPT ``.bin``)."""
    arr = np.load(path, mmap_mode="r") if path.endswith(".npy") else np.memmap(path, dtype=np.uint16, mode="r")
    if arr.ndim != 1:
        raise ValueError(f"token file {path} has shape {arr.shape}; expected a 1-D array of token ids")
    return arr


class MicroBatches(Dataset[torch.Tensor]):
    """The micro-batches one rank consumes, in order: item ``k`` is micro-step ``k % accum`` of step ``k // accum``."""

    def __init__(self, source: SampleSource, steps: int, global_batch: int, micro_batch: int,
                 world: int, rank: int, read_latency_s: float = 0.0) -> None:
        self.source, self.steps, self.read_latency_s = source, steps, read_latency_s
        self.global_batch, self.micro_batch, self.world, self.rank = global_batch, micro_batch, world, rank
        self.accum = len(rank_slice(global_batch, world, rank)) // micro_batch

    def __len__(self) -> int:
        return self.steps * self.accum

    def __getitem__(self, k: int) -> torch.Tensor:
        step, micro = divmod(k, self.accum)
        if self.read_latency_s:
            time.sleep(self.read_latency_s)  # simulated storage: each read waits, whatever the CPU load
        return self.source.batch(micro_batch_positions(step, micro, self.global_batch, self.micro_batch,
                                                       self.world, self.rank))


def micro_batches(recipe: Recipe, steps: int, world: int, rank: int, micro_batch: int,
                  workers: int = 0, read_latency_s: float = 0.0) -> Iterator[torch.Tensor]:
    """Iterate this rank's micro-batches for ``steps`` optimizer steps, optionally via DataLoader workers.

    ``read_latency_s`` makes each micro-batch read wait that long (simulated slow storage, see
    ``config.READ_LATENCY_ENV``); DataLoader workers overlap those waits, as they would real reads."""
    t = recipe.training
    assert t is not None and recipe.model is not None  # the torch framework requires both
    source = SampleSource(t.data, t.seq_length, recipe.model.vocab_size, epoch_size=t.steps * t.global_batch_size)
    ds = MicroBatches(source, steps, t.global_batch_size, micro_batch, world, rank, read_latency_s)
    if workers <= 0:
        return (ds[k] for k in range(len(ds)))
    loader = DataLoader(ds, batch_size=None, shuffle=False, num_workers=workers, prefetch_factor=2)
    return iter(loader)
