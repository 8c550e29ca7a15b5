"""The knob declaration of a ``command`` recipe: what attune may change in a script it has never heard of, and how
to read the script's output.

The user writes it once, beside the command (``knobs.yaml``), and ``attune import --framework command --knobs
knobs.yaml -- python train.py ...`` copies it into the recipe (``launch.declaration``), where the gate freezes it::

    steps: nanogpt                  # a preset (nanogpt, hf, step_loss), or {pattern: REGEX with named groups}
    tokens_per_sample: 128          # or tokens_per_step: N, or a `tokens` group in the pattern
    batch:
      global: batch_size * gradient_accumulation_steps    # the product that must not change
      accumulation: {flag: --gradient_accumulation_steps}  # derived: global / the other factors
    knobs:
      batch_size: {flag: --batch_size, values: [1, 2, 4, 8, 16], default: 12, role: batch_per_process}
      compile: {flag: --compile, values: [false, true], semantics: numerics_drift, role: compile}
      threads: {env: OMP_NUM_THREADS, values: ['1', '2'], role: threads}
      processes: {launcher: processes, values: [1, 2], role: processes}
    contract: [--learning_rate, --max_iters, --seed, --dtype, --dataset]
    loss_is_step_mean: true         # facts about the script the loss check reads (optional, see below)
    eval_shares_generator: false
    dropout: false

A knob is one flag (``--name value`` or ``--name=value``, or a bare ``switch``), one environment variable, or the
launcher's process count; its ``values`` are its whole domain, ``default`` is what the script uses when the flag
is absent, ``semantics`` says what a change does to what is learned (``preserving``, ``numerics_drift``, or
``numerics_changing`` with a ``numerics_class`` the recipe must opt in to), and ``role`` tells the playbook what
kind of setting it is, so its rules and diagnosis apply. ``contract`` names the flags and variables that decide
what is learned; every flag that is neither a knob nor contract is frozen too, with its value as written. The
global-batch product keeps the work per optimizer step fixed: a batch move re-derives the accumulation flag, as
attune does for HF's ``--gradient_accumulation_steps``.

A trial needs a token count per step: ``tokens_per_sample`` (with ``batch``), ``tokens_per_step``, or a ``tokens``
group in the step pattern; a declaration without one is refused at import, ``validate`` and before a tune, with the
value read from the command line or the script (``--block_size``, ``--seq_len``, ...) as the fix.

Three optional facts tell the loss check what the script's loss curve means (``attune knobs --suggest`` fills them
in from the source; unset means unknown): ``loss_is_step_mean`` (the printed loss is the optimizer step's mean over
its micro-steps; nanoGPT prints the last micro-step's, ``loss.item() * gradient_accumulation_steps``, which moves
with the micro-batch split), ``eval_shares_generator`` (evaluation draws its batches from the global generator
training draws from, so when it runs decides which samples training sees) and ``dropout`` (the model draws dropout
masks while training). :meth:`Declaration.hazards` lists the ones a declaration states.

:func:`load` reads a declaration file and names every problem with its field path and the fix.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from attune.errors import RecipeError
from attune.recipe.catalogue import KnobValue, Semantics

#: what ``attune import --framework command`` needs beside the command
DECLARATION_HINT = ("write a knob declaration (knobs.yaml) beside your script and pass it with --knobs knobs.yaml; "
                    "`attune knobs --framework command --suggest -- python train.py ...` proposes one")


class Role(str, Enum):
    """What kind of setting a declared knob is: the playbook's rules and the diagnosis read it by its role."""

    BATCH_PER_PROCESS = "batch_per_process"  # samples per forward/backward (accumulation derived)
    PROCESSES = "processes"  # data-parallel processes on the node
    LOADER_WORKERS = "loader_workers"  # background data-loading processes
    COMPILE = "compile"  # torch.compile or another graph compiler, on/off
    CHECKPOINTING = "checkpointing"  # activation recomputation, on/off
    THREADS = "threads"  # CPU threads per process (OMP_NUM_THREADS)
    OTHER = "other"  # no rule applies: tried after the rules run dry


class HazardKind(str, Enum):
    """A fact about a script that makes two runs learn differently although attune changed nothing that should."""

    LOSS_NOT_STEP_MEAN = "loss_not_step_mean"  # the printed loss is one micro-step's, not the step's mean
    EVAL_SHARES_GENERATOR = "eval_shares_generator"  # evaluation draws from training's global generator
    DROPOUT = "dropout"  # the model draws dropout masks while training


@dataclass(frozen=True)
class Hazard:
    """One hazard, with the line that says why it matters (and where it was seen, when read from the source)."""

    kind: HazardKind
    why: str


#: what each hazard means, where a declaration states it without a source line to point at
HAZARD_TEXT = {
    HazardKind.LOSS_NOT_STEP_MEAN: "the printed loss is one micro-step's, not the optimizer step's mean "
                                   "(loss_is_step_mean: false): it changes with the micro-batch split",
    HazardKind.EVAL_SHARES_GENERATOR: "evaluation draws its batches from the global generator training draws from "
                                      "(eval_shares_generator: true): when it runs decides which samples training "
                                      "sees",
    HazardKind.DROPOUT: "the model applies dropout while training (dropout: true): another micro-batch split draws "
                        "other masks",
}


class StepsSpec(BaseModel):
    """How one optimizer step appears in the output: a preset, or a regular expression with named groups."""

    model_config = ConfigDict(extra="forbid")

    preset: str | None = Field(default=None, description="nanogpt | hf | step_loss")
    pattern: str | None = Field(default=None, description="regular expression, searched in each output line, "
                                "with groups step (required), loss, time_ms or time_s, tokens")

    @model_validator(mode="after")
    def _one(self) -> StepsSpec:
        from attune.frameworks.command.logs import PRESETS

        if (self.preset is None) == (self.pattern is None):
            raise ValueError("give either a preset or a pattern")
        if self.preset is not None and self.preset not in PRESETS:
            raise ValueError(f"unknown preset {self.preset!r}; known: {', '.join(sorted(PRESETS))} (or write "
                             "pattern: a regular expression with named groups step, loss, time_ms)")
        if self.pattern is not None:
            try:
                groups = re.compile(self.pattern).groupindex
            except re.error as err:
                raise ValueError(f"pattern is not a regular expression: {err}") from None
            if "step" not in groups:
                raise ValueError("pattern needs a named group step, e.g. (?P<step>\\d+)")
            unknown = set(groups) - {"step", "loss", "time_ms", "time_s", "tokens"}
            if unknown:
                raise ValueError(f"pattern has groups {sorted(unknown)}; the groups attune reads are step, loss, "
                                 "time_ms, time_s and tokens")
            if "time_ms" in groups and "time_s" in groups:
                raise ValueError("pattern has both time_ms and time_s; keep one")
        return self


class KnobSpec(BaseModel):
    """One declared knob."""

    model_config = ConfigDict(extra="forbid")

    flag: str | None = Field(default=None, description="the command-line flag, e.g. --batch_size")
    env: str | None = Field(default=None, description="an environment variable, e.g. OMP_NUM_THREADS")
    launcher: Literal["processes"] | None = Field(default=None, description="the launcher's process count "
                                                  "(python → torchrun --standalone --nproc_per_node N)")
    switch: bool = Field(default=False, description="a bare flag: present means true (argparse store_true)")
    values: tuple[KnobValue, ...] = Field(min_length=2, description="the whole domain, in order")
    default: KnobValue = Field(default=None, description="the script's own value when the flag is absent")
    semantics: Semantics = Semantics.NUMERICS_DRIFT
    numerics_class: str | None = None
    role: Role = Role.OTHER
    description: str = ""

    @model_validator(mode="after")
    def _check(self) -> KnobSpec:
        where = [w for w in ("flag", "env", "launcher") if getattr(self, w) is not None]
        if len(where) != 1:
            raise ValueError("give exactly one of flag, env or launcher" + (f" (got {', '.join(where)})" if where
                                                                             else ""))
        if self.flag is not None and not self.flag.startswith("-"):
            raise ValueError(f"flag {self.flag!r} must be written as on the command line, e.g. --{self.flag}")
        if self.switch and (self.flag is None or set(self.values) != {False, True}):
            raise ValueError("switch: true needs a flag and values [false, true]")
        if self.semantics is Semantics.CONTRACT:
            raise ValueError("a knob cannot be contract; list the flag under contract instead")
        if self.semantics is Semantics.NUMERICS_CHANGING and not self.numerics_class:
            raise ValueError("a numerics_changing knob needs a numerics_class (the name a recipe opts in with, "
                             "launch.numerics_opt_in)")
        if self.launcher is not None and not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1
                                                 for v in self.values):
            raise ValueError("the process count's values must be positive integers")
        if self.env is not None and not all(isinstance(v, str) for v in self.values):
            raise ValueError("an environment variable's values are strings: quote them, e.g. ['1', '2']")
        return self

    @property
    def type(self) -> Literal["int", "bool", "choice"]:
        if all(isinstance(v, bool) for v in self.values):
            return "bool"
        if all(isinstance(v, int) and not isinstance(v, bool) for v in self.values):
            return "int"
        return "choice"


class Accumulation(BaseModel):
    """The flag attune derives to keep the global batch: gradient accumulation."""

    model_config = ConfigDict(extra="forbid")

    flag: str = Field(description="e.g. --gradient_accumulation_steps")
    default: int | None = Field(default=None, ge=1, description="the script's value when the flag is absent")
    divided_by_processes: bool = Field(default=False, description=(
        "the script divides the flag's value among its processes (nanoGPT does): the value must stay divisible by "
        "the process count"))


class BatchSpec(BaseModel):
    """The global-batch invariant: a product of knobs, the accumulation and constants that must not change."""

    model_config = ConfigDict(extra="forbid")

    global_: str = Field(alias="global", description="e.g. batch_size * gradient_accumulation_steps * processes")
    accumulation: Accumulation

    @property
    def factors(self) -> list[str | int]:
        out: list[str | int] = []
        for term in self.global_.split("*"):
            term = term.strip()
            out.append(int(term) if term.isdigit() else term.lstrip("-"))
        return out


class Declaration(BaseModel):
    """A whole declaration (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    steps: StepsSpec
    knobs: dict[str, KnobSpec] = Field(min_length=1)
    batch: BatchSpec | None = None
    contract: tuple[str, ...] = ()
    tokens_per_step: int | None = Field(default=None, ge=1)
    tokens_per_sample: int | None = Field(default=None, ge=1)
    trial_flags: dict[str, str] = Field(default_factory=dict, description=(
        "flags a trial sets that do not change what is learned (log every step, output under {trial_dir})"))
    loss_is_step_mean: bool | None = Field(default=None, description=(
        "the printed loss is the optimizer step's mean over its micro-steps (false: one micro-step's, as nanoGPT's "
        "loss.item() * gradient_accumulation_steps); unset: unknown"))
    eval_shares_generator: bool | None = Field(default=None, description=(
        "evaluation draws its batches from the same global generator as training (nanoGPT's estimate_loss calling "
        "get_batch, which uses torch.randint without a generator); unset: unknown"))
    dropout: bool | None = Field(default=None, description=(
        "the model applies dropout while training (random masks per sample); unset: unknown"))

    @field_validator("steps", mode="before")
    @classmethod
    def _preset_shorthand(cls, value: Any) -> Any:
        return {"preset": value} if isinstance(value, str) else value

    @model_validator(mode="after")
    def _check(self) -> Declaration:
        problems: list[str] = []
        for name, knob in self.knobs.items():
            if not re.fullmatch(r"[A-Za-z_][\w.]*", name):
                problems.append(f"knobs.{name}: a knob name is letters, digits, underscores and dots")
            if knob.flag is not None and knob.flag in self.contract:
                problems.append(f"knobs.{name}: {knob.flag} is also listed under contract; a setting is either a "
                                "knob or contract")
        flags = [k.flag for k in self.knobs.values() if k.flag is not None]
        if len(flags) != len(set(flags)):
            problems.append("knobs: two knobs name the same flag")
        if sum(k.launcher is not None for k in self.knobs.values()) > 1:
            problems.append("knobs: only one knob can be the launcher's process count")
        if self.batch is not None:
            acc = _name(self.batch.accumulation.flag)
            if acc in self.contract or self.batch.accumulation.flag in self.contract:
                problems.append(f"batch.accumulation: {self.batch.accumulation.flag} is listed under contract; "
                                "attune derives it, so it cannot also be contract")
            terms = self.batch.factors
            if terms.count(acc) != 1:
                problems.append(f"batch.global: the product must name the accumulation ({acc}) once, e.g. "
                                f"batch_size * {acc}")
            for term in terms:
                if isinstance(term, str) and term != acc and term not in self.knobs:
                    problems.append(f"batch.global: {term!r} is neither a declared knob nor the accumulation "
                                    f"({acc}); terms are knob names, {acc} and whole numbers joined by *")
        for flag in self.trial_flags:
            if not flag.startswith("-"):
                problems.append(f"trial_flags.{flag}: write the flag as on the command line, e.g. --{flag}")
            if flag in self.contract or flag in flags:
                problems.append(f"trial_flags.{flag}: a trial flag cannot also be a knob or contract")
        terms = self.batch.factors if self.batch is not None else []
        for name, knob in self.knobs.items():
            if knob.role is Role.BATCH_PER_PROCESS and name not in terms:
                problems.append(f"knobs.{name}: a batch_per_process knob moves the global batch unless batch.global "
                                f"names it: declare batch: {{global: {name} * gradient_accumulation_steps, "
                                "accumulation: {flag: --gradient_accumulation_steps}}} (your script's accumulation "
                                "flag)")
            if knob.launcher is not None and name not in terms and not (
                    self.batch is not None and self.batch.accumulation.divided_by_processes):
                problems.append(f"knobs.{name}: more processes take more samples per step unless the batch "
                                f"invariant accounts for them: add {name} to batch.global (each process its own "
                                "batch), or set batch.accumulation.divided_by_processes (the script divides its "
                                "accumulation among them, as nanoGPT does)")
        if self.tokens_per_step is not None and self.tokens_per_sample is not None:
            problems.append("tokens_per_step, tokens_per_sample: give one of them")
        if self.tokens_per_sample is not None and self.batch is None:
            problems.append("tokens_per_sample: needs batch (the global batch in samples) to count tokens per step")
        if problems:
            raise ValueError("\n".join(problems))
        return self

    # -- views -----------------------------------------------------------------------------------------------
    @property
    def counts_tokens(self) -> bool:
        """Whether a trial's step records get a token count: declared per step or per sample, or read from a
        ``tokens`` group of the step pattern."""
        return (self.tokens_per_step is not None or self.tokens_per_sample is not None
                or (self.steps.pattern is not None and "tokens" in re.compile(self.steps.pattern).groupindex))

    def hazards(self) -> list[Hazard]:
        """The hazards this declaration states (a fact left unset is unknown, and no hazard is claimed for it)."""
        stated = {HazardKind.LOSS_NOT_STEP_MEAN: self.loss_is_step_mean is False,
                  HazardKind.EVAL_SHARES_GENERATOR: self.eval_shares_generator is True,
                  HazardKind.DROPOUT: self.dropout is True}
        return [Hazard(kind, HAZARD_TEXT[kind]) for kind, on in stated.items() if on]

    def role_knob(self, role: Role) -> str | None:
        """The knob declared with ``role`` (the first, where several are)."""
        return next((name for name, k in self.knobs.items() if k.role is role), None)

    @property
    def processes_knob(self) -> str | None:
        return next((name for name, k in self.knobs.items() if k.launcher is not None), None)

    def to_data(self) -> dict[str, Any]:
        """The declaration as the recipe stores it (plain YAML types, ``global`` under its own name)."""
        data: dict[str, Any] = self.model_dump(mode="json", by_alias=True, exclude_defaults=True)
        return data


def _name(flag: str) -> str:
    """``--gradient-accumulation-steps`` → ``gradient_accumulation_steps`` (the name a product term uses)."""
    return flag.lstrip("-").replace("-", "_")


def parse(data: Any, source: str = "the knob declaration") -> Declaration:
    """A declaration from its mapping; :class:`RecipeError` with one ``field: message`` line per problem."""
    if not isinstance(data, Mapping):
        raise RecipeError(f"{source} must be a mapping with steps and knobs (see `attune knobs --framework command`)")
    try:
        return Declaration.model_validate(dict(data))
    except ValidationError as err:
        lines: list[str] = []
        for e in err.errors():
            where = ".".join(str(p) for p in e["loc"]) or "(declaration)"
            msg = str(e["msg"]).removeprefix("Value error, ")
            lines.extend(f"{where}: {m}" if where != "(declaration)" or ":" not in m else m
                         for m in msg.splitlines())
        raise RecipeError(f"{source} has problems:", lines) from None


def load(path: str | Path) -> tuple[Declaration, dict[str, Any]]:
    """A declaration file → (the declaration, its data as the recipe stores it)."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise RecipeError(f"cannot read the knob declaration {path}: {err.strerror}") from None
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        raise RecipeError(f"the knob declaration {path} is not YAML: {str(err).splitlines()[0]}") from None
    declaration = parse(data, str(path))
    return declaration, declaration.to_data()


__all__ = ["DECLARATION_HINT", "HAZARD_TEXT", "Accumulation", "BatchSpec", "Declaration", "Hazard", "HazardKind",
           "KnobSpec", "Role", "StepsSpec", "load", "parse"]
