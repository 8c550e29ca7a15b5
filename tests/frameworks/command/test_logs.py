"""Step lines of `command` recipes: the presets on real output (fixtures/SOURCES.md), a declared pattern, failures."""

from __future__ import annotations

import math

import pytest

from attune.frameworks.command.logs import PRESETS, StepLineParser
from attune.trial import FailureKind
from tests.frameworks.command.helpers import FIXTURES, command, declaration, feed, recipe


def parse(name: str, pattern: str, **kw) -> StepLineParser:
    return feed(StepLineParser(pattern, **kw), (FIXTURES / name).read_text())


def test_nanogpt_lines_give_the_scripts_own_step_times_and_losses_but_not_its_evaluations():
    p = parse("nanogpt_shakespeare.log", PRESETS["nanogpt"], tokens_per_step=480)
    assert [s["loss"] for s in p.steps] == [4.2648, 3.2202, 2.7697, 2.6104, 2.5339, 2.5026, 1.6524]
    assert p.steps[0]["step_time_s"] == pytest.approx(9.37181) and p.steps[1]["step_time_s"] == pytest.approx(0.89376)
    assert [s["step"] for s in p.steps] == list(range(1, 8)) and all(s["tokens"] == 480 for s in p.steps)
    assert p.errors == [] and p.reported["loss_decimals"] == 4


def test_an_older_nanogpt_without_mfu_and_timestamped_lines_read_alike():
    p = parse("nanogpt_8gpu.log", PRESETS["nanogpt"])
    assert [s["step_time_s"] for s in p.steps] == pytest.approx([0.56194, 0.56315, 0.56211, 0.5628])
    p = parse("nanogpt_nan.log", PRESETS["nanogpt"])
    assert len(p.steps) == 6 and p.steps[3]["step_time_s"] == pytest.approx(35.39233)  # the checkpoint's iteration
    assert math.isnan(p.steps[4]["loss"])


def test_a_nan_loss_and_an_out_of_memory_error_are_failures():
    p = parse("nanogpt_nan.log", PRESETS["nanogpt"])
    assert [e["kind"] for e in p.errors] == [FailureKind.DIVERGED]
    assert "iter 3010: loss nan" in p.errors[0]["message"]
    p = parse("nanogpt_oom.log", PRESETS["nanogpt"])
    assert [e["kind"] for e in p.errors] == [FailureKind.OOM] and p.steps == []


def test_step_loss_lines_of_hand_written_loops_are_timed_by_arrival():
    text = "epoch 0\nstep 1 | loss 2.5000 | lr 1e-3\nstep: 2, loss: 2.4\nStep 3 loss=2.3\nvalidation loss 2.0\n"
    p = feed(StepLineParser(PRESETS["step_loss"], tokens_per_step=64), text, dt=0.25)
    assert [s["loss"] for s in p.steps] == [2.5, 2.4, 2.3]
    assert [s["step_time_s"] for s in p.steps] == pytest.approx([0.25, 0.25, 0.25])  # the first from the output's start


def test_hf_dicts_are_read_for_a_script_that_wraps_the_trainer():
    text = ("{'loss': '6.265', 'grad_norm': '0.8155', 'learning_rate': '0.0005', 'epoch': '1.6e-05'}\n"
            "{'loss': 'nan', 'grad_norm': 'nan', 'learning_rate': '0.0005', 'epoch': '3.2e-05'}\n"
            "{'train_runtime': '3.1', 'train_samples_per_second': '1.0', 'train_loss': '6.2'}\n")
    p = feed(StepLineParser(PRESETS["hf"]), text)
    assert p.steps[0]["loss"] == 6.265 and math.isnan(p.steps[1]["loss"]) and p.done
    assert [e["kind"] for e in p.errors] == [FailureKind.DIVERGED]


def test_a_declared_pattern_with_tokens_and_seconds():
    d = declaration(steps={"pattern": r"\[(?P<step>\d+)/\d+\] loss=(?P<loss>\S+) (?P<time_s>[\d.]+)s/it "
                                      r"tok=(?P<tokens>\d+)"}, tokens_per_sample=None)
    r = recipe(decl=d)
    p = feed(command().parser(r), "[1/100] loss=3.25 0.5s/it tok=2048\nnoise\n[2/100] loss=3.125 0.25s/it tok=2048\n")
    assert [(s["loss"], s["step_time_s"], s["tokens"]) for s in p.steps] == [(3.25, 0.5, 2048), (3.125, 0.25, 2048)]
    assert p.reported["loss_decimals"] == 2
    assert command().loss_resolution(r, 3.125, p.reported) == pytest.approx(0.005)
