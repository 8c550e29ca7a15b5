"""The trial's job where it meets a real cluster, through :func:`reconcile` with the real resources (only the API and
Prometheus are fakes): time queued for accelerators is not charged, refused job creations, valid job names, jobs
deleted by someone else, and 409 adoption of only the jobs and trials a run owns."""

from __future__ import annotations

import copy

import pytest

from attune.operator.backends import MAX_JOB_NAME, job_name, valid_job_name
from attune.operator.reconcile import (
    ApiRefusal,
    reconcile,
)
from attune.operator.resources import LABEL_QUEUE
from tests.k8s.fakes import FakePorts, conds, drive, records, step, tuning_run, waited_out

pytestmark = pytest.mark.k8s


# -- waiting for accelerators is not charged -----------------------------------------------------------------------

def test_time_waiting_for_accelerators_is_queue_time_not_charged():
    ports = FakePorts()
    ports.pods_running = False  # no free GPUs: the pods stay Unschedulable
    run = tuning_run()  # trialDeadlineSeconds 180: the old clock (from job creation) timed the trial out after 210 s
    step(run, ports)  # the trial
    step(run, ports)  # its job: created, pods pending
    created = ports.t - 40
    for _ in range(15):  # 600 s of waiting
        step(run, ports)
        ports.finish()  # (only a running job can finish)
    assert records(ports, run) == [], "a trial waiting for accelerators was recorded (timed out)"
    queued = conds(run)["TrialQueued"]
    assert queued["status"] == "True" and queued["reason"] == "Unschedulable"
    assert "Insufficient nvidia.com/gpu" in queued["message"] and "not charged" in queued["message"]
    assert conds(run)["Reconciling"]["status"] == "True" and conds(run)["Stalled"]["status"] == "False"
    assert run["status"]["budget"]["hoursUsed"] == 0
    ports.start_pods()  # GPUs free up
    started = ports.t
    step(run, ports)
    ports.finish()  # it runs for 40 s
    step(run, ports)
    [rec] = records(ports, run)
    assert rec["outcome"] == "succeeded"
    assert rec["wall_s"] == pytest.approx(40.0) and rec["charged_hours"] == pytest.approx(40 / 3600)
    trial = ports.trials["r-t001"]["status"]
    assert trial["queuedSeconds"] == pytest.approx(started - created)  # visible, not charged
    assert run["status"]["queuedSeconds"] == pytest.approx(started - created)
    assert conds(run)["TrialQueued"]["status"] == "False"


def test_a_pending_trial_has_its_own_deadline_and_costs_nothing():
    ports = FakePorts()
    run = waited_out(ports)
    rec = records(ports, run)
    # waiting is not the recipe's failure: the baseline is interrupted (uncharged) and the run stops there, never
    # "the baseline recipe itself fails", and no job is re-created at the back of the queue
    assert [r["outcome"] for r in rec] == ["interrupted"]
    assert all("pendingDeadlineSeconds (300 s)" in r["message"] and r["charged_hours"] == 0 for r in rec)
    assert run["status"]["budget"]["hoursUsed"] == 0
    assert not ports.jobs, "the pending jobs were not stopped"
    assert conds(run)["TrialsHealthy"]["reason"] == "PendingDeadline"
    assert run["status"]["phase"] == "Failed" and conds(run)["Stalled"]["status"] == "True"
    assert "stopped waiting for accelerators" in run["status"]["message"]
    assert "baseline recipe itself fails" not in run["status"]["message"]


def test_pods_admission_refuses_are_named_while_the_trial_waits_and_when_it_gives_up():
    """A LimitRange's maximum or PodSecurity refuses the pods the training operator creates: the job has no status and
    no pod, only a FailedCreatePod event on the job (seen on the real control plane: test_real_admission.py). The
    run says so while it waits and when it gives up, instead of "waiting for its pods to be scheduled"."""
    ports = FakePorts()
    ports.pods_refused = 'pods "r-t001-master-0" is forbidden: maximum cpu usage per Container is 1, but limit is 2'
    run = tuning_run()
    run["spec"]["budget"]["pendingDeadlineSeconds"] = 300
    step(run, ports)
    step(run, ports)
    step(run, ports)
    queued = conds(run)["TrialQueued"]
    assert queued["reason"] == "FailedCreatePod", queued
    assert "pods could not be created" in queued["message"] and "maximum cpu usage per Container is 1" in \
        queued["message"] and "not charged" in queued["message"]
    run = drive(run, ports, each=lambda p: None)
    [rec] = records(ports, run)
    assert rec["outcome"] == "interrupted" and rec["charged_hours"] == 0
    assert "maximum cpu usage per Container is 1" in rec["message"]
    assert "maximum cpu usage per Container is 1" in run["status"]["message"]


def test_a_job_kueue_suspends_waits_uncharged_and_is_never_unsuspended_by_the_operator():
    ports = FakePorts()
    run = tuning_run()
    run["spec"]["budget"]["pendingDeadlineSeconds"] = None  # Kueue decides when it runs
    tmpl = run["spec"]["trialTemplate"]
    tmpl.setdefault("metadata", {})["labels"] = {LABEL_QUEUE: "gpus"}
    step(run, ports)
    step(run, ports)
    job = ports.jobs["r-t001"]
    assert job["spec"]["runPolicy"]["suspend"] is True, "a Kueue-queued job must be created suspended"
    assert job["metadata"]["labels"][LABEL_QUEUE] == "gpus"
    for _ in range(40):  # 1600 s in Kueue's queue
        step(run, ports)
    assert ports.jobs["r-t001"]["spec"]["runPolicy"]["suspend"] is True  # nobody but Kueue unsuspends it
    q = conds(run)["TrialQueued"]
    assert q["reason"] == "KueueSuspended" and "queue gpus" in q["message"] and not records(ports, run)
    ports.admit("r-t001")
    step(run, ports)
    ports.finish()
    step(run, ports)
    [rec] = records(ports, run)
    assert rec["outcome"] == "succeeded" and rec["charged_hours"] == pytest.approx(40 / 3600)


def test_the_jobs_own_deadline_leaves_room_for_the_queue():
    ports = FakePorts()
    run = tuning_run()
    step(run, ports)
    step(run, ports)
    policy = ports.jobs["r-t001"]["spec"]["runPolicy"]
    b = run["spec"]["budget"]
    # Kubeflow counts activeDeadlineSeconds from the job's start, before scheduling: a backstop only
    assert policy["activeDeadlineSeconds"] > b["trialDeadlineSeconds"] + 3600


# -- refused job creations, valid names ----------------------------------------------------------------------------

def test_a_refused_job_creation_is_a_condition_then_a_failed_trial_with_the_apis_reason():
    ports = FakePorts()
    calls = []

    def refuse(job):
        calls.append(job["metadata"]["name"])
        raise ApiRefusal(422, "Invalid", 'admission webhook "validator.pytorchjob" denied the request: '
                                         'spec.pytorchReplicaSpecs.Master.replicas: must be 1')

    ports.create_job = refuse
    run = tuning_run()
    step(run, ports)
    step(run, ports)  # refused: reported on the trial
    step(run, ports)  # the run says so, and tries again
    c = conds(run)
    assert c["JobsAccepted"]["status"] == "False" and c["JobsAccepted"]["reason"] == "Invalid"
    assert "must be 1" in c["JobsAccepted"]["message"]
    # tried again: a hold that may clear by itself is Reconciling, not Stalled (which kstatus readers take as failed)
    assert c["Stalled"]["status"] == "False" and c["Reconciling"]["status"] == "True"
    assert c["Reconciling"]["reason"] == "JobRefused" and "must be 1" in c["Reconciling"]["message"]
    run = drive(run, ports, each=lambda p: None)
    rec = records(ports, run)
    assert [r["outcome"] for r in rec] == ["crashed", "crashed"] and all(r["charged_hours"] == 0 for r in rec)
    assert "422 Invalid" in rec[0]["message"] and "must be 1" in rec[0]["message"]
    assert len(calls) == 6  # three tries per trial, then the trial failed: no retry loop
    assert run["status"]["phase"] == "Failed" and "fails" in run["status"]["message"]


@pytest.mark.parametrize(("code", "reason", "message", "expect"), [
    (404, "NotFound", 'the server could not find the requested resource', "JobCreateNotFound"),
    (403, "Forbidden", 'pytorchjobs.kubeflow.org is forbidden: User "system:serviceaccount:x:y" cannot create '
                       'resource "pytorchjobs"', "JobCreateForbidden"),
])
def test_a_configuration_refusal_fails_the_run_permanently(code, reason, message, expect):
    ports = FakePorts()

    def refuse(job):
        raise ApiRefusal(code, reason, message)

    ports.create_job = refuse
    run = tuning_run()
    step(run, ports)
    step(run, ports)
    res = step(run, ports)
    assert run["status"]["phase"] == "Failed"
    assert conds(run)["JobsAccepted"]["reason"] == expect and message in conds(run)["Stalled"]["message"]
    assert res.permanent and message in res.permanent  # the handler raises kopf.PermanentError with it
    assert reconcile(run, ports).status == {}  # terminal: no more tries


def test_quota_refusals_wait_within_the_pending_deadline():
    ports = FakePorts()

    def refuse(job):
        raise ApiRefusal(403, "Forbidden", 'pytorchjobs "r-t001" is forbidden: exceeded quota: gpu-quota')

    ports.create_job = refuse
    run = tuning_run()
    run["spec"]["budget"]["pendingDeadlineSeconds"] = 400
    for _ in range(6):
        step(run, ports)
    assert not records(ports, run) and conds(run)["TrialQueued"]["reason"] == "QuotaExceeded"
    for _ in range(10):
        step(run, ports)
    assert records(ports, run)[0]["outcome"] == "interrupted" and records(ports, run)[0]["charged_hours"] == 0
    assert "stopped waiting for accelerators" in run["status"]["message"]


@pytest.mark.parametrize("name", ["my.run", "1st-run", "Tiny", "x" * 60, "a" * 253])
def test_job_names_are_always_valid_and_distinct(name):
    jobs = {job_name(name, i, a) for i in (1, 2, 999) for a in (0, 1)}
    assert len(jobs) == 6 and all(valid_job_name(j) and len(j) <= MAX_JOB_NAME for j in jobs), jobs
    assert job_name(name, 1) != job_name(name + "x", 1) and job_name("my-run", 1) != job_name("my.run", 1)
    ports = FakePorts()
    run = tuning_run()
    run["metadata"]["name"] = name
    step(run, ports)
    step(run, ports)
    [created] = ports.jobs_created
    assert created == job_name(name, 1) and valid_job_name(created)
    assert ports.trials[next(iter(ports.trials))]["status"]["jobRef"]["name"] == created


# -- jobs deleted by someone else, 409 adoption --------------------------------------------------------------------

def test_a_job_deleted_by_someone_else_is_interrupted_and_rerun_not_a_failure():
    ports = FakePorts()
    run = tuning_run()
    run["spec"]["budget"]["maxFailedTrials"] = 1
    step(run, ports)
    step(run, ports)  # job running since now
    step(run, ports)
    ports.jobs.pop("r-t001")  # someone deletes it
    step(run, ports)
    [rec] = records(ports, run)
    assert rec["outcome"] == "interrupted" and "deleted" in rec["message"]
    assert rec["charged_hours"] == pytest.approx(80 / 3600)  # the time it ran, not a failure
    assert conds(run)["TrialsHealthy"]["reason"] == "JobDeleted"
    run = drive(run, ports)
    assert run["status"]["phase"] == "Succeeded", run["status"]["message"]  # maxFailedTrials 1 was not hit
    kinds = [(r["id"], r["kind"], r["outcome"]) for r in records(ports, run)]
    assert kinds[:3] == [(1, "baseline", "interrupted"), (2, "baseline", "succeeded"), (3, "baseline", "succeeded")]


def test_a_409_adopts_only_a_job_the_trial_owns():
    ports = FakePorts()
    run = tuning_run()
    step(run, ports)  # trial r-t001
    foreign = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
               "metadata": {"name": "r-t001", "namespace": "ml",
                            "ownerReferences": [{"uid": "someone-else", "kind": "TuningTrial", "name": "r-t001"}]},
               "spec": {}, "status": {"conditions": [{"type": "Running", "status": "True"}]}}
    ports.jobs["r-t001"] = copy.deepcopy(foreign)  # a leftover of an earlier run of the same name
    step(run, ports)
    assert conds(run)["JobsAccepted"]["reason"] == "JobNameTaken" and "r-t001-1" in conds(run)["JobsAccepted"]["message"]
    step(run, ports)
    assert ports.jobs_created == ["r-t001-1"] and ports.jobs["r-t001"] == foreign  # the foreign job untouched
    assert ports.trials["r-t001"]["status"]["jobRef"]["name"] == "r-t001-1"
    # a job the trial does own (created before a crash, not yet noted) is adopted, not created again
    ports2, run2 = FakePorts(), tuning_run()
    step(run2, ports2)
    trial = ports2.trials["r-t001"]
    own = copy.deepcopy(foreign)
    own["metadata"]["ownerReferences"] = [{"uid": trial["metadata"]["uid"], "kind": "TuningTrial", "name": "r-t001"}]
    ports2.jobs["r-t001"] = own
    ports2.pod_start["r-t001"] = ports2.t
    step(run2, ports2)
    assert ports2.jobs_created == [] and trial["status"]["jobRef"]["name"] == "r-t001"


def test_a_409_on_a_trial_never_adopts_or_patches_another_runs_trial():
    ports = FakePorts()
    run = tuning_run()
    foreign = {"apiVersion": "attune.dev/v1alpha1", "kind": "TuningTrial",
               "metadata": {"name": "r-t001", "namespace": "ml", "uid": "old-trial",
                            "ownerReferences": [{"uid": "an-earlier-run", "kind": "TuningRun", "name": "r"}]},
               "spec": {"runRef": "r", "index": 1, "kind": "baseline", "knobs": {}},
               "status": {"phase": "Succeeded", "note": "the earlier run's"}}
    ports.trials["r-t001"] = copy.deepcopy(foreign)  # the earlier run of this name is being garbage-collected
    for _ in range(3):
        step(run, ports)
    assert ports.trials["r-t001"] == foreign and not ports.jobs_created  # untouched, nothing launched or charged
    c = conds(run)["TrialsAccepted"]
    assert c["status"] == "False" and c["reason"] == "TrialNameTaken" and "an-earlier-run" in c["message"]
    assert run["status"]["budget"]["hoursUsed"] == 0
    ports.trials.pop("r-t001")  # garbage-collected
    step(run, ports)
    assert ports.trials["r-t001"]["metadata"]["ownerReferences"][0]["uid"] == "run-uid"
    assert conds(run)["TrialsAccepted"]["status"] == "True"
    run = drive(run, ports)
    assert run["status"]["phase"] == "Succeeded", run["status"]["message"]
    # the effect layer alone refuses too: a 409 returning another owner's trial is never patched
    from attune.operator.reconcile import CreateTrial, apply_effects
    ports.trials["r-t999"] = copy.deepcopy({**foreign, "metadata": {**foreign["metadata"], "name": "r-t999"}})
    before = copy.deepcopy(ports.trials["r-t999"])
    mine = copy.deepcopy(ports.trials["r-t002"])
    mine["metadata"] = {**mine["metadata"], "name": "r-t999"}
    apply_effects([CreateTrial(mine, {"phase": "Pending"})], ports)
    assert ports.trials["r-t999"] == before
