"""LLaMA-Factory training launches (``framework: llamafactory``), on the framework seam.

The recipe carries the user's launch and the text of its YAML config (:mod:`attune.frameworks.hfyaml` has what this
shares with axolotl). Accepted forms, as LLaMA-Factory 0.9.5 reads them (``llamafactory/cli.py``,
``llamafactory/launcher.py``, ``llamafactory/hparams/parser.py``)::

    llamafactory-cli train cfg.yaml [key=value ...]          (also ``lmf train``, ``python -m llamafactory.cli train``)
    FORCE_TORCHRUN=1 NPROC_PER_NODE=4 llamafactory-cli train cfg.yaml
    torchrun [options] src/train.py cfg.yaml [key=value ...] (any script that calls ``run_exp``; python / accelerate too)

- ``read_args`` merges ``OmegaConf.from_cli(argv[2:])`` over ``OmegaConf.load(cfg)``: every token after the config is
  a ``key=value`` override (value read as YAML by OmegaConf's loader: ``1e-4`` is a float) and wins over the file;
- ``llamafactory-cli train`` re-launches itself under ``torchrun --nproc_per_node $NPROC_PER_NODE`` when
  ``FORCE_TORCHRUN`` (or ``USE_MCA``) is set, or when more than one device is visible; ``NPROC_PER_NODE`` defaults to
  the device count. The process-count knob sets those two variables (a torchrun / accelerate / python launch: its own
  option);
- ``packing`` defaults to ``stage == "pt"`` and ``neat_packing`` turns it on (``hparams/data_args.py``,
  ``hparams/parser.py``): the contract holds the resolved value;
- gradient checkpointing is on unless ``disable_gradient_checkpointing`` (``model/model_utils/checkpointing.py``):
  the knob is that key, in LLaMA-Factory's own name.

Knobs: ``per_device_train_batch_size`` (``gradient_accumulation_steps`` derived so the global batch stays), the
process count, ``disable_gradient_checkpointing``, ``dataloader_num_workers`` (``preprocessing_num_workers`` is data
preparation and stays frozen), ``torch_compile``, ``flash_attn`` and ``enable_liger_kernel``. Contract: the keys
that decide what is learned (model, method, data, sequence length, packing, optimizer, schedule, precision, seed),
with LLaMA-Factory's / HF's defaults where absent; every other key is frozen verbatim.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any, ClassVar

from attune import frameworks
from attune.errors import RecipeError
from attune.frameworks.base import Rule, Tier
from attune.frameworks.cmdline import ACCELERATE_SWITCHES, TORCHRUN_SWITCHES, Edit, split_launch
from attune.frameworks.common import (
    GLOBAL_BATCH_HINT,
    compile_rules,
    loader_worker_rules,
    micro_batch_rules,
    process_rules,
    processes_fit_problem,
    recompute_rules,
)
from attune.frameworks.hfyaml import (
    ConfigLaunch,
    Override,
    Settings,
    YamlTrainerFramework,
    YamlTrainerLogParser,
    format_scalar,
    head_process_count,
    head_process_edit,
    load_yaml,
    omegaconf_loader,
)
from attune.recipe.catalogue import Catalogue, Constraint, Knob, Semantics

if TYPE_CHECKING:
    from attune.recipe.model import Recipe

NAME = "llamafactory"
VERSIONS = ">=0.9,<0.10"
PER_DEVICE = "per_device_train_batch_size"
NPROC = "nproc_per_node"
NO_CHECKPOINTING = "disable_gradient_checkpointing"
WORKERS = "dataloader_num_workers"
COMPILE = "torch_compile"
ATTENTION = "flash_attn"
LIGER = "enable_liger_kernel"
CLI_NAMES = ("llamafactory-cli", "lmf")
#: environment variables of ``llamafactory-cli train`` that decide whether and how it runs torchrun
PROCESS_ENV = ("FORCE_TORCHRUN", "NPROC_PER_NODE")
LOADER = omegaconf_loader()

ACCEPTED = (
    "llamafactory-cli train CONFIG.yaml [key=value ...]   (lmf train ..., python -m llamafactory.cli train ...)",
    "FORCE_TORCHRUN=1 NPROC_PER_NODE=N llamafactory-cli train CONFIG.yaml [key=value ...]",
    "torchrun [options] src/train.py CONFIG.yaml [key=value ...]   (python / accelerate launch the same)",
)

#: contract keys with LLaMA-Factory 0.9.5's defaults (``hparams/*_args.py``) and HF TrainingArguments' (transformers
#: 5.24; ``optim``'s default is adamw_torch_fused from 4.55 with torch >= 2.8, see attune.frameworks.hf.catalogue)
CONTRACT: dict[str, Any] = {
    # model and method
    "model_name_or_path": None, "adapter_name_or_path": None, "stage": "sft", "finetuning_type": "lora",
    "lora_rank": 8, "lora_alpha": None, "lora_dropout": 0.0, "lora_target": "all", "additional_target": None,
    "use_rslora": False, "use_dora": False, "pissa_init": False, "quantization_bit": None,
    "quantization_method": "bnb", "freeze_trainable_layers": 2, "freeze_trainable_modules": "all",
    "pref_beta": 0.1, "pref_loss": "sigmoid", "pref_ftx": 0.0, "train_from_scratch": False,
    "use_dft_loss": False, "use_asft_loss": False, "use_eaft_loss": False,
    # data
    "dataset": None, "dataset_dir": "data", "template": None, "cutoff_len": 2048, "packing": None,
    "neat_packing": False, "train_on_prompt": False, "mask_history": False, "max_samples": None, "val_size": 0.0,
    "mix_strategy": "concat", "interleave_probs": None, "streaming": False, "tokenized_path": None,
    "disable_shuffling": False, "default_system": None, "enable_thinking": True,
    # optimisation
    "learning_rate": 5e-05, "lr_scheduler_type": "linear", "lr_scheduler_kwargs": None, "warmup_ratio": 0.0,
    "warmup_steps": 0, "num_train_epochs": 3.0, "max_steps": -1, "weight_decay": 0.0, "max_grad_norm": 1.0,
    "optim": "adamw_torch_fused", "adam_beta1": 0.9, "adam_beta2": 0.999, "adam_epsilon": 1e-08,
    "use_galore": False, "use_apollo": False, "use_badam": False, "use_muon": False, "use_adam_mini": False,
    "loraplus_lr_ratio": None,
    # precision and randomness
    "bf16": False, "fp16": False, "pure_bf16": False, "tf32": None, "fp8": False, "seed": 42, "data_seed": None,
    "upcast_layernorm": False, "upcast_lmhead_output": False,
}
#: instrumentation every trial sets in its copy of the config (HF TrainingArguments and LLaMA-Factory keys that change
#: nothing learned: a log line per step, NaN logged as NaN, no checkpoints, trackers or plots). No token counts: a
#: step's work is the fixed global batch (× ``tokens_per_sample``). ``include_num_input_tokens_seen: true`` counts the
#: padding of each micro-batch to its longest sample (more "tokens" for the same samples at a larger per-device
#: batch), and ``non_padding`` is no safer: LLaMA-Factory 0.9.5 allows transformers 4.55-5.6, whose 4.55 and 4.56
#: take that field as a bool and would count padding for the string without a word.
TRIAL_KEYS: dict[str, Any] = {
    "logging_steps": 1, "logging_strategy": "steps", "logging_nan_inf_filter": False,
    "disable_tqdm": True, "save_strategy": "no", "report_to": "none",
    "overwrite_output_dir": True, "plot_loss": False, "log_level": "info",
}

D, P = Semantics.NUMERICS_DRIFT, Semantics.PRESERVING
KNOBS = [
    Knob(name=PER_DEVICE, type="int", values=(1, 2, 4, 8, 16, 32, 64), default=8, semantics=D, group="batch_split",
         description="per_device_train_batch_size: sequences per forward/backward on each process (HF default 8). "
                     "gradient_accumulation_steps is derived so the global batch (per-device × accumulation × "
                     "processes) stays. Larger means bigger GEMMs and fewer launches, more activation memory."),
    Knob(name=NPROC, type="int", values=(1, 2, 4, 8), default=1, semantics=D, group="batch_split",
         description="data-parallel processes per node: NPROC_PER_NODE with FORCE_TORCHRUN=1 for llamafactory-cli "
                     "train (it re-launches itself under torchrun), torchrun --nproc_per_node / accelerate "
                     "--num_processes otherwise. Each process takes a slice of the global batch."),
    Knob(name=NO_CHECKPOINTING, type="bool", values=(False, True), default=False, semantics=P,
         description="disable_gradient_checkpointing: LLaMA-Factory checkpoints activations unless this is true "
                     "(model/model_utils/checkpointing.py). True stores activations instead of recomputing them: "
                     "faster backward, more memory. Same math."),
    Knob(name=WORKERS, type="int", values=(0, 1, 2, 4), default=0, semantics=D,
         description="dataloader_num_workers: background data-loader processes per training process (the "
                     "tokenised dataset is prepared before training by preprocessing_num_workers, which stays). "
                     "Owes the loss check, as for HF."),
    Knob(name=COMPILE, type="bool", values=(False, True), default=False, semantics=D,
         description="torch_compile (HF TrainingArguments): compile the model with torch.compile; fuses kernels, "
                     "the first step pays the compilation."),
    Knob(name=ATTENTION, type="choice", values=("auto", "disabled", "sdpa", "fa2", "fa3"), default="auto",
         semantics=D, description="flash_attn: the attention kernel (auto: LLaMA-Factory picks; disabled: eager; "
                                  "sdpa: torch's fused attention; fa2/fa3: FlashAttention 2/3, GPU only). Same "
                                  "math, other kernels: owes the loss check."),
    Knob(name=LIGER, type="bool", values=(False, True), default=False, semantics=D,
         description="enable_liger_kernel: Liger's fused Triton kernels (RMSNorm, RoPE, SwiGLU, fused linear "
                     "cross-entropy): less memory and time on GPU; needs liger-kernel and a GPU."),
]


def _batch_divisible(r: Recipe) -> str | None:
    return FRAMEWORK.batch_divisible_problem(r)


def _procs_fit(r: Recipe) -> str | None:
    return processes_fit_problem(r, NPROC)


def _gpu_kernels(r: Recipe) -> str | None:
    if r.resources.accelerator != "cpu":
        return None
    if r.knob(ATTENTION) in ("fa2", "fa3"):
        return f"{ATTENTION}: {r.knob(ATTENTION)} is FlashAttention, which runs on GPUs only; use auto, sdpa or disabled"
    if r.knob(LIGER):
        return f"{LIGER}: Liger's kernels are Triton GPU kernels; keep it false on CPU"
    return None


CONSTRAINTS = [
    Constraint("global_batch_divisible", (PER_DEVICE, NPROC), _batch_divisible,
               "global batch = per-device batch × accumulation × processes, accumulation derived"),
    Constraint("processes_fit_devices", (NPROC,), _procs_fit, "one process per device slot"),
    Constraint("gpu_kernels_on_gpu", (ATTENTION, LIGER), _gpu_kernels, "FlashAttention and Liger need a GPU"),
]

_MEM = "memory_capacity"
RULES = {
    **micro_batch_rules(PER_DEVICE),
    **process_rules(NPROC),
    **recompute_rules(NO_CHECKPOINTING, off="enable"),
    **loader_worker_rules(WORKERS),
    **compile_rules(COMPILE),
    (ATTENTION, "up"): Rule(Tier.MICRO, 0.05, {"compute_bound": 0.1, _MEM: 0.1}),
    (ATTENTION, "down"): Rule(Tier.MICRO, 0.0),
    (LIGER, "enable"): Rule(Tier.MICRO, 0.05, {"compute_bound": 0.05, _MEM: 0.2}, memory=-1),
    (LIGER, "disable"): Rule(Tier.MICRO, 0.0),
}


class LlamaFactoryLogParser(YamlTrainerLogParser):
    """LLaMA-Factory's output: the Trainer's dicts (transformers' explicit log format, which LLaMA-Factory turns on);
    LLaMA-Factory's own ``llamafactory.train.callbacks`` echo of a step (``LogCallback.on_log``) is no step."""

    echo = ("llamafactory.train.callbacks",)


def _truthy(value: str | None) -> bool:
    """``is_env_enabled`` of LLaMA-Factory 0.9.5 (``extras/misc.py``): true, y or 1, any case."""
    return (value or "0").lower() in ("true", "y", "1")


class LlamaFactoryFramework(YamlTrainerFramework):
    name = NAME
    title = "LLaMA-Factory (llamafactory-cli train CONFIG.yaml [key=value ...])"
    versions = VERSIONS
    distribution = "llamafactory"
    rules = RULES
    tool = "LLaMA-Factory"
    per_device_key = PER_DEVICE
    per_device_default = 8
    nproc_knob = NPROC
    key_knobs: ClassVar[dict[str, Any]] = {NO_CHECKPOINTING: False, WORKERS: 0, COMPILE: False, ATTENTION: "auto",
                                           LIGER: False}
    contract_keys = CONTRACT
    trial_keys = TRIAL_KEYS
    loader = LOADER
    accepted = ACCEPTED
    env_names = ("CUDA_VISIBLE_DEVICES", "PYTORCH_CUDA_ALLOC_CONF", *PROCESS_ENV, "NNODES", "NODE_RANK",
                 "MASTER_ADDR", "MASTER_PORT", "USE_MCA", "USE_RAY", "USE_V1", "OPTIM_TORCH", "RECORD_VRAM",
                 "LLAMAFACTORY_VERBOSITY", "DISABLE_VERSION_CHECK")
    parser_class = LlamaFactoryLogParser
    field_hints: ClassVar[dict[str, str]] = {f"{NAME}.global_batch_size": GLOBAL_BATCH_HINT.format(knob=PER_DEVICE)}

    def build_catalogue(self) -> Catalogue:
        return Catalogue(framework=NAME, knobs={k.name: k for k in KNOBS}, constraints=list(CONSTRAINTS),
                         versions=VERSIONS)

    # -- the command line ------------------------------------------------------------------------------------
    def parse(self, argv: Sequence[str], data: Mapping[str, Any] | None = None) -> ConfigLaunch:
        argv = tuple(str(a) for a in argv)
        if not argv:
            raise RecipeError("the launch command is empty; accepted forms:", list(ACCEPTED))
        head_name = PurePosixPath(argv[0]).name
        head = None
        if head_name in CLI_NAMES:
            command_at = 1
        else:
            head = split_launch(argv, {"torchrun": TORCHRUN_SWITCHES, "accelerate": ACCELERATE_SWITCHES},
                                unknown="a LLaMA-Factory launch runs llamafactory-cli train or a script under "
                                        "python / torchrun / accelerate launch", accepted=ACCEPTED)
            command_at = head.args_start if head.module and head.script == "llamafactory.cli" else -1
        if command_at >= 0:
            if len(argv) <= command_at or argv[command_at] != "train":
                raise RecipeError(f"`{' '.join(argv)}` does not run `train`: attune tunes LLaMA-Factory training "
                                  "launches; accepted forms:", list(ACCEPTED))
            config_at = command_at + 1
        else:
            assert head is not None
            config_at = head.args_start
        if len(argv) <= config_at or not argv[config_at].lower().endswith((".yaml", ".yml")):
            found = argv[config_at] if len(argv) > config_at else "nothing"
            raise RecipeError(f"a LLaMA-Factory launch names its YAML config right after `train` (or the script); "
                              f"found {found!r}. attune reads and edits .yaml/.yml configs (a .json config: write "
                              "it as YAML); accepted forms:", list(ACCEPTED))
        overrides = tuple(self._override(i, tok) for i, tok in enumerate(argv) if i > config_at)
        nproc, nnodes = head_process_count(head) if head is not None else (None, 1)
        launcher = "llamafactory-cli" if head is None or head.module else head.launcher
        tokens = list(argv[:config_at])
        if head is not None:
            skip = {i for o in head.options if o.name.replace("-", "_") in ("nproc_per_node", "num_processes")
                    for i in range(o.start, o.end)}
            tokens = [t for i, t in enumerate(argv[:config_at]) if i not in skip]
        return ConfigLaunch(argv=argv, launcher=launcher, launcher_tokens=tuple(tokens), config_index=config_at,
                            overrides=overrides, nproc=nproc, nnodes=nnodes,
                            process_env=PROCESS_ENV if head is None or head.module else ())

    @staticmethod
    def _override(i: int, token: str) -> Override:
        """One ``key=value`` token, read as ``OmegaConf.from_cli`` does (the value as YAML, by OmegaConf's loader)."""
        key, eq, text = token.partition("=")
        if not eq or not key or key.startswith("-"):
            raise RecipeError(f"LLaMA-Factory reads the tokens after the config as key=value overrides "
                              f"(OmegaConf.from_cli); {token!r} is none. Write it as key=value, or in the config "
                              "file")
        try:
            value = load_yaml("the command line", f"v: {text}" if text.strip() else "v:", LOADER).get("v")
        except RecipeError:
            raise RecipeError(f"the override {token!r} does not read as YAML (OmegaConf reads the value after `=` "
                              "as YAML); quote or fix it") from None

        def write(new: Any, _key: str = key) -> list[str]:
            return [f"{_key}={format_scalar(new, LOADER)}"]

        return Override(key=key, start=i, end=i + 1, value=value, write=write)

    def process_count(self, launch: ConfigLaunch, env: Mapping[str, str], *, accelerator: str,
                      devices_per_node: int | None) -> int:
        """A torchrun / accelerate / python launch: its own option (default 1). ``llamafactory-cli train``: one
        process unless it re-launches under torchrun (``FORCE_TORCHRUN`` or ``USE_MCA``, or more than one visible
        GPU), then ``NPROC_PER_NODE``, else the device count."""
        if launch.launcher != "llamafactory-cli":
            return launch.nproc or 1
        if _truthy(env.get("USE_V1")):
            raise RecipeError("launch.env: USE_V1 runs LLaMA-Factory's v1 trainer, whose settings attune does not read; "
                              "import the launch without USE_V1")
        gpus = (devices_per_node or 1) if accelerator != "cpu" else 0
        torchrun = _truthy(env.get("FORCE_TORCHRUN")) or _truthy(env.get("USE_MCA")) or \
            (gpus > 1 and not _truthy(env.get("USE_RAY")))
        if not torchrun:
            return 1
        text = env.get("NPROC_PER_NODE")
        if text is None:
            if gpus < 1:
                raise RecipeError("launch.env: FORCE_TORCHRUN makes llamafactory-cli run torchrun with NPROC_PER_NODE "
                                  "processes, which defaults to the GPU count (none here); set NPROC_PER_NODE")
            return gpus
        if not text.isdigit() or int(text) < 1:
            raise RecipeError(f"launch.env: NPROC_PER_NODE={text!r}: attune needs the number of processes per node; "
                              "write e.g. NPROC_PER_NODE=2")
        return int(text)

    def read_launch(self, argv: Sequence[str], files: Mapping[str, str], env: Mapping[str, str], *,
                    accelerator: str, devices_per_node: int | None) -> Settings:
        s = super().read_launch(argv, files, env, accelerator=accelerator, devices_per_node=devices_per_node)
        nnodes = env.get("NNODES", "1") if s.launch.launcher == "llamafactory-cli" else str(s.nnodes)
        if not nnodes.isdigit() or int(nnodes) < 1:
            raise RecipeError(f"launch.env: NNODES={nnodes!r}: give one node count")
        if int(nnodes) != s.nnodes:
            from dataclasses import replace

            s = replace(s, nnodes=int(nnodes))
        return s

    def process_edit(self, launch: ConfigLaunch, edit: Edit, env: dict[str, str], nproc: int, *, cpu: bool) -> None:
        if launch.launcher == "llamafactory-cli":
            if not (_truthy(env.get("FORCE_TORCHRUN")) or _truthy(env.get("USE_MCA"))):
                env["FORCE_TORCHRUN"] = "1"
            env["NPROC_PER_NODE"] = str(nproc)
            if cpu and nproc > 1:
                env.setdefault("ACCELERATE_USE_CPU", "true")
            return
        head = split_launch(launch.argv, {"torchrun": TORCHRUN_SWITCHES, "accelerate": ACCELERATE_SWITCHES},
                            unknown="", accepted=ACCEPTED)
        head_process_edit(edit, head, nproc, cpu=cpu, env=env)

    def resolve(self, effective: dict[str, Any]) -> dict[str, Any]:
        """``packing`` as LLaMA-Factory resolves it: ``neat_packing`` turns it on, else it defaults to
        ``stage == "pt"`` (``DataArguments.__post_init__``, ``get_train_args``)."""
        if effective.get("neat_packing") is True:
            effective["packing"] = True
        elif effective.get("packing") is None:
            effective["packing"] = effective.get("stage", CONTRACT["stage"]) == "pt"
        return effective

    def trial_instrumentation(self, s: Settings, trial_dir: Any) -> dict[str, Any]:
        keys = super().trial_instrumentation(s, trial_dir)
        for name in ("push_to_hub", "load_best_model_at_end"):
            if s.effective.get(name) is True:
                keys[name] = False  # no hub repository for a trial; no best-model bookkeeping without saves
        return keys

    def preflight(self, recipe: Recipe, backend: str) -> list[str]:
        """What would fail a local trial before it starts: the launcher not on PATH, half precision on CPU."""
        import shutil

        problems = super().preflight(recipe, backend)
        if problems or recipe.launch is None:
            return problems
        try:
            s = self.read(recipe)
        except RecipeError as err:
            return [f"launch.argv: {err}"]
        argv0 = recipe.launch.argv[0]
        if shutil.which(argv0) is None and not PurePosixPath(argv0).is_absolute():
            problems.append(f"launch.argv: {argv0} is not on PATH here; activate the environment that has "
                            "LLaMA-Factory (pip install llamafactory) before running attune")
        if recipe.resources.accelerator == "cpu" and (s.effective.get("fp16") is True or
                                                     s.effective.get("pure_bf16") is True):
            problems.append(f"{NAME}.fp16: fp16 / pure_bf16 need a GPU; tune this launch on a GPU recipe")
        return problems


FRAMEWORK = LlamaFactoryFramework()
frameworks.register(FRAMEWORK)

__all__ = ["ACCEPTED", "CONTRACT", "FRAMEWORK", "KNOBS", "TRIAL_KEYS", "LlamaFactoryFramework",
           "LlamaFactoryLogParser"]
