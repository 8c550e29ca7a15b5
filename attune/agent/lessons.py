"""The lessons store: structured, user-owned lessons distilled from finished tuning runs.

A lesson says: *in this scope* (framework, model family, size bucket, accelerator, scale and the backend
whose trials measured it), *when this bottleneck shows*, *moving this knob this way* had *these measured
effects*. The evidence is counted by what the engine made of each trial:

- **supporting**: a gain of a change the engine *accepted* (the trial's record, or the loss check that
  settled it, says ``accepted``);
- **inconclusive**: a gain the engine rejected (within the noise floor, or it did not hold on a re-run);
- **counter**: a measured gain below ``min_gain``;
- **infeasible**: the trial failed (OOM, crash, timeout, divergence). A failure is not an effect value.

The status moves ``hypothesis → confirmed`` when at least two supporting measurements agree, is **demoted**
back to ``hypothesis`` by a counter-example or a failure, and becomes ``disproven`` when counter-examples
outnumber the rest. A lesson whose move failed (and that is not confirmed) is *infeasible*: the playbook
avoids that move in scope.

**A lesson is evidence with a scope, not an order.** Each measured effect is stored with the conditions it was
measured under (:func:`job_features`: the diagnosed bottleneck and the share of the step each phase took, memory
headroom, MFU, model size and shape, sequence length, scale and accelerator). On a new job,
:func:`estimate` weighs every effect by how alike its conditions are to what this job's own trials measure
(:func:`similarity`) and shrinks the weighted mean toward the playbook's own prior by the weight of that
evidence: many lessons from unlike jobs weigh almost nothing, so they converge to "no effect", not to a wrong
order. The playbook tries a move a lesson raised at most once per run, and drops the lessons of a knob as soon as
this run measures a counter-example. A lesson that never paid in :data:`FORGET_AFTER_RUNS` runs (no accepted gain, a mean below ``min_gain``) is
forgotten.

**Noise records.** Each run also leaves the run-to-run noise it measured (:class:`NoiseRecord`: the pooled log-sd of
what it ran more than once, and its degrees of freedom). A later run on the same cluster (framework, backend,
accelerator and scale: :func:`noise_in_scope`) starts with their pool as a noise prior (:func:`noise_prior_overrides`),
which the engine weighs against the run's own runs (``RunNoise.with_prior``).

Lessons steer only runs of the same framework and of the same kind of backend (another accelerator weighs less,
and never prunes): simulated
lessons (backend ``sim``) never steer a real run unless asked (``include_simulated``); lessons recorded before
backends were recorded are of unknown provenance and count as simulated.

The store is one JSON file the user controls: ``$ATTUNE_LESSONS``, or
``platformdirs.user_data_dir("attune")/lessons.json``; ``attune lessons list|show|forget`` edits it. Every
read-modify-write holds an ``flock`` on ``lessons.json.lock`` and re-reads the file under it, and the file is
replaced atomically (temporary file in the same directory, fsync, ``os.replace``), so concurrent runs lose
nothing. A file that cannot be read back is never overwritten: it is moved aside to
``lessons.json.corrupt-<time>`` (with a warning) and its readable lessons are kept.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import math
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from attune.agent.diagnose import diagnose
from attune.errors import AttuneError
from attune.recipe.catalogue import KnobValue
from attune.recipe.model import Recipe
from attune.trial import TrialOutcome, TrialRecord

log = logging.getLogger(__name__)

Status = Literal["hypothesis", "confirmed", "disproven"]
#: what the engine made of one observed trial
Verdict = Literal["accepted", "rejected", "infeasible"]
#: backends whose trials are simulated, not measured on hardware
SIMULATED_BACKENDS = frozenset({"sim"})
#: scope match at or above which an infeasible lesson prunes its move outright
INFEASIBLE_PRUNE_MATCH = 0.85
STORE_VERSION = 2
FORGET_AFTER_RUNS = 3
"""A lesson measured in this many runs without one accepted gain (and no failure to warn of) is forgotten."""
PRIOR_WEIGHT = 2.0
"""How many perfectly alike measurements the playbook's own prior counts as, against a lesson's evidence."""
MIN_EVIDENCE = 0.15
"""Similarity-weighted evidence below this changes nothing (unlike jobs stay out of the way)."""
UNKNOWN_SIMILARITY = 0.2
"""Similarity of an effect recorded without its conditions (an older attune version's lesson)."""


class LessonStoreError(AttuneError):
    """The lessons file cannot be read or written (permissions, a full disk...)."""


def backend_kind(name: str | None) -> Literal["real", "simulated", "unknown"]:
    """``simulated`` for the simulator's backends, ``unknown`` when not recorded, else ``real``."""
    if not name:
        return "unknown"
    return "simulated" if name in SIMULATED_BACKENDS else "real"


class Scope(BaseModel):
    """Where a lesson applies."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    framework: str
    model_family: str
    size_bucket: str
    accelerator: str
    scale: str
    backend: str = Field(default="", description="backend whose trials measured it (sim: simulated); "
                                                 "empty: not recorded (lessons of older attune versions)")

    def key(self) -> str:
        base = f"{self.framework}/{self.model_family}/{self.size_bucket}/{self.accelerator}/{self.scale}"
        return f"{base}@{self.backend}" if self.backend else base


class Condition(BaseModel):
    """When a lesson applies: the diagnosed bottleneck and the evidence seen."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    bottleneck: str
    evidence: tuple[str, ...] = ()
    features: dict[str, float] = Field(default_factory=dict, description="the measured conditions (job_features)")


class LessonAction(BaseModel):
    """What was done: one knob moved in a direction (up, down, enable, disable, set) to a value."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    knob: str
    direction: str
    value: KnobValue = None


class Lesson(BaseModel):
    """One structured lesson with its measured effects, its evidence counts and status."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    scope: Scope
    condition: Condition
    action: LessonAction
    effects: tuple[float, ...] = Field(default=(), description="relative throughput gains measured (failed "
                                                               "trials are counted in `infeasible` instead)")
    conditions: tuple[dict[str, float], ...] = Field(
        default=(), description="the measured conditions of each effect, in the same order (job_features); older "
                                "lessons have none")
    supporting: int = Field(default=0, ge=0, description="gains of changes the engine accepted")
    inconclusive: int = Field(default=0, ge=0, description="gains the engine rejected (noise, did not hold)")
    counter: int = Field(default=0, ge=0, description="measured gains below min_gain")
    infeasible: int = Field(default=0, ge=0, description="trials of this move that failed (OOM, crash...)")
    failures: tuple[str, ...] = Field(default=(), description="how they failed (trial outcomes)")
    status: Status = "hypothesis"
    demotions: int = 0
    runs: tuple[str, ...] = ()
    created: float = 0.0
    updated: float = 0.0

    @property
    def effect_conditions(self) -> tuple[dict[str, float], ...]:
        """The conditions of each measured effect (a lesson of an older version: its one condition for all)."""
        if len(self.conditions) == len(self.effects):
            return self.conditions
        return (self.condition.features,) * len(self.effects)

    @property
    def mean_effect(self) -> float:
        return statistics.fmean(self.effects) if self.effects else 0.0

    @property
    def is_infeasible(self) -> bool:
        """True when the move failed in scope and no accepted evidence has confirmed it since."""
        return self.infeasible > 0 and self.status != "confirmed"

    def summary(self) -> str:
        failed = (f"; failed ×{self.infeasible} ({', '.join(self.failures)})" if self.infeasible else "")
        return (f"{self.action.knob} {self.action.direction}"
                f"{'' if self.action.value is None else f' → {self.action.value}'} when {self.condition.bottleneck}: "
                f"{self.mean_effect:+.1%} over {len(self.effects)} trial(s), {self.supporting} accepted"
                f"{failed} [{self.status}]")


class NoiseRecord(BaseModel):
    """The run-to-run noise one finished run measured: the pooled log-sd of its recipes measured more than once
    (its baseline's repeats, the best's reference runs, its pairs), with its degrees of freedom and where it ran. A
    later run on the same cluster (:meth:`LessonStore.noise_prior`) decides its first candidates on it and on its
    own runs, so a change far above this noise is kept on its first run instead of after a pair."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    run: str
    scope: Scope
    sigma: float = Field(gt=0, allow_inf_nan=False)
    df: int = Field(ge=1)
    recorded: float = 0.0


class _Contents(dict[str, "Lesson"]):
    """The lessons of a store by id, and (``noise``) the noise records of its runs by run id."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.noise: dict[str, NoiseRecord] = {}


#: a noise prior pools the noise records of at most this many recent runs in scope
NOISE_PRIOR_RUNS = 20


def noise_in_scope(record: Scope, target: Scope) -> bool:
    """Whether a run's measured noise describes a run in ``target``: the same framework, backend, accelerator and
    scale (the cluster, not the model, sets how much one run varies)."""
    return (record.framework, record.backend, record.accelerator, record.scale) == \
        (target.framework, target.backend, target.accelerator, target.scale)


# -- scope helpers ----------------------------------------------------------------------------------

def param_count(recipe: Recipe) -> int:
    """Rough parameter count: 12·L·h² (dense) plus embeddings (experts counted whole)."""
    m = recipe.model
    if m is None:  # the architecture lives in the user's own launch
        return 0
    dense = 12 * m.layers * m.hidden_size ** 2
    if m.is_moe and m.moe_experts:
        ffn = m.moe_ffn_hidden_size or m.ffn_hidden_size
        dense = m.layers * (4 * m.hidden_size ** 2 + 3 * m.hidden_size * ffn * m.moe_experts)
    return dense + m.vocab_size * m.hidden_size


def size_bucket(recipe: Recipe) -> str:
    """Model size bucket (by parameter count)."""
    n = param_count(recipe)
    if n == 0:
        return "unknown"
    for limit, name in ((1e8, "<100M"), (1e9, "100M-1B"), (1e10, "1B-10B"), (1e11, "10B-100B")):
        if n < limit:
            return name
    return ">100B"


def scale_bucket(recipe: Recipe) -> str:
    """Scale bucket (by allocated devices)."""
    d = recipe.resources.devices
    return "1" if d <= 1 else "2-8" if d <= 8 else "9-64" if d <= 64 else ">64"


def scope_of(recipe: Recipe, backend: str | None = None) -> Scope:
    return Scope(framework=recipe.framework, model_family=recipe.model.family if recipe.model else "native",
                 size_bucket=size_bucket(recipe), accelerator=recipe.resources.accelerator, scale=scale_bucket(recipe),
                 backend=backend or "")


def backend_compatible(lesson_backend: str, target_backend: str | None, include_simulated: bool = False) -> bool:
    """May a lesson measured on ``lesson_backend`` steer a run on ``target_backend``?

    Runs are steered by lessons of the same kind of backend (real or simulated; a run that does not name its
    backend counts as real). A real run also takes simulated lessons, and lessons of unknown provenance, only
    when ``include_simulated`` asks for them.
    """
    lk = backend_kind(lesson_backend)
    tk = backend_kind(target_backend)
    tk = "real" if tk == "unknown" else tk
    if lk == tk:
        return True
    return include_simulated and tk == "real" and lk in ("simulated", "unknown")


def scope_match(lesson: Scope, target: Scope, include_simulated: bool = False) -> float:
    """How well a lesson's scope matches a recipe's (0: not at all, 1: exactly); the framework and the kind of
    backend must match (see :func:`backend_compatible`); another accelerator scores at most 0.6 (it never prunes)."""
    if lesson.framework != target.framework:
        return 0.0
    if not backend_compatible(lesson.backend, target.backend or None, include_simulated):
        return 0.0
    score = 0.55
    score += 0.15 if lesson.model_family == target.model_family else 0.0
    score += 0.15 if lesson.size_bucket == target.size_bucket else 0.0
    score += 0.15 if lesson.scale == target.scale else 0.0
    return score if lesson.accelerator == target.accelerator else 0.6 * score


def direction_of(catalogue: Any, knob: str, old: KnobValue, new: KnobValue) -> str:
    """``up``/``down`` along a knob's ordered domain, ``enable``/``disable`` for booleans, else ``set``."""
    if isinstance(new, bool) or isinstance(old, bool):
        return "enable" if new else "disable"
    try:
        vals = list(catalogue[knob].values)
        i, j = vals.index(old), vals.index(new)
    except (KeyError, ValueError):
        return "set"
    return "up" if j > i else "down" if j < i else "set"


# -- measured conditions and transfer ---------------------------------------------------------------

#: the spread over which a numeric condition is still "alike" (one unit of distance); shares of the step in 0..1
_FEATURE_SCALES = {"share": 0.1, "mfu": 0.12, "memory": 0.15, "log10_params": 0.6, "log2_seq": 1.0,
                   "log2_devices": 1.5, "moe": 0.5}
#: distance a differing categorical condition (bottleneck, accelerator) adds
_CATEGORY_DISTANCE = 1.0


def job_features(recipe: Recipe | None, measurement: Any = None) -> dict[str, float]:
    """The measured conditions of one trial of ``recipe``: the diagnosed bottleneck and the share of the step each
    phase took (communication by kind), memory in use, MFU, model size and shape, sequence length, scale and
    accelerator. Numbers only; a categorical condition is a ``name:value`` key set to 1."""
    f: dict[str, float] = {}
    diag = diagnose(measurement, recipe)
    if diag.confidence > 0.1:
        f[f"bottleneck:{diag.bottleneck}"] = 1.0
    for k, v in diag.shares.items():
        f["memory" if k == "memory" else f"share:{k}"] = round(min(max(float(v), 0.0), 1.5), 4)
    phases = getattr(measurement, "phases", None) or {}
    step = float(getattr(measurement, "step_time_median_s", 0.0) or 0.0)
    if phases and step > 0:
        total = max(step, sum(v for v in phases.values() if v > 0))
        for key in ("tp_comm", "dp_exposed", "pp_bubble", "pp_comm", "ep_comm", "cp_comm"):
            if phases.get(key, 0.0) > 0:
                f[f"share:{key}"] = round(phases[key] / total, 4)
    mfu = (getattr(measurement, "signals", None) or {}).get("mfu")
    if isinstance(mfu, (int, float)) and 0 < mfu <= 1:
        f["mfu"] = round(float(mfu), 4)
    if recipe is not None:
        n = param_count(recipe)
        if n > 0:
            f["log10_params"] = round(math.log10(n), 3)
        seq = recipe.training.seq_length if recipe.training is not None else None
        if seq:
            f["log2_seq"] = round(math.log2(seq), 3)
        f["log2_devices"] = round(math.log2(max(1, recipe.resources.devices)), 3)
        f["moe"] = 1.0 if recipe.model is not None and recipe.model.is_moe else 0.0
        f[f"accelerator:{recipe.resources.accelerator}"] = 1.0
    return f


def similarity(a: dict[str, float], b: dict[str, float]) -> float:
    """How alike two sets of measured conditions are: 1 when equal, falling with the scaled distance (a Gaussian
    kernel); :data:`UNKNOWN_SIMILARITY` where either side was recorded without conditions."""
    if not a or not b:
        return UNKNOWN_SIMILARITY
    d2 = 0.0
    cats = {k.split(":", 1)[0] for k in (*a, *b) if ":" in k and not k.startswith("share:")}
    for c in cats:
        ka = {k for k in a if k.startswith(c + ":")}
        kb = {k for k in b if k.startswith(c + ":")}
        if ka and kb and ka != kb:
            d2 += _CATEGORY_DISTANCE
    for k in {k for k in (*a, *b) if k.startswith("share:")}:  # a phase not measured took no time
        d2 += ((a.get(k, 0.0) - b.get(k, 0.0)) / _FEATURE_SCALES["share"]) ** 2
    for k in _FEATURE_SCALES.keys() & a.keys() & b.keys():  # the rest only where both sides have them
        d2 += ((a[k] - b[k]) / _FEATURE_SCALES[k]) ** 2
    return math.exp(-d2 / 8.0)


class Estimate(BaseModel):
    """What the lessons say of one move on this job: the evidence-weighted gain and what it rests on."""

    model_config = ConfigDict(frozen=True)

    gain: float = Field(description="the move's expected gain: the prior shrunk toward the lessons' weighted mean")
    prior: float
    lessons_mean: float = 0.0
    evidence: float = Field(default=0.0, description="similarity-weighted number of measurements behind it")
    measurements: int = 0
    lesson_ids: tuple[str, ...] = ()

    @property
    def moved(self) -> bool:
        return self.evidence >= MIN_EVIDENCE and abs(self.gain - self.prior) > 1e-4

    def note(self) -> str:
        return (f"lessons {', '.join(self.lesson_ids[:3])}{'…' if len(self.lesson_ids) > 3 else ''}: "
                f"{self.lessons_mean:+.1%} over {self.measurements} measurement(s) on jobs "
                f"{self.evidence / max(self.measurements, 1):.0%} alike (weight {self.evidence:.2f} against the "
                f"prior's {PRIOR_WEIGHT:g}): expected {self.prior:+.1%} → {self.gain:+.1%}")


def estimate(lessons: Iterable[tuple[Lesson, float]], knob: str, direction: str, value: KnobValue,
             features: dict[str, float], prior: float) -> Estimate:
    """The lessons' word on moving ``knob`` ``direction`` to ``value`` on a job measured as ``features``.

    Every measured effect of a lesson about this knob and direction counts with its similarity to this job (times
    the lesson's scope match, and half for another value of the knob); failures are left to pruning. The result is
    ``(Σ wᵢ·eᵢ + PRIOR_WEIGHT·prior) / (Σ wᵢ + PRIOR_WEIGHT)``: evidence from unlike jobs weighs little, so it moves
    the prior little, whatever its sign."""
    num = den = 0.0
    n = 0
    ids: list[str] = []
    for lesson, match in lessons:
        a = lesson.action
        if a.knob != knob or a.direction != direction or not lesson.effects:
            continue
        same = 1.0 if a.value == value else 0.5
        conds = lesson.effect_conditions
        used = False
        for effect, cond in zip(lesson.effects, conds, strict=True):
            w = same * match * similarity(cond, features)
            if w <= 0:
                continue
            num += w * max(-0.5, min(2.0, effect))
            den += w
            n += 1
            used = True
        if used:
            ids.append(lesson.id)
    if den < MIN_EVIDENCE:
        return Estimate(gain=prior, prior=prior, evidence=den, measurements=n, lesson_ids=tuple(ids))
    mean = num / den
    return Estimate(gain=(num + PRIOR_WEIGHT * prior) / (den + PRIOR_WEIGHT), prior=prior, lessons_mean=mean,
                    evidence=den, measurements=n, lesson_ids=tuple(ids))


def never_paid(lesson: Lesson, min_gain: float = 0.02) -> bool:
    """Measured in :data:`FORGET_AFTER_RUNS` runs or more, never once an accepted gain, on average less than
    ``min_gain``, and no failure to warn of."""
    return (len(lesson.runs) >= FORGET_AFTER_RUNS and lesson.supporting == 0 and lesson.infeasible == 0
            and lesson.mean_effect < min_gain)


def _lesson_id(scope: Scope, bottleneck: str, action: LessonAction) -> str:
    raw = f"{scope.key()}|{bottleneck}|{action.knob}|{action.direction}|{action.value!r}"
    return hashlib.sha1(raw.encode()).hexdigest()[:10]


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
    best_rec: TrialRecord | None = next((r for r in records if r.kind == "baseline" and r.measurement), None)
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
        if rec.kind == "baseline" or rec.outcome in (TrialOutcome.REFUSED, TrialOutcome.INTERRUPTED) or not rec.change:
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
        elif rec.kind == "confirm":
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


# -- the store ----------------------------------------------------------------------------------------

def lessons_disabled() -> bool:
    """True when ``ATTUNE_LESSONS`` is ``off`` (or ``0``/``none``): no lessons are read or written."""
    return os.environ.get("ATTUNE_LESSONS", "").strip().lower() in ("off", "0", "none", "false")


STEER_BY_DEFAULT = False
"""Whether the user's lessons steer a run unless asked otherwise. Off: on the shipped suite the lessons benchmark
(``attune bench --lessons loo``) does not yet show warm runs reaching 0.95 of the optimum in 0.75 of cold's trials'
worth (README, "Lessons"); runs still record what they teach, and ``ATTUNE_LESSONS_STEER=on`` lets them steer."""


def lessons_steer() -> bool:
    """True when the user's lessons steer proposals: ``ATTUNE_LESSONS_STEER=on``/``off``, else
    :data:`STEER_BY_DEFAULT`; never when lessons are off altogether."""
    if lessons_disabled():
        return False
    v = os.environ.get("ATTUNE_LESSONS_STEER", "").strip().lower()
    if v in ("on", "1", "true", "yes"):
        return True
    if v in ("off", "0", "false", "no"):
        return False
    return STEER_BY_DEFAULT


def default_path() -> Path:
    """``$ATTUNE_LESSONS`` or the per-user data directory's ``lessons.json``."""
    env = os.environ.get("ATTUNE_LESSONS")
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_data_dir("attune")) / "lessons.json"


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


_Op = Callable[[dict[str, Lesson]], Any]


class LessonStore:
    """A JSON file of lessons, safe for concurrent writers.

    ``add`` and ``forget`` change the lessons in memory and remember the change; ``save`` takes the store's
    lock, re-reads the file, replays the remembered changes onto what is there now and replaces the file
    atomically, so a lesson another process wrote in the meantime is kept. Reads are re-done whenever the file
    changed on disk.
    """

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path).expanduser() if path is not None else default_path()
        self._lessons: dict[str, Lesson] | None = None
        self._stamp: tuple[int, int, int] | None = None
        self._pending: list[_Op] = []
        self._mutex = threading.RLock()  # one store may serve several threads (the sidecar's)

    @property
    def lock_path(self) -> Path:
        return self.path.with_name(self.path.name + ".lock")

    # -- file access --------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _locked(self, *, write: bool) -> Iterator[bool]:
        """Hold the store's exclusive ``flock`` (on the side lock file); yields whether it is held. A read
        where no lock file can be made (a read-only directory) goes ahead without one."""
        fd: int | None = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as err:
            if write or err.errno not in (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOENT):
                raise LessonStoreError(f"cannot lock the lessons store {self.path}: {err.strerror}") from None
        if fd is None:
            yield False
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield True
        finally:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            st = self.path.stat()
        except OSError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def _read(self, *, locked: bool) -> dict[str, Lesson]:
        """The lessons in the file; a file that cannot be read back whole is moved aside (when ``locked``)."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return _Contents()
        except OSError as err:
            raise LessonStoreError(f"cannot read the lessons store {self.path}: {err.strerror}") from None
        if not raw.strip():
            return _Contents()
        problems: list[str] = []
        lessons = _Contents()
        items: list[Any] = []
        noise_items: list[Any] = []
        version: Any = STORE_VERSION
        try:
            data = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as err:
            problems.append(f"not valid JSON ({err})")
        else:
            if not isinstance(data, dict) or not isinstance(data.get("lessons", []), list):
                problems.append("not a lessons file (expected an object with a 'lessons' list)")
            else:
                version = data.get("version", 1)
                items = data.get("lessons", [])
                noise_items = data.get("noise", [])
                if not isinstance(noise_items, list):
                    problems.append("'noise' is not a list")
                    noise_items = []
                if version not in (1, STORE_VERSION):
                    problems.append(f"store version {version!r} is not one this attune reads (1, {STORE_VERSION})")
                    items = noise_items = []
        for i, item in enumerate(items):
            try:
                lesson = Lesson.model_validate(_migrate_v1(item) if version == 1 else item)
            except ValidationError as err:
                first = err.errors()[0]
                problems.append(f"lesson #{i + 1}: {'.'.join(map(str, first['loc'])) or 'item'}: {first['msg']}")
                continue
            lessons[lesson.id] = lesson
        for i, item in enumerate(noise_items):
            try:
                rec = NoiseRecord.model_validate(item)
            except ValidationError as err:
                first = err.errors()[0]
                problems.append(f"noise record #{i + 1}: {'.'.join(map(str, first['loc'])) or 'item'}: {first['msg']}")
                continue
            lessons.noise[rec.run] = rec
        if problems:
            where = self._move_aside() if locked else None
            if where is not None:  # the readable lessons stay in the live store; the whole file is kept aside
                self._write(lessons)
            log.warning("the lessons store %s is corrupt (%s%s); %s; %d readable lesson(s) kept",
                        self.path, "; ".join(problems[:3]), f"; and {len(problems) - 3} more" if len(problems) > 3
                        else "", f"the file was moved aside to {where} (never overwritten)" if where
                        else "the file is left as it is", len(lessons))
        return lessons

    def _move_aside(self) -> Path | None:
        stamp = time.strftime("%Y%m%dT%H%M%S")
        for n in range(1000):
            aside = self.path.with_name(f"{self.path.name}.corrupt-{stamp}" + (f"-{n}" if n else ""))
            if aside.exists():
                continue
            try:
                os.link(self.path, aside)  # never replaces an existing file
            except FileExistsError:
                continue
            except OSError:
                try:
                    os.replace(self.path, aside)
                except OSError as err:
                    raise LessonStoreError(f"the lessons store {self.path} is corrupt and cannot be moved aside: "
                                           f"{err.strerror}") from None
                return aside
            os.unlink(self.path)
            _fsync_dir(self.path.parent)
            return aside
        raise LessonStoreError(f"the lessons store {self.path} is corrupt and cannot be moved aside")

    def _write(self, lessons: dict[str, Lesson]) -> None:
        parent = self.path.parent
        payload: dict[str, Any] = {"version": STORE_VERSION,
                                   "lessons": [lz.model_dump(mode="json") for lz in lessons.values()]}
        noise = getattr(lessons, "noise", {})
        if noise:
            payload["noise"] = [n.model_dump(mode="json") for n in noise.values()]
        try:
            parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=parent, prefix=".lessons-", suffix=".json.tmp")
        except OSError as err:
            raise LessonStoreError(f"cannot write the lessons store {self.path}: {err.strerror}") from None
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(payload, f, indent=2)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException as err:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            if isinstance(err, OSError):
                raise LessonStoreError(f"cannot write the lessons store {self.path}: {err.strerror}") from None
            raise
        _fsync_dir(parent)

    def _load(self) -> dict[str, Lesson]:
        with self._mutex:
            return self._load_unlocked()

    def _load_unlocked(self) -> dict[str, Lesson]:
        stamp = self._stat()
        if self._lessons is None or stamp != self._stamp:
            with self._locked(write=False) as locked:
                lessons = self._read(locked=locked)
                self._stamp = self._stat()
            for op in self._pending:  # changes not saved yet stay applied
                op(lessons)
            self._lessons = lessons
        return self._lessons

    # -- the API ------------------------------------------------------------------------------------------
    def save(self) -> None:
        """Write the changes made through this store: under the lock, onto the file as it is now."""
        with self._mutex, self._locked(write=True):
            lessons = self._read(locked=True)
            for op in self._pending:
                op(lessons)
            self._write(lessons)
            self._stamp = self._stat()
            self._pending.clear()
            self._lessons = lessons

    def all(self) -> list[Lesson]:
        with self._mutex:
            lessons = list(self._load_unlocked().values())
        return sorted(lessons, key=lambda lz: (lz.scope.key(), lz.action.knob, lz.id))

    def get(self, lesson_id: str) -> Lesson | None:
        with self._mutex:
            lessons = dict(self._load_unlocked())
        if lesson_id in lessons:
            return lessons[lesson_id]
        matches = [lz for k, lz in lessons.items() if k.startswith(lesson_id)]
        return matches[0] if len(matches) == 1 else None

    def forget(self, lesson_id: str) -> bool:
        lesson = self.get(lesson_id)
        if lesson is None:
            return False

        def drop(lessons: dict[str, Lesson]) -> None:
            lessons.pop(lesson.id, None)

        self._change(drop)
        self.save()
        return True

    def add(self, observations: Iterable[Observation], run_id: str, min_gain: float = 0.02) -> list[Lesson]:
        """Fold observations of run ``run_id`` into the lessons (a run already folded in is skipped); ``save``
        writes them."""
        obs = list(observations)

        def fold_in(lessons: dict[str, Lesson]) -> list[Lesson]:
            touched: dict[str, Lesson] = {}
            # idempotent per run: a lesson that already holds this run's evidence is not folded again
            done = {lid for lid, lz in lessons.items() if run_id in lz.runs}
            for o in obs:
                lid = _lesson_id(o.scope, o.condition.bottleneck, o.action)
                if lid in done:
                    continue
                lessons[lid] = fold(lessons.get(lid), o, run_id, min_gain)
                touched[lid] = lessons[lid]
            for lid in [lid for lid in touched if never_paid(lessons[lid], min_gain)]:
                log.info("lesson %s forgotten: %s", lid, f"measured in {len(lessons[lid].runs)} runs, never paid")
                del lessons[lid]
                touched.pop(lid)
            return list(touched.values())

        return self._change(fold_in)

    def add_noise(self, record: NoiseRecord) -> None:
        """Keep the noise a run measured (a run already recorded is replaced); ``save`` writes it."""

        def put(lessons: dict[str, Lesson]) -> None:
            noise = lessons.noise if isinstance(lessons, _Contents) else {}
            noise[record.run] = record

        self._change(put)

    def noise_records(self) -> list[NoiseRecord]:
        """The runs' noise records, oldest first."""
        with self._mutex:
            lessons = self._load_unlocked()
            records = list(lessons.noise.values()) if isinstance(lessons, _Contents) else []
        return sorted(records, key=lambda n: (n.recorded, n.run))

    def noise_prior(self, recipe: Recipe, *, backend: str | None = None) -> tuple[float, int, int] | None:
        """(log-sd, degrees of freedom, runs) of the run-to-run noise that the last :data:`NOISE_PRIOR_RUNS` runs
        on this cluster (:func:`noise_in_scope`) measured, pooled; None where no run in scope recorded any."""
        target = scope_of(recipe, backend)
        mine = [n for n in self.noise_records() if noise_in_scope(n.scope, target)][-NOISE_PRIOR_RUNS:]
        df = sum(n.df for n in mine)
        if not df:
            return None
        return math.sqrt(math.fsum(n.sigma ** 2 * n.df for n in mine) / df), df, len(mine)

    def _change(self, op: _Op) -> Any:
        with self._mutex:
            lessons = self._load_unlocked()
            self._pending.append(op)
            return op(lessons)

    def in_scope(self, recipe: Recipe, *, backend: str | None = None,
                 include_simulated: bool = False) -> list[tuple[Lesson, float]]:
        """Lessons that apply to ``recipe`` run on ``backend`` with their scope match (best first); simulated
        lessons (and those of unknown provenance) steer a real run only with ``include_simulated``."""
        target = scope_of(recipe, backend)
        with self._mutex:
            lessons = list(self._load_unlocked().values())
        out = [(lz, scope_match(lz.scope, target, include_simulated)) for lz in lessons]
        return sorted([(lz, m) for lz, m in out if m > 0], key=lambda p: (-p[1], p[0].id))


def noise_prior_overrides(store: LessonStore | None, recipe: Recipe, *, backend: str | None) -> dict[str, Any]:
    """The run configuration's overrides (``TuneConfig``) that carry the noise prior of ``store`` for a run of
    ``recipe`` on ``backend``: none without a store, or where no past run on this cluster measured its noise. The
    baseline keeps its repeats: the engine weighs the prior only against the run's own repeats."""
    prior = store.noise_prior(recipe, backend=backend) if store is not None else None
    if prior is None:
        return {}
    sigma, df, _runs = prior
    return {"noise_prior_sigma": sigma, "noise_prior_df": df}


def run_noise(state: Any, *, backend: str | None = None) -> NoiseRecord | None:
    """The run-to-run noise a finished run measured (every recipe it ran more than once, its certification runs
    among them, pooled), or None where it ran nothing twice."""
    from attune.engine.acceptance import RunNoise
    from attune.engine.loop import repeated_runs

    noise = RunNoise.pooled(repeated_runs(state, kinds=("baseline", "reference", "candidate", "confirm", "certify")))
    if noise.df < 1 or not noise.sigma > 0 or not math.isfinite(noise.sigma):
        return None
    return NoiseRecord(run="", scope=scope_of(state.baseline, backend), sigma=noise.sigma, df=noise.df,
                       recorded=time.time())


def record_run(state: Any, store: LessonStore | str | Path | None = None, run_id: str | None = None, *,
               backend: str | None = None) -> list[Lesson]:
    """Distil lessons from a finished :class:`~attune.engine.loop.RunState` into ``store`` and save it.

    ``backend`` (default: the state's ``backend``) is recorded in each lesson's scope.
    """
    if not isinstance(store, LessonStore):
        if store is None and lessons_disabled():
            return []
        store = LessonStore(store)
    min_gain = getattr(getattr(state, "config", None), "min_gain", 0.02)
    backend = backend if backend is not None else getattr(state, "backend", None)
    obs = distil(state.baseline, state.records, min_gain, backend=backend)
    noise = run_noise(state, backend=backend)
    if not obs and noise is None:
        return []
    rid = run_id or hashlib.sha1(
        json.dumps([r.signature for r in state.records] + [state.baseline.name]).encode()).hexdigest()[:8]
    touched = store.add(obs, rid, min_gain)
    if noise is not None:
        store.add_noise(noise.model_copy(update={"run": rid}))
    store.save()
    log.info("recorded %d lesson(s) from run %s into %s", len(touched), rid, store.path)
    return touched


__all__ = [
    "FORGET_AFTER_RUNS",
    "NOISE_PRIOR_RUNS",
    "SIMULATED_BACKENDS",
    "STEER_BY_DEFAULT",
    "Condition",
    "Estimate",
    "Lesson",
    "LessonAction",
    "LessonStore",
    "LessonStoreError",
    "NoiseRecord",
    "Observation",
    "Scope",
    "backend_compatible",
    "backend_kind",
    "default_path",
    "direction_of",
    "distil",
    "estimate",
    "fold",
    "job_features",
    "lessons_steer",
    "never_paid",
    "noise_in_scope",
    "noise_prior_overrides",
    "param_count",
    "record_run",
    "run_noise",
    "scope_match",
    "scope_of",
    "similarity",
]
