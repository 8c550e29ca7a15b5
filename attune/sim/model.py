"""What the simulator runs: a framework's performance model, asked through ``Framework.simulate``.

The simulator itself knows hardware (:mod:`attune.sim.hardware`), run-to-run noise and the shape of a result, and
holds the analytical models a framework's ``simulate`` runs (Megatron-Core's: :mod:`attune.sim.megatron`, with its
layout arithmetic in :mod:`attune.sim.megatron_layout`), so the simulator imports no framework package.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from attune.recipe.model import Recipe

NOISE_SIGMA = 0.015
"""Run-to-run noise of step time (DGXC: 70B BF16 14.61-14.86 s across scales, ~1-2 %)."""


@dataclass(frozen=True)
class SimResult:
    """The simulated outcome of one training step of a recipe."""

    outcome: Literal["succeeded", "oom"]
    step_time_s: float | None
    tokens_per_s_per_device: float
    peak_memory_gb: float
    breakdown: dict[str, float] = field(default_factory=dict)
    memory_gb: dict[str, float] = field(default_factory=dict)
    signals: dict[str, float] = field(default_factory=dict)
    mfu: float = 0.0
    model_flops_per_token: float = 0.0
    message: str = ""
    #: rough parameters held per device, in billions (the simulated start-up time only)
    params_per_device_b: float = 0.0


def simulate(recipe: Recipe, *, seed: int | None = None, noise_sigma: float = NOISE_SIGMA) -> SimResult:
    """One steady-state training step of ``recipe`` on its cluster, by its framework's performance model.

    Deterministic (the model's mean) when ``seed`` is None; with a seed, the step time carries multiplicative
    log-normal run-to-run noise of sigma ``noise_sigma``. Raises ``ValueError`` for a framework without a model or an
    accelerator that cannot be simulated.
    """
    result: SimResult = recipe.framework_impl.simulate(recipe, seed=seed, noise_sigma=noise_sigma)
    return result
