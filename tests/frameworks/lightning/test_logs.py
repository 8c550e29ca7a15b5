"""Lightning trial output → step records: real output of the example (two ddp processes on a CPU, a diverging run,
``detect_anomaly``), rank lines that arrive in any order, failure signatures and the Trainer's own report."""

from __future__ import annotations

import math

import pytest

from attune.frameworks.lightning.logs import LightningLogParser
from attune.trial import FailureKind
from tests.frameworks.lightning.helpers import FIXTURES, cmd, feed, lightning, recipe

DDP = (FIXTURES / "ddp_two_processes.log").read_text()


def rank_losses(text: str, step: int) -> list[float]:
    import json

    return [json.loads(ln.split(" ", 1)[1])["loss"] for ln in text.splitlines()
            if ln.startswith("attune-lightning ") and f'"step": {step}, "rank"' in ln]


def test_two_processes_make_one_record_per_optimizer_step():
    p = feed(LightningLogParser(t0=100.0), DDP, dt=0.5)
    assert [s["step"] for s in p.steps] == [1, 2, 3] and p.done and not p.errors
    for rec, step in zip(p.steps, (1, 2, 3)):
        losses = rank_losses(DDP, step)
        assert len(losses) == 2 and rec["loss"] == pytest.approx(sum(losses) / 2, abs=1e-12)
        assert rec["tokens"] == 2 * 16 * 128  # both ranks' token ids (16 sequences of 128 each)
    lines = DDP.splitlines()
    last_of_step = [max(i for i, ln in enumerate(lines) if f'"step": {n}, "rank"' in ln) for n in (1, 2, 3)]
    # a step's time runs from the previous step's completing line to its own (the first: from the parser's start)
    assert p.steps[0]["step_time_s"] == pytest.approx((last_of_step[0] + 1) * 0.5)
    assert p.steps[2]["step_time_s"] == pytest.approx((last_of_step[2] - last_of_step[1]) * 0.5)
    assert p.reported == {"batch_size": 4, "accumulate_grad_batches": 4, "world_size": 2, "num_nodes": 1,
                          "devices": 2, "precision": "32-true", "max_steps": 3, "max_epochs": -1,
                          "estimated_stepping_batches": 3, "trainable_parameters": 141056, "seed": "0",
                          "learning_rate": 1e-05, "global_batch": 32, "samples_per_step": 32}


def test_the_recipes_sample_length_counts_tokens_where_given():
    p = feed(LightningLogParser(tokens_per_sample=100), DDP)
    assert [s["tokens"] for s in p.steps] == [3200, 3200, 3200]


def test_a_step_waits_for_every_rank():
    p = LightningLogParser(t0=0.0)
    one = 'attune-lightning {"event": "step", "step": 1, "rank": %d, "world": 2, "loss": %s, "samples": 4}'
    p.feed(one % (1, "2.0"), 1.0)
    assert p.steps == []
    p.feed("[rank: 0] " + one % (0, "4.0"), 1.5)
    assert len(p.steps) == 1 and p.steps[0]["loss"] == 3.0 and p.steps[0]["step_time_s"] == 1.5
    assert p.steps[0]["tokens"] == 8  # no token ids counted and no sample length: samples


def test_a_real_diverging_run_is_a_diverged_failure():
    p = feed(LightningLogParser(), (FIXTURES / "nan_loss.log").read_text())
    assert math.isfinite(p.steps[0]["loss"]) and math.isnan(p.steps[1]["loss"])
    assert [e["kind"] for e in p.errors] == [FailureKind.DIVERGED] and "step 2" in p.errors[0]["message"]


def test_detect_anomaly_is_a_diverged_failure():
    p = feed(LightningLogParser(), (FIXTURES / "detect_anomaly.log").read_text())
    assert len(p.steps) == 1 and not p.done
    assert p.errors[0]["kind"] == FailureKind.DIVERGED and "detect_anomaly" in p.errors[0]["message"]


@pytest.mark.parametrize("line,kind", [
    ("RuntimeError: [enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate memory: you tried "
     "to allocate 68719476736 bytes.", FailureKind.OOM),
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", FailureKind.OOM),
    ("Monitored metric train_loss = nan is not finite. Previous best value was 5.600.", FailureKind.DIVERGED),
    ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer", FailureKind.COMM),
])
def test_failure_signatures(line, kind):
    p = LightningLogParser()
    p.feed(line, 1.0)
    assert [e["kind"] for e in p.errors] == [kind]


def test_trainer_stopped_line_means_done():
    p = LightningLogParser()
    p.feed("`Trainer.fit` stopped: `max_steps=3` reached.", 1.0)
    assert p.done


def test_the_trainers_report_is_checked_against_the_recipe():
    argv = cmd("python train.py fit --config config.yaml --trainer.devices 2 --data.batch_size 4 "
           "--trainer.accumulate_grad_batches 4")
    r = recipe(argv, devices_per_node=2)
    reported = feed(LightningLogParser(), DDP).reported
    assert lightning().report_problems(r, reported) == []
    problems = lightning().report_problems(r.with_knobs(**{"data.batch_size": 8}), reported)
    assert "Lightning reported batch_size = 4, the recipe reads 8" in problems
    assert "Lightning reported accumulate_grad_batches = 4, the recipe reads 2" in problems


def test_a_step_without_a_loss_is_a_crash_naming_the_fix():
    p = LightningLogParser()
    p.feed('attune-lightning {"event": "step", "step": 1, "rank": 0, "world": 1, "loss": null, "samples": 4}', 1.0)
    assert len(p.steps) == 1 and math.isnan(p.steps[0]["loss"])  # the step counts: the trial still ends on time
    assert [e["kind"] for e in p.errors] == [FailureKind.CRASH] and "return the loss" in p.errors[0]["message"]
