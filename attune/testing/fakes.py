"""A deterministic in-process backend for engine and policy tests (no processes, no torch)."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

from attune.backends.base import TrialBackend, TrialRequest, TrialResult
from attune.engine.budget import charge
from attune.recipe.model import Recipe
from attune.trial import Measurement, TrialOutcome

SpeedFn = Callable[[Recipe], float | TrialOutcome]


def default_speed(recipe: Recipe) -> float | TrialOutcome:
    """The made-up landscape of the recipe's framework (``attune.frameworks.<name>.testing.fake_speed``)."""
    import importlib

    module = importlib.import_module(f"attune.frameworks.{recipe.framework}.testing")
    speed: float | TrialOutcome = module.fake_speed(recipe)
    return speed


@dataclass
class FakeBackend(TrialBackend):
    """Returns ``speed(recipe)`` tokens/s/device with seeded multiplicative noise; counts its launches."""

    speed: SpeedFn = default_speed
    noise: float = 0.01
    wall_s: float = 60.0
    seed: int = 0
    launches: list[Recipe] = field(default_factory=list)
    name: str = "fake"

    def run(self, recipe: Recipe, request: TrialRequest) -> TrialResult:
        self.launches.append(recipe)
        devices = recipe.resources.devices
        value = self.speed(recipe)
        if isinstance(value, TrialOutcome):
            return TrialResult(outcome=value, measurement=None, wall_s=self.wall_s / 2, devices=devices,
                               charged_hours=charge(devices, self.wall_s / 2), message=f"fake {value.value}")
        rng = random.Random(self.seed * 7919 + request.trial_id)
        tps = value * (1 + rng.gauss(0, self.noise))
        step = (recipe.tokens_per_step or 1) / (tps * devices)
        m = Measurement(tokens_per_s_per_device=tps, tokens_per_s=tps * devices, step_time_median_s=step,
                        step_time_cv=self.noise, steps_measured=request.measure_steps,
                        losses=[8.0 - 0.01 * i for i in range(request.steps)])
        return TrialResult(outcome=TrialOutcome.SUCCEEDED, measurement=m, wall_s=self.wall_s, devices=devices,
                           charged_hours=charge(devices, self.wall_s))
