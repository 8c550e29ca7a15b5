"""The lessons' data: scope, conditions, a lesson and its evidence, the noise records, how alike two jobs are
(:func:`similarity`) and what the lessons in scope estimate for a move (:func:`estimate`).
See :mod:`attune.agent.lessons` for what a lesson means."""

from __future__ import annotations

import hashlib
import logging
import math
import statistics
from collections.abc import Iterable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from attune.agent.diagnose import diagnose
from attune.errors import AttuneError
from attune.recipe.catalogue import KnobValue
from attune.recipe.model import Recipe

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
