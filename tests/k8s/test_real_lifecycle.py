"""A TuningRun's life on the real API server with the real controllers, where the emulator had none: the garbage
collector removing trials and jobs through their ownerReferences when the run goes, a namespace deleted under a live
run (which a finalizer used to deadlock), and a real ResourceQuota refusing a trial's job. The chart is installed for real
(:class:`tests.k8s.realcluster.Release`) and the operator runs with its ServiceAccount's token.

The training operator runs where a trial must start (its pod run by the pod runner); elsewhere the trial's
PyTorchJob is created and stays unstarted, which is all those need."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from kubernetes import client

from tests.k8s import rbac
from tests.k8s.harness import NS, ROOT, Operator, wait_for
from tests.k8s.hfruns import hf_example_run, master_container
from tests.k8s.realcluster import Release
from tests.k8s.realcluster_kubeflow import TrainingOperator

pytestmark = [pytest.mark.k8s, pytest.mark.slow]


def _first_job(release: Release) -> dict:
    return wait_for(lambda: next(iter(release.jobs()), None), 60, "the operator to create the first trial's job")


def test_deleting_a_run_mid_trial_lets_the_garbage_collector_stop_it(training_operator: TrainingOperator,
                                                                     release: Release,
                                                                     real_operator: Operator) -> None:
    """The first trial runs (the real training operator's pod, run by the pod runner); the run is deleted; the
    garbage collector removes its trials, their jobs and pods, and the trial's process stops."""
    cp = release.cp
    run = hf_example_run("gc", deleteWithRun=True)
    cp.set_images({master_container(run["spec"]["trialTemplate"])["image"]: ROOT / "examples" / "hf-trainer"})
    cp.custom.create_namespaced_custom_object("attune.dev", "v1alpha1", NS, "tuningruns", run)
    job = _first_job(release)
    trial = release.trials()[0]
    created = release.run("gc")
    assert created is not None
    # the chain the collector follows: pod → job → trial → run
    assert [r["uid"] for r in job["metadata"]["ownerReferences"]] == [trial["metadata"]["uid"]]
    assert [r["uid"] for r in trial["metadata"]["ownerReferences"]] == [created["metadata"]["uid"]]
    pod = cp.wait_pod_phase(NS, f"{job['metadata']['name']}-master-0", ("Running",), timeout=90)
    pid_of = cp.state / "pods"
    assert pod.metadata.owner_references[0].uid == job["metadata"]["uid"]
    procs = wait_for(lambda: _processes_under(pid_of), 30, "the trial's process")
    cp.custom.delete_namespaced_custom_object("attune.dev", "v1alpha1", NS, "tuningruns", "gc")
    wait_for(lambda: release.run("gc") is None, 60, "the run to go (no finalizer)")
    wait_for(lambda: not release.trials() and not release.jobs() and not cp.core.list_namespaced_pod(NS).items, 120,
             "the garbage collector to delete the run's trials, jobs and pods")
    wait_for(lambda: not any(_alive(p) for p in procs), 60, "the trial's process to stop")
    # the operator stops reconciling the deleted run
    wait_for(lambda: "run ml/gc is gone: its reconcile timer stops" in real_operator.log(), 30, "the timer to stop")
    assert not release.unexpected_denials()


def test_suspending_a_run_releases_its_running_trials_pods_and_resuming_runs_it_again(
        training_operator: TrainingOperator, release: Release, real_operator: Operator) -> None:
    """Issue 39, item 17: spec.suspend with a trial running gives its pods back now (its PyTorchJob deleted, the real
    training operator's pod and process gone), charges the time they ran, and on resume the same recipe runs again
    from its start as the next trial."""
    cp = release.cp
    run = hf_example_run("pause")
    cp.set_images({master_container(run["spec"]["trialTemplate"])["image"]: ROOT / "examples" / "hf-trainer"})
    cp.custom.create_namespaced_custom_object("attune.dev", "v1alpha1", NS, "tuningruns", run)
    job = _first_job(release)
    cp.wait_pod_phase(NS, f"{job['metadata']['name']}-master-0", ("Running",), timeout=90)
    procs = wait_for(lambda: _processes_under(cp.state / "pods"), 30, "the trial's process")
    cp.custom.patch_namespaced_custom_object("attune.dev", "v1alpha1", NS, "tuningruns", "pause",
                                             {"spec": {"suspend": True}})
    wait_for(lambda: not release.jobs() and not cp.core.list_namespaced_pod(NS).items, 120,
             "the trial's job and pods to be released")
    wait_for(lambda: not any(_alive(p) for p in procs), 60, "the trial's process to stop")
    [rec] = wait_for(lambda: release.records("pause") or None, 30, "the trial's record")
    assert rec["outcome"] == "interrupted" and rec["charged_hours"] > 0 and "spec.suspend" in rec["message"], rec
    status = (release.run("pause") or {})["status"]
    assert status["phase"] == "Suspended" and status.get("currentTrial") is None
    cp.custom.patch_namespaced_custom_object("attune.dev", "v1alpha1", NS, "tuningruns", "pause",
                                             {"spec": {"suspend": False}})
    again = wait_for(lambda: next((t for t in release.trials() if t["spec"]["index"] == 2), None), 60,
                     "the trial run again on resume")
    first = next(t for t in release.trials() if t["spec"]["index"] == 1)
    assert again["spec"]["knobs"] == first["spec"]["knobs"] and again["spec"]["kind"] == first["spec"]["kind"]
    wait_for(lambda: any(j["metadata"]["name"].startswith("pause-t002") for j in release.jobs()), 60,
             "its job")
    assert not release.unexpected_denials()


def test_a_foreground_deletion_goes_through_the_collector(release: Release, real_operator: Operator) -> None:
    """``kubectl delete --cascade=foreground`` (and Argo CD's pruning, foreground by default): the API server keeps the
    run (finalizer ``foregroundDeletion``) until the collector has deleted its dependents, the trial and, through the
    trial, its job, whose references block their owners' deletion. The operator needs no part in it: the chart
    grants it no list of jobs and no delete of trials, and it makes no request about the run's children once the run
    is in deletion."""
    cp = release.cp
    cp.custom.create_namespaced_custom_object("attune.dev", "v1alpha1", NS, "tuningruns", hf_example_run("fg"))
    job = _first_job(release)
    cp.custom.delete_namespaced_custom_object("attune.dev", "v1alpha1", NS, "tuningruns", "fg",
                                              propagation_policy="Foreground")
    held = wait_for(lambda: release.run("fg"), 10, "the run held by foregroundDeletion")
    assert "foregroundDeletion" in held["metadata"].get("finalizers", []) and held["metadata"]["deletionTimestamp"]
    deleting = time.time()
    wait_for(lambda: release.run("fg") is None and not release.trials() and not release.jobs(), 120,
             "the run, its trial and its job to go")
    after = [(e["verb"], e["objectRef"]["resource"]) for e in cp.audit(rbac.OPERATOR_USER, since=deleting)
             if e.get("objectRef") and e["verb"] in ("create", "delete")]
    assert ("create", "pytorchjobs") not in after and ("create", "tuningtrials") not in after, after
    assert job["metadata"]["ownerReferences"][0]["blockOwnerDeletion"] is True
    try:
        wait_for(lambda: "run ml/fg is gone: its reconcile timer stops" in real_operator.log(), 60, "the timer to stop")
    except TimeoutError:
        raise AssertionError(real_operator.log()[-6000:]) from None
    assert not release.unexpected_denials()


def test_a_finished_run_is_no_longer_fetched_and_goes_after_its_ttl(release: Release, real_operator: Operator) -> None:
    """A run that finished (its trial waited for Kueue past pendingDeadlineSeconds, no Kueue here) is no longer
    fetched every interval (0.5 s here: the audit log shows none of the operator's requests about it for 6 s); an
    edit of spec.ttlSecondsAfterFinished after the end is observed (one step), and once its time is up the operator
    deletes the run, whose trial and job the collector takes."""
    from tests.k8s.conftest import good_run

    cp = release.cp
    run = good_run("ttl", "http://prom.ml.svc:9090", None, ttlSecondsAfterFinished=3600)
    run["spec"]["trialTemplate"].setdefault("metadata", {})["labels"] = {"kueue.x-k8s.io/queue-name": "none"}
    run["spec"]["budget"]["pendingDeadlineSeconds"] = 10
    cp.custom.create_namespaced_custom_object("attune.dev", "v1alpha1", NS, "tuningruns", run)
    done = wait_for(lambda: (s := (release.run("ttl") or {}).get("status") or {}).get("phase") in ("Succeeded",
                                                                                                 "Failed") and s,
                    120, "the run to stop at its pending deadline")
    assert done["completionTime"]
    time.sleep(2)  # a step in flight when the run finished may still write
    quiet_from = time.time()
    time.sleep(6)  # (the window measured: the operator's interval is 0.5 s)
    about = [(e["verb"], e["objectRef"].get("subresource", "")) for e in cp.audit(rbac.OPERATOR_USER, since=quiet_from)
             if (e.get("objectRef") or {}).get("resource") == "tuningruns" and e["objectRef"].get("name") == "ttl"]
    assert not about, f"a finished run was still fetched: {about}"
    from attune.operator.backends import rfc3339_time

    # due 30 s after the edit (an edit to less than the time since the end is due at once: the deletion would race
    # the step that observes the edit, which a whole-suite run saw lose)
    ttl = int(time.time() - (rfc3339_time(done["completionTime"]) or 0)) + 30
    edited = cp.custom.patch_namespaced_custom_object("attune.dev", "v1alpha1", NS, "tuningruns", "ttl",
                                                      {"spec": {"ttlSecondsAfterFinished": ttl}})
    generation = edited["metadata"]["generation"]
    wait_for(lambda: ((release.run("ttl") or {}).get("status") or {}).get("observedGeneration") == generation, 30,
             "the edit after the end to be observed")
    wait_for(lambda: release.run("ttl") is None, 90, "the operator to delete the run after its ttl")
    wait_for(lambda: not release.trials() and not release.jobs(), 60, "the collector to take its trial and job")
    deletes = [e for e in cp.audit(rbac.OPERATOR_USER, since=quiet_from)
               if e["verb"] == "delete" and (e.get("objectRef") or {}).get("name") == "ttl"]
    assert len(deletes) == 1, deletes  # its timer ends with the deletion (it used to send a DELETE every tick)
    assert "spec.ttlSecondsAfterFinished" in real_operator.log()


def test_a_run_carrying_an_earlier_versions_finalizer_loses_it(release: Release, real_operator: Operator) -> None:
    """Upgrading from a version that put a finalizer on runs: the operator takes it off on the run's next event (a
    patch of the run, the one the chart's patch of tuningruns is for), so deleting the run is never held up by it."""
    from attune.operator.resources import FINALIZER
    from tests.k8s.conftest import good_run

    cp = release.cp
    run = good_run("old", "http://prom.ml.svc:9090", None, suspend=True)
    run["metadata"]["finalizers"] = [FINALIZER]
    cp.custom.create_namespaced_custom_object("attune.dev", "v1alpha1", NS, "tuningruns", run)
    wait_for(lambda: FINALIZER not in ((release.run("old") or {}).get("metadata") or {}).get("finalizers", []), 60,
             "the operator to take the earlier version's finalizer off")
    assert any(e["verb"] == "patch" and (e.get("objectRef") or {}).get("name") == "old"
               and not e["objectRef"].get("subresource") for e in cp.audit(rbac.OPERATOR_USER, since=release.since))
    cp.custom.delete_namespaced_custom_object("attune.dev", "v1alpha1", NS, "tuningruns", "old")
    wait_for(lambda: release.run("old") is None, 30, "the run to go at once")


def _processes_under(folder: Path) -> list[int]:
    """Live processes whose working directory is under ``folder`` (the pod runner's pods)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if str(Path(os.readlink(entry / "cwd"))).startswith(str(folder)):
                    out.append(int(entry.name))
            except OSError:
                continue
    return out


def _alive(pid: int) -> bool:
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def test_a_namespace_deleted_under_a_live_run_empties_and_goes(release: Release, real_operator: Operator) -> None:
    cp = release.cp
    cp.custom.create_namespaced_custom_object("attune.dev", "v1alpha1", NS, "tuningruns", hf_example_run("doomed"))
    _first_job(release)
    assert not (release.run("doomed") or {})["metadata"].get("finalizers")
    cp.core.delete_namespace(NS)
    # the namespace controller deletes the run (no finalizer to wait on: with one, the namespace's RoleBinding went
    # first and the operator could never remove it) and the collector takes the rest
    try:
        wait_for(lambda: not cp.exists(NS), 120, f"namespace {NS} to be deleted with its live run")
    except TimeoutError:
        ns = cp.core.read_namespace(NS)
        left = [(t["metadata"]["name"], t["metadata"].get("finalizers")) for t in release.trials()]
        raise AssertionError(f"{[(c.type, c.message) for c in ns.status.conditions or []]}; trials {left}; run "
                             f"{(release.run('doomed') or {}).get('metadata')}") from None
    wait_for(lambda: "run ml/doomed is gone: its reconcile timer stops" in real_operator.log(), 30, "the timer to stop")
    assert not release.unexpected_denials()


def test_a_real_resource_quota_refuses_the_trials_job(release: Release, real_operator: Operator) -> None:
    """A ResourceQuota allowing no PyTorchJob in the namespace: the API server's quota admission refuses the
    operator's create with its own message, and the run says so (it is not the operator's RBAC)."""
    cp = release.cp
    cp.core.create_namespaced_resource_quota(NS, {"metadata": {"name": "no-jobs"},
                                                  "spec": {"hard": {"count/pytorchjobs.kubeflow.org": "0"}}})
    wait_for(lambda: (cp.core.read_namespaced_resource_quota("no-jobs", NS).status.hard or {}), 30,
             "the quota controller to fill in the quota's status")
    cp.custom.create_namespaced_custom_object("attune.dev", "v1alpha1", NS, "tuningruns", hf_example_run("quota"))

    def said() -> str | None:
        events = client.CoreV1Api(cp.api).list_namespaced_event(NS).items
        texts = [f"{e.reason}: {e.message}" for e in events if "exceeded quota" in (e.message or "")]
        status = (release.run("quota") or {}).get("status") or {}
        texts += [str(status.get("message", ""))] if "exceeded quota" in str(status.get("message", "")) else []
        texts += [str(c.get("message", "")) for c in status.get("conditions") or []
                  if "exceeded quota" in str(c.get("message", ""))]
        return "\n".join(texts) or None

    text = wait_for(said, 60, "the run to report the quota's refusal")
    assert "no-jobs" in text and "count/pytorchjobs.kubeflow.org" in text, text
    assert not release.jobs()
    # the refusal is the quota's (HTTP 403 from admission), which the audit log keeps apart from the authorizer's
    assert not release.unexpected_denials()


def test_a_run_recreated_under_its_name_waits_for_the_collector_to_take_the_old_trial(
        release: Release, real_operator: Operator) -> None:
    """A run deleted and created again at once finds its first trial's name still held by the old run's trial (here
    kept in deletion by a finalizer of the test's, as a slow collector or another controller's finalizer would): it
    says TrialNameTaken and waits, never adopting it; once the real collector has taken the old trial it goes on."""
    cp = release.cp
    cp.custom.create_namespaced_custom_object("attune.dev", "v1alpha1", NS, "tuningruns", hf_example_run("again"))
    _first_job(release)
    old_trial = release.trials()[0]
    name, old_uid = old_trial["metadata"]["name"], (release.run("again") or {})["metadata"]["uid"]
    hold = "test.attune.dev/hold"
    cp.custom.patch_namespaced_custom_object("attune.dev", "v1alpha1", NS, "tuningtrials", name,
                                             {"metadata": {"finalizers": [hold]}})
    try:
        cp.custom.delete_namespaced_custom_object("attune.dev", "v1alpha1", NS, "tuningruns", "again")
        wait_for(lambda: (release.get("attune.dev", "v1alpha1", "tuningtrials", name) or {}).get("metadata", {}).get(
            "deletionTimestamp"), 60, "the collector to start deleting the old run's trial")
        cp.custom.create_namespaced_custom_object("attune.dev", "v1alpha1", NS, "tuningruns", hf_example_run("again"))

        def waiting() -> dict | None:
            conds = {c["type"]: c for c in ((release.run("again") or {}).get("status") or {}).get("conditions") or []}
            c = conds.get("TrialsAccepted") or {}
            return c if c.get("reason") == "TrialNameTaken" else None

        cond = wait_for(waiting, 60, "the new run to wait on the old trial's name")
        assert old_uid in cond["message"] and "garbage-collect" in cond["message"]
        held = release.get("attune.dev", "v1alpha1", "tuningtrials", name) or {}
        assert held["metadata"]["ownerReferences"][0]["uid"] == old_uid  # never adopted
        cp.custom.patch_namespaced_custom_object("attune.dev", "v1alpha1", NS, "tuningtrials", name,
                                                 {"metadata": {"finalizers": None}})
        new_uid = (release.run("again") or {})["metadata"]["uid"]
        fresh = wait_for(lambda: next((t for t in release.trials() if t["metadata"]["name"] == name and
                                       t["metadata"]["ownerReferences"][0]["uid"] == new_uid), None), 60,
                         "the new run's own first trial once the old one is collected")
        assert fresh["metadata"]["uid"] != old_trial["metadata"]["uid"]
    finally:  # never leave the hold behind: the namespace could not go
        lingering = release.get("attune.dev", "v1alpha1", "tuningtrials", name)
        if lingering and hold in (lingering["metadata"].get("finalizers") or []):
            cp.custom.patch_namespaced_custom_object("attune.dev", "v1alpha1", NS, "tuningtrials", name,
                                                     {"metadata": {"finalizers": None}})
    assert not release.unexpected_denials()
