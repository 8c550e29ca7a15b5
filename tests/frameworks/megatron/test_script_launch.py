"""Megatron launches written in shell scripts (Finding C): a script of ours in the form
Megatron-LM's example scripts use (fixtures/train_gpt3_distributed.sh: bash arrays of flags, positional
paths, `torchrun ${LAUNCHER[@]} pretrain_gpt.py ${MODEL[@]} ...`) is read as bash expands it, and a trial's
copy of it differs from it in exactly the changed flags (plus the trial's logging instrumentation)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from attune.errors import RecipeError
from attune.frameworks.megatron import _is_launch
from attune.frameworks.megatron import script as S
from attune.recipe.io import parse_recipe
from tests.frameworks.megatron.helpers import FIXTURES, changed_lines, megatron

TEXT = (FIXTURES / "train_gpt3_distributed.sh").read_text()
PATH = "/scripts/run.sh"


def container(command: list[str], args: list[str] | None = None) -> dict[str, Any]:
    return {"name": "pytorch", "image": "nvcr.io/nvidia/pytorch:25.01-py3", "command": command, "args": args or [],
            "workingDir": "/workspace/megatron-lm"}


def imported(c: dict[str, Any], files: dict[str, str] | None = None):
    return parse_recipe(megatron().import_container(c, options={"files": files or {}, "framework_version": "0.20.0"}))


def patched(recipe, c, steps=8):
    c = copy.deepcopy(c)
    megatron().patch_job(recipe, {"kind": "PyTorchJob", "spec": {}}, c, steps=steps, metrics_port=9464, linger_s=30)
    return c


def test_the_script_reads_as_bash_expands_it():
    s = S.read_script(TEXT, args=["/ckpt", "/tb"], zero=PATH, is_launch=_is_launch)
    argv = s.argv
    assert argv[:9] == ["torchrun", "--nproc_per_node", "8", "--nnodes", "1", "--master_addr", "localhost",
                        "--master_port", "6000"]
    assert argv[9] == "pretrain_gpt.py" and argv[argv.index("--save") + 1] == "/ckpt"
    assert argv[argv.index("--tensorboard-dir") + 1] == "/tb" and "--attention-backend" in argv
    assert s.env == {"CUDA_DEVICE_MAX_CONNECTIONS": "1", "NCCL_NVLS_ENABLE": "1"}


def test_a_mounted_script_is_imported_and_each_trial_runs_a_copy_with_exactly_the_change():
    c = container(["bash", PATH], ["/ckpt", "/tb"])
    r = imported(c, {PATH: TEXT})
    assert r.launch.files[PATH] == TEXT and r.knobs["micro_batch_size"] == 1
    assert r.knobs["tensor_model_parallel_size"] == 2 and r.training.global_batch_size == 256
    base = patched(r, c)
    trial = patched(r.with_knobs(micro_batch_size=2), c)
    # the container still runs the script with bash, as $0 = the script's path with its own arguments
    assert trial["command"] == ["bash", "-c"] and trial["args"][1:] == [PATH, "/ckpt", "/tb"]
    assert trial["image"] == c["image"] and trial["workingDir"] == c["workingDir"]
    # baseline vs trial: exactly the changed flag
    assert changed_lines(base["args"][0], trial["args"][0]) == (["    --micro-batch-size 1"],
                                                                ["    --micro-batch-size 2"])
    # original vs baseline: only measurement instrumentation (log every step, no eval or checkpoint writes, exit)
    removed, added = changed_lines(TEXT, base["args"][0])
    assert removed == ["    --log-interval 100", "    --save-interval 10000", "    --save $CHECKPOINT_PATH",
                       "    --eval-iters 10", "    --tensorboard-dir $TENSORBOARD_LOGS_PATH"]
    assert added == ["    --log-interval 1", "", "", "    --eval-iters 0",
                     "    --tensorboard-dir $TENSORBOARD_LOGS_PATH --log-throughput --exit-interval 8"]
    # the copy reads back as the rendered launch
    again = S.read_script(trial["args"][0], args=["/ckpt", "/tb"], zero=PATH, is_launch=_is_launch).argv
    assert again[again.index("--micro-batch-size") + 1] == "2" and again[again.index("--exit-interval") + 1] == "8"


def test_an_unchanged_recipe_renders_the_script_exactly():
    c = container(["bash", PATH], ["/ckpt", "/tb"])
    r = imported(c, {PATH: TEXT})
    tuned = copy.deepcopy(c)
    megatron().apply_to_container(r, tuned)
    assert tuned["args"][0] == TEXT and tuned["command"] == ["bash", "-c"]
    changed = copy.deepcopy(c)
    megatron().apply_to_container(r.with_knobs(tensor_model_parallel_size=4), changed)
    assert changed_lines(TEXT, changed["args"][0]) == (["\t--tensor-model-parallel-size 2"],
                                                       ["\t--tensor-model-parallel-size 4"])


def test_an_env_knob_the_script_exports_is_changed_in_the_script():
    c = container(["bash", PATH], ["/ckpt", "/tb"])
    r = imported(c, {PATH: TEXT})
    base, trial = patched(r, c), patched(r.with_knobs(**{"env.NCCL_NVLS_ENABLE": "0"}), c)
    assert changed_lines(base["args"][0], trial["args"][0]) == (["export NCCL_NVLS_ENABLE=1"],
                                                                ["export NCCL_NVLS_ENABLE=0"])
    assert all(e["name"] != "NCCL_NVLS_ENABLE" for e in trial.get("env") or [])


def test_a_script_baked_into_the_image_is_refused_saying_what_to_do():
    c = container(["bash", "run.sh"])
    with pytest.raises(RecipeError) as err:
        imported(c)
    msg = str(err.value)
    assert "/workspace/megatron-lm/run.sh" in msg and "ConfigMap" in msg and "args" in msg
    r = imported(container(["bash", PATH], ["/ckpt", "/tb"]), {PATH: TEXT})
    with pytest.raises(RecipeError, match="put the script in a ConfigMap"):
        patched(r, c)  # an inline recipe with a template that runs a script attune has not read


def test_sh_c_with_the_launch_inline_is_edited_in_place():
    line = ("torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers 24 --hidden-size 2048 --num-attention-heads 16 "
            "--seq-length 2048 --max-position-embeddings 2048 --micro-batch-size 1 --global-batch-size 256 "
            "--train-iters 100 --lr 6e-5 --bf16 --mock-data --vocab-size 50257 --tensor-model-parallel-size 2")
    c = container(["sh", "-c", f"cd /workspace/megatron-lm && {line} 2>&1 | tee /logs/train.log"])
    r = imported(c)
    trial = patched(r.with_knobs(micro_batch_size=2), c)
    assert trial["command"][:2] == ["sh", "-c"] and "/logs/train.log" in trial["command"][2]
    base = patched(r, c)
    assert base["command"][2].replace("--micro-batch-size 1", "--micro-batch-size 2") == trial["command"][2]


def test_a_command_line_in_args_keeps_the_command_and_changes_only_the_flag():
    argv = S.read_script(TEXT, args=["/ckpt", "/tb"], is_launch=_is_launch).argv
    c = container(argv[:1], argv[1:])
    r = imported(c)
    base, trial = patched(r, c), patched(r.with_knobs(micro_batch_size=2), c)
    assert trial["command"] == ["torchrun"]
    diff = [(a, b) for a, b in zip(base["args"], trial["args"], strict=True) if a != b]
    assert diff == [("1", "2")] and trial["args"][trial["args"].index("--micro-batch-size") + 1] == "2"


def test_a_launch_value_the_script_computes_at_run_time_is_refused_by_name():
    text = TEXT.replace("--micro-batch-size 1", "--micro-batch-size $(cat /etc/mbs)")
    with pytest.raises(RecipeError, match=r"\$\(cat /etc/mbs\)"):
        imported(container(["bash", PATH], ["/ckpt", "/tb"]), {PATH: text})
