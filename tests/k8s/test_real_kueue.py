"""Kueue admission and preemption on the real control plane: upstream's Kueue manager (tests.k8s.realcluster_addons.py)
admits the trials' PyTorchJobs from a LocalQueue, the real training operator runs them, and a workload of higher
priority preempts a running trial. The run's trial template names the queue (``kueue.x-k8s.io/queue-name``): attune
creates each job suspended and never unsuspends it; Kueue does, when the ClusterQueue has room."""

from __future__ import annotations

import os
import signal

import pytest
from kubernetes import client

from attune.trainer.config import READ_LATENCY_ENV
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


def _cleanup(cp, queue: str, priorities: tuple[str, ...] = ()) -> None:
    """The cluster-scoped objects outlive the namespace: this worker's later tests share the control plane."""
    for plural, name in (("clusterqueues", queue), ("resourceflavors", f"{queue}-flavor"),
                         *(("workloadpriorityclasses", p) for p in priorities)):
        try:
            cp.custom.delete_cluster_custom_object(GROUP, VERSION, plural, name)
        except client.exceptions.ApiException as err:
            if err.status != 404:
                raise


def _queued_run(queue: str, prometheus_url: str, measure_steps: int, read_ms: int = 20, name: str = "queued") -> dict:
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


def _kueue_state(release, kueue) -> str:
    """What Kueue saw, for a failure's message: every Workload's conditions and the tail of its manager's log."""
    lines = []
    for w in release.custom.list_namespaced_custom_object(GROUP, VERSION, NS, "workloads")["items"]:
        conds = "; ".join(f"{c['type']}={c['status']} ({c.get('reason')}: {c.get('message')})"
                          for c in (w.get("status") or {}).get("conditions") or [])
        lines.append(f"{w['metadata']['name']} priority={w['spec'].get('priority')} {conds}")
    for job in release.jobs():
        lines.append(f"job {job['metadata']['name']} suspend={job['spec'].get('runPolicy', {}).get('suspend')} "
                     f"conditions={[(c['type'], c['status'], c.get('reason')) for c in job.get('status', {}).get('conditions') or []]}")
    for pod in client.CoreV1Api(release.cp.api).list_namespaced_pod(NS).items:
        lines.append(f"pod {pod.metadata.name} uid={pod.metadata.uid} phase={pod.status.phase} "
                     f"deleting={pod.metadata.deletion_timestamp} created={pod.metadata.creation_timestamp}")
    for trial in release.trials():
        st = trial.get("status") or {}
        lines.append(f"trial {trial['metadata']['name']} phase={st.get('phase')} runningPods={st.get('runningPods')} "
                     f"runningSince={st.get('runningSince')}")
    return "\n".join(lines) + "\n--- kueue log ---\n" + kueue.log()[-3000:]


@pytest.mark.parametrize("operator_paused", [False, True], ids=["operator-watching", "operator-paused"])
def test_a_trial_preempted_by_kueue_is_interrupted_charged_for_its_running_only_and_run_again(
        operator_paused, kueue, training_operator, release, real_operator, pod_metrics, prometheus):
    """An urgent Job (a higher WorkloadPriorityClass) needs the whole ClusterQueue while trial 1 runs: Kueue evicts
    trial 1 (suspends its PyTorchJob); attune records it interrupted, says why, charges only the time it ran, and runs
    the trial again once Kueue admits it. Trial 1 measures 600 steps of 800 ms (8 min): only the preemption ends it
    within the test, however loaded the machine, and the test waits for the eviction, not the trial's end. The
    operator sees the eviction either while the job is suspended or, when Kueue has admitted it again before its
    next look (the urgent Job lasts 5 s), by its pods' new identity: ``operator-paused`` holds the operator
    (SIGSTOP) from before the eviction until the trial's new pod runs, so only the pods' identity can tell."""
    cp = release.cp
    queue = queues(cp.api, NS, cpu="2", name="attune-pq")
    priority_class(cp.api, "urgent", 1000)
    batch = client.BatchV1Api(cp.api)
    try:
        run = _queued_run(queue, prometheus.url, measure_steps=600, read_ms=100, name="preempted")
        run["spec"]["budget"]["trialDeadlineSeconds"] = 1800  # not the example's 180 s: the eviction ends it
        cp.custom.create_namespaced_custom_object("attune.dev", "v1alpha1", NS, "tuningruns", run)
        wait_for(lambda: release.master_running("preempted-t001"), 240, "trial 1's master pod to run")
        # the eviction must come after the operator has seen trial 1 run: a preemption it never saw (the job
        # suspended and admitted again before its first look) is queueing to it, and the trial is measured on the
        # pods it then finds (a loaded machine's whole-suite runs interleaved so)
        wait_for(lambda: next((((t.get("status") or {}).get("runningPods")) for t in release.trials()
                               if t["metadata"]["name"].startswith("preempted-t001")), None), 120,
                 "the operator to see trial 1's pods run")
        urgent = {"apiVersion": "batch/v1", "kind": "Job",
                  "metadata": {"name": "urgent", "labels": {QUEUE_LABEL: queue, PRIORITY_LABEL: "urgent"}},
                  "spec": {"suspend": True, "template": {"spec": {"restartPolicy": "Never", "containers": [{
                      "name": "work", "image": "busybox:1.36", "command": ["sleep", "5"],
                      "resources": {"requests": {"cpu": "2"}}}]}}}}
        first_pod = release.cp.core.read_namespaced_pod("preempted-t001-master-0", NS).metadata.uid
        if operator_paused:
            os.killpg(real_operator.proc.pid, signal.SIGSTOP)
        try:
            batch.create_namespaced_job(NS, urgent)
            if operator_paused:  # the eviction, the urgent Job and the re-admission, all while the operator sleeps
                wait_for(lambda: (batch.read_namespaced_job("urgent", NS).status.succeeded or 0) >= 1, 240,
                         "the urgent Job to complete")
                wait_for(lambda: release.master_running("preempted-t001") and release.cp.core.read_namespaced_pod(
                    "preempted-t001-master-0", NS).metadata.uid != first_pod, 240,
                         "trial 1 admitted again, on a new pod")
        finally:
            if operator_paused:
                os.killpg(real_operator.proc.pid, signal.SIGCONT)
        try:
            first = wait_for(lambda: next((r for r in release.records("preempted") if r["id"] == 1), None), 240,
                             "trial 1's record after the preemption")
        except Exception as err:
            raise AssertionError(f"{err}\n{_kueue_state(release, kueue)}") from err
        assert first["outcome"] == "interrupted", first
        assert "suspended (preempted, e.g. by Kueue)" in first["message"], first["message"]
        if operator_paused:
            assert "admitted again" in first["message"] and "started over" in first["message"], first["message"]
        # the urgent Job runs and completes; Kueue admits the trial again and it runs
        wait_for(lambda: (batch.read_namespaced_job("urgent", NS).status.succeeded or 0) >= 1, 240,
                 "the urgent Job to complete")
        again = wait_for(lambda: next((j["metadata"]["name"] for j in release.jobs()
                                       if j["metadata"]["name"] != "preempted-t001"
                                       and release.master_running(j["metadata"]["name"])), None), 300,
                         "the trial run again, admitted by Kueue")
        # charged for the time it ran (its queueing is not), and the run's budget is the sum of its records
        assert 0 < first["charged_hours"] * 3600 <= first["wall_s"] * 1.05 + 1, first
        wait_for(lambda: abs((((release.run("preempted") or {}).get("status") or {}).get("budget") or {})
                             .get("hoursUsed", -1) - sum(r["charged_hours"] for r in release.records("preempted")))
                 < 2e-6, 60, "the run's hoursUsed to be the sum of its trials' charges")  # rounded to 1e-6 h
        print(f"\nkueue: trial 1 {first['outcome']} after {first['wall_s']:.1f} s "
              f"({first['charged_hours'] * 3600:.1f} accelerator-s charged); {again} runs after the urgent Job")
    finally:
        try:
            batch.delete_namespaced_job("urgent", NS, propagation_policy="Background")
        except client.exceptions.ApiException as err:
            if err.status != 404:
                raise
        _cleanup(cp, queue, ("urgent",))


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
