"""The playbook policy: a deterministic expert that maps the diagnosed bottleneck to one knob move.

How a proposal is made (no network, no randomness):

1. diagnose the current best trial (:func:`attune.agent.diagnose.diagnose`);
2. list every *adjacent* legal value of every search-space knob around the current best (one step up or
   down the knob's domain), completing coupled knobs of the same group only where the single move alone
   is inadmissible;
3. give each move a tier (**fit** before **scale** before **overlap** before **micro-tuning**), an expected
   relative gain (a prior from the rule table, raised where the move addresses the diagnosed bottleneck,
   lowered where it fights it, corrected by this run's history and by lessons in scope) and a relative
   cost (a compile trial costs about three ordinary ones);
4. drop moves the gate would refuse or that were already tried (``ctx.admissible``), and moves whose
   expected gain does not justify a trial;
5. propose the first move ordered by (tier, expected gain per accelerator-hour), or stop with the reason.

A *premature-stop veto* keeps a run going: a stop (the playbook's own diminishing-returns stop or an
LLM's stop flag) is overruled while an untried high-value move remains.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import combinations, product
from typing import Any

from attune.agent.diagnose import Diagnosis, diagnose
from attune.agent.lessons import INFEASIBLE_PRUNE_MATCH, Lesson, LessonStore, direction_of
from attune.engine.policy import Policy, PolicyContext, Stop
from attune.engine.state import TrialOutcome, TrialRecord
from attune.errors import RecipeError
from attune.frameworks.base import Rule, Tier
from attune.recipe.catalogue import KnobValue
from attune.recipe.change import Change, apply_change, signature

log = logging.getLogger(__name__)

FIT, SCALE, OVERLAP, MICRO = Tier.FIT, Tier.SCALE, Tier.OVERLAP, Tier.MICRO
TIER_NAMES = {Tier.LESSON: "lesson", FIT: "fit", SCALE: "scale", OVERLAP: "overlap", MICRO: "micro-tuning"}

_MEM = "memory_capacity"
_DEFAULT = Rule(MICRO, 0.005)


def rule_for(framework: str, knob: str, direction: str) -> Rule:
    """The prior for moving ``knob`` of ``framework`` in ``direction`` (the framework package's rule table)."""
    from attune import frameworks

    try:
        rules = frameworks.get(framework).rules
    except KeyError:
        return _DEFAULT
    return rules.get((knob, direction), _DEFAULT)


@dataclass(frozen=True)
class Candidate:
    """One scored move: the change, its tier, expected gain, relative cost and the reasons."""

    change: dict[str, KnobValue]
    knob: str
    direction: str
    tier: int
    expected_gain: float
    cost: float
    notes: tuple[str, ...] = ()
    stepped: bool = False  # steps past an inconclusive neighbour (ranked after fresh adjacent moves)

    @property
    def value(self) -> KnobValue:
        return self.change[self.knob]

    @property
    def gain_per_hour(self) -> float:
        return self.expected_gain / self.cost

    def describe(self, current: KnobValue) -> str:
        extra = f" (with {', '.join(f'{k}={v}' for k, v in self.change.items() if k != self.knob)})" \
            if len(self.change) > 1 else ""
        return (f"{self.knob}: {current} → {self.value}{extra} [{TIER_NAMES.get(self.tier, self.tier)} tier, "
                f"expected {self.expected_gain:+.1%}, cost ×{self.cost:g}]")


def _helps(rule: Rule, diag: Diagnosis) -> float | None:
    best = None
    for key, g in rule.helps.items():
        b, _, sub = key.partition(":")
        if b != diag.bottleneck:
            continue
        v = g if not sub or diag.sub_kind in (None, sub) else g * 0.4
        best = v if best is None else max(best, v)
    return best


class PlaybookPolicy(Policy):
    """Bottleneck-driven expert rules: one adjacent, admissible, never-tried knob move at a time."""

    name = "playbook"

    def __init__(self, *, lessons: LessonStore | None = None, min_expected_gain: float = 0.01,
                 high_value_gain: float = 0.05, patience: int = 4, max_completion_checks: int = 150,
                 include_simulated_lessons: bool = False, seed: int = 0, **_: Any) -> None:
        self.lessons = lessons
        #: let lessons measured on the simulator (or of unknown provenance) steer a run on real hardware
        self.include_simulated_lessons = include_simulated_lessons
        self.min_expected_gain = min_expected_gain
        self.high_value_gain = high_value_gain
        self.patience = patience
        self.max_completion_checks = max_completion_checks

    # -- public API -----------------------------------------------------------------------------------
    def propose(self, ctx: PolicyContext) -> Change | Stop:
        diag = self.diagnosis(ctx)
        ranked = self.candidates(ctx, diag)
        if not ranked:
            return Stop("no admissible, untried adjacent move is left in the search space "
                        f"(diagnosis: {diag.label()})")
        justified = [c for c in ranked if c.expected_gain >= self.min_expected_gain]
        if not justified:
            top = "; ".join(c.describe(ctx.best.knob(c.knob)) for c in ranked[:3])
            return Stop(f"no move is expected to gain at least {self.min_expected_gain:.1%} "
                        f"(diagnosis {diag.label()}); best remaining: {top}")
        stale = self._rejections_since_accept(ctx.records)
        if stale >= self.patience:
            vetoing = self.veto(ctx, diag, justified)
            if vetoing is None:
                return Stop(f"{stale} candidates in a row gave no gain and no untried high-value move remains "
                            f"(diagnosis {diag.label()})")
            return self._change(ctx, vetoing, diag, prefix=f"stop vetoed after {stale} rejections: ")
        return self._change(ctx, justified[0], diag)

    def diagnosis(self, ctx: PolicyContext) -> Diagnosis:
        best_sig = None
        accepted = [r for r in ctx.records if r.accepted]
        if accepted:
            best_sig = accepted[-1].signature
        own = [r for r in ctx.records if (best_sig is None and r.kind == "baseline" or r.signature == best_sig)
               and r.outcome is not TrialOutcome.REFUSED]
        if own and own[-1].outcome is TrialOutcome.OOM:
            return diagnose(own[-1], ctx.best)
        pool = [r for r in own if r.measurement is not None and r.outcome is TrialOutcome.SUCCEEDED]
        if pool:
            return diagnose(pool[-1], ctx.best)
        return diagnose(ctx.best_measurement, ctx.best)

    def veto(self, ctx: PolicyContext, diag: Diagnosis | None = None,
             ranked: Sequence[Candidate] | None = None) -> Candidate | None:
        """The untried high-value move that overrules a stop, or ``None`` if stopping is justified."""
        diag = diag or self.diagnosis(ctx)
        ranked = ranked if ranked is not None else self.candidates(ctx, diag)
        for c in ranked:
            if c.expected_gain >= max(self.high_value_gain, ctx.noise_floor):
                return c
        return None

    def veto_change(self, ctx: PolicyContext, why: str) -> Change | None:
        """A :class:`Change` that overrules an external stop (e.g. an LLM's), or ``None``."""
        diag = self.diagnosis(ctx)
        c = self.veto(ctx, diag)
        return self._change(ctx, c, diag, prefix=f"stop vetoed ({why}): ") if c else None

    def best_value_for(self, ctx: PolicyContext, knob: str) -> Change | None:
        """The playbook's best admissible move on one knob (the LLM's hybrid mode picks knobs, we pick values)."""
        diag = self.diagnosis(ctx)
        for c in self.candidates(ctx, diag):
            if c.knob == knob:
                return self._change(ctx, c, diag)
        return None

    def candidates(self, ctx: PolicyContext, diag: Diagnosis) -> list[Candidate]:
        """Every admissible, untried adjacent move, scored and ordered (best first)."""
        lessons = self._lessons_in_scope(ctx)
        out: list[Candidate] = []
        for order, knob_name in enumerate(ctx.search_space):
            if knob_name not in ctx.catalogue:
                continue
            current = ctx.best.knob(knob_name)
            for value, past in self._steps(ctx, knob_name, current):
                direction = direction_of(ctx.catalogue, knob_name, current, value)
                cand = self._score(ctx, diag, knob_name, value, direction, lessons)
                if cand is None:
                    continue
                if past is not None:
                    cand = Candidate(change=cand.change, knob=knob_name, direction=direction, tier=cand.tier,
                                     expected_gain=cand.expected_gain * 0.8, cost=cand.cost,
                                     notes=(*cand.notes, f"stepping past inconclusive {knob_name}={past}"),
                                     stepped=True)
                change = self._admissible_change(ctx, knob_name, value)
                if change is None:
                    continue
                out.append(Candidate(change=change, knob=knob_name, direction=direction, tier=cand.tier,
                                     expected_gain=cand.expected_gain, cost=cand.cost, notes=cand.notes,
                                     stepped=cand.stepped))
        index = {k: i for i, k in enumerate(ctx.search_space)}
        out.sort(key=lambda c: (c.expected_gain < self.min_expected_gain, c.stepped, c.tier, -round(c.gain_per_hour, 6),
                                index.get(c.knob, 99),
                                str(c.value)))
        return out

    def _steps(self, ctx: PolicyContext, knob: str, current: KnobValue) -> list[tuple[KnobValue, KnobValue | None]]:
        """Adjacent values; where an adjacent value was measured from this best and was *inconclusive* (within
        the noise floor, not a failure), the next value in that direction too (a plateau is not a wall)."""
        vals = list(ctx.catalogue[knob].values)
        out: list[tuple[KnobValue, KnobValue | None]] = [(v, None) for v in ctx.catalogue[knob].neighbours(current)]
        if current not in vals or ctx.catalogue[knob].type == "bool":
            return out
        i = vals.index(current)
        best_sig = signature(ctx.best)
        parents = {r.signature for r in ctx.records if r.accepted} | {best_sig}
        for step in (1, -1):
            j = i + step
            if not 0 <= j + step < len(vals):
                continue
            try:
                sig = signature(apply_change(ctx.best, {knob: vals[j]}))
            except RecipeError:
                continue
            recs = [r for r in ctx.records if r.signature == sig and r.kind == "candidate"]
            if recs and best_sig in parents and all(
                    r.outcome is TrialOutcome.SUCCEEDED and r.gain is not None and r.gain > -ctx.noise_floor
                    and not r.accepted for r in recs):
                out.append((vals[j + step], vals[j]))
        return out

    # -- scoring --------------------------------------------------------------------------------------
    def _score(self, ctx: PolicyContext, diag: Diagnosis, knob: str, value: KnobValue, direction: str,
               lessons: list[tuple[Lesson, float]]) -> Candidate | None:
        rule = rule_for(ctx.catalogue.framework, knob, direction)
        notes: list[str] = []
        gain = rule.gain
        h = _helps(rule, diag)
        if h is not None:
            gain = diag.confidence * max(h, rule.gain) + (1 - diag.confidence) * rule.gain
            notes.append(f"addresses {diag.label()}")
        if diag.bottleneck in rule.hurts:
            if rule.memory > 0 and diag.bottleneck == _MEM and diag.confidence >= 0.5:
                return None  # guard: never add memory to a recipe that is out of memory
            gain *= 0.3
            notes.append(f"works against {diag.bottleneck}")
        tier = rule.tier
        # history of this run: the same knob value tried from another parent
        for r in ctx.records:
            if r.kind != "candidate" or r.change.get(knob, object()) != value or len(r.change) > 3:
                continue
            if r.outcome.failed:
                gain *= 0.2
                notes.append(f"{knob}={value} failed earlier ({r.outcome.value})")
            elif r.outcome is TrialOutcome.SUCCEEDED and r.gain is not None and r.gain < ctx.noise_floor:
                gain *= 0.5
                notes.append(f"{knob}={value} gave {r.gain:+.1%} earlier")
        # lessons in scope
        for lesson, match in lessons:
            a = lesson.action
            if a.knob != knob or a.direction != direction:
                continue
            if lesson.is_infeasible and a.value == value:  # the move failed in scope (OOM, crash...)
                if match >= INFEASIBLE_PRUNE_MATCH:
                    notes.append(f"pruned by lesson {lesson.id} (failed: {', '.join(lesson.failures)})")
                    return None
                gain *= 0.1
                notes.append(f"lesson {lesson.id}: failed in a related scope ({', '.join(lesson.failures)})")
                continue
            weight = match * (1.0 if lesson.condition.bottleneck == diag.bottleneck else 0.6)
            weight *= 1.0 if a.value == value else 0.8
            if lesson.status == "confirmed" and lesson.mean_effect > 0:
                gain = max(gain, weight * lesson.mean_effect)
                tier = -1
                notes.append(f"lesson {lesson.id} confirmed {lesson.mean_effect:+.1%}")
            elif lesson.status == "disproven":
                if weight >= 0.8:
                    notes.append(f"pruned by lesson {lesson.id} (disproven)")
                    return None
                gain *= 0.2
                notes.append(f"lesson {lesson.id} disproven")
            else:
                gain = (1 - 0.5 * weight) * gain + 0.5 * weight * lesson.mean_effect
                notes.append(f"lesson {lesson.id} hypothesis {lesson.mean_effect:+.1%}")
        return Candidate(change={knob: value}, knob=knob, direction=direction, tier=tier,
                         expected_gain=gain, cost=rule.cost, notes=tuple(notes))

    def _lessons_in_scope(self, ctx: PolicyContext) -> list[tuple[Lesson, float]]:
        if self.lessons is None:
            return []
        try:
            return self.lessons.in_scope(ctx.baseline, backend=ctx.backend,
                                         include_simulated=self.include_simulated_lessons)
        except Exception as err:  # noqa: BLE001 - a broken lessons file must not stop tuning
            log.warning("lessons unavailable: %s", err)
            return []

    # -- admissibility with coupled completion --------------------------------------------------------
    def _admissible_change(self, ctx: PolicyContext, knob: str, value: KnobValue) -> dict[str, KnobValue] | None:
        change = {knob: value}
        if ctx.admissible(change):
            return change
        group = ctx.catalogue[knob].coupling_group
        if group == knob:
            return None
        try:  # complete coupled knobs only for a move the gate refuses alone, never for one already tried
            if signature(apply_change(ctx.best, change)) in ctx.tried:
                return None
        except RecipeError:
            pass
        # complete with coupled knobs still at their baseline value (never undo an accepted move)
        mates = [k for k, kn in ctx.catalogue.knobs.items() if kn.coupling_group == group and k != knob
                 and ctx.best.knob(k) == ctx.baseline.knob(k)]
        checks = 0
        for size in (1, 2):
            for names in combinations(mates, size):
                domains = [[v for v in ctx.catalogue[n].values if v != ctx.best.knob(n)] for n in names]
                for values in product(*domains):
                    checks += 1
                    if checks > self.max_completion_checks:
                        return None
                    trial = {knob: value, **dict(zip(names, values, strict=True))}
                    if ctx.admissible(trial):
                        return trial
        return None

    # -- helpers --------------------------------------------------------------------------------------
    @staticmethod
    def _rejections_since_accept(records: Sequence[TrialRecord]) -> int:
        n = 0
        for r in reversed(records):
            if r.accepted:
                break
            if r.kind == "candidate" and r.outcome is not TrialOutcome.REFUSED and r.decision != "pending confirmation re-run":
                n += 1
        return n

    def _change(self, ctx: PolicyContext, c: Candidate, diag: Diagnosis, prefix: str = "") -> Change:
        why = f"{prefix}diagnosis {diag.label()} (confidence {diag.confidence:.2f}); {c.describe(ctx.best.knob(c.knob))}"
        if c.notes:
            why += "; " + "; ".join(c.notes)
        return Change(set=c.change, rationale=why, source=self.name)


__all__ = ["FIT", "MICRO", "OVERLAP", "SCALE", "Candidate", "PlaybookPolicy", "Rule", "rule_for"]
