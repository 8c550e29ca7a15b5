"""Failure paths against the real operator process: an unreachable agent sidecar, an unreachable Prometheus,
and a PyTorchJob that fails. The three runs share one operator, Prometheus and stand-in Kubeflow."""

from __future__ import annotations

from typing import Any

import pytest

from tests.k8s.conftest import good_run
from tests.k8s.harness import NS, KubeAPI, free_port, wait_for

pytestmark = [pytest.mark.k8s, pytest.mark.slow, pytest.mark.e2e]


def _short(run: dict[str, Any]) -> dict[str, Any]:
    """A run with one short baseline and short sequences, so a trial takes a few seconds."""
    run["spec"]["recipe"]["inline"]["training"]["seq_length"] = 16
    run["spec"]["metrics"].update(warmupSteps=1, measureSteps=6, baselineRepeats=1)
    return run


def _condition(kube: KubeAPI, name: str, ctype: str) -> dict[str, Any] | None:
    run = kube.run(name) or {}
    return next((c for c in (run.get("status") or {}).get("conditions") or [] if c["type"] == ctype), None)


def _finished(kube: KubeAPI, name: str) -> dict[str, Any] | None:
    run = kube.run(name) or {}
    return run if (run.get("status") or {}).get("phase") in ("Succeeded", "Failed") else None


def test_unreachable_agent_prometheus_and_failed_jobs_surface_as_conditions(kube, operator, kubeflow, prometheus):
    closed = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    runs = {
        # the sidecar is down: the local policy proposes instead, and the run says so
        "noagent": _short(good_run("noagent", prometheus.url, closed,
                                        searchSpace=["activation_checkpointing"])),
        # Prometheus is down: the finished trial cannot be measured, which is a condition, not a silent stall
        "noprom": _short(good_run("noprom", closed, None)),
        # every trial's trainer crashes at step 1: each is recorded failed and charged, the run goes on
        "crash": _short(good_run("crash", prometheus.url, None)),
    }
    # the baseline and a candidate, not re-run; room for one more, so that a baseline run that fails on a loaded
    # machine (it is retried) still leaves a candidate for the fallback policy to propose
    runs["noagent"]["spec"]["budget"]["maxTrials"] = 3
    runs["noagent"]["spec"]["metrics"].update(confirm=False, paired=False)  # decided on its one run
    crash_pod = runs["crash"]["spec"]["trialTemplate"]["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    crash_pod["containers"][0]["env"] = [{"name": "ATTUNE_TRAINER_FAULT", "value": "crash@1"}]
    for run in runs.values():
        kube.custom.create_namespaced_custom_object("attune.dev", "v1alpha1", NS, "tuningruns", run)

    # Prometheus unreachable: the condition names the reason once the first trial's job has finished
    cond = wait_for(lambda: _condition(kube, "noprom", "MetricsAvailable"), 120, "noprom's MetricsAvailable")
    assert cond["status"] == "False" and cond["reason"] == "PrometheusUnreachable", cond
    assert "unreachable" in cond["message"] and closed in cond["message"], cond
    assert "noprom-t001" in kubeflow.done
    noprom = kube.run("noprom")["status"]
    assert noprom["currentTrial"] == "noprom-t001" and not kube.records("noprom"), "the unmeasured trial was recorded"

    # a failed job: recorded failed and charged, and the run launched the next trial
    crash = wait_for(lambda: _finished(kube, "crash"), 120, "the crashing run to finish")["status"]
    records = kube.records("crash")
    assert len(records) == 2 and all(r["outcome"] == "crashed" for r in records), records
    assert all(r["charged_hours"] > 0 for r in records) and "torchrun exited with 1" in records[0]["message"]
    assert crash["budget"]["hoursUsed"] == pytest.approx(sum(r["charged_hours"] for r in records), abs=1e-6)
    assert sorted(n for n in kubeflow.launched if n.startswith("crash-")) == ["crash-t001", "crash-t002"]
    trials = {t["metadata"]["name"]: t["status"] for t in kube.trials() if t["spec"]["runRef"] == "crash"}
    assert all(s["phase"] == "Failed" and s["outcome"] == "crashed" and s["hoursCharged"] > 0
               for s in trials.values()), trials
    healthy = next(c for c in crash["conditions"] if c["type"] == "TrialsHealthy")
    assert healthy["status"] == "False" and healthy["reason"] == "JobFailed"
    assert crash["phase"] == "Failed" and crash["trials"]["failed"] == 2

    # agent unreachable: the local fallback policy proposed the candidate, and a condition says so
    noagent = wait_for(lambda: _finished(kube, "noagent"), 150, "the run without its agent to finish")["status"]
    cond = next((c for c in noagent["conditions"] if c["type"] == "AgentAvailable"), None)
    assert cond is not None, (noagent, kube.records("noagent"))
    assert cond["status"] == "False" and cond["reason"] == "AgentUnreachable", cond
    assert "local playbook policy" in cond["message"], cond
    cands = [r for r in kube.records("noagent") if r["kind"] == "candidate"]
    assert cands and all(r["source"].endswith("-fallback") for r in cands), cands
    assert noagent["phase"] == "Succeeded", noagent.get("message")

    # Prometheus is still down: the condition holds and the trial is still waiting to be measured, not dropped
    assert _condition(kube, "noprom", "MetricsAvailable")["reason"] == "PrometheusUnreachable"
    assert kube.run("noprom")["status"]["currentTrial"] == "noprom-t001"
