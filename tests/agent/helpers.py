"""Shared helpers of the agent tests: contexts over real recipes, measurements, a megatron recipe."""

from __future__ import annotations

import copy
from typing import Any

from attune.engine.policy import PolicyContext
from attune.errors import RecipeError
from attune.gate import evaluate
from attune.recipe.change import apply_change, signature
from attune.recipe.io import parse_recipe
from attune.recipe.model import Recipe
from attune.trial import Measurement, TrialOutcome, TrialRecord
from tests.gate.recipes import base


def megatron_recipe(**knobs: Any) -> Recipe:
    data = base("megatron")
    data["knobs"] = dict(knobs)
    return parse_recipe(data)


def measurement(step: float = 1.0, phases: dict[str, float] | None = None, signals: dict[str, float] | None = None,
                peak_mb: float | None = None) -> Measurement:
    return Measurement(tokens_per_s_per_device=1000.0 / max(step, 1e-9), tokens_per_s=2000.0 / max(step, 1e-9),
                       step_time_median_s=step,
                       step_time_cv=0.01, steps_measured=4, phases=phases or {}, signals=signals or {},
                       peak_memory_mb=peak_mb)


def context(recipe: Recipe, records: list[TrialRecord] | None = None, best: Recipe | None = None,
            noise: float = 0.03) -> PolicyContext:
    best = best or recipe
    records = list(records or [])
    tried = {r.signature for r in records if r.signature}
    history = [recipe.with_knobs(**r.knobs) for r in records if r.knobs]

    def admissible(change: dict[str, Any]) -> bool:
        try:
            cand = apply_change(best, change)
        except RecipeError:  # the change makes an invalid recipe
            return False
        return signature(cand) not in tried and evaluate(recipe, cand, history, parent=best).admitted

    space = recipe.tuning.search_space or tuple(n for n, k in recipe.catalogue.knobs.items() if len(k.values) > 1)
    bm = next((r.measurement for r in reversed(records) if r.measurement), None)
    return PolicyContext(baseline=recipe, best=best, best_measurement=bm, records=tuple(records),
                         search_space=space, noise_floor=noise, budget_left_hours=1.0, admissible=admissible)


def baseline_record(recipe: Recipe, m: Measurement | None = None, rid: int = 1) -> TrialRecord:
    return TrialRecord(id=rid, kind="baseline", knobs=recipe.effective_knobs, signature=signature(recipe),
                       outcome=TrialOutcome.SUCCEEDED, measurement=m or measurement(), charged_hours=0.01)


def copy_dict(d: dict[str, Any]) -> dict[str, Any]:
    return copy.deepcopy(d)
