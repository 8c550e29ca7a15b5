"""Megatron-LM argument lists: ``torchrun [...] pretrain_gpt.py --tensor-model-parallel-size 4 ... --lr 3e-4 ...``.

Flag names, store-true switches and defaults checked against ``megatron/training/arguments.py`` and the dataclass
flags ``argument_utils.ArgumentGroupFactory`` generates from ``TransformerConfig`` / ``ModelParallelConfig`` /
``DistributedDataParallelConfig`` at NVIDIA/Megatron-LM ``d98e8a6`` (megatron-core 0.20.0), and against the
flags of ``examples/llama/train_llama3_8b_h100_fp8.sh`` (which names ``core_r0.12.0``). Spellings that changed:

- CUDA graphs: ``--enable-cuda-graph`` until 0.13; ``--cuda-graph-impl {none,local,transformer_engine}`` from 0.14
  (``enable_cuda_graph`` is deprecated there: "use cuda_graph_impl=local instead");
- interleaving: ``--num-layers-per-virtual-pipeline-stage K`` (layers per chunk) everywhere; ``--num-virtual-
  stages-per-pipeline-rank V`` from 0.11. The knob is V; a launch written with K keeps K's form (and K is
  re-derived when PP moves, so V stays what it was).

Megatron-LM's ``validate_args`` defaults: ``--make-vocab-size-divisible-by 128``, ``--seed 1234``,
``--hidden-dropout 0.1``, ``--attention-dropout 0.1``, ``--weight-decay 0.01``, ``--adam-beta2 0.999``,
``--adam-eps 1e-08``, ``--clip-grad 1.0``, ``--lr-decay-style linear``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import PurePosixPath
from typing import Any

from attune.errors import RecipeError
from attune.frameworks.cmdline import AbbreviatedOption
from attune.frameworks.megatron import argv as av
from attune.frameworks.megatron.formats import Format, Native, Spelling

VERSIONS = ">=0.12,<0.21"

#: store-true switches a knob controls: present means True
SWITCHES = {
    "sequence_parallel": "sequence-parallel",
    "tp_comm_overlap": "tp-comm-overlap",
    "use_distributed_optimizer": "use-distributed-optimizer",
    "overlap_grad_reduce": "overlap-grad-reduce",
    "overlap_param_gather": "overlap-param-gather",
    "grad_reduce_in_bf16": "grad-reduce-in-bf16",
    "manual_gc": "manual-gc",
    "account_for_embedding_in_pipeline_split": "account-for-embedding-in-pipeline-split",
    "account_for_loss_in_pipeline_split": "account-for-loss-in-pipeline-split",
}
#: flags with a value a knob controls, and the value Megatron-LM uses when the flag is absent
VALUES: dict[str, tuple[str, Any]] = {
    "tensor_model_parallel_size": ("tensor-model-parallel-size", 1),
    "pipeline_model_parallel_size": ("pipeline-model-parallel-size", 1),
    "context_parallel_size": ("context-parallel-size", 1),
    "expert_model_parallel_size": ("expert-model-parallel-size", 1),
    "expert_tensor_parallel_size": ("expert-tensor-parallel-size", None),
    "moe_token_dispatcher_type": ("moe-token-dispatcher-type", "allgather"),
    "micro_batch_size": ("micro-batch-size", 1),
    "recompute_granularity": ("recompute-granularity", "none"),
    "recompute_method": ("recompute-method", None),
    "recompute_num_layers": ("recompute-num-layers", None),
    "bucket_size": ("ddp-bucket-size", None),
    "fp8": ("fp8-format", None),
    "make_vocab_size_divisible_by": ("make-vocab-size-divisible-by", 128),
}
VPP = ("num-virtual-stages-per-pipeline-rank", "num-layers-per-virtual-pipeline-stage")
GRAPHS = ("cuda-graph-impl", "enable-cuda-graph")

SPELLINGS: dict[str, Spelling] = {
    **{k: Spelling(k, (f"--{f}",), VERSIONS) for k, f in SWITCHES.items()},
    **{k: Spelling(k, (f"--{f}",), VERSIONS) for k, (f, _) in VALUES.items()},
    "virtual_pipeline_model_parallel_size": Spelling(
        "virtual_pipeline_model_parallel_size", ("--num-virtual-stages-per-pipeline-rank",
                                                 "--num-layers-per-virtual-pipeline-stage"), VERSIONS,
        "V chunks per rank; a launch that gives layers per chunk keeps that form"),
    "enable_cuda_graph": Spelling("enable_cuda_graph", ("--cuda-graph-impl", "--enable-cuda-graph"), VERSIONS,
                                  "--cuda-graph-impl local from 0.14, --enable-cuda-graph before"),
}
KNOB_FLAGS = frozenset([*SWITCHES.values(), *(f for f, _ in VALUES.values()), *VPP, *GRAPHS])

#: settings that decide what is learned (the rest of a launch is frozen: carried verbatim, never changed)
CONTRACT = frozenset({
    "lr", "min-lr", "decoupled-lr", "decoupled-min-lr", "lr-decay-style", "lr-decay-iters", "lr-decay-samples",
    "lr-warmup-iters", "lr-warmup-samples", "lr-warmup-fraction", "lr-warmup-init", "lr-wsd-decay-style",
    "lr-wsd-decay-iters", "lr-wsd-decay-samples", "weight-decay", "start-weight-decay", "end-weight-decay",
    "weight-decay-incr-style", "clip-grad", "adam-beta1", "adam-beta2", "adam-eps", "sgd-momentum", "optimizer",
    "global-batch-size", "rampup-batch-size", "seq-length", "max-position-embeddings", "train-iters",
    "train-samples", "seed", "data-path", "train-data-path", "split", "mock-data", "dataloader-type",
    "tokenizer-type", "tokenizer-model", "vocab-size", "vocab-file", "merge-file", "padded-vocab-size",
    "num-layers", "hidden-size", "ffn-hidden-size", "num-attention-heads", "num-query-groups",
    "group-query-attention", "kv-channels", "swiglu", "normalization", "position-embedding-type", "rotary-base",
    "rotary-percent", "use-rope-scaling", "untie-embeddings-and-output-weights", "init-method-std",
    "hidden-dropout", "attention-dropout", "bf16", "fp16", "fp8-recipe", "calculate-per-token-loss",
    "disable-bias-linear", "apply-layernorm-1p", "num-experts", "moe-ffn-hidden-size", "moe-router-topk",
    "moe-router-load-balancing-type", "moe-aux-loss-coeff", "moe-z-loss-coeff", "moe-expert-capacity-factor",
    "moe-pad-expert-input-to-capacity", "moe-token-drop-policy", "moe-router-score-function",
    "moe-router-force-load-balancing", "moe-router-pre-softmax", "moe-router-topk-scaling-factor",
    "moe-router-enable-expert-bias", "moe-shared-expert-intermediate-size", "moe-layer-freq",
    "first-last-layers-bf16", "num-layers-at-start-in-bf16", "num-layers-at-end-in-bf16",
})
_CONTRACT_PREFIXES = ("lr-", "adam-", "rotary-", "tokenizer-", "moe-router-", "moe-aux-")
#: the launch's scripts attune reads as Megatron-LM (any ``*.py`` with Megatron-LM model flags also is)
SCRIPTS = ("pretrain_gpt.py", "pretrain_mamba.py", "pretrain_t5.py", "pretrain_bert.py")


def _flag_name(name: str) -> str:
    return name.lstrip("-").replace("_", "-")


class MegatronLM(Format):
    name = "megatron-lm"
    title = "Megatron-LM argument list (pretrain_gpt.py flags)"
    package = "megatron-core"
    versions = VERSIONS
    spellings = SPELLINGS

    def detect(self, argv: Sequence[str]) -> bool:
        try:
            launch = av.split(argv)
        except AbbreviatedOption:
            raise  # the launch is this format's or another's: either way it must be written out
        except RecipeError:
            return False
        script = PurePosixPath(launch.script).name
        if script in ("run_recipe.py",) or any(t.startswith("--config-file") or t == "--recipe" for t in argv):
            return False
        rest = set(argv[launch.args_start:])
        return script in SCRIPTS or (script.endswith(".py") and bool(rest & {"--num-layers", "--hidden-size"}))

    # -- reading ---------------------------------------------------------------------------------------
    def _parse(self, argv: Sequence[str]) -> tuple[av.Launch, list[av.Option], dict[str, Any]]:
        launch = av.split(argv)
        opts, _, positionals = av.scan(launch.argv, launch.args_start)
        if positionals:
            raise RecipeError(f"`{launch.argv[positionals[0]]}` in the Megatron-LM arguments is no --flag; "
                              "pretrain_gpt.py takes flags only")
        settings: dict[str, Any] = {}
        for o in opts:
            settings[o.name] = True if o.raw is None else (av.to_scalar(o.raw) if isinstance(o.raw, str) else o.raw)
        return launch, opts, settings

    def read(self, argv: Sequence[str], files: Mapping[str, str]) -> Native:
        launch, _opts, s = self._parse(argv)
        knobs: dict[str, Any] = {k: bool(s.get(f, False)) for k, f in SWITCHES.items()}
        for k, (f, default) in VALUES.items():
            v = s.get(f, default)
            knobs[k] = "none" if k == "recompute_granularity" and v is None else v
        layers = _int(s, "num-layers")
        pp = int(knobs["pipeline_model_parallel_size"])
        if VPP[0] in s:
            knobs["virtual_pipeline_model_parallel_size"] = s[VPP[0]]
        elif VPP[1] in s:
            per = int(s[VPP[1]])
            split_layers = layers + int(knobs["account_for_embedding_in_pipeline_split"]) + int(
                knobs["account_for_loss_in_pipeline_split"])
            if per <= 0 or split_layers % (pp * per):
                raise RecipeError(f"--num-layers-per-virtual-pipeline-stage {per}: {split_layers} layers do not "
                                  f"split into {pp} stages of chunks of {per}")
            knobs["virtual_pipeline_model_parallel_size"] = split_layers // (pp * per)
        else:
            knobs["virtual_pipeline_model_parallel_size"] = None
        impl = s.get(GRAPHS[0])
        knobs["enable_cuda_graph"] = bool(s.get(GRAPHS[1], False)) or (impl is not None and impl != "none")
        model, training = _derive(s, knobs)
        return Native(format=self, argv=tuple(launch.argv), files={}, settings=s, knobs=knobs, model=model,
                      training=training, nodes=launch.nnodes, devices_per_node=launch.nproc, pads_vocab=
                      "padded-vocab-size" not in s, knob_settings=KNOB_FLAGS, extra={"layers": layers})

    # -- editing ---------------------------------------------------------------------------------------
    def render(self, native: Native, changes: Mapping[str, Any], *, in_files: bool = True,
               extra: Mapping[str, Any] | None = None) -> tuple[list[str], dict[str, str]]:
        launch, opts, s = self._parse(native.argv)
        edit = av.Edit(list(launch.argv))
        knobs = {**native.knobs, **changes}
        for knob, new in changes.items():
            if knob in SWITCHES:
                flag = SWITCHES[knob]
                edit.set_option(opts, [flag], [] if new else None, spelling=f"--{flag}")
            elif knob in VALUES:
                flag, default = VALUES[knob]
                absent = new is None or (knob == "recompute_granularity" and new == "none")
                if absent:
                    edit.set_option(opts, [flag], None, spelling=f"--{flag}")
                elif flag in s or new != default:
                    edit.set_option(opts, [flag], [str(new)], spelling=f"--{flag}")
            elif knob == "enable_cuda_graph":
                if GRAPHS[1] in s:
                    edit.set_option(opts, [GRAPHS[1]], [] if new else None, spelling=f"--{GRAPHS[1]}")
                elif GRAPHS[0] in s or new:
                    edit.set_option(opts, [GRAPHS[0]], ["local" if new else "none"], spelling=f"--{GRAPHS[0]}")
        vpp_moved = "virtual_pipeline_model_parallel_size" in changes
        pp_moved = "pipeline_model_parallel_size" in changes
        v = knobs["virtual_pipeline_model_parallel_size"]
        if vpp_moved or (pp_moved and VPP[1] in s and v is not None):
            if VPP[1] in s:
                split_layers = native.extra["layers"] + int(bool(knobs["account_for_embedding_in_pipeline_split"])) \
                    + int(bool(knobs["account_for_loss_in_pipeline_split"]))
                per = split_layers // (int(knobs["pipeline_model_parallel_size"]) * int(v)) if v else None
                edit.set_option(opts, [VPP[1]], None if per is None else [str(per)], spelling=f"--{VPP[1]}")
            else:
                edit.set_option(opts, [VPP[0]], None if v is None else [str(v)], spelling=f"--{VPP[0]}")
        for name, value in (extra or {}).items():
            _set(edit, opts, name, value)
        return edit.result(), dict(native.files)

    def set_native(self, native: Native, name: str, value: Any) -> tuple[list[str], dict[str, str]] | None:
        flag = _flag_name(name)
        if flag in KNOB_FLAGS:
            return None
        if flag not in native.settings and self.kind_of(flag) != "contract":
            return None
        launch, opts, _ = self._parse(native.argv)
        edit = av.Edit(list(launch.argv))
        _set(edit, opts, flag, value)
        return edit.result(), dict(native.files)

    def known_contract(self) -> frozenset[str]:
        return CONTRACT

    def kind_of(self, name: str) -> str:
        flag = _flag_name(name)
        return "contract" if flag in CONTRACT or flag.startswith(_CONTRACT_PREFIXES) else "frozen"

    def trial_settings(self, native: Native, steps: int) -> dict[str, Any]:
        """Log every iteration with its TFLOP/s, no evaluation or checkpoint writes, and let Megatron-LM exit
        cleanly after the measured iterations (``--exit-interval``; ``--train-iters`` and the LR schedule stay)."""
        out: dict[str, Any] = {"log-interval": 1, "log-throughput": True, "eval-iters": 0,
                               "exit-interval": steps}
        if "save" in native.settings:
            out["save"] = av.REMOVE
            out["save-interval"] = av.REMOVE
        return out


def _set(edit: av.Edit, opts: Sequence[av.Option], flag: str, value: Any) -> None:
    flag = _flag_name(flag)
    if value is av.REMOVE or value is None or value is False:
        edit.set_option(opts, [flag], None, spelling=f"--{flag}")
    elif value is True:
        edit.set_option(opts, [flag], [], spelling=f"--{flag}")
    else:
        edit.set_option(opts, [flag], [repr(value) if isinstance(value, float) else str(value)], spelling=f"--{flag}")


def _int(s: Mapping[str, Any], flag: str, default: int | None = None) -> int:
    v = s.get(flag, default)
    if v is None:
        raise RecipeError(f"--{flag}: the Megatron-LM launch does not set it, and attune needs it for the model "
                          "the simulator times; add it to the command")
    if isinstance(v, bool) or not isinstance(v, int):
        raise RecipeError(f"--{flag} {v}: expected a whole number")
    return v


def _float(s: Mapping[str, Any], flag: str, default: float | None) -> float | None:
    v = s.get(flag, default)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise RecipeError(f"--{flag} {v}: expected a number")
    return float(v)


def _derive(s: Mapping[str, Any], knobs: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """attune's model and training sections from the flags (Megatron-LM defaults where a flag is absent)."""
    hidden = _int(s, "hidden-size")
    heads = _int(s, "num-attention-heads")
    gated = bool(s.get("swiglu"))
    ffn = s.get("ffn-hidden-size")
    if ffn is None:  # validate_args: 4h, or 2/3 of it rounded to a multiple of 64 with SwiGLU
        ffn = int((4 * hidden * 2 / 3) / 64) * 64 if gated else 4 * hidden
    vocab = s.get("vocab-size")
    if vocab is None:
        raise RecipeError("--vocab-size: attune cannot load the tokenizer to count its vocabulary; add --vocab-size "
                          "N (the tokenizer's size) to the command")
    experts = s.get("num-experts")
    model: dict[str, Any] = {
        "family": ("mixtral" if experts else "llama3") if gated else "gpt",
        "layers": _int(s, "num-layers"), "hidden_size": hidden, "heads": heads,
        "kv_groups": s.get("num-query-groups") if s.get("group-query-attention") else None,
        "ffn_hidden_size": int(ffn), "vocab_size": int(vocab),
        "tied_embeddings": not bool(s.get("untie-embeddings-and-output-weights")),
    }
    if experts:
        model.update(moe_experts=int(experts), moe_top_k=int(s.get("moe-router-topk", 2)),
                     moe_ffn_hidden_size=s.get("moe-ffn-hidden-size"))
    mbs = int(knobs["micro_batch_size"])
    gbs = s.get("global-batch-size")
    if gbs is None:
        raise RecipeError("--global-batch-size: attune keeps the global batch fixed while it moves the layout; "
                          "give it explicitly")
    gbs = int(gbs)
    if "train-iters" in s:
        steps = _int(s, "train-iters")
    elif "train-samples" in s:
        steps = math.ceil(_int(s, "train-samples") / gbs)
    else:
        raise RecipeError("--train-iters / --train-samples: the launch sets neither, so its schedule length is "
                          "unknown; give one")
    lr = _float(s, "lr", None)
    if lr is None:
        raise RecipeError("--lr: the launch sets no learning rate; give --lr")
    min_lr = _float(s, "min-lr", 0.0) or 0.0
    if "lr-warmup-iters" in s:
        warmup = int(s["lr-warmup-iters"])
    elif "lr-warmup-samples" in s:
        warmup = math.ceil(int(s["lr-warmup-samples"]) / gbs)
    elif "lr-warmup-fraction" in s:
        warmup = int(float(s["lr-warmup-fraction"]) * steps)
    else:
        warmup = 0
    style = str(s.get("lr-decay-style", "linear"))
    clip = _float(s, "clip-grad", 1.0)
    training: dict[str, Any] = {
        "global_batch_size": gbs, "seq_length": _int(s, "seq-length"), "steps": steps,
        "optimizer": {"name": "sgd" if s.get("optimizer") == "sgd" else "adamw", "lr": lr,
                      "weight_decay": _float(s, "weight-decay", 0.01),
                      "betas": [_float(s, "adam-beta1", 0.9), _float(s, "adam-beta2", 0.999)],
                      "eps": _float(s, "adam-eps", 1e-8), "grad_clip": clip if clip else None},
        "schedule": {"name": style if style in ("cosine", "linear", "constant") else "constant",
                     "warmup_steps": min(warmup, steps), "min_lr_ratio": max(0.0, min(1.0, min_lr / lr))},
        "seed": _int(s, "seed", 1234),
        "data": ({"source": "synthetic", "seed": _int(s, "seed", 1234)} if s.get("mock-data") or "data-path" not in s
                 else {"source": "tokens", "path": " ".join(map(str, s["data-path"])) if isinstance(
                     s["data-path"], list) else str(s["data-path"]), "seed": _int(s, "seed", 1234)}),
        "precision": "bf16" if s.get("bf16") else "fp16" if s.get("fp16") else "fp32",
        "dropout": _float(s, "hidden-dropout", 0.1),
    }
    _ = mbs
    return model, training


FORMAT = MegatronLM()

__all__ = ["CONTRACT", "FORMAT", "KNOB_FLAGS", "SPELLINGS", "SWITCHES", "VALUES", "VERSIONS", "MegatronLM"]
