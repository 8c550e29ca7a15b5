"""kstatus and GitOps health (attune/operator/health.py): every condition has a generation and a transition time,
kstatus reads a run right, and the Argo CD Lua health check agrees with its Python twin and ships in the README."""

from __future__ import annotations

from typing import Any

import pytest

from tests.k8s.fakes import FakePorts, drive, step, tuning_run

pytestmark = pytest.mark.k8s


# -- kstatus and GitOps --------------------------------------------------------------------------------------------

def test_every_condition_has_a_generation_and_a_transition_time_and_kstatus_is_right():
    from attune.operator.health import argocd_health, kstatus

    ports = FakePorts()
    run = tuning_run()
    seen = set()
    for _ in range(200):
        step(run, ports)
        ports.finish()
        assert all(c["observedGeneration"] == 1 and c["lastTransitionTime"] for c in run["status"]["conditions"])
        seen.add((run["status"]["phase"], kstatus(run), argocd_health(run)["status"]))
        if run["status"]["phase"] in ("Succeeded", "Failed"):
            break
    assert ("Baseline", "InProgress", "Progressing") in seen and ("Succeeded", "Current", "Healthy") in seen
    failed = tuning_run()
    drive(failed, FakePorts(), each=lambda p: p.finish(ok=False, reason="Error"))
    assert kstatus(failed) == "Failed" and argocd_health(failed)["status"] == "Degraded"
    suspended = tuning_run(suspend=True)
    step(suspended, FakePorts())
    assert argocd_health(suspended)["status"] == "Suspended" and kstatus(suspended) == "Current"
    # an edit after the end: the generation is observed, nothing else moves
    run["metadata"]["generation"] = 2
    assert kstatus(run) == "InProgress"
    step(run, ports)
    assert kstatus(run) == "Current" and all(c["observedGeneration"] == 2 for c in run["status"]["conditions"])


LUA_CASES = ["none", "fresh", "baseline", "stalled", "succeeded", "failed", "suspended", "stale"]


def _status_case(case: str) -> dict[str, Any]:
    def c(t, s, m=""):
        return {"type": t, "status": s, "reason": t, "message": m, "lastTransitionTime": "2026-01-01T00:00:00Z",
                "observedGeneration": 1}
    obj: dict[str, Any] = {"metadata": {"generation": 1}}
    if case == "none":
        return obj
    base = {"observedGeneration": 1, "phase": "Baseline", "conditions": [c("Ready", "False"), c("Reconciling", "True",
                                                                                                  "trial r-t001")]}
    obj["status"] = base
    if case == "stalled":
        base["conditions"] = [c("Ready", "False"), c("Stalled", "True", "Prometheus unreachable")]
    elif case == "succeeded":
        base.update(phase="Succeeded", message="budget spent", conditions=[c("Ready", "True")])
    elif case == "failed":
        base.update(phase="Failed", message="no baseline", conditions=[c("Stalled", "True", "no baseline")])
    elif case == "suspended":
        base.update(phase="Suspended", conditions=[c("Ready", "False"), c("Reconciling", "False")])
    elif case == "stale":
        obj["metadata"]["generation"] = 2
    elif case == "fresh":
        base["conditions"] = []
    return obj


@pytest.mark.parametrize("case", LUA_CASES)
def test_the_argocd_lua_health_check_agrees_with_its_python_twin(case):
    from attune.operator.health import ARGOCD_HEALTH_LUA, argocd_health

    obj = _status_case(case)
    expected = argocd_health(obj)
    lupa = pytest.importorskip("lupa")
    lua = lupa.LuaRuntime(unpack_returned_tuples=True)

    def to_lua(v):
        if isinstance(v, dict):
            return lua.table_from({k: to_lua(x) for k, x in v.items()})
        if isinstance(v, list):
            return lua.table_from([to_lua(x) for x in v])
        return v
    fn = lua.eval("function(obj) " + ARGOCD_HEALTH_LUA + " end")
    got = fn(to_lua(obj))
    assert {"status": got["status"], "message": got["message"]} == expected


def test_the_readme_ships_the_argocd_health_check():
    from pathlib import Path

    from attune.operator.health import ARGOCD_HEALTH_LUA

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert "resource.customizations.health.attune.dev_TuningRun" in readme
    body = "\n".join(line[4:] if line.startswith("    ") else line for line in ARGOCD_HEALTH_LUA.splitlines())
    assert all(line.strip() in readme for line in body.splitlines() if line.strip())
