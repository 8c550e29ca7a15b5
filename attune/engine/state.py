"""Trial records and the engine state folded from the journal.

Records are frozen: policies and reports get read-only snapshots. Failures are outcomes, never exceptions.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class TrialOutcome(str, Enum):
    SUCCEEDED = "succeeded"
    OOM = "oom"
    CRASHED = "crashed"  # killed by a signal (segfault, abort, OOM killer) or a communication failure
    FAILED = "failed"  # exited by itself with a non-zero status; the message holds it and the first error line
    FINISHED_EARLY = "finished_early"  # exited 0 by itself before the measurement window was complete
    TIMED_OUT = "timed_out"
    DIVERGED = "diverged"
    REFUSED = "refused"  # the gate refused it: never launched, costs nothing
    INTERRUPTED = "interrupted"  # the tuner itself was killed while it ran

    @property
    def failed(self) -> bool:
        return self in (TrialOutcome.OOM, TrialOutcome.CRASHED, TrialOutcome.FAILED, TrialOutcome.FINISHED_EARLY,
                        TrialOutcome.TIMED_OUT, TrialOutcome.DIVERGED)


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
    peak_memory_mb: float | None = None
    phases: dict[str, float] = Field(default_factory=dict, description="median seconds per step by phase")
    losses: list[float] = Field(default_factory=list, description="per-step loss over the whole trial")
    grad_norms: list[float] = Field(default_factory=list)
    signals: dict[str, float] = Field(default_factory=dict, description="backend-specific utilisation signals")
    reported: dict[str, bool | int | float | str] = Field(
        default_factory=dict, description="training contract as the job's own output reported it (e.g. HF's total "
                                          "train batch size), checked against the recipe and the baseline's")


TrialKind = Literal["baseline", "candidate", "confirm", "reference", "calibration", "loss_check", "certify"]


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
    verdict: dict[str, Any] | None = None
    outcome: TrialOutcome
    message: str = ""
    measurement: Measurement | None = None
    charged_hours: float = 0.0
    wall_s: float = 0.0
    accepted: bool = False
    decision: str = Field(default="", description="why the trial was accepted or rejected")
    gain: float | None = Field(default=None, description="relative throughput gain over the best at the time")
    loss_check: dict[str, Any] | None = Field(default=None, description="loss-equivalence result, if one was run")

    @property
    def launched(self) -> bool:
        """True if this record ran something (refusals and loss comparisons launch nothing)."""
        return self.outcome is not TrialOutcome.REFUSED and self.kind != "loss_check"

    @property
    def throughput(self) -> float | None:
        return self.measurement.tokens_per_s_per_device if self.measurement else None

    def label(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.change.items()) or "(baseline)"
