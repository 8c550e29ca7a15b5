"""Round trip of a Llama-3 8B torchtitan job (our TOML job file for v0.2.2) and of main's Python-config form: import,
change one knob, render — the launch differs in exactly that setting; no change renders the original exactly."""

from __future__ import annotations

import pytest

from attune.errors import RecipeError
from tests.frameworks.megatron.helpers import changed_lines, changed_tokens
from tests.frameworks.torchtitan.helpers import (
    EXAMPLE,
    imported,
    recipe,
    registry_argv,
    titan,
    toml_argv,
)

TOML = (EXAMPLE / "llama3_8b.toml").read_text()


def test_toml_job_imports_launch_and_knobs():
    r = recipe()
    assert r.framework == "torchtitan" and list(r.launch.argv) == toml_argv()
    assert r.launch.files == {"llama3_8b.toml": TOML} and r.launch.env == {"PYTORCH_ALLOC_CONF": "expandable_segments:True"}
    k = r.effective_knobs
    assert (k["tensor_parallel_degree"], k["local_batch_size"], k["activation_checkpoint"], k["compile"]) == \
        (2, 1, "selective", False)
    assert r.resources.devices == 8 and r.launch.tokens_per_sample == 8192
    assert r.tokens_per_step == 8 * 8192  # --training.global_batch_size 8


def test_unchanged_renders_exactly():
    r = recipe()
    launch = titan().render(r)
    assert list(launch.argv) == toml_argv() and launch.files == {"llama3_8b.toml": TOML}
    assert dict(launch.env) == dict(r.launch.env)


@pytest.mark.parametrize("change, where, removed, added", [
    ({"tensor_parallel_degree": 4}, "argv", ["2"], ["4"]),  # the command line sets it: changed there
    ({"compile": True}, "toml", ["enable = false"], ["enable = true"]),  # the TOML sets it: changed in its line
    ({"activation_checkpoint": "full"}, "toml", ['mode = "selective"  # recompute part of each block in the backward pass'],
     ['mode = "full"  # recompute part of each block in the backward pass']),
    ({"pipeline_parallel_degree": 2, "tensor_parallel_degree": 2}, "toml", ["pipeline_parallel_degree = 1"],
     ["pipeline_parallel_degree = 2"]),
    ({"fsdp_reshard_after_forward": "always"}, "argv", [], ["--parallelism.fsdp_reshard_after_forward", "always"]),
])
def test_one_knob_changes_exactly_its_setting(change, where, removed, added):
    r = recipe()
    launch = titan().render(r.with_knobs(**change))
    if where == "argv":
        assert changed_tokens(toml_argv(), launch.argv) == (removed, added)
        assert launch.files["llama3_8b.toml"] == TOML
    else:
        assert list(launch.argv) == toml_argv()
        assert changed_lines(TOML, launch.files["llama3_8b.toml"]) == (removed, added)


def test_registry_form_round_trip():
    r = recipe(registry_argv())
    assert r.launch.files == {} and r.knob("local_batch_size") == 1 and r.knob("tensor_parallel_degree") == 2
    assert list(titan().render(r).argv) == registry_argv()
    launch = titan().render(r.with_knobs(compile=True))
    assert changed_tokens(registry_argv(), launch.argv) == ([], ["--compile.enable"])
    # the local batch is main's token count per micro-batch: 2 sequences of 8192 tokens
    out = titan().render(r.with_knobs(local_batch_size=2))
    assert changed_tokens(registry_argv(), out.argv) == (
        [], ["--training.num_tokens_per_microbatch_per_dp_rank", "16384"])
    # activation checkpointing is a config-tree choice there, with no CLI flag: not searched
    assert "activation_checkpoint" not in r.tuning.search_space


def test_unknown_versions_are_reported_not_guessed(tmp_path):
    with pytest.raises(RecipeError, match="torchtitan 0.3.0 is outside"):
        imported(toml_argv(), version="0.3.0")
    text = TOML.replace("[training]\n", "[training]\nbatch_size = 8\n")
    (tmp_path / "old.toml").write_text(text)
    argv = ["torchrun", "--nproc_per_node=8", "-m", "torchtitan.train", "--job.config_file", "old.toml"]
    with pytest.raises(RecipeError, match="training.batch_size is torchtitan 0.1's name"):
        imported(argv, cwd=tmp_path)
    (tmp_path / "new.toml").write_text(TOML + "\n[spmd]\nbackend = \"x\"\n")
    argv[-1] = "new.toml"
    with pytest.raises(RecipeError, match="spmd.backend are not in the job-config schema"):
        imported(argv, cwd=tmp_path)
    with pytest.raises(RecipeError, match="knows only"):
        imported(["torchrun", "-m", "torchtitan.train", "--module", "qwen3", "--config", "qwen3_8b"])


def test_catalogue_records_versions():
    cat = titan().catalogue()
    assert cat.versions == ">=0.2,<0.3" and all(k.versions for k in cat.knobs.values())
