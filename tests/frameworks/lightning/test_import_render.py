"""Import of LightningCLI launches and rendering back: an unchanged recipe renders the user's argv exactly, a knob
change edits exactly its tokens (and the derived accumulation), a setting a config file decides is overridden by an
appended flag; bad launches are refused with the field and the fix."""

from __future__ import annotations

import pytest

from attune.errors import RecipeError
from tests.frameworks.lightning.helpers import EXAMPLE, POOR, cmd, imported, lightning, recipe, run_sh_argv

BATCH, ACC, DEVICES, WORKERS = "data.batch_size", "trainer.accumulate_grad_batches", "trainer.devices", \
    "data.num_workers"


def test_run_sh_is_the_poor_command():
    assert run_sh_argv() == POOR


def test_import_reads_the_launch_and_its_config_file():
    data = imported(POOR, env={"OMP_NUM_THREADS": "1", "HF_TOKEN": "secret"})
    assert data["framework"] == "lightning" and data["launch"]["argv"] == POOR
    assert data["launch"]["files"] == {"config.yaml": (EXAMPLE / "config.yaml").read_text()}
    assert data["launch"]["env"] == {}  # nothing that shapes the run, and never a secret
    assert data["knobs"] == {BATCH: 1, DEVICES: 1, WORKERS: 0, "trainer.precision": "32-true",
                             "env.OMP_NUM_THREADS": "1"}
    assert data["resources"] == {"accelerator": "cpu", "devices_per_node": 1, "nodes": 1}


@pytest.mark.parametrize("argv", [
    POOR,
    "python train.py fit --config=config.yaml --data.batch_size=2 --trainer.accumulate_grad_batches=16",
    "python -u train.py fit -c config.yaml --data.batch_size 4 --trainer.devices auto --trainer.max_steps -1",
    "python train.py fit --data.batch_size 8 --trainer.precision bf16",
])
def test_an_unchanged_recipe_renders_the_users_argv_exactly(argv):
    argv = argv.split() if isinstance(argv, str) else argv
    r = recipe(argv)
    assert list(lightning().render(r).argv) == argv


def test_a_batch_change_edits_its_tokens_and_the_accumulation_only():
    r = recipe(POOR).with_knobs(**{BATCH: 4})
    assert list(lightning().render(r).argv) == [*POOR[:8], "4", POOR[9], "8", *POOR[11:]]


def test_equals_forms_keep_their_form():
    argv = cmd("python train.py fit --config=config.yaml --data.batch_size=2 --trainer.accumulate_grad_batches=16")
    r = recipe(argv).with_knobs(**{BATCH: 8})
    assert list(lightning().render(r).argv) == [*argv[:4], "--data.batch_size=8", "--trainer.accumulate_grad_batches=4"]


def test_device_count_between_several_processes_rederives_the_accumulation():
    argv = cmd("python train.py fit --config config.yaml --trainer.devices 2 --data.batch_size 2 "
           "--trainer.accumulate_grad_batches 8 --trainer.strategy ddp")
    r = recipe(argv, devices_per_node=4).with_knobs(**{DEVICES: 4})
    out = list(lightning().render(r).argv)
    assert out == swap_all(argv, {"--trainer.devices": "4", "--trainer.accumulate_grad_batches": "4"})
    assert lightning().render(r).env["OMP_NUM_THREADS"] == "1"  # 4 CPU slots / 4 processes


def swap_all(argv: list[str], values: dict[str, str]) -> list[str]:
    out = list(argv)
    for flag, value in values.items():
        out[out.index(flag) + 1] = value
    return out


def test_a_setting_only_the_config_file_gives_is_overridden_by_an_appended_flag(tmp_path):
    (tmp_path / "cfg.yaml").write_text("data:\n  batch_size: 2\ntrainer:\n  accumulate_grad_batches: 8\n")
    argv = ["python", "train.py", "fit", "--config", "cfg.yaml"]
    r = recipe(argv, tmp_path)
    assert r.knob(BATCH) == 2
    launch = lightning().render(r.with_knobs(**{BATCH: 16}))
    assert list(launch.argv) == [*argv, "--data.batch_size", "16", "--trainer.accumulate_grad_batches", "1"]
    assert launch.files == {"cfg.yaml": (tmp_path / "cfg.yaml").read_text()}  # the file stays verbatim


def test_a_flag_before_the_config_file_that_sets_it_loses_and_is_not_edited(tmp_path):
    (tmp_path / "cfg.yaml").write_text("data:\n  batch_size: 2\n")
    argv = ["python", "train.py", "fit", "--data.batch_size", "1", "--config", "cfg.yaml"]
    r = recipe(argv, tmp_path)
    assert r.knob(BATCH) == 2  # the file, read after the flag, decides (as in jsonargparse)
    out = list(lightning().render(r.with_knobs(**{BATCH: 1})).argv)
    assert out == [*argv, "--data.batch_size", "1", "--trainer.accumulate_grad_batches", "2"]


def test_a_knob_the_launch_does_not_give_is_appended():
    argv = cmd("python train.py fit --data.batch_size 4 --trainer.accumulate_grad_batches 2 --data.num_workers 0")
    r = recipe(argv).with_knobs(**{WORKERS: 2, "env.OMP_NUM_THREADS": "2"})
    launch = lightning().render(r)
    assert list(launch.argv) == swap_all(argv, {"--data.num_workers": "2"})
    assert launch.env["OMP_NUM_THREADS"] == "2"


def test_workers_move_only_where_the_launch_passes_them():
    r = recipe("python train.py fit --data.batch_size 4")
    assert r.knob(WORKERS) is None
    with pytest.raises(ValueError, match=r"add --data\.num_workers N"):
        r.with_knobs(**{WORKERS: 2})
    # and a launch that passes them cannot have them dropped to null ("not set"), which would render `None`
    # (seen in a real tune: the trial failed with jsonargparse's "Expected a <class 'int'>. Got value: None")
    r = recipe("python train.py fit --data.batch_size 4 --data.num_workers 0")
    with pytest.raises(ValueError, match=r"passes --data\.num_workers 0, so null \(not set\) is no value"):
        r.with_knobs(**{WORKERS: None})


def test_one_process_never_becomes_several():
    r = recipe(POOR, devices_per_node=2)
    with pytest.raises(ValueError, match="DistributedSampler"):
        r.with_knobs(**{DEVICES: 2})


@pytest.mark.parametrize("argv,match", [
    ("python train.py fit --trainer.devices 1", r"does not set data\.batch_size.*--data\.batch_size N"),
    ("python train.py validate --data.batch_size 2", "attune tunes training"),
    ("torchrun --nproc_per_node 2 train.py fit --data.batch_size 2", "Lightning starts its own processes"),
    ("python train.py fit --data.batch_size 3", r"knobs\.data\.batch_size: the launch has 3"),
    ("python train.py fit --data.batch_size 2 --config missing.yaml", "cannot read the config file missing.yaml"),
    ("python train.py fit --data.batch_size 2 --print_config", "prints and exits"),
    ("python train.py fit --data.batch_size", "has no value"),
    ("python train.py fit --data.batch_size 2 --trainer.accumulate_grad_batches two", "whole number"),
])
def test_bad_launches_are_refused_with_the_fix(argv, match):
    with pytest.raises(RecipeError, match=match):
        imported(argv)


def test_set_native_edits_the_command_line_or_appends():
    data = imported(POOR)
    assert lightning().set_native(data, "model.learning_rate", 0.002)
    assert data["launch"]["argv"] == [*POOR, "--model.learning_rate", "0.002"]
    assert lightning().set_native(data, "trainer.accumulate_grad_batches", 8)
    assert data["launch"]["argv"][POOR.index("--trainer.accumulate_grad_batches") + 1] == "8"
    assert not lightning().set_native(data, "data.batch_size", 2)  # a knob: set as a knob
    assert not lightning().set_native(data, "global_batch", 2)  # no LightningCLI setting
