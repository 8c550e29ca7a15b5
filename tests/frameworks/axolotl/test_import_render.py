"""Import → render of axolotl launches, on a LoRA config of ours (fixtures/lora-packed.yml): an unchanged recipe renders
the user's argv and file byte for byte; a knob change differs in exactly its key (and the derived accumulation or
batch_size), in the file or in the option that overrides it; overrides are read as axolotl's click / fire CLIs and
load_cfg read them."""

from __future__ import annotations

import pytest

from attune.backends.base import TrialRequest
from attune.errors import RecipeError
from tests.frameworks.axolotl.helpers import (
    CLI,
    EXAMPLE,
    ax,
    changed_keys,
    changed_lines,
    example_text,
    imported,
    recipe,
    set_line,
)

MODULE = ["accelerate", "launch", "--num_processes", "2", "-m", "axolotl.cli.train", EXAMPLE]


def test_import_reads_every_knob_from_the_example(tmp_path):
    data = imported(tmp_path, env={"WANDB_API_KEY": "secret"})
    assert data["framework"] == "axolotl" and data["launch"]["files"] == {EXAMPLE: example_text()}
    assert data["launch"]["env"] == {}
    assert data["knobs"] == {"micro_batch_size": 2, "nproc_per_node": 1, "gradient_checkpointing": True,
                             "dataloader_num_workers": 0, "torch_compile": False}
    s = ax().read(recipe(tmp_path))
    assert (s.per_device, s.accumulation, s.nproc, s.global_batch) == (2, 2, 1, 4)


@pytest.mark.parametrize("argv,expect", [
    ([*CLI, "--micro-batch-size=4", "--learning-rate", "1e-4"], {"micro_batch_size": 4, "learning_rate": 1e-4}),
    ([*CLI, "--no-sample-packing", "--gradient-checkpointing=false"],
     {"sample_packing": False, "gradient_checkpointing": False}),
    (["python", "-m", "axolotl.cli.train", EXAMPLE, "--micro_batch_size=1", "--sequence_len", "1024"],
     {"micro_batch_size": 1, "sequence_len": 1024}),
])
def test_overrides_are_read_and_cast_as_axolotl_does(tmp_path, argv, expect):
    s = ax().read(recipe(tmp_path, argv))
    assert {k: s.effective[k] for k in expect} == expect
    assert type(s.effective["learning_rate"]) is float  # cast to the YAML value's type (_coerce_value)


def test_strict_configs_ignore_overrides_of_keys_they_lack(tmp_path):
    text = set_line(example_text(), "strict", "true")
    s = ax().read(recipe(tmp_path, [*CLI, "--dataloader-num-workers=2", "--micro-batch-size=1"], text=text))
    assert "dataloader_num_workers" not in s.effective and s.per_device == 1


def test_the_process_count_is_read_from_each_launcher(tmp_path):
    assert recipe(tmp_path, [*CLI, "--", "--num_processes", "2"]).knob("nproc_per_node") == 2
    assert recipe(tmp_path, [*CLI, "--launcher", "torchrun", "--", "--nproc_per_node=4"]).knob("nproc_per_node") == 4
    assert recipe(tmp_path, MODULE).knob("nproc_per_node") == 2
    # accelerate's default without --num_processes: one process per visible GPU
    assert recipe(tmp_path, accelerator="h100-sxm-80gb", devices_per_node=4).knob("nproc_per_node") == 4


def test_a_batch_size_config_derives_the_accumulation(tmp_path):
    text = example_text().replace("gradient_accumulation_steps: 2\n", "batch_size: 8\n")
    r = recipe(tmp_path, text=text, devices_per_node=4)
    s = ax().read(r)
    assert (s.per_device, s.accumulation, s.global_batch) == (2, 4, 8)
    launch = ax().render(r.with_knobs(micro_batch_size=4))  # batch_size per process stays 8: no other change
    assert changed_keys(text, launch.files[EXAMPLE]) == {"micro_batch_size": (2, 4)}
    launch = ax().render(r.with_knobs(nproc_per_node=2))
    assert changed_keys(text, launch.files[EXAMPLE]) == {"batch_size": (8, 4)}


@pytest.mark.parametrize("argv,message", [
    (["axolotl", "preprocess", EXAMPLE], "does not run `axolotl train`"),
    (["axolotl", "train", EXAMPLE, "--sweep", "sweep.yml"], "drop the option"),
    (["python", "-m", "axolotl.cli.evaluate", EXAMPLE], "does not run -m axolotl.cli.train"),
    (["axolotl", "train", "--micro-batch-size=2"], "names its YAML config"),
])
def test_launches_it_cannot_read_are_refused_with_the_fix(tmp_path, argv, message):
    with pytest.raises(RecipeError) as err:
        imported(tmp_path, argv)
    assert message in str(err.value)


def test_an_unchanged_recipe_renders_the_users_launch_exactly(tmp_path):
    argv = [*CLI, "--learning-rate=1e-4", "--", "--num_processes", "2"]
    launch = ax().render(recipe(tmp_path, argv))
    assert list(launch.argv) == argv and launch.files == {EXAMPLE: example_text()} and dict(launch.env) == {}


@pytest.mark.parametrize("knobs,expect", [
    ({"gradient_checkpointing": False}, {"gradient_checkpointing": (True, False)}),
    ({"gradient_checkpointing": "offload"}, {"gradient_checkpointing": (True, "offload")}),
    ({"dataloader_num_workers": 2}, {"dataloader_num_workers": (None, 2)}),
    ({"torch_compile": True}, {"torch_compile": (None, True)}),
    ({"micro_batch_size": 1}, {"micro_batch_size": (2, 1), "gradient_accumulation_steps": (2, 4)}),
    ({"micro_batch_size": 4}, {"micro_batch_size": (2, 4), "gradient_accumulation_steps": (2, 1)}),
])
def test_one_knob_changes_exactly_its_setting(tmp_path, knobs, expect):
    base = recipe(tmp_path)
    text = ax().render(base.with_knobs(**knobs)).files[EXAMPLE]
    assert changed_keys(example_text(), text) == expect
    present = sum(1 for k in expect if f"\n{k}:" in "\n" + example_text())  # a present key: one - and one + line
    assert len(changed_lines(example_text(), text)) == len(expect) + present
    assert "  - o_proj\n" in text and 'pad_token: "<|finetune_right_pad_id|>"' in text  # the rest as written


def test_an_overridden_key_changes_in_its_option(tmp_path):
    argv = [*CLI, "--micro-batch-size", "2", "--gradient-checkpointing"]
    base = recipe(tmp_path, argv)
    launch = ax().render(base.with_knobs(micro_batch_size=1))
    assert list(launch.argv) == [*CLI, "--micro-batch-size", "1", "--gradient-checkpointing"]
    assert changed_keys(example_text(), launch.files[EXAMPLE]) == {"gradient_accumulation_steps": (2, 4)}
    launch = ax().render(base.with_knobs(gradient_checkpointing=False))
    assert list(launch.argv) == [*CLI, "--micro-batch-size", "2", "--no-gradient-checkpointing"]
    assert launch.files[EXAMPLE] == example_text()


@pytest.mark.parametrize("argv,nproc,expect", [
    # CPU: several accelerate processes need its multi-process launcher (as for hf launches)
    ([*CLI, "--", "--num_processes", "2"], 4, [*CLI, "--", "--num_processes", "4", "--multi_gpu"]),
    (CLI, 2, [*CLI, "--", "--multi_gpu", "--num_processes", "2"]),
    ([*CLI, "--launcher=torchrun", "--", "--nproc_per_node=2"], 1, [*CLI, "--launcher=torchrun", "--",
                                                                      "--nproc_per_node=1"]),
    (MODULE, 1, ["accelerate", "launch", "--num_processes", "1", "-m", "axolotl.cli.train", EXAMPLE]),
    (["torchrun", "-m", "axolotl.cli.train", EXAMPLE], 2,
     ["torchrun", "--nproc_per_node", "2", "-m", "axolotl.cli.train", EXAMPLE]),
])
def test_the_process_count_edits_the_launchers_own_option(tmp_path, argv, nproc, expect):
    base = recipe(tmp_path, argv, devices_per_node=4)
    launch = ax().render(base.with_knobs(nproc_per_node=nproc, micro_batch_size=1))
    assert list(launch.argv) == expect
    acc = ax().read(base).global_batch // nproc
    assert load_acc(launch.files[EXAMPLE]) == acc


def load_acc(text):
    from tests.frameworks.axolotl.helpers import load

    return load(text)["gradient_accumulation_steps"]


def test_a_python_launch_keeps_its_one_process(tmp_path):
    base = recipe(tmp_path, ["python", "-m", "axolotl.cli.train", EXAMPLE], devices_per_node=2)
    data = base.model_dump(mode="python")
    data["knobs"]["nproc_per_node"] = 2
    from attune.gate import evaluate

    v = evaluate(base, data)
    assert not v.admitted and any("one python process" in r.message for r in v.reasons)


def test_a_trial_runs_a_copy_without_saves_or_trackers(tmp_path):
    text = set_line(example_text(), "wandb_project", "my-project")
    r = recipe(tmp_path, [*CLI, "--logging-steps=5"], text=text)
    req = TrialRequest(trial_id=1, trial_dir=tmp_path / "trial", warmup_steps=1, measure_steps=3, timeout_s=60)
    t = ax().trial_launch(r, req, tmp_path / "trial")
    copy = str(tmp_path / "trial" / "axolotl-config" / EXAMPLE)
    assert list(t.launch.argv) == [*CLI[:2], copy, "--logging-steps=1"] and t.stop_after_steps == 4
    keys = changed_keys(text, t.launch.files[copy])
    assert keys == {"output_dir": ("./runs/llama-1b-lora", str(tmp_path / "trial" / "axolotl-output")),
                    "save_strategy": (None, "no"), "include_tokens_per_second": (None, True),
                    "saves_per_epoch": (1, None), "wandb_project": ("my-project", None)}
    assert t.launch.env["WANDB_MODE"] == "disabled"
