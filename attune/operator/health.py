"""How GitOps tools read a TuningRun's health: the kstatus conditions and an Argo CD health check.

The operator keeps three conditions in the kstatus shape on every step (see
:func:`attune.operator.reconcile.kstatus_conditions`), each with ``observedGeneration`` and ``lastTransitionTime``:

- ``Ready``: True once the run Succeeded (its tuned recipe is in the ``<run>-tuned`` ConfigMap);
- ``Reconciling``: True while the run works (baseline, tuning), False when done, suspended or stalled;
- ``Stalled``: True when the run Failed, or is held by what someone must change (a missing Secret, a Kueue queue
  that does not exist); a hold that clears by itself (Prometheus unreachable, a discovery 503) is named on
  ``Reconciling`` instead (:data:`attune.operator.outcomes.HOLDS`).

Flux (kstatus) reads those directly. Argo CD needs a Lua health check in ``argocd-cm``
(``resource.customizations.health.attune.dev_TuningRun``): :data:`ARGOCD_HEALTH_LUA`, whose logic
:func:`argocd_health` mirrors (the tests run both on the operator's own statuses).
"""

from __future__ import annotations

from typing import Any

ARGOCD_HEALTH_LUA = """\
hs = {}
if obj.status == nil then
  hs.status = "Progressing"
  hs.message = "waiting for the operator"
  return hs
end
local gen = obj.metadata.generation
if gen ~= nil and obj.status.observedGeneration ~= nil and obj.status.observedGeneration < gen then
  hs.status = "Progressing"
  hs.message = "the operator has not seen the latest spec yet"
  return hs
end
local c = {}
if obj.status.conditions ~= nil then
  for _, cond in ipairs(obj.status.conditions) do
    c[cond.type] = cond
  end
end
if obj.status.phase == "Failed" or (c.Stalled ~= nil and c.Stalled.status == "True") then
  hs.status = "Degraded"
  hs.message = (c.Stalled ~= nil and c.Stalled.message) or obj.status.message or "failed"
  return hs
end
if c.Ready ~= nil and c.Ready.status == "True" then
  hs.status = "Healthy"
  hs.message = obj.status.message or "tuned"
  return hs
end
if obj.status.phase == "Suspended" then
  hs.status = "Suspended"
  hs.message = "spec.suspend is true"
  return hs
end
hs.status = "Progressing"
hs.message = (c.Reconciling ~= nil and c.Reconciling.message) or obj.status.phase or "starting"
return hs
"""


def argocd_health(obj: dict[str, Any]) -> dict[str, str]:
    """What :data:`ARGOCD_HEALTH_LUA` answers for ``obj`` (a TuningRun): ``{"status": ..., "message": ...}``."""
    status = obj.get("status")
    if status is None:
        return {"status": "Progressing", "message": "waiting for the operator"}
    gen = (obj.get("metadata") or {}).get("generation")
    seen = status.get("observedGeneration")
    if gen is not None and seen is not None and seen < gen:
        return {"status": "Progressing", "message": "the operator has not seen the latest spec yet"}
    c = {cond.get("type"): cond for cond in status.get("conditions") or []}
    stalled = c.get("Stalled")
    if status.get("phase") == "Failed" or (stalled is not None and stalled.get("status") == "True"):
        return {"status": "Degraded",
                "message": (stalled or {}).get("message") or status.get("message") or "failed"}
    ready = c.get("Ready")
    if ready is not None and ready.get("status") == "True":
        return {"status": "Healthy", "message": status.get("message") or "tuned"}
    if status.get("phase") == "Suspended":
        return {"status": "Suspended", "message": "spec.suspend is true"}
    rec = c.get("Reconciling")
    return {"status": "Progressing",
            "message": (rec or {}).get("message") or status.get("phase") or "starting"}


def kstatus(obj: dict[str, Any]) -> str:
    """The kstatus reading of ``obj``: Current, InProgress or Failed (as Flux's health checks compute it)."""
    status = obj.get("status") or {}
    gen = (obj.get("metadata") or {}).get("generation")
    if gen is not None and status.get("observedGeneration") != gen:
        return "InProgress"
    c = {cond.get("type"): cond.get("status") for cond in status.get("conditions") or []}
    if c.get("Stalled") == "True":
        return "Failed"
    if c.get("Reconciling") == "True":
        return "InProgress"
    if "Ready" in c and c["Ready"] != "True" and status.get("phase") != "Suspended":
        return "InProgress"
    return "Current"
