"""Sanity and monotonicity tests of the analytical simulator."""

from __future__ import annotations

import ast
import pathlib

import pytest

from attune.sim import simulate
from attune.sim.calibration import MODELS, ROWS, CalibrationRow
from tests.recipe.helpers import make

ROW_70B = next(r for r in ROWS if r.name == "llama3-70b-bf16-h100")


def test_no_torch_import_in_sim():
    for path in pathlib.Path("attune/sim").glob("*.py"):
        tree = ast.parse(path.read_text())
        names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert "torch" not in names, path


def test_result_fields_and_breakdown_sum():
    res = simulate(ROW_70B.recipe())
    assert res.outcome == "succeeded"
    assert res.tokens_per_s_per_device > 0 and res.step_time_s > 0
    parts = sum(v for k, v in res.breakdown.items())
    assert parts == pytest.approx(res.step_time_s, rel=0.15)
    for key in ("sm_active", "tensor_active", "dram_active", "nvlink_bytes", "ib_bytes", "pcie_bytes",
                "fb_used_gb"):
        assert key in res.signals
    assert 0 < res.signals["tensor_active"] <= res.signals["sm_active"] <= 1


def test_noise_is_seeded_and_small():
    r = ROW_70B.recipe()
    mean = simulate(r).step_time_s
    assert simulate(r).step_time_s == mean
    a, b = simulate(r, seed=1).step_time_s, simulate(r, seed=1).step_time_s
    assert a == b
    samples = [simulate(r, seed=s).step_time_s / mean for s in range(40)]
    assert all(0.93 < x < 1.07 for x in samples)
    assert len(set(samples)) > 30


def test_more_recompute_is_slower_and_uses_less_memory():
    base = make({"use_distributed_optimizer": True}, seq=4096)
    assert simulate(base).outcome == "succeeded"
    none = simulate(base)
    sel = simulate(base.with_knobs(recompute_granularity="selective"))
    full = simulate(base.with_knobs(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1))
    assert none.step_time_s < sel.step_time_s < full.step_time_s
    assert full.peak_memory_gb < sel.peak_memory_gb <= none.peak_memory_gb
    block = simulate(base.with_knobs(recompute_granularity="full", recompute_method="block", recompute_num_layers=8))
    assert none.step_time_s < block.step_time_s < full.step_time_s
    assert full.peak_memory_gb < block.peak_memory_gb < none.peak_memory_gb


def test_bigger_model_ooms_on_fewer_gpus():
    row = CalibrationRow("x", "llama3-70b", "h100-sxm-80gb", 8, "bf16", 128, 1, 8192, 8, 1, 1, None, 1, 1.0, "t")
    res = simulate(row.recipe())
    assert res.outcome == "oom" and res.step_time_s is None and res.tokens_per_s_per_device == 0
    assert res.peak_memory_gb > 80
    assert simulate(ROW_70B.recipe()).outcome == "succeeded"


def test_h200_fits_what_h100_cannot():
    row = CalibrationRow("x", "llama3-8b", "h100-sxm-80gb", 8, "bf16", 128, 2, 8192, 1, 1, 1, None, 1, 1.0, "t")
    assert simulate(row.recipe()).outcome == "oom"
    row200 = CalibrationRow("x", "llama3-8b", "h200", 8, "bf16", 128, 2, 8192, 1, 1, 1, None, 1, 1.0, "t")
    assert simulate(row200.recipe()).outcome == "succeeded"


def test_device_memory_cap_is_honoured():
    r = make()
    need = simulate(r).peak_memory_gb
    capped = r.model_copy(update={"resources": r.resources.model_copy(update={"device_memory_gb": need - 1})})
    assert simulate(capped).outcome == "oom"


def test_cuda_graphs_reduce_host_overhead_in_host_bound_regime():
    small = {**MODELS["llama3-8b"], "layers": 8, "hidden_size": 1024, "heads": 8, "kv_groups": 8,
             "ffn_hidden_size": 4096}
    r = make({"tensor_model_parallel_size": 2, "sequence_parallel": True}, model=small, seq=2048)
    eager = simulate(r)
    graphed = simulate(r.with_knobs(enable_cuda_graph=True))
    assert graphed.breakdown["host_overhead"] < eager.breakdown["host_overhead"]
    assert graphed.step_time_s < eager.step_time_s
    assert graphed.peak_memory_gb > eager.peak_memory_gb


def test_manual_gc_helps_at_scale():
    r = ROW_70B.recipe(manual_gc=False)
    assert simulate(ROW_70B.recipe()).step_time_s < simulate(r).step_time_s


def test_overlaps_help():
    base = ROW_70B.recipe(overlap_param_gather=False, overlap_grad_reduce=False)
    assert simulate(ROW_70B.recipe()).step_time_s < simulate(base).step_time_s
    no_tp = ROW_70B.recipe(tp_comm_overlap=False)
    assert simulate(ROW_70B.recipe()).breakdown["tp_comm"] < simulate(no_tp).breakdown["tp_comm"]


def test_distributed_optimizer_saves_memory():
    base = ROW_70B.recipe(overlap_param_gather=False)
    plain = ROW_70B.recipe(overlap_param_gather=False, use_distributed_optimizer=False)
    assert simulate(base).peak_memory_gb < simulate(plain).peak_memory_gb


def test_tp_across_nodes_is_slow():
    r8 = make({"tensor_model_parallel_size": 8, "sequence_parallel": True}, nodes=2)
    r16 = make({"tensor_model_parallel_size": 16, "sequence_parallel": True}, nodes=2)
    assert simulate(r16).breakdown["tp_comm"] > 3 * simulate(r8).breakdown["tp_comm"]


def test_interleaving_shrinks_the_bubble():
    plain = ROW_70B.recipe(virtual_pipeline_model_parallel_size=None)
    assert simulate(ROW_70B.recipe()).breakdown["pp_bubble"] < simulate(plain).breakdown["pp_bubble"]


def test_fp8_is_faster_on_hopper():
    assert simulate(ROW_70B.recipe(fp8="hybrid")).step_time_s < simulate(ROW_70B.recipe()).step_time_s


def test_rejects_torch_recipe_and_cpu():
    from attune.recipe.model import Recipe
    torch_r = Recipe.model_validate({"model": MODELS["llama3-8b"],
                                     "training": {"global_batch_size": 8, "seq_length": 128, "steps": 1,
                                                  "optimizer": {"lr": 1e-4}}})
    with pytest.raises(ValueError, match="framework"):
        simulate(torch_r)
    with pytest.raises(ValueError, match="accelerator"):
        simulate(make(accelerator="cpu"))


def test_expert_tensor_parallelism_alone_pays_for_moving_tokens():
    """ETP shards every expert: with EP 1 and TP 1 the ETP group still gathers its tokens to each shard and
    reduce-scatters the outputs back. (It once cost nothing, so EP 1 + ETP 8 beat every real MoE layout.)"""
    from attune.recipe.io import load_recipe

    moe = load_recipe("benchmarks/suite/22-mixtral-8x7b-h200x32.yaml").with_knobs(
        tensor_model_parallel_size=1, pipeline_model_parallel_size=1, micro_batch_size=2)
    ep1 = simulate(moe.with_knobs(expert_model_parallel_size=1, expert_tensor_parallel_size=1))
    etp8 = simulate(moe.with_knobs(expert_model_parallel_size=1, expert_tensor_parallel_size=8))
    assert ep1.breakdown["ep_comm"] == 0
    assert etp8.breakdown["ep_comm"] > 0
    ep8 = simulate(moe.with_knobs(expert_model_parallel_size=8, expert_tensor_parallel_size=1))
    assert ep8.breakdown["ep_comm"] > 0
