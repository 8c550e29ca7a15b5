"""Invariants of the trainer's data order: pure functions, no training run."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch

from attune.recipe.model import DataSpec, Recipe
from attune.trainer.data import SampleSource, micro_batch_positions, micro_batches, rank_slice


def step_positions(step: int, gbs: int, mbs: int, world: int) -> list[int]:
    """Every stream position of a step, concatenated over ranks and micro-steps in order."""
    out: list[int] = []
    for rank in range(world):
        for micro in range(gbs // world // mbs):
            out += list(micro_batch_positions(step, micro, gbs, mbs, world, rank))
    return out


def test_rank_slices_are_contiguous_and_cover_the_batch() -> None:
    slices = [rank_slice(16, 4, r) for r in range(4)]
    assert [list(s) for s in slices] == [list(range(4 * r, 4 * r + 4)) for r in range(4)]
    with pytest.raises(ValueError, match="divisible"):
        rank_slice(10, 4, 0)
    with pytest.raises(ValueError, match="not in a world"):
        rank_slice(8, 2, 2)


@pytest.mark.parametrize(("mbs", "world"), [(1, 1), (4, 1), (8, 1), (1, 2), (2, 2), (4, 2), (1, 4), (2, 4)])
def test_step_consumes_the_same_positions_for_any_layout(mbs: int, world: int) -> None:
    for step in (0, 1, 7):
        assert step_positions(step, 8, mbs, world) == list(range(8 * step, 8 * step + 8))


def test_micro_batch_out_of_range_is_refused() -> None:
    with pytest.raises(ValueError, match="out of range"):
        micro_batch_positions(0, 2, 8, 2, 2, 0)


def test_synthetic_samples_depend_only_on_seed_and_index() -> None:
    a = SampleSource(DataSpec(seed=5), 16, 100, epoch_size=64)
    b = SampleSource(DataSpec(seed=5), 16, 100, epoch_size=64)
    c = SampleSource(DataSpec(seed=6), 16, 100, epoch_size=64)
    assert np.array_equal(a.sample(3), b.sample(3)) and a.sample(3).shape == (17,)
    assert not np.array_equal(a.sample(3), c.sample(3))
    assert a.sample(3).min() >= 0 and a.sample(3).max() < 100
    # learnable: most consecutive differences equal one stride
    diffs = np.diff(a.sample(9)) % 100
    assert np.bincount(diffs).max() >= 10


def test_shuffled_order_is_a_seeded_permutation_of_each_epoch() -> None:
    src = SampleSource(DataSpec(order="shuffled", seed=1), 8, 50, epoch_size=32)
    first = [src.index(p) for p in range(32)]
    assert sorted(first) == list(range(32)) and first != list(range(32))
    assert [src.index(p) for p in range(32)] == first
    assert sorted(src.index(p) for p in range(32, 64)) == list(range(32))
    other = SampleSource(DataSpec(order="shuffled", seed=2), 8, 50, epoch_size=32)
    assert [other.index(p) for p in range(32)] != first


def test_token_file_is_cut_into_sequences(tmp_path) -> None:
    path = tmp_path / "tokens.npy"
    np.save(path, np.arange(100, dtype=np.uint16) % 50)
    src = SampleSource(DataSpec(source="tokens", path=str(path)), 9, 50, epoch_size=0)
    assert src.epoch_size == 10
    assert src.sample(1).tolist() == list(range(10, 20))
    assert src.sample(12).tolist() == list(range(20, 30))  # wraps into the second epoch
    bad = SampleSource(DataSpec(source="tokens", path=str(path)), 9, 10, epoch_size=0)
    with pytest.raises(ValueError, match="outside"):
        bad.sample(3)


def test_dataloader_workers_yield_the_same_micro_batches(recipe: Callable[..., Recipe]) -> None:
    r = recipe()
    plain = list(micro_batches(r, steps=3, world=2, rank=1, micro_batch=2, workers=0))
    loaded = list(micro_batches(r, steps=3, world=2, rank=1, micro_batch=2, workers=2))
    assert len(plain) == 6 and all(torch.equal(a, b) for a, b in zip(plain, loaded, strict=True))
    assert plain[0].shape == (2, 33) and plain[0].dtype == torch.int64


def test_simulated_storage_latency_waits_per_read_and_changes_no_sample(recipe: Callable[..., Recipe]) -> None:
    import time

    r = recipe()
    plain = list(micro_batches(r, steps=2, world=1, rank=0, micro_batch=2))
    t0 = time.monotonic()
    slow = list(micro_batches(r, steps=2, world=1, rank=0, micro_batch=2, read_latency_s=0.05))
    waited = time.monotonic() - t0
    assert len(slow) == len(plain) and all(torch.equal(a, b) for a, b in zip(plain, slow, strict=True))
    assert waited >= 0.05 * len(slow)  # a sleep per read: a lower bound no load can break


@pytest.mark.parametrize("raw, seconds", [("", 0.0), ("0", 0.0), ("25", 0.025), (" 2.5 ", 0.0025)])
def test_read_latency_is_read_from_the_environment(raw: str, seconds: float) -> None:
    from attune.trainer.config import READ_LATENCY_ENV, read_latency_s

    assert read_latency_s({READ_LATENCY_ENV: raw}) == pytest.approx(seconds)
    assert read_latency_s({}) == 0.0


@pytest.mark.parametrize("raw", ["-1", "nan", "inf", "fast", "1e9"])
def test_a_bad_read_latency_names_the_variable(raw: str) -> None:
    from attune.trainer.config import READ_LATENCY_ENV, read_latency_s

    with pytest.raises(ValueError, match=READ_LATENCY_ENV):
        read_latency_s({READ_LATENCY_ENV: raw})
