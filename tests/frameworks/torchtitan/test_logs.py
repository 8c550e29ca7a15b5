"""The torchtitan log parser on real torchtitan output (fixtures/README.md names each source)."""

from __future__ import annotations

import math

import pytest

from attune.backends.local import classify
from attune.frameworks.base import Observation
from attune.frameworks.torchtitan.logs import TorchtitanLogParser
from attune.trial import TrialOutcome
from tests.frameworks.torchtitan.helpers import FIXTURES, recipe, titan


def feed(name: str, tokens: int = 8 * 8192, devices: int = 8) -> TorchtitanLogParser:
    p = TorchtitanLogParser(tokens_per_step=tokens, devices=devices)
    for i, line in enumerate((FIXTURES / name).read_text().splitlines(keepends=True)):
        p.feed(line, float(i))
    return p


def test_rank_prefixed_lines_once_per_step():
    p = feed("tt-llama3-8b-4gpu.log", tokens=4 * 8192, devices=4)
    assert [s["step"] for s in p.steps] == [1, 10]
    s10 = p.steps[1]
    assert s10["loss"] == pytest.approx(10.2391) and s10["grad_norm"] == pytest.approx(16.1413)
    assert s10["peak_mem_mb"] == pytest.approx(44.84 * 1024) and s10["tps_per_device"] == 5615
    assert s10["tflops_per_gpu"] == pytest.approx(325.2) and s10["mfu"] == pytest.approx(0.3288)
    # the step time is derived from torchtitan's per-device tps: tokens per step ÷ (tps × devices)
    assert s10["step_time_s"] == pytest.approx(4 * 8192 / (5615 * 4))
    assert not p.errors


def test_consecutive_steps_and_old_format():
    p = feed("tt-checkpoint-readability.log")
    assert [s["step"] for s in p.steps] == [54, 55, 56, 57] and p.steps[0]["tps_per_device"] == 7084
    old = feed("tt-old-0.1.log")
    assert old.steps[0]["step"] == 2 and old.steps[0]["grad_norm"] is None and old.steps[0]["tps_per_device"] == 13785


def test_colour_codes_are_stripped():
    p = feed("tt-colour.log")
    assert p.steps[0]["step"] == 4 and p.steps[0]["tps_per_device"] == 10050 and p.steps[0]["mfu"] == pytest.approx(0.1399)


@pytest.mark.parametrize("name, expected", [("tt-oom.log", TrialOutcome.OOM), ("tt-nccl-timeout.log", TrialOutcome.CRASHED),
                                            ("tt-nan.log", TrialOutcome.DIVERGED)])
def test_failures(name, expected):
    p = feed(name)
    obs = Observation(steps=p.steps, errors=p.errors, done=p.done, first_error=p.first_error_line)
    assert classify(1, False, obs, 8)[0] is expected


def test_nan_loss_record():
    p = feed("tt-nan.log")
    assert math.isnan(p.steps[1]["loss"]) and math.isnan(p.steps[1]["grad_norm"])


def test_framework_parser_uses_the_jobs_tokens_per_step():
    r = recipe()
    p = titan().parser(r)
    p.feed((FIXTURES / "tt-checkpoint-readability.log").read_text().splitlines()[0], 0.0)
    assert p.steps[0]["tokens"] == 8 * 8192 and p.steps[0]["step_time_s"] == pytest.approx(8 * 8192 / (7084 * 8))
