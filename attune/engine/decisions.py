"""The decision on a finished trial (:func:`decide`): the four protocols a run's trials are judged by, in one place.

- **a baseline, reference, calibration or certification run** is noted, never judged;
- **a candidate's first run** is kept at once where it is decisive (:func:`decisive_first_run`: far above the noise at
  a strict level), rejected where it is decisively below what a gain of ``min_gain`` could read (the screen,
  :func:`screen_floor`), and otherwise measured again in A-B-A order;
- **a paired decision** keeps a change whose gain is shown at Pocock's level for its look
  (:func:`~attune.engine.acceptance.paired_gain`), asks for another look while it stays promising, and rejects it
  otherwise (:func:`look`). Its runs are interleaved so that a linear drift of the machine cancels. Where the run
  just before the candidate's first run was a run of the best (its *lead*, :func:`lead_run`: the baseline's repeat,
  the reference that ended the previous decision, the kept change's last run), that run is the first A of A-B-A:
  the best's reference run after the candidate completes the first look, which a zero-cost ``decision`` record
  takes, and each further look adds a B-A pair (the candidate, then the best). One reference run so serves the
  decisions on both sides of it. Without a lead, the candidate's runs frame the best's (B-A-B, then A-B pairs) and
  each look is taken on the candidate's run;
- **the noise-floor rule** (pairing off, or the reference failed): a candidate and its confirmation against the
  baseline's noise floor.

Every rule's statistics live in :mod:`attune.engine.acceptance`; this module reads the run's records for them."""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from attune.engine.acceptance import (
    MAX_LOOKS,
    PROMISING_SHARE,
    Z_95,
    PairedGain,
    RunNoise,
    clears,
    gain,
    paired_gain,
    prior_note,
)
from attune.engine.state import MEASURING_KINDS, RunState, fault_streak, repeated_runs, settled
from attune.gate import (
    LOSS_EQUIVALENCE,
)
from attune.recipe.change import signature
from attune.trial import (
    LEAD_RUN,
    MAX_REMEASURES,
    PAIR_LEAD_REFERENCE,
    PAIR_REFERENCE,
    PENDING_CONFIRM,
    PENDING_LOSS_CHECK,
    PENDING_MORE,
    PENDING_MORE_LED,
    PENDING_PAIR,
    Decision,
    Measurement,
    TrialKind,
    TrialOutcome,
    TrialRecord,
    TrialResult,
)

#: a candidate's first run is decisive, and kept without its pair, when its lower end at this level clears
#: DECISIVE_MARGIN × min_gain on noise of at least DECISIVE_MIN_DF degrees of freedom: a third look at a level so
#: strict that the chance of keeping a change that does nothing stays near the paired decision's 2.5 %
DECISIVE_ALPHA = 0.001
DECISIVE_MARGIN = 3.0
DECISIVE_MIN_DF = 2


def owes_loss_check(state: RunState, verdict: dict[str, Any] | None) -> bool:
    return state.config.loss_check and bool(verdict) and LOSS_EQUIVALENCE in (verdict or {}).get("owed", [])


class Judgement(NamedTuple):
    """The decision on a finished trial: where it stands, why (the record's text), and the gain it showed."""

    status: Decision
    text: str
    gain: float | None = None


def decide(state: RunState, kind: TrialKind, sig: str, result: TrialResult,
           verdict: dict[str, Any] | None, trial_id: int | None = None) -> Judgement:
    """The decision on a finished trial (its status, why, and the gain), given the records before it."""
    if result.outcome is TrialOutcome.MISMEASURED:
        if fault_streak(state.records, kind, sig) < MAX_REMEASURES:
            return Judgement(Decision.NOTED, "not used: its measurement was a fault (see its message); it runs again")
        times = f"its measurement was a fault {MAX_REMEASURES + 1} times in a row"
        if kind in (TrialKind.CANDIDATE, TrialKind.CONFIRM):
            return Judgement(Decision.REJECTED, f"rejected: {times}; its throughput cannot be measured here")
        return Judgement(Decision.NOTED, f"{kind} run not used: {times}")
    if kind == TrialKind.BASELINE:
        return Judgement(Decision.NOTED, "baseline run" if result.outcome is TrialOutcome.SUCCEEDED
                         else f"baseline failed: {result.outcome.value}")
    if kind == TrialKind.CALIBRATION:
        return Judgement(Decision.NOTED, "drift reference for the loss check"
                         if result.outcome is TrialOutcome.SUCCEEDED else f"calibration failed: {result.outcome.value}")
    if kind == TrialKind.CERTIFY:
        which = "the baseline" if sig == signature(state.baseline) else "the final best"
        return Judgement(Decision.NOTED, f"certification run of {which}" if result.outcome is TrialOutcome.SUCCEEDED
                         else f"certification run of {which} failed: {result.outcome.value}")
    if kind == TrialKind.REFERENCE:
        if result.outcome is not TrialOutcome.SUCCEEDED:
            return Judgement(Decision.NOTED, f"reference run failed: {result.outcome.value}; deciding on the noise "
                             "floor")
        cand = pending_candidate(state)
        if cand is None:
            return Judgement(Decision.NOTED, LEAD_RUN)
        return Judgement(Decision.NOTED, PAIR_LEAD_REFERENCE if lead_run(state, cand) is not None else PAIR_REFERENCE)
    if result.outcome is not TrialOutcome.SUCCEEDED or result.measurement is None:
        return Judgement(Decision.REJECTED, f"rejected: trial {result.outcome.value}")
    best = state.best_throughput() or 0.0
    floor = state.floor()
    tps = result.measurement.tokens_per_s_per_device
    pair = interleaved_runs(state, sig) if kind == TrialKind.CONFIRM else None
    if pair is not None:
        cands, refs, led = pair
        if led:  # the best's reference run follows this one, and the look after it
            return Judgement(Decision.PENDING_PAIR, PENDING_PAIR)
        now = trial_id if trial_id is not None else state.next_id()
        return look(state, sig, [*cands, (now, result.measurement)], refs, verdict)
    if kind == TrialKind.CANDIDATE and state.config.paired:
        g1 = gain(tps, best)
        decisive = decisive_first_run(state, sig, result.measurement, trial_id)
        if decisive is not None:  # far above the noise on its first run: no pair needed to keep it
            if owes_loss_check(state, verdict):
                return Judgement(Decision.PENDING_LOSS_CHECK, PENDING_LOSS_CHECK, decisive.gain)
            return Judgement(Decision.KEPT, f"accepted: on its first run, decisively: {describe_decisive(decisive)}",
                             decisive.gain)
        floor = screen_floor(state, sig)
        bar = state.config.min_gain - floor  # could it be a gain of min_gain, given how noisy runs are here?
        if g1 > bar:
            return Judgement(Decision.PENDING_PAIR, PENDING_PAIR, g1)
        return Judgement(Decision.REJECTED, f"rejected: {g1:+.1%} is decisively below the best (noise floor "
                         f"{floor:.1%}); not worth a paired re-measurement", g1)
    if kind == TrialKind.CONFIRM:
        first = state.throughput_of(sig, (TrialKind.CANDIDATE,)) or tps
        tps = (first + tps) / 2
    g = gain(tps, best)
    if not clears(tps, best, floor):
        why = "gain did not hold on re-run" if kind == TrialKind.CONFIRM else "does not clear the noise floor"
        return Judgement(Decision.REJECTED, f"rejected: {g:+.1%} {why} {floor:.1%}", g)
    if kind == TrialKind.CANDIDATE and state.config.confirm:
        return Judgement(Decision.PENDING_CONFIRM, PENDING_CONFIRM, g)
    if owes_loss_check(state, verdict):
        return Judgement(Decision.PENDING_LOSS_CHECK, PENDING_LOSS_CHECK, g)
    return Judgement(Decision.KEPT, f"accepted: {g:+.1%} over best (floor {floor:.1%})", g)


def screen_floor(state: RunState, sig: str) -> float:
    """How far below the best a candidate's first run may read and still be a gain of ``min_gain``: the baseline's
    noise floor, widened where the best rests on fewer runs than the baseline did (a change kept on its first run)
    by the pooled run-to-run noise of one run against that many runs of the best."""
    floor = state.floor()
    prior = state.config.noise_prior()
    noise = RunNoise.pooled(repeated_runs(state, sig)).with_prior(prior)
    if not noise.df and prior is not None:  # one baseline run: the prior alone says how noisy a run is (a screen
        noise = prior                       # only ever rejects: it keeps nothing on the prior's word)
    n = state.best_runs()
    if noise.df and n:
        floor = max(floor, Z_95 * noise.sigma * math.sqrt(1 + 1 / n))
    return floor


def decisive_first_run(state: RunState, sig: str, m: Measurement, trial_id: int | None) -> PairedGain | None:
    """The candidate's first run against every run of the best so far, where it is decisive: its gain's lower end
    at the strict level :data:`DECISIVE_ALPHA` (the runs are not interleaved, so a drift the runs show is taken out
    but not cancelled) clears ``DECISIVE_MARGIN × min_gain``, on noise pooled from at least :data:`DECISIVE_MIN_DF`
    degrees of freedom. Such a change is kept without its pair; any other goes on to the paired decision."""
    best = state.best_record()
    best_sig = best.signature if best is not None else signature(state.baseline)
    refs = [(r.id, r.measurement) for r in state.records if r.signature == best_sig and r.measurement is not None
            and r.outcome is TrialOutcome.SUCCEEDED
            and r.kind in (TrialKind.BASELINE, TrialKind.REFERENCE, TrialKind.CANDIDATE, TrialKind.CONFIRM)]
    others = repeated_runs(state, sig)
    prior = state.config.noise_prior()
    if not refs or RunNoise.pooled(others).with_prior(prior).df < DECISIVE_MIN_DF:
        return None
    now = trial_id if trial_id is not None else state.next_id()
    p = paired_gain([(now, m)], refs, others, alpha=DECISIVE_ALPHA, prior=prior)
    return p if p.lower > DECISIVE_MARGIN * state.config.min_gain and math.isfinite(p.half_width) else None


def describe_decisive(p: PairedGain) -> str:
    return (f"{p.gain:+.1%} ± {p.half_width:.1%} (one-sided, at level {DECISIVE_ALPHA:.1%}) over its one run against "
            f"{p.runs[1]} run(s) of the best, not interleaved (run-to-run noise {p.sigma:.1%} from {p.df} df"
            f"{prior_note(p.prior_df)}, Student's t)")


def look(state: RunState, sig: str, cands: list[tuple[int, Measurement]], refs: list[tuple[int, Measurement]],
         verdict: dict[str, Any] | None, *, led: bool = False) -> Judgement:
    """One look at a paired decision: the candidate's runs ``cands`` against the best's ``refs`` interleaved with
    them (``led``: from the best's lead run, A-B-A). Kept where the gain is shown at this look's level; another
    pair while it stays promising and looks are left (B-A where led, else A-B); else rejected, saying why."""
    p = paired_gain(cands, refs, repeated_runs(state, sig), prior=state.config.noise_prior())
    what = p.describe()
    if p.shows(state.config.min_gain):
        if owes_loss_check(state, verdict):
            return Judgement(Decision.PENDING_LOSS_CHECK, PENDING_LOSS_CHECK, p.gain)
        return Judgement(Decision.KEPT, f"accepted: {what}", p.gain)
    looks = min(len(cands), len(refs))
    if looks < MAX_LOOKS and p.gain > PROMISING_SHARE * state.config.min_gain and state.budget().affords(2):
        return Judgement(Decision.PENDING_MORE, PENDING_MORE_LED if led else PENDING_MORE, p.gain)  # the next look
    if not p.consistent:
        return Judgement(Decision.REJECTED, f"rejected as inconclusive: {what}", p.gain)
    return Judgement(Decision.REJECTED, f"rejected: {what}; {p.shortfall(state.config.min_gain)}", p.gain)


def look_after_reference(state: RunState, cand: TrialRecord) -> Judgement:
    """The look a candidate with a lead gets once the best's reference run after its latest run is in: the
    decision a zero-cost ``decision`` record carries."""
    pair = interleaved_runs(state, cand.signature)
    if pair is None:
        raise ValueError(f"trial {cand.id} has no paired decision under way")
    cands, refs, led = pair
    return look(state, cand.signature, cands, refs, cand.verdict, led=led)


def pending_candidate(state: RunState) -> TrialRecord | None:
    """The candidate whose paired decision is under way (its first run's status says so, and no record after it
    settled the decision), or None."""
    for r in reversed(settled(state)):
        if r.kind == TrialKind.CANDIDATE:
            return r if r.status is Decision.PENDING_PAIR else None
        if r.kind in (TrialKind.CONFIRM, TrialKind.DECISION, TrialKind.LOSS_CHECK) and not r.status.pending:
            return None
    return None


def _of_the_best(state: RunState, r: TrialRecord) -> bool:
    """Whether ``r`` is a successful, measured run of the best recipe (one a paired decision may start from)."""
    best = state.best_record()
    best_sig = best.signature if best is not None else signature(state.baseline)
    return r.signature == best_sig and r.kind in MEASURING_KINDS and r.outcome is TrialOutcome.SUCCEEDED \
        and r.measurement is not None


def lead_run(state: RunState, cand: TrialRecord) -> tuple[int, Measurement] | None:
    """The best's run launched just before the candidate ``cand`` (its trial id and measurement), where that run
    succeeded and measures the recipe the candidate is decided against: the first A of its A-B-A, or None."""
    before = [r for r in settled(state) if r.launched and r.id < cand.id]
    if not before or not _of_the_best(state, before[-1]) or before[-1].measurement is None:
        return None
    return before[-1].id, before[-1].measurement


def has_lead(state: RunState) -> bool:
    """Whether the last launched run is a successful run of the best: the next candidate's decision starts from it."""
    launched = [r for r in settled(state) if r.launched]
    return bool(launched) and _of_the_best(state, launched[-1])


def interleaved_runs(state: RunState, sig: str) -> tuple[list[tuple[int, Measurement]],
                                                    list[tuple[int, Measurement]], bool] | None:
    """The candidate's runs so far and the best's runs interleaved with them (each with its trial id), while its
    paired decision is under way, and whether it has a lead (:func:`lead_run`): then A-B-A with the lead first, and
    a B-A pair for each further look; else B-A-B, and an A-B pair for each further look."""
    cand = next((r for r in reversed(state.records) if r.kind == TrialKind.CANDIDATE and r.signature == sig), None)
    if cand is None or cand.status is not Decision.PENDING_PAIR or cand.measurement is None:
        return None
    later = [r for r in state.records if r.id > cand.id and r.outcome is TrialOutcome.SUCCEEDED]
    refs = [(r.id, r.measurement) for r in later if r.kind == TrialKind.REFERENCE and r.measurement]
    lead = lead_run(state, cand)
    if not refs and lead is None:
        return None
    confirms = [(r.id, r.measurement) for r in later
                if r.kind == TrialKind.CONFIRM and r.signature == sig and r.measurement]
    return [(cand.id, cand.measurement), *confirms], ([lead] if lead else []) + refs, lead is not None
