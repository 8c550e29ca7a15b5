"""The three native launch formats of Megatron-Core training, behind one interface.

- :mod:`.mlm`: Megatron-LM argument lists (``torchrun ... pretrain_gpt.py --tensor-model-parallel-size 4 ...``);
- :mod:`.bridge`: Megatron-Bridge recipes (``run_recipe.py --recipe NAME`` or ``--config-file x.yaml``, plus
  ``section.field=value`` ``ConfigContainer`` overrides);
- :mod:`.nemo`: NeMo 2 override lines (``nemo llm pretrain --factory llama3_8b trainer.strategy....=2``).

All three drive the same Megatron-Core engine, so they share the ``megatron`` knob catalogue, its constraints, the
padded-vocabulary contract and the simulator; a format only knows how its launch spells each knob (and which
versions of its package spell it so), how to derive the model and training contract attune's simulator needs from
the launch, and how to change exactly one setting of it. :func:`detect` picks the format from the launch.

Every native setting a format reads is classed ``contract`` (decides what is learned: learning rate, batch,
sequence, data, seed, MoE routing, precision, architecture) or ``frozen`` (not modelled, carried verbatim);
knob-controlled settings are neither (the knob's value is the setting). The gate refuses any change to the first two.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from attune.errors import RecipeError


@dataclass(frozen=True)
class Spelling:
    """How one format writes one knob: its native name(s), and the package versions that spelling covers."""

    knob: str
    names: tuple[str, ...]  # first: the name a new setting is written as; the rest: other names of it
    versions: str
    note: str = ""


@dataclass
class Native:
    """What one native launch says, as a format reads it."""

    format: Format
    argv: tuple[str, ...]
    files: dict[str, str]
    settings: dict[str, Any]  # native name → value (typed), every setting the launch (and its files) give
    knobs: dict[str, Any]  # knob → the value the launch runs with (format defaults where absent)
    model: dict[str, Any]
    training: dict[str, Any]
    nodes: int = 1
    devices_per_node: int | None = None
    pads_vocab: bool = True  # the framework pads the vocabulary by make_vocab_size_divisible_by × TP
    knob_settings: frozenset[str] = frozenset()  # native names a knob controls (not contract, not frozen)
    notes: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)


class Format(ABC):
    """One native launch format of Megatron-Core training."""

    name: str
    title: str
    package: str  # the distribution whose version ``launch.framework_version`` records
    versions: str  # the package versions the spellings, defaults and log lines were checked against
    spellings: dict[str, Spelling]

    @abstractmethod
    def detect(self, argv: Sequence[str]) -> bool:
        """Whether ``argv`` is a launch of this format."""

    def files_to_read(self, argv: Sequence[str]) -> list[str]:
        """Config files the launch names that attune must read (path as written)."""
        return []

    @abstractmethod
    def read(self, argv: Sequence[str], files: Mapping[str, str]) -> Native:
        """The launch's settings, knob values, model and training contract; :class:`RecipeError` on what attune
        cannot read (naming the setting and what to do)."""

    @abstractmethod
    def render(self, native: Native, changes: Mapping[str, Any], *, in_files: bool = True,
               extra: Mapping[str, Any] | None = None) -> tuple[list[str], dict[str, str]]:
        """The launch with knob ``changes`` (knob → new value) applied, each as exactly its own setting; ``extra``
        native settings (trial instrumentation) set too. ``in_files``: edit a config file in place where it holds
        the setting (False: everything on the command line, for a container whose files cannot be changed)."""

    @abstractmethod
    def set_native(self, native: Native, name: str, value: Any) -> tuple[list[str], dict[str, str]] | None:
        """The launch with native setting ``name`` set to ``value`` (``None``: not a setting of this format)."""

    @abstractmethod
    def kind_of(self, name: str) -> str:
        """``contract`` or ``frozen`` for a native setting no knob controls."""

    def known_contract(self) -> frozenset[str]:
        """Contract settings the gate watches even where a launch does not set them (adding one is refused)."""
        return frozenset()

    def trial_settings(self, native: Native, steps: int) -> dict[str, Any]:
        """Measurement instrumentation of a trial (never what is learned): log every step, no checkpoints."""
        return {}

    def spelling_of(self, knob: str) -> Spelling | None:
        return self.spellings.get(knob)


def all_formats() -> list[Format]:
    from attune.frameworks.megatron.formats import bridge, mlm, nemo

    return [nemo.FORMAT, bridge.FORMAT, mlm.FORMAT]


def detect(argv: Sequence[str]) -> Format:
    """The format of ``argv``; :class:`RecipeError` listing the accepted forms otherwise."""
    argv = [str(a) for a in argv]
    for fmt in all_formats():
        if fmt.detect(argv):
            return fmt
    raise RecipeError(f"`{' '.join(argv)}` is not a Megatron launch attune can read; accepted forms:", [
        ("Megatron-LM: torchrun [...] pretrain_gpt.py --tensor-model-parallel-size N ... (or python -m "
         "torch.distributed.run ...)"),
        ("Megatron-Bridge: torchrun [...] run_recipe.py --recipe NAME [key=value ...], or a script with "
         "--config-file CONFIG.yaml [key=value ...]"),
        "NeMo 2: nemo llm pretrain --factory NAME [trainer.strategy.tensor_model_parallel_size=2 ...]"])


def by_name(name: str) -> Format:
    for fmt in all_formats():
        if fmt.name == name:
            return fmt
    raise KeyError(name)


def scalar_text(value: Any) -> str:
    """A value as a command line writes it (``True`` → ``true`` for overrides is the caller's choice)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, float):
        return repr(value)
    return str(value)


__all__ = ["Format", "Native", "Spelling", "all_formats", "by_name", "detect", "scalar_text"]
