"""Round trips of published Megatron-family recipes: import, change one knob, render.

The rendered launch differs from the original in exactly the changed setting; no change renders the original
exactly (argument list, environment, config file). Recipes: NVIDIA's Llama-3 8B and 70B performance settings as
Megatron-LM flags (examples/megatron-lm) and as Megatron-Bridge ConfigContainer YAML (examples/megatron-bridge), the
Bridge ``run_recipe.py --recipe`` form, and a NeMo 2 ``llama3_8b`` override line.
"""

from __future__ import annotations

import pytest

from attune.errors import RecipeError
from attune.frameworks.megatron import formats
from tests.frameworks.megatron.helpers import (
    BRIDGE,
    MLM,
    NEMO_8B,
    ROOT,
    argv_of,
    bridge_argv,
    bridge_yaml,
    changed_lines,
    changed_tokens,
    env_of,
    imported,
    megatron,
    mlm,
    nemo,
    recipe,
)


def test_megatron_lm_8b_imports_model_training_knobs_and_the_launch_verbatim():
    r = mlm()
    script = MLM / "llama3_8b_h100_fp8.sh"
    assert r.framework == "megatron" and list(r.launch.argv) == argv_of(script)
    assert r.launch.env == env_of(script) == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    m = r.model
    assert (m.layers, m.hidden_size, m.heads, m.kv_groups, m.ffn_hidden_size, m.vocab_size, m.tied_embeddings) == \
        (32, 4096, 32, 8, 14336, 128256, False)
    t = r.training
    assert (t.global_batch_size, t.seq_length, t.precision, t.seed) == (128, 8192, "bf16", 1234)
    assert t.steps == -(-1953125000 // 128) and t.optimizer.lr == 0.00015 and t.optimizer.betas == (0.9, 0.95)
    assert (r.resources.nodes, r.resources.devices_per_node) == (1, 8)
    k = r.effective_knobs
    assert k["grad_reduce_in_bf16"] is True and k["fp8"] == "hybrid" and k["manual_gc"] is True
    assert k["use_distributed_optimizer"] and k["overlap_grad_reduce"] and k["overlap_param_gather"]
    assert k["env.CUDA_DEVICE_MAX_CONNECTIONS"] == "1" and k["make_vocab_size_divisible_by"] == 128
    assert r.launch.framework_version == "0.20.0" and r.launch.tokens_per_sample == 8192
    # numerics-changing knobs are not searched; the divisor moves only as TP's coupled completion
    assert "grad_reduce_in_bf16" not in r.tuning.search_space and "fp8" not in r.tuning.search_space
    assert "make_vocab_size_divisible_by" not in r.tuning.search_space
    assert "expert_model_parallel_size" not in r.tuning.search_space  # a dense model


@pytest.mark.parametrize("script", ["llama3_8b_h100_fp8.sh", "llama3_70b_h100_fp8.sh"])
def test_megatron_lm_unchanged_renders_the_launch_exactly(script):
    r = mlm(script)
    launch = megatron().render(r)
    assert list(launch.argv) == argv_of(MLM / script)
    assert dict(launch.env) == env_of(MLM / script) and launch.files == {} and launch.cwd == r.launch.cwd


@pytest.mark.parametrize("script, change, removed, added", [
    ("llama3_8b_h100_fp8.sh", {"micro_batch_size": 2}, ["1"], ["2"]),
    ("llama3_8b_h100_fp8.sh", {"context_parallel_size": 2}, ["1"], ["2"]),
    ("llama3_8b_h100_fp8.sh", {"overlap_param_gather": False}, ["--overlap-param-gather"], []),
    ("llama3_8b_h100_fp8.sh", {"recompute_granularity": "selective"}, [], ["--recompute-granularity", "selective"]),
    ("llama3_8b_h100_fp8.sh", {"enable_cuda_graph": True}, [], ["--cuda-graph-impl", "local"]),
    ("llama3_8b_h100_fp8.sh", {"bucket_size": 80_000_000}, [], ["--ddp-bucket-size", "80000000"]),
    ("llama3_70b_h100_fp8.sh", {"virtual_pipeline_model_parallel_size": 10}, ["2"], ["1"]),
    ("llama3_70b_h100_fp8.sh", {"micro_batch_size": 2}, ["1"], ["2"]),
])
def test_megatron_lm_one_knob_changes_exactly_its_flag(script, change, removed, added):
    r = mlm(script)
    before = argv_of(MLM / script)
    after = list(megatron().render(r.with_knobs(**change)).argv)
    assert changed_tokens(before, after) == (removed, added)


def test_megatron_lm_pipeline_move_keeps_the_interleaving_in_the_launchs_own_form():
    # the 70B launch gives layers per virtual stage (80 / 8 / 5 = 2): PP 8 → 4 with 5 chunks is 4 layers per chunk
    r = mlm("llama3_70b_h100_fp8.sh")
    assert r.knob("virtual_pipeline_model_parallel_size") == 5
    after = list(megatron().render(r.with_knobs(pipeline_model_parallel_size=4)).argv)
    i = after.index("--pipeline-model-parallel-size")
    assert after[i:i + 4] == ["--pipeline-model-parallel-size", "4", "--num-layers-per-virtual-pipeline-stage", "4"]


def test_env_knob_changes_only_the_environment():
    r = mlm()
    launch = megatron().render(r.with_knobs(**{"env.NCCL_NVLS_ENABLE": "0"}))
    assert list(launch.argv) == list(r.launch.argv)
    assert dict(launch.env) == {"CUDA_DEVICE_MAX_CONNECTIONS": "1", "NCCL_NVLS_ENABLE": "0"}


@pytest.mark.parametrize("name, nodes", [("llama3_8b_pretrain_8gpu_h100_bf16.yaml", 1),
                                         ("llama3_70b_pretrain_64gpu_h100_bf16.yaml", 8)])
def test_bridge_yaml_round_trip(name, nodes):
    r = bridge_yaml(name, nodes)
    text = (BRIDGE / name).read_text()
    assert r.launch.files == {name: text}
    launch = megatron().render(r)
    assert list(launch.argv) == bridge_argv(name, nodes) and launch.files == {name: text} and dict(launch.env) == {}
    # the perf recipe reduces gradients in BF16 and pads the vocabulary (model.should_pad_vocab: true)
    assert r.knob("grad_reduce_in_bf16") is True and r.knob("env.NVTE_FWD_LAYERNORM_SM_MARGIN") == "20"
    assert r.training.global_batch_size == (128 if nodes == 1 else 256)
    knob = "micro_batch_size" if nodes == 1 else "pipeline_model_parallel_size"
    value = 2 if nodes == 1 else 8
    changed = megatron().render(r.with_knobs(**{knob: value}))
    assert list(changed.argv) == bridge_argv(name, nodes)
    old = r.knob(knob)
    key = "micro_batch_size" if nodes == 1 else "pipeline_model_parallel_size"
    assert changed_lines(text, changed.files[name]) == ([f"  {key}: {old}"], [f"  {key}: {value}"])


def test_bridge_two_place_setting_changes_in_both_places():
    # Bridge dumps carry the gradient-reduction dtype in ddp and mixed_precision: one knob, both keys (inverted)
    r = bridge_yaml()
    text = (BRIDGE / "llama3_8b_pretrain_8gpu_h100_bf16.yaml").read_text()
    out = megatron().render(r.with_knobs(grad_reduce_in_bf16=False)).files
    removed, added = changed_lines(text, out["llama3_8b_pretrain_8gpu_h100_bf16.yaml"])
    assert removed == ["  grad_reduce_in_fp32: false"] * 2 and added == ["  grad_reduce_in_fp32: true"] * 2


BRIDGE_RECIPE = ["torchrun", "--nproc_per_node", "8", "scripts/training/run_recipe.py", "--recipe", "llama3_8b_pretrain_8gpu_h100_bf16_config", "--mode", "pretrain", "--dataset", "mock", "-mb", "1", "model.sequence_parallel=false"]


def test_bridge_recipe_name_with_overrides():
    r = recipe(BRIDGE_RECIPE, ROOT, {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}, framework_version="0.7.0")
    assert r.training.global_batch_size == 128 and r.knob("context_parallel_size") == 2
    # cfg.env_vars of the recipe are defaults under the process environment (apply_environment_variables)
    assert r.knob("env.NCCL_NVLS_ENABLE") == "0" and r.knob("env.CUDA_DEVICE_MAX_CONNECTIONS") == "1"
    fw = megatron()
    assert list(fw.render(r).argv) == BRIDGE_RECIPE
    assert changed_tokens(BRIDGE_RECIPE, fw.render(r.with_knobs(micro_batch_size=2)).argv) == (["1"], ["2"])
    assert changed_tokens(BRIDGE_RECIPE, fw.render(r.with_knobs(sequence_parallel=True)).argv) == (
        ["model.sequence_parallel=false"], ["model.sequence_parallel=true"])
    assert changed_tokens(BRIDGE_RECIPE, fw.render(r.with_knobs(tensor_model_parallel_size=2)).argv) == (
        [], ["model.tensor_model_parallel_size=2"])


def test_nemo2_override_line_round_trip():
    r = nemo()
    assert r.model.layers == 32 and r.training.global_batch_size == 512 and r.training.optimizer.lr == 3e-4
    assert r.knob("tensor_model_parallel_size") == 2 and r.knob("context_parallel_size") == 2
    assert r.knob("use_distributed_optimizer") is True and r.knob("grad_reduce_in_bf16") is False
    fw = megatron()
    assert list(fw.render(r).argv) == NEMO_8B
    assert changed_tokens(NEMO_8B, fw.render(r.with_knobs(tensor_model_parallel_size=1)).argv) == (
        ["trainer.strategy.tensor_model_parallel_size=2"], ["trainer.strategy.tensor_model_parallel_size=1"])
    assert changed_tokens(NEMO_8B, fw.render(r.with_knobs(pipeline_model_parallel_size=2)).argv) == (
        [], ["trainer.strategy.pipeline_model_parallel_size=2"])
    # NeMo 2 sets TP comm overlap and manual GC through callbacks: no override spelling, not searched
    assert "tp_comm_overlap" not in r.tuning.search_space and "manual_gc" not in r.tuning.search_space


def test_formats_detected_from_the_launch():
    assert formats.detect(argv_of(MLM / "llama3_8b_h100_fp8.sh")).name == "megatron-lm"
    assert formats.detect(bridge_argv("x.yaml")).name == "megatron-bridge"
    assert formats.detect(BRIDGE_RECIPE).name == "megatron-bridge"
    assert formats.detect(NEMO_8B).name == "nemo2"
    with pytest.raises(RecipeError, match="Megatron-LM"):
        formats.detect(["python", "train.py", "--lr", "1"])


def test_import_errors_name_what_to_do(tmp_path):
    argv = argv_of(MLM / "llama3_8b_h100_fp8.sh")
    no_vocab = [a for a in argv if a != "--vocab-size" and a != "128256"]
    with pytest.raises(RecipeError, match="--vocab-size"):
        imported(no_vocab, MLM)
    with pytest.raises(RecipeError, match="known: llama3_70b, llama3_8b"):
        imported(["nemo", "llm", "pretrain", "--factory", "mixtral_8x7b"])
    with pytest.raises(RecipeError, match="dump_perf_configs"):
        imported(["torchrun", "run_recipe.py", "--recipe", "qwen3_8b_pretrain_config"])
    with pytest.raises(RecipeError, match="cannot read the config file"):
        imported(bridge_argv("missing.yaml"), tmp_path)
    bad = argv[:]
    bad[bad.index("--micro-batch-size") + 1] = "3"
    with pytest.raises(RecipeError, match="knobs.micro_batch_size"):
        imported(bad, MLM)
