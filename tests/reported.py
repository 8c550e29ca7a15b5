"""Helpers for the runtime contract check's tests: a run state whose baseline reported something, and trial
results that report what a test says (the engine's side of the check, any framework)."""

from __future__ import annotations

from typing import Any

from attune.backends.base import TrialResult
from attune.engine.loop import RunState, TuneConfig
from attune.recipe.change import signature
from attune.recipe.model import Recipe
from attune.trial import Measurement, TrialOutcome, TrialRecord


def measured(reported: dict[str, Any]) -> Measurement:
    return Measurement(tokens_per_s_per_device=100.0, tokens_per_s=100.0, step_time_median_s=1.0, step_time_cv=0.0,
                       steps_measured=3, reported=reported)


def succeeded(reported: dict[str, Any]) -> TrialResult:
    """A finished trial whose own log reported ``reported``."""
    return TrialResult(TrialOutcome.SUCCEEDED, measured(reported), 1.0, 1, 0.001)


def baseline_state(recipe: Recipe, result: TrialResult) -> RunState:
    """A run of ``recipe`` whose first (baseline) trial ended as ``result``."""
    state = RunState(baseline=recipe, config=TuneConfig.from_recipe(recipe, 1.0))
    state.records.append(TrialRecord(id=1, kind="baseline", outcome=result.outcome, measurement=result.measurement,
                                     signature=signature(recipe), knobs=recipe.effective_knobs))
    return state
