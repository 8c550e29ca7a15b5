"""Write the "headroom" recipes of the benchmark suite (benchmarks/suite/15-*.yaml onwards) and check them.

Each recipe starts from the kind of layout people actually ship before tuning: conservative recompute, pipeline
parallelism where none is needed, micro-batch 1, no communication overlap, the default MoE dispatcher, context
parallelism off at long context, NCCL defaults. The oracle (exhaustive enumeration of the search space on the
noiseless simulator) must find between 1.3x and 4x over the start, and the start must run.

    python benchmarks/scripts/make_headroom_suite.py            # write the files, print start, optimum, headroom
    python benchmarks/scripts/make_headroom_suite.py --check    # only check the files on disk
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

SUITE = Path(__file__).resolve().parents[1] / "suite"

MODELS: dict[str, dict[str, Any]] = {
    "llama3.2-3b": dict(family="llama3", layers=28, hidden_size=3072, heads=24, kv_groups=8, ffn_hidden_size=8192,
                        vocab_size=128256, tied_embeddings=True),
    "llama3-8b": dict(family="llama3", layers=32, hidden_size=4096, heads=32, kv_groups=8, ffn_hidden_size=14336,
                      vocab_size=128256),
    "llama3-70b": dict(family="llama3", layers=80, hidden_size=8192, heads=64, kv_groups=8, ffn_hidden_size=28672,
                       vocab_size=128256),
    "llama3-405b": dict(family="llama3", layers=126, hidden_size=16384, heads=128, kv_groups=8,
                        ffn_hidden_size=53248, vocab_size=128256),
    "nemotron4-15b": dict(family="nemotron", layers=32, hidden_size=6144, heads=48, kv_groups=8,
                          ffn_hidden_size=24576, vocab_size=256000),
    "gpt3-175b": dict(family="gpt", layers=96, hidden_size=12288, heads=96, kv_groups=None, ffn_hidden_size=49152,
                      vocab_size=50257),
    "mixtral-8x7b": dict(family="mixtral", layers=32, hidden_size=4096, heads=32, kv_groups=8, ffn_hidden_size=14336,
                         vocab_size=32768, moe_experts=8, moe_top_k=2, moe_ffn_hidden_size=14336),
    "mixtral-8x22b": dict(family="mixtral", layers=56, hidden_size=6144, heads=48, kv_groups=8,
                          ffn_hidden_size=16384, vocab_size=32768, moe_experts=8, moe_top_k=2,
                          moe_ffn_hidden_size=16384),
    "deepseek-v2-lite": dict(family="deepseek", layers=27, hidden_size=2048, heads=16, kv_groups=None,
                             ffn_hidden_size=10944, vocab_size=102400, moe_experts=64, moe_top_k=6,
                             moe_ffn_hidden_size=1408),
    "qwen2-57b-a14b": dict(family="qwen", layers=28, hidden_size=3584, heads=28, kv_groups=4, ffn_hidden_size=18944,
                           vocab_size=151552, moe_experts=64, moe_top_k=8, moe_ffn_hidden_size=2560),
}

# name, model, accelerator, nodes, GBS, seq, start knobs, search space, comment
RECIPES: list[dict[str, Any]] = []


def R(num: int, name: str, model: str, acc: str, nodes: int, gbs: int, seq: int, knobs: dict[str, Any],
      space: list[str], why: str) -> None:
    RECIPES.append(dict(num=num, name=name, model=model, acc=acc, nodes=nodes, gbs=gbs, seq=seq, knobs=knobs,
                        space=space, why=why))


FULL = dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
REC = ["recompute_granularity", "recompute_method", "recompute_num_layers"]
DPO = ["use_distributed_optimizer", "overlap_grad_reduce", "overlap_param_gather"]

R(15, "llama3.2-3b-h100x8", "llama3.2-3b", "h100-sxm-80gb", 1, 256, 4096,
  dict(tensor_model_parallel_size=2, sequence_parallel=True, pipeline_model_parallel_size=2, **FULL),
  ["tensor_model_parallel_size", "pipeline_model_parallel_size", "micro_batch_size", *REC,
   *DPO, "manual_gc"],
  "small model shipped with TP=2 PP=2 copied from a bigger recipe, full recompute, micro-batch 1, no overlap")
R(16, "llama3-8b-a100x16", "llama3-8b", "a100-80gb", 2, 128, 8192,
  dict(tensor_model_parallel_size=2, sequence_parallel=True, pipeline_model_parallel_size=2, **FULL),
  ["pipeline_model_parallel_size", "micro_batch_size", *REC, *DPO, "manual_gc"],
  "A100 run with PP=2 it does not need, full recompute for safety, no distributed optimizer, no overlap")
R(17, "llama3-8b-64k-h100x32", "llama3-8b", "h100-sxm-80gb", 4, 64, 65536,
  dict(tensor_model_parallel_size=2, sequence_parallel=True, pipeline_model_parallel_size=4, **FULL,
       use_distributed_optimizer=True),
  ["pipeline_model_parallel_size", "context_parallel_size", "micro_batch_size", *REC, "overlap_grad_reduce",
   "manual_gc"],
  "64K context with context parallelism off: PP=4 and full recompute to make it fit")
R(18, "llama3-70b-h200x64", "llama3-70b", "h200", 8, 256, 8192,
  dict(tensor_model_parallel_size=8, sequence_parallel=True, pipeline_model_parallel_size=4, **FULL),
  ["pipeline_model_parallel_size", "virtual_pipeline_model_parallel_size", "micro_batch_size", *REC,
   *DPO, "manual_gc"],
  "H200 run of a 70B with the H100 layout: PP=4 plain 1F1B, full recompute, no distributed optimizer, no overlap")
R(19, "nemotron4-15b-a100x32", "nemotron4-15b", "a100-80gb", 4, 256, 4096,
  dict(tensor_model_parallel_size=8, sequence_parallel=True, pipeline_model_parallel_size=2, **FULL,
       use_distributed_optimizer=True),
  ["tensor_model_parallel_size", "pipeline_model_parallel_size", "micro_batch_size", *REC, "overlap_grad_reduce",
   "overlap_param_gather", "manual_gc"],
  "15B on A100 with TP=8 PP=2 and full recompute, micro-batch 1, no overlap")
R(20, "llama3-405b-b200x256", "llama3-405b", "b200", 32, 512, 8192,
  dict(tensor_model_parallel_size=8, sequence_parallel=True, pipeline_model_parallel_size=16,
       account_for_embedding_in_pipeline_split=True, account_for_loss_in_pipeline_split=True, **FULL,
       use_distributed_optimizer=True),
  ["pipeline_model_parallel_size", "virtual_pipeline_model_parallel_size", "micro_batch_size", *REC,
   "overlap_grad_reduce", "overlap_param_gather", "manual_gc", "env.NCCL_P2P_NET_CHUNKSIZE"],
  "405B on B200 with the H100 layout: PP=16 plain 1F1B, full recompute, no overlap, NCCL defaults")
R(21, "gpt3-175b-a100x512", "gpt3-175b", "a100-80gb", 64, 1536, 2048,
  dict(tensor_model_parallel_size=8, sequence_parallel=True, pipeline_model_parallel_size=16, **FULL),
  ["pipeline_model_parallel_size", "virtual_pipeline_model_parallel_size", "micro_batch_size", *REC,
   *DPO, "manual_gc"],
  "175B on A100 with PP=16, full recompute, no distributed optimizer, no overlap")
R(22, "mixtral-8x7b-h200x32", "mixtral-8x7b", "h200", 4, 256, 4096,
  dict(tensor_model_parallel_size=8, sequence_parallel=True, pipeline_model_parallel_size=1,
       use_distributed_optimizer=True, recompute_granularity="selective"),
  ["tensor_model_parallel_size", "pipeline_model_parallel_size", "expert_model_parallel_size",
   "expert_tensor_parallel_size", "moe_token_dispatcher_type", "micro_batch_size", "overlap_grad_reduce",
   "manual_gc"],
  "MoE shipped like a dense model: TP=8 across the node, no expert parallelism, allgather dispatcher")
R(23, "mixtral-8x22b-b200x128", "mixtral-8x22b", "b200", 16, 512, 4096,
  dict(tensor_model_parallel_size=4, sequence_parallel=True, pipeline_model_parallel_size=4,
       expert_model_parallel_size=2, use_distributed_optimizer=True, **FULL),
  ["tensor_model_parallel_size", "pipeline_model_parallel_size", "expert_model_parallel_size",
   "moe_token_dispatcher_type", "micro_batch_size", "recompute_granularity", "recompute_method",
   "recompute_num_layers", "overlap_grad_reduce"],
  "8x22B on B200: EP=2 with the allgather dispatcher, TP=4 PP=4, full recompute")
R(24, "deepseek-v2-lite-h100x32", "deepseek-v2-lite", "h100-sxm-80gb", 4, 512, 4096,
  dict(tensor_model_parallel_size=2, sequence_parallel=True, pipeline_model_parallel_size=4,
       account_for_embedding_in_pipeline_split=True, use_distributed_optimizer=True, **FULL),
  ["tensor_model_parallel_size", "pipeline_model_parallel_size", "expert_model_parallel_size",
   "expert_tensor_parallel_size", "moe_token_dispatcher_type", "micro_batch_size", "recompute_granularity",
   "recompute_method", "recompute_num_layers"],
  "fine-grained MoE (64 experts, top-6) with TP=2 PP=4, no expert parallelism, full recompute")
R(25, "llama3-70b-32k-b200x64", "llama3-70b", "b200", 8, 64, 32768,
  dict(tensor_model_parallel_size=8, sequence_parallel=True, pipeline_model_parallel_size=4, **FULL,
       use_distributed_optimizer=True),
  ["pipeline_model_parallel_size", "virtual_pipeline_model_parallel_size", "context_parallel_size",
   "micro_batch_size", *REC, "overlap_grad_reduce", "manual_gc"],
  "32K context 70B on B200 with context parallelism off: PP=4 and full recompute to fit")
R(26, "qwen2-57b-a14b-h100x64", "qwen2-57b-a14b", "h100-sxm-80gb", 8, 512, 4096,
  dict(tensor_model_parallel_size=2, sequence_parallel=True, pipeline_model_parallel_size=4,
       expert_model_parallel_size=1, use_distributed_optimizer=True, **FULL),
  ["pipeline_model_parallel_size", "expert_model_parallel_size", "moe_token_dispatcher_type",
   "expert_tensor_parallel_size", "micro_batch_size", "recompute_granularity", "recompute_method",
   "recompute_num_layers", "overlap_grad_reduce", "manual_gc"],
  "fine-grained MoE (64 experts, top-8) with PP=4, full recompute, no expert parallelism")

TRAINING = dict(steps=10000, optimizer=dict(name="adamw", lr=0.0003, weight_decay=0.1, betas=[0.9, 0.95], eps=1.0e-08,
                                            grad_clip=1.0),
                schedule=dict(name="cosine", warmup_steps=100, min_lr_ratio=0.1), seed=0,
                data=dict(source="synthetic", path=None, seed=1234, order="sequential"), precision="bf16",
                dropout=0.0, numerics_opt_in=["bf16_grad_reduce"])


def document(spec: dict[str, Any]) -> dict[str, Any]:
    model = {"moe_experts": None, "moe_top_k": None, "moe_ffn_hidden_size": None, "tied_embeddings": False,
             **MODELS[spec["model"]]}
    return {
        "name": spec["name"], "framework": "megatron", "model": model,
        "training": {"global_batch_size": spec["gbs"], "seq_length": spec["seq"], **TRAINING},
        "resources": {"accelerator": spec["acc"], "nodes": spec["nodes"], "devices_per_node": 8,
                      "device_memory_gb": None},
        "knobs": spec["knobs"],
        "tuning": {"search_space": spec["space"], "warmup_steps": 2, "measure_steps": 6, "baseline_repeats": 2,
                   "confirm": True, "min_gain": 0.02, "trial_timeout_s": 1800.0},
    }


def path_of(spec: dict[str, Any]) -> Path:
    return SUITE / f"{spec['num']:02d}-{spec['name']}.yaml"


def write(spec: dict[str, Any]) -> Path:
    p = path_of(spec)
    p.write_text(f"# headroom: {spec['why']}\n" + yaml.safe_dump(document(spec), sort_keys=False))
    return p


def cache_dir() -> Path:
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("attune")) / "oracle"


def check(path: Path) -> tuple[bool, str]:
    from attune.bench.oracle import oracle
    from attune.recipe.io import load_recipe
    from attune.sim import simulate

    r = load_recipe(path)
    base = simulate(r)
    if base.outcome != "succeeded":
        return False, f"{r.name}: the start does not run ({base.message})"
    o = oracle(r, cache_dir())
    gain = o.optimum_tps / o.baseline_tps
    ok = 1.3 <= gain <= 4.0
    changed = {k: v for k, v in o.optimum_knobs.items() if r.knob(k) != v}
    return ok, (f"{r.name}: {o.admissible:,}/{o.space_size:,} admissible, start {o.baseline_tps:,.0f}, optimum "
                f"{o.optimum_tps:,.0f} tok/s/dev = {gain:.2f}x {'ok' if ok else 'OUT OF RANGE'} ({o.seconds:.0f} s); "
                f"optimum changes {changed}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only check the files on disk")
    ap.add_argument("--only", nargs="*", type=int, help="recipe numbers")
    args = ap.parse_args(argv)
    bad = 0
    for spec in RECIPES:
        if args.only and spec["num"] not in args.only:
            continue
        p = path_of(spec) if args.check else write(spec)
        try:
            ok, line = check(p)
        except Exception as err:  # noqa: BLE001 - report every recipe
            ok, line = False, f"{p.name}: {err}"
        bad += not ok
        print(line, flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
