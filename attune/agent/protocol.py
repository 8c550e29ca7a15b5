"""Wire format of the agent sidecar (``attune agent serve``), shared by the service and the operator.

The sidecar is stateless, like Katib's suggestion services: every request carries the whole run
(baseline recipe, every trial record so far, search space), so any replica can answer and an operator
restart loses nothing.

- ``POST /v1/propose``  ProposeRequest → ProposeResponse (a change or a stop, with its source)
- ``POST /v1/observe``  ObserveRequest → {"ok": true} (distils lessons from a finished run or trial)
- ``GET  /healthz``     → {"status": "ok", "policies": [...]}
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from attune.engine.state import TrialRecord
from attune.recipe.catalogue import KnobValue


class ProposeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    policy: Literal["playbook", "llm", "hybrid", "coordinate", "random"] = "playbook"
    baseline: dict[str, Any] = Field(description="the user's baseline recipe (as a recipe mapping)")
    best: dict[str, Any] | None = Field(default=None, description="current best recipe; baseline when absent")
    records: list[TrialRecord] = Field(default_factory=list)
    search_space: list[str] = Field(default_factory=list)
    noise_floor: float = 0.05
    budget_left_hours: float = 0.0
    seed: int = 0


class ProposeResponse(BaseModel):
    model_config = ConfigDict(extra="forbid")

    action: Literal["change", "stop"]
    change: dict[str, KnobValue] = Field(default_factory=dict)
    rationale: str = ""
    source: str = Field(default="", description="policy that produced it (e.g. llm, playbook, playbook-fallback)")
    reason: str = Field(default="", description="why the policy stopped")
    expected_gain: float | None = None


class ObserveRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    baseline: dict[str, Any]
    records: list[TrialRecord]
    finished: bool = False
