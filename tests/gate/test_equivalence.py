"""Loss-equivalence arithmetic on synthetic curves."""

from __future__ import annotations

import math
import random

import pytest

from attune.gate import Tolerance, compare_losses, derive_tolerance
from attune.gate.equivalence import EPSILON


def curve(steps: int = 50, *, lr_scale: float = 1.0, drift: float = 0.0, seed: int = 0) -> list[float]:
    """A decaying loss curve; ``drift`` adds a random walk of rounding-like noise growing like sqrt(step)."""
    rng = random.Random(seed)
    walk, out = 0.0, []
    for t in range(steps):
        walk += rng.gauss(0.0, drift)
        out.append(2.0 + 6.0 * math.exp(-0.05 * lr_scale * t) + walk)
    return out


def test_identical_curves_pass() -> None:
    ref = curve()
    result = compare_losses(ref, list(ref), Tolerance.constant(1e-6, len(ref)))
    assert result.passed and result.max_abs_diff == 0.0 and result.failures == 0


def test_derived_band_admits_a_new_equivalent_run_and_refuses_a_changed_objective() -> None:
    drift = 1e-4
    tol = derive_tolerance([curve(drift=drift, seed=s) for s in (1, 2, 3)])
    assert tol.runs == 3 and all(b >= a for a, b in zip(tol.per_step, tol.per_step[1:]))  # monotone envelope
    ref = curve(drift=drift, seed=1)
    passes = sum(compare_losses(ref, curve(drift=drift, seed=s), tol).passed for s in range(10, 30))
    assert passes >= 19  # an equivalent layout practically never fails
    changed = compare_losses(ref, curve(lr_scale=1.1, drift=drift, seed=4), tol)  # a 10 % different learning rate
    assert not changed.passed and changed.first_failure is not None and "step" in changed.reason


def test_floor_keeps_bit_identical_calibration_from_collapsing_to_zero() -> None:
    ref = curve()
    tol = derive_tolerance([ref, list(ref)], n_terms=2048)
    assert all(t > 0 for t in tol.per_step)
    expected_last = 3.0 * EPSILON["fp32"] * max(abs(ref[-1]), abs(ref[-1])) * math.sqrt(2048) * math.sqrt(len(ref))
    assert tol.per_step[-1] == pytest.approx(expected_last)
    assert tol.per_step[-1] > tol.per_step[0]  # grows like sqrt(step)
    nudged = [x * (1 + 1e-7) for x in ref]  # one float32 ulp-ish of reordering
    assert compare_losses(ref, nudged, tol).passed


def test_tolerance_extrapolates_with_sqrt_growth() -> None:
    tol = Tolerance(per_step=(1.0, 2.0))
    assert tol.at(1) == 2.0 and tol.at(7) == pytest.approx(2.0 * math.sqrt(8 / 2))
    with pytest.raises(ValueError):
        tol.at(-1)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_candidate_fails(bad: float) -> None:
    ref = curve(10)
    cand = list(ref)
    cand[4] = bad
    result = compare_losses(ref, cand, Tolerance.constant(1.0, 10))
    assert not result.passed and result.first_failure == 4 and "diverged" in result.reason


def test_non_finite_reference_fails_and_blames_the_baseline() -> None:
    ref = curve(10)
    ref[0] = math.nan
    result = compare_losses(ref, curve(10), Tolerance.constant(1.0, 10))
    assert not result.passed and "baseline" in result.reason


def test_length_mismatch_and_empty_fail() -> None:
    assert "steps" in compare_losses(curve(10), curve(9), Tolerance.constant(1.0, 10)).reason
    assert not compare_losses([], [], Tolerance.constant(1.0, 1)).passed


def test_per_step_diffs_and_relative_diffs() -> None:
    ref, cand = [2.0, 4.0, 8.0], [2.0, 4.4, 8.0]
    result = compare_losses(ref, cand, Tolerance(per_step=(0.1, 0.1, 0.1)))
    assert not result.passed and result.first_failure == 1 and result.failures == 1
    assert result.abs_diff[1] == pytest.approx(0.4) and result.rel_diff[1] == pytest.approx(0.1)
    assert result.max_abs_diff == pytest.approx(0.4) and result.worst_step == 1 and result.worst_ratio > 1
    ok = compare_losses(ref, cand, Tolerance(per_step=(0.1, 0.5, 0.1)))
    assert ok.passed and "within tolerance" in ok.reason


@pytest.mark.parametrize("runs", [[], [[1.0, 2.0]], [[1.0, 2.0], [1.0]], [[1.0, math.nan], [1.0, 2.0]], [[], []]])
def test_derive_tolerance_rejects_unusable_runs(runs: list[list[float]]) -> None:
    with pytest.raises(ValueError):
        derive_tolerance(runs)


def test_derive_tolerance_rejects_bad_parameters() -> None:
    runs = [curve(5), curve(5, drift=1e-3)]
    for kwargs in ({"safety_factor": 0}, {"epsilon": -1.0}, {"n_terms": 0}):
        with pytest.raises(ValueError):
            derive_tolerance(runs, **kwargs)


def test_all_zero_losses_still_get_room() -> None:
    tol = derive_tolerance([[0.0] * 4, [0.0] * 4])
    assert all(t > 0 for t in tol.per_step)
