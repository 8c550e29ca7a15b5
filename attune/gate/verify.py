"""The running half of the loss-equivalence check: train baseline, an equivalent layout and the candidate.

All three runs use the same seed and data order for the same number of steps. The baseline and its
equivalent re-layout (another micro-batch split, which only reorders sums) measure how far rounding
alone moves the loss on this machine and model; :func:`~attune.gate.equivalence.derive_tolerance` turns
that into a per-step band, and the candidate must stay inside it. The static gate runs first unless a
test bypasses it (``static=False``) to prove the empirical check catches contract changes on its own.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from attune.gate.equivalence import (
    EquivalenceResult,
    ReorderBound,
    compare_losses,
    derive_tolerance,
    first_step_problem,
)
from attune.gate.rules import equivalent_layout, evaluate
from attune.gate.verdict import Verdict
from attune.recipe.change import apply_change, signature
from attune.recipe.io import parse_recipe
from attune.recipe.model import RANDOM_STREAM, Recipe
from attune.trial import MAX_REMEASURES, Measurement, TrialBackend, TrialOutcome, TrialRequest, TrialResult

log = logging.getLogger(__name__)


class VerifyResult(BaseModel):
    """What ``attune gate verify`` found."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    passed: bool
    reason: str
    verdict: dict[str, Any] | None = Field(default=None, description="the static verdict (None when bypassed)")
    equivalence: EquivalenceResult | None = None
    reference_losses: list[float] = Field(default_factory=list)
    drift_losses: list[float] = Field(default_factory=list)
    candidate_losses: list[float] = Field(default_factory=list)
    drift_change: dict[str, Any] = Field(default_factory=dict)
    first_step: str | None = Field(default=None, description="why a run's first logged loss was not the baseline's "
                                                             "up to reordering (None: every first step agreed)")
    tolerance_max: float | None = None
    charged_hours: float = 0.0


def first_step_bound_for(recipe: Recipe, reference: Measurement, *others: Measurement) -> ReorderBound:
    """What reordering the sums can move ``recipe``'s first logged loss by: the reference run's tokens per step,
    the framework's compute precision, and the coarsest print resolution of the first losses compared."""
    fw = recipe.framework_impl
    n_terms = 1
    if reference.tokens_per_s > 0 and reference.step_time_median_s > 0:
        n_terms = max(1, round(reference.tokens_per_s * reference.step_time_median_s))
    resolution = max((fw.loss_resolution(recipe, m.losses[0], m.reported) or 0.0
                      for m in (reference, *others) if m.losses and math.isfinite(m.losses[0])), default=0.0)
    return ReorderBound(n_terms=n_terms, precision=fw.compute_precision(recipe), resolution=resolution)


def _losses(result: TrialResult) -> list[float]:
    return list(result.measurement.losses) if result.measurement else []


def verify(baseline: Recipe, candidate: Recipe | dict[str, Any], *, backend: TrialBackend, steps: int,
           run_dir: str | Path, static: bool = True, timeout_s: float = 600.0) -> VerifyResult:
    """Run the empirical loss-equivalence check of ``candidate`` against ``baseline``."""
    run_dir = Path(run_dir)
    verdict: Verdict | None = None
    if static:
        verdict = evaluate(baseline, candidate)
        if not verdict.admitted:
            return VerifyResult(passed=False, verdict=verdict.to_dict(),
                                reason="refused by the static gate: " + "; ".join(r.message for r in verdict.reasons))
    cand = candidate if isinstance(candidate, Recipe) else parse_recipe(candidate, "candidate")
    # the drift reference is never the candidate itself: its own curve would set the band it is judged by
    drift_change = equivalent_layout(baseline, avoid=(signature(cand),))
    if drift_change is None:
        return VerifyResult(passed=False, reason="the baseline has no equivalent re-layout other than the candidate "
                                                 "itself to measure drift with",
                            verdict=verdict.to_dict() if verdict else None)
    runs: dict[str, TrialResult] = {}
    for i, (name, recipe) in enumerate((("reference", baseline), ("drift", apply_change(baseline, drift_change)),
                                        ("candidate", cand))):
        for attempt in range(1 + MAX_REMEASURES):  # a measurement fault is the measurement's, not the recipe's
            runs[name] = backend.loss_curve(recipe, TrialRequest(
                trial_id=i, trial_dir=run_dir / (name if not attempt else f"{name}-again{attempt}"), warmup_steps=0,
                measure_steps=steps, timeout_s=timeout_s))
            if runs[name].outcome is not TrialOutcome.MISMEASURED:
                break
        log.info("%s: %s", name, runs[name].outcome.value)
    hours = sum(r.charged_hours for r in runs.values())
    common: dict[str, Any] = dict(verdict=verdict.to_dict() if verdict else None, drift_change=drift_change,
                                  reference_losses=_losses(runs["reference"]), drift_losses=_losses(runs["drift"]),
                                  candidate_losses=_losses(runs["candidate"]), charged_hours=hours)
    for name in ("reference", "drift"):
        if runs[name].outcome is not TrialOutcome.SUCCEEDED:
            return VerifyResult(passed=False, reason=f"the {name} run failed ({runs[name].outcome.value}: "
                                                     f"{runs[name].message})", **common)
    if runs["candidate"].outcome not in (TrialOutcome.SUCCEEDED, TrialOutcome.DIVERGED):
        return VerifyResult(passed=False, reason=f"the candidate run failed ({runs['candidate'].outcome.value}: "
                                                 f"{runs['candidate'].message})", **common)
    ref_m, drift_m, cand_m = (runs[k].measurement for k in ("reference", "drift", "candidate"))
    if ref_m is not None and drift_m is not None and cand_m is not None \
            and RANDOM_STREAM not in baseline.numerics_opt_in:
        bound = first_step_bound_for(baseline, ref_m, drift_m, cand_m)
        problem = first_step_problem(ref_m.losses, drift_m.losses, bound)
        if problem is not None:
            # a reference that trains on other samples or another random stream cannot calibrate a band: the
            # baseline once more is the drift reference (its run-to-run drift)
            log.info("drift reference set aside: %s", problem)
            again = backend.loss_curve(baseline, TrialRequest(trial_id=3, trial_dir=run_dir / "reference-again",
                                                              warmup_steps=0, measure_steps=steps,
                                                              timeout_s=timeout_s))
            common["charged_hours"] += again.charged_hours
            common["drift_change"] = {}
            common["drift_losses"] = _losses(again)
            if again.outcome is not TrialOutcome.SUCCEEDED:
                return VerifyResult(passed=False, reason=f"the drift reference {drift_change} {problem}, and the "
                                                         f"baseline's second run failed ({again.outcome.value})",
                                    **common)
            problem = first_step_problem(ref_m.losses, common["drift_losses"], bound)
            if problem is not None:
                return VerifyResult(passed=False, reason=f"the baseline's own runs differ at their first step: "
                                                         f"{problem}; the job does not repeat itself, so no change "
                                                         "can be shown to train the same model",
                                    first_step=problem, **common)
        problem = first_step_problem(ref_m.losses, cand_m.losses, bound)
        if problem is not None:
            return VerifyResult(passed=False, reason="the change draws another random stream or other samples, or "
                                                     f"the job prints another quantity: {problem}",
                                first_step=problem, **common)
    tol = derive_tolerance([common["reference_losses"], common["drift_losses"]])
    if ref_m is not None and RANDOM_STREAM not in baseline.numerics_opt_in:
        tol = tol.capped(first_step_bound_for(baseline, ref_m, *(m for m in (drift_m, cand_m) if m)),
                         common["reference_losses"])
    eq = compare_losses(common["reference_losses"], common["candidate_losses"], tol)
    return VerifyResult(passed=eq.passed, reason=eq.reason, equivalence=eq, tolerance_max=max(tol.per_step), **common)
