"""The lessons store: structured, user-owned lessons distilled from finished tuning runs.

A lesson says: *in this scope* (framework, model family, size bucket, accelerator, scale), *when this
bottleneck shows*, *moving this knob this way* had *these measured effects*. Its status moves
``hypothesis → confirmed`` when at least two measurements agree that it helps, is **demoted** back to
``hypothesis`` when a counter-example appears, and becomes ``disproven`` when most measurements say it
does not help. The store is one JSON file the user controls: ``$ATTUNE_LESSONS``, or
``platformdirs.user_data_dir("attune")/lessons.json``; ``attune lessons list|show|forget`` edits it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import statistics
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from attune.agent.diagnose import diagnose
from attune.engine.state import TrialOutcome, TrialRecord
from attune.recipe.catalogue import KnobValue
from attune.recipe.model import Recipe

log = logging.getLogger(__name__)

Status = Literal["hypothesis", "confirmed", "disproven"]
#: effect recorded for a trial that failed (OOM, crash): a strong counter-example
FAILURE_EFFECT = -1.0


class Scope(BaseModel):
    """Where a lesson applies."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    framework: str
    model_family: str
    size_bucket: str
    accelerator: str
    scale: str

    def key(self) -> str:
        return f"{self.framework}/{self.model_family}/{self.size_bucket}/{self.accelerator}/{self.scale}"


class Condition(BaseModel):
    """When a lesson applies: the diagnosed bottleneck and the evidence seen."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    bottleneck: str
    evidence: tuple[str, ...] = ()


class LessonAction(BaseModel):
    """What was done: one knob moved in a direction (up, down, enable, disable, set) to a value."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    knob: str
    direction: str
    value: KnobValue = None


class Lesson(BaseModel):
    """One structured lesson with its measured effects and status."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    scope: Scope
    condition: Condition
    action: LessonAction
    effects: tuple[float, ...] = Field(default=(), description="relative throughput gains measured (−1: failed)")
    status: Status = "hypothesis"
    demotions: int = 0
    runs: tuple[str, ...] = ()
    created: float = 0.0
    updated: float = 0.0

    @property
    def mean_effect(self) -> float:
        return statistics.fmean(self.effects) if self.effects else 0.0

    def summary(self) -> str:
        return (f"{self.action.knob} {self.action.direction}"
                f"{'' if self.action.value is None else f' → {self.action.value}'} when {self.condition.bottleneck}: "
                f"{self.mean_effect:+.1%} over {len(self.effects)} trial(s) [{self.status}]")


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


def scope_of(recipe: Recipe) -> Scope:
    return Scope(framework=recipe.framework, model_family=recipe.model.family if recipe.model else "native", size_bucket=size_bucket(recipe),
                 accelerator=recipe.resources.accelerator, scale=scale_bucket(recipe))


def scope_match(lesson: Scope, target: Scope) -> float:
    """How well a lesson's scope matches a recipe's (0: not at all, 1: exactly); framework and accelerator must match."""
    if lesson.framework != target.framework or lesson.accelerator != target.accelerator:
        return 0.0
    score = 0.55
    score += 0.15 if lesson.model_family == target.model_family else 0.0
    score += 0.15 if lesson.size_bucket == target.size_bucket else 0.0
    score += 0.15 if lesson.scale == target.scale else 0.0
    return score


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


def _lesson_id(scope: Scope, bottleneck: str, action: LessonAction) -> str:
    raw = f"{scope.key()}|{bottleneck}|{action.knob}|{action.direction}|{action.value!r}"
    return hashlib.sha1(raw.encode()).hexdigest()[:10]


# -- distillation -----------------------------------------------------------------------------------

class Observation(BaseModel):
    """One measured effect of one knob move, ready to be folded into a lesson."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    scope: Scope
    condition: Condition
    action: LessonAction
    effect: float


def distil(baseline: Recipe, records: Sequence[TrialRecord], min_gain: float = 0.02) -> list[Observation]:
    """Observations from a run's records: each launched single-move candidate and its confirmation."""
    scope = scope_of(baseline)
    cat = baseline.catalogue
    best_knobs = dict(baseline.effective_knobs)
    best_rec: TrialRecord | None = next((r for r in records if r.kind == "baseline" and r.measurement), None)
    out: list[Observation] = []
    pending: dict[str, Observation] = {}
    for rec in sorted(records, key=lambda r: r.id):
        if rec.kind == "baseline" or rec.outcome in (TrialOutcome.REFUSED, TrialOutcome.INTERRUPTED) or not rec.change:
            continue
        if rec.kind == "candidate":
            diag = diagnose(best_rec, baseline)
            knob, value = next(iter(rec.change.items()))
            if knob not in cat:
                continue
            action = LessonAction(knob=knob, direction=direction_of(cat, knob, best_knobs.get(knob), value), value=value)
            if rec.outcome.failed:
                effect = FAILURE_EFFECT if rec.outcome is TrialOutcome.OOM else -0.5
            else:
                effect = float(rec.gain or 0.0)
            obs = Observation(scope=scope, condition=Condition(bottleneck=diag.bottleneck,
                                                               evidence=diag.evidence[:3]),
                              action=action, effect=effect)
            out.append(obs)
            pending[rec.signature] = obs
        elif rec.kind == "confirm":
            first = pending.get(rec.signature)
            if first is not None and rec.gain is not None:
                out.append(first.model_copy(update={"effect": float(rec.gain)}))
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
    effects = (*lesson.effects, obs.effect)
    positive = [e for e in effects if e >= min_gain]
    negative = [e for e in effects if e < min_gain]
    status, demotions = lesson.status, lesson.demotions
    helps = obs.effect >= min_gain
    if lesson.status == "confirmed" and not helps:
        status, demotions = "hypothesis", demotions + 1
        log.info("lesson %s demoted by a counter-example (%+.1f%%)", lesson.id, obs.effect * 100)
    elif len(effects) >= 2 and len(negative) > len(positive):
        status = "disproven"
    elif len(positive) >= 2 and helps and (lesson.status != "hypothesis" or demotions == 0
                                           or len(positive) >= 2 * len(negative) + 1):
        status = "confirmed"
    runs = lesson.runs if run_id in lesson.runs else (*lesson.runs, run_id)
    return lesson.model_copy(update={"effects": effects, "status": status, "demotions": demotions, "runs": runs,
                                     "updated": now, "condition": obs.condition if not lesson.condition.evidence
                                     else lesson.condition})


# -- the store ----------------------------------------------------------------------------------------

def lessons_disabled() -> bool:
    """True when ``ATTUNE_LESSONS`` is ``off`` (or ``0``/``none``): no lessons are read or written."""
    return os.environ.get("ATTUNE_LESSONS", "").strip().lower() in ("off", "0", "none", "false")


def default_path() -> Path:
    """``$ATTUNE_LESSONS`` or the per-user data directory's ``lessons.json``."""
    env = os.environ.get("ATTUNE_LESSONS")
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_data_dir("attune")) / "lessons.json"


class LessonStore:
    """A JSON file of lessons (written atomically)."""

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path).expanduser() if path is not None else default_path()
        self._lessons: dict[str, Lesson] | None = None

    def _load(self) -> dict[str, Lesson]:
        if self._lessons is None:
            self._lessons = {}
            if self.path.exists():
                try:
                    data = json.loads(self.path.read_text() or "{}")
                    for item in data.get("lessons", []):
                        lesson = Lesson.model_validate(item)
                        self._lessons[lesson.id] = lesson
                except (OSError, ValueError) as err:
                    log.warning("ignoring unreadable lessons file %s: %s", self.path, err)
        return self._lessons

    def save(self) -> None:
        lessons = self._load()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        payload = {"version": 1, "lessons": [lz.model_dump(mode="json") for lz in lessons.values()]}
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".lessons-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump(payload, f, indent=2)
        os.replace(tmp, self.path)

    def all(self) -> list[Lesson]:
        return sorted(self._load().values(), key=lambda lz: (lz.scope.key(), lz.action.knob, lz.id))

    def get(self, lesson_id: str) -> Lesson | None:
        lessons = self._load()
        if lesson_id in lessons:
            return lessons[lesson_id]
        matches = [lz for k, lz in lessons.items() if k.startswith(lesson_id)]
        return matches[0] if len(matches) == 1 else None

    def forget(self, lesson_id: str) -> bool:
        lesson = self.get(lesson_id)
        if lesson is None:
            return False
        del self._load()[lesson.id]
        self.save()
        return True

    def add(self, observations: Iterable[Observation], run_id: str, min_gain: float = 0.02) -> list[Lesson]:
        """Fold observations of run ``run_id`` into the lessons (a run already folded in is skipped)."""
        lessons = self._load()
        touched: dict[str, Lesson] = {}
        # idempotent per run: a lesson that already holds this run's evidence is not folded again
        done = {lid for lid, lz in lessons.items() if run_id in lz.runs}
        for obs in observations:
            lid = _lesson_id(obs.scope, obs.condition.bottleneck, obs.action)
            if lid in done:
                continue
            lessons[lid] = fold(lessons.get(lid), obs, run_id, min_gain)
            touched[lid] = lessons[lid]
        return list(touched.values())

    def in_scope(self, recipe: Recipe) -> list[tuple[Lesson, float]]:
        """Lessons that apply to ``recipe`` with their scope match (best first)."""
        target = scope_of(recipe)
        out = [(lz, scope_match(lz.scope, target)) for lz in self._load().values()]
        return sorted([(lz, m) for lz, m in out if m > 0], key=lambda p: (-p[1], p[0].id))


def record_run(state: Any, store: LessonStore | str | Path | None = None, run_id: str | None = None) -> list[Lesson]:
    """Distil lessons from a finished :class:`~attune.engine.loop.RunState` into ``store`` and save it."""
    if not isinstance(store, LessonStore):
        if store is None and lessons_disabled():
            return []
        store = LessonStore(store)
    min_gain = getattr(getattr(state, "config", None), "min_gain", 0.02)
    obs = distil(state.baseline, state.records, min_gain)
    if not obs:
        return []
    rid = run_id or hashlib.sha1(
        json.dumps([r.signature for r in state.records] + [state.baseline.name]).encode()).hexdigest()[:8]
    touched = store.add(obs, rid, min_gain)
    store.save()
    log.info("recorded %d lesson(s) from run %s into %s", len(touched), rid, store.path)
    return touched


__all__ = ["Condition", "Lesson", "LessonAction", "LessonStore", "Observation", "Scope", "default_path",
           "direction_of", "distil", "fold", "param_count", "record_run", "scope_match", "scope_of"]
