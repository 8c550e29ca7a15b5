"""The policy seam: what to try next.

Call sequence, once per trial:

1. the engine builds a :class:`PolicyContext` (read-only: recipes, every record so far, the search
   space, a gate pre-check) and calls :meth:`Policy.propose`;
2. the policy returns a :class:`~attune.recipe.change.Change` or :class:`Stop`;
3. after the trial the engine calls :meth:`Policy.observe` with its frozen record.

Policies must be rebuildable from the records alone (``propose`` may only depend on the context and
the constructor's seed), so ``--resume`` needs nothing but the journal.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from attune.recipe.catalogue import Catalogue, KnobValue
from attune.recipe.change import Change
from attune.recipe.model import Recipe
from attune.trial import Measurement, TrialRecord


@dataclass(frozen=True)
class Stop:
    """The policy has no justified move left."""

    reason: str


@dataclass(frozen=True)
class PolicyContext:
    baseline: Recipe
    best: Recipe
    best_measurement: Measurement | None
    records: Sequence[TrialRecord]
    search_space: Sequence[str]
    noise_floor: float
    budget_left_hours: float
    #: gate pre-check: True if the gate would admit this change to ``best`` (and it was never tried)
    admissible: Callable[[dict[str, KnobValue]], bool] = field(repr=False, default=lambda change: True)
    #: name of the backend that runs the trials (``local``, ``sim``...), ``None`` when the caller does not say
    backend: str | None = None

    @property
    def catalogue(self) -> Catalogue:
        return self.baseline.catalogue

    @property
    def tried(self) -> set[str]:
        return {r.signature for r in self.records if r.signature}


class Policy(ABC):
    """Proposes one change at a time to the current best recipe."""

    name: str = "policy"

    @abstractmethod
    def propose(self, ctx: PolicyContext) -> Change | Stop:
        """The next change to try, or why there is none."""

    def observe(self, record: TrialRecord) -> None:  # noqa: B027 - optional hook
        """Called with each finished trial's record (including refused ones)."""
