"""The axolotl log parser on real output pasted into axolotl issues (fixtures/SOURCES.md names each)."""

from __future__ import annotations

import math

import pytest

from attune.frameworks.axolotl import SIGNATURES
from attune.frameworks.hfyaml import YamlTrainerLogParser
from attune.trial import FailureKind
from tests.frameworks.axolotl.helpers import FIXTURES, ax, feed, recipe


def parsed(name: str, **kw):
    p = YamlTrainerLogParser(global_batch=kw.pop("global_batch", 4), signatures=SIGNATURES, **kw)
    return feed(p, (FIXTURES / name).read_text())


def test_healthy_steps_with_axolotls_memory_keys():
    p = parsed("ax-steps-memory.log", tokens_per_sample=2048)
    assert [s["step"] for s in p.steps] == [1, 2, 3, 4, 5]
    assert [s["loss"] for s in p.steps] == [4.75, 2.0312, 0.8984, 0.4102, 0.2031]
    assert [s["grad_norm"] for s in p.steps] == [98.5, 59.5, 45.0, 19.625, 11.8125]
    assert all(s["tokens"] == 4 * 2048 for s in p.steps) and not p.errors


def test_progress_bars_and_axolotls_own_lines_are_no_steps():
    p = parsed("ax-packing-tqdm.log")
    assert len(p.steps) == 1 and p.steps[0]["loss"] == 0.8635 and p.steps[0]["grad_norm"] is None
    assert p.steps[0]["learning_rate"] == pytest.approx(0.0001369640787949015) and not p.errors


def test_nan_grad_norm_with_zero_loss_is_a_diverged_run():
    p = parsed("ax-flash-nan.log")
    assert len(p.steps) == 1 and p.steps[0]["loss"] == 0.0 and math.isnan(p.steps[0]["grad_norm"])
    assert [e["kind"] for e in p.errors] == [FailureKind.DIVERGED]
    assert p.first_error_line == "RuntimeError: CUDA error: an illegal memory access was encountered"


def test_out_of_memory_is_read_behind_rank_prefixes():
    p = parsed("ax-oom-fsdp-eval.log")
    assert [e["kind"] for e in p.errors] == [FailureKind.OOM] and "Tried to allocate 2.00 GiB" in p.errors[0]["message"]


def test_the_loss_watchdog_stopping_training_is_a_divergence():
    line = ("[2025-01-01 00:00:00,000] [WARNING] [axolotl.utils.callbacks.on_step_end:78] [PID:1] [RANK:0] "
            "Loss is too high, stopping training (loss_watchdog_threshold)\n")
    p = feed(YamlTrainerLogParser(global_batch=4, signatures=SIGNATURES), line)
    assert [e["kind"] for e in p.errors] == [FailureKind.DIVERGED] and "watchdog" in p.errors[0]["message"]


def test_the_frameworks_parser_knows_the_global_batch(tmp_path):
    p = ax().parser(recipe(tmp_path))
    assert p.global_batch == 4 and p.fp16 is False
    feed(p, (FIXTURES / "ax-steps-memory.log").read_text())
    assert len(p.steps) == 5


def test_a_printed_loss_is_only_as_precise_as_its_digits(tmp_path):
    r = recipe(tmp_path)
    assert ax().loss_resolution(r, 2.0312) == pytest.approx(0.0005)  # transformers 5: four significant digits
    assert ax().loss_resolution(r, 0.2031) == pytest.approx(0.00005)  # 4.x: four decimals (the coarser here)
