"""Test support of the torch framework: a made-up speed landscape for :class:`attune.testing.fakes.FakeBackend`."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from attune.trial import TrialOutcome

if TYPE_CHECKING:
    from attune.recipe.model import Recipe


def fake_speed(recipe: Recipe) -> float | TrialOutcome:
    """More processes and bigger micro-batches help; checkpointing costs; micro-batch 8 runs out of memory."""
    k = recipe.effective_knobs
    speed = 1000.0 * (1 + 0.8 * (int(cast(int, k["nproc_per_node"])) - 1))
    speed *= {1: 0.8, 2: 0.95, 4: 1.0, 8: 0.98}.get(int(cast(int, k["micro_batch_size"])), 0.9)
    speed *= {"none": 1.0, "selective": 0.9, "full": 0.75}[str(k["activation_checkpointing"])]
    if int(cast(int, k["micro_batch_size"])) >= 8:
        return TrialOutcome.OOM
    return speed
