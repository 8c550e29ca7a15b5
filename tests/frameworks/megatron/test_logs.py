"""The Megatron-family log parser on real Megatron-LM, Megatron-Bridge and NeMo 2 output (fixtures/README.md)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from attune.backends.local import classify
from attune.engine.measure import summarise
from attune.frameworks.base import Observation
from attune.frameworks.megatron.logs import MegatronLogParser
from attune.trial import TrialOutcome
from tests.frameworks.megatron.helpers import FIXTURES, megatron, mlm


def feed(parser: MegatronLogParser, name: str) -> MegatronLogParser:
    for i, line in enumerate((FIXTURES / name).read_text().splitlines(keepends=True)):
        parser.feed(line, 100.0 + i)
    return parser


def outcome(p: MegatronLogParser, steps: int = 3, rc: int = 1) -> TrialOutcome:
    obs = Observation(steps=p.steps, errors=p.errors, done=p.done, first_error=p.first_error_line)
    return classify(rc, False, obs, steps)[0]


def test_megatron_lm_iteration_lines_with_throughput():
    p = feed(MegatronLogParser(global_batch=128, seq_length=4096), "mlm-mixtral-throughput.log")
    assert [s["step"] for s in p.steps] == [10, 11, 12]
    assert [s["step_time_s"] for s in p.steps] == pytest.approx([9.4964, 10.0369, 10.1984])
    assert [s["loss"] for s in p.steps] == pytest.approx([0.2092005, 0.2352597, 0.7243721])
    assert p.steps[0]["grad_norm"] == pytest.approx(51.01) and p.steps[0]["tflops_per_gpu"] == pytest.approx(137.5)
    # tokens are derived: the printed global batch × the launch's sequence length
    assert all(s["tokens"] == 128 * 4096 and s["tokens_source"] == "global_batch×seq_length" for s in p.steps)
    assert not p.errors
    m = summarise(p.steps, warmup_steps=1, devices=16)
    assert m.tokens_per_s == pytest.approx(128 * 4096 / ((10.0369 + 10.1984) / 2))


def test_tokens_per_second_derived_without_a_throughput_field():
    p = feed(MegatronLogParser(global_batch=1024, seq_length=2048), "mlm-no-throughput.log")
    assert [s["step_time_s"] for s in p.steps] == pytest.approx([86.5452, 87.8716, 89.4748])
    assert all(s["tflops_per_gpu"] is None and s["tokens"] == 1024 * 2048 for s in p.steps)


def test_bridge_step_time_line_iteration_line_and_memory_report():
    p = feed(MegatronLogParser(global_batch=512, seq_length=1024), "bridge-0.2-step.log")
    (rec,) = p.steps
    assert rec["step"] == 10 and rec["step_time_s"] == pytest.approx(4.6478) and rec["loss"] == pytest.approx(9.763827)
    assert rec["tflops_per_gpu"] == pytest.approx(59892.5)  # Bridge's own (buggy, issue #1499-style) model TFLOP/s
    assert rec["peak_mem_mb"] == pytest.approx(12003.604, rel=1e-6) and p.done


def test_nemo2_progress_lines():
    p = feed(MegatronLogParser(global_batch=512, seq_length=4096), "nemo2-qwen3-moe.log")
    assert [s["step"] for s in p.steps] == [8, 9, 10]
    assert [s["step_time_s"] for s in p.steps] == pytest.approx([27.01, 27.88, 26.63])
    assert [s["loss"] for s in p.steps] == pytest.approx([10.22, 10.1, 10.06])
    assert p.steps[1]["tflops_per_gpu"] == pytest.approx(85.8)
    assert p.steps[0]["peak_mem_mb"] == pytest.approx(57466159104 / 2**20)
    q = feed(MegatronLogParser(global_batch=128, seq_length=8192), "nemo2-dgxc-llama3.log")
    (rec,) = q.steps
    assert rec["step"] == 49 and rec["step_time_s"] == pytest.approx(12.39) and rec["tokens"] == 128 * 8192
    assert rec["peak_mem_mb"] == pytest.approx(70833405952 / 2**20)


@pytest.mark.parametrize("name, kind, expected", [
    ("mlm-oom.log", "oom", TrialOutcome.OOM),
    ("mlm-nccl-timeout.log", "comm", TrialOutcome.CRASHED),
    ("mlm-nan-grad-norm.log", "diverged", TrialOutcome.DIVERGED),
    ("mlm-nan-iteration.log", "diverged", TrialOutcome.DIVERGED),
])
def test_failures(name, kind, expected):
    p = feed(MegatronLogParser(global_batch=8, seq_length=2048), name)
    assert kind in {e["kind"] for e in p.errors}
    assert outcome(p) is expected


def test_nan_iteration_record_keeps_a_nan_grad_norm():
    p = feed(MegatronLogParser(global_batch=8, seq_length=2048), "mlm-nan-iteration.log")
    assert math.isnan(p.steps[0]["grad_norm"]) and math.isnan(p.steps[0]["loss"])  # NaN losses are not printed


def test_framework_parser_uses_the_recipes_batch_and_sequence():
    r = mlm()
    p = megatron().parser(r)
    p.feed((FIXTURES / "mlm-mixtral-throughput.log").read_text().splitlines()[0], 0.0)
    assert p.steps[0]["tokens"] == 128 * 8192
    assert megatron().pod_parser(r).__class__ is MegatronLogParser


def test_repeated_lines_count_once(tmp_path: Path):
    line = (FIXTURES / "mlm-mixtral-throughput.log").read_text().splitlines()[0]
    p = MegatronLogParser(global_batch=128, seq_length=4096)
    for _ in range(3):
        p.feed(line, 0.0)
    assert len(p.steps) == 1
