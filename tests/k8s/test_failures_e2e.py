"""Failure paths against the real operator process on the real control plane: an unreachable agent sidecar, an
unreachable Prometheus, and a PyTorchJob that fails (its trainer exits non-zero in the pod the real training
operator made and the pod runner ran). The three runs share one operator, Prometheus and training operator."""

from __future__ import annotations

from typing import Any

import pytest

from tests.k8s.conftest import good_run
from tests.k8s.harness import NS, Operator, Prometheus, free_port, free_port_block, wait_for
from tests.k8s.realcluster import Release

pytestmark = [pytest.mark.k8s, pytest.mark.slow, pytest.mark.e2e]


def _short(run: dict[str, Any]) -> dict[str, Any]:
    """A run with one short baseline and short sequences, so a trial takes a few seconds, whose trials run on the pod
    runner's Node side by side with the other runs': metrics ports of its own, a free rendezvous port (MASTER_PORT,
    the port named ``pytorchjob-port``: the pods share this machine's network) and a third of the Node's CPUs."""
    run["spec"]["recipe"]["inline"]["training"]["seq_length"] = 16
    run["spec"]["metrics"].update(warmupSteps=1, measureSteps=6, baselineRepeats=1, metricsPort=free_port_block(2))
    container = run["spec"]["trialTemplate"]["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"][
        "containers"][0]
    container["ports"] = [{"name": "pytorchjob-port", "containerPort": free_port(), "protocol": "TCP"}]
    container["resources"] = {"requests": {"cpu": "600m", "memory": "1Gi"}, "limits": {"cpu": "600m", "memory": "2Gi"}}
    return run


def _condition(rel: Release, name: str, ctype: str) -> dict[str, Any] | None:
    run = rel.run(name) or {}
    return next((c for c in (run.get("status") or {}).get("conditions") or [] if c["type"] == ctype), None)


def _finished(rel: Release, name: str) -> dict[str, Any] | None:
    run = rel.run(name) or {}
    return run if (run.get("status") or {}).get("phase") in ("Succeeded", "Failed") else None


def test_unreachable_agent_prometheus_and_failed_jobs_surface_as_conditions(
        training_operator: Any, release: Release, real_operator: Operator, pod_metrics: Any,
        prometheus: Prometheus) -> None:
    rel = release  # the chart installed; its reads of the runs, trials and jobs
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
        rel.custom.create_namespaced_custom_object("attune.dev", "v1alpha1", NS, "tuningruns", run)

    # Prometheus unreachable: the condition names the reason once the first trial's job has finished
    cond = wait_for(lambda: _condition(rel, "noprom", "MetricsAvailable"), 120, "noprom's MetricsAvailable")
    assert cond["status"] == "False" and cond["reason"] == "PrometheusUnreachable", cond
    assert "unreachable" in cond["message"] and closed in cond["message"], cond
    assert rel.job_finished("noprom-t001") == "Succeeded"  # the trainer ran to its end in its pod
    noprom = rel.run("noprom")["status"]
    assert noprom["currentTrial"] == "noprom-t001" and not rel.records("noprom"), "the unmeasured trial was recorded"

    # a failed job: recorded failed and charged, and the run launched the next trial
    crash = wait_for(lambda: _finished(rel, "crash"), 120, "the crashing run to finish")["status"]
    records = rel.records("crash")
    assert len(records) == 2 and all(r["outcome"] == "crashed" for r in records), records
    assert all(r["charged_hours"] > 0 for r in records)
    # the record says why: the training operator's Failed condition (which only says that the job failed) and how
    # the trainer ended, read from the master pod the job keeps (the kubelet's terminated state)
    assert records[0]["message"].startswith("job failed: PyTorchJobFailed") and "crash-t001" in records[0]["message"]
    assert "container pytorch of pod crash-t001-master-0 exited with 1 (Error)" in records[0]["message"], records
    assert crash["budget"]["hoursUsed"] == pytest.approx(sum(r["charged_hours"] for r in records), abs=1e-6)
    assert sorted(n for n in rel.job_creates() if n.startswith("crash-")) == ["crash-t001", "crash-t002"]
    assert all(rel.job_finished(n) == "Failed" for n in ("crash-t001", "crash-t002"))  # the training operator's verdict
    trials = {t["metadata"]["name"]: t["status"] for t in rel.trials() if t["spec"]["runRef"] == "crash"}
    assert all(s["phase"] == "Failed" and s["outcome"] == "crashed" and s["hoursCharged"] > 0
               for s in trials.values()), trials
    healthy = next(c for c in crash["conditions"] if c["type"] == "TrialsHealthy")
    assert healthy["status"] == "False" and healthy["reason"] == "JobFailed"
    assert crash["phase"] == "Failed" and crash["trials"]["failed"] == 2

    # agent unreachable: the local fallback policy proposed the candidate, and a condition says so
    noagent = wait_for(lambda: _finished(rel, "noagent"), 150, "the run without its agent to finish")["status"]
    cond = next((c for c in noagent["conditions"] if c["type"] == "AgentAvailable"), None)
    assert cond is not None, (noagent, rel.records("noagent"))
    assert cond["status"] == "False" and cond["reason"] == "AgentUnreachable", cond
    assert "local playbook policy" in cond["message"], cond
    cands = [r for r in rel.records("noagent") if r["kind"] == "candidate"]
    assert cands and all(r["source"].endswith("-fallback") for r in cands), cands
    assert noagent["phase"] == "Succeeded", noagent.get("message")

    # Prometheus is still down: the condition holds and the trial is still waiting to be measured, not dropped
    assert _condition(rel, "noprom", "MetricsAvailable")["reason"] == "PrometheusUnreachable"
    assert rel.run("noprom")["status"]["currentTrial"] == "noprom-t001"
