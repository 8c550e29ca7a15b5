"""The recipe: model architecture, training contract, resources, and the knobs a tuner may change.

``training`` is the *training contract*: everything that decides what the model learns. The gate
protects it. ``knobs`` are execution settings validated against the framework's knob catalogue.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from attune.recipe.catalogue import Catalogue, KnobValue, get_catalogue

Accelerator = Literal["cpu", "a100-80gb", "h100-sxm-80gb", "h200", "b200"]
Precision = Literal["fp32", "bf16", "fp16", "fp8"]



#: the numerics class an owner names (``numerics_opt_in: [random_stream]``) to admit changes that draw another
#: random stream or other samples (their first-step loss differs beyond rounding), judged then only against the
#: spread of runs that differ the same way; every card of such a recipe says so
RANDOM_STREAM = "random_stream"

class _Strict(BaseModel):
    """Strict parsing: no booleans or strings as numbers, no NaN or infinity, unknown fields refused."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


class ModelSpec(_Strict):
    """Decoder-only transformer architecture."""

    family: str = Field(default="gpt", description="model family, e.g. gpt, llama3, mixtral, deepseek")
    layers: int = Field(gt=0, le=10_000, description="number of transformer layers")
    hidden_size: int = Field(gt=0, le=1_048_576, description="model width")
    heads: int = Field(gt=0, le=65_536, description="attention heads")
    kv_groups: int | None = Field(default=None, gt=0, le=65_536, description="key/value groups (GQA); None means heads")
    ffn_hidden_size: int = Field(gt=0, le=16_777_216, description="MLP inner width")
    vocab_size: int = Field(gt=0, le=100_000_000, description="tokenizer vocabulary size (before any padding)")
    moe_experts: int | None = Field(default=None, gt=0, le=65_536, description="number of routed experts (MoE only)")
    moe_top_k: int | None = Field(default=None, gt=0, le=65_536, description="experts per token (MoE only)")
    moe_ffn_hidden_size: int | None = Field(default=None, gt=0, le=16_777_216,
                                            description="expert MLP width (MoE only)")
    tied_embeddings: bool = Field(default=False, description="share input embedding and output head")

    @model_validator(mode="after")
    def _check(self) -> ModelSpec:
        if self.hidden_size % self.heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be divisible by heads ({self.heads}); "
                "change one of them"
            )
        if self.kv_groups is not None and self.heads % self.kv_groups:
            raise ValueError(f"heads ({self.heads}) must be divisible by kv_groups ({self.kv_groups})")
        if (self.moe_experts is None) != (self.moe_top_k is None):
            raise ValueError("set both moe_experts and moe_top_k for an MoE model, or neither")
        if self.moe_experts is not None and self.moe_top_k is not None and self.moe_top_k > self.moe_experts:
            raise ValueError(f"moe_top_k ({self.moe_top_k}) cannot exceed moe_experts ({self.moe_experts})")
        return self

    @property
    def num_kv_groups(self) -> int:
        return self.kv_groups or self.heads

    @property
    def is_moe(self) -> bool:
        return self.moe_experts is not None


class OptimizerSpec(_Strict):
    name: Literal["adamw", "adam", "sgd"] = Field(default="adamw", description="optimizer algorithm")
    lr: float = Field(gt=0, description="peak learning rate")
    weight_decay: float = Field(default=0.0, ge=0, description="decoupled weight decay")
    betas: tuple[float, float] = Field(default=(0.9, 0.95), strict=False, description="Adam betas")
    eps: float = Field(default=1e-8, gt=0, description="Adam epsilon")
    grad_clip: float | None = Field(default=1.0, gt=0, description="global gradient-norm clip; None disables")


class ScheduleSpec(_Strict):
    name: Literal["constant", "cosine", "linear"] = Field(default="cosine", description="LR schedule shape")
    warmup_steps: int = Field(default=0, ge=0, description="linear warm-up steps")
    min_lr_ratio: float = Field(default=0.1, ge=0, le=1, description="final LR as a fraction of peak")


class DataSpec(_Strict):
    source: Literal["synthetic", "tokens"] = Field(
        default="synthetic", description="synthetic: deterministic generated tokens; tokens: a .npy/.bin token file"
    )
    path: str | None = Field(default=None, description="token file for source=tokens")
    seed: int = Field(default=1234, description="seed of the data order / synthetic generator")
    order: Literal["sequential", "shuffled"] = Field(default="sequential", description="sample order")

    @model_validator(mode="after")
    def _check(self) -> DataSpec:
        if self.source == "tokens" and not self.path:
            raise ValueError("data.path is required when data.source is 'tokens'")
        return self


class TrainingContract(_Strict):
    """Everything that decides what the model learns. The gate refuses any change to it."""

    global_batch_size: int = Field(gt=0, le=100_000_000, description="sequences per optimizer step")
    seq_length: int = Field(gt=0, le=100_000_000, description="tokens per sequence")
    steps: int = Field(gt=0, le=10_000_000_000,
                       description="optimizer steps of the full training run (sets the LR schedule)")
    optimizer: OptimizerSpec
    schedule: ScheduleSpec = Field(default_factory=ScheduleSpec)
    seed: int = Field(default=0, description="model-initialisation seed")
    data: DataSpec = Field(default_factory=DataSpec)
    precision: Precision = Field(default="fp32", description="arithmetic precision (autocast dtype)")
    dropout: float = Field(default=0.0, ge=0, lt=1, description="dropout probability")
    numerics_opt_in: tuple[str, ...] = Field(
        default=(), strict=False,
        description="numerics-changing knob classes the owner accepts (e.g. fp8, bf16_grad_reduce, tf32)",
    )

    @model_validator(mode="after")
    def _check(self) -> TrainingContract:
        if self.schedule.warmup_steps > self.steps:
            raise ValueError(f"training.schedule.warmup_steps ({self.schedule.warmup_steps}) exceeds training.steps "
                             f"({self.steps}): the learning rate would never finish warming up; lower it")
        return self

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch_size * self.seq_length


class Resources(_Strict):
    accelerator: Accelerator = Field(default="cpu", description="accelerator kind")
    nodes: int = Field(default=1, gt=0, le=100_000, description="number of nodes")
    devices_per_node: int = Field(default=1, gt=0, le=1024, description="accelerators (or CPU worker slots) per node")
    device_memory_gb: float | None = Field(
        default=None, gt=0, description="memory cap per device; on cpu the trainer enforces it on its resident set"
    )

    @property
    def devices(self) -> int:
        return self.nodes * self.devices_per_node


class TuningSpec(_Strict):
    """How to tune this recipe (optional; CLI flags override)."""

    search_space: tuple[str, ...] = Field(
        default=(), strict=False, description="knobs the tuner may change, in priority order; empty means all tunable knobs"
    )
    warmup_steps: int = Field(default=2, ge=0, le=100_000, description="steps dropped from each trial's measurement")
    measure_steps: int = Field(default=6, ge=2, le=100_000, description="steps in the steady measurement window")
    adaptive_window: bool = Field(default=True, description=(
        "detect each trial's warm-up from its step times and end its measurement once its median step time is "
        "known well enough against the run-to-run noise (or, for a candidate, once it is surely too slow); a trial "
        "then runs at most warmup_steps + measure_steps steps. false: drop warmup_steps, measure measure_steps"))
    baseline_repeats: int = Field(default=2, ge=1, le=100, description="baseline runs used to learn the noise floor")
    confirm: bool = Field(default=True, description="re-run a winning candidate once before accepting it")
    paired: bool = Field(default=True, description="decide a promising candidate on a paired measurement: "
                                                   "candidate, current best, candidate again (A-B-A)")
    min_gain: float = Field(default=0.02, ge=0, description="smallest relative gain ever accepted")
    certify_share: float = Field(default=0.15, ge=0, le=0.9, description=(
        "share of the budget kept back to certify the final speedup: interleaved runs of the baseline and the "
        "final best (A-B-A-B...) at the end, reported as a point estimate with its 95 % interval; 0 turns it off"))
    trial_timeout_s: float = Field(default=300, gt=0, le=7 * 86400, description="deadline of one trial")
    explore: tuple[str, ...] = Field(
        default=(), strict=False, description="unclassified framework settings (as `attune knobs --discover` names "
        "them) the owner lets the tuner change; each change is treated as numerics-changing and owes the "
        "loss-equivalence check; every other unclassified setting stays frozen")


class NativeLaunch(_Strict):
    """The user's own launch, verbatim, for frameworks whose model and training live in their script or config.

    ``argv`` is the command line exactly as the user runs it; ``files`` holds the text of config files it names
    (path as written in ``argv`` → content). The framework reads its native settings from both; settings attune
    does not model are carried through unchanged and frozen by the gate.
    """

    argv: tuple[str, ...] = Field(min_length=1, strict=False, description="the launch command line, one argument per entry")
    env: dict[str, str] = Field(default_factory=dict, description="environment the launch sets (NAME: value)")
    cwd: str | None = Field(default=None, description="working directory the command runs in (default: the "
                                                      "recipe file's directory)")
    files: dict[str, str] = Field(default_factory=dict, description="config files the command names: path → text")
    framework_version: str | None = Field(default=None, description="framework version seen at import")
    tokens_per_sample: int | None = Field(default=None, gt=0, description="tokens in one training sample "
                                          "(sequence length), where the framework's log does not count tokens")
    numerics_opt_in: tuple[str, ...] = Field(
        default=(), strict=False, description="numerics-changing knob classes the owner accepts (e.g. tf32)")
    declaration: dict[str, Any] | None = Field(default=None, description=(
        "framework command: the owner's knob declaration (what attune may change, the contract flags, the global "
        "batch, how steps appear in the output); `attune import --framework command --knobs knobs.yaml` copies it"))

    @field_validator("env")
    @classmethod
    def _env_names_and_values(cls, env: dict[str, str]) -> dict[str, str]:
        # a name a shell would read as code (`EVIL; touch pwned; X`) must never reach a rendered command line
        for name, value in env.items():
            if not ENV_NAME.fullmatch(name):
                raise ValueError(f"environment name {name!r} is not a valid POSIX name (letters, digits and "
                                 "underscores, not starting with a digit); rename or remove it")
            if "\0" in value:
                raise ValueError(f"the value of {name} holds a NUL byte, which no process environment can carry")
        return env

    @field_validator("argv", "cwd")
    @classmethod
    def _no_nul(cls, value: Any) -> Any:
        words = [value] if isinstance(value, str) else list(value or ())
        if any("\0" in str(w) for w in words):
            raise ValueError("holds a NUL byte, which no command line can carry")
        return value


#: a POSIX environment variable name (what `export NAME=...` accepts)
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class Recipe(_Strict):
    """A training recipe: the unit attune measures and tunes."""

    name: str = Field(default="recipe", description="human-readable name")
    framework: str = Field(default="torch", description="which framework (and knob catalogue) applies; "
                                                        "`attune knobs --list-frameworks` lists them")
    model: ModelSpec | None = Field(default=None, description="architecture (frameworks that do not read it "
                                                              "from the user's own launch)")
    training: TrainingContract | None = Field(default=None, description="training contract (likewise)")
    launch: NativeLaunch | None = Field(default=None, description="the user's own launch (frameworks that run it)")
    resources: Resources = Field(default_factory=Resources)
    knobs: dict[str, KnobValue] = Field(default_factory=dict, description="execution settings (see catalogue)")
    tuning: TuningSpec = Field(default_factory=TuningSpec)

    @field_validator("framework")
    @classmethod
    def _known_framework(cls, value: str) -> str:
        from attune import registry

        if value not in registry.names():
            raise ValueError(registry.unknown_message(value))
        return value

    @model_validator(mode="after")
    def _check_knobs(self) -> Recipe:
        fw = self.framework_impl
        problems: list[str] = []
        if fw.launch_based:
            if self.launch is None:
                problems.append(f"launch: required for framework {self.framework}; create the recipe with "
                                f"`attune import --framework {self.framework} -- <your command>`")
        else:
            for section in ("model", "training"):
                if getattr(self, section) is None:
                    problems.append(f"{section}: required for framework {self.framework}")
            if self.launch is not None and not fw.native_launch:
                problems.append(f"launch: framework {self.framework} does not run a native launch; remove it")
        if not problems and self.launch is not None:
            problems = fw.launch_problems(self.launch)
        if problems:
            raise ValueError("\n".join(problems))
        cat = self.catalogue
        problems = cat.value_problems(self.knobs)
        if not problems:
            problems = [f"{', '.join('knobs.' + k for k in c.knobs)}: {msg}" for c, msg in cat.constraint_problems(self)]
        for name in self.tuning.search_space:
            if name not in cat:
                problems.append(f"tuning.search_space: {cat.unknown_knob_message(name)}")
        known = sorted({k.numerics_class for k in cat.knobs.values() if k.numerics_class} | {RANDOM_STREAM})
        where = "training.numerics_opt_in" if self.training is not None else "launch.numerics_opt_in"
        for name in self.numerics_opt_in:
            if name not in known:
                problems.append(f"{where}: {name!r} is not a numerics class of the {self.framework} catalogue; "
                                f"known: {known or 'none'}")
        if not problems:
            problems = fw.check(self)
        if problems:
            raise ValueError("\n".join(problems))
        return self

    @property
    def framework_impl(self) -> Any:
        """The :class:`attune.frameworks.Framework` of this recipe."""
        from attune import registry

        return registry.get(self.framework)

    @property
    def catalogue(self) -> Catalogue:
        return get_catalogue(self.framework, self.launch)

    @property
    def numerics_opt_in(self) -> tuple[str, ...]:
        """Numerics-changing classes the owner accepts (from the training contract or the native launch)."""
        if self.training is not None:
            return tuple(self.training.numerics_opt_in)
        return tuple(self.launch.numerics_opt_in) if self.launch is not None else ()

    @property
    def tokens_per_step(self) -> int | None:
        """Tokens per optimizer step (``None`` where the framework cannot tell before running)."""
        tokens: int | None = self.framework_impl.tokens_per_step(self)
        return tokens

    @property
    def effective_knobs(self) -> dict[str, KnobValue]:
        """Every catalogue knob with its value (explicit or default)."""
        return self.catalogue.effective(self.knobs)

    def knob(self, name: str) -> Any:
        return self.effective_knobs[name]

    def knob_changes(self, knobs: dict[str, Any]) -> dict[str, Any]:
        """The entries of a knob assignment that differ from this recipe's effective knobs."""
        eff = self.effective_knobs
        return {k: v for k, v in knobs.items() if k not in eff or eff[k] != v}

    def with_knobs(self, **changes: KnobValue) -> Recipe:
        """A new, validated recipe with some knobs changed."""
        data = self.model_dump(mode="python")
        data["knobs"] = {**self.knobs, **changes}
        return Recipe.model_validate(data)
