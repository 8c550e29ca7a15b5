"""Kueue admission and preemption on the real control plane: upstream's Kueue manager (tests.k8s.realcluster_addons.py)
admits the trials' PyTorchJobs from a LocalQueue, the real training operator runs them, and a workload of higher
priority preempts a running trial. The run's trial template names the queue (``kueue.x-k8s.io/queue-name``): attune
creates each job suspended and never unsuspends it; Kueue does, when the ClusterQueue has room."""

from __future__ import annotations

import pytest
from kubernetes import client

from attune.frameworks.torch.trainer.config import READ_LATENCY_ENV
from tests.k8s.conftest import good_run
from tests.k8s.harness import NS, free_port, free_port_block, wait_for
from tests.k8s.realcluster_addons import GROUP, PRIORITY_LABEL, QUEUE_LABEL, VERSION, priority_class, queues

pytestmark = [pytest.mark.k8s, pytest.mark.slow, pytest.mark.e2e]


def _workload_of(release, job: str) -> dict | None:
    for w in release.custom.list_namespaced_custom_object(GROUP, VERSION, NS, "workloads")["items"]:
        if any(o.get("name") == job for o in w["metadata"].get("ownerReferences") or []):
            return w
    return None


def _cond(obj: dict | None, ctype: str) -> dict:
    return next((c for c in ((obj or {}).get("status") or {}).get("conditions") or [] if c["type"] == ctype), {})


def test_kueue_admits_the_trials_and_a_preempted_trial_is_interrupted_uncharged_then_run_again(
        kueue, training_operator, release, real_operator, pod_metrics, prometheus):
    cp = release.cp
    queue = queues(cp.api, NS, cpu="2", name="attune-q")
    priority_class(cp.api, "urgent", 1000)
    try:
        _preempted_and_run_again(release, queue, pod_metrics, prometheus)
    finally:  # the cluster-scoped objects outlive the namespace: this worker's later tests share the control plane
        for plural, name in (("clusterqueues", queue), ("resourceflavors", f"{queue}-flavor"),
                             ("workloadpriorityclasses", "urgent")):
            try:
                cp.custom.delete_cluster_custom_object(GROUP, VERSION, plural, name)
            except client.exceptions.ApiException as err:
                if err.status != 404:
                    raise


def _preempted_and_run_again(release, queue, pod_metrics, prometheus):
    cp = release.cp
    run = good_run("queued", prometheus.url, None, searchSpace=["micro_batch_size"])
    run["spec"]["budget"].update(maxTrials=3, pendingDeadlineSeconds=None)
    # a trial of about 50 s (300 steps of 160 ms waiting on reads): Kueue preempts it within seconds, even loaded
    run["spec"]["metrics"].update(measureSteps=300, metricsPort=free_port_block(2))
    run["spec"]["recipe"]["inline"]["training"]["seq_length"] = 16
    template = run["spec"]["trialTemplate"]
    template.setdefault("metadata", {})["labels"] = {QUEUE_LABEL: queue}
    container = template["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    container["env"] = [{"name": READ_LATENCY_ENV, "value": "20"}]  # a trial long enough to be preempted in
    container["ports"] = [{"name": "pytorchjob-port", "containerPort": free_port(), "protocol": "TCP"}]
    cp.custom.create_namespaced_custom_object("attune.dev", "v1alpha1", NS, "tuningruns", run)

    # Kueue admits trial 1's job (attune created it suspended) and unsuspends it; the training operator runs it
    wait_for(lambda: _cond(_workload_of(release, "queued-t001"), "Admitted").get("status") == "True", 120,
             "Kueue to admit trial 1's workload")
    wait_for(lambda: release.master_running("queued-t001"), 120, "trial 1's master pod to run")
    job = release.get("kubeflow.org", "v1", "pytorchjobs", "queued-t001") or {}
    assert job["spec"]["runPolicy"].get("suspend") is False  # Kueue's doing: attune never unsuspends

    # an urgent batch Job in the same queue needs the whole quota: Kueue evicts trial 1 (suspends its job)
    urgent = {"apiVersion": "batch/v1", "kind": "Job",
              "metadata": {"name": "urgent", "labels": {QUEUE_LABEL: queue, PRIORITY_LABEL: "urgent"}},
              "spec": {"suspend": True, "template": {"spec": {"restartPolicy": "Never", "containers": [{
                  "name": "work", "image": "busybox:1.36", "command": ["sleep", "5"],
                  "resources": {"requests": {"cpu": "2"}}}]}}}}
    client.BatchV1Api(cp.api).create_namespaced_job(NS, urgent)
    first = wait_for(lambda: next((r for r in release.records("queued") if r["id"] == 1), None), 180,
                     "trial 1's record after the preemption")
    assert first["outcome"] == "interrupted", first
    assert "suspended (preempted, e.g. by Kueue)" in first["message"], first["message"]
    evicted = _cond(_workload_of(release, "queued-t001"), "Evicted")
    assert evicted.get("reason") == "Preempted" or not evicted, evicted  # the workload may be gone with the job
    # the urgent Job runs and completes; the trial is run again once Kueue admits it, and succeeds
    wait_for(lambda: (client.BatchV1Api(cp.api).read_namespaced_job("urgent", NS).status.succeeded or 0) >= 1, 120,
             "the urgent Job to complete")
    again = wait_for(lambda: next((r for r in release.records("queued")
                                   if r["id"] > 1 and r["outcome"] == "succeeded"), None), 300,
                     "a trial after the preemption to succeed")
    assert again["kind"] == "baseline" and again["charged_hours"] > 0
    # the run's budget is the sum of its trials' charges (its status catches up on the step after a record)
    def budget_matches() -> bool:
        used = ((release.run("queued") or {}).get("status") or {}).get("budget", {}).get("hoursUsed")
        records = release.records("queued")
        return used is not None and abs(used - sum(r["charged_hours"] for r in records)) < 1e-6 and len(records) > 1

    wait_for(budget_matches, 60, "the run's hoursUsed to be the sum of its trials' charges")
    # the preempted trial is charged only for the time it ran (not its queueing), and not as a failure
    assert first["charged_hours"] < again["charged_hours"] * 2
    print(f"\nkueue: trial 1 {first['outcome']} after {first['wall_s']:.1f} s, trial {again['id']} "
          f"{again['outcome']} in {again['wall_s']:.1f} s")
