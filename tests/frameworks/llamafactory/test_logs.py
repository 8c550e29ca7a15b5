"""The LLaMA-Factory log parser on real output pasted into LLaMA-Factory issues (fixtures/SOURCES.md names each)."""

from __future__ import annotations

import math

import pytest

from attune.frameworks.llamafactory import LlamaFactoryLogParser
from attune.trial import FailureKind
from tests.frameworks.llamafactory.helpers import FIXTURES, feed, lf, recipe


def parsed(name: str, **kw):
    return feed(LlamaFactoryLogParser(global_batch=kw.pop("global_batch", 16), **kw), (FIXTURES / name).read_text())


def test_healthy_steps_give_one_record_each():
    p = parsed("lf-steps-zero2.log", tokens_per_sample=1024)
    assert [s["step"] for s in p.steps] == [1, 2, 3, 4]
    assert [s["loss"] for s in p.steps] == [1.6228, 1.6573, 1.6861, 1.677]
    assert p.steps[3]["grad_norm"] == pytest.approx(8.5338134765625)
    assert p.steps[0]["learning_rate"] == pytest.approx(4.9424511162240815e-06)
    assert all(s["tokens"] == 16 * 1024 for s in p.steps) and p.steps[1]["step_time_s"] == pytest.approx(0.5)
    assert not p.errors and not p.done


def test_the_trainers_startup_lines_are_read_behind_the_explicit_log_format():
    p = parsed("lf-startup.log")
    assert p.reported == {"per_device_train_batch_size": 1, "total_train_batch_size": 16}
    assert not p.steps and not p.errors


def test_llamafactorys_own_echo_is_no_step_and_nan_grad_norm_diverges():
    """#6286: each step is printed twice, by the Trainer and by llamafactory.train.callbacks (loss rounded to
    0.0000); the run has diverged (grad_norm nan, loss printed as 0)."""
    p = parsed("lf-0.9.1-gradnorm-nan-callbacks.log")
    assert len(p.steps) == 3 and all(s["loss"] == 0.0 and math.isnan(s["grad_norm"]) for s in p.steps)
    assert [s["learning_rate"] for s in p.steps] == pytest.approx([4.998452110450943e-05, 4.998223113110496e-05,
                                                                   4.9979783305842495e-05])
    assert [e["kind"] for e in p.errors] == [FailureKind.DIVERGED]
    assert "grad_norm became nan at step 1" in p.errors[0]["message"]


def test_a_nan_grad_norm_is_the_failure_from_its_first_step():
    p = parsed("lf-0.9.1-npu-nan.log")
    assert len(p.steps) == 4 and p.steps[0]["loss"] == 1.4596
    assert [e["kind"] for e in p.errors] == [FailureKind.DIVERGED] and "step 1" in p.errors[0]["message"]


def test_fp16_loss_scaling_skips_are_no_failure():
    """With fp16 the Trainer's dynamic loss scaling skips a step whose gradients overflow (its grad_norm is inf/nan
    by design); only a non-finite loss is a failure then."""
    p = parsed("lf-0.9.1-npu-nan.log", fp16=True)
    assert len(p.steps) == 4 and not p.errors


@pytest.mark.parametrize("name", ["lf-oom-backward.log", "lf-oom-torchrun-ranks.log"])
def test_out_of_memory_is_read(name):
    p = parsed(name)
    assert [e["kind"] for e in p.errors] == [FailureKind.OOM] and "CUDA out of memory" in p.errors[0]["message"]
    assert not p.steps


def test_the_frameworks_parser_knows_the_global_batch_and_precision(tmp_path):
    r = recipe(tmp_path)
    p = lf().parser(r)
    assert isinstance(p, LlamaFactoryLogParser) and p.global_batch == 8 and p.fp16 is False
    feed(p, (FIXTURES / "lf-startup.log").read_text())
    problems = lf().report_problems(r, p.reported)
    assert problems == ["LLaMA-Factory's Trainer reported total train batch size = 16, the recipe reads 8"]
