"""The charts' axis ticks and ranges on the values real runs produce, including the degenerate ones."""

from __future__ import annotations

import itertools
import math

from hypothesis import given
from hypothesis import strategies as st

from attune.report.svg import nice_ticks
from attune.report.trials import ChartData, Point

finite = st.floats(min_value=-1e12, max_value=1e12, allow_nan=False, allow_infinity=False)


@given(finite, finite, st.integers(min_value=1, max_value=12))
def test_ticks_are_few_and_inside_the_range(a, b, n):
    lo, hi = min(a, b), max(a, b)
    ticks = nice_ticks(lo, hi, n)
    assert 1 <= len(ticks) <= n + 1
    assert all(x < y for x, y in itertools.pairwise(ticks))  # strictly increasing: no label twice
    span = hi - lo
    assert all(lo - span * 1e-6 - 1e-9 <= t <= hi + span * 1e-6 + 1e-9 for t in ticks)


def test_a_span_below_the_values_resolution_ends_at_once():
    """Seen: a one-trial run's chart, the trial at 8,550 tok/s and the best line through it a rounding apart, spun
    in the tick loop for 8 minutes (the step was smaller than the float spacing at 8,550)."""
    lo = 8550.0
    hi = math.nextafter(lo, math.inf)
    assert nice_ticks(lo, hi, 5) in ([lo, hi], [lo])


def test_a_trial_and_the_best_line_a_rounding_apart_get_a_visible_band():
    y = 8550.123
    data = ChartData(unit="tokens/s per device")
    data.points.append(Point(id=1, x=0.001, y=y, kind="baseline", category="baseline", label="#1"))
    data.best.append((0.001, math.nextafter(y, math.inf)))
    lo, hi = data.y_range()
    assert hi - lo > 0.05 * y  # a band around the value, not a span of one float step
    assert 2 <= len(nice_ticks(lo, hi, 5)) <= 6
