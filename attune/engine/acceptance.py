"""When is a change faster? A noise floor learned from repeated baselines, and a pure ``accept``.

The floor is the larger of
- ``min_gain`` (the user's smallest interesting gain),
- twice the relative spread between repeated baseline runs (run-to-run noise: process placement,
  allocator state, neighbours), and
- twice the standard error of one trial's window median, ``cv / sqrt(n)`` (within-run noise).
A candidate is accepted only if its throughput beats the best by more than the floor, and, when
confirmation is on, the mean of its run and a re-run still does.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from attune.engine.state import Measurement


def noise_floor(baselines: Sequence[Measurement], *, min_gain: float) -> float:
    if not baselines:
        return max(min_gain, 0.05)
    tps = [m.tokens_per_s_per_device for m in baselines]
    mean = statistics.fmean(tps)
    spread = (max(tps) - min(tps)) / mean if len(tps) > 1 and mean > 0 else 0.0
    within = max(m.step_time_cv / math.sqrt(max(m.steps_measured, 1)) for m in baselines)
    return max(min_gain, 2 * spread, 2 * within)


def gain(candidate: float, best: float) -> float:
    return candidate / best - 1.0 if best > 0 else math.inf


def clears(candidate: float, best: float, floor: float) -> bool:
    """True when ``candidate`` throughput beats ``best`` by more than the noise floor."""
    return gain(candidate, best) > floor
