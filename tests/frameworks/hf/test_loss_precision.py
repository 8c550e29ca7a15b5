"""HF trials' loss checks at full precision: the losses come from the Trainer's own TensorBoard events, not from
its four-digit log lines, so a real drift of 1e-4 in a loss near 10 (far below the log's ±5e-3) is seen."""

from __future__ import annotations

import os
import shutil
import struct
import sys
from pathlib import Path

import pytest

from attune.frameworks.hf import tensorboard as tb
from attune.gate.equivalence import compare_losses, derive_tolerance
from attune.recipe.io import parse_recipe
from attune.testing.procs import processes_in
from attune.trial import TrialOutcome
from tests.frameworks.hf.helpers import FIXTURES, backend, cmd, hf, recipe, request, with_argv

JOB = cmd("python loss_offset.py --vocab_size 22000 --output_dir out --max_steps 1000 "
          "--per_device_train_batch_size 2 --gradient_accumulation_steps 1 --learning_rate 1e-3 --seed 0 "
          "--use_cpu True")


@pytest.mark.slow
def test_a_real_drift_of_1e_4_in_a_loss_near_10_is_seen(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{os.environ['PATH']}")  # attune reads it as trials do
    work = tmp_path / "job"
    work.mkdir()
    shutil.copy(FIXTURES / "loss_offset.py", work)
    base = recipe(JOB, work, devices_per_node=1).with_knobs(**{"env.OMP_NUM_THREADS": "1"})
    # the same job with a constant 1e-4 added to its loss: the same model, the logged loss 1e-4 higher
    shifted = parse_recipe(with_argv(base, [*JOB, "--loss_offset", "1e-4"]))
    runs = []
    for i, r in enumerate((base, base, shifted), start=1):
        res = backend().run(r, request(tmp_path, trial_id=i, trial_dir=tmp_path / f"trial-{i}", timeout_s=120))
        assert res.outcome is TrialOutcome.SUCCEEDED, res.message
        assert res.measurement.reported["loss_precision"] == "float32"
        runs.append(res.measurement)
    first, second, drifted = (m.losses for m in runs)
    assert all(9.5 < x < 10.5 for x in first) and len(first) == 4
    # what the log prints cannot show it: four digits of a loss near 10 are ±5e-3
    assert hf().loss_resolution(base, first[0]) == pytest.approx(5e-3)
    resolution = max(hf().loss_resolution(base, x, runs[2].reported) for x in drifted)
    assert resolution < 1e-6
    # the check, as the run loop makes it: a band from the baseline's own repeats, the drifted run against it
    tol = derive_tolerance([first, second])
    assert max(tol.per_step) < 1e-4
    verdict = compare_losses(first, drifted, tol)
    assert not verdict.passed, verdict
    assert verdict.max_abs_diff == pytest.approx(1e-4, rel=0.05)
    assert compare_losses(first, second, tol).passed  # the repeat itself is equivalent
    assert processes_in(tmp_path) == []


def _record(payload: bytes) -> bytes:
    return struct.pack("<Q", len(payload)) + b"\0" * 4 + payload + b"\0" * 4


def _event(step: int, value: float, tag: str = tb.LOSS_TAG) -> bytes:
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary

    return Event(step=step, summary=Summary(value=[Summary.Value(tag=tag, simple_value=value)])).SerializeToString()


def test_events_replace_printed_losses_only_when_they_are_this_trials(tmp_path):
    folder = tmp_path / tb.TB_DIR
    folder.mkdir()
    events = [_event(1, 10.00012), _event(1, 10.01234), _event(2, 9.99871), _event(2, 2.0, tag="train/grad_norm")]
    # a record cut short, as a writer killed mid-write leaves it, ends the file
    (folder / "events.out.tfevents.1.host").write_bytes(b"".join(map(_record, events)) + _record(_event(3, 9.9))[:-9])
    full = tb.scalars(folder)
    assert full == {1: pytest.approx(10.01234), 2: pytest.approx(9.99871)}  # the last value of a step wins
    printed = [{"step": 1, "loss": 10.01}, {"step": 2, "loss": 9.999}]
    merged, precision = tb.merge_losses(printed, full)
    assert precision == tb.FULL and [m["loss"] for m in merged] == [full[1], full[2]]
    # a printed value its event does not round to: the events are another run's, the printed values stay
    assert tb.merge_losses([{"step": 1, "loss": 10.02}, {"step": 2, "loss": 9.999}], full) == (
        [{"step": 1, "loss": 10.02}, {"step": 2, "loss": 9.999}], tb.PRINTED)
    # a step the events do not have (tensorboardX's writer thread had not written it): printed, all of them
    assert tb.merge_losses([*printed, {"step": 3, "loss": 9.9}], full)[1] == tb.PRINTED
    assert tb.scalars(tmp_path / "nowhere") == {}


def test_the_check_states_a_float32_resolution_for_full_precision_losses():
    r = recipe(JOB, ".")
    assert hf().loss_resolution(r, 10.0, {"loss_precision": "float32"}) == pytest.approx(2 ** -21)  # half a ulp
    assert hf().loss_resolution(r, 10.0, {"loss_precision": "printed"}) == pytest.approx(5e-3)
    assert tb.printed_agrees(10.00049, 10.0) and not tb.printed_agrees(10.006, 10.0)
    assert tb.printed_agrees(0.12344, 0.1234) and tb.printed_agrees(float("nan"), float("nan"))
