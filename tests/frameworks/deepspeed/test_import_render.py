"""Import → render of DeepSpeed launches: an unchanged recipe renders the user's argv and config byte for byte; a
knob change differs in exactly its key (and the derived accumulation); HF Trainer launches resolve "auto"."""

from __future__ import annotations

import json

import pytest

from attune.errors import RecipeError
from attune.frameworks.deepspeed import config as dsconfig
from attune.frameworks.deepspeed import settings
from attune.recipe.io import load_recipe, parse_recipe
from tests.frameworks.deepspeed.helpers import (
    EXAMPLE,
    HF_ARGV,
    HF_CONFIG,
    POOR,
    POOR_CONFIG,
    ds,
    hf_recipe,
    imported,
    poor,
    recipe,
    write,
)


def changed_keys(before: str, after: str) -> dict[str, tuple[object, object]]:
    old, new = dsconfig.flatten(json.loads(before)), dsconfig.flatten(json.loads(after))
    return {k: (old.get(k), new.get(k)) for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)}


# -- import ------------------------------------------------------------------------------------------------

def test_import_reads_every_knob_from_the_config(tmp_path):
    data = imported(POOR, write(tmp_path, "ds_config.json", POOR_CONFIG), env={"DS_ACCELERATOR": "cpu",
                                                                             "OMP_NUM_THREADS": "1", "HF_TOKEN": "x"})
    assert data["framework"] == "deepspeed" and data["launch"]["files"] == {"ds_config.json": POOR_CONFIG}
    assert data["launch"]["env"] == {"DS_ACCELERATOR": "cpu"}  # OMP is a knob; tokens are never recorded
    assert data["knobs"] == {
        "train_micro_batch_size_per_gpu": 1, "nproc_per_node": 1, "zero_optimization.stage": 3,
        "zero_optimization.overlap_comm": False, "zero_optimization.contiguous_gradients": False,
        "zero_optimization.reduce_bucket_size": 10_000, "zero_optimization.allgather_bucket_size": 10_000,
        "zero_optimization.stage3_prefetch_bucket_size": 10_000,
        "zero_optimization.stage3_param_persistence_threshold": 0, "env.OMP_NUM_THREADS": "1"}


def test_absent_keys_read_as_deepspeed_defaults(tmp_path):
    write(tmp_path, "ds.json", {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2})
    r = recipe("torchrun --nproc_per_node 2 train.py --deepspeed_config ds.json", tmp_path)
    assert r.knob("zero_optimization.stage") == 0 and r.knob("zero_optimization.reduce_bucket_size") == 500_000_000
    assert r.knob("zero_optimization.overlap_comm") is None and r.knob("nproc_per_node") == 2
    s = settings.read(r)
    assert (s.train_batch, s.micro, s.accumulation) == (16, 2, 4)  # DeepSpeed derives the accumulation


@pytest.mark.parametrize("config,expect", [
    ({"train_batch_size": 32}, (32, 16, 1)),  # train_batch_size alone: no accumulation
    ({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2}, (16, 4, 2)),
    ({"train_batch_size": 32, "gradient_accumulation_steps": 4}, (32, 4, 4)),
])
def test_batch_triple_resolves_like_deepspeed(tmp_path, config, expect):
    write(tmp_path, "ds.json", config)
    s = settings.read(recipe("deepspeed --num_gpus 2 train.py --deepspeed_config ds.json", tmp_path))
    assert (s.train_batch, s.micro, s.accumulation) == expect


def test_import_refuses_what_deepspeed_refuses(tmp_path):
    write(tmp_path, "ds.json", {"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4,
                                "gradient_accumulation_steps": 2})
    with pytest.raises(RecipeError, match="DeepSpeed refuses"):
        imported("deepspeed train.py --deepspeed_config ds.json", tmp_path)
    write(tmp_path, "ds.json", {"train_batch_size": 8, "zero_optimization": {"reduce_bucket_size": 12345}})
    with pytest.raises(RecipeError, match="outside the deepspeed catalogue's domain"):
        imported("deepspeed train.py --deepspeed_config ds.json", tmp_path)
    with pytest.raises(RecipeError, match="names no DeepSpeed config"):
        imported("deepspeed train.py --lr 3", tmp_path)
    with pytest.raises(RecipeError, match="unknown launcher"):
        imported("srun train.py --deepspeed_config ds.json", tmp_path)


def test_other_config_flag_names(tmp_path):
    write(tmp_path, "cfg.json", {"train_batch_size": 8})
    assert recipe("deepspeed train.py --ds_config cfg.json", tmp_path).launch.files.keys() == {"cfg.json"}
    assert recipe("deepspeed train.py --my_cfg=cfg.json", tmp_path, config_flag="my_cfg").knob(
        "train_micro_batch_size_per_gpu") == 8


# -- round trip --------------------------------------------------------------------------------------------

def test_unchanged_recipe_renders_the_launch_byte_for_byte(tmp_path):
    r = poor(tmp_path)
    launch = ds().render(r)
    assert list(launch.argv) == POOR and launch.files == {"ds_config.json": POOR_CONFIG}
    assert launch.env["DS_ACCELERATOR"] == "cpu"
    again = parse_recipe(r.model_dump(mode="python"))  # through the recipe mapping (YAML round trip)
    assert ds().render(again).files["ds_config.json"] == POOR_CONFIG


def test_micro_batch_change_touches_exactly_its_key_and_the_accumulation(tmp_path):
    r = poor(tmp_path)
    text = ds().render(r.with_knobs(train_micro_batch_size_per_gpu=4)).files["ds_config.json"]
    assert changed_keys(POOR_CONFIG, text) == {"train_micro_batch_size_per_gpu": (1, 4),
                                               "gradient_accumulation_steps": (32, 8)}
    assert text == POOR_CONFIG.replace('"train_micro_batch_size_per_gpu": 1', '"train_micro_batch_size_per_gpu": 4') \
        .replace('"gradient_accumulation_steps": 32', '"gradient_accumulation_steps": 8')  # edited in place
    assert list(ds().render(r.with_knobs(train_micro_batch_size_per_gpu=4)).argv) == POOR


@pytest.mark.parametrize("knob,value,key,old", [
    ("zero_optimization.stage", 1, "zero_optimization.stage", 3),
    ("zero_optimization.contiguous_gradients", True, "zero_optimization.contiguous_gradients", False),
    ("zero_optimization.reduce_bucket_size", 50_000_000, "zero_optimization.reduce_bucket_size", 10_000),
    ("zero_optimization.stage3_prefetch_bucket_size", 0, "zero_optimization.stage3_prefetch_bucket_size", 10_000),
])
def test_one_config_knob_changes_one_key(tmp_path, knob, value, key, old):
    r = poor(tmp_path)
    text = ds().render(r.with_knobs(**{knob: value})).files["ds_config.json"]
    assert changed_keys(POOR_CONFIG, text) == {key: (old, value)}


def test_overlap_comm_null_removes_the_key(tmp_path):
    r = poor(tmp_path)
    text = ds().render(r.with_knobs(**{"zero_optimization.overlap_comm": None})).files["ds_config.json"]
    assert changed_keys(POOR_CONFIG, text) == {"zero_optimization.overlap_comm": (False, None)}
    json.loads(text)


def test_process_count_edits_the_launcher_and_the_accumulation(tmp_path):
    r = poor(tmp_path)
    launch = ds().render(r.with_knobs(nproc_per_node=2))
    assert list(launch.argv) == ["deepspeed", "--num_gpus", "2", *POOR[3:]]
    assert changed_keys(POOR_CONFIG, launch.files["ds_config.json"]) == {"gradient_accumulation_steps": (32, 16)}
    write(tmp_path, "ds.json", {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2})
    for argv, want in (
        ("deepspeed train.py --deepspeed_config ds.json", "deepspeed --num_gpus 2 train.py --deepspeed_config ds.json"),
        ("torchrun --standalone train.py --deepspeed_config ds.json",
         "torchrun --standalone --nproc_per_node 2 train.py --deepspeed_config ds.json"),
        ("torchrun --nproc_per_node=1 train.py --deepspeed_config ds.json",
         "torchrun --nproc_per_node=2 train.py --deepspeed_config ds.json"),
        ("python -u train.py --deepspeed_config ds.json",
         "python -u -m torch.distributed.run --standalone --nproc_per_node 2 train.py --deepspeed_config ds.json"),
    ):
        launch = ds().render(recipe(argv, tmp_path).with_knobs(nproc_per_node=2))
        assert " ".join(launch.argv) == want
        assert launch.files["ds.json"] == (tmp_path / "ds.json").read_text()  # no accumulation key: DeepSpeed derives it


def test_new_keys_are_inserted_beside_their_siblings(tmp_path):
    write(tmp_path, "ds.json", '{\n  "train_batch_size": 16,\n  "zero_optimization": {\n    "stage": 2\n  }\n}\n')
    r = recipe("deepspeed train.py --deepspeed_config ds.json", tmp_path)
    text = ds().render(r.with_knobs(**{"zero_optimization.overlap_comm": True})).files["ds.json"]
    assert text == '{\n  "train_batch_size": 16,\n  "zero_optimization": {\n    "stage": 2,\n    "overlap_comm": true\n  }\n}\n'
    text = ds().render(r.with_knobs(train_micro_batch_size_per_gpu=4)).files["ds.json"]
    assert changed_keys((tmp_path / "ds.json").read_text(), text) == {"train_micro_batch_size_per_gpu": (None, 4)}
    assert text.startswith('{\n  "train_batch_size": 16,\n  "zero_optimization": {\n    "stage": 2\n  },\n  '
                           '"train_micro_batch_size_per_gpu": 4\n}')


def test_aliased_keys_keep_their_spelling(tmp_path):
    write(tmp_path, "ds.json", {"train_batch_size": 8, "zero_optimization": {"stage": 3, "prefetch_bucket_size": 10000}})
    r = recipe("deepspeed train.py --deepspeed_config ds.json", tmp_path)
    assert r.knob("zero_optimization.stage3_prefetch_bucket_size") == 10_000
    text = ds().render(r.with_knobs(**{"zero_optimization.stage3_prefetch_bucket_size": 5_000_000})).files["ds.json"]
    assert json.loads(text)["zero_optimization"] == {"stage": 3, "prefetch_bucket_size": 5_000_000}


def test_rewrite_keeps_the_rest_of_the_text():
    text = '{"a": 5e8, "b": {"c": 1,   "d": [1, 2]}, "e": "x"}'
    assert dsconfig.rewrite("x.json", text, {"b.c": 2}) == '{"a": 5e8, "b": {"c": 2,   "d": [1, 2]}, "e": "x"}'
    assert dsconfig.rewrite("x.json", text, {"b.c": 1}) is text  # no change: the text itself
    assert dsconfig.rewrite("x.json", text, {"e": dsconfig.REMOVE}) == '{"a": 5e8, "b": {"c": 1,   "d": [1, 2]}}'
    assert dsconfig.rewrite("x.json", text, {"a": dsconfig.REMOVE}) == '{"b": {"c": 1,   "d": [1, 2]}, "e": "x"}'
    assert json.loads(dsconfig.rewrite("x.json", text, {"f.g.h": True}))["f"] == {"g": {"h": True}}


def test_example_recipe_is_the_importers_output_of_run_sh():
    r = load_recipe(EXAMPLE / "recipe.yaml")
    line = next(ln for ln in (EXAMPLE / "run.sh").read_text().splitlines() if ln.startswith("exec "))
    launch = ds().render(r)
    assert list(launch.argv) == line.split()[1:] == POOR
    assert launch.files == {"ds_config.json": POOR_CONFIG}  # recipe.yaml carries ds_config.json as it is
    assert r.knob("env.OMP_NUM_THREADS") == "1" and "env.OMP_NUM_THREADS" not in r.tuning.search_space


# -- HF Trainer with --deepspeed ------------------------------------------------------------------------------

def test_hf_launch_resolves_auto_values_from_the_training_arguments(tmp_path):
    r = hf_recipe(tmp_path)
    s = settings.read(r)
    assert s.mode == "hf" and s.nproc == 2
    assert (s.train_batch, s.micro, s.accumulation) == (16, 4, 2)  # 4 per device × 2 accumulation × 2 processes
    res = s.resolved
    assert res["optimizer"]["params"] == {"lr": 3e-4, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01,
                                          "torch_adam": True}
    assert res["scheduler"]["params"] == {"warmup_min_lr": 0, "warmup_max_lr": 3e-4, "warmup_num_steps": 50,
                                          "total_num_steps": 1000}
    assert res["gradient_clipping"] == 1 and res["bf16"] == {"enabled": True}
    assert r.knob("train_micro_batch_size_per_gpu") == 4 and r.knob("zero_optimization.stage") == 2
    assert r.knob("zero_optimization.allgather_bucket_size") == 200_000_000
    assert "zero_optimization.reduce_bucket_size" in s.auto_knobs  # HF fills it from the model's hidden size


def test_hf_launch_round_trip_and_micro_batch_as_trainer_flags(tmp_path):
    r = hf_recipe(tmp_path)
    launch = ds().render(r)
    assert list(launch.argv) == HF_ARGV and launch.files == {"ds_zero2.json": HF_CONFIG}
    launch = ds().render(r.with_knobs(train_micro_batch_size_per_gpu=8))
    argv = list(launch.argv)
    assert argv[argv.index("--per_device_train_batch_size") + 1] == "8"
    assert argv[argv.index("--gradient_accumulation_steps") + 1] == "1"
    assert launch.files == {"ds_zero2.json": HF_CONFIG}  # "auto" stays "auto": HF fills it
    launch = ds().render(r.with_knobs(**{"zero_optimization.stage": 3}))
    assert changed_keys(HF_CONFIG, launch.files["ds_zero2.json"]) == {"zero_optimization.stage": (2, 3)}


def test_hf_numeric_batch_keys_follow_the_flags(tmp_path):
    config = HF_CONFIG.replace('"train_micro_batch_size_per_gpu": "auto"', '"train_micro_batch_size_per_gpu": 4')
    r = hf_recipe(tmp_path, config)
    text = ds().render(r.with_knobs(train_micro_batch_size_per_gpu=2)).files["ds_zero2.json"]
    assert changed_keys(config, text) == {"train_micro_batch_size_per_gpu": (4, 2)}
    bad = HF_CONFIG.replace('"train_micro_batch_size_per_gpu": "auto"', '"train_micro_batch_size_per_gpu": 3')
    with pytest.raises(RecipeError, match="HF Trainer refuses that mismatch"):
        hf_recipe(tmp_path, bad)


def test_hf_auto_bucket_sizes_stay_auto(tmp_path):
    r = hf_recipe(tmp_path)
    from attune.gate import evaluate

    data = r.model_dump(mode="python")
    data["knobs"]["zero_optimization.reduce_bucket_size"] = 100_000_000
    v = evaluate(r, data)
    assert not v.admitted and v.codes == ["constraint"] and "hf_auto_keys_stay_auto" in v.reasons[0].message


def test_hf_mode_is_recognised_without_auto_values(tmp_path):
    config = {"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 1}}
    write(tmp_path, "ds.json", config)
    argv = ["torchrun", "--nproc_per_node", "2", "train.py", "--deepspeed", "ds.json", "--output_dir", "o",
            "--per_device_train_batch_size", "4"]
    assert settings.read(recipe(argv, tmp_path)).mode == "hf"
    argv = ["torchrun", "--nproc_per_node", "2", "train.py", "--deepspeed", "--deepspeed_config", "ds.json"]
    assert settings.read(recipe(argv, tmp_path)).mode == "plain"  # DeepSpeed's own --deepspeed switch


@pytest.mark.parametrize("launch,devices", [(None, 1), ("deepspeed --num_gpus 2 train.py --deepspeed_config ds.json", 2)])
def test_a_trial_is_charged_for_the_devices_its_launch_uses(tmp_path, launch, devices):
    """Issue 19: a one-process job was charged over every core of the machine."""
    write(tmp_path, "ds.json", {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2})
    if launch is None:
        data = imported(POOR, write(tmp_path, "ds_config.json", POOR_CONFIG), devices_per_node=None)
    else:
        data = imported(launch, tmp_path, devices_per_node=None)
    assert parse_recipe(data).resources.devices == devices
