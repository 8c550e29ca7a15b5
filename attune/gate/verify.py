"""The running half of the loss-equivalence check: train baseline, an equivalent layout and the candidate.

All three runs use the same seed and data order for the same number of steps. The baseline and its
equivalent re-layout (another micro-batch split, which only reorders sums) measure how far rounding
alone moves the loss on this machine and model; :func:`~attune.gate.equivalence.derive_tolerance` turns
that into a per-step band, and the candidate must stay inside it. The static gate runs first unless a
test bypasses it (``static=False``) to prove the empirical check catches contract changes on its own.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from attune.gate.equivalence import EquivalenceResult, compare_losses, derive_tolerance
from attune.gate.rules import equivalent_layout, evaluate
from attune.gate.verdict import Verdict
from attune.recipe.change import apply_change, signature
from attune.recipe.io import parse_recipe
from attune.recipe.model import Recipe
from attune.trial import TrialBackend, TrialOutcome, TrialRequest, TrialResult

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
    tolerance_max: float | None = None
    charged_hours: float = 0.0


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
        runs[name] = backend.loss_curve(recipe, TrialRequest(trial_id=i, trial_dir=run_dir / name, warmup_steps=0,
                                                             measure_steps=steps, timeout_s=timeout_s))
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
    tol = derive_tolerance([common["reference_losses"], common["drift_losses"]])
    eq = compare_losses(common["reference_losses"], common["candidate_losses"], tol)
    return VerifyResult(passed=eq.passed, reason=eq.reason, equivalence=eq, tolerance_max=max(tol.per_step), **common)
