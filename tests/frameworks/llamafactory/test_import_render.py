"""Import → render of LLaMA-Factory launches, on a LoRA SFT config of ours (fixtures/lora_sft_small.yaml): an unchanged
recipe renders the user's argv and file byte for byte; a knob change differs in exactly its key (and the derived
accumulation), in the file or in the command-line override that sets it; overrides are read as OmegaConf reads them."""

from __future__ import annotations

import pytest

from attune.backends.base import TrialRequest
from attune.errors import RecipeError
from tests.frameworks.llamafactory.helpers import (
    CLI,
    EXAMPLE,
    changed_keys,
    changed_lines,
    example_text,
    imported,
    lf,
    load,
    recipe,
)

# -- import ------------------------------------------------------------------------------------------------------


def test_import_reads_every_knob_from_the_example(tmp_path):
    data = imported(tmp_path, env={"HF_TOKEN": "secret", "CUDA_VISIBLE_DEVICES": "0"})
    assert data["framework"] == "llamafactory" and data["launch"]["files"] == {EXAMPLE: example_text()}
    assert data["launch"]["env"] == {"CUDA_VISIBLE_DEVICES": "0"}  # tokens are never recorded
    assert data["knobs"] == {"per_device_train_batch_size": 1, "nproc_per_node": 1,
                             "disable_gradient_checkpointing": False, "dataloader_num_workers": 0,
                             "torch_compile": False, "flash_attn": "auto", "enable_liger_kernel": False}
    s = lf().read(recipe(tmp_path))
    assert (s.per_device, s.accumulation, s.nproc, s.global_batch) == (1, 8, 1, 8)


def test_overrides_are_read_as_omegaconf_reads_them(tmp_path):
    argv = [*CLI, "per_device_train_batch_size=2", "learning_rate=1e-4", "dataloader_num_workers=1",
            "per_device_train_batch_size=4"]
    r = recipe(tmp_path, argv)
    assert r.knob("per_device_train_batch_size") == 4  # the last override of a key wins (OmegaConf.from_cli)
    assert r.knob("dataloader_num_workers") == 1
    c = lf().contract(r)
    assert c["llamafactory.learning_rate"].value == 1e-4  # a float, as OmegaConf's loader reads 1e-4
    assert lf().read(r).global_batch == 4 * 8


def test_the_example_files_own_spelling_of_the_rate_is_a_float(tmp_path):
    c = lf().contract(recipe(tmp_path))
    assert c["llamafactory.learning_rate"].value == 1.0e-4 and c["llamafactory.bf16"].value is True
    assert c["llamafactory.cutoff_len"].value == 2048 and c["llamafactory.packing"].value is False


@pytest.mark.parametrize("argv,message", [
    (["llamafactory-cli", "export", EXAMPLE], "does not run `train`"),
    (["llamafactory-cli", "train", "cfg.json"], ".yaml/.yml"),
    ([*CLI, "--learning_rate", "1e-4"], "key=value"),
    (["deepspeed", "train.py", EXAMPLE], "unknown launcher"),
])
def test_launches_it_cannot_read_are_refused_with_the_fix(tmp_path, argv, message):
    with pytest.raises(RecipeError) as err:
        imported(tmp_path, argv)
    assert message in str(err.value)


def test_a_missing_config_is_named(tmp_path):
    with pytest.raises(RecipeError, match="cannot read the LLaMA-Factory config other.yaml"):
        lf().import_launch(["llamafactory-cli", "train", "other.yaml"], cwd=tmp_path, env={}, options={})


def test_a_knob_outside_its_domain_is_refused_at_import(tmp_path):
    text = example_text().replace("per_device_train_batch_size: 1", "per_device_train_batch_size: 3")
    with pytest.raises(RecipeError, match="knobs.per_device_train_batch_size: the launch has 3"):
        imported(tmp_path, text=text)


# -- render ------------------------------------------------------------------------------------------------------


def test_an_unchanged_recipe_renders_the_users_launch_exactly(tmp_path):
    argv = [*CLI, "learning_rate=2e-4"]
    r = recipe(tmp_path, argv, env={"FORCE_TORCHRUN": "1", "NPROC_PER_NODE": "2"})
    launch = lf().render(r)
    assert list(launch.argv) == argv and launch.files == {EXAMPLE: example_text()}
    assert dict(launch.env) == {"FORCE_TORCHRUN": "1", "NPROC_PER_NODE": "2"}


@pytest.mark.parametrize("knobs,expect", [
    ({"disable_gradient_checkpointing": True}, {"disable_gradient_checkpointing": (None, True)}),
    ({"dataloader_num_workers": 2}, {"dataloader_num_workers": (None, 2)}),
    ({"torch_compile": True}, {"torch_compile": (None, True)}),
    ({"flash_attn": "sdpa"}, {"flash_attn": (None, "sdpa")}),
    ({"per_device_train_batch_size": 2}, {"per_device_train_batch_size": (1, 2), "gradient_accumulation_steps": (8, 4)}),
    ({"per_device_train_batch_size": 8}, {"per_device_train_batch_size": (1, 8), "gradient_accumulation_steps": (8, 1)}),
])
def test_one_knob_changes_exactly_its_setting(tmp_path, knobs, expect):
    base = recipe(tmp_path)
    text = lf().render(base.with_knobs(**knobs)).files[EXAMPLE]
    assert changed_keys(example_text(), text) == expect
    # every other line (comments, order, blank lines) is the user's
    present = sum(1 for k in expect if k in load(example_text()))  # a present key: one - and one + line
    assert len(changed_lines(example_text(), text)) == len(expect) + present
    assert text.startswith("# attune's own") and "# eval_strategy: steps\n" in text


def test_a_key_the_command_line_overrides_changes_in_its_override(tmp_path):
    argv = [*CLI, "per_device_train_batch_size=1", "dataloader_num_workers=0"]
    base = recipe(tmp_path, argv)
    launch = lf().render(base.with_knobs(per_device_train_batch_size=4))
    assert list(launch.argv) == [*CLI, "per_device_train_batch_size=4", "dataloader_num_workers=0"]
    assert changed_keys(example_text(), launch.files[EXAMPLE]) == {"gradient_accumulation_steps": (8, 2)}
    launch = lf().render(base.with_knobs(dataloader_num_workers=2))
    assert launch.argv[-1] == "dataloader_num_workers=2" and launch.files[EXAMPLE] == example_text()


def test_the_process_count_of_llamafactory_cli_is_its_environment(tmp_path):
    base = recipe(tmp_path)  # one process: no FORCE_TORCHRUN, no GPU
    r = base.with_knobs(nproc_per_node=2, per_device_train_batch_size=1)
    launch = lf().render(r)
    assert list(launch.argv) == CLI
    assert dict(launch.env) == {"FORCE_TORCHRUN": "1", "NPROC_PER_NODE": "2", "ACCELERATE_USE_CPU": "true"}
    assert changed_keys(example_text(), launch.files[EXAMPLE]) == {"gradient_accumulation_steps": (8, 4)}
    assert lf().read(r).nproc == 1 and lf().contract(r)["llamafactory.global_batch_size"].value == 8


def test_force_torchrun_and_nproc_per_node_are_read(tmp_path):
    r = recipe(tmp_path, env={"FORCE_TORCHRUN": "true", "NPROC_PER_NODE": "4"})
    assert r.knob("nproc_per_node") == 4 and lf().read(r).global_batch == 32
    with pytest.raises(RecipeError, match="set NPROC_PER_NODE"):
        imported(tmp_path, env={"FORCE_TORCHRUN": "1"})  # CPU: no GPU count to default to
    gpu = recipe(tmp_path, env={}, accelerator="h100-sxm-80gb", devices_per_node=4)
    assert gpu.knob("nproc_per_node") == 4  # more than one visible GPU: llamafactory-cli runs torchrun itself


def test_a_torchrun_launch_of_the_train_script_edits_its_own_option(tmp_path):
    argv = ["torchrun", "--nproc_per_node=2", "src/train.py", EXAMPLE, "cutoff_len=1024"]
    r = recipe(tmp_path, argv)
    assert r.knob("nproc_per_node") == 2 and lf().contract(r)["llamafactory.cutoff_len"].value == 1024
    launch = lf().render(r.with_knobs(nproc_per_node=4))
    assert list(launch.argv) == ["torchrun", "--nproc_per_node=4", "src/train.py", EXAMPLE, "cutoff_len=1024"]
    # global batch 1 × 8 × 2 processes = 16: four processes accumulate 4
    assert changed_keys(example_text(), launch.files[EXAMPLE]) == {"gradient_accumulation_steps": (8, 4)}


def test_a_trial_runs_a_copy_with_logging_instrumentation(tmp_path):
    argv = [*CLI, "logging_steps=10"]
    r = recipe(tmp_path, argv)
    req = TrialRequest(trial_id=1, trial_dir=tmp_path / "trial", warmup_steps=1, measure_steps=3, timeout_s=60)
    t = lf().trial_launch(r, req, tmp_path / "trial")
    copy = str(tmp_path / "trial" / "llamafactory-config" / EXAMPLE)
    assert list(t.launch.argv) == [*CLI[:2], copy, "logging_steps=1"]  # the override wins: it is edited
    assert t.stop_after_steps == 4 and list(t.launch.files) == [copy]
    keys = changed_keys(example_text(), t.launch.files[copy])
    assert keys["output_dir"] == ("runs/llama-1b/lora-sft", str(tmp_path / "trial" / "llamafactory-output"))
    assert keys["save_strategy"] == (None, "no") and keys["report_to"] == (None, "none")
    assert "include_num_input_tokens_seen" not in keys and "logging_steps" not in keys  # no padded token counts
    learned = {"learning_rate", "cutoff_len", "num_train_epochs", "gradient_accumulation_steps", "bf16", "dataset"}
    assert not learned & set(keys)
    assert lf().render(r).files == {EXAMPLE: example_text()}  # the user's file is untouched
