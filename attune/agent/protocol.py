"""Wire format of the agent sidecar (``attune agent serve``), shared by the service and the operator.

The sidecar is stateless, like Katib's suggestion services: every request carries the whole run
(baseline recipe, every trial record so far, search space), so any replica can answer and an operator
restart loses nothing.

- ``POST /v1/propose``  ProposeRequest → ProposeResponse (a change or a stop, with its source)
- ``POST /v1/observe``  ObserveRequest → {"ok": true} (distils lessons from a finished run or trial)
- ``GET  /healthz``     → {"status": "ok", "policies": [...]}

Every error is a JSON object ``{"detail": ...}``: 422 with a list of ``{"loc", "msg", "type"}`` for a request
that is not a valid run (bad JSON, nested deeper than 32 levels, a recipe, record, knob value or number the
engine would not accept), 413 for a body over the size limit, 503 when the policy (or the lessons store) cannot
answer. The sidecar never answers 500.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from attune.agent.lessons.model import Lesson, NoiseRecord
from attune.recipe.catalogue import KnobValue
from attune.trial import TrialRecord

#: most trial records one request may carry
MAX_RECORDS = 5000
#: largest accelerator-hour figure (a budget, a charge) a request may carry
MAX_HOURS = 1e9
#: the backend a request's trials ran on when it does not say: the operator's pods (real hardware)
DEFAULT_BACKEND = "k8s"

Backend = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$",
                               description="backend that ran the trials (sim: simulated; lessons are scoped by it)")]


class LessonsPayload(BaseModel):
    """A tenant's lessons, sent with a proposal request by a caller that keeps them (the operator keeps each
    namespace's in that namespace). The sidecar uses them for that one request only and keeps nothing."""

    model_config = ConfigDict(extra="forbid")

    lessons: list[Lesson] = Field(default_factory=list, max_length=MAX_RECORDS)
    noise: list[NoiseRecord] = Field(default_factory=list, max_length=MAX_RECORDS)


class ProposeRequest(BaseModel):
    """One proposal request. Numbers must be finite; the sidecar also checks the baseline, every record's
    knobs and the search space against the framework's catalogue (422 with the field path otherwise)."""

    model_config = ConfigDict(extra="forbid")

    policy: Literal["playbook", "llm", "hybrid", "coordinate", "random"] = "playbook"
    baseline: dict[str, Any] = Field(description="the user's baseline recipe (as a recipe mapping)")
    best: dict[str, Any] | None = Field(default=None, description="current best recipe; baseline when absent")
    records: list[TrialRecord] = Field(default_factory=list, max_length=MAX_RECORDS)
    search_space: list[str] = Field(default_factory=list, max_length=1000)
    noise_floor: float = Field(default=0.05, ge=0.0, le=100.0, allow_inf_nan=False)
    budget_left_hours: float = Field(default=0.0, ge=0.0, le=MAX_HOURS, allow_inf_nan=False)
    seed: int = Field(default=0, ge=-(2**63), le=2**63 - 1)
    backend: Backend = DEFAULT_BACKEND
    lessons: LessonsPayload | None = Field(
        default=None, description="the caller's lessons for this run (its tenant's); when given, the sidecar's own "
                                  "store is not read")


class ProposeResponse(BaseModel):
    model_config = ConfigDict(extra="forbid")

    action: Literal["change", "stop"]
    change: dict[str, KnobValue] = Field(default_factory=dict)
    rationale: str = ""
    source: str = Field(default="", description="policy that produced it (e.g. llm, playbook, playbook-fallback)")
    reason: str = Field(default="", description="why the policy stopped")
    expected_gain: float | None = None


class ObserveRequest(BaseModel):
    """A run (or its progress) to learn from; checked exactly like a :class:`ProposeRequest`'s run."""

    model_config = ConfigDict(extra="forbid")

    baseline: dict[str, Any]
    records: list[TrialRecord] = Field(max_length=MAX_RECORDS)
    finished: bool = False
    backend: Backend = DEFAULT_BACKEND
