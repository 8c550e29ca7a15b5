"""The second line of defence: each HF trial's own start-up log states what it trains (batch per device,
accumulation, total batch, optimisation steps, trainable parameters), and a trial that contradicts its recipe or
the baseline's run is a contract violation, whatever the recipe said. Real CPU trials of examples/hf-trainer."""

from __future__ import annotations

import pytest

from attune.engine.loop import RunState, TuneConfig, trial_record, verified
from attune.recipe.io import parse_recipe
from attune.testing.procs import processes_in
from attune.trial import TrialOutcome
from tests.frameworks.hf.helpers import backend, cmd, example_copy, hf, imported, request
from tests.reported import baseline_state, succeeded

LAUNCH = cmd("python train.py --output_dir out --max_steps 1000 --learning_rate 3e-4 --seed 42 --use_cpu True "
             "--report_to none --seq_len 16 --num_hidden_layers 1")


@pytest.mark.slow
def test_a_launch_misread_by_attune_is_caught_from_the_trials_own_log(tmp_path):
    """The issue's args-file bypass with the file unseen (as an older attune, or a container image, would): the
    recipe reads HF's defaults (8 × 1), the job trains 1 × 4, and its own log says so."""
    work = example_copy(tmp_path)
    (work / "train.args").write_text("--per_device_train_batch_size 1 --gradient_accumulation_steps 4\n")
    blind = parse_recipe(imported(LAUNCH, work, read_files=False, devices_per_node=1))
    assert blind.knob("per_device_train_batch_size") == 8 and not blind.launch.files
    res = backend().run(blind.with_knobs(**{"env.OMP_NUM_THREADS": "1"}), request(tmp_path, measure_steps=2))
    assert res.outcome is TrialOutcome.SUCCEEDED, res.message
    assert res.measurement.reported["total_train_batch_size"] == 4
    state = RunState(baseline=blind, config=TuneConfig.from_recipe(blind, 1.0))
    checked = verified(state, blind, res)
    assert checked.outcome is TrialOutcome.CRASHED and checked.message.startswith("contract violation"), checked
    assert "total train batch size = 4, the recipe reads 8" in checked.message
    assert "per device train batch size = 1, the recipe reads 8" in checked.message
    # read the way HF reads it (the file beside the script carried in the recipe), the same job verifies
    seen = parse_recipe(imported(LAUNCH, work, devices_per_node=1))
    assert seen.launch.files == {"train.args": (work / "train.args").read_text()}
    assert hf().report_problems(seen, res.measurement.reported) == []
    assert processes_in(tmp_path) == []


@pytest.mark.slow
def test_an_abbreviation_forced_past_the_import_check_is_caught_from_the_trials_own_log(tmp_path, monkeypatch):
    """The issue's abbreviation bypass (`--per_device_train 1 --gradient_acc 4`) with the import check switched off,
    as an attune without it read the launch: the recipe reads HF's defaults (8 × 1), argparse expands the prefixes
    and the job trains 1 × 4, and its own log says so."""
    from attune.frameworks.hf import fields

    monkeypatch.setattr(fields, "abbreviation_problems", lambda names, no_forms: [])
    work = example_copy(tmp_path)
    blind = parse_recipe(imported([*LAUNCH, "--per_device_train", "1", "--gradient_acc", "4"], work,
                                  devices_per_node=1))
    assert blind.knob("per_device_train_batch_size") == 8
    res = backend().run(blind.with_knobs(**{"env.OMP_NUM_THREADS": "1"}), request(tmp_path, measure_steps=2))
    assert res.outcome is TrialOutcome.SUCCEEDED, res.message
    assert (res.measurement.reported["per_device_train_batch_size"],
            res.measurement.reported["gradient_accumulation_steps"]) == (1, 4)
    checked = verified(RunState(baseline=blind, config=TuneConfig.from_recipe(blind, 1.0)), blind, res)
    assert checked.outcome is TrialOutcome.CRASHED and checked.message.startswith("contract violation"), checked
    assert "total train batch size = 4, the recipe reads 8" in checked.message
    assert processes_in(tmp_path) == []


@pytest.mark.slow
def test_a_batch_doubling_forced_past_the_gate_is_rejected_by_the_runtime_check(tmp_path):
    work = example_copy(tmp_path)
    base = parse_recipe(imported([*LAUNCH, "--per_device_train_batch_size", "1", "--gradient_accumulation_steps",
                                  "2"], work, devices_per_node=1)).with_knobs(**{"env.OMP_NUM_THREADS": "1"})
    base_res = backend().run(base, request(tmp_path, measure_steps=2, trial_dir=tmp_path / "t1"))
    assert base_res.outcome is TrialOutcome.SUCCEEDED, base_res.message
    state = baseline_state(base, base_res)
    # a candidate that doubles the accumulation in the user's own flag: the gate refuses it ...
    data = base.model_dump(mode="python")
    data["launch"]["argv"] = [*data["launch"]["argv"], "--gradient_accumulation_steps", "4"]
    doubled = parse_recipe(data)
    from attune.gate import evaluate

    assert not evaluate(base, doubled).admitted
    # ... and forced past it, the trial's own log convicts it (its recipe agrees with itself; the baseline's
    # run reported half the batch)
    res = backend().run(doubled, request(tmp_path, measure_steps=2, trial_dir=tmp_path / "t2"))
    assert res.outcome is TrialOutcome.SUCCEEDED and res.measurement.reported["total_train_batch_size"] == 4
    assert hf().report_problems(doubled, res.measurement.reported) == []
    checked = verified(state, doubled, res)
    assert checked.outcome is TrialOutcome.CRASHED
    assert "total_train_batch_size = 4, the baseline's run reported 2" in checked.message
    assert processes_in(tmp_path) == []


#: what the Trainer reports for the launch below (per-device 8 × accumulation 2)
OK = {"per_device_train_batch_size": 8, "gradient_accumulation_steps": 2, "total_train_batch_size": 16,
      "total_optimization_steps": 1000, "trainable_parameters": 123456}


def _state_with_a_reported_baseline(tmp_path):
    base = parse_recipe(imported([*LAUNCH, "--gradient_accumulation_steps", "2"], example_copy(tmp_path),
                                 devices_per_node=1))
    return base, baseline_state(base, succeeded(OK))


def test_the_record_of_a_trial_that_reports_another_contract_is_a_rejected_failure(tmp_path):
    from attune.engine.loop import TrialPlan

    base, state = _state_with_a_reported_baseline(tmp_path)
    cand = base.with_knobs(per_device_train_batch_size=4)
    plan = TrialPlan(id=2, kind="candidate", recipe=cand, change={"per_device_train_batch_size": 4}, rationale="",
                     source="test", verdict=None)
    fine = {**OK, "per_device_train_batch_size": 4, "gradient_accumulation_steps": 4}
    rec = trial_record(state, plan, succeeded(fine))
    assert rec.outcome is TrialOutcome.SUCCEEDED and rec.measurement.reported == fine
    for name, value in (("total_optimization_steps", 500), ("trainable_parameters", 6)):
        rec = trial_record(state, plan, succeeded({**fine, name: value}))
        assert rec.outcome is TrialOutcome.CRASHED and rec.decision.startswith("rejected"), rec
        assert f"{name} = {value}" in rec.message and rec.charged_hours == 0.001
    # a job that reports nothing (another framework, an older log) is not judged by it
    rec = trial_record(state, plan, succeeded({}))
    assert rec.outcome is TrialOutcome.SUCCEEDED


def test_the_report_shows_what_each_trial_reported(tmp_path):
    from attune.report.result import build_result, render_markdown

    _, state = _state_with_a_reported_baseline(tmp_path)
    result = build_result(state)
    assert result["trials"][0]["reported"] == OK
    text = render_markdown(result)
    assert "trainable parameters" in text and "| 1 | 2 | 8 | 1,000 | 16 | 123,456 |" in text
