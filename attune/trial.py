"""The trial vocabulary, below every other package: what a trial is asked to do (:class:`TrialRequest`), what came
back (:class:`TrialResult`, :class:`Measurement`, :class:`TrialOutcome`), and the record the run keeps of it
(:class:`TrialRecord`, its :class:`TrialKind` and :class:`Decision`).

Records are frozen: policies and reports get read-only snapshots. Failures are outcomes, never exceptions.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, computed_field, model_validator

if TYPE_CHECKING:  # the seam's signatures name a recipe; the vocabulary imports nothing of attune's at run time
    from attune.recipe.model import Recipe


class TrialOutcome(str, Enum):
    SUCCEEDED = "succeeded"
    OOM = "oom"
    CRASHED = "crashed"  # killed by a signal (segfault, abort, OOM killer) or a communication failure
    FAILED = "failed"  # exited by itself with a non-zero status; the message holds it and the first error line
    FINISHED_EARLY = "finished_early"  # exited 0 by itself before the measurement window was complete
    TIMED_OUT = "timed_out"
    DIVERGED = "diverged"
    REFUSED = "refused"  # the gate refused it: never launched, costs nothing
    INTERRUPTED = "interrupted"  # the tuner itself was killed while it ran, or attune's budget deadline ended it
    #: it ran, but its measurement cannot be true (its step lines reached attune in one burst, its steps read far
    #: faster than the job's own clock, or it lies far outside the same recipe's other runs): a fault of the
    #: measurement, not of the recipe. Never used as a measurement; the engine runs the trial again (a few times)
    MISMEASURED = "mismeasured"

    @property
    def failed(self) -> bool:
        return self in (TrialOutcome.OOM, TrialOutcome.CRASHED, TrialOutcome.FAILED, TrialOutcome.FINISHED_EARLY,
                        TrialOutcome.TIMED_OUT, TrialOutcome.DIVERGED)


class FailureKind(str, Enum):
    """What a failure signature in a trial's output means (the ``kind`` of a log parser's error records)."""

    OOM = "oom"  #: out of device (or host) memory
    DIVERGED = "diverged"  #: the loss or the gradient norm became NaN or Inf
    COMM = "comm"  #: a collective failed (NCCL, gloo)
    CRASH = "crash"  #: any other error the framework names (its message explains the failure)

    def __str__(self) -> str:
        return self.value

    @property
    def outcome(self) -> TrialOutcome:
        """The outcome a trial that failed this way has."""
        return {FailureKind.OOM: TrialOutcome.OOM, FailureKind.DIVERGED: TrialOutcome.DIVERGED}.get(
            self, TrialOutcome.CRASHED)


def failure_message(errors: list[dict[str, Any]], kind: FailureKind) -> str | None:
    """The message of the first error of ``kind`` among a log parser's error records, or None."""
    return next((str(e.get("message", "")) for e in errors if e.get("kind") == kind), None)


#: the outcome values of launched trials that gave no measurement (for reports that read result.json)
FAILED_OUTCOMES = tuple(o.value for o in TrialOutcome if o.failed)


class Measurement(BaseModel):
    """Steady-state figures of one trial (warm-up dropped)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tokens_per_s_per_device: float = Field(description="throughput per allocated device")
    tokens_per_s: float = Field(description="throughput of the whole job")
    step_time_median_s: float
    step_time_cv: float = Field(description="coefficient of variation of step times in the window")
    steps_measured: int
    warmup_steps: int | None = Field(default=None, description="steps dropped as warm-up before the window "
                                     "(detected from the step series where the trial's window was adaptive)")
    ended: str | None = Field(default=None, description="why an adaptive window ended: 'precise' (its median known "
                              "well enough), 'futile' (a candidate surely below what it needed), 'cap' (its "
                              "most steps)")
    peak_memory_mb: float | None = None
    phases: dict[str, float] = Field(default_factory=dict, description="median seconds per step by phase")
    losses: list[float] = Field(default_factory=list, description="per-step loss over the whole trial")
    grad_norms: list[float] = Field(default_factory=list)
    signals: dict[str, float] = Field(default_factory=dict, description="backend-specific utilisation signals")
    reported: dict[str, bool | int | float | str] = Field(
        default_factory=dict, description="training contract as the job's own output reported it (e.g. HF's total "
                                          "train batch size), checked against the recipe and the baseline's")


#: a trial whose measurement was a fault (``mismeasured``) is run again at most this many times in a row; the next
#: fault settles it (a candidate or confirmation is rejected, a baseline run counts as failed): a job whose output
#: always reaches attune in one burst cannot be measured, and saying so costs less than measuring it on and on
MAX_REMEASURES = 2

class TrialKind(str, Enum):
    """What a record is for (a ``str`` enum: the journal, result.json and the CRD status keep the plain names)."""

    BASELINE = "baseline"  #: the recipe as given, measured (twice at least) before any change
    CANDIDATE = "candidate"  #: a proposed change's first run (or its refusal: never launched)
    CONFIRM = "confirm"  #: a promising candidate's re-run
    REFERENCE = "reference"  #: the best so far, re-run between a candidate's two runs (paired decisions)
    CALIBRATION = "calibration"  #: the baseline re-run for the loss check's run-to-run tolerance
    LOSS_CHECK = "loss_check"  #: the loss-equivalence comparison (launches nothing)
    DECISION = "decision"  #: a look at a paired decision after the best's reference run (launches nothing)
    CERTIFY = "certify"  #: the final interleaved baseline/best runs that certify the speedup

    def __str__(self) -> str:
        return self.value


#: the kinds of record that launch nothing: a comparison of runs already made (the loss check, a paired look)
ZERO_COST_KINDS = (TrialKind.LOSS_CHECK, TrialKind.DECISION)

#: the kinds that measure a configuration for the search (not calibration, certification or a comparison)
SEARCH_KINDS = (TrialKind.BASELINE, TrialKind.CANDIDATE, TrialKind.CONFIRM)


PENDING_CONFIRM = "pending confirmation re-run"
PENDING_PAIR = "pending paired re-measurement against the best"
PAIR_REFERENCE = "reference run of the best, between the candidate's two runs"
PAIR_LEAD_REFERENCE = "reference run of the best, after the candidate's run: the look follows"
LEAD_RUN = "the best's run just before the next candidate: its paired decision starts from it"
PENDING_MORE = "pending one more interleaved pair (the best, then the candidate): inconclusive so far"
PENDING_MORE_LED = "pending one more interleaved pair (the candidate, then the best): inconclusive so far"
PENDING_LOSS_CHECK = "pending loss-equivalence check"
NOT_RUN_MOOT = "not run: it cannot matter for this recipe (no budget spent)"


class Decision(str, Enum):
    """Where a record's decision stands (``TrialRecord.status``), beside the text that says why
    (``TrialRecord.decision``). The loop reads this, never the text."""

    NOTED = "noted"  #: a run that decides nothing by itself: a baseline, reference, calibration or certification run
    KEPT = "kept"  #: the change is kept: the new best
    REJECTED = "rejected"  #: decided against (slower, not shown above the noise, failed, or not loss-equivalent)
    REFUSED = "refused"  #: refused before launch (the gate, the search space, the budget): no budget spent
    MOOT = "moot"  #: not run: the change cannot matter for this recipe (no budget spent)
    PENDING_CONFIRM = "pending_confirm"  #: promising: a confirmation re-run decides
    PENDING_PAIR = "pending_pair"  #: promising (or a look's run): the best's reference run follows
    PENDING_MORE = "pending_more"  #: inconclusive so far: one more interleaved pair
    PENDING_LOSS_CHECK = "pending_loss_check"  #: faster: the loss-equivalence check decides

    def __str__(self) -> str:
        return self.value

    @property
    def pending(self) -> bool:
        return self.name.startswith("PENDING_")

    @classmethod
    def of_text(cls, text: str, *, accepted: bool = False, refused: bool = False) -> Decision:
        """The status a record written before statuses existed had, read from its decision text (old journals)."""
        if accepted:
            return cls.KEPT
        pending = {PENDING_CONFIRM: cls.PENDING_CONFIRM, PENDING_PAIR: cls.PENDING_PAIR,
                   PENDING_MORE: cls.PENDING_MORE, PENDING_MORE_LED: cls.PENDING_MORE,
                   PENDING_LOSS_CHECK: cls.PENDING_LOSS_CHECK}
        if text in pending:
            return pending[text]
        if refused:
            return cls.MOOT if text.startswith(NOT_RUN_MOOT) else cls.REFUSED
        return cls.REJECTED if text.startswith("rejected") else cls.NOTED


class LLMUsage(BaseModel):
    """What a proposal cost an LLM endpoint: its tokens, attempts and seconds, and whether the playbook took over."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str = "-"
    prompt_tokens: int = 0
    completion_tokens: int = 0
    attempts: int = 0
    seconds: float = 0.0
    fallback: bool = False


class TrialRecord(BaseModel):
    """Everything known about one attempted configuration."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: int
    kind: TrialKind
    change: dict[str, Any] = Field(default_factory=dict, description="knob → new value (empty for baseline)")
    knobs: dict[str, Any] = Field(default_factory=dict, description="full effective knob assignment")
    signature: str = ""
    rationale: str = ""
    source: str = ""
    lessons: list[str] = Field(default_factory=list, description="ids of the lessons that moved this proposal")
    usage: LLMUsage | None = Field(default=None, description="what the proposal cost an LLM endpoint, if one made it")
    verdict: dict[str, Any] | None = None
    outcome: TrialOutcome
    message: str = ""
    measurement: Measurement | None = None
    charged_hours: float = 0.0
    wall_s: float = 0.0
    status: Decision = Field(default=Decision.NOTED, description="where the decision stands (read by the loop)")
    decision: str = Field(default="", description="why: the reason for the status, in words")
    gain: float | None = Field(default=None, description="relative throughput gain over the best at the time")
    loss_check: dict[str, Any] | None = Field(default=None, description="loss-equivalence result, if one was run")

    @model_validator(mode="before")
    @classmethod
    def _status_of_old_records(cls, data: Any) -> Any:
        """A record without a status (an older journal, or one built from its text) gets the one its text says;
        ``accepted``, which a record's JSON carries (it is :attr:`accepted`, derived), is read only for that."""
        if isinstance(data, dict) and "accepted" in data:
            data = dict(data)
            accepted = bool(data.pop("accepted"))
            if data.get("status") is None:
                refused = str(data.get("outcome") or "") == TrialOutcome.REFUSED.value
                data["status"] = Decision.of_text(str(data.get("decision") or ""), accepted=accepted, refused=refused)
        elif isinstance(data, dict) and data.get("status") is None:
            refused = str(data.get("outcome") or "") == TrialOutcome.REFUSED.value
            data = {**data, "status": Decision.of_text(str(data.get("decision") or ""), refused=refused)}
        return data

    @computed_field  # type: ignore[prop-decorator]
    @property
    def accepted(self) -> bool:
        """The change is kept (the status says so: one decision, stored once, with its reason in words)."""
        return self.status is Decision.KEPT

    @property
    def launched(self) -> bool:
        """True if this record ran something (refusals and loss comparisons launch nothing)."""
        return self.outcome is not TrialOutcome.REFUSED and self.kind not in ZERO_COST_KINDS

    @property
    def throughput(self) -> float | None:
        return self.measurement.tokens_per_s_per_device if self.measurement else None

    def label(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.change.items()) or "(baseline)"


@dataclass(frozen=True)
class MeasurePlan:
    """When a trial has measured enough (the adaptive window, :func:`attune.engine.measure.window_end`).

    The warm-up is detected from the step series (the first steps that are not slower than the steady level), not
    assumed; the measurement ends once the window's median step time is known to a relative standard error of
    ``target_se`` (set from the run-to-run noise, so the window adds little to it) over at least ``min_window``
    steps, or, for a candidate, once its throughput is surely below ``futility_tps`` (tokens/s per device: what it
    needs to stay worth a paired re-measurement). Never more steps than the request's ``warmup_steps +
    measure_steps``: an adaptive trial costs at most what a fixed one does."""

    target_se: float
    min_window: int = 3
    futility_tps: float | None = None


@dataclass(frozen=True)
class TrialRequest:
    """One trial as the engine asks a backend for it: its id and directory, the steps to run (at most: a ``plan``
    may end it sooner), the deadline."""

    trial_id: int
    trial_dir: Path
    warmup_steps: int
    measure_steps: int
    timeout_s: float
    seed: int = 0
    plan: MeasurePlan | None = None

    @property
    def steps(self) -> int:
        return self.warmup_steps + self.measure_steps


@dataclass(frozen=True)
class TrialResult:
    """What a backend reports of one trial: never an exception for a failed one."""

    outcome: TrialOutcome
    measurement: Measurement | None
    wall_s: float
    devices: int
    charged_hours: float
    message: str = ""
    extra: dict[str, object] = field(default_factory=dict)

# -- the backend seam ------------------------------------------------------------------------------------------------
# A backend never raises for a failed trial: out of memory, crashes, hangs and divergence come back as
# :class:`TrialResult` outcomes with the accelerator-hours they cost. It raises :class:`~attune.errors.BackendError`
# only when it cannot work at all (no torchrun, no cluster).

class TrialBackend(ABC):
    """Runs trials. ``run`` must always release everything it started, whatever happens."""

    name: str = "backend"
    #: seconds a trial may still run (and be charged) after its deadline: the backend's kill grace and teardown
    teardown_s: float = 0.0

    @abstractmethod
    def run(self, recipe: Recipe, request: TrialRequest) -> TrialResult:
        """Launch ``recipe`` for ``request.steps`` steps, wait (at most ``timeout_s``), measure, clean up."""

    def estimate_hours(self, recipe: Recipe, request: TrialRequest) -> float | None:
        """What one trial of ``recipe`` is expected to cost, before any has run (``None``: unknown)."""
        return None

    def worst_case_hours(self, recipe: Recipe, request: TrialRequest) -> float | None:
        """The most one trial of ``recipe`` can be charged (``None``: this backend cannot tell before it runs).
        A backend that can tell lets the engine refuse a candidate whose decision the budget left cannot pay for."""
        return None

    def prepare(self, recipe: Recipe, work_dir: Path) -> dict[str, object] | None:
        """Run the recipe's one-time set-up before its first trial (see ``Framework.setup``); what it was and how
        long it took, or None when there is none. Never raises for a failed set-up: it is reported."""
        return None

    def release(self, trial_dir: Path) -> None:  # noqa: B027 - optional hook
        """Release whatever an interrupted run of this backend left behind for ``trial_dir`` (on resume)."""

    def loss_curve(self, recipe: Recipe, request: TrialRequest) -> TrialResult:
        """Run for a loss-equivalence check (same as ``run`` unless a backend knows better)."""
        return self.run(recipe, request)
