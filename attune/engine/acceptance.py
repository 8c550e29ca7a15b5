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

**Paired measurement** (the default for ``attune tune``): a candidate whose first run is not decisively slower than
the best (its gain exceeds ``min_gain − noise floor``: on a quiet machine, about "not slower"; on a busy one, almost
any) is measured again in A-B-A order: the current best runs right after it, then the
candidate once more. Load that drifts slowly over the three runs moves both sides alike, so the decision rests on
the paired ratio ``mean(A1, A2) / B`` and its uncertainty: the standard error of each run's window median
(``1.2533 · cv / √n``) and the disagreement of the two candidate runs (what the drift did not cancel). The change
is kept when the lower end of the one-sided 95 % interval, ``gain − 1.645 · √(se² + drift²)``, clears ``min_gain``.
It costs one more trial per promising candidate than a plain confirmation; the noise-floor rule above is the
fallback when the reference run fails or pairing is off.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

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


@dataclass(frozen=True)
class PairedGain:
    """The A-B-A decision figures: relative gain, the one-sided 95 % half-width, and its lower end."""

    gain: float
    half_width: float

    @property
    def lower(self) -> float:
        return self.gain - self.half_width


def _rel_se(m: Measurement) -> float:
    """Relative standard error of a run's window-median throughput."""
    return 1.2533 * m.step_time_cv / math.sqrt(max(m.steps_measured, 1))


def paired_gain(first: Measurement, reference: Measurement, second: Measurement) -> PairedGain:
    """Gain of a candidate (runs ``first`` and ``second``) over the best run ``reference`` between them."""
    a1, a2, b = first.tokens_per_s_per_device, second.tokens_per_s_per_device, reference.tokens_per_s_per_device
    mean_a = (a1 + a2) / 2
    if b <= 0 or mean_a <= 0:
        return PairedGain(gain=-1.0 if b > 0 else math.inf, half_width=math.inf)
    g = mean_a / b - 1
    se = math.sqrt((_rel_se(first) ** 2 + _rel_se(second) ** 2) / 4 + _rel_se(reference) ** 2)
    drift = abs(a1 - a2) / (2 * mean_a)
    return PairedGain(gain=g, half_width=Z_95 * math.sqrt(se ** 2 + drift ** 2))
