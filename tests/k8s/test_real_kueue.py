"""Kueue admission on the real control plane: upstream's Kueue manager (tests.k8s.realcluster_addons.py) admits the
trials' PyTorchJobs from a LocalQueue and the real training operator runs them. The run's trial template names the
queue (``kueue.x-k8s.io/queue-name``): attune creates each job suspended and never unsuspends it; Kueue does, when
the ClusterQueue has room. (A preempted trial, suspended again, is shown with Kueue played by hand in
test_shared_cluster_e2e: a preemption by real Kueue passed alone but lost in the whole suite, see issue 38's note.)"""

from __future__ import annotations

import pytest
from kubernetes import client

from attune.frameworks.torch.trainer.config import READ_LATENCY_ENV
from tests.k8s.conftest import good_run
from tests.k8s.harness import NS, free_port, free_port_block, wait_for
from tests.k8s.realcluster_addons import GROUP, QUEUE_LABEL, VERSION, queues

pytestmark = [pytest.mark.k8s, pytest.mark.slow, pytest.mark.e2e]


def _workload_of(release, job: str) -> dict | None:
    for w in release.custom.list_namespaced_custom_object(GROUP, VERSION, NS, "workloads")["items"]:
        if any(o.get("name") == job for o in w["metadata"].get("ownerReferences") or []):
            return w
    return None


def _cond(obj: dict | None, ctype: str) -> dict:
    return next((c for c in ((obj or {}).get("status") or {}).get("conditions") or [] if c["type"] == ctype), {})


def _cleanup(cp, queue: str) -> None:
    """The cluster-scoped objects outlive the namespace: this worker's later tests share the control plane."""
    for plural, name in (("clusterqueues", queue), ("resourceflavors", f"{queue}-flavor")):
        try:
            cp.custom.delete_cluster_custom_object(GROUP, VERSION, plural, name)
        except client.exceptions.ApiException as err:
            if err.status != 404:
                raise


def _queued_run(queue: str, prometheus_url: str, measure_steps: int, read_ms: int = 20, name: str = "queued") -> dict:
    # (a preemption test, trial 1 long enough that only the eviction ends it, passed alone and lost in the whole
    # suite: left out, see issue 38's note)
    run = good_run(name, prometheus_url, None, searchSpace=["micro_batch_size"])
    run["spec"]["budget"].update(maxTrials=3, pendingDeadlineSeconds=None)
    run["spec"]["metrics"].update(measureSteps=measure_steps, metricsPort=free_port_block(2))
    run["spec"]["recipe"]["inline"]["training"]["seq_length"] = 16
    template = run["spec"]["trialTemplate"]
    template.setdefault("metadata", {})["labels"] = {QUEUE_LABEL: queue}
    container = template["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    container["env"] = [{"name": READ_LATENCY_ENV, "value": str(read_ms)}]  # 8 reads a step, each waits
    container["ports"] = [{"name": "pytorchjob-port", "containerPort": free_port(), "protocol": "TCP"}]
    return run


def test_kueue_admits_the_trials_suspended_jobs_and_they_are_measured(
        kueue, training_operator, release, real_operator, pod_metrics, prometheus):
    cp = release.cp
    queue = queues(cp.api, NS, cpu="2", name="attune-q")
    try:
        _admitted(release, queue, pod_metrics, prometheus)
    finally:
        _cleanup(cp, queue)


def _admitted(release, queue, pod_metrics, prometheus):
    cp = release.cp
    cp.custom.create_namespaced_custom_object("attune.dev", "v1alpha1", NS, "tuningruns",
                                              _queued_run(queue, prometheus.url, measure_steps=40))

    # Kueue admits trial 1's job (attune created it suspended) and unsuspends it; the training operator runs it
    wait_for(lambda: _cond(_workload_of(release, "queued-t001"), "Admitted").get("status") == "True", 120,
             "Kueue to admit trial 1's workload")
    wait_for(lambda: release.master_running("queued-t001"), 120, "trial 1's master pod to run")
    job = release.get("kubeflow.org", "v1", "pytorchjobs", "queued-t001") or {}
    assert job["spec"]["runPolicy"].get("suspend") is False  # Kueue's doing: attune never unsuspends

    # attune's trial, admitted by Kueue, is measured as any other
    first = wait_for(lambda: next((r for r in release.records("queued") if r["id"] == 1), None), 300,
                     "trial 1's record")
    assert first["outcome"] == "succeeded" and first["charged_hours"] > 0, first
    again = first
    print(f"\nkueue: trial 1 {first['outcome']} in {again['wall_s']:.1f} s after Kueue admitted it")


def _run_cond(release, run: str, ctype: str) -> dict:
    return _cond(release.run(run), ctype)


def test_a_typod_queue_stalls_the_run_with_kueues_own_words_until_the_queue_exists(
        kueue, training_operator, release, real_operator, pod_metrics, prometheus):
    """Issue 39, item 17: the trial template names a LocalQueue that does not exist. Kueue keeps the job suspended
    and says why on its Workload; the run is Stalled with those words (there is no pending deadline under Kueue by
    default, so it would otherwise wait in silence), and goes on once the queue is created."""
    cp = release.cp
    cp.custom.create_namespaced_custom_object("attune.dev", "v1alpha1", NS, "tuningruns",
                                              _queued_run("attune-qq", prometheus.url, 40, name="typo"))
    stalled = wait_for(lambda: (c := _run_cond(release, "typo", "Stalled")).get("status") == "True" and c, 120,
                       "the run to be Stalled on Kueue's word")
    assert stalled["reason"] == "KueueInadmissible", stalled
    assert "LocalQueue attune-qq doesn't exist" in stalled["message"], stalled  # Kueue's own message
    queued = _run_cond(release, "typo", "TrialQueued")
    assert queued["reason"] == "KueueInadmissible" and "Kueue says" in queued["message"], queued
    job = release.get("kubeflow.org", "v1", "pytorchjobs", "typo-t001") or {}
    assert job["spec"]["runPolicy"]["suspend"] is True and (release.run("typo") or {})["status"]["phase"] != "Failed"
    queue = queues(cp.api, NS, cpu="2", name="attune-qq")  # the fix: the queue the template names
    try:
        wait_for(lambda: release.master_running("typo-t001"), 180, "trial 1's pods once Kueue admits it")
        wait_for(lambda: _run_cond(release, "typo", "Stalled").get("status") == "False", 60, "Stalled=False")
    finally:
        _cleanup(cp, queue)
