"""When is a change faster? A noise floor learned from repeated baselines, and a pure ``accept``.

The floor is the larger of
- ``min_gain`` (the user's smallest interesting gain),
- a one-sided 95 % bound on the difference between one new run and the mean of the ``n`` baseline
  runs, ``1.645 · σ · sqrt(1 + 1/n)``, where σ is the relative standard deviation between repeated
  baseline runs (run-to-run noise: process placement, allocator state, neighbours), and
- the standard error of one trial's window median, ``cv / sqrt(window)`` (within-run noise), which
  guards against two baseline runs agreeing by chance.
A candidate is accepted only if its throughput beats the best by more than the floor, and, when
confirmation is on, the mean of its run and a re-run still does.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from attune.engine.state import Measurement


Z_95 = 1.645  # one-sided 95 % normal quantile


def noise_floor(baselines: Sequence[Measurement], *, min_gain: float) -> float:
    if not baselines:
        return max(min_gain, 0.05)
    tps = [m.tokens_per_s_per_device for m in baselines]
    mean = statistics.fmean(tps)
    sigma = statistics.stdev(tps) / mean if len(tps) > 1 and mean > 0 else 0.0
    between = Z_95 * sigma * math.sqrt(1 + 1 / len(tps))
    within = max(m.step_time_cv / math.sqrt(max(m.steps_measured, 1)) for m in baselines)
    return max(min_gain, between, within)


def gain(candidate: float, best: float) -> float:
    return candidate / best - 1.0 if best > 0 else math.inf


def clears(candidate: float, best: float, floor: float) -> bool:
    """True when ``candidate`` throughput beats ``best`` by more than the noise floor."""
    return gain(candidate, best) > floor
