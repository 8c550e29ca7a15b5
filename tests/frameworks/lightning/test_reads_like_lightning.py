"""attune reads a LightningCLI launch as LightningCLI itself does: each case runs Lightning's own parser
(``--print_config``, with the example's model and data module) and compares every setting attune relies on."""

from __future__ import annotations

import pytest

from attune.frameworks.lightning.catalogue import CONTRACT, normal_precision
from attune.frameworks.lightning.launch import canonical
from attune.frameworks.lightning.settings import device_count, read_launch
from tests.frameworks.lightning.helpers import EXAMPLE, EXAMPLE_MODULE, POOR, cmd, imported, lightning_config, lookup

pytest.importorskip("lightning")

#: settings attune reads for knobs, the contract and the global batch
KEYS = ("data.batch_size", "data.num_workers", "trainer.accumulate_grad_batches", "trainer.devices",
        "trainer.max_steps", "trainer.precision", "seed_everything", "model.learning_rate", "trainer.gradient_clip_val",
        "trainer.enable_progress_bar", "trainer.logger")


def compare(argv: list[str], cwd, **cli) -> dict:
    """attune's settings of ``argv`` against LightningCLI's: every key the launch sets, the contract defaults
    attune assumes where it does not, and the batch layout; returns attune's settings."""
    data = imported(argv, cwd)
    s = read_launch(data["launch"])
    config = lightning_config(argv[2:], cwd, **cli)
    for key in KEYS:
        theirs = lookup(config, key)
        if key in s.native:
            assert canonical(s.native[key]) == canonical(theirs), (key, s.native[key], theirs)
        elif key == "trainer.precision":
            assert s.precision == normal_precision(theirs), (key, s.precision, theirs)
        elif key in CONTRACT:
            assert s.value(key) == canonical(theirs), (key, s.value(key), theirs)
    assert s.batch == lookup(config, "data.batch_size")
    assert s.accumulation == lookup(config, "trainer.accumulate_grad_batches")
    assert s.devices == device_count(lookup(config, "trainer.devices"), "cpu")
    return s.native


def test_the_example_command(tmp_path):
    native = compare(POOR, EXAMPLE)
    assert native["trainer.max_steps"] == 10000 and native["model.learning_rate"] == 1e-3


@pytest.mark.parametrize("tail", [
    ["--data.batch_size=4", "--config", "config.yaml"],  # a flag before the file: the file lacks it, the flag stays
    ["--config", "config.yaml", "--trainer.max_steps=77", "--seed_everything", "5", "--data.batch_size", "2"],
    ["-c", "config.yaml", "--trainer.precision", "bf16", "--model.learning_rate", "2e-3", "--data.batch_size", "4"],
    ["--data.batch_size", "4", "--trainer.enable_progress_bar", "False", "--trainer.logger", "false"],
    ["--data.batch_size", "4", "--trainer.max_steps", "-1", "--trainer.gradient_clip_val", "0.5"],
])
def test_flags_and_config_files_in_order(tail):
    compare(["python", "train.py", "fit", *tail], EXAMPLE)


def test_a_config_file_after_a_flag_overrides_it_and_a_later_flag_overrides_the_file(tmp_path):
    (tmp_path / "a.yaml").write_text("data:\n  batch_size: 2\ntrainer:\n  max_steps: 9\n  accumulate_grad_batches: 3\n")
    native = compare(cmd("python train.py fit --data.batch_size 8 --trainer.max_steps 5 --config a.yaml "
                     "--trainer.max_steps 11"), tmp_path)
    assert native["data.batch_size"] == 2 and native["trainer.max_steps"] == 11
    assert native["trainer.accumulate_grad_batches"] == 3


def test_a_top_level_config_gives_the_subcommands_defaults(tmp_path):
    (tmp_path / "top.yaml").write_text("fit:\n  trainer:\n    max_steps: 9\n    accumulate_grad_batches: 4\n"
                                       "  data:\n    batch_size: 2\n")
    native = compare(cmd("python train.py --config top.yaml fit --trainer.max_steps 12"), tmp_path)
    assert native["trainer.max_steps"] == 12 and native["trainer.accumulate_grad_batches"] == 4
    assert native["data.batch_size"] == 2


def test_init_args_name_the_same_setting_in_subclass_mode(tmp_path):
    (tmp_path / "sub.yaml").write_text(f"data:\n  class_path: {EXAMPLE_MODULE}.TokenData\n  init_args:\n"
                                       "    batch_size: 2\n    num_workers: 1\n")
    for tail in (["-c", "sub.yaml", "--data.batch_size", "4"], ["--config=sub.yaml", "--data.init_args.batch_size=8"],
                 ["--data", f"{EXAMPLE_MODULE}.TokenData", "--data.init_args.batch_size", "16"]):
        native = compare(["python", "train.py", "fit", *tail], tmp_path, subclass_mode_data=True)
        assert native["data.class_path"] == f"{EXAMPLE_MODULE}.TokenData"


def test_a_knob_change_rendered_into_a_config_launch_is_what_lightning_reads(tmp_path):
    (tmp_path / "cfg.yaml").write_text("data:\n  batch_size: 1\ntrainer:\n  accumulate_grad_batches: 32\n")
    from tests.frameworks.lightning.helpers import lightning, recipe

    r = recipe("python train.py fit --config cfg.yaml", tmp_path).with_knobs(**{"data.batch_size": 8})
    argv = list(lightning().render(r).argv)
    config = lightning_config(argv[2:], tmp_path)
    assert lookup(config, "data.batch_size") == 8 and lookup(config, "trainer.accumulate_grad_batches") == 4


def test_lightning_reads_the_trials_instrumentation_over_the_launchs_own_settings(tmp_path):
    from tests.frameworks.lightning.helpers import lightning, recipe, request

    (tmp_path / "cfg.yaml").write_text(
        "trainer:\n  enable_progress_bar: true\n  logger:\n    class_path: lightning.pytorch.loggers.TensorBoardLogger\n"
        "    init_args:\n      save_dir: logs\n  callbacks:\n  - class_path: lightning.pytorch.callbacks."
        "LearningRateMonitor\n")
    r = recipe(cmd("python train.py fit --config cfg.yaml --data.batch_size 4"), tmp_path)
    tl = lightning().trial_launch(r, request(tmp_path), tmp_path / "trial")
    for path, text in tl.launch.files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    import sys

    sys.path.insert(0, str(tmp_path / "trial" / "attune-probe"))
    try:
        config = lightning_config(list(tl.launch.argv[2:]), tmp_path)
    finally:
        sys.path.remove(str(tmp_path / "trial" / "attune-probe"))
    trainer = config["trainer"]
    assert trainer["logger"]["class_path"] == "attune_lightning_probe.TrialLogger"
    assert trainer["enable_progress_bar"] is False
    assert trainer["enable_checkpointing"] is False and trainer["default_root_dir"] == str(tmp_path / "trial" /
                                                                                          "lightning")
    assert [c["class_path"] for c in trainer["callbacks"]] == ["lightning.pytorch.callbacks.LearningRateMonitor",
                                                               "attune_lightning_probe.AttuneStepProbe"]
    assert lookup(config, "data.batch_size") == 4
