"""The runtime contract check for DeepSpeed: every trial's own start-up config dump (``DeepSpeedEngine
configuration:``, real logs of deepspeed 0.19.8 in ``fixtures/``) states the batch triple DeepSpeed resolved, its
world size, clipping, precision, optimizer and scheduler; a trial whose dump contradicts its recipe or the
baseline's run is a contract violation, whatever the recipe said."""

from __future__ import annotations

from attune.engine.loop import TrialPlan, trial_record, verified
from attune.frameworks.deepspeed.logs import DeepSpeedLogParser, HFDeepSpeedLogParser
from attune.gate import evaluate
from attune.recipe.io import parse_recipe
from attune.trial import TrialOutcome
from tests.frameworks.deepspeed.helpers import FIXTURES, ds, feed, hf_recipe, poor, with_config
from tests.reported import baseline_state, succeeded


def reported(fixture: str, parser=None) -> dict:
    p = parser or DeepSpeedLogParser(train_batch=32)
    return dict(feed(p, (FIXTURES / fixture).read_text()).reported)


def test_the_config_dump_of_a_real_trial_is_read():
    assert reported("ds0.19.8-trial-1proc.log") == {
        "train_batch_size": 32, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 32,
        "world_size": 1, "gradient_clipping": 1, "fp16_enabled": False, "bf16_enabled": False,
        "optimizer_name": "adamw", "optimizer_lr": 0.0005, "scheduler_name": "WarmupCosineLR"}
    two = reported("ds0.19.8-2proc-wallclock.log")
    assert (two["train_batch_size"], two["train_micro_batch_size_per_gpu"], two["gradient_accumulation_steps"],
            two["world_size"]) == (32, 4, 4, 2)
    # an HF Trainer under DeepSpeed: the dump shows the "auto" values as the Trainer filled them
    hf = reported("ds0.19.8-hf5.24-trainer.log", HFDeepSpeedLogParser(global_batch=16))
    assert (hf["train_batch_size"], hf["train_micro_batch_size_per_gpu"], hf["gradient_accumulation_steps"]) == \
        (16, 4, 4)
    assert hf["optimizer_lr"] == 0.0005 and hf["scheduler_name"] == "WarmupDecayLR" and hf["gradient_clipping"] == 1.0


def test_the_dump_is_not_read_as_steps_or_losses():
    p = feed(DeepSpeedLogParser(train_batch=32), (FIXTURES / "ds0.19.8-trial-1proc.log").read_text())
    assert len(p.steps) == 8 and all(r["loss"] > 6 for r in p.steps)


def test_a_trial_agrees_with_the_recipe_it_ran(tmp_path):
    # the fixture is trial 1 of the example's poor recipe (ZeRO-3, micro-batch 1 × 32 accumulation, 1 process)
    assert ds().report_problems(poor(tmp_path), reported("ds0.19.8-trial-1proc.log")) == []


def test_a_config_misread_by_attune_is_caught_from_the_trials_own_dump(tmp_path):
    """The recipe reads train_batch_size 64 with micro-batch 2 (what a misread config would give), DeepSpeed ran
    32 = 1 × 32: the dump convicts the trial."""
    r = poor(tmp_path)
    misread = parse_recipe(with_config(r, r.launch.files["ds_config.json"].replace('"train_batch_size": 32',
                                                                                    '"train_batch_size": 64')))
    assert misread.knob("train_micro_batch_size_per_gpu") == 1
    problems = ds().report_problems(misread, reported("ds0.19.8-trial-1proc.log"))
    assert problems == ["DeepSpeed reported train_batch_size = 32, the recipe reads 64",
                        "DeepSpeed reported gradient_accumulation_steps = 32, the recipe reads 64"]
    state = baseline_state(misread, succeeded({}))
    checked = verified(state, misread, succeeded(reported("ds0.19.8-trial-1proc.log")))
    assert checked.outcome is TrialOutcome.CRASHED and checked.message.startswith("contract violation")
    assert "train_batch_size = 32, the recipe reads 64" in checked.message


def test_a_contract_change_forced_past_the_gate_is_rejected_against_the_baselines_run(tmp_path):
    base = poor(tmp_path)
    ok = reported("ds0.19.8-trial-1proc.log")
    state = baseline_state(base, succeeded(ok))
    text = base.launch.files["ds_config.json"]
    cases = {  # a change of the user's config the gate refuses, and the dump such a trial prints
        "train_batch_size": ('"train_batch_size": 32', '"train_batch_size": 64', 64),
        "optimizer_lr": ('"lr": 0.0005', '"lr": 0.001', 0.001),
    }
    for name, (old, new, value) in cases.items():
        assert old in text, old
        forced = parse_recipe(with_config(base, text.replace(old, new)))
        assert not evaluate(base, forced).admitted, name
        plan = TrialPlan(id=2, kind="candidate", recipe=forced, change={}, rationale="", source="test", verdict=None)
        trial = {**ok, name: value}
        if name == "train_batch_size":
            trial["gradient_accumulation_steps"] = 64
        rec = trial_record(state, plan, succeeded(trial))
        assert rec.outcome is TrialOutcome.CRASHED and rec.decision.startswith("rejected"), rec
        assert f"the job reported {name} = {value}, the baseline's run reported {ok[name]}" in rec.message
    # the knob-controlled split of the same batch reports another triple and passes
    cand = base.with_knobs(train_micro_batch_size_per_gpu=4)
    fine = {**ok, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 8}
    plan = TrialPlan(id=3, kind="candidate", recipe=cand, change={"train_micro_batch_size_per_gpu": 4},
                     rationale="", source="test", verdict=None)
    assert trial_record(state, plan, succeeded(fine)).outcome is TrialOutcome.SUCCEEDED


def test_an_hf_launch_under_deepspeed_checks_the_trainers_filled_values(tmp_path):
    r = hf_recipe(tmp_path)  # 2 processes × 4 per device × 2 accumulation = 16
    dump = {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
            "world_size": 2}
    assert ds().report_problems(r, dump) == []
    assert ds().report_problems(r, {**dump, "world_size": 1, "train_batch_size": 8}) == [
        "DeepSpeed reported train_batch_size = 8, the recipe reads 16",
        "DeepSpeed reported world_size = 1, the recipe reads 2"]


def test_an_hf_launch_under_deepspeed_refuses_abbreviated_trainer_flags(tmp_path):
    """With "auto" batch sizes the Trainer fills DeepSpeed's triple from its own flags; an abbreviation
    (``--per_device_train 1``) would be read by HfArgumentParser as the batch per device and by attune as the
    default 8, so the launch is refused, naming the flag and the full name."""
    import pytest

    from attune.errors import RecipeError
    from tests.frameworks.deepspeed.helpers import HF_ARGV

    argv = [a.replace("--per_device_train_batch_size", "--per_device_train") for a in HF_ARGV]
    with pytest.raises(RecipeError) as err:
        hf_recipe(tmp_path, argv=argv)
    assert "--per_device_train is an abbreviation" in str(err.value)
    assert "write --per_device_train_batch_size" in str(err.value)


def test_auto_values_are_resolved_as_the_trainer_resolved_them_in_a_real_run(tmp_path):
    """The fixture's run: `deepspeed --num_gpus 1 hf_train.py --deepspeed ds_hf.json --output_dir out --max_steps 1000
    --per_device_train_batch_size 4 --gradient_accumulation_steps 4 --learning_rate 5e-4 --warmup_steps 10 --seed 0`,
    every batch, optimizer and scheduler value "auto". What attune resolves from the launch is what DeepSpeed's own
    dump says it ran with."""
    import ast

    from attune.frameworks.deepspeed import settings
    from attune.frameworks.deepspeed.logs import CONFIG_LINE
    from tests.frameworks.deepspeed.helpers import HF_ARGV

    argv = ["deepspeed", "--num_gpus", "1", "train.py", "--deepspeed", "ds_zero2.json", "--output_dir", "out",
            "--max_steps", "1000", "--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "4",
            "--learning_rate", "5e-4", "--warmup_steps", "10", "--seed", "0"]
    assert HF_ARGV[:6] == ["deepspeed", "--num_gpus", "2", "train.py", "--deepspeed", "ds_zero2.json"]
    s = settings.read(hf_recipe(tmp_path, argv=argv))
    dump = {}
    for line in (FIXTURES / "ds0.19.8-hf5.24-trainer.log").read_text().splitlines():
        m = CONFIG_LINE.search(line)
        if m:
            dump.setdefault(m.group(1), m.group(2))
    ran = {k: ast.literal_eval(dump[k]) for k in ("train_batch_size", "train_micro_batch_size_per_gpu",
                                                  "gradient_accumulation_steps", "gradient_clipping",
                                                  "optimizer_params", "scheduler_params")}
    assert (s.train_batch, s.micro, s.accumulation) == (ran["train_batch_size"], ran["train_micro_batch_size_per_gpu"],
                                                        ran["gradient_accumulation_steps"]) == (16, 4, 4)
    assert s.resolved["gradient_clipping"] == ran["gradient_clipping"]
    opt = s.resolved["optimizer"]["params"]
    assert {k: opt[k] for k in ("lr", "betas", "eps", "weight_decay")} == \
        {k: ran["optimizer_params"][k] for k in ("lr", "betas", "eps", "weight_decay")}
    assert s.resolved["scheduler"]["params"] == ran["scheduler_params"]
