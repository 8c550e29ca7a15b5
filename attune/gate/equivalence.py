"""The pure half of the empirical loss-equivalence check: derive a tolerance, compare two loss curves.

A change the gate classes as ``numerics_drift`` (a new micro-batch split, layout, fused kernel, compile)
computes the same function with its floating-point sums in a different order. Bit-equality is not
promised across such changes, so the gate asks for evidence instead: the candidate's loss curve must stay
within a per-step band of the baseline's. This module holds only arithmetic on loss lists; running the
trainer to obtain the curves lives elsewhere.

How wide is the band? Not a magic constant: it is **measured**. :func:`derive_tolerance` takes loss
curves of runs that are known to be equivalent (the same recipe under two or more layouts the gate admits
as preserving or drifting, e.g. one process versus two data-parallel processes), and builds:

1. the per-step *spread* ``d_t = max_i L_i(t) - min_i L_i(t)``: how far equivalent executions of the same
   training actually drift apart at step ``t`` on this machine, model and data;
2. its *running maximum* ``e_t = max_{s<=t} d_s``: rounding differences are amplified by training and do
   not systematically cancel later, so a step where the curves happen to cross must not become a
   needle's eye; the running maximum is a monotone envelope of the drift seen so far;
3. a *floor* ``f_t = eps · |L(t)| · sqrt(n_terms) · sqrt(t + 1)``: reordering a sum of ``n_terms`` values of
   size ``|L|`` moves it by about ``eps·sqrt(n)·|L|`` (the standard random-rounding model), and
   independent per-step perturbations accumulate like a random walk, ``sqrt(t + 1)``. The floor keeps the
   band from collapsing to zero when the measured runs happen to agree bit for bit (small models on a
   deterministic CPU), which would otherwise fail every legitimate reordering. ``eps`` is the machine
   epsilon of the dtype the loss is *accumulated* in (fp32 even under bf16 autocast);
4. ``tol_t = safety_factor · max(e_t, f_t)``. The safety factor (default 3) covers what a handful of
   measured runs cannot show: a new pair of equivalent runs is one more draw from the drift distribution,
   and with two or three reference runs the observed spread underestimates its tail. Under a Gaussian
   drift model the running maximum of pair spreads over a dozen steps sits near two standard deviations
   of a pair difference; three times that leaves a new pair about six standard deviations of room, so a
   false refusal is rare while a real change of the objective (a different batch, learning rate or
   vocabulary moves the loss by far more than rounding drift) is still caught.

Past the last measured step the band keeps the random-walk growth: ``tol_t = tol_{T-1} · sqrt((t+1)/T)``.

**The first step proves the reference.** A band is only as good as the runs it was measured from: a "drift
reference" that trains on other samples (an evaluation that draws from the training generator, so another batch
shape shifts every later draw), draws another random stream (dropout masks laid out per micro-batch) or prints
another quantity (the last micro-step's loss rather than the step's mean) differs from the baseline by far more
than rounding, and a band calibrated on it admits exactly the difference it should catch. Before any optimizer
update the weights are identical, so a change that only reorders floating-point sums moves the first logged loss
by no more than reordering can explain (:class:`ReorderBound`): the runs that calibrate a band and every
candidate must pass :func:`first_step_problem` first. A reference that fails calibrates nothing; a candidate that
fails changes the random stream or the data, whatever its later curve does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

#: machine epsilon (spacing of floats just above 1.0) of the dtypes a loss can be accumulated in
EPSILON = {"fp32": 2.0**-23, "bf16": 2.0**-7, "fp16": 2.0**-10, "fp8": 2.0**-3, "fp64": 2.0**-52}


class Tolerance(BaseModel):
    """A per-step absolute band for the difference between a candidate's and the reference's loss."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    per_step: tuple[float, ...] = Field(min_length=1, description="allowed |candidate - reference| at each step")
    safety_factor: float = Field(default=3.0, gt=0, description="multiplier applied to the measured envelope")
    runs: int = Field(default=0, ge=0, description="how many equivalent runs the band was measured from")
    basis: str = Field(default="", description="how the band was derived, for reports")

    def at(self, step: int) -> float:
        """The tolerance at ``step`` (0-based); past the measured steps it grows like ``sqrt(step + 1)``."""
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        n = len(self.per_step)
        if step < n:
            return self.per_step[step]
        return self.per_step[-1] * math.sqrt((step + 1) / n)

    def capped(self, bound: ReorderBound, reference: Sequence[float]) -> Tolerance:
        """This band, never wider at any step of ``reference`` (the baseline's losses) than ``bound`` allows there:
        measured drift may narrow the band below what reordering explains, never widen it past that."""
        per_step = tuple(min(self.at(t), bound.at(float(x), t)) if math.isfinite(float(x)) else self.at(t)
                         for t, x in enumerate(reference))
        if not per_step or per_step == tuple(self.at(t) for t in range(len(per_step))):
            return self
        return self.model_copy(update={"per_step": per_step,
                                       "basis": f"{self.basis}, capped at what reordering explains "
                                                f"({bound.describe(float(reference[0]))} at the first step, growing "
                                                "like sqrt(step+1))"})

    @classmethod
    def constant(cls, value: float, steps: int, basis: str = "constant band (tests and overrides only)") -> Tolerance:
        """A flat band of ``value`` for ``steps`` steps; prefer :func:`derive_tolerance` for real checks."""
        return cls(per_step=(float(value),) * steps, safety_factor=1.0, runs=0, basis=basis)


class EquivalenceResult(BaseModel):
    """The outcome of comparing a candidate loss curve with the reference curve."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    passed: bool = Field(description="true when every step is finite and within its tolerance")
    reason: str = Field(description="why it passed or failed, naming the step and the numbers")
    steps: int = Field(description="steps compared")
    abs_diff: tuple[float, ...] = Field(default=(), description="|candidate - reference| per step")
    rel_diff: tuple[float, ...] = Field(default=(), description="abs_diff / |reference| per step")
    tolerance: tuple[float, ...] = Field(default=(), description="the band applied at each step")
    max_abs_diff: float = Field(default=math.nan, description="largest abs_diff")
    max_rel_diff: float = Field(default=math.nan, description="largest rel_diff")
    worst_step: int | None = Field(default=None, description="step using the largest share of its tolerance")
    worst_ratio: float = Field(default=math.nan, description="abs_diff / tolerance at worst_step (>1 fails)")
    first_failure: int | None = Field(default=None, description="first step out of tolerance or non-finite")
    failures: int = Field(default=0, description="steps out of tolerance")


class ReorderBound(BaseModel):
    """How far reordering floating-point sums can move a logged loss: at the first step, before any update, and, by
    the random-walk growth of independent per-step perturbations, at later ones.

    With identical weights, a layout that only regroups the same samples changes two things: the order of the
    loss's reduction over ``n_terms`` values (tokens of the step), which moves a sum by about
    ``eps_accum · sqrt(n_terms) · |L|`` (the random-rounding model, as in :func:`derive_tolerance`), and the
    rounding of the forward pass under another batch shape, which a reduced-precision forward makes at most about
    one unit of its precision on the loss (the per-token errors average over the tokens). Later steps add such
    perturbations independently (``sqrt(step + 1)``, the floor of :func:`derive_tolerance`). The printed value adds
    its own quantisation: two values that reach attune rounded to ±``resolution`` can differ by twice that. So::

        bound(step) = safety · |L| · (eps_accum · sqrt(n_terms) + eps_compute) · sqrt(step + 1) + 2 · resolution

    with ``eps_accum`` fp32's (losses are reduced in fp32, even under bf16 autocast) and ``eps_compute`` that of
    the precision the forward runs in. The safety factor (3) is the same as the band's. A band drawn from measured
    drift is capped by it (:meth:`Tolerance.capped`): a reference that passed its first step yet drifts further
    than reordering can explain cannot widen the band past what reordering explains.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    n_terms: int = Field(default=1, ge=1, description="values one step's loss reduces (its tokens)")
    precision: str = Field(default="fp32", description="the precision the forward runs in (a key of EPSILON)")
    resolution: float = Field(default=0.0, ge=0, description="half the last unit of the losses as they reached "
                                                              "attune (0: full precision)")
    safety_factor: float = Field(default=3.0, gt=0)

    def at(self, loss: float, step: int = 0) -> float:
        """The largest difference from a baseline loss of ``loss`` at ``step`` (0-based) that reordering explains."""
        eps_compute = EPSILON.get(self.precision, EPSILON["fp32"])
        return (self.safety_factor * abs(loss) * (EPSILON["fp32"] * math.sqrt(self.n_terms) + eps_compute)
                * math.sqrt(step + 1) + 2.0 * self.resolution)

    def describe(self, loss: float) -> str:
        seen = f", losses printed to ±{self.resolution:.1e}" if self.resolution else ""
        return (f"{self.at(loss):.2e} (what reordering the sums of {self.n_terms} values can explain at "
                f"{self.precision}{seen})")


def first_step_problem(reference: Sequence[float], other: Sequence[float], bound: ReorderBound) -> str | None:
    """Why ``other``'s first logged loss is not the reference's up to reordering (see :class:`ReorderBound`);
    None where it is. A curve without a finite first loss cannot show it."""
    if not reference or not other:
        return "no first-step loss to compare"
    ref, oth = float(reference[0]), float(other[0])
    if not (math.isfinite(ref) and math.isfinite(oth)):
        return f"the first logged loss is {oth if math.isfinite(ref) else ref}, not a number to compare"
    diff, allowed = abs(oth - ref), bound.at(ref)
    if diff <= allowed:
        return None
    times = f"{diff / allowed:.0f}× " if allowed > 0 else ""
    return (f"the first logged loss, before any update, differs by {diff:.3g} ({oth:.6g} against the baseline's "
            f"{ref:.6g}), {times}the {bound.describe(ref)}")


def _first_nonfinite(values: Sequence[float]) -> int | None:
    for i, v in enumerate(values):
        if not math.isfinite(v):
            return i
    return None


def compare_losses(reference: Sequence[float], candidate: Sequence[float], tolerance: Tolerance) -> EquivalenceResult:
    """Compare ``candidate`` with ``reference`` step by step against ``tolerance``.

    Fails when either curve is empty, the lengths differ, any loss is NaN/Inf, or any step's absolute
    difference exceeds ``tolerance.at(step)``.
    """
    ref, cand = [float(x) for x in reference], [float(x) for x in candidate]
    if not ref or not cand:
        return EquivalenceResult(passed=False, steps=0,
                                 reason=f"nothing to compare: reference has {len(ref)} steps, candidate "
                                        f"{len(cand)}; run both for the same number of steps")
    if len(ref) != len(cand):
        return EquivalenceResult(passed=False, steps=min(len(ref), len(cand)),
                                 reason=f"reference has {len(ref)} steps but candidate has {len(cand)}; run the "
                                        "candidate for exactly the reference's steps")
    bad = _first_nonfinite(ref)
    if bad is not None:
        return EquivalenceResult(passed=False, steps=len(ref), first_failure=bad,
                                 reason=f"reference loss is {ref[bad]} at step {bad}: the baseline run itself "
                                        "diverged; re-run the baseline before checking candidates")
    bad = _first_nonfinite(cand)
    if bad is not None:
        return EquivalenceResult(passed=False, steps=len(cand), first_failure=bad,
                                 reason=f"candidate loss is {cand[bad]} at step {bad} (reference {ref[bad]:.6g}): "
                                        "the candidate diverged")
    tol = [tolerance.at(i) for i in range(len(ref))]
    absd = [abs(c - r) for c, r in zip(cand, ref)]
    reld = [d / abs(r) if r != 0 else (0.0 if d == 0 else math.inf) for d, r in zip(absd, ref)]
    ratios = [d / t if t > 0 else (0.0 if d == 0 else math.inf) for d, t in zip(absd, tol)]
    worst = max(range(len(ratios)), key=ratios.__getitem__)
    failing = [i for i, x in enumerate(ratios) if x > 1.0]
    common: dict[str, Any] = dict(
        steps=len(ref), abs_diff=tuple(absd), rel_diff=tuple(reld), tolerance=tuple(tol),
        max_abs_diff=max(absd), max_rel_diff=max(reld), worst_step=worst, worst_ratio=ratios[worst],
        failures=len(failing))
    if failing:
        i = failing[0]
        reason = (f"loss at step {i} differs by {absd[i]:.3g} (candidate {cand[i]:.6g}, reference {ref[i]:.6g}, "
                  f"relative {reld[i]:.3g}), above the tolerance {tol[i]:.3g} derived from run-to-run drift; "
                  f"{len(failing)} of {len(ref)} steps out of tolerance, worst at step {worst} "
                  f"({ratios[worst]:.2f}× its tolerance). The change does not train the same model")
        return EquivalenceResult(passed=False, reason=reason, first_failure=i, **common)
    reason = (f"all {len(ref)} steps within tolerance; worst step {worst} differs by {absd[worst]:.3g} "
              f"({100 * ratios[worst]:.0f}% of its tolerance {tol[worst]:.3g})")
    return EquivalenceResult(passed=True, reason=reason, **common)


def derive_tolerance(
    drift_runs: Sequence[Sequence[float]],
    *,
    safety_factor: float = 3.0,
    epsilon: float = EPSILON["fp32"],
    n_terms: int = 1,
) -> Tolerance:
    """A per-step tolerance from the measured drift between equivalent runs of the same recipe.

    ``drift_runs`` are loss curves (same steps, at least two) of the same recipe under layouts known to
    be equivalent; ``epsilon`` is the machine epsilon of the loss accumulation dtype (see ``EPSILON``);
    ``n_terms`` is how many values one loss reduction sums (e.g. tokens per step), which scales the floor.
    See the module docstring for the reasoning. Raises ``ValueError`` for unusable input.
    """
    runs = [[float(x) for x in run] for run in drift_runs]
    if len(runs) < 2:
        raise ValueError(f"derive_tolerance needs at least 2 equivalent runs to measure drift, got {len(runs)}; "
                         "run the baseline under a second equivalent layout")
    lengths = {len(r) for r in runs}
    if len(lengths) != 1 or 0 in lengths:
        raise ValueError(f"drift runs must have the same, non-zero number of steps; got lengths "
                         f"{[len(r) for r in runs]}")
    for k, run in enumerate(runs):
        bad = _first_nonfinite(run)
        if bad is not None:
            raise ValueError(f"drift run {k} has loss {run[bad]} at step {bad}; a diverged run cannot calibrate "
                             "the tolerance, re-run it")
    if not (safety_factor > 0 and math.isfinite(safety_factor)):
        raise ValueError(f"safety_factor must be a positive number, got {safety_factor}")
    if not (epsilon > 0 and math.isfinite(epsilon)):
        raise ValueError(f"epsilon must be a positive number, got {epsilon}")
    if n_terms < 1:
        raise ValueError(f"n_terms must be >= 1, got {n_terms}")
    steps = lengths.pop()
    per_step: list[float] = []
    envelope = 0.0
    for t in range(steps):
        column = [run[t] for run in runs]
        envelope = max(envelope, max(column) - min(column))
        magnitude = max(abs(x) for x in column)
        floor = epsilon * magnitude * math.sqrt(n_terms) * math.sqrt(t + 1)
        per_step.append(safety_factor * max(envelope, floor))
    if per_step[-1] == 0.0:  # every loss is exactly zero: fall back to epsilon-scale absolute room
        per_step = [safety_factor * epsilon * math.sqrt(t + 1) for t in range(steps)]
    basis = (f"{safety_factor:g} × max(running max of the spread of {len(runs)} equivalent runs, "
             f"eps {epsilon:.3g} × |loss| × sqrt({n_terms}) × sqrt(step+1))")
    return Tolerance(per_step=tuple(per_step), safety_factor=safety_factor, runs=len(runs), basis=basis)
