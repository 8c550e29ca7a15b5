"""Distillation: what a finished run teaches (:func:`distil` into :class:`Observation` s) and how an observation
folds into a lesson (:func:`fold`), including the reading of a version-1 store's lessons."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from attune.agent.diagnose import diagnose
from attune.agent.lessons.model import (
    Condition,
    Lesson,
    LessonAction,
    Scope,
    Verdict,
    _lesson_id,
    direction_of,
    job_features,
    scope_of,
)
from attune.recipe.model import Recipe
from attune.trial import TrialOutcome, TrialRecord

log = logging.getLogger(__name__)

# -- distillation -----------------------------------------------------------------------------------

class Observation(BaseModel):
    """One observed trial of one knob move, ready to be folded into a lesson.

    ``verdict`` is what the engine made of it: ``accepted`` (the change was kept), ``rejected`` (measured, not
    kept) or ``infeasible`` (the trial failed; ``effect`` is then ``None`` and ``outcome`` says how).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    scope: Scope
    condition: Condition
    action: LessonAction
    effect: float | None = Field(default=None, allow_inf_nan=False)
    verdict: Verdict = "rejected"
    outcome: str = TrialOutcome.SUCCEEDED.value

    @model_validator(mode="after")
    def _effect_matches_verdict(self) -> Observation:
        if self.verdict != "infeasible" and self.effect is None:
            raise ValueError("a measured observation needs its effect (use verdict='infeasible' for a failure)")
        return self


def _gain(rec: TrialRecord) -> float | None:
    return float(rec.gain) if rec.gain is not None and math.isfinite(rec.gain) else None


def distil(baseline: Recipe, records: Sequence[TrialRecord], min_gain: float = 0.02,
           backend: str | None = None) -> list[Observation]:
    """Observations from a run's records: each launched single-move candidate and its confirmation.

    A measured gain counts as ``accepted`` only if the engine accepted that configuration (a record of it with
    ``accepted`` set: the candidate, its confirmation, or the loss check that settled it); any other gain is
    ``rejected`` evidence. A failed trial is ``infeasible``, not an effect.
    """
    scope = scope_of(baseline, backend)
    cat = baseline.catalogue
    accepted = {r.signature for r in records if r.accepted and r.signature}
    best_knobs = dict(baseline.effective_knobs)
    best_rec: TrialRecord | None = next((r for r in records if r.kind == "baseline" and r.measurement
                                         and r.outcome is TrialOutcome.SUCCEEDED), None)
    out: list[Observation] = []
    pending: dict[str, Observation] = {}

    def observed(base: Observation, rec: TrialRecord) -> Observation | None:
        if rec.outcome.failed:
            return base.model_copy(update={"effect": None, "verdict": "infeasible", "outcome": rec.outcome.value})
        g = _gain(rec)
        if rec.outcome is not TrialOutcome.SUCCEEDED or g is None:
            return None
        return base.model_copy(update={"effect": g, "verdict": "accepted" if rec.signature in accepted
                                       else "rejected", "outcome": rec.outcome.value})

    for rec in sorted(records, key=lambda r: r.id):
        if rec.kind == "baseline" or rec.outcome in (TrialOutcome.REFUSED, TrialOutcome.INTERRUPTED,
                                                          TrialOutcome.MISMEASURED) or not rec.change:
            continue
        if rec.kind == "candidate":
            knob, value = next(iter(rec.change.items()))
            if knob in cat:
                parent = baseline.with_knobs(**baseline.knob_changes(best_knobs))
                diag = diagnose(best_rec, parent)
                action = LessonAction(knob=knob, direction=direction_of(cat, knob, best_knobs.get(knob), value),
                                      value=value)
                features = job_features(parent, best_rec.measurement if best_rec is not None else None)
                base = Observation(scope=scope, condition=Condition(bottleneck=diag.bottleneck,
                                                                    evidence=diag.evidence[:3], features=features),
                                   action=action, effect=0.0)
                pending[rec.signature] = base
                obs = observed(base, rec)
                if obs is not None:
                    out.append(obs)
        elif rec.kind in ("confirm", "decision"):
            first = pending.get(rec.signature)
            obs = observed(first, rec) if first is not None else None
            if obs is not None:
                out.append(obs)
        if rec.accepted:
            best_knobs = dict(rec.knobs)
            best_rec = rec
    return out


def fold(lesson: Lesson | None, obs: Observation, run_id: str, min_gain: float = 0.02) -> Lesson:
    """The lesson after one more observation: statuses move and demote by the rules in the module docstring."""
    now = time.time()
    if lesson is None:
        lesson = Lesson(id=_lesson_id(obs.scope, obs.condition.bottleneck, obs.action), scope=obs.scope,
                        condition=obs.condition, action=obs.action, created=now)
    effects, failures = lesson.effects, lesson.failures
    conditions = lesson.effect_conditions
    supporting, inconclusive, counter, infeasible = (lesson.supporting, lesson.inconclusive, lesson.counter,
                                                     lesson.infeasible)
    helps = against = False
    if obs.verdict == "infeasible" or obs.effect is None:
        infeasible += 1
        failures = failures if obs.outcome in failures else (*failures, obs.outcome)
        against = True
    else:
        effects = (*effects, obs.effect)
        conditions = (*conditions, obs.condition.features)
        if obs.effect < min_gain:
            counter += 1
            against = True
        elif obs.verdict == "accepted":
            supporting += 1
            helps = True
        else:  # a gain the engine did not accept: inconclusive at most
            inconclusive += 1
    status, demotions = lesson.status, lesson.demotions
    if lesson.status == "confirmed" and against:
        status, demotions = "hypothesis", demotions + 1
        log.info("lesson %s demoted by a counter-example (%s)", lesson.id,
                 f"{obs.effect * 100:+.1f}%" if obs.effect is not None else obs.outcome)
    elif counter >= 2 and counter > supporting + inconclusive:
        status = "disproven"
    elif helps and supporting >= 2 and (lesson.status != "hypothesis" or demotions == 0
                                        or supporting >= 2 * (counter + infeasible) + 1):
        status = "confirmed"
    runs = lesson.runs if run_id in lesson.runs else (*lesson.runs, run_id)
    return lesson.model_copy(update={
        "effects": effects, "conditions": conditions, "supporting": supporting, "inconclusive": inconclusive, "counter": counter,
        "infeasible": infeasible, "failures": failures, "status": status, "demotions": demotions, "runs": runs,
        "updated": now, "condition": obs.condition if not lesson.condition.evidence else lesson.condition})


def _migrate_v1(item: Any, min_gain: float = 0.02) -> Any:
    """A lesson written by store version 1: failures were effects (−1: OOM, −0.5: other failures) and a lesson
    could be confirmed by gains the engine had rejected. Failures become ``infeasible``; the other effects are
    counter-examples or inconclusive (whether the engine accepted them was not recorded); ``confirmed``
    becomes ``hypothesis`` until accepted changes confirm it again."""
    if not isinstance(item, dict) or "supporting" in item:
        return item
    item = dict(item)
    effects = item.get("effects", [])
    if not isinstance(effects, list) or not all(isinstance(e, (int, float)) for e in effects):
        return item  # let validation report it
    failed = [e for e in effects if e in (-1.0, -0.5)]
    measured = [e for e in effects if e not in (-1.0, -0.5)]
    item["effects"] = measured
    item["infeasible"] = len(failed)
    item["failures"] = ["failed"] if failed else []
    item["counter"] = sum(1 for e in measured if e < min_gain)
    item["inconclusive"] = len(measured) - item["counter"]
    item["supporting"] = 0
    if item.get("status") == "confirmed":
        item["status"] = "hypothesis"
    return item
