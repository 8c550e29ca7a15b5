"""Knob catalogues: what a tuner may change in a framework's recipe, and the rules that bind knobs.

A :class:`Knob` is data: name, type, finite domain, default, semantics class and a description.
A :class:`Constraint` is a named rule over a whole recipe (divisibility, compatibility), written as a
function that returns a problem message or ``None``. The gate and the recipe loader call the same
constraints, so a rule lives in exactly one place.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from attune.recipe.model import Recipe


class Semantics(str, Enum):
    """What changing a knob does to what the model learns.

    - ``preserving``: same math and the same floating-point results (data-loader workers, checkpointing).
    - ``numerics_drift``: same math, floating-point sums may be reordered (micro-batch split, layout,
      fused kernels, compile). Admitted, but owes an empirical loss-equivalence check.
    - ``numerics_changing``: changes numerics by design (FP8, BF16 gradient reduction, TF32). Refused unless
      the recipe's training contract opts in to it, and then also owes the loss check.
    - ``contract``: changes what is learned (batch, learning rate, data order, precision). Always refused.
    """

    PRESERVING = "preserving"
    NUMERICS_DRIFT = "numerics_drift"
    NUMERICS_CHANGING = "numerics_changing"
    CONTRACT = "contract"


KnobValue = int | float | bool | str | None


class Knob(BaseModel):
    """One execution setting of a framework, with its finite domain."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(description="snake_case name used in YAML, the CLI, the journal and reports")
    type: Literal["int", "bool", "choice", "str"] = Field(description="value type")
    values: tuple[KnobValue, ...] = Field(description="legal values in ascending / natural order")
    default: KnobValue = Field(description="value used when a recipe does not set the knob")
    semantics: Semantics = Field(description="what a change does to training; see Semantics")
    group: str = Field(default="", description="coupled knobs sharing a group count as one change")
    description: str = Field(min_length=3, description="what the knob does and which bottleneck it addresses")
    numerics_class: str | None = Field(
        default=None,
        description="for numerics_changing knobs: the opt-in name a training contract must list",
    )
    changing_values: tuple[KnobValue, ...] | None = Field(
        default=None,
        description="if set, only these values carry `semantics`; other values are numerics_drift",
    )
    versions: str = Field(default="", description="framework versions this entry covers (PEP 440 specifier; "
                                                 "empty: every version the framework's catalogue covers)")
    compiles: tuple[KnobValue, ...] = Field(
        default=(), description="values at which the job compiles before its first step (torch.compile, CUDA graph "
                                "capture): a trial of such a configuration pays it, which the budget predicts")

    @property
    def coupling_group(self) -> str:
        return self.group or self.name

    def semantics_of(self, value: KnobValue) -> Semantics:
        """The semantics class of setting this knob to ``value`` (some knobs only change numerics at some values)."""
        if self.changing_values is not None and value not in self.changing_values:
            return Semantics.NUMERICS_DRIFT
        return self.semantics

    def check_value(self, value: Any) -> str | None:
        """Return a problem message if ``value`` is not legal for this knob, else ``None``."""
        if self.type == "int" and (isinstance(value, bool) or not isinstance(value, int)):
            return f"must be an integer, got {value!r}; legal values: {_fmt(self.values)}"
        if self.type == "bool" and not isinstance(value, bool):
            return f"must be true or false, got {value!r}"
        if value not in self.values:
            return f"{value!r} is not a legal value; legal values: {_fmt(self.values)}"
        return None

    def neighbours(self, value: KnobValue) -> list[KnobValue]:
        """The values one move away: adjacent ones for ordered (int) knobs, every other value for
        categorical (choice, bool) knobs, nearest in the listed order first."""
        vals = list(self.values)
        if value not in vals:
            return vals
        i = vals.index(value)
        if self.type != "int":
            return sorted((v for v in vals if v != value), key=lambda v: (abs(vals.index(v) - i), -vals.index(v)))
        out = []
        if i + 1 < len(vals):
            out.append(vals[i + 1])
        if i - 1 >= 0:
            out.append(vals[i - 1])
        return out


def format_value(value: Any) -> str:
    """A knob or contract value as a person writes it in YAML messages: true, null, 'text', 4."""
    if isinstance(value, bool):
        return str(value).lower()
    if value is None:
        return "null"
    if isinstance(value, str):
        return repr(value)
    return str(value)


def _fmt(values: Iterable[Any]) -> str:
    return ", ".join(format_value(v) for v in values)


@dataclass(frozen=True)
class Constraint:
    """A named rule over a whole recipe. ``check`` returns a problem message (with the fix) or ``None``."""

    name: str
    knobs: tuple[str, ...]
    check: Callable[[Recipe], str | None]
    description: str = ""


@dataclass
class Catalogue:
    """All knobs and constraints of one framework."""

    framework: str
    knobs: dict[str, Knob]
    constraints: list[Constraint] = field(default_factory=list)
    version: str = "1"
    versions: str = ""  # framework versions the catalogue covers (PEP 440 specifier)
    #: pairs of coupling groups one change may move together, where moving one of them alone is predicted
    #: infeasible (e.g. fewer pipeline stages only fit with the distributed optimizer): the gate's only exception to
    #: one group per step, and the change is measured and reported as one
    coupled_groups: tuple[tuple[str, str], ...] = ()
    #: the framework's memory model: predicted (peak GB, device capacity GB) of a recipe, ``None`` when it cannot
    #: tell; the gate uses it for :meth:`predicts_infeasible`, policies to size moves
    memory_model: Callable[[Recipe], tuple[float, float] | None] | None = None
    #: the playbook's priors for these knobs, ``(knob, direction) → Rule``, where a recipe declares its own knobs
    #: (``command``); None: the framework's ``rules``
    rules: Mapping[tuple[str, str], Any] | None = None

    def coupled(self, a: str, b: str) -> bool:
        """True when the catalogue declares coupling groups ``a`` and ``b`` movable together."""
        return (a, b) in self.coupled_groups or (b, a) in self.coupled_groups

    def predicts_infeasible(self, recipe: Recipe) -> str | None:
        """Why ``recipe`` cannot run (a violated constraint, or the memory model's predicted OOM), else ``None``."""
        problems = self.constraint_problems(recipe)
        if problems:
            return f"rule {problems[0][0].name}: {problems[0][1]}"
        if self.memory_model is None:
            return None
        try:
            mem = self.memory_model(recipe)
        except Exception:  # noqa: BLE001 - a model that cannot judge predicts nothing
            return None
        if mem is not None and mem[0] > mem[1]:
            return f"predicted out of memory ({mem[0]:.1f} GB of {mem[1]:.1f} GB)"
        return None

    def compiling(self, recipe: Recipe) -> list[str]:
        """The knobs of ``recipe`` set to a value at which the job compiles before its first step
        (:attr:`Knob.compiles`)."""
        return [k.name for k in self.knobs.values() if k.compiles and recipe.knob(k.name) in k.compiles]

    def __contains__(self, name: str) -> bool:
        return name in self.knobs

    def __getitem__(self, name: str) -> Knob:
        return self.knobs[name]

    def unknown_knob_message(self, name: str) -> str:
        close = difflib.get_close_matches(name, list(self.knobs), n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        return (
            f"'{name}' is not a knob of the {self.framework} catalogue.{hint} "
            f"Run `attune knobs --framework {self.framework}` to list them."
        )

    def value_problems(self, knobs: dict[str, Any]) -> list[str]:
        """Type/domain problems of a knob assignment, as ``knobs.NAME: message`` lines."""
        problems: list[str] = []
        for name, value in knobs.items():
            if name not in self.knobs:
                problems.append(f"knobs.{name}: {self.unknown_knob_message(name)}")
                continue
            msg = self.knobs[name].check_value(value)
            if msg:
                problems.append(f"knobs.{name}: {msg}")
        return problems

    def constraint_problems(self, recipe: Recipe) -> list[tuple[Constraint, str]]:
        """Every constraint the recipe violates, with its message."""
        out = []
        for c in self.constraints:
            msg = c.check(recipe)
            if msg:
                out.append((c, msg))
        return out

    def effective(self, knobs: dict[str, Any]) -> dict[str, KnobValue]:
        """Full assignment: catalogue defaults overlaid with the recipe's explicit knobs."""
        full: dict[str, KnobValue] = {k.name: k.default for k in self.knobs.values()}
        full.update(knobs)
        return full

    def describe(self) -> list[dict[str, Any]]:
        return [k.model_dump(mode="json") for k in self.knobs.values()]


def get_catalogue(framework: str, launch: Any = None) -> Catalogue:
    """The catalogue of ``framework`` (built once per registered framework object, so a framework registered anew
    under the same name gets its own); with a recipe's ``launch``, the catalogue that launch declares where the
    framework reads one from it (``command``). :class:`KeyError` for an unknown framework."""
    from attune import registry

    impl = registry.get(framework)
    if launch is not None:
        own: Catalogue | None = impl.launch_catalogue(launch)
        if own is not None:
            return own
    cached = _CACHE.get(framework)
    if cached is None or cached[0] is not impl:
        cached = _CACHE[framework] = (impl, impl.catalogue())
    return cached[1]


_CACHE: dict[str, tuple[object, Catalogue]] = {}


def frameworks() -> list[str]:
    """Names of every registered framework."""
    from attune import registry

    return registry.names()
