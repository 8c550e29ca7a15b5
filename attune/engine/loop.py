"""The tuning loop: baseline → propose → gate → run → measure → accept, one change at a time.

The loop is level-triggered: :func:`next_action` looks only at the records folded from the journal
and says what to do next, so a run killed at any point resumes exactly where it stopped, without
re-running or re-charging a finished trial.
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attune.backends.base import TrialBackend, TrialRequest, TrialResult
from attune.engine.acceptance import clears, gain, noise_floor
from attune.engine.budget import Budget, charge
from attune.engine.journal import Event, Journal
from attune.engine.policy import Policy, PolicyContext, Stop
from attune.engine.state import Measurement, TrialKind, TrialOutcome, TrialRecord
from attune.errors import JournalError, RecipeError
from attune.recipe.change import Change, apply_change, signature
from attune.recipe.io import parse_recipe, recipe_to_dict
from attune.recipe.model import Recipe

log = logging.getLogger(__name__)

PENDING_CONFIRM = "pending confirmation re-run"


@dataclass(frozen=True)
class TuneConfig:
    """How one tuning run is conducted (defaults come from the recipe's ``tuning`` section)."""

    budget_hours: float
    search_space: tuple[str, ...]
    warmup_steps: int = 2
    measure_steps: int = 6
    baseline_repeats: int = 2
    confirm: bool = True
    min_gain: float = 0.02
    trial_timeout_s: float = 300.0
    max_trials: int | None = None
    max_consecutive_refusals: int = 25

    @classmethod
    def from_recipe(cls, recipe: Recipe, budget_hours: float, **overrides: Any) -> TuneConfig:
        t = recipe.tuning
        space = t.search_space or tuple(
            name for name, k in recipe.catalogue.knobs.items() if len(k.values) > 1
        )
        base = dict(budget_hours=budget_hours, search_space=tuple(space), warmup_steps=t.warmup_steps,
                    measure_steps=t.measure_steps, baseline_repeats=t.baseline_repeats, confirm=t.confirm,
                    min_gain=t.min_gain, trial_timeout_s=t.trial_timeout_s)
        base.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**base)


@dataclass
class RunState:
    """Everything the loop knows, folded from the journal's records."""

    baseline: Recipe
    config: TuneConfig
    records: list[TrialRecord] = field(default_factory=list)
    finished: str | None = None

    # -- derived views -------------------------------------------------------------------------
    def baselines(self) -> list[TrialRecord]:
        return [r for r in self.records if r.kind == "baseline" and r.outcome is TrialOutcome.SUCCEEDED]

    def floor(self) -> float:
        return noise_floor([r.measurement for r in self.baselines() if r.measurement], min_gain=self.config.min_gain)

    def best_record(self) -> TrialRecord | None:
        accepted = [r for r in self.records if r.accepted]
        return accepted[-1] if accepted else None

    def best_recipe(self) -> Recipe:
        rec = self.best_record()
        if rec is None:
            return self.baseline
        return self.baseline.with_knobs(**{k: v for k, v in rec.knobs.items() if self.baseline.knob(k) != v})

    def throughput_of(self, sig: str, kinds: tuple[str, ...]) -> float | None:
        tps = [r.throughput for r in self.records
               if r.signature == sig and r.kind in kinds and r.outcome is TrialOutcome.SUCCEEDED and r.throughput]
        return statistics.fmean(tps) if tps else None

    def baseline_throughput(self) -> float | None:
        return self.throughput_of(signature(self.baseline), ("baseline",))

    def best_throughput(self) -> float | None:
        rec = self.best_record()
        if rec is None:
            return self.baseline_throughput()
        return self.throughput_of(rec.signature, ("candidate", "confirm"))

    def best_measurement(self) -> Measurement | None:
        rec = self.best_record()
        pool = [r for r in self.records if r.outcome is TrialOutcome.SUCCEEDED and r.measurement
                and r.signature == (rec.signature if rec else signature(self.baseline))]
        return pool[-1].measurement if pool else None

    def budget(self) -> Budget:
        return Budget(self.config.budget_hours, self.records)

    def tried(self) -> set[str]:
        return {r.signature for r in self.records if r.signature and r.outcome is not TrialOutcome.INTERRUPTED}

    def next_id(self) -> int:
        return max((r.id for r in self.records), default=0) + 1


# -- what to do next (pure) ------------------------------------------------------------------------

@dataclass(frozen=True)
class Action:
    kind: str  # "baseline" | "confirm" | "propose" | "finish"
    target: TrialRecord | None = None
    reason: str = ""


def next_action(state: RunState) -> Action:
    cfg = state.config
    budget = state.budget()
    launched = [r for r in state.records if r.outcome is not TrialOutcome.REFUSED]
    if state.finished:
        return Action("finish", reason=state.finished)
    if not budget.affords_another():
        return Action("finish", reason=f"budget spent ({budget.used:.4f} of {cfg.budget_hours:g} accelerator-hours)")
    if cfg.max_trials is not None and len(launched) >= cfg.max_trials:
        return Action("finish", reason=f"reached max_trials ({cfg.max_trials})")
    base = [r for r in state.records if r.kind == "baseline" and r.outcome is not TrialOutcome.INTERRUPTED]
    if len(state.baselines()) < cfg.baseline_repeats:
        failed = [r for r in base if r.outcome is not TrialOutcome.SUCCEEDED]
        if len(failed) >= 2 and not state.baselines():
            return Action("finish", reason=f"the baseline recipe itself fails ({failed[-1].outcome.value}: "
                                            f"{failed[-1].message}); fix it before tuning")
        if len(base) < cfg.baseline_repeats + 2:
            return Action("baseline")
    if not state.baselines():
        return Action("finish", reason="no successful baseline run")
    done = [r for r in state.records if r.outcome is not TrialOutcome.INTERRUPTED]
    last = done[-1] if done else None
    if last is not None and last.kind == "candidate" and last.decision == PENDING_CONFIRM:
        return Action("confirm", target=last)
    refusals = 0
    for r in reversed(state.records):
        if r.outcome is not TrialOutcome.REFUSED:
            break
        refusals += 1
    if refusals >= cfg.max_consecutive_refusals:
        return Action("finish", reason=f"{refusals} proposals in a row were refused by the gate")
    return Action("propose")


# -- the loop --------------------------------------------------------------------------------------

GateFn = Callable[..., Any]
EventFn = Callable[[str, dict[str, Any]], None]


class Tuner:
    """Drives one tuning run in ``run_dir``; ``Tuner.resume(run_dir, ...)`` continues a killed one."""

    def __init__(self, baseline: Recipe, *, backend: TrialBackend, policy: Policy, config: TuneConfig,
                 run_dir: str | Path, gate: GateFn | None = None, on_event: EventFn | None = None) -> None:
        from attune.gate import evaluate

        self.backend = backend
        self.policy = policy
        self.run_dir = Path(run_dir)
        self.journal = Journal(self.run_dir)
        self.gate = gate or evaluate
        self.on_event = on_event or (lambda kind, payload: None)
        self.state = RunState(baseline=baseline, config=config)

    # construction from a journal -----------------------------------------------------------------
    @classmethod
    def resume(cls, run_dir: str | Path, *, backend: TrialBackend, policy: Policy,
               budget_hours: float | None = None, gate: GateFn | None = None,
               on_event: EventFn | None = None) -> Tuner:
        journal = Journal(run_dir)
        events = journal.read()
        if not events or events[0].get("event") != Event.RUN_STARTED.value:
            raise JournalError(f"{journal.path} does not start with a run_started event")
        start = events[0]
        baseline = parse_recipe(start["recipe"], f"{journal.path} (run_started.recipe)")
        cfg_data = dict(start["config"])
        cfg_data["search_space"] = tuple(cfg_data["search_space"])
        if budget_hours is not None:
            cfg_data["budget_hours"] = budget_hours
        tuner = cls(baseline, backend=backend, policy=policy, config=TuneConfig(**cfg_data), run_dir=run_dir,
                    gate=gate, on_event=on_event)
        open_trials: dict[int, dict[str, Any]] = {}
        for ev in events[1:]:
            if ev["event"] == Event.TRIAL_STARTED.value:
                open_trials[ev["trial"]] = ev
            elif ev["event"] == Event.TRIAL_FINISHED.value:
                rec = TrialRecord.model_validate(ev["record"])
                open_trials.pop(rec.id, None)
                tuner.state.records.append(rec)
                tuner.policy.observe(rec)
        tuner.state.records.sort(key=lambda r: r.id)
        for started in open_trials.values():
            tuner._close_interrupted(started)
        if budget_hours is not None:
            tuner.journal.append(Event.RUN_STARTED, resumed=True, budget_hours=budget_hours)
        return tuner

    def _close_interrupted(self, started: dict[str, Any]) -> None:
        """Charge a trial the tuner was killed in for the time it evidently ran, and record it."""
        trial_dir = Path(started["trial_dir"])
        last = max((p.stat().st_mtime for p in trial_dir.rglob("*") if p.is_file()), default=started["time"])
        wall = max(0.0, last - started["time"])
        devices = self.state.baseline.resources.devices
        rec = TrialRecord(id=started["trial"], kind=started["kind"], change=started.get("change", {}),
                          knobs=started.get("knobs", {}), signature=started.get("signature", ""),
                          outcome=TrialOutcome.INTERRUPTED, wall_s=wall, charged_hours=charge(devices, wall),
                          message="the tuner stopped while this trial ran; charged up to its last recorded activity",
                          verdict=started.get("verdict"))
        self._finish(rec)

    # the loop itself -------------------------------------------------------------------------------
    def run(self) -> RunState:
        if not self.journal.exists():
            self.journal.append(Event.RUN_STARTED, recipe=recipe_to_dict(self.state.baseline),
                                config=self.state.config.__dict__, backend=self.backend.name, policy=self.policy.name)
        while True:
            action = next_action(self.state)
            if action.kind == "finish":
                self.state.finished = action.reason
                self.journal.append(Event.RUN_FINISHED, reason=action.reason)
                self.on_event("finished", {"reason": action.reason})
                return self.state
            if action.kind == "baseline":
                self._trial("baseline", self.state.baseline, Change(set={}, source="baseline"), verdict=None)
            elif action.kind == "confirm" and action.target is not None:
                target = action.target
                recipe = apply_change(self.state.best_recipe(), target.change)
                self._trial("confirm", recipe, Change(set=target.change, rationale="confirmation re-run",
                                                      source=target.source), verdict=target.verdict)
            else:
                self._propose_and_run()

    def _context(self) -> PolicyContext:
        best = self.state.best_recipe()
        tried = self.state.tried()

        def admissible(change: dict[str, Any]) -> bool:
            try:
                cand = apply_change(best, change)
            except RecipeError:
                return False
            if signature(cand) in tried:
                return False
            return bool(self._gate(cand, best).admitted)

        return PolicyContext(baseline=self.state.baseline, best=best,
                             best_measurement=self.state.best_measurement(), records=tuple(self.state.records),
                             search_space=self.state.config.search_space, noise_floor=self.state.floor(),
                             budget_left_hours=self.state.budget().left, admissible=admissible)

    def _gate(self, candidate: Recipe | dict[str, Any], parent: Recipe) -> Any:
        history = [self.state.baseline.with_knobs(**{k: v for k, v in r.knobs.items()})
                   for r in self.state.records if r.knobs and r.outcome is not TrialOutcome.INTERRUPTED]
        return self.gate(self.state.baseline, candidate, history, parent=parent)

    def _propose_and_run(self) -> None:
        proposal = self.policy.propose(self._context())
        if isinstance(proposal, Stop):
            self.state.finished = f"policy stopped: {proposal.reason}"
            return
        best = self.state.best_recipe()
        try:
            candidate: Recipe | dict[str, Any] = apply_change(best, proposal)
        except RecipeError as err:
            data = recipe_to_dict(best)
            data["knobs"] = {**best.knobs, **proposal.set}
            candidate = data
            log.debug("proposal makes an invalid recipe: %s", err)
        verdict = self._gate(candidate, best)
        if not verdict.admitted:
            rec = TrialRecord(id=self.state.next_id(), kind="candidate", change=dict(proposal.set),
                              rationale=proposal.rationale, source=proposal.source or self.policy.name,
                              verdict=verdict.to_dict(), outcome=TrialOutcome.REFUSED,
                              message="; ".join(r.message for r in verdict.reasons),
                              decision="refused by the gate (no budget spent)")
            self._finish(rec)
            return
        assert isinstance(candidate, Recipe)
        self._trial("candidate", candidate, proposal, verdict=verdict.to_dict())

    def _trial(self, kind: TrialKind, recipe: Recipe, change: Change, verdict: dict[str, Any] | None) -> TrialRecord:
        tid = self.state.next_id()
        trial_dir = self.run_dir / "trials" / f"{tid:04d}"
        sig = signature(recipe)
        started = dict(trial=tid, kind=kind, change=dict(change.set), knobs=recipe.effective_knobs, signature=sig,
                       trial_dir=str(trial_dir), verdict=verdict)
        self.journal.append(Event.TRIAL_STARTED, **started)
        self.on_event("trial_started", started)
        cfg = self.state.config
        result = self.backend.run(recipe, TrialRequest(trial_id=tid, trial_dir=trial_dir, warmup_steps=cfg.warmup_steps,
                                                      measure_steps=cfg.measure_steps, timeout_s=cfg.trial_timeout_s))
        decision, accepted, g = self._decide(kind, sig, change, result)
        rec = TrialRecord(id=tid, kind=kind, change=dict(change.set), knobs=recipe.effective_knobs, signature=sig,
                          rationale=change.rationale, source=change.source or self.policy.name, verdict=verdict,
                          outcome=result.outcome, message=result.message, measurement=result.measurement,
                          charged_hours=result.charged_hours, wall_s=result.wall_s, accepted=accepted,
                          decision=decision, gain=g)
        self._finish(rec)
        return rec

    def _decide(self, kind: TrialKind, sig: str, change: Change, result: TrialResult) -> tuple[str, bool, float | None]:
        if kind == "baseline":
            return ("baseline run" if result.outcome is TrialOutcome.SUCCEEDED
                    else f"baseline failed: {result.outcome.value}"), False, None
        if result.outcome is not TrialOutcome.SUCCEEDED or result.measurement is None:
            return f"rejected: trial {result.outcome.value}", False, None
        best = self.state.best_throughput() or 0.0
        floor = self.state.floor()
        tps = result.measurement.tokens_per_s_per_device
        if kind == "confirm":
            first = self.state.throughput_of(sig, ("candidate",)) or tps
            mean = (first + tps) / 2
            g = gain(mean, best)
            if clears(mean, best, floor):
                return f"accepted: {g:+.1%} over best after confirmation (floor {floor:.1%})", True, g
            return f"rejected: gain did not hold on re-run ({g:+.1%}, floor {floor:.1%})", False, g
        g = gain(tps, best)
        if not clears(tps, best, floor):
            return f"rejected: {g:+.1%} does not clear the noise floor {floor:.1%}", False, g
        if self.state.config.confirm:
            return PENDING_CONFIRM, False, g
        return f"accepted: {g:+.1%} over best (floor {floor:.1%})", True, g

    def _finish(self, rec: TrialRecord) -> None:
        self.journal.append(Event.TRIAL_FINISHED, record=rec.model_dump(mode="json"))
        self.state.records.append(rec)
        self.policy.observe(rec)
        self.on_event("trial_finished", {"record": rec, "state": self.state})

