"""NeMo 2 override lines: ``nemo llm pretrain --factory llama3_8b trainer.strategy.tensor_model_parallel_size=2 ...``.

The factory builds a NeMo-Run ``run.Partial`` (model, trainer with its ``MegatronStrategy``, data, optim); the
``key=value`` tokens override its fields (NeMo docs: ``nemo llm pretrain --factory llama3_8b
trainer.strategy.tensor_model_parallel_size=2``, ``data.micro_batch_size=4 data.global_batch_size=16``). The
factories attune knows are in :mod:`.presets` (NVIDIA/NeMo ``nemo/collections/llm/recipes``); others cannot be read
from their name. ``--factory "llama3_8b(num_nodes=2)"`` passes ``num_nodes`` / ``num_gpus_per_node``.

Covered: nemo-toolkit 2.x (the NeMo 2 ``nemo llm`` CLI; the LLM collections are being retired in favour of
Megatron-Bridge and the 3.x line concentrates on speech). Settings NeMo 2 sets through trainer callbacks (TP comm
overlap in ``MegatronCommOverlapCallback``, manual GC in ``GarbageCollectionCallback``) have no ``key=value``
spelling, so those knobs are not tunable in this format. NeMo pads the vocabulary from the tokenizer's size by
``make_vocab_size_divisible_by × TP`` (``nemo/lightning/base.py get_vocab_size``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from attune.errors import RecipeError
from attune.frameworks.megatron import argv as av
from attune.frameworks.megatron.formats import Native, presets
from attune.frameworks.megatron.formats.dotted import DottedFormat, KnobKeys, number

VERSIONS = ">=2.0,<3"
_S = "trainer.strategy."


class NeMo2(DottedFormat):
    name = "nemo2"
    title = "NeMo 2 override line (nemo llm pretrain --factory NAME key=value ...)"
    package = "nemo-toolkit"
    versions = VERSIONS
    programs = ("nemo",)
    short_options = True
    switches = frozenset({"y", "yes", "h", "help", "dryrun", "dry-run"})
    KNOBS = (
        KnobKeys("tensor_model_parallel_size", (_S + "tensor_model_parallel_size",), 1),
        KnobKeys("pipeline_model_parallel_size", (_S + "pipeline_model_parallel_size",), 1),
        KnobKeys("virtual_pipeline_model_parallel_size", (_S + "virtual_pipeline_model_parallel_size",), None),
        KnobKeys("context_parallel_size", (_S + "context_parallel_size",), 1),
        KnobKeys("expert_model_parallel_size", (_S + "expert_model_parallel_size",), 1),
        KnobKeys("expert_tensor_parallel_size", (_S + "expert_tensor_parallel_size",), None),
        KnobKeys("sequence_parallel", (_S + "sequence_parallel",), False),
        KnobKeys("moe_token_dispatcher_type", ("model.config.moe_token_dispatcher_type",), "allgather"),
        KnobKeys("micro_batch_size", ("data.micro_batch_size",), 1),
        KnobKeys("recompute_granularity", ("model.config.recompute_granularity",), "none", none_is="none"),
        KnobKeys("recompute_method", ("model.config.recompute_method",), None),
        KnobKeys("recompute_num_layers", ("model.config.recompute_num_layers",), None),
        KnobKeys("use_distributed_optimizer", ("optim.config.use_distributed_optimizer",), False),
        KnobKeys("overlap_grad_reduce", (_S + "ddp.overlap_grad_reduce",), False),
        KnobKeys("overlap_param_gather", (_S + "ddp.overlap_param_gather",), False),
        KnobKeys("bucket_size", (_S + "ddp.bucket_size",), None),
        KnobKeys("grad_reduce_in_bf16", ("trainer.plugins.grad_reduce_in_fp32", _S + "ddp.grad_reduce_in_fp32"),
                 False, invert=True),
        KnobKeys("fp8", ("trainer.plugins.fp8",), None),
        KnobKeys("enable_cuda_graph", ("model.config.enable_cuda_graph",), False),
        KnobKeys("account_for_embedding_in_pipeline_split", (_S + "account_for_embedding_in_pipeline_split",), False),
        KnobKeys("account_for_loss_in_pipeline_split", (_S + "account_for_loss_in_pipeline_split",), False),
        KnobKeys("make_vocab_size_divisible_by", ("model.config.make_vocab_size_divisible_by",), 128),
    )
    CONTRACT_PREFIXES = ("optim.", "data.", "model.config.moe_router", "model.config.rotary", "tokenizer.",
                         "resume.", "peft.")
    CONTRACT_KEYS = frozenset({
        "trainer.max_steps", "trainer.accumulate_grad_batches", "trainer.plugins.precision",
        "trainer.plugins.fp8_recipe", "model.config.num_layers", "model.config.hidden_size",
        "model.config.ffn_hidden_size", "model.config.num_attention_heads", "model.config.num_query_groups",
        "model.config.vocab_size", "model.config.seq_length", "model.config.share_embeddings_and_output_weights",
        "model.config.gated_linear_unit", "model.config.hidden_dropout", "model.config.attention_dropout",
        "model.config.num_moe_experts", "model.config.moe_ffn_hidden_size", "model.config.moe_expert_capacity_factor",
        "model.config.moe_token_drop_policy", "model.config.moe_aux_loss_coeff", "model.config.init_method_std",
        "model.config.calculate_per_token_loss", "model._target_", "factory", "seed",
    })
    ALIASES: ClassVar[dict[str, str]] = {"lr": "optim.config.lr", "min_lr": "optim.lr_scheduler.min_lr",
               "global_batch_size": "data.global_batch_size", "seq_length": "data.seq_length",
               "max_steps": "trainer.max_steps", "weight_decay": "optim.config.weight_decay"}

    def detect(self, argv: Sequence[str]) -> bool:
        return len(argv) >= 3 and str(argv[0]).rsplit("/", 1)[-1] == "nemo" and str(argv[1]) == "llm"

    def check_positionals(self, launch: av.Launch, positionals: list[int]) -> None:
        toks = [launch.argv[i] for i in positionals]
        if toks[:2] != ["llm", "pretrain"]:
            raise RecipeError(f"`{' '.join(launch.argv[:3])}`: attune tunes pretraining (`nemo llm pretrain ...`)")
        if toks[2:]:
            raise RecipeError(f"`{toks[2]}` in the NeMo 2 line is neither an option nor a key=value override")

    def base(self, launch: av.Launch, opts: list[av.Option], files: Mapping[str, str]) -> tuple[dict[str, Any],
                                                                                                str | None]:
        factory = next((o.values[0] for o in opts if o.name in ("factory", "f") and o.values), None)
        if factory is None:
            raise RecipeError("the NeMo 2 line names no recipe: give --factory NAME (e.g. --factory llama3_8b)")
        m = re.match(r"^\s*([\w.]+)\s*(?:\((.*)\))?\s*$", factory)
        if not m:
            raise RecipeError(f"--factory {factory}: expected NAME or NAME(key=value, ...)")
        name, args = m.group(1), m.group(2) or ""
        if name not in presets.NEMO_FACTORIES:
            raise RecipeError(f"--factory {name}: attune does not know this recipe's settings (it cannot import NeMo "
                              f"here); known: {', '.join(sorted(presets.NEMO_FACTORIES))}. Spell its settings out as "
                              "key=value overrides, or use a known factory")
        base = dict(presets.NEMO_FACTORIES[name])
        for part in filter(None, (p.strip() for p in args.split(","))):
            key, eq, value = part.partition("=")
            if not eq:
                raise RecipeError(f"--factory {factory}: expected key=value arguments, got {part!r}")
            target = {"num_nodes": "trainer.num_nodes", "num_gpus_per_node": "trainer.devices"}.get(key.strip())
            if target is None:
                if key.strip() in ("name", "dir"):
                    continue
                raise RecipeError(f"--factory {factory}: attune reads num_nodes and num_gpus_per_node from the "
                                  f"factory's arguments, not {key.strip()!r}")
            base[target] = av.to_scalar(value.strip())
        return base, None

    def read(self, argv: Sequence[str], files: Mapping[str, str]) -> Native:
        src = self.sources(argv, files)
        s = self.settings(src)
        knobs = self.knob_values(s)
        model, training = _derive(s)
        return Native(format=self, argv=tuple(src.launch.argv), files={}, settings=s, knobs=knobs, model=model,
                      training=training, nodes=int(s.get("trainer.num_nodes", 1)),
                      devices_per_node=int(s.get("trainer.devices", 8)), pads_vocab=True,
                      knob_settings=self.knob_keys())

    def trial_settings(self, native: Native, steps: int) -> dict[str, Any]:
        """Log every step and skip validation (``trainer.max_steps``, which sets the LR schedule, stays)."""
        return {"trainer.log_every_n_steps": 1, "trainer.limit_val_batches": 0}


def _derive(s: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    c = "model.config."
    target = str(s.get("model._target_", ""))
    gated = bool(s.get(c + "gated_linear_unit", True))
    experts = s.get(c + "num_moe_experts")
    model: dict[str, Any] = {
        "family": "llama3" if target.lower().startswith("llama3") else "mixtral" if experts else
        "llama" if gated else "gpt",
        "layers": int(number(s, c + "num_layers")), "hidden_size": int(number(s, c + "hidden_size")),
        "heads": int(number(s, c + "num_attention_heads")), "kv_groups": s.get(c + "num_query_groups"),
        "ffn_hidden_size": int(number(s, c + "ffn_hidden_size")), "vocab_size": int(number(s, c + "vocab_size")),
        "tied_embeddings": bool(s.get(c + "share_embeddings_and_output_weights", False)),
    }
    if experts:
        model.update(moe_experts=int(experts), moe_top_k=int(s.get(c + "moe_router_topk", 2)),
                     moe_ffn_hidden_size=s.get(c + "moe_ffn_hidden_size"))
    steps = int(number(s, "trainer.max_steps"))
    lr = float(number(s, "optim.config.lr"))
    min_lr = float(s.get("optim.lr_scheduler.min_lr") or 0.1 * lr)
    clip = s.get("optim.config.clip_grad", 1.0)
    precision = str(s.get("trainer.plugins.precision", "bf16-mixed"))
    training: dict[str, Any] = {
        "global_batch_size": int(number(s, "data.global_batch_size")),
        "seq_length": int(number(s, "data.seq_length")), "steps": steps,
        "optimizer": {"name": "adamw", "lr": lr, "weight_decay": float(s.get("optim.config.weight_decay", 0.01)),
                      "betas": [float(s.get("optim.config.adam_beta1", 0.9)),
                                float(s.get("optim.config.adam_beta2", 0.999))],
                      "eps": float(s.get("optim.config.adam_eps", 1e-8)), "grad_clip": float(clip) if clip else None},
        "schedule": {"name": "cosine", "warmup_steps": min(int(s.get("optim.lr_scheduler.warmup_steps", 0)), steps),
                     "min_lr_ratio": max(0.0, min(1.0, min_lr / lr))},
        "seed": int(s.get("seed", 1234)),
        "data": {"source": "synthetic", "seed": int(s.get("seed", 1234))},
        "precision": "bf16" if "bf16" in precision else "fp16" if "16" in precision else "fp32",
        "dropout": float(s.get(c + "hidden_dropout", 0.0)),
    }
    return model, training


FORMAT = NeMo2()

__all__ = ["FORMAT", "VERSIONS", "NeMo2"]
