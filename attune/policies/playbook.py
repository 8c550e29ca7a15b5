"""The playbook policy: a deterministic expert that maps the diagnosed bottleneck to knob moves.

How a proposal is made (no network, no randomness):

1. diagnose the current best trial (:func:`attune.agent.diagnose.diagnose`);
2. list every *adjacent* legal value of every search-space knob around the current best (one step up or down the
   knob's domain), and, where the catalogue has a memory model, the *largest* step along an ordered knob in its
   memory-costly direction that the model predicts still fits (micro-batch 1 → 8 in one trial instead of three);
   complete coupled knobs of the same group only where the single move alone is inadmissible, and, where the move
   alone is predicted to run out of memory, with knobs of a coupling group the catalogue declares coupled to it
   (fewer pipeline stages *with* the distributed optimizer, less TP *with* more EP, no recompute *with* a smaller
   micro-batch, a bigger micro-batch *with* more EP): the gate admits that as one change, and it is measured and
   reported as one. From one best, a move gets at most two completions: first the one the rules like best, then,
   if that was not kept, the one that changes the fewest knobs;
3. give each move an expected relative gain (a prior from the rule table, raised where the move addresses the
   diagnosed bottleneck, lowered where it fights it, corrected by this run's history and by lessons in scope), a
   relative cost (a compile trial costs about three ordinary ones) and a tier (**fit**, **scale**, **overlap**,
   **micro-tuning**); moves of one coupling group that are each worth a trial are also offered together
   (*bundles*: the distributed optimizer and both overlaps in one trial);
4. drop moves the gate would refuse, that were already tried (``ctx.admissible``), that never leave the declared
   search space, or that the memory model says cannot fit;
5. propose the first move ordered by expected gain per accelerator-hour (lessons first; fit moves first while the
   recipe is out of memory), fresh adjacent moves before steps past an inconclusive neighbour.

**When the rules run dry** and budget is left, the playbook does not stop (unless ``stop_early``): it goes on with
the next best evidence: rule moves whose prior is below the threshold, second-order moves (a value measured from an
earlier parent, tried again from the new best), and a model-based proposal over the untried admissible one-group
moves (a ridge-regression surrogate of log throughput over knob values fitted on this run's measurements, with a
bonus for values never measured). ``stop_early=True`` restores the diminishing-returns stop to save hours.

A *premature-stop veto* keeps a run going: a stop (the playbook's own diminishing-returns stop or an LLM's stop
flag) is overruled while an untried high-value move remains.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import combinations, product
from typing import Any

from attune.agent.diagnose import Diagnosis, diagnose
from attune.agent.lessons import (
    INFEASIBLE_PRUNE_MATCH,
    Lesson,
    LessonStore,
    direction_of,
    estimate,
    job_features,
)
from attune.agent.surrogate import KnobSurrogate
from attune.engine.policy import Policy, PolicyContext, Stop
from attune.errors import RecipeError
from attune.frameworks.base import Rule, Tier
from attune.recipe.catalogue import Catalogue, KnobValue
from attune.recipe.change import Change, apply_change, signature
from attune.recipe.model import Recipe
from attune.trial import Decision, TrialKind, TrialOutcome, TrialRecord

log = logging.getLogger(__name__)

FIT, SCALE, OVERLAP, MICRO = Tier.FIT, Tier.SCALE, Tier.OVERLAP, Tier.MICRO
TIER_NAMES: dict[int, str] = {Tier.LESSON: "lesson", FIT: "fit", SCALE: "scale", OVERLAP: "overlap",
                              MICRO: "micro-tuning"}

_MEM = "memory_capacity"
_DEFAULT = Rule(MICRO, 0.005)
MEMORY_MARGIN = 0.94
"""A jump along a knob must be predicted to fit in this share of the device (the model and the allocator err)."""
EXPLORE_SHARE = 0.25
"""With the rule moves spent and budget left, a move the model of this run rates this share of
``min_expected_gain`` is still worth the budget that would otherwise go unspent."""
NEAR_CLIFF = 0.985
"""A move predicted above this share of the device is a gamble (allocator variation): its expected gain is halved."""


def rule_for(catalogue: Catalogue | str, knob: str, direction: str) -> Rule:
    """The prior for moving ``knob`` in ``direction``: the catalogue's own rules where a recipe declares its knobs
    (``command``), else its framework package's rule table (``catalogue`` may be the framework's name)."""
    from attune import frameworks

    if isinstance(catalogue, Catalogue) and catalogue.rules is not None:
        rule = catalogue.rules.get((knob, direction), _DEFAULT)
        return rule if isinstance(rule, Rule) else _DEFAULT
    try:
        rules = frameworks.get(catalogue.framework if isinstance(catalogue, Catalogue) else catalogue).rules
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
    steps: int = 1  # steps along the knob's domain (more than one: a jump the memory model says fits)
    lessons: tuple[str, ...] = ()  # the lessons that moved its expected gain
    adds_memory: bool = False  # the move alone adds memory to a memory-bound recipe (admitted only completed)

    @property
    def value(self) -> KnobValue:
        return self.change[self.knob]

    @property
    def gain_per_hour(self) -> float:
        return self.expected_gain / self.cost

    def describe(self, current: KnobValue) -> str:
        extra = f" (with {', '.join(f'{k}={v}' for k, v in self.change.items() if k != self.knob)})" \
            if len(self.change) > 1 else ""
        return (f"{self.knob}: {current} → {self.value}{extra} [{TIER_NAMES.get(self.tier, str(self.tier))} tier, "
                f"expected {self.expected_gain:+.1%}, cost ×{self.cost:g}]")


#: measured phases (per-step seconds) behind each bottleneck label a rule may help
_PHASES = {"pipeline_bubble": ("pp_bubble", "bubble"), "communication:tp": ("tp_comm",),
           "communication:dp": ("dp_exposed", "dp_comm"), "communication:pp": ("pp_p2p", "pp_comm"),
           "communication:ep": ("ep_comm", "a2a"), "communication:cp": ("cp_comm",),
           "host_overhead": ("host_overhead", "host", "launch"), "data_loading": ("data", "data_loading")}
REMOVABLE = 0.6
"""Share of a measured phase a move that addresses it is expected to remove."""


def phase_shares(ctx: PolicyContext) -> dict[str, float]:
    """Share of the best's step each bottleneck label's phases take (from the best trial's phase timers)."""
    m = ctx.best_measurement
    if m is None or not m.phases or not m.step_time_median_s:
        return {}
    step = max(m.step_time_median_s, sum(v for v in m.phases.values() if v > 0))
    out = {}
    for label, keys in _PHASES.items():
        v = sum(m.phases.get(k, 0.0) for k in keys)
        if v > 0:
            out[label] = v / step
    return out


def _from_shares(rule: Rule, shares: dict[str, float]) -> float:
    """The gain a move is expected to bring by removing part of the measured phases it addresses: up to
    ``REMOVABLE`` of the phase, less where the rule says it addresses that bottleneck only weakly (the rule's own
    coefficient: manual GC removes GC pauses, not the launch overhead counted with them)."""
    best = 0.0
    for key, coeff in rule.helps.items():
        s = shares.get(key, 0.0) if ":" in key or key in shares else sum(
            v for k, v in shares.items() if k.startswith(key + ":"))
        removed = min(REMOVABLE, 4 * coeff) * s
        if removed > 0:
            best = max(best, removed / (1 - removed))
    return best


def _phase_total(rule: Rule, shares: dict[str, float]) -> float:
    return sum(shares.get(k, 0.0) for k in rule.helps)


def _mfu(ctx: PolicyContext) -> float | None:
    m = ctx.best_measurement
    v = (m.signals or {}).get("mfu") if m is not None else None
    return float(v) if isinstance(v, (int, float)) and 0 < v <= 1 else None


def _helps(rule: Rule, diag: Diagnosis) -> float | None:
    best = None
    for key, g in rule.helps.items():
        b, _, sub = key.partition(":")
        if b != diag.bottleneck:
            continue
        v = g if not sub or diag.sub_kind in (None, sub) else g * 0.4
        best = v if best is None else max(best, v)
    return best


_OPPOSITE = {"up": "down", "down": "up", "enable": "disable", "disable": "enable"}


def completion_value(cat: Any, best: Recipe, extra: dict[str, KnobValue]) -> float:
    """What a coupled completion adds to a move's expected gain: each completing move's prior, less what undoing it
    would gain (turning recompute back on costs what turning it off gains)."""
    total = 0.0
    for n, v in extra.items():
        d = direction_of(cat, n, best.knob(n), v)
        total += rule_for(cat, n, d).gain - (rule_for(cat, n, _OPPOSITE[d]).gain
                                                       if d in _OPPOSITE else 0.0) - 0.001
    return total


def _steps_moved(cat: Any, best: Recipe, extra: dict[str, KnobValue]) -> int:
    """How many places along each knob's catalogue values ``extra`` moves it from ``best`` (1 where a value is not
    in the list)."""
    steps = 0
    for n, v in extra.items():
        values = list(cat[n].values)
        cur = best.knob(n)
        steps += abs(values.index(v) - values.index(cur)) if v in values and cur in values else 1
    return steps


def _since_accept(records: Sequence[TrialRecord]) -> Iterator[TrialRecord]:
    """The records after the last accepted one, newest first."""
    for r in reversed(records):
        if r.accepted:
            return
        yield r


# -- how a move is scored: the catalogue rule's prior gain, then named adjustments in order --------------------------

#: a move that works against the diagnosed bottleneck keeps this share of its expected gain
AGAINST_BOTTLENECK = 0.3
#: an overlap hides at most the phase it overlaps: its gain is capped at that phase's measured share times this margin,
#: never below OVERLAP_FLOOR
OVERLAP_MARGIN = 1.1
OVERLAP_FLOOR = 0.004
#: a bigger work unit (a SCALE move that adds memory) helps where kernels are small: its gain is scaled by
#: (MFU_KNEE - mfu) / MFU_SPAN, within MFU_SCALE
MFU_KNEE = 0.42
MFU_SPAN = 0.12
MFU_SCALE = (0.15, 1.5)
#: a parallel dimension taken to its smallest value that the model still fits without (at most this share of the
#: device's memory) is worth at least UNNEEDED_DIM_GAIN: its bubble, imbalance and communication go
UNNEEDED_DIM_SHARE = 0.85
UNNEEDED_DIM_GAIN = 0.08
#: the same knob value tried earlier in this run from another parent: it failed (this share left) or gained less than
#: the noise floor (this share left)
FAILED_EARLIER = 0.2
NO_GAIN_EARLIER = 0.5
#: a move further along a knob than a step that already lost
FURTHER_THAN_A_LOSS = 0.2
#: the move failed in a related scope (a lesson below the prune match)
FAILED_NEARBY = 0.1


@dataclass(frozen=True)
class Move:
    """What a move's score reads: the policy (for its memory model and lessons bookkeeping), the context, the
    diagnosis, the knob and value, the catalogue rule, the measured phase shares and the lessons in scope."""

    policy: PlaybookPolicy
    ctx: PolicyContext
    diag: Diagnosis
    knob: str
    value: KnobValue
    direction: str
    rule: Rule
    shares: dict[str, float]
    lessons: list[tuple[Lesson, float]]


@dataclass
class Score:
    """A move's expected gain as the rules adjust it, with why (``notes``), whether it adds memory to a recipe that is
    out of it, the lessons that moved it, and whether a rule pruned it."""

    gain: float
    notes: list[str] = field(default_factory=list)
    adds_memory: bool = False
    lesson_ids: tuple[str, ...] = ()
    pruned: bool = False


def _addresses_the_bottleneck(m: Move, s: Score) -> None:
    h = _helps(m.rule, m.diag)
    if h is not None:
        s.gain = m.diag.confidence * max(h, m.rule.gain) + (1 - m.diag.confidence) * m.rule.gain
        s.notes.append(f"addresses {m.diag.label()}")


def _works_against_the_bottleneck(m: Move, s: Score) -> None:
    if m.diag.bottleneck not in m.rule.hurts:
        return
    if m.rule.memory > 0 and m.diag.bottleneck == _MEM and m.diag.confidence >= 0.5:
        # guard: never add memory to a recipe that is out of memory; the move is kept only with a coupled
        # completion that lowers the predicted peak (fewer stages *with* more TP)
        s.adds_memory = True
        s.notes.append("adds memory: only with a completion that frees more")
    else:
        s.gain *= AGAINST_BOTTLENECK
        s.notes.append(f"works against {m.diag.bottleneck}")


def _measured_phases(m: Move, s: Score) -> None:
    from_phases = _from_shares(m.rule, m.shares)
    if from_phases > s.gain:
        s.gain = from_phases
        s.notes.append(f"measured phases it addresses: {from_phases:+.1%}")


def _overlap_cap(m: Move, s: Score) -> None:
    rule = m.rule
    if rule.tier == OVERLAP and m.shares and rule.helps and all(k in _PHASES for k in rule.helps):
        cap = max(_phase_total(rule, m.shares) * OVERLAP_MARGIN, OVERLAP_FLOOR)
        if s.gain > cap:  # an overlap hides a phase: it cannot gain more than that phase's share
            s.gain = cap
            s.notes.append(f"capped by the measured phase it hides ({cap:.1%})")


def _kernel_efficiency(m: Move, s: Score) -> None:
    mfu = _mfu(m.ctx)
    if mfu is not None and m.rule.memory > 0 and m.rule.tier == SCALE and "compute_bound" in m.rule.helps:
        scale = min(MFU_SCALE[1], max(MFU_SCALE[0], (MFU_KNEE - mfu) / MFU_SPAN))
        s.gain *= scale
        s.notes.append(f"MFU {mfu:.0%}: kernels {'already' if scale < 0.5 else 'not yet'} efficient")


def _unneeded_parallel_dimension(m: Move, s: Score) -> None:
    knob, value, rule = m.knob, m.value, m.rule
    smallest = min((v for v in m.ctx.catalogue[knob].values if isinstance(v, int)), default=None)
    if m.direction == "down" and value == smallest and rule.memory > 0 and rule.tier == SCALE \
            and isinstance(value, int):
        share = m.policy._fit_share(m.ctx, {knob: value})
        if share is not None and share <= UNNEEDED_DIM_SHARE:
            s.gain = max(s.gain, UNNEEDED_DIM_GAIN)
            s.notes.append(f"{knob}={value} fits without it ({share:.0%} of device memory)")


def _tried_earlier_in_this_run(m: Move, s: Score) -> None:
    for r in m.ctx.records:  # the same knob value tried from another parent
        if r.kind != TrialKind.CANDIDATE or r.change.get(m.knob, object()) != m.value or len(r.change) > 3:
            continue
        if r.outcome.failed:
            s.gain *= FAILED_EARLIER
            s.notes.append(f"{m.knob}={m.value} failed earlier ({r.outcome.value})")
        elif r.outcome is TrialOutcome.SUCCEEDED and r.gain is not None and r.gain < m.ctx.noise_floor:
            s.gain *= NO_GAIN_EARLIER
            s.notes.append(f"{m.knob}={m.value} gave {r.gain:+.1%} earlier")


def _further_than_a_loss(m: Move, s: Score) -> None:
    further = m.policy._further_than_a_loss(m.ctx, m.knob, m.value)
    if further is not None:
        s.gain *= FURTHER_THAN_A_LOSS
        s.notes.append(further)


def _failed_in_scope(m: Move, s: Score) -> None:
    """A failure in scope prunes the move; one in a related scope leaves it :data:`FAILED_NEARBY` of its gain."""
    for lesson, match in m.lessons:
        a = lesson.action
        if not (a.knob == m.knob and a.direction == m.direction and a.value == m.value and lesson.is_infeasible):
            continue
        if match >= INFEASIBLE_PRUNE_MATCH:  # the move failed in scope (OOM, crash...)
            s.notes.append(f"pruned by lesson {lesson.id} (failed: {', '.join(lesson.failures)})")
            s.pruned = True
            return
        s.gain *= FAILED_NEARBY
        s.notes.append(f"lesson {lesson.id}: failed in a related scope ({', '.join(lesson.failures)})")


def _measured_on_alike_jobs(m: Move, s: Score) -> None:
    """Measured effects on alike jobs correct the prior (:func:`attune.agent.lessons.estimate`), at most once per
    run, and not for a knob this run has already contradicted."""
    if m.lessons and not m.policy._lessons_spent(m.ctx, m.knob, m.value):
        est = estimate(m.lessons, m.knob, m.direction, m.value, m.policy._features(m.ctx), s.gain)
        if est.moved:
            s.gain = est.gain
            s.lesson_ids = est.lesson_ids
            s.notes.append(est.note())


#: the adjustments a move's expected gain goes through, in order, each named (its notes say which applied)
SCORE_RULES: tuple[tuple[str, Callable[[Move, Score], None]], ...] = (
    ("addresses the bottleneck", _addresses_the_bottleneck),
    ("works against the bottleneck", _works_against_the_bottleneck),
    ("measured phases", _measured_phases),
    ("overlap cap", _overlap_cap),
    ("kernel efficiency", _kernel_efficiency),
    ("unneeded parallel dimension", _unneeded_parallel_dimension),
    ("tried earlier in this run", _tried_earlier_in_this_run),
    ("further than a loss", _further_than_a_loss),
    ("failed in scope", _failed_in_scope),
    ("measured on alike jobs", _measured_on_alike_jobs),
)


class PlaybookPolicy(Policy):
    """Bottleneck-driven expert rules: one adjacent, admissible, never-tried knob move at a time."""

    name = "playbook"

    def __init__(self, *, lessons: LessonStore | None = None, min_expected_gain: float = 0.01,
                 high_value_gain: float = 0.05, patience: int = 4, max_completion_checks: int = 150,
                 include_simulated_lessons: bool = False, seed: int = 0, stop_early: bool = False,
                 max_jump_steps: int = 3, memory_margin: float = MEMORY_MARGIN, max_model_candidates: int = 400
                 ) -> None:
        self.lessons = lessons
        #: let lessons measured on the simulator (or of unknown provenance) steer a run on real hardware
        self.include_simulated_lessons = include_simulated_lessons
        self.min_expected_gain = min_expected_gain
        self.high_value_gain = high_value_gain
        self.patience = patience
        self.max_completion_checks = max_completion_checks
        #: stop once ``patience`` candidates in a row gave nothing and no high-value move is left (saves hours);
        #: otherwise go on with the next best evidence while budget is left
        self.stop_early = stop_early
        self.max_jump_steps = max_jump_steps
        self.memory_margin = memory_margin
        self.max_model_candidates = max_model_candidates
        self._mem_cache: dict[str, tuple[float, float] | None] = {}
        self._diag: Diagnosis | None = None
        self._feature_cache: tuple[str, dict[str, float]] | None = None

    # -- public API -----------------------------------------------------------------------------------
    def propose(self, ctx: PolicyContext) -> Change | Stop:
        diag = self.diagnosis(ctx)
        ranked = self.candidates(ctx, diag)
        justified = [c for c in ranked if c.expected_gain >= self.min_expected_gain]
        stale = self._rejections_since_accept(ctx.records)
        if justified and stale < self.patience:
            return self._change(ctx, justified[0], diag)
        if justified:
            vetoing = self.veto(ctx, diag, justified)
            if vetoing is not None:
                return self._change(ctx, vetoing, diag, prefix=f"stop vetoed after {stale} rejections: ")
            if self.stop_early:
                return Stop(f"{stale} candidates in a row gave no gain and no untried high-value move remains "
                            f"(diagnosis {diag.label()})")
            return self._change(ctx, justified[0], diag,
                                prefix=f"budget left after {stale} rejections: next best rule move: ")
        if self.stop_early:
            if not ranked:
                return Stop("no admissible, untried adjacent move is left in the search space "
                            f"(diagnosis: {diag.label()})")
            top = "; ".join(c.describe(ctx.best.knob(c.knob)) for c in ranked[:3])
            return Stop(f"no move is expected to gain at least {self.min_expected_gain:.1%} "
                        f"(diagnosis {diag.label()}); best remaining: {top}")
        # budget left and no stop asked for: the best-rated untried move (the model of this run's measurements
        # ranks the rule moves among every one-group move), however small its predicted gain; the run stops when
        # every admissible move has been tried or the budget is spent
        scored = self.model_based(ctx, diag, ranked)
        if scored is not None:
            score, change = scored
            if score < EXPLORE_SHARE * self.min_expected_gain:
                change = change.model_copy(update={"rationale": f"budget left, nothing predicted to gain "
                                                                f"{self.min_expected_gain:.1%}: the next best "
                                                                f"untried move ({score:+.1%}); {change.rationale}"})
            return change
        if ranked:
            return self._change(ctx, ranked[0], diag, prefix="budget left: the next untried rule move: ")
        return Stop("every admissible move has been tried: none is left in the search space, adjacent, coupled or "
                    f"one-group (diagnosis: {diag.label()})")

    def diagnosis(self, ctx: PolicyContext) -> Diagnosis:
        best_sig = None
        accepted = [r for r in ctx.records if r.accepted]
        if accepted:
            best_sig = accepted[-1].signature
        own = [r for r in ctx.records if ((best_sig is None and r.kind == "baseline") or r.signature == best_sig)
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
        """Every admissible, untried move (adjacent, memory-sized jumps, coupled, bundled), scored, best first."""
        self._diag = diag
        lessons = self._lessons_in_scope(ctx)
        now = self._share(ctx, ctx.best)  # the best's predicted peak: a move that adds memory must end below it
        out: list[Candidate] = []
        for knob_name in ctx.search_space:
            if knob_name not in ctx.catalogue:
                continue
            current = ctx.best.knob(knob_name)
            for value, past, steps in self._steps(ctx, knob_name, current):
                direction = direction_of(ctx.catalogue, knob_name, current, value)
                cand = self._score(ctx, diag, knob_name, value, direction, lessons)
                if cand is None:
                    continue
                gain, notes, stepped = cand.expected_gain, list(cand.notes), False
                if past is not None:
                    gain *= 0.8
                    notes.append(f"stepping past inconclusive {knob_name}={past}")
                    stepped = True
                if steps > 1:
                    gain *= 1 + 0.5 * (steps - 1)
                    notes.append(f"{steps} steps at once: the memory model says {knob_name}={value} fits")
                change = self._admissible_change(ctx, knob_name, value)
                if change is None:
                    continue
                fit = self._fit_share(ctx, change)
                if fit is not None and fit > 1.0:
                    continue  # the memory model says it cannot fit, even with a coupled completion
                if fit is not None and fit > NEAR_CLIFF:
                    gain *= 0.5
                    notes.append(f"predicted at {fit:.1%} of device memory")
                extra = {k: v for k, v in change.items() if k in ctx.catalogue
                         and ctx.catalogue[k].coupling_group != ctx.catalogue[knob_name].coupling_group}
                if cand.adds_memory and (not extra or fit is None or now is None or fit >= now):
                    continue  # out of memory already: only a completion that frees memory may carry it
                if extra:
                    gain += completion_value(ctx.catalogue, ctx.best, extra)
                    notes.append("coupled: the move alone is predicted not to fit")
                out.append(Candidate(change=change, knob=knob_name, direction=direction, tier=cand.tier,
                                     expected_gain=gain, cost=cand.cost, notes=tuple(notes), stepped=stepped,
                                     steps=steps, lessons=cand.lessons))
        out += self._bundles(ctx, out)
        return self._rank(ctx, diag, out)

    def _rank(self, ctx: PolicyContext, diag: Diagnosis, out: list[Candidate]) -> list[Candidate]:
        index = {k: i for i, k in enumerate(ctx.search_space)}
        memory_bound = diag.bottleneck == _MEM and diag.confidence >= 0.5

        def first(c: Candidate) -> int:
            return 1 if memory_bound and c.tier == FIT else 2

        seen: set[str] = set()
        unique = []
        for c in sorted(out, key=lambda c: (c.expected_gain < self.min_expected_gain, c.stepped, first(c),
                                             -round(c.gain_per_hour, 6), c.tier, index.get(c.knob, 99),
                                             str(c.value))):
            key = repr(sorted(c.change.items(), key=lambda kv: kv[0]))
            if key not in seen:
                seen.add(key)
                unique.append(c)
        return unique

    def _steps(self, ctx: PolicyContext, knob: str,
               current: KnobValue) -> list[tuple[KnobValue, KnobValue | None, int]]:
        """(value, inconclusive value stepped past, steps) of each move along ``knob``: the adjacent values; where an
        adjacent value was measured from this best and was *inconclusive* (within the noise floor, not a failure),
        the next value in that direction too (a plateau is not a wall); and the farthest value (up to
        ``max_jump_steps``) in a memory-costly direction that the memory model says fits."""
        k = ctx.catalogue[knob]
        vals = list(k.values)
        out: list[tuple[KnobValue, KnobValue | None, int]] = [(v, None, 1) for v in k.neighbours(current)]
        if current not in vals or k.type == "bool":
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
                out.append((vals[j + step], vals[j], 2))
        if k.type != "int" or ctx.catalogue.memory_model is None:
            return out
        shares = phase_shares(ctx)
        for step in (1, -1):
            direction = "up" if step > 0 else "down"
            rule = rule_for(ctx.catalogue, knob, direction)
            if rule.memory <= 0:
                continue
            if any(shares.get(h, 0.0) >= 0.03 for h in rule.hurts):
                continue  # a long step would grow a phase this move makes worse (a bigger pipeline bubble)
            mfu = _mfu(ctx)
            if mfu is not None and rule.tier == SCALE and "compute_bound" in rule.helps and mfu >= 0.36:
                continue  # kernels already efficient: no reason to jump
            far = None
            for n in range(2, self.max_jump_steps + 1):
                j = i + step * n
                if not 0 <= j < len(vals):
                    break
                try:
                    cand = apply_change(ctx.best, {knob: vals[j]})
                except RecipeError:
                    continue
                if ctx.catalogue.constraint_problems(cand):
                    continue
                share = self._share(ctx, cand)
                if share is None:
                    break
                if share > 1.0:  # less model parallelism fits only with a coupled completion that frees memory
                    if step > 0 or self._completed_share(ctx, knob, vals[j]) > self.memory_margin:
                        break
                elif share > self.memory_margin:
                    break
                far = (vals[j], n)
            if far is not None and all(v != far[0] for v, _, _ in out):
                out.append((far[0], None, far[1]))
        return out

    # -- memory --------------------------------------------------------------------------------------
    def _share(self, ctx: PolicyContext, recipe: Recipe) -> float | None:
        """Predicted peak memory of ``recipe`` as a share of the device (``None`` without a memory model)."""
        model = ctx.catalogue.memory_model
        if model is None:
            return None
        sig = signature(recipe)
        if sig not in self._mem_cache:
            try:
                self._mem_cache[sig] = model(recipe)
            except Exception:  # noqa: BLE001 - a model that cannot judge predicts nothing
                self._mem_cache[sig] = None
        mem = self._mem_cache[sig]
        return None if mem is None or not mem[1] else mem[0] / mem[1]

    def _completed_share(self, ctx: PolicyContext, knob: str, value: KnobValue) -> float:
        """Predicted peak share of the move ``knob=value`` with the coupled completion that makes it fit (inf if
        none does)."""
        change = self._within_group(ctx, knob, value)
        completed = self._coupled_completion(ctx, knob, change) if change is not None else None
        share = self._fit_share(ctx, completed) if completed is not None else None
        return float("inf") if share is None else share

    def _fit_share(self, ctx: PolicyContext, change: dict[str, KnobValue]) -> float | None:
        try:
            return self._share(ctx, apply_change(ctx.best, change))
        except RecipeError:
            return None

    # -- bundles --------------------------------------------------------------------------------------
    def _bundles(self, ctx: PolicyContext, singles: list[Candidate]) -> list[Candidate]:
        """Per coupling group, the moves of different knobs each worth a trial, as one change (one trial)."""
        by_group: dict[str, list[Candidate]] = {}
        for c in singles:
            if c.expected_gain < self.min_expected_gain or c.stepped or c.steps > 1:
                continue
            if not all(k in ctx.catalogue and ctx.catalogue[k].coupling_group == ctx.catalogue[c.knob].coupling_group
                       for k in c.change):
                continue
            by_group.setdefault(ctx.catalogue[c.knob].coupling_group, []).append(c)
        out = []
        for group, cands in by_group.items():
            best_per_knob: dict[str, Candidate] = {}
            for c in sorted(cands, key=lambda c: -c.expected_gain):
                best_per_knob.setdefault(c.knob, c)
            picks = list(best_per_knob.values())
            if len(picks) < 2:
                continue
            merged: dict[str, KnobValue] = {}
            ok = True
            for c in picks:
                for k, v in c.change.items():
                    if k in merged and merged[k] != v:
                        ok = False
                    merged[k] = v
            if not ok or not ctx.admissible(merged):
                continue
            share = self._fit_share(ctx, merged)
            if share is not None and share > NEAR_CLIFF:
                continue
            top = picks[0]
            gain = top.expected_gain + 0.8 * sum(c.expected_gain for c in picks[1:])  # the parts may overlap
            out.append(Candidate(change=merged, knob=top.knob, direction=top.direction, tier=min(c.tier for c in picks),
                                 expected_gain=gain, cost=max(c.cost for c in picks),
                                 notes=(f"bundle of {group}: {', '.join(c.knob for c in picks)} in one trial",)))
        return out

    # -- when the rules run dry: a model over the untried admissible one-group moves ------------------
    def model_based(self, ctx: PolicyContext, diag: Diagnosis,
                    ranked: Sequence[Candidate] = ()) -> tuple[float, Change] | None:
        """(score, change) of the untried admissible move a surrogate of this run's measurements rates best.

        Candidates are every one-group move of the search space and the rule moves (coupled and jumps included).
        The surrogate is a ridge regression of log throughput on one-hot knob values over every measured trial;
        a value never measured gets a bonus (it is the evidence still missing), and half the rule prior of the move
        is added. Moves the memory model says cannot fit are skipped. ``None`` when no move is admissible.
        """
        space = [k for k in ctx.search_space if k in ctx.catalogue]
        surrogate = KnobSurrogate.fit(ctx.records, space)
        if surrogate is None:
            return None

        priors = {repr(sorted(c.change.items(), key=lambda kv: kv[0])): c for c in ranked}
        best: tuple[float, dict[str, KnobValue], str] | None = None
        moves = [dict(c.change) for c in ranked] + self._one_group_moves(ctx, space)
        done: set[str] = set()
        for change in moves:
            key = repr(sorted(change.items(), key=lambda kv: kv[0]))
            if key in done:
                continue
            done.add(key)
            if key not in priors and not ctx.admissible(change):
                continue
            share = self._fit_share(ctx, change)
            if share is not None and share > 1.0:
                continue
            delta, unseen = surrogate.predict(change, ctx.best)
            prior = priors.get(key)
            score = delta + 0.02 * unseen + (0.5 * prior.expected_gain if prior else 0.0)
            if share is not None and share > NEAR_CLIFF:
                score -= 0.02
            if best is None or score > best[0]:
                best = (score, change, f"surrogate {delta:+.1%}, {unseen} value(s) never measured"
                                       + (f", rule prior {prior.expected_gain:+.1%}" if prior else ""))
        if best is None:
            return None
        score, change, why = best
        label = ", ".join(f"{k}: {ctx.best.knob(k)} → {v}" for k, v in change.items())
        return score, Change(set=change, source=self.name,
                             rationale=f"budget left, rule moves spent: model-based proposal over the untried "
                                       f"admissible moves ({why}); {label}; diagnosis {diag.label()}")

    def _one_group_moves(self, ctx: PolicyContext, space: Sequence[str]) -> list[dict[str, KnobValue]]:
        """Every change of the search space's knobs within one coupling group (up to three knobs), bounded."""
        groups: dict[str, list[str]] = {}
        for k in space:
            groups.setdefault(ctx.catalogue[k].coupling_group, []).append(k)
        moves: list[dict[str, KnobValue]] = []
        for names in groups.values():
            for size in range(1, min(3, len(names)) + 1):
                for subset in combinations(names, size):
                    domains = [[v for v in ctx.catalogue[n].values if v != ctx.best.knob(n)] for n in subset]
                    for values in product(*domains):
                        moves.append(dict(zip(subset, values, strict=True)))
        if len(moves) > self.max_model_candidates:
            step = len(moves) / self.max_model_candidates
            moves = [moves[int(i * step)] for i in range(self.max_model_candidates)]
        return moves

    # -- scoring --------------------------------------------------------------------------------------
    def _score(self, ctx: PolicyContext, diag: Diagnosis, knob: str, value: KnobValue, direction: str,
               lessons: list[tuple[Lesson, float]]) -> Candidate | None:
        """The move ``knob = value`` with its expected gain: the catalogue rule's prior, adjusted by each of
        :data:`SCORE_RULES` in turn (None: a rule pruned it)."""
        rule = rule_for(ctx.catalogue, knob, direction)
        move = Move(policy=self, ctx=ctx, diag=diag, knob=knob, value=value, direction=direction, rule=rule,
                    shares=phase_shares(ctx), lessons=lessons)
        score = Score(gain=rule.gain)
        for _name, adjust in SCORE_RULES:
            adjust(move, score)
            if score.pruned:
                return None
        return Candidate(change={knob: value}, knob=knob, direction=direction, tier=rule.tier,
                         expected_gain=score.gain, cost=rule.cost, notes=tuple(score.notes), lessons=score.lesson_ids,
                         adds_memory=score.adds_memory)

    @staticmethod
    def _further_than_a_loss(ctx: PolicyContext, knob: str, value: KnobValue) -> str | None:
        """Why ``knob=value`` goes at least as far, from the best's value, as a move of this run that was decisively
        slower (a loss of more than twice the noise floor, e.g. PP 8 → 16 at −30 % makes PP 32 unlikely to pay), or
        None. Integer knobs only; both moves are read as directions from the best's current value."""
        cur = ctx.best.knob(knob)
        if knob not in ctx.catalogue or ctx.catalogue[knob].type != "int" or not isinstance(cur, int) \
                or not isinstance(value, int) or value == cur:
            return None
        for r in ctx.records:
            past = r.change.get(knob)
            if (r.kind != "candidate" or r.outcome is not TrialOutcome.SUCCEEDED or r.gain is None
                    or not isinstance(past, int) or len(r.change) > 3 or r.gain > -2 * ctx.noise_floor):
                continue
            if (past - cur) * (value - cur) > 0 and abs(value - cur) >= abs(past - cur) and value != past:
                return f"{knob}={value} goes further than {knob}={past}, which gave {r.gain:+.1%}"
        return None

    def _features(self, ctx: PolicyContext) -> dict[str, float]:
        """The measured conditions of this run's current best (what lessons are matched against)."""
        key = signature(ctx.best)
        if self._feature_cache is None or self._feature_cache[0] != key:
            self._feature_cache = (key, job_features(ctx.best, ctx.best_measurement))
        return self._feature_cache[1]

    @staticmethod
    def _lessons_spent(ctx: PolicyContext, knob: str, value: KnobValue) -> bool:
        """True once this run tried ``knob=value`` (a lesson raises a move at most once per run), or measured a
        move of ``knob`` that did not pay or failed (a counter-example in this run demotes its lessons at once)."""
        for r in ctx.records:
            if r.kind != "candidate" or knob not in r.change or r.outcome is TrialOutcome.REFUSED:
                continue
            if r.change[knob] == value:
                return True
            if r.outcome.failed or (r.outcome is TrialOutcome.SUCCEEDED and r.gain is not None
                                    and r.gain < ctx.noise_floor and not r.accepted):
                return True
        return False

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
        """``{knob: value}``, completed where needed: with knobs of its own group where the move alone is
        inadmissible, and with knobs of a group the catalogue declares coupled where the move is predicted not to fit
        in memory. Completions only use search-space knobs (a tuner never steps outside the declared space)."""
        change = self._within_group(ctx, knob, value)
        if change is None:
            return None
        share = self._fit_share(ctx, change)
        if share is None or share <= 1.0:
            return change
        coupled = self._coupled_completion(ctx, knob, change)
        return coupled if coupled is not None else change

    def _within_group(self, ctx: PolicyContext, knob: str, value: KnobValue) -> dict[str, KnobValue] | None:
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
        # complete with coupled knobs of the search space still at their baseline value (never undo an accepted move)
        mates = [k for k in ctx.search_space if k in ctx.catalogue and ctx.catalogue[k].coupling_group == group
                 and k != knob and ctx.best.knob(k) == ctx.baseline.knob(k)]
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

    def _coupled_completion(self, ctx: PolicyContext, knob: str,
                            change: dict[str, KnobValue]) -> dict[str, KnobValue] | None:
        """``change`` plus knobs of a coupled group that make it fit: the completion the rules like best, or, once
        that was measured from this best and not kept, the one with the fewest knobs (``None`` after both)."""
        cat = ctx.catalogue
        tried = self._completions_since_best(ctx, change)
        if tried >= 2:
            return None  # measured from this best with the rules' and the smallest completion: enough evidence
        fewest = tried == 1  # the rules' favourite completion was measured: now the one that changes least
        group = cat[knob].coupling_group
        others = [b if a == group else a for a, b in cat.coupled_groups if group in (a, b)]
        # (knobs, the rules' score, -steps, the change): among completions the rules score alike, the one that moves its
        # knobs the fewest steps along their values gives up least (TP 2 -> 1 at micro-batch 8: 2 if it fits, not 1)
        best: tuple[int, float, int, dict[str, KnobValue]] | None = None
        checks = 0
        for other in others:
            mates = [k for k in ctx.search_space if k in cat and cat[k].coupling_group == other and k not in change]
            for size in range(1, min(3, len(mates)) + 1):
                if fewest and best is not None and best[0] < size:
                    break
                for names in combinations(mates, size):
                    domains = [[v for v in cat[n].values if v != ctx.best.knob(n)] for n in names]
                    for values in product(*domains):
                        checks += 1
                        if checks > self.max_completion_checks:
                            break
                        extra = dict(zip(names, values, strict=True))
                        trial = {**change, **extra}
                        share = self._fit_share(ctx, trial)
                        if share is None or share > NEAR_CLIFF or not ctx.admissible(trial):
                            continue
                        score = completion_value(cat, ctx.best, extra)
                        near = -_steps_moved(cat, ctx.best, extra)
                        if best is None or ((-size, score, near) > (-best[0], best[1], best[2]) if fewest
                                            else (score, near) > (best[1], best[2])):
                            best = (size, score, near, trial)
        return None if best is None else best[3]

    @staticmethod
    def _completions_since_best(ctx: PolicyContext, change: dict[str, KnobValue]) -> int:
        """How many candidates since the last accepted change made this move with a coupled completion."""
        return sum(1 for r in _since_accept(ctx.records) if r.kind == "candidate" and len(r.change) > len(change)
                   and all(k in r.change and r.change[k] == v for k, v in change.items()))

    # -- helpers --------------------------------------------------------------------------------------
    @staticmethod
    def _rejections_since_accept(records: Sequence[TrialRecord]) -> int:
        return sum(1 for r in _since_accept(records) if r.kind == TrialKind.CANDIDATE
                   and r.outcome is not TrialOutcome.REFUSED and r.status is not Decision.PENDING_CONFIRM)

    def _change(self, ctx: PolicyContext, c: Candidate, diag: Diagnosis, prefix: str = "") -> Change:
        why = f"{prefix}diagnosis {diag.label()} (confidence {diag.confidence:.2f}); {c.describe(ctx.best.knob(c.knob))}"
        if c.notes:
            why += "; " + "; ".join(c.notes)
        return Change(set=c.change, rationale=why, source=self.name, lessons=c.lessons)


__all__ = ["FIT", "MICRO", "OVERLAP", "SCALE", "Candidate", "PlaybookPolicy", "Rule", "rule_for"]
