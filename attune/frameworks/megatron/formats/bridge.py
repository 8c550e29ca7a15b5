"""Megatron-Bridge launches: a ``ConfigContainer`` built from a recipe or a YAML config, plus dot-notation overrides.

Accepted forms (NVIDIA-NeMo/Megatron-Bridge @ ``067f987``, package 0.7.0; the YAML layout also checked against a
0.2.0rc7 ``Task Configuration`` dump):

- ``torchrun [...] scripts/training/run_recipe.py --recipe NAME [--mode pretrain] [--dataset mock] [-tp N ...]
  [section.field=value ...]``: the recipe function's settings (the published ones attune knows are in
  :mod:`.presets`), the convenience options (``-tp`` = ``model.tensor_model_parallel_size`` ...) and overrides;
- ``torchrun [...] SCRIPT.py --config-file CONFIG.yaml [section.field=value ...]`` (``tutorials/recipes/llama``):
  the YAML mirrors the ``ConfigContainer`` (``model``, ``train``, ``optimizer``, ``ddp``, ``mixed_precision``, ...).
  attune reads the file; a full dump (``ConfigContainer.to_yaml``, ``dump_perf_configs.py``) carries the model's
  architecture, a partial one needs a known ``--recipe`` underneath.

A config with top-level sections the covered versions do not have is refused as an unknown schema, not guessed.
Bridge pads the vocabulary only with ``model.should_pad_vocab: true`` (its perf recipes set it; the model providers
default to false), so only then does TP decide the padded vocabulary.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import PurePosixPath
from typing import Any, ClassVar

from attune.errors import RecipeError
from attune.frameworks.cmdline import AbbreviatedOption
from attune.frameworks.megatron import argv as av
from attune.frameworks.megatron.formats import Native, presets, yamledit
from attune.frameworks.megatron.formats.dotted import DottedFormat, KnobKeys, number

VERSIONS = ">=0.1,<0.8"
#: top-level ``ConfigContainer`` fields of the covered versions (0.7.0 added ``validation`` and
#: ``tensor_inspect`` to the 0.2 set; ``env_vars`` holds the launcher's environment)
SECTIONS = frozenset({
    "_target_", "rng", "rerun_state_machine", "train", "model", "optimizer", "optimizer_config_override_provider",
    "ddp", "validation", "scheduler", "dataset", "logger", "tokenizer", "checkpoint", "dist", "ft", "straggler",
    "nvrx_straggler", "profiling", "peft", "comm_overlap", "mixed_precision", "tensor_inspect", "inprocess_restart",
    "env_vars",
})
CONFIG_FILE_FLAGS = ("config-file", "config_file")


class MegatronBridge(DottedFormat):
    name = "megatron-bridge"
    title = "Megatron-Bridge recipe (ConfigContainer + key=value overrides)"
    package = "megatron-bridge"
    versions = VERSIONS
    short_options = True
    switches = frozenset({"dry-run", "dry_run", "deterministic", "dump-env", "dump_env", "h", "help"})
    KNOBS = (
        KnobKeys("tensor_model_parallel_size", ("model.tensor_model_parallel_size",), 1),
        KnobKeys("pipeline_model_parallel_size", ("model.pipeline_model_parallel_size",), 1),
        KnobKeys("virtual_pipeline_model_parallel_size", ("model.virtual_pipeline_model_parallel_size",), None),
        KnobKeys("context_parallel_size", ("model.context_parallel_size",), 1),
        KnobKeys("expert_model_parallel_size", ("model.expert_model_parallel_size",), 1),
        KnobKeys("expert_tensor_parallel_size", ("model.expert_tensor_parallel_size",), None),
        KnobKeys("sequence_parallel", ("model.sequence_parallel",), False),
        KnobKeys("moe_token_dispatcher_type", ("model.moe_token_dispatcher_type",), "allgather"),
        KnobKeys("micro_batch_size", ("train.micro_batch_size",), 1),
        KnobKeys("recompute_granularity", ("model.recompute_granularity",), "none", none_is="none"),
        KnobKeys("recompute_method", ("model.recompute_method",), None),
        KnobKeys("recompute_num_layers", ("model.recompute_num_layers",), None),
        KnobKeys("use_distributed_optimizer", ("ddp.use_distributed_optimizer", "optimizer.use_distributed_optimizer"),
                 False),
        KnobKeys("overlap_grad_reduce", ("ddp.overlap_grad_reduce",), False),
        KnobKeys("overlap_param_gather", ("ddp.overlap_param_gather",), False),
        KnobKeys("bucket_size", ("ddp.bucket_size",), None),
        KnobKeys("grad_reduce_in_bf16", ("mixed_precision.grad_reduce_in_fp32", "ddp.grad_reduce_in_fp32"), False,
                 invert=True),
        KnobKeys("tp_comm_overlap", ("comm_overlap.tp_comm_overlap", "model.tp_comm_overlap"), False),
        KnobKeys("fp8", ("mixed_precision.fp8", "model.fp8"), None),
        KnobKeys("enable_cuda_graph", ("model.cuda_graph_impl", "model.enable_cuda_graph"), False,
                 to_native={True: "local", False: "none"}),
        KnobKeys("manual_gc", ("train.manual_gc",), False),
        KnobKeys("account_for_embedding_in_pipeline_split", ("model.account_for_embedding_in_pipeline_split",), False),
        KnobKeys("account_for_loss_in_pipeline_split", ("model.account_for_loss_in_pipeline_split",), False),
        KnobKeys("make_vocab_size_divisible_by", ("model.make_vocab_size_divisible_by",), 128),
    )
    CONTRACT_PREFIXES = ("optimizer.", "scheduler.", "dataset.", "rng.", "tokenizer.", "peft.", "model.moe_router",
                         "model.moe_aux", "model.rotary", "model.init_method", "model.embedding_init")
    CONTRACT_KEYS = frozenset({
        "train.global_batch_size", "train.rampup_batch_size", "train.train_iters", "train.train_samples",
        "model.num_layers", "model.hidden_size", "model.ffn_hidden_size", "model.num_attention_heads",
        "model.num_query_groups", "model.kv_channels", "model.vocab_size", "model.seq_length",
        "model.should_pad_vocab", "model.share_embeddings_and_output_weights", "model.gated_linear_unit",
        "model.normalization", "model.hidden_dropout", "model.attention_dropout", "model.num_moe_experts",
        "model.moe_ffn_hidden_size", "model.moe_expert_capacity_factor", "model.moe_token_drop_policy",
        "model.moe_pad_expert_input_to_capacity", "model.calculate_per_token_loss", "model.position_embedding_type",
        "model.bf16", "model.fp16", "mixed_precision.bf16", "mixed_precision.fp16", "mixed_precision.fp8_recipe",
        "mixed_precision.first_last_layers_bf16", "model._target_", "mixed_precision",
    })
    ALIASES: ClassVar[dict[str, str]] = {"lr": "optimizer.lr", "min_lr": "optimizer.min_lr", "global_batch_size": "train.global_batch_size",
               "seq_length": "dataset.seq_length", "train_iters": "train.train_iters", "seed": "rng.seed",
               "weight_decay": "optimizer.weight_decay"}
    #: run_recipe.py's convenience options (COMMON_OVERRIDE_FIELDS)
    OPTION_KEYS: ClassVar[dict[str, str]] = {
        "max_steps": "train.train_iters", "ms": "train.train_iters", "global_batch_size": "train.global_batch_size",
        "gb": "train.global_batch_size", "micro_batch_size": "train.micro_batch_size", "mb": "train.micro_batch_size",
        "seq_length": "dataset.seq_length", "sl": "dataset.seq_length",
        "tensor_model_parallel_size": "model.tensor_model_parallel_size", "tp": "model.tensor_model_parallel_size",
        "pipeline_model_parallel_size": "model.pipeline_model_parallel_size",
        "pp": "model.pipeline_model_parallel_size", "context_parallel_size": "model.context_parallel_size",
        "cp": "model.context_parallel_size",
        "virtual_pipeline_model_parallel_size": "model.virtual_pipeline_model_parallel_size",
        "vp": "model.virtual_pipeline_model_parallel_size",
        "expert_model_parallel_size": "model.expert_model_parallel_size", "ep": "model.expert_model_parallel_size",
        "expert_tensor_parallel_size": "model.expert_tensor_parallel_size", "etp": "model.expert_tensor_parallel_size",
        "lr": "optimizer.lr", "min_lr": "optimizer.min_lr", "warmup_iters": "scheduler.lr_warmup_iters",
    }

    def detect(self, argv: Sequence[str]) -> bool:
        try:
            launch = av.split(argv)
        except AbbreviatedOption:
            raise  # the launch is this format's or another's: either way it must be written out
        except RecipeError:
            return False
        rest = list(argv[launch.args_start:])
        return PurePosixPath(launch.script).name == "run_recipe.py" or any(
            t.lstrip("-").split("=")[0] in (*CONFIG_FILE_FLAGS, "recipe") for t in rest if t.startswith("--"))

    def files_to_read(self, argv: Sequence[str]) -> list[str]:
        launch = av.split(argv)
        opts, _, _ = av.scan(launch.argv, launch.args_start, overrides=True, short=True)
        return [str(o.values[0]) for o in opts if o.name in CONFIG_FILE_FLAGS and o.values]

    def base(self, launch: av.Launch, opts: list[av.Option], files: Mapping[str, str]) -> tuple[dict[str, Any],
                                                                                                str | None]:
        recipe = next((o.values[0] for o in opts if o.name == "recipe" and o.values), None)
        cfg_file = next((o.values[0] for o in opts if o.name in CONFIG_FILE_FLAGS and o.values), None)
        base: dict[str, Any] = {}
        if recipe is not None:
            if recipe not in presets.BRIDGE_RECIPES and cfg_file is None:
                raise RecipeError(f"--recipe {recipe}: attune does not know this recipe's settings (it cannot import "
                                  "Megatron-Bridge here); known: " + ", ".join(sorted(presets.BRIDGE_RECIPES))
                                  + ". Dump its ConfigContainer to YAML (scripts/performance/dump_perf_configs.py, "
                                  "or train.save_config_filepath) and import that with --config-file")
            base.update(presets.BRIDGE_RECIPES.get(recipe, {}))
        if cfg_file is not None:
            if cfg_file not in files:
                raise RecipeError(f"--config-file {cfg_file}: attune needs the file's text to read the launch (it "
                                  "cannot read files inside a container image); import it where the file is")
            data = yamledit.load(cfg_file, files[cfg_file])
            unknown = sorted(k for k in data if k not in SECTIONS)
            if unknown:
                raise RecipeError(f"{cfg_file}: sections {', '.join(unknown)} are not in the ConfigContainer of the "
                                  f"Megatron-Bridge versions attune covers ({VERSIONS}); this looks like a newer (or "
                                  "another) config schema, which attune will not guess at")
            base.update(yamledit.flatten(data))
        if recipe is None and cfg_file is None:
            raise RecipeError("a Megatron-Bridge launch names its config with --recipe NAME or --config-file FILE")
        return base, cfg_file

    # -- reading -------------------------------------------------------------------------------------------
    def read(self, argv: Sequence[str], files: Mapping[str, str]) -> Native:
        src = self.sources(argv, files)
        s = self.settings(src)
        knobs = self.knob_values(s)
        if isinstance(s.get("mixed_precision"), str):  # a named precision recipe: FP8 iff its name says so
            knobs["fp8"] = "hybrid" if "fp8" in str(s["mixed_precision"]) else None
            knobs["grad_reduce_in_bf16"] = False if "mixed_precision.grad_reduce_in_fp32" not in s else knobs[
                "grad_reduce_in_bf16"]
        if knobs["fp8"] not in (None, "hybrid"):
            knobs["fp8"] = "hybrid" if knobs["fp8"] in ("e4m3",) else knobs["fp8"]
        if knobs.get("enable_cuda_graph") not in (True, False):
            knobs["enable_cuda_graph"] = knobs["enable_cuda_graph"] not in (None, "none")
        model, training = _derive(s)
        recipe = next((o.values[0] for o in src.options if o.name == "recipe" and o.values), None)
        # apply_environment_variables: the recipe's cfg.env_vars are defaults under the process environment
        env = dict(presets.BRIDGE_ENV.get(str(recipe), {}))
        env.update({k.removeprefix("env_vars."): str(av.to_scalar(v) if not isinstance(v, bool) else int(v))
                    for k, v in s.items() if k.startswith("env_vars.")})
        return Native(format=self, argv=tuple(src.launch.argv), files={k: v for k, v in files.items()
                                                                       if k == src.file},
                      settings=s, knobs=knobs, model=model, training=training, nodes=src.launch.nnodes,
                      devices_per_node=src.launch.nproc, pads_vocab=bool(s.get("model.should_pad_vocab", False)),
                      knob_settings=self.knob_keys(), extra={"env": env})

    def trial_settings(self, native: Native, steps: int) -> dict[str, Any]:
        """Log every step with throughput, stop after the measured steps (``train.exit_interval``), write no
        checkpoint and run no evaluation; ``train.train_iters`` and the schedule stay as they are."""
        s = native.settings
        out: dict[str, Any] = {"logger.log_interval": 1, "logger.log_throughput": True, "train.exit_interval": steps}
        out["validation.eval_iters" if "validation.eval_iters" in s else "train.eval_iters"] = 0
        if s.get("checkpoint.save") is not None:
            out["checkpoint.save"] = None
        return out


def _derive(s: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    target = str(s.get("model._target_", ""))
    gated = bool(s.get("model.gated_linear_unit", "llama" in target.lower()))
    experts = s.get("model.num_moe_experts")
    vocab = s.get("model.vocab_size") or s.get("tokenizer.vocab_size")
    if vocab is None:
        raise RecipeError("model.vocab_size / tokenizer.vocab_size: the launch sets neither, and attune cannot load "
                          "the tokenizer; add model.vocab_size=N")
    family = "llama3" if "llama3" in target.lower() or "llama31" in target.lower() else (
        "mixtral" if experts and gated else "llama" if gated else "gpt")
    heads = int(number(s, "model.num_attention_heads"))
    model: dict[str, Any] = {
        "family": family, "layers": int(number(s, "model.num_layers")), "hidden_size": int(number(s, "model.hidden_size")),
        "heads": heads, "kv_groups": s.get("model.num_query_groups"),
        "ffn_hidden_size": int(number(s, "model.ffn_hidden_size")), "vocab_size": int(vocab),
        "tied_embeddings": bool(s.get("model.share_embeddings_and_output_weights", False)),
    }
    if experts:
        model.update(moe_experts=int(experts), moe_top_k=int(s.get("model.moe_router_topk", 2)),
                     moe_ffn_hidden_size=s.get("model.moe_ffn_hidden_size"))
    gbs = int(number(s, "train.global_batch_size"))
    seq = s.get("dataset.sequence_length") or s.get("dataset.seq_length") or s.get("model.seq_length")
    seq = int(number({"seq": seq}, "seq", what=" (dataset.seq_length)"))
    steps = s.get("train.train_iters")
    if steps is None and s.get("train.train_samples"):
        steps = math.ceil(int(s["train.train_samples"]) / gbs)
    steps = int(number({"train.train_iters": steps}, "train.train_iters"))
    lr = float(number(s, "optimizer.lr"))
    min_lr = float(s.get("optimizer.min_lr") or 0.0)
    style = str(s.get("scheduler.lr_decay_style", "cosine"))
    clip = s.get("optimizer.clip_grad", 1.0)
    mp = s.get("mixed_precision")
    bf16 = bool(s.get("mixed_precision.bf16", s.get("model.bf16", False))) or (isinstance(mp, str) and "bf16" in mp)
    fp16 = bool(s.get("mixed_precision.fp16", s.get("model.fp16", False)))
    seed = int(s.get("rng.seed", 1234))
    warmup = int(s.get("scheduler.lr_warmup_iters") or 0)
    training: dict[str, Any] = {
        "global_batch_size": gbs, "seq_length": seq, "steps": steps,
        "optimizer": {"name": "sgd" if s.get("optimizer.optimizer") == "sgd" else "adamw", "lr": lr,
                      "weight_decay": float(s.get("optimizer.weight_decay", 0.01)),
                      "betas": [float(s.get("optimizer.adam_beta1", 0.9)), float(s.get("optimizer.adam_beta2", 0.999))],
                      "eps": float(s.get("optimizer.adam_eps", 1e-8)), "grad_clip": float(clip) if clip else None},
        "schedule": {"name": style if style in ("cosine", "linear", "constant") else "constant",
                     "warmup_steps": min(warmup, steps), "min_lr_ratio": max(0.0, min(1.0, min_lr / lr))},
        "seed": seed,
        "data": {"source": "synthetic", "seed": int(s.get("dataset.random_seed", seed))}
        if s.get("dataset.mock", not s.get("dataset.blend") and not s.get("dataset.data_path")) else
        {"source": "tokens", "path": str(s.get("dataset.data_path") or s.get("dataset.blend")),
         "seed": int(s.get("dataset.random_seed", seed))},
        "precision": "bf16" if bf16 else "fp16" if fp16 else "fp32",
        "dropout": float(s.get("model.hidden_dropout", 0.0)),
    }
    return model, training


FORMAT = MegatronBridge()

__all__ = ["CONFIG_FILE_FLAGS", "FORMAT", "SECTIONS", "VERSIONS", "MegatronBridge"]
