"""The LightningCLI reader's own rules: order, subtrees, class paths, values as YAML, where a setting was decided."""

from __future__ import annotations

import pytest

from attune.errors import RecipeError
from attune.frameworks.lightning.launch import canonical, edit_settings, parse
from tests.frameworks.lightning.helpers import cmd

LOGGER = "trainer:\n  logger:\n    class_path: lightning.pytorch.loggers.CSVLogger\n    init_args:\n      save_dir: logs\n"


def test_a_scalar_replaces_the_subtree_a_mapping_set():
    p = parse(cmd("python train.py fit --config c.yaml --trainer.logger false"), {"c.yaml": LOGGER})
    assert p.settings["trainer.logger"] is False
    assert not any(k.startswith("trainer.logger.") for k in p.settings)


def test_a_class_path_keeps_the_sections_arguments():
    p = parse(cmd("python train.py fit --config c.yaml --trainer.logger lightning.pytorch.loggers.TensorBoardLogger"),
              {"c.yaml": LOGGER})
    assert p.settings["trainer.logger.class_path"] == "lightning.pytorch.loggers.TensorBoardLogger"
    assert p.settings["trainer.logger.save_dir"] == "logs"


def test_values_are_yaml_and_negative_numbers_are_values():
    p = parse(cmd("python train.py fit --trainer.max_steps -1 --trainer.devices [0,1] --model.lr 1e-3 "
                  "--trainer.fast_dev_run False --data.name null"))
    assert p.settings["trainer.max_steps"] == -1 and p.settings["trainer.devices"] == [0, 1]
    assert canonical(p.settings["model.lr"]) == 0.001 and p.settings["trainer.fast_dev_run"] is False
    assert p.settings["data.name"] is None


def test_appends_add_to_a_list():
    p = parse(cmd("python train.py fit --trainer.callbacks+=a.B --trainer.callbacks+=c.D"))
    assert p.settings["trainer.callbacks"] == ["a.B", "c.D"]


def test_who_decides_a_setting_decides_how_it_is_edited():
    files = {"c.yaml": "data:\n  batch_size: 2\n"}
    p = parse(cmd("python train.py fit --data.batch_size 1 --config c.yaml --trainer.devices=2"), files)
    assert p.setter["data.batch_size"] == "c.yaml" and p.cli_arg("data.batch_size") is None
    assert p.cli_arg("trainer.devices").inline
    assert edit_settings(p, {"data.batch_size": 4, "trainer.devices": 4}) == cmd(
        "python train.py fit --data.batch_size 1 --config c.yaml --trainer.devices=4 --data.batch_size 4")


def test_a_cli_without_subcommands_reads_the_same_flags():
    p = parse(cmd("python train.py --config c.yaml --data.batch_size 4"), {"c.yaml": "trainer:\n  max_steps: 3\n"})
    assert p.subcommand is None and p.settings == {"trainer.max_steps": 3, "data.batch_size": 4}


@pytest.mark.parametrize("argv,match", [
    ("python train.py --trainer.max_steps 3 fit --data.batch_size 2", "move it after `fit`"),
    ("python train.py fit --config c.yaml --data.batch_size 2", "cannot read the config file c.yaml"),
    ("accelerate launch train.py fit", "unknown launcher"),
])
def test_launches_lightning_would_not_read_so_are_refused(argv, match):
    with pytest.raises(RecipeError, match=match):
        parse(cmd(argv))


def test_a_config_file_that_is_no_mapping_is_refused():
    with pytest.raises(RecipeError, match="must be a mapping"):
        parse(cmd("python train.py fit -c c.yaml"), {"c.yaml": "- a\n- b\n"})
