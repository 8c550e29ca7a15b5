"""The tuning loop: baseline → propose → gate → run → measure → accept, one change at a time.

The loop is level-triggered: :func:`next_action` looks only at the records folded from the journal
and says what to do next, so a run killed at any point resumes exactly where it stopped, without
re-running or re-charging a finished trial. The pure steps (:func:`next_action`, :func:`gate_proposal`,
:func:`decide`, :func:`loss_check_record`) are shared with the Kubernetes operator, which keeps the same
records in its resources' status instead of a journal.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path
from typing import Any

from attune.engine.acceptance import (
    Certified,
    RunNoise,
    paired_gain,
)
from attune.engine.budget import COST_EVIDENCE, charge
from attune.engine.decisions import (
    decide,
    decisive_first_run,
    describe_decisive,
    has_lead,
    interleaved_runs,
    lead_run,
    look_after_reference,
    owes_loss_check,
    pending_candidate,
    screen_floor,
)
from attune.engine.journal import Event, Journal, RunJournal, RunLock, replay
from attune.engine.policy import Policy, PolicyContext, Stop
from attune.engine.state import (
    MEASURING_KINDS,
    RunState,
    TuneConfig,
    repeated_runs,
    rerun_ids,
    settled,
)
from attune.errors import JournalError, RecipeError
from attune.gate import (
    LOSS_EQUIVALENCE,
    ReorderBound,
    Tolerance,
    Verdict,
    compare_losses,
    derive_tolerance,
    equivalent_layout,
    evaluate,
    first_step_problem,
)
from attune.gate.rules import whole_recipe
from attune.gate.verdict import Reason, ReasonCode
from attune.gate.verify import first_step_bound_for
from attune.recipe.change import Change, apply_change, signature
from attune.recipe.io import recipe_to_dict
from attune.recipe.model import RANDOM_STREAM, Recipe
from attune.trial import (
    NOT_RUN_MOOT,
    Decision,
    LLMUsage,
    Measurement,
    MeasurePlan,
    TrialBackend,
    TrialKind,
    TrialOutcome,
    TrialRecord,
    TrialRequest,
    TrialResult,
)

log = logging.getLogger(__name__)

# -- what to do next (pure) ------------------------------------------------------------------------

class ActionKind(str, Enum):
    """What the run does next (a ``str`` enum: ``ActionKind.BASELINE == "baseline"``)."""

    BASELINE = "baseline"
    CONFIRM = "confirm"
    REFERENCE = "reference"
    CALIBRATE = "calibrate"
    CERTIFY = "certify"
    LOSS_CHECK = "loss_check"
    DECIDE = "decide"  #: a look at a paired decision, on the runs made (launches nothing)
    PROPOSE = "propose"
    RERUN = "rerun"  #: a candidate whose run was a measurement fault, run again as it was
    FINISH = "finish"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Action:
    kind: ActionKind
    target: TrialRecord | None = None
    reason: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", ActionKind(self.kind))


def _stop(reason: str) -> Action:
    """The run ends here, for ``reason`` (the record a stop rule answers with)."""
    return Action(ActionKind.FINISH, reason=reason)


# -- measurement faults --------------------------------------------------------------------------------------------

#: a run that measures more than this factor above the fastest, or below the slowest, of the same recipe's earlier
#: runs in this run is a measurement fault (:func:`twin_fault`). Runs of one recipe agree to a few percent here, and
#: a run that a neighbour's load slowed (by half, say) stays inside the factor: the certification's own check sets
#: such runs aside (:func:`~attune.engine.acceptance.disturbance`)
TWIN_FACTOR = 3.0

#: a candidate's run that measures more than this factor above the best is a measurement fault: a candidate moves one
#: setting by one step from the best (a batch per device doubled, a compiler turned on, one more loader worker), which
#: speeds a job up by a small factor, not tenfold, whereas a burst of lines reads hundreds of times faster. A bound
#: chosen wide on purpose: it is there for absurd figures, not for large true gains
LEAP_FACTOR = 10.0

#: the kinds of trial whose throughput a decision or the headline uses: their measurement faults are run again (a
#: calibration run is for its loss curve alone, which a burst of lines does not change)
TIMED_KINDS = (*MEASURING_KINDS, TrialKind.CERTIFY)


def twin_fault(state: RunState, kind: TrialKind, sig: str, m: Measurement) -> str | None:
    """Why a run of recipe ``sig`` cannot be true next to the same recipe's earlier successful runs in this run (its
    twins), or None: it measures more than :data:`TWIN_FACTOR` above the fastest of them or below the slowest; a
    candidate's run, more than :data:`LEAP_FACTOR` above the best. A baseline's first run has nothing to compare with
    and is judged by its own timing alone (:func:`~attune.engine.measure.timing_fault`); so is a candidate's first
    run within the leap factor, which its confirmation's twin check then trusts."""
    if kind not in TIMED_KINDS or m.tokens_per_s_per_device <= 0:
        return None
    x = m.tokens_per_s_per_device
    twins = [r.throughput for r in state.records if r.signature == sig and r.kind in TIMED_KINDS
             and r.outcome is TrialOutcome.SUCCEEDED and r.throughput]
    best = state.best_throughput()
    if kind in (TrialKind.CANDIDATE, TrialKind.CONFIRM) and best and x > LEAP_FACTOR * best:
        return (f"it measured {x:,.0f} tokens/s per device, {x / best:,.0f}× the best ({best:,.0f}): one setting moved "
                f"by one step does not make a job more than {LEAP_FACTOR:g}× faster")
    if not twins:
        return None
    lo, hi = min(twins), max(twins)
    if lo / TWIN_FACTOR <= x <= hi * TWIN_FACTOR:
        return None
    span = f"{lo:,.0f}" if lo == hi else f"{lo:,.0f}–{hi:,.0f}"
    return (f"it measured {x:,.0f} tokens/s per device where {len(twins)} earlier run(s) of the same recipe measured "
            f"{span}: {x / lo if x > hi else hi / x:,.1f}× {'above' if x > hi else 'below'}, beyond the "
            f"{TWIN_FACTOR:g}× that runs of one recipe can differ by")


def measured(state: RunState, plan: TrialPlan, result: TrialResult) -> TrialResult:
    """``result`` with its measurement judged: a run far outside its twins is a measurement fault
    (:func:`twin_fault`); a calibration run's timing fault is no fault (its loss curve is what it is for)."""
    m = result.measurement
    if result.outcome is TrialOutcome.MISMEASURED and plan.kind not in TIMED_KINDS:
        return replace(result, outcome=TrialOutcome.SUCCEEDED,
                       message=f"its timing is not used (a calibration run is for its loss curve): {result.message}")
    if result.outcome is not TrialOutcome.SUCCEEDED or m is None:
        return result
    fault = twin_fault(state, plan.kind, plan.signature, m)
    if fault is None:
        return result
    return replace(result, outcome=TrialOutcome.MISMEASURED, message=f"measurement fault: {fault}")


def failed_trials(state: RunState) -> int:
    """Launched trials that failed (OOM, crash, timeout, divergence); interrupted and refused ones do not count."""
    return sum(1 for r in state.records if r.launched and r.outcome.failed)


MIN_TRIAL_S = 1.0
"""A trial whose deadline would be shorter than this is not started (no launch finishes a step sooner)."""


def trial_deadline(state: RunState, devices: int, teardown_s: float = 0.0,
                   kind: TrialKind = TrialKind.CANDIDATE) -> float:
    """Seconds a trial may run: the trial timeout, cut so that the trial plus its teardown (``teardown_s``, the
    backend's kill grace) cannot charge more than what is left of the budget (for a search trial, less the
    certification reserve). No trial overspends the budget, and no search trial spends the reserve."""
    budget = state.budget()
    # every search trial (a candidate, its confirmation and reference runs, a baseline, a calibration) stays out of
    # the certification reserve; only the certification runs may use it (seen: a torch_compile confirmation started
    # inside the reserve, its deadline cut to 83 s, timed out compiling, and the headline went out uncertified)
    left = budget.left if kind == TrialKind.CERTIFY else budget.search_left
    left_s = left * 3600.0 / max(devices, 1) - teardown_s
    return min(state.config.trial_timeout_s, left_s)


def next_action(state: RunState) -> Action:
    """What the run should do next, from its records alone: the first of :data:`RULES` that answers (every stop rule
    is one of them), then the failed-trials limit and the certification once the search is over; for the CLI's
    tuner and the Kubernetes operator alike."""
    action = _next_action(state)
    limit = state.config.max_failed_trials
    if action.kind is not ActionKind.FINISH and limit is not None and failed_trials(state) >= limit:
        action = _stop(f"{failed_trials(state)} trials failed (max_failed_trials {limit})")
    if action.kind is ActionKind.FINISH:
        return certification_action(state) or action  # the search is over: certify what it kept, then finish
    return action


def certification_action(state: RunState) -> Action | None:
    """The next certification run once the search is over (A-B-A-B...: the baseline, then the final best), or None
    when nothing was kept, certification is off, ``certify_max_pairs`` undisturbed pairs ran, or the budget cannot
    pay for another whole pair. A pair set aside as disturbed (:meth:`RunState.certification_check`) does not count
    towards ``certify_max_pairs``: another pair replaces it while the budget pays, at most ``certify_max_pairs``
    replacements in all (a machine disturbed that often will not certify anything)."""
    cfg = state.config
    if cfg.certify_share <= 0 or state.best_record() is None:
        return None
    runs = [r for r in settled(state) if r.kind == TrialKind.CERTIFY]
    if sum(1 for r in runs if r.outcome is not TrialOutcome.SUCCEEDED) >= 2:
        return None  # the recipes fail where they ran before: no certification, and the report says why
    base, best = state.certification_runs()
    best_rec = state.best_record()
    best_sig = best_rec.signature if best_rec is not None else signature(state.baseline)
    base_h, best_h = recipe_worst_case(state, signature(state.baseline)), recipe_worst_case(state, best_sig)
    left, overhead = state.budget().left, state.budget().overhead_hours
    if len(base) == len(best):
        if _pairs_done(state, len(base)) or base_h + best_h + 2 * overhead > left or not _room_for_a_pair(state):
            return None
        return Action(ActionKind.CERTIFY, reason="baseline")
    side = "best" if len(base) > len(best) else "baseline"
    if (best_h if side == "best" else base_h) + overhead > left:
        return None
    return Action(ActionKind.CERTIFY, reason=side)


def recipe_worst_case(state: RunState, sig: str) -> float:
    """What one run of the recipe ``sig`` may cost: its dearest whole run so far in this run, else the budget's
    worst case. The certification runs are predicted by it (at their own recipes' cost, not at the dearest trial of
    the search, which may be a candidate that compiled for minutes before its first step)."""
    own = [r.charged_hours for r in state.records if r.signature == sig and r.outcome in COST_EVIDENCE
           and r.charged_hours > 0]
    return max(own) if own else state.budget().worst_case()


def _pairs_done(state: RunState, pairs: int) -> bool:
    """Whether ``pairs`` whole certification pairs are all the run will spend: ``certify_max_pairs`` undisturbed
    ones, or as many as that replaced after disturbances."""
    cap = state.config.certify_max_pairs
    set_aside = state.certification_check().pairs_set_aside if pairs else 0
    return pairs >= cap + min(set_aside, cap)


def _certify_trials_kept_back(state: RunState) -> int:
    """Launched trials ``--max-trials`` keeps back from the search for one certification pair, once the search kept
    a change and certification is on (else a run that spends its trials searching certifies nothing); none where the
    cap leaves no room for a pair beside the baseline's repeats. A new
    candidate is then proposed only where its own decision runs (reference, confirmation) fit before the pair."""
    cfg = state.config
    if cfg.max_trials is None or cfg.certify_share <= 0 or state.best_record() is None:
        return 0
    return 2 if cfg.max_trials >= cfg.baseline_repeats + 4 else 0


def _room_for_a_pair(state: RunState) -> bool:
    """Whether ``--max-trials`` (which caps every launched trial, certification runs included) allows two more."""
    cap = state.config.max_trials
    return cap is None or cap - sum(1 for r in settled(state) if r.launched) >= 2


def certification_note(state: RunState, certified: Certified | None) -> str:
    """One line: the certified speedup and its verdict, or why the run has none."""
    if certified is not None:
        return certified.describe()
    if state.best_record() is None:
        return "nothing was kept: the baseline stays best (no certification needed)"
    if state.config.certify_share <= 0:
        return "certification off (tuning.certify_share: 0): the speedup is the search's own estimate, unchecked"
    check = state.certification_check()
    if check.disturbed:
        base, _ = state.certification_runs()
        if certification_action(state) is not None:
            return ("not certified yet: the certification was disturbed: "
                    + "; ".join(d.describe() for d in check.disturbed)
                    + "; another interleaved pair will replace it, until then the speedup is the search's own estimate")
        if not _room_for_a_pair(state):
            why = f"max_trials ({state.config.max_trials}) left no room for another pair"
        elif _pairs_done(state, len(base)):
            why = f"{check.pairs_set_aside} pairs were disturbed, as many as certify_max_pairs allows to replace"
        else:
            why = "the budget left could not pay for another pair"
        return ("not certified: the certification was disturbed: " + "; ".join(d.describe() for d in check.disturbed)
                + f"; {why}, so no interval is certified and the speedup is the search's own estimate")
    if any(r.kind == TrialKind.CERTIFY for r in state.records):
        return "not certified: the certification runs failed; the speedup is the search's own estimate"
    if not _room_for_a_pair(state):
        return (f"not certified: max_trials ({state.config.max_trials}) left no room for an interleaved "
                "baseline/best pair; the speedup is the search's own estimate")
    return ("not certified: the budget left could not pay for one interleaved baseline/best pair; the speedup is "
            "the search's own estimate")


# -- what the run does next: an ordered list of named rules ------------------------------------------------------
# Each rule reads the run's records and either answers (an action: a run a decision under way needs, the baseline's
# runs, a stop with its reason) or passes to the next. The first answer wins; PROPOSE when none answers. A stop rule
# is one line in RULES and one function that returns the reason to stop, or None.


@dataclass(frozen=True)
class Rule:
    """One of the rules :func:`next_action` asks in order: its name (the journal and the docs say which rule ended a
    run) and a function of the run's state that answers with an action, or None to pass to the next rule."""

    name: str
    decides: Callable[[RunState], Action | None]


def _deciding(state: RunState) -> list[TrialRecord]:
    return [r for r in settled(state) if r.kind != TrialKind.CALIBRATION]


def _launched(state: RunState) -> list[TrialRecord]:
    return [r for r in settled(state) if r.launched]  # an interrupted trial is run again: not counted


def _finished_already(state: RunState) -> Action | None:
    return _stop(state.finished) if state.finished else None


def _decision_under_way(state: RunState) -> Action | None:
    """The next run of a decision under way, settled before anything else (even if that needs a little more budget,
    though never the reserve's): its loss check, its confirmation, the best's reference run between its runs."""
    budget = state.budget()
    deciding = _deciding(state)
    last = deciding[-1] if deciding else None
    if last is None:
        return None
    if last.status is Decision.PENDING_LOSS_CHECK:
        if needs_calibration(state, last.signature) and budget.affords_another():
            return Action(ActionKind.CALIBRATE, target=last)
        return Action(ActionKind.LOSS_CHECK, target=last)
    if last.kind == TrialKind.CANDIDATE and last.status is Decision.PENDING_CONFIRM:
        return _settling(state, Action(ActionKind.CONFIRM, target=last))  # its cost was checked at the launch
    if last.kind in (TrialKind.CANDIDATE, TrialKind.CONFIRM) and last.status is Decision.PENDING_PAIR:
        # the best now: after the candidate's run (A-B-A from its lead), or between its two runs (B-A-B)
        return _settling(state, Action(ActionKind.REFERENCE, target=last))
    if last.kind == TrialKind.CONFIRM and last.status is Decision.PENDING_MORE:
        # the next look: A-B once more (its cost was checked)
        return _settling(state, Action(ActionKind.REFERENCE, target=last))
    if last.kind == TrialKind.DECISION and last.status is Decision.PENDING_MORE:
        # the next look: B-A once more, the candidate first (its cost was checked)
        return _settling(state, Action(ActionKind.CONFIRM, target=last))
    if last.kind == TrialKind.REFERENCE:
        cand = pending_candidate(state)
        if cand is not None:
            if lead_run(state, cand) is not None:  # A-B-A from the lead is complete: the look, on the runs made
                return Action(ActionKind.DECIDE, target=cand)
            if owes_loss_check(state, cand.verdict) and cand.measurement is not None and \
                    decisive_first_run(state, cand.signature, cand.measurement, cand.id) is not None:
                # the reference run gave the noise the degrees of freedom the first-run look lacked, and the
                # candidate is decisively faster: its loss check (a zero-cost record) keeps it without a confirm run
                if needs_calibration(state, cand.signature) and budget.affords_another():
                    return Action(ActionKind.CALIBRATE, target=cand)
                return Action(ActionKind.LOSS_CHECK, target=cand)
            return _settling(state, Action(ActionKind.CONFIRM, target=cand))
    return None


def _budget_spent(state: RunState) -> Action | None:
    budget = state.budget()
    if budget.affords_another():
        return None
    if not _launched(state):
        return _stop(f"the budget ({state.config.budget_hours:g} accelerator-hours) cannot pay for one "
                       f"trial (at least {budget.worst_case():.4g} h each); nothing was spent; raise --budget")
    return _stop(f"budget spent ({budget.used:.4f} of {state.config.budget_hours:g} accelerator-hours)")


def _max_trials_reached(state: RunState) -> Action | None:
    cfg = state.config
    if cfg.max_trials is None:
        return None
    launched = _launched(state)
    kept = _certify_trials_kept_back(state)
    # a candidate's own decision runs: the best's reference run after it (from the best's lead run), or its second
    # run and the best's between
    follow_ups = ((1 if has_lead(state) else 2) if cfg.paired else 1 if cfg.confirm else 0) if kept else 0
    searched = sum(1 for r in launched if r.kind != TrialKind.CERTIFY)  # certification runs use the kept-back trials
    if len(launched) >= cfg.max_trials or searched + follow_ups >= cfg.max_trials - kept:
        return _stop(f"reached max_trials ({cfg.max_trials}" + (f", the last {kept} kept back to certify the best)"
                                                                  if kept else ")"))
    return None


def _baseline_runs(state: RunState) -> Action | None:
    """The baseline's runs (``baseline_repeats`` that succeeded), or the end of a run whose baseline itself fails."""
    cfg = state.config
    if len(state.baselines()) >= cfg.baseline_repeats:
        return None
    base = [r for r in settled(state) if r.kind == TrialKind.BASELINE]
    failed = [r for r in base if r.outcome is not TrialOutcome.SUCCEEDED]
    if len(failed) >= 2 and not state.baselines():
        return _stop(f"the baseline recipe itself fails ({failed[-1].outcome.value}: {failed[-1].message}); fix "
                       "it before tuning")
    if len(base) < cfg.baseline_repeats + 2:
        return Action(ActionKind.BASELINE)
    return None


def _no_baseline(state: RunState) -> Action | None:
    return None if state.baselines() else _stop("no successful baseline run")


def _refusals_in_a_row(state: RunState) -> Action | None:
    refusals = 0
    for r in reversed(state.records):
        if r.outcome is not TrialOutcome.REFUSED:
            break
        refusals += 1
    if refusals >= state.config.max_consecutive_refusals:
        return _stop(f"{refusals} proposals in a row were refused by the gate")
    return None


def _decision_unaffordable(state: RunState) -> Action | None:
    """No candidate and its own decision runs (a pair, or a confirmation) fit in what the search may still spend:
    the candidate and the best's reference run where the best's lead run is in (:func:`has_lead`), else the
    candidate twice and the best's run between."""
    cfg, budget = state.config, state.budget()
    if cfg.paired and not budget.affords(2 if has_lead(state) else 3):
        return _stop(f"budget nearly spent ({budget.used:.4f} of {cfg.budget_hours:g} accelerator-hours): what is "
                       "left cannot pay for a candidate and its paired re-measurement")
    if cfg.confirm and not budget.affords(2):
        return _stop(f"budget nearly spent ({budget.used:.4f} of {cfg.budget_hours:g} accelerator-hours): what is "
                       "left cannot pay for a candidate and its confirmation run")
    return None


def _max_records_reached(state: RunState) -> Action | None:
    cap = state.config.max_records
    if cap is not None and len(state.records) >= cap:
        return _stop(f"reached max_records ({cap} trials and refusals)")
    return None


def _measurement_fault(state: RunState) -> Action | None:
    again = _rerun_candidate(state)
    return Action(ActionKind.RERUN, target=again, reason="measurement fault") if again is not None else None


def _priced_decision_unaffordable(state: RunState) -> Action | None:
    """Where the backend prices trials: a decision on a move from the best, at its predicted worst case, must fit."""
    if state.trial_price is None:
        return None
    budget = state.budget()
    need = decision_hours(state, state.best_recipe())
    if need is not None and need * PRICED_STOP_SHARE > budget.search_left:
        return _stop(f"budget nearly spent ({budget.search_left:.4g} accelerator-hours left to the search cannot "
                       "pay for a candidate and its confirmation at their predicted worst-case cost)")
    return None


def _lead_run(state: RunState) -> Action | None:
    """A run of the best before the next candidate, so that its paired decision starts from it (A-B-A from the lead:
    two runs to its first look instead of three) and ends on the best again, which leads the next one. Run where
    the last decision kept a change and ended on another recipe's run: it costs what the candidate's own second run
    would have, and every decision after it is one run cheaper. (Run also after a candidate rejected on its first
    run, it measured no better on the simulator's suite: 15t headroom 9.3 trials' worth to 0.95 against 9.1.)"""
    if not state.config.paired or has_lead(state):
        return None
    last = next((r for r in reversed(_deciding(state)) if r.outcome is not TrialOutcome.REFUSED), None)
    if last is None or last.status is not Decision.KEPT:
        return None
    return Action(ActionKind.REFERENCE, reason="lead")


#: the rules :func:`next_action` asks, in order; the first to answer decides, and a run with no answer proposes
RULES: tuple[Rule, ...] = (
    Rule("finished", _finished_already),
    Rule("decision under way", _decision_under_way),
    Rule("budget spent", _budget_spent),
    Rule("max_trials", _max_trials_reached),
    Rule("baseline runs", _baseline_runs),
    Rule("no baseline", _no_baseline),
    Rule("refusals in a row", _refusals_in_a_row),
    Rule("decision unaffordable", _decision_unaffordable),
    Rule("max_records", _max_records_reached),
    Rule("measurement fault", _measurement_fault),
    Rule("priced decision unaffordable", _priced_decision_unaffordable),
    Rule("lead run", _lead_run),
)


def _next_action(state: RunState) -> Action:
    for rule in RULES:
        action = rule.decides(state)
        if action is not None:
            return action
    return Action(ActionKind.PROPOSE)


def _settling(state: RunState, action: Action) -> Action:
    """``action``, the next run of a decision under way (its confirmation, the best's reference run), where it fits
    at its predicted worst case in what the search may still spend (outside the certification reserve); else the
    end of the search, the decision left undecided, so that the reserve certifies what was kept. Without a reserve
    the run goes ahead, its deadline cut to what is left."""
    budget = state.budget()
    t = action.target
    which = f"trial {t.id} ({t.label()})" if t is not None else "the last candidate"
    cap = state.config.max_trials
    if cap is not None and sum(1 for r in state.records if r.launched) >= cap:  # a hard cap, as documented
        return _stop(f"reached max_trials ({cap}): the decision on {which} stays open (its runs so far were "
                       "inconclusive)")
    if budget.reserve_hours <= 0 or budget.affords(1):
        return action
    return _stop(f"budget nearly spent ({budget.used:.4f} of {state.config.budget_hours:g} accelerator-hours): the "
                   f"decision on {which} stays open: its next runs could cost {budget.worst_case():.4g} h each at "
                   f"worst (the dearest trial so far), more than the {budget.search_left:.4g} h the search has left "
                   f"outside the certification reserve ({budget.reserve_hours:.4g} h)")


def _rerun_candidate(state: RunState) -> TrialRecord | None:
    """The candidate whose run, the last one, was a measurement fault to run again (the other kinds are asked for
    again by the rules above, as after an interrupted trial), or None."""
    last = next((r for r in reversed(state.records) if r.outcome is not TrialOutcome.INTERRUPTED), None)
    if last is None or last.kind != TrialKind.CANDIDATE or last.id not in rerun_ids(state.records):
        return None
    return last


# -- what a decision can cost, where the backend can price a trial ------------------------------------------

PRICED_STOP_SHARE = 0.8
"""The search ends when what is left is below this share of what a decision on a move from the best would cost at
worst: most moves cost about what the best does, so none of them could be paid for."""


def decision_hours(state: RunState, candidate: Recipe, gate: GateFn | None = None) -> float | None:
    """Accelerator-hours the decision on ``candidate`` can cost at worst (its runs, the best's paired reference, the
    loss check's calibration run where one is still owed), or None where the backend cannot price a trial."""
    price = state.trial_price
    if price is None:
        return None
    cfg = state.config
    own = price(candidate)
    total = own
    if candidate.catalogue.predicts_infeasible(candidate):
        return total  # a run that fails decides nothing more
    if cfg.paired:  # the best's reference run, and the candidate's second run unless the best's lead run is in
        total += price(state.best_recipe()) + (0.0 if has_lead(state) else own)
    elif cfg.confirm:
        total += own
    if cfg.loss_check and needs_calibration(state, signature(candidate)):
        verdict = (gate or evaluate)(state.baseline, candidate, (), parent=state.best_recipe())
        if LOSS_EQUIVALENCE in verdict.owed:
            total += price(state.baseline)
    return total


def affords_decision(state: RunState, candidate: Recipe, gate: GateFn | None = None) -> bool:
    """Whether what the search may still spend (the budget left, less the certification reserve) pays for the
    decision on ``candidate`` at worst: priced by the backend where it can, else, for a candidate that compiles,
    predicted from the trials so far (:func:`compile_decision_hours`); any other unpriced candidate passes (the
    loop's own checks on the next trials' worst case hold for it). A candidate that compiles must also leave room
    for a certification pair of the baseline and itself, were it kept."""
    need = decision_hours(state, candidate, gate)
    own = state.trial_price(candidate) if need is not None and state.trial_price is not None else None
    if need is None:
        need = compile_decision_hours(state, candidate)
        own = COMPILE_COST_FACTOR * state.budget().worst_case() if need is not None else None
    if need is None or own is None:
        return True
    budget = state.budget()
    if need > budget.search_left + 1e-12:
        return False
    if state.config.certify_share <= 0 or not compiles_newly(state, candidate):
        return True
    # kept, a compiling candidate is certified against the baseline at its own dear runs, which the reserve (a share
    # of the budget, sized for the runs the search had seen) may not hold: that pair must fit in what its decision
    # leaves
    pair = recipe_worst_case(state, signature(state.baseline)) + own + 2 * budget.overhead_hours
    return need + pair <= budget.left + 1e-12


#: where the backend cannot price a trial, the runs of a candidate that turns compilation on (a knob at a value its
#: catalogue lists in ``compiles``: torch_compile, compile, enable_cuda_graph) are predicted at this many times the
#: dearest trial so far: compiling a model before its first step takes about one to two trials' worth of an
#: uncompiled run (minutes under inductor for an LLM), so a cheap first prediction would let the run start a
#: confirmation it cannot finish. Once the candidate ran, its own charge is the dearest trial and predicts the rest
COMPILE_COST_FACTOR = 3.0


def compiles_newly(state: RunState, candidate: Recipe) -> list[str]:
    """The knobs by which ``candidate`` compiles where the best recipe does not (its first run pays compilation)."""
    best = state.best_recipe()
    already = set(best.catalogue.compiling(best))
    return [k for k in candidate.catalogue.compiling(candidate) if k not in already]


def compile_decision_hours(state: RunState, candidate: Recipe) -> float | None:
    """The predicted worst case of the decision on a candidate that newly compiles (:func:`compiles_newly`): its
    runs (the first and its confirmation) at :data:`COMPILE_COST_FACTOR` × the dearest trial so far, the best's
    reference run at the dearest, each with the backend's teardown allowance; None for any other candidate."""
    if not compiles_newly(state, candidate):
        return None
    cfg, budget = state.config, state.budget()
    own = 1 + (1 if cfg.paired or cfg.confirm else 0)
    refs = 1 if cfg.paired else 0
    return (own * COMPILE_COST_FACTOR + refs) * budget.worst_case() + (own + refs) * budget.overhead_hours


# -- pure steps shared with the operator -----------------------------------------------------------

GateFn = Callable[..., Verdict]


@dataclass(frozen=True)
class GatedProposal:
    change: Change
    candidate: Recipe | None  # None when the change makes an invalid recipe
    verdict: Verdict


def cannot_matter(state: RunState, candidate: Recipe) -> str | None:
    """The framework's reason why moving the best recipe to ``candidate`` cannot change its throughput, or None."""
    best = state.best_recipe()
    reason: str | None = best.framework_impl.cannot_matter(best, candidate, state.best_measurement())
    return reason


@dataclass
class Screen:
    """What a policy's admissibility filter turned away for the budget: admissible moves the budget left could not
    pay for (a policy that then stops has stopped for the budget, and the run says so)."""

    priced_out: int = 0


def policy_context(state: RunState, gate: GateFn = evaluate, screen: Screen | None = None) -> PolicyContext:
    best = state.best_recipe()
    tried = state.tried()
    history = state.history()
    space = set(state.config.search_space)

    def admissible(change: dict[str, Any]) -> bool:
        if not set(change) <= space:
            return False
        try:
            cand = apply_change(best, change)
        except RecipeError:
            return False
        if signature(cand) in tried or cannot_matter(state, cand) is not None:
            return False
        if not gate(state.baseline, cand, history, parent=best).admitted:
            return False
        if state.trial_price is None and not compiles_newly(state, cand):
            return True  # unpriced: the loop's own checks on the next trials' worst case hold for it
        ok = affords_decision(state, cand, gate)
        if screen is not None:
            screen.priced_out += not ok
        return ok

    return PolicyContext(baseline=state.baseline, best=best, best_measurement=state.best_measurement(),
                         records=tuple(state.records), search_space=state.config.search_space,
                         noise_floor=state.floor(), budget_left_hours=state.budget().left, admissible=admissible,
                         backend=state.backend)


def gate_proposal(state: RunState, change: Change, gate: GateFn = evaluate) -> GatedProposal:
    """Apply a proposed change to the best recipe and ask the gate; invalid results are refused, not raised."""
    best = state.best_recipe()
    candidate: Recipe | None
    try:
        candidate = apply_change(best, change)
        target: Recipe | dict[str, Any] = candidate
    except RecipeError:
        candidate = None
        data = recipe_to_dict(best)
        data["knobs"] = {**best.knobs, **change.set}
        target = data
    verdict = gate(state.baseline, target, state.history(), parent=best)
    return GatedProposal(change=change, candidate=candidate if verdict.admitted else None, verdict=verdict)


def refused_record(state: RunState, gated: GatedProposal, source: str) -> TrialRecord:
    v = gated.verdict
    return TrialRecord(id=state.next_id(), kind=TrialKind.CANDIDATE, change=dict(gated.change.set),
                       rationale=gated.change.rationale, source=gated.change.source or source,
                       lessons=list(gated.change.lessons), usage=gated.change.usage, verdict=v.to_dict(),
                       outcome=TrialOutcome.REFUSED,
                       message="; ".join(r.message for r in v.reasons),
                       decision="refused by the gate (no budget spent)", status=Decision.REFUSED)


@dataclass(frozen=True)
class TrialPlan:
    """A trial an action asks for: what to run, why, and the gate's verdict on it (the record's fixed fields)."""

    id: int
    kind: TrialKind
    recipe: Recipe
    change: dict[str, Any]
    rationale: str
    source: str
    verdict: dict[str, Any] | None
    lessons: tuple[str, ...] = ()  # the lessons that moved the proposal
    usage: LLMUsage | None = None  # what the proposal cost an LLM endpoint

    @property
    def signature(self) -> str:
        return signature(self.recipe)


def plan_trial(state: RunState, action: Action, gate: GateFn = evaluate) -> TrialPlan:
    """The trial a baseline, confirm, reference or calibrate action launches (``propose``: :func:`plan_candidate`)."""
    kind = action.kind
    t = action.target
    if kind is ActionKind.BASELINE:
        return _plan(state, TrialKind.BASELINE, state.baseline, {}, "", "baseline", None, gate)
    if kind is ActionKind.CONFIRM and t is not None:
        return _plan(state, TrialKind.CONFIRM, apply_change(state.best_recipe(), t.change), dict(t.change),
                     "confirmation re-run", t.source, t.verdict, gate)
    if kind is ActionKind.REFERENCE:
        why = f"paired reference for trial {t.id}" if t is not None else \
            "the best's lead run: the next candidate's paired decision starts from it"
        return _plan(state, TrialKind.REFERENCE, state.best_recipe(), {}, why, "engine", None, gate)
    if kind is ActionKind.CALIBRATE:
        change = calibration_change(state, t.signature if t is not None else None)
        return _plan(state, TrialKind.CALIBRATION, apply_change(state.baseline, change), change,
                     "equivalent layout: measures rounding drift", "gate", None, gate)
    if kind is ActionKind.RERUN and t is not None:  # the same candidate again: its first run was a measurement fault
        return TrialPlan(id=state.next_id(), kind=t.kind, recipe=apply_change(state.best_recipe(), t.change),
                         change=dict(t.change), rationale=t.rationale, source=t.source, verdict=t.verdict,
                         lessons=tuple(t.lessons))
    if kind is ActionKind.CERTIFY:
        if action.reason == "best":
            best = state.best_recipe()
            return _plan(state, TrialKind.CERTIFY, best, state.baseline.knob_changes(best.effective_knobs),
                         "certification: the final best, interleaved with the baseline", "engine", None, gate)
        return _plan(state, TrialKind.CERTIFY, state.baseline, {},
                     "certification: the baseline, interleaved with the best", "engine", None, gate)
    raise ValueError(f"action {kind.value} launches no planned trial")


def plan_candidate(state: RunState, change: Change, source: str, gate: GateFn = evaluate) -> TrialPlan | TrialRecord:
    """A proposed change gated against the best recipe: the candidate trial to launch, or the refusal's record."""
    gated = gate_proposal(state, change, gate)
    if gated.candidate is None:
        return refused_record(state, gated, source)
    moot = cannot_matter(state, gated.candidate)
    if moot is not None:
        return TrialRecord(id=state.next_id(), kind=TrialKind.CANDIDATE, change=dict(change.set),
                           rationale=change.rationale,
                           source=change.source or source, lessons=list(change.lessons), usage=change.usage,
                           verdict=gated.verdict.to_dict(), outcome=TrialOutcome.REFUSED, message=moot,
                           decision=f"{NOT_RUN_MOOT}: {moot}", status=Decision.MOOT)
    outside = sorted(set(change.set) - set(state.config.search_space))
    reason = None
    if outside:
        reason = Reason(code=ReasonCode.OUTSIDE_SEARCH_SPACE, field=", ".join(outside),
                        message=f"{', '.join(outside)} is not in tuning.search_space")
    elif not affords_decision(state, gated.candidate, gate):
        priced = decision_hours(state, gated.candidate, gate)
        need = priced if priced is not None else compile_decision_hours(state, gated.candidate) or 0.0
        why = "" if priced is not None else (
            f" (it compiles before its first step, by {', '.join(compiles_newly(state, gated.candidate))}: its runs "
            f"are predicted at {COMPILE_COST_FACTOR:g}× the dearest trial so far)")
        budget = state.budget()
        reason = Reason(code=ReasonCode.BUDGET, field="budget", message=(
            f"the candidate's decision can cost {need:.4g} accelerator-hours{why}; {budget.search_left:.4g} are left "
            f"to the search ({budget.reserve_hours:.4g} more are kept back to certify the result)"))
    if reason is not None:
        refused = GatedProposal(change=change, candidate=None, verdict=Verdict(admitted=False, reasons=[reason]))
        return refused_record(state, refused, source)
    return TrialPlan(id=state.next_id(), kind=TrialKind.CANDIDATE, recipe=gated.candidate, change=dict(change.set),
                     rationale=change.rationale, source=change.source or source, verdict=gated.verdict.to_dict(),
                     lessons=tuple(change.lessons), usage=change.usage)


def _plan(state: RunState, kind: TrialKind, recipe: Recipe, change: dict[str, Any], rationale: str, source: str,
          verdict: dict[str, Any] | None, gate: GateFn) -> TrialPlan:
    if verdict is None:  # baseline, reference, calibration and certification runs: the gate's view of the whole
        # recipe relative to the baseline (the best reached it one coupling group at a time: that rule is moot here)
        verdict = whole_recipe(gate(state.baseline, recipe, (), parent=state.baseline)).to_dict()
    return TrialPlan(id=state.next_id(), kind=kind, recipe=recipe, change=change, rationale=rationale, source=source,
                     verdict=verdict)


def reported_contract_problems(state: RunState, recipe: Recipe, measurement: Measurement) -> list[str]:
    """Where a trial's own output contradicts its contract: against what attune read from its recipe (the
    framework's check), and, for the framework's contract names, against what the first baseline run reported.
    A second line of defence behind the gate: it holds whatever the recipe said."""
    fw = recipe.framework_impl
    reported = measurement.reported
    if not reported:
        return []
    problems = list(fw.report_problems(recipe, reported))
    first = next((r for r in state.records if r.kind == TrialKind.BASELINE and r.outcome is TrialOutcome.SUCCEEDED
                  and r.measurement is not None and r.measurement.reported), None)
    if first is not None and first.measurement is not None:
        base = first.measurement.reported
        for name in fw.reported_contract:
            if name in base and name in reported and base[name] != reported[name]:
                problems.append(f"the job reported {name} = {reported[name]}, the baseline's run reported "
                                f"{base[name]}")
    return problems


def verified(state: RunState, recipe: Recipe, result: TrialResult) -> TrialResult:
    """``result``, or a contract violation (a failed trial) where the job's own output contradicts its contract."""
    m = result.measurement
    if result.outcome is not TrialOutcome.SUCCEEDED or m is None:
        return result
    problems = reported_contract_problems(state, recipe, m)
    if not problems:
        return result
    message = "contract violation, from the job's own log: " + "; ".join(problems) + \
        " (what it trains is not what the recipe says: attune refuses to measure it)"
    return replace(result, outcome=TrialOutcome.CRASHED, message=message)


#: the adaptive window's target: its median's standard error at most this share of one run's run-to-run noise, so
#: the window adds at most about this share squared (9 %) to a run's variance, which decides every comparison
WINDOW_SHARE = 0.3
#: the run-to-run noise a run assumes before it has measured any (and no noise prior says): a quiet cluster's (DGX
#: Cloud's published 70B step times spread 1-2 % across runs; the simulator's calibrated NOISE_SIGMA is this)
DEFAULT_RUN_NOISE = 0.015
#: never aim below this standard error: a window that precise costs steps and changes no decision
MIN_TARGET_SE = 0.002


def measure_plan(state: RunState, plan: TrialPlan) -> MeasurePlan | None:
    """When the trial ``plan`` has measured enough (None: the fixed window, ``adaptive_window`` off): its window's
    median known to :data:`WINDOW_SHARE` of the run-to-run noise known so far (this run's repeats, with the noise
    prior; :data:`DEFAULT_RUN_NOISE` before any), and, for a paired candidate, surely below what the first-run
    screen needs to keep it in the running (``decide``'s bar, against the best's throughput) is futile."""
    cfg = state.config
    if not cfg.adaptive_window:
        return None
    prior = cfg.noise_prior()
    noise = RunNoise.pooled(repeated_runs(state)).with_prior(prior)
    sigma = noise.sigma if noise.df else prior.sigma if prior is not None else DEFAULT_RUN_NOISE
    futility = None
    best = state.best_throughput()
    if plan.kind == TrialKind.CANDIDATE and cfg.paired and best:
        futility = best * (1 + cfg.min_gain - screen_floor(state, plan.signature))
    return MeasurePlan(target_se=max(MIN_TARGET_SE, WINDOW_SHARE * sigma), futility_tps=futility)


def cut_short(result: TrialResult, deadline: float, timeout_s: float) -> TrialResult:
    """A trial that ran out a deadline attune cut to fit the budget (``deadline`` below the trial timeout) was
    stopped by attune, not failed by its recipe: ``interrupted``, never charged to the recipe as a timeout."""
    if result.outcome is not TrialOutcome.TIMED_OUT or deadline >= timeout_s:
        return result
    return replace(result, outcome=TrialOutcome.INTERRUPTED,
                   message=f"stopped at the end of the budget: attune cut its deadline to {deadline:.0f} s of the "
                           f"trial timeout's {timeout_s:.0f} s ({result.message}); not a failure of the recipe")


def trial_record(state: RunState, plan: TrialPlan, result: TrialResult) -> TrialRecord:
    """The record of a finished trial: its plan, what the backend reported, and the decision on it (from the
    records before it). The one place a trial's record is assembled, for the tuner and the operator."""
    result = measured(state, plan, verified(state, plan.recipe, result))
    judged = decide(state, plan.kind, plan.signature, result, plan.verdict, plan.id)
    return TrialRecord(id=plan.id, kind=plan.kind, change=dict(plan.change), knobs=plan.recipe.effective_knobs,
                       signature=plan.signature, rationale=plan.rationale, source=plan.source,
                       lessons=list(plan.lessons), usage=plan.usage, verdict=plan.verdict, outcome=result.outcome,
                       message=result.message, measurement=result.measurement,
                       charged_hours=result.charged_hours, wall_s=result.wall_s,
                       decision=judged.text, status=judged.status,
                       gain=judged.gain)


#: at most this many calibration runs settle one loss check's drift reference (the layout, then the baseline again)
MAX_CALIBRATIONS = 2


def first_step_bound(state: RunState, *others: Measurement) -> ReorderBound:
    """What reordering the sums can move this run's first logged loss by (see ``first_step_bound_for``), from the
    baseline's first run and ``others``."""
    refs = [r.measurement for r in state.baselines() if r.measurement and r.measurement.losses]
    if not refs:
        return ReorderBound(precision=state.baseline.framework_impl.compute_precision(state.baseline))
    return first_step_bound_for(state.baseline, refs[0], *others)


def first_step_problem_of(state: RunState, measurement: Measurement | None) -> str | None:
    """Why a run's first logged loss is not the baseline's up to reordering (another random stream, other samples
    or another printed quantity), or None: the proof every drift reference and every candidate of a loss check
    must pass (see :mod:`attune.gate.equivalence`). A recipe whose owner opted in to ``random_stream`` skips it."""
    if RANDOM_STREAM in state.baseline.numerics_opt_in:
        return None
    refs = [r.measurement for r in state.baselines() if r.measurement and r.measurement.losses]
    if not refs or measurement is None or not measurement.losses:
        return None
    return first_step_problem(refs[0].losses, measurement.losses, first_step_bound(state, measurement))


def _set_aside(state: RunState, judged: str | None) -> list[tuple[TrialRecord, str]]:
    """The calibration runs (of any configuration but ``judged``) that cannot calibrate a band: their first logged
    loss differs from the baseline's beyond what reordering explains."""
    out = []
    for r in state.records:
        if r.kind == TrialKind.CALIBRATION and r.outcome is TrialOutcome.SUCCEEDED and r.signature != judged:
            problem = first_step_problem_of(state, r.measurement)
            if problem is not None:
                out.append((r, problem))
    return out


def needs_calibration(state: RunState, judged: str | None = None) -> bool:
    """True until the loss check of configuration ``judged`` (a signature) has a drift reference: a run of an
    equivalent layout whose first logged loss is the baseline's (it proves it only reorders sums); where that run
    failed, could not prove it, or the framework has no such layout, and the baseline's runs are not two drift
    curves yet, one more run of the baseline (:func:`calibration_change`). A run of ``judged`` itself does not
    count: its difference from the baseline is what the check measures, so it cannot also be the tolerance."""
    tried = [r for r in state.records if r.kind == TrialKind.CALIBRATION and r.outcome is not TrialOutcome.INTERRUPTED
             and r.signature != judged]
    unproven = {r.id for r, _ in _set_aside(state, judged)}
    if any(r.outcome is TrialOutcome.SUCCEEDED and r.id not in unproven for r in tried):
        return False
    if not tried and equivalent_layout(state.baseline, avoid=(judged,) if judged else ()) is not None:
        return True
    return len(tried) < MAX_CALIBRATIONS and len(drift_runs(state, judged)) < 2


def calibration_change(state: RunState, judged: str | None = None) -> dict[str, Any]:
    """The change the next calibration run makes to the baseline: an equivalent re-layout to measure rounding drift
    with (see ``equivalent_layout``), never the configuration ``judged`` (the signature of the candidate a loss
    check judges); after a calibration run failed or could not prove its first step, or where the framework has no
    such layout, none (the baseline once more: its run-to-run drift is then the reference)."""
    if any(r.kind == TrialKind.CALIBRATION and r.outcome.failed for r in state.records) or _set_aside(state, judged):
        return {}
    return equivalent_layout(state.baseline, avoid=(judged,) if judged else ()) or {}


def common_steps(curves: Iterable[Sequence[float]]) -> list[list[float]]:
    """``curves`` cut to the steps every one of them ran: adaptive windows (:func:`measure_plan`) end runs at
    different steps, and a loss check compares each step on every run that has it (runs of one recipe have the same
    losses step by step, so the steps a run stopped before say nothing it could contradict)."""
    runs = [list(c) for c in curves]
    n = min((len(c) for c in runs), default=0)
    return [c[:n] for c in runs]


def drift_runs(state: RunState, judged: str | None = None) -> list[list[float]]:
    """The loss curves that measure rounding drift for the loss check of ``judged``: the baseline's runs and the
    calibration runs of any configuration but ``judged`` itself whose first step proves they only reorder sums."""
    unproven = {r.id for r, _ in _set_aside(state, judged)}
    runs = [r.measurement.losses for r in state.baselines() if r.measurement and r.measurement.losses]
    return runs + [r.measurement.losses for r in state.records
                   if r.kind == TrialKind.CALIBRATION and r.outcome is TrialOutcome.SUCCEEDED and r.measurement
                   and r.signature != judged and r.id not in unproven]


def loss_band(state: RunState, drift: list[list[float]], reference: list[float], bound: ReorderBound | None = None,
              *, exploratory: bool = False) -> Tolerance:
    """The band a loss check applies: derived from the ``drift`` curves (an explored, unclassified setting gets no
    safety margin above them), capped at every step of ``reference`` at what reordering explains unless the owner
    opted in to another random stream. The one definition the check, the report and the card share."""
    tol = derive_tolerance(drift, safety_factor=1.0 if exploratory else 3.0)
    if RANDOM_STREAM in state.baseline.numerics_opt_in:
        return tol
    return tol.capped(bound or first_step_bound(state), reference)


def _likely_cause(state: RunState) -> str:
    hazards = state.baseline.framework_impl.random_stream_hazards(state.baseline)
    return f"; what the recipe shows: {'; '.join(hazards)}" if hazards else ""


def decision_record(state: RunState, target: TrialRecord) -> TrialRecord:
    """The look at the candidate ``target``'s paired decision once the best's reference run after its latest run is
    in (A-B-A from its lead, then each B-A pair): a record that launches nothing and carries the decision."""
    j = look_after_reference(state, target)
    return TrialRecord(id=state.next_id(), kind=TrialKind.DECISION, change=target.change, knobs=target.knobs,
                       signature=target.signature, source="engine", verdict=target.verdict,
                       outcome=TrialOutcome.SUCCEEDED, status=j.status,
                       decision=j.text, gain=j.gain, lessons=list(target.lessons))


def loss_check_record(state: RunState, target: TrialRecord) -> TrialRecord:
    """Compare the target's loss curves with the baseline's within a tolerance measured from drift runs.

    Every curve first proves its first step (:func:`first_step_problem_of`): the baseline's own runs (a job that
    does not repeat its first step cannot show equivalence), each drift reference (one that fails is set aside:
    it cannot calibrate a band) and the target's runs (one that fails changes the random stream or the data, and
    is refused whatever its later curve does)."""
    refs = [r.measurement for r in state.baselines() if r.measurement and r.measurement.losses]
    ref_runs = [m.losses for m in refs]
    drift = drift_runs(state, target.signature)
    measured = [r.measurement for r in state.records if r.signature == target.signature
                and r.kind in (TrialKind.CANDIDATE, TrialKind.CONFIRM) and r.outcome is TrialOutcome.SUCCEEDED
                and r.measurement]
    curves = [m.losses for m in measured]
    base: dict[str, Any] = dict(id=state.next_id(), kind=TrialKind.LOSS_CHECK, change=target.change,
                                knobs=target.knobs, signature=target.signature, source="gate", verdict=target.verdict,
                                gain=target.gain)
    opted_in = RANDOM_STREAM in state.baseline.numerics_opt_in
    set_aside = [f"calibration run {r.id} ({', '.join(f'{k}={v}' for k, v in r.change.items()) or 'the baseline'}): {why}"
                 for r, why in _set_aside(state, target.signature)]
    bound = first_step_bound(state, *measured)
    first: dict[str, Any] = {"bound": bound.at(ref_runs[0][0]) if ref_runs and ref_runs[0] else None,
                             "basis": bound.describe(ref_runs[0][0]) if ref_runs and ref_runs[0] else None,
                             "set_aside": set_aside, "opt_in": RANDOM_STREAM if opted_in else None}
    twin = next((p for m in refs[1:] if (p := first_step_problem_of(state, m))), None)
    if twin is not None:
        return TrialRecord(**base, outcome=TrialOutcome.SUCCEEDED, status=Decision.REJECTED,
                           loss_check={"passed": False, "reason": twin, "first_step": first},
                           decision="rejected: loss-equivalence check impossible: the baseline's own runs differ at "
                                    f"their first step ({twin}): the job does not repeat itself (an unseeded data "
                                    "order or random stream), so no change can be shown to train the same model")
    finite = [run for run in drift if run and all(math.isfinite(x) for x in run)]
    if len(drift) >= 2 and len(finite) < 2:
        return TrialRecord(**base, outcome=TrialOutcome.SUCCEEDED, status=Decision.REJECTED,
                           decision="rejected: the drift reference runs diverged (non-finite loss); no loss check "
                                    "is possible against them")
    drift = finite
    if len(drift) < 2 or not curves:
        return TrialRecord(**base, outcome=TrialOutcome.SUCCEEDED, status=Decision.REJECTED,
                           decision="rejected: no drift reference to check loss equivalence against")
    moved = next((p for m in measured if (p := first_step_problem_of(state, m))), None)
    if moved is not None:
        first["candidate"] = moved
        return TrialRecord(**base, outcome=TrialOutcome.SUCCEEDED, status=Decision.REJECTED,
                           loss_check={"passed": False, "reason": moved, "first_step": first},
                           decision=f"rejected: loss-equivalence check failed: the change draws another random stream "
                                    f"or other samples, or the job prints another quantity: {moved}{_likely_cause(state)}"
                                    f". A recipe owner who accepts that names numerics_opt_in: [{RANDOM_STREAM}]")
    exploratory = any(str(g).startswith("exploratory") for g in (target.verdict or {}).get("changed_groups", []))
    cut = common_steps([ref_runs[0], *drift, *curves])
    reference, drift, curves = cut[0], cut[1:1 + len(drift)], cut[1 + len(drift):]
    tol = loss_band(state, drift, reference, bound, exploratory=exploratory)
    results = [compare_losses(reference, c, tol) for c in curves]
    worst = max(results, key=lambda r: (not r.passed, r.worst_ratio if r.worst_ratio == r.worst_ratio else 0))
    fw = state.baseline.framework_impl
    # the coarsest precision among the curves compared: the reference run's and the candidate's
    resolution = max((fw.loss_resolution(state.baseline, x, m.reported) or 0.0 for m in [refs[0], *measured]
                      for x in m.losses if math.isfinite(x)), default=0.0) or None
    summary = {"passed": all(r.passed for r in results), "reason": worst.reason,
               "max_abs_diff": worst.max_abs_diff, "tolerance_basis": tol.basis,
               "tolerance_max": max(tol.per_step), "drift_runs": len(drift), "resolution": resolution,
               "blind": bool(resolution and max(tol.per_step) < resolution), "first_step": first}
    seen = "" if not resolution else (
        f"; the trials' losses reach attune to ±{resolution:.1e}, so drift below that is invisible"
        + (f" and the band ({max(tol.per_step):.1e}) is narrower than what they can show" if summary["blind"]
           else ""))
    if set_aside:
        seen += f"; {len(set_aside)} drift reference(s) set aside for a first step that was not the baseline's"
    if opted_in:
        seen += (f"; first steps not compared: the recipe opts in to {RANDOM_STREAM}, so the band is the spread of "
                 "runs that may draw other random streams")
    if summary["passed"]:
        pair = interleaved_runs(state, target.signature)  # the decision that sent it here, with its interval
        if pair is not None and not pair[2] and len(pair[0]) == 1:
            pair = None  # sent here after its reference run alone: decisively faster on its first run
        decisive = decisive_first_run(state, target.signature, target.measurement, target.id) \
            if pair is None and target.kind == TrialKind.CANDIDATE and target.measurement is not None else None
        kept = (paired_gain(pair[0], pair[1], repeated_runs(state, target.signature),
                            prior=state.config.noise_prior()).describe() if pair else
                f"on its first run, decisively: {describe_decisive(decisive)}" if decisive else
                f"{target.gain or 0.0:+.1%} over best")
        return TrialRecord(**base, outcome=TrialOutcome.SUCCEEDED, status=Decision.KEPT,
                           loss_check=summary,
                           decision=f"accepted: {kept}; loss curve equivalent "
                                    f"(max |Δloss| {worst.max_abs_diff:.2e}{seen})")
    return TrialRecord(**base, outcome=TrialOutcome.SUCCEEDED, status=Decision.REJECTED,
                       loss_check=summary,
                       decision=f"rejected: loss-equivalence check failed: {worst.reason}{seen}")


# -- the loop --------------------------------------------------------------------------------------

EventFn = Callable[[Event, dict[str, Any]], None]
"""Progress of a run as it happens (the journal's own events: setup, trial started, trial finished, run finished)."""


class Tuner:
    """Drives one tuning run in ``run_dir``; ``Tuner.resume(run_dir, ...)`` continues a killed one."""

    def __init__(self, baseline: Recipe, *, backend: TrialBackend, policy: Policy, config: TuneConfig,
                 run_dir: str | Path, gate: GateFn | None = None, on_event: EventFn | None = None,
                 journal: RunJournal | None = None) -> None:
        self.backend = backend
        self.policy = policy
        self.run_dir = Path(run_dir)
        self.lock = RunLock(self.run_dir).acquire()  # one writer per run directory, for this tuner's life
        self.journal: RunJournal = journal if journal is not None else Journal(self.run_dir)
        self.gate: GateFn = gate or evaluate
        self.on_event: EventFn = on_event or (lambda kind, payload: None)
        self.state = RunState(baseline=baseline, config=config, backend=backend.name, teardown_s=backend.teardown_s,
                              trial_price=self._pricer(baseline, config))

    def _estimate_request(self, config: TuneConfig) -> TrialRequest:
        """A trial as the config asks for one, for a backend's prices before any trial runs (nothing is launched)."""
        return TrialRequest(trial_id=0, trial_dir=self.run_dir / "trials" / "estimate",
                            warmup_steps=config.warmup_steps, measure_steps=config.measure_steps,
                            timeout_s=config.trial_timeout_s)

    def _pricer(self, baseline: Recipe, config: TuneConfig) -> Callable[[Recipe], float] | None:
        """The backend's worst-case price of one trial, memoised per configuration; None where it cannot price."""
        request = self._estimate_request(config)
        if self.backend.worst_case_hours(baseline, request) is None:
            return None
        prices: dict[str, float] = {}

        def price(recipe: Recipe) -> float:
            sig = signature(recipe)
            if sig not in prices:
                prices[sig] = self.backend.worst_case_hours(recipe, request) or 0.0
            return prices[sig]

        return price

    @classmethod
    def resume(cls, run_dir: str | Path, *, backend: TrialBackend, policy: Policy,
               budget_hours: float | None = None, gate: GateFn | None = None,
               on_event: EventFn | None = None) -> Tuner:
        lock = RunLock(run_dir).acquire()  # before reading: a live tuner's trial must not look interrupted
        try:
            journal = Journal(run_dir)
            run = replay(journal.read(), journal.path, budget_hours=budget_hours)
        finally:
            lock.release()
        tuner = cls(run.baseline, backend=backend, policy=policy, config=run.config, run_dir=run_dir,
                    gate=gate, on_event=on_event)
        if run.budget_changed:
            tuner.journal.append(Event.BUDGET_CHANGED, budget_hours=run.config.budget_hours)
        for rec in run.records:
            tuner.state.records.append(rec)
            tuner.policy.observe(rec)
        tuner.state.setup.extend(run.setup)
        tuner.state.records.sort(key=lambda r: r.id)
        for started in run.open_trials:
            try:
                tuner._close_interrupted(started)
            except (KeyError, TypeError, ValueError) as err:
                tuner.lock.release()
                raise JournalError(f"{journal.path}: trial {started.get('trial')}'s trial_started record cannot be "
                                   f"closed ({str(err).splitlines()[0]}); the journal cannot be replayed") from None
        return tuner

    def _close_interrupted(self, started: dict[str, Any]) -> None:
        """Charge a trial the tuner was killed in for the time it evidently ran, and record it."""
        trial_dir = Path(started["trial_dir"])
        self.backend.release(trial_dir)
        files = [p for p in trial_dir.rglob("*") if p.is_file()] if trial_dir.exists() else []
        last = max((p.stat().st_mtime for p in files), default=started["time"])
        wall = max(0.0, last - started["time"])
        devices = self.state.baseline.resources.devices
        rec = TrialRecord(id=started["trial"], kind=started["kind"], change=started.get("change", {}),
                          knobs=started.get("knobs", {}), signature=started.get("signature", ""),
                          outcome=TrialOutcome.INTERRUPTED, wall_s=wall, charged_hours=charge(devices, wall),
                          message="the tuner stopped while this trial ran; charged up to its last recorded activity",
                          verdict=started.get("verdict"))
        self._finish(rec)

    def run(self) -> RunState:
        try:
            return self._run()
        finally:
            self.lock.release()

    def _run(self) -> RunState:
        self.lock.acquire()
        if self.state.cost_estimate is None:
            self.state.cost_estimate = self.backend.estimate_hours(self.state.baseline,
                                                                   self._estimate_request(self.state.config))
        if not self.journal.exists():
            self.journal.append(Event.RUN_STARTED, recipe=recipe_to_dict(self.state.baseline),
                                config=self.state.config.to_dict(), backend=self.backend.name,
                                policy=self.policy.name)
        if not self.state.setup and not self.state.records:
            info = self.backend.prepare(self.state.baseline, self.run_dir / "setup")
            if info is not None:  # before the first trial, so that no trial is billed for it; its own line
                self.state.setup.append(dict(info))
                self.journal.append(Event.SETUP, **info)
                self.on_event(Event.SETUP, dict(info))
        while True:
            action = next_action(self.state)
            if action.kind is ActionKind.FINISH:
                self.state.finished = action.reason
                self.journal.append(Event.RUN_FINISHED, reason=action.reason)
                self.on_event(Event.RUN_FINISHED, {"reason": action.reason})
                return self.state
            if action.kind is ActionKind.LOSS_CHECK and action.target is not None:
                self._finish(loss_check_record(self.state, action.target))
            elif action.kind is ActionKind.DECIDE and action.target is not None:
                self._finish(decision_record(self.state, action.target))
            elif action.kind is ActionKind.PROPOSE:
                self._propose_and_run()
            else:
                self._trial(plan_trial(self.state, action, self.gate))

    def _propose_and_run(self) -> None:
        screen = Screen()
        proposal = self.policy.propose(policy_context(self.state, self.gate, screen))
        if isinstance(proposal, Stop):
            # the policy saw only what the budget left pays for: where it priced moves out, the stop was the budget's
            left = self.state.budget().left
            priced = (f"budget nearly spent ({left:.4g} accelerator-hours left): the untried admissible moves cost "
                      "more at their predicted worst case; ") if screen.priced_out else ""
            self.state.finished = f"{priced}policy stopped: {proposal.reason}"
            return
        planned = plan_candidate(self.state, proposal, self.policy.name, self.gate)
        if isinstance(planned, TrialRecord):
            self._finish(planned)
            return
        self._trial(planned)

    def _trial(self, plan: TrialPlan) -> TrialRecord | None:
        deadline = trial_deadline(self.state, plan.recipe.resources.devices, self.backend.teardown_s, plan.kind)
        if deadline < MIN_TRIAL_S:
            budget = self.state.budget()
            self.state.finished = (f"budget spent ({budget.used:.4f} of {self.state.config.budget_hours:g} "
                                   f"accelerator-hours): what is left cannot hold the {plan.kind} trial it needs")
            return None
        tid = plan.id
        trial_dir = self.run_dir / "trials" / f"{tid:04d}"
        if trial_dir.exists():  # never reuse a directory: keep what an earlier process left there
            trial_dir.rename(trial_dir.with_name(f"{tid:04d}.stale-{int(time.time())}"))
        started = dict(trial=tid, kind=plan.kind, change=dict(plan.change), knobs=plan.recipe.effective_knobs,
                       signature=plan.signature, trial_dir=str(trial_dir), verdict=plan.verdict)
        self.journal.append(Event.TRIAL_STARTED, **started)
        self.on_event(Event.TRIAL_STARTED, started)
        cfg = self.state.config
        result = self.backend.run(plan.recipe, TrialRequest(trial_id=tid, trial_dir=trial_dir,
                                                           warmup_steps=cfg.warmup_steps,
                                                           measure_steps=cfg.measure_steps,
                                                           timeout_s=deadline, plan=measure_plan(self.state, plan)))
        result = cut_short(result, deadline, cfg.trial_timeout_s)
        rec = trial_record(self.state, plan, result)
        self._finish(rec)
        return rec

    def _finish(self, rec: TrialRecord) -> None:
        self.journal.append(Event.TRIAL_FINISHED, record=rec.model_dump(mode="json"))
        self.state.records.append(rec)
        self.policy.observe(rec)
        self.on_event(Event.TRIAL_FINISHED, {"record": rec, "state": self.state})
