"""The trial-backend seam: run one configuration and report what happened.

A backend never raises for a failed trial: out of memory, crashes, hangs and divergence come back as
:class:`TrialResult` outcomes with the accelerator-hours they cost. It raises
:class:`~attune.errors.BackendError` only when it cannot work at all (no torchrun, no cluster).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path

from attune.engine.state import Measurement, TrialOutcome
from attune.recipe.model import Recipe


@dataclass(frozen=True)
class TrialRequest:
    trial_id: int
    trial_dir: Path
    warmup_steps: int
    measure_steps: int
    timeout_s: float
    seed: int = 0

    @property
    def steps(self) -> int:
        return self.warmup_steps + self.measure_steps


@dataclass(frozen=True)
class TrialResult:
    outcome: TrialOutcome
    measurement: Measurement | None
    wall_s: float
    devices: int
    charged_hours: float
    message: str = ""
    extra: dict[str, object] = field(default_factory=dict)


class TrialBackend(ABC):
    """Runs trials. ``run`` must always release everything it started, whatever happens."""

    name: str = "backend"
    #: seconds a trial may still run (and be charged) after its deadline: the backend's kill grace and teardown
    teardown_s: float = 0.0

    @abstractmethod
    def run(self, recipe: Recipe, request: TrialRequest) -> TrialResult:
        """Launch ``recipe`` for ``request.steps`` steps, wait (at most ``timeout_s``), measure, clean up."""

    def estimate_hours(self, recipe: Recipe, request: TrialRequest) -> float | None:
        """What one trial of ``recipe`` is expected to cost, before any has run (``None``: unknown)."""
        return None

    def prepare(self, recipe: Recipe, work_dir: Path) -> dict[str, object] | None:
        """Run the recipe's one-time set-up before its first trial (see ``Framework.setup``); what it was and how
        long it took, or None when there is none. Never raises for a failed set-up: it is reported."""
        return None

    def release(self, trial_dir: Path) -> None:  # noqa: B027 - optional hook
        """Release whatever an interrupted run of this backend left behind for ``trial_dir`` (on resume)."""

    def loss_curve(self, recipe: Recipe, request: TrialRequest) -> TrialResult:
        """Run for a loss-equivalence check (same as ``run`` unless a backend knows better)."""
        return self.run(recipe, request)
