"""The DeepSpeed log parser on real deepspeed 0.19.8 output (fixtures/README.md says how each was recorded)."""

from __future__ import annotations

import math
import re

import pytest

from attune.backends.local import classify
from attune.engine.measure import summarise
from attune.frameworks.deepspeed.logs import DeepSpeedLogParser, HFDeepSpeedLogParser
from attune.trial import TrialOutcome
from tests.frameworks.deepspeed.helpers import FIXTURES, ds, feed


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def samples_per_s(text: str) -> list[float]:
    return [float(x) for x in re.findall(r"CurrSamplesPerSec=([\d.]+)", text)]


def test_trial_log_gives_one_record_per_step():
    text = fixture("ds0.19.8-trial-1proc.log")
    p = feed(DeepSpeedLogParser(train_batch=32, tokens_per_sample=128, t0=99.0), text, dt=0.5, t0=100.0)
    assert [s["step"] for s in p.steps] == list(range(1, 9))  # step=0 (start-up) is not a step
    assert [s["loss"] for s in p.steps[:3]] == [6.410347, 6.388449, 6.411201]
    assert p.steps[2]["learning_rate"] == pytest.approx(0.0001192803136799156)
    assert all(s["tokens"] == 32 * 128 for s in p.steps)
    # steps 1-2: arrival times (DeepSpeed's throughput timer starts at step 3); from step 3: its own timer
    assert p.steps[1]["step_time_s"] == pytest.approx(1.0) and p.steps[1]["wall_s"] == pytest.approx(1.0)
    assert [s["step_time_s"] for s in p.steps[2:]] == pytest.approx([32 / x for x in samples_per_s(text)])
    assert p.steps[2]["peak_mem_mb"] == pytest.approx(0.44 * 1024, rel=0.2)
    assert not p.errors and not p.done


def test_measurement_from_the_parsed_steps():
    p = feed(DeepSpeedLogParser(train_batch=32, tokens_per_sample=128), fixture("ds0.19.8-trial-1proc.log"))
    m = summarise(p.steps, warmup_steps=2, devices=2)
    assert m.steps_measured == 6 and len(m.losses) == 8
    assert m.tokens_per_s == pytest.approx(32 * 128 / m.step_time_median_s)


def test_a_step_waits_for_its_loss_line():
    """The trial is ended on the count of parsed steps: a step counts once its loss has arrived."""
    text = fixture("ds0.19.8-trial-1proc.log")
    lines = text.splitlines(keepends=True)
    cut = next(i for i, ln in enumerate(lines) if "step=8," in ln)
    p = feed(DeepSpeedLogParser(train_batch=32), "".join(lines[:cut + 2]))  # step=8 and its throughput, no loss
    assert len(p.steps) == 7
    p.flush()  # the output ended: the step is published without its loss
    assert len(p.steps) == 8 and math.isnan(p.steps[-1]["loss"])
    p = feed(DeepSpeedLogParser(train_batch=32), "".join(lines[:cut + 3]))
    assert len(p.steps) == 8 and p.steps[-1]["loss"] == 6.377725


def test_wall_clock_breakdown_gives_phases_two_processes():
    text = fixture("ds0.19.8-2proc-wallclock.log")
    p = feed(DeepSpeedLogParser(train_batch=32), text)
    p.flush()
    assert len(p.steps) == 5 and [s["loss"] for s in p.steps] == [6.410345, 6.388448, 6.411201, 6.392628, 6.403045]
    first = p.steps[0]
    assert first["ds_timers_s"] == pytest.approx({"fwd": 0.40965, "bwd": 0.83512, "bwd_inner": 0.69925,
                                                 "bwd_allreduce": 0.13573, "step": 0.03184,
                                                 "optimizer_allgather": 0.0228, "optimizer_gradients": 0.00032,
                                                 "optimizer_step": 0.00232})  # ZeRO's, printed before step=1
    assert first["phases"] == pytest.approx({"forward": 0.40965, "backward": 0.69925, "dp_comm": 0.13573,
                                             "optimizer": 0.03184})
    m = summarise(p.steps, warmup_steps=2, devices=2)
    assert set(m.phases) == {"forward", "backward", "dp_comm", "optimizer"}


def test_losses_in_other_formats():
    ds_line = "[2026-12-01 10:14:13,832] [INFO] [logging.py:123:log_dist] [Rank 0] step={}, skipped={}, lr=[0.001], " \
        "mom=[(0.9, 0.95)]"
    lines = [ds_line.format(1, 0), "epoch 0 | iter 1 | loss: 5.25 | lr 1e-3",
             ds_line.format(2, 0), "{'loss': 5.0, 'step': 2}",
             ds_line.format(3, 1), "train loss=nan"]
    p = feed(DeepSpeedLogParser(train_batch=8), "\n".join(lines) + "\n")
    assert [s["loss"] for s in p.steps[:2]] == [5.25, 5.0] and math.isnan(p.steps[2]["loss"])
    assert p.steps[2]["skipped"] == 1 and [e["kind"] for e in p.errors] == ["diverged"]


def test_nan_loss_is_divergence():
    p = feed(DeepSpeedLogParser(train_batch=32), fixture("ds0.19.8-fp32-nan.log"))
    p.flush()
    assert len(p.steps) == 6 and p.steps[0]["loss"] == 6.410346 and all(math.isnan(s["loss"]) for s in p.steps[1:])
    assert [e["kind"] for e in p.errors] == ["diverged"] and "step 2" in p.errors[0]["message"]
    outcome, msg = classify(0, False, ds().collect(p, FIXTURES), 6)
    assert outcome is TrialOutcome.DIVERGED and "nan" in msg.lower()


def test_steps_skipped_for_overflow_are_divergence():
    """bf16 ZeRO-2 with an exploding learning rate: the loss stays finite (2.9e9) but every step from the second
    is skipped for non-finite gradients."""
    text = fixture("ds0.19.8-bf16-overflow.log")
    p = feed(DeepSpeedLogParser(train_batch=32), text)
    p.flush()
    assert p.overflows == 5 and [s["skipped"] for s in p.steps] == [0, 1, 2, 3, 4, 5]
    assert all(math.isfinite(s["loss"]) for s in p.steps)
    assert [e["kind"] for e in p.errors] == ["diverged"] and "3 optimizer steps in a row up to step 4" in \
        p.errors[0]["message"]
    outcome, msg = classify(0, False, ds().collect(p, FIXTURES), 6)
    assert outcome is TrialOutcome.DIVERGED and "skipped" in msg
    lines = [ln for ln in text.splitlines(keepends=True) if "global_step=4" not in ln]
    cut = next(i for i, ln in enumerate(lines) if "step=3," in ln)
    assert not feed(DeepSpeedLogParser(train_batch=32), "".join(lines[:cut + 1])).errors  # two in a row: settling


def test_fp16_loss_scale_at_minimum_is_divergence():
    """fp16 is not supported by this machine's CPU (no mkldnn fp16): the line is DeepSpeed 0.19.8's own text from
    ``runtime/fp16/loss_scaler.py`` as it reaches the log through a rank's traceback."""
    text = ("[2026-12-01 11:02:10,101] [INFO] [loss_scaler.py:265:update_scale] [deepspeed] OVERFLOW! Rank 0 Skipping "
            "step. Attempted loss scale: 65536, reducing to 32768\n"
            "[rank0]: Exception: Current loss scale already at minimum - cannot decrease scale anymore. Exiting run.\n")
    p = feed(DeepSpeedLogParser(train_batch=8), text)
    assert p.overflows == 1 and [e["kind"] for e in p.errors] == ["diverged"]
    outcome, msg = classify(1, False, ds().collect(p, FIXTURES), 8)
    assert outcome is TrialOutcome.DIVERGED and "loss scale" in msg


def test_host_out_of_memory():
    p = feed(DeepSpeedLogParser(train_batch=32), fixture("ds0.19.8-oom.log"))
    p.flush()
    assert not p.steps and [e["kind"] for e in p.errors] == ["oom"]
    outcome, msg = classify(1, False, ds().collect(p, FIXTURES), 8)
    assert outcome is TrialOutcome.OOM and "can't allocate memory" in msg


def test_hf_trainer_under_deepspeed():
    p = feed(HFDeepSpeedLogParser(global_batch=16, tokens_per_sample=128), fixture("ds0.19.8-hf5.24-trainer.log"))
    assert len(p.steps) >= 4 and all(6 < s["loss"] < 7 for s in p.steps)
    assert all(s["tokens"] == 16 * 128 for s in p.steps) and not p.errors
