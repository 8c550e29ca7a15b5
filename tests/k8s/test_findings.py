"""The operator's reconcile step where it meets a real cluster: time queued for accelerators is not charged, refused,
deleted and foreign jobs and trials, a status that stays small, the spec the run accepted, measurements and their
credentials, TrainJob trials, kstatus and GitOps health, admission of updates, the CRD's CEL rules, and the check
that no process outlives the session. Each runs :func:`reconcile` with the real resources (the CRD models, the real
engine, gate and manifests; only the API and Prometheus are fakes). What needs the real operator process is in
``test_findings_e2e.py``."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from attune.engine.loop import ActionKind, RunState, TuneConfig, next_action, plan_trial
from attune.operator.backends import MAX_JOB_NAME, job_name, valid_job_name
from attune.operator.reconcile import (
    ApiRefusal,
    NeedObservation,
    Observations,
    decide,
    reconcile,
)
from attune.operator.resources import LABEL_QUEUE
from attune.trial import TrialOutcome, TrialRecord
from tests.k8s.conftest import good_run
from tests.k8s.fakes import FakePorts, conds, drive, records, step, trainjob_run, tuning_run

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
    ports.pods_running = False
    run = tuning_run()
    run["spec"]["budget"]["pendingDeadlineSeconds"] = 300
    run = drive(run, ports, each=lambda p: None)
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


# -- bounded status ------------------------------------------------------------------------------------------------

def test_the_run_object_stays_small_over_200_trials():
    ports = FakePorts()
    run = tuning_run()
    run["spec"]["metrics"].update(baselineRepeats=200, measureSteps=60)
    run["spec"]["budget"].update(acceleratorHours=1000, maxTrials=200)
    sizes = {}
    for _ in range(1000):
        step(run, ports)
        ports.finish()
        n = len(records(ports, run)) if len(ports.trials) % 50 == 0 else None
        if n:
            sizes[n] = len(json.dumps(run))
        if run["status"].get("phase") in ("Succeeded", "Failed"):
            break
    assert run["status"]["phase"] == "Succeeded", run["status"]["message"]
    assert len(ports.trials) == 200 and run["status"]["trials"]["total"] == 200
    size = len(json.dumps(run))
    trial_size = max(len(json.dumps(t)) for t in ports.trials.values())
    print(f"run object {size} B after 200 trials, largest trial {trial_size} B; sizes {sizes}")
    assert size < 32 * 1024, size
    assert max(sizes.values()) - min(sizes.values()) < 2048, sizes  # does not grow with the trials
    assert trial_size < 64 * 1024
    assert run["status"]["cursor"]["nextTrial"] == 201


def test_refusals_are_kept_bounded():
    from attune.operator.resources import REFUSED_KEPT

    ports = FakePorts()
    run = tuning_run()
    old = step(run, ports).status
    status = {**run["status"], "refused": [], "cursor": {"refused": 0}}
    for i in range(40):
        rec = TrialRecord(id=100 + i, kind="candidate", outcome=TrialOutcome.REFUSED, message="no",
                          verdict={"admitted": False})
        status["refused"] = (status["refused"] + [rec.model_dump(mode="json")])[-REFUSED_KEPT:]
    assert old
    run["status"] = status
    res = reconcile(run, ports)
    assert len(res.status["refused"]) == REFUSED_KEPT


# -- one run driver, a pure decision -------------------------------------------------------------------------------

def test_actions_are_typed_and_every_stop_rule_lives_in_the_engine():
    from attune.recipe.io import parse_recipe

    recipe = parse_recipe(tuning_run()["spec"]["recipe"]["inline"])
    cfg = TuneConfig.from_recipe(recipe, 1.0, max_failed_trials=2)
    st = RunState(baseline=recipe, config=cfg)
    a = next_action(st)
    assert a.kind is ActionKind.BASELINE and a.kind == "baseline"
    plan = plan_trial(st, a)
    from attune.trial import Measurement

    m = Measurement(tokens_per_s_per_device=100, tokens_per_s=100, step_time_median_s=1, step_time_cv=0.01,
                    steps_measured=10)
    crashed = [TrialRecord(id=i, kind="baseline", outcome=TrialOutcome.SUCCEEDED, signature=plan.signature,
                           charged_hours=0.01, measurement=m) for i in (1, 2)] + \
              [TrialRecord(id=i, kind="candidate", outcome=TrialOutcome.CRASHED, signature=f"s{i}",
                           charged_hours=0.01) for i in (3, 4)]
    st.records.extend(crashed)
    st.config = TuneConfig.from_recipe(recipe, 1.0, max_failed_trials=2, baseline_repeats=5)
    assert next_action(st).kind is ActionKind.FINISH and "max_failed_trials 2" in next_action(st).reason
    st.config = TuneConfig.from_recipe(recipe, 1.0, max_failed_trials=3, baseline_repeats=5)
    assert next_action(st).kind is ActionKind.BASELINE  # under the limit: the engine goes on
    # the operator's maxFailedTrials is the engine's
    from attune.operator.reconcile import tune_config
    from attune.operator.resources import TuningRunSpec

    assert tune_config(TuningRunSpec.model_validate(tuning_run()["spec"]), recipe).max_failed_trials == 2


def test_decide_is_pure_and_asks_for_what_it_needs():
    run = tuning_run()
    obs = Observations(1_000_000.0)
    with pytest.raises(NeedObservation) as need:
        decide(run, obs)  # no ports at all: it can only ask
    assert need.value.key == ("trials", "ml", "r")
    with pytest.raises(NeedObservation) as need:
        decide(copy.deepcopy(run), Observations(1_000_000.0, {("trials", "ml", "r"): []}))
    assert need.value.key == ("hours_left", "ml")  # the namespace's quota, before a trial is launched
    seen = {("trials", "ml", "r"): [], ("hours_left", "ml"): None}
    a = decide(copy.deepcopy(run), Observations(1_000_000.0, dict(seen)))
    b = decide(copy.deepcopy(run), Observations(1_000_000.0, dict(seen)))
    assert a.status == b.status and a.effects == b.effects  # same inputs, same decision
    assert [type(e).__name__ for e in a.effects] == ["CreateTrial"]


def test_the_operators_baseline_record_is_the_engines():
    """The CLI's tuner and the operator assemble records alike: same plan, same verdict, same decision."""
    from attune.backends.base import TrialResult
    from attune.engine.loop import trial_record
    from attune.recipe.io import parse_recipe

    ports = FakePorts()
    run = tuning_run()
    for _ in range(3):
        step(run, ports)
        ports.finish()
    [rec] = records(ports, run)
    recipe = parse_recipe(run["spec"]["recipe"]["inline"])
    st = RunState(baseline=recipe, config=TuneConfig.from_recipe(recipe, 1.0))
    plan = plan_trial(st, next_action(st))
    mine = trial_record(st, plan, TrialResult(TrialOutcome.SUCCEEDED, None, 1.0, 1, 0.0))
    assert rec["verdict"] == mine.verdict and rec["verdict"] is not None
    assert rec["decision"] == mine.decision and rec["source"] == mine.source and rec["signature"] == mine.signature


# -- the operator runs on the spec it accepted ---------------------------------------------------------------------

def test_frozen_edits_that_slipped_past_are_ignored_and_reported_then_cleared():
    ports = FakePorts()
    run = tuning_run()
    step(run, ports)
    step(run, ports)
    ports.finish()
    image = run["spec"]["trialTemplate"]["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    original = image["image"]
    edited = copy.deepcopy(run)
    edited["spec"]["trialTemplate"]["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0][
        "image"] = "evil/image:latest"
    edited["spec"]["searchSpace"] = ["micro_batch_size"]
    edited["spec"]["budget"]["acceleratorHours"] = 5.0  # an increase: taken
    edited["metadata"]["generation"] = 2
    frozen_events = []  # per step, the FrozenFieldChanged events it emitted
    for _ in range(4):
        res = step(edited, ports)
        frozen_events.append([e for e in res.events if e[1] == "FrozenFieldChanged"])
        ports.finish()
    c = conds(edited)["SpecAccepted"]
    assert c["status"] == "False" and c["reason"] == "FrozenFieldChanged"
    assert "spec.trialTemplate is frozen" in c["message"] and "spec.searchSpace is frozen" in c["message"]
    assert c["observedGeneration"] == 2
    # reported once as a Warning event, by the step that first saw the edit; the later steps keep the condition but
    # do not repeat the event while the condition already says the same
    assert frozen_events == [[("Warning", "FrozenFieldChanged", c["message"])], [], [], []]
    for name in ports.jobs_created:
        pod = ports.jobs[name]["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
        assert pod["image"] == original, "a frozen field's edit reached a trial"
    assert edited["status"]["budget"]["hoursLimit"] == 5.0
    edited["spec"]["trialTemplate"] = copy.deepcopy(run["spec"]["trialTemplate"])
    edited["spec"]["searchSpace"] = run["spec"]["searchSpace"]
    edited["metadata"]["generation"] = 3
    step(edited, ports)
    c = conds(edited)["SpecAccepted"]
    assert c["status"] == "True" and c["observedGeneration"] == 3  # it returns to True


# -- measurements need enough steps; DCGM missing is a condition ---------------------------------------------------

def test_a_gpu_trial_without_dcgm_data_says_so():
    ports = FakePorts()
    run = tuning_run()
    run["spec"]["recipe"]["inline"]["resources"]["accelerator"] = "h100-sxm-80gb"
    for _ in range(3):
        step(run, ports)
        ports.finish()
    c = conds(run)["GPUMetricsAvailable"]
    assert c["status"] == "False" and c["reason"] == "NoDCGMData"
    ports.signals = {"sm_active": 0.5}
    for _ in range(3):
        step(run, ports)
        ports.finish()
    assert conds(run)["GPUMetricsAvailable"]["reason"] == "PartialDCGMData"


def test_prometheus_credentials_come_from_secrets():
    from attune.operator import orgs

    ports = FakePorts()
    run = tuning_run()
    run["spec"]["metrics"]["prometheusUrl"] = "https://prom.ml.svc"  # a token goes over https only
    run["spec"]["metrics"]["prometheus"] = {"bearerTokenSecretRef": {"name": "prom", "key": "token"},
                                            "tenant": "team-a"}
    for _ in range(3):
        step(run, ports)
        ports.finish()
    c = conds(run)["MetricsAvailable"]
    assert c["reason"] == "SecretNotFound" and "prom" in c["message"] and not records(ports, run)
    ports.secrets[("prom", "token")] = "s3cret"
    orgs.configure([f"{run['metadata']['namespace']}=org-of-the-platform"])
    try:
        step(run, ports)
    finally:
        orgs.configure([])
    # the run's own tenant (past a webhook that was down) is never sent: the platform's organisation is
    assert ports.measured[2].bearer_token == "s3cret" and ports.measured[2].tenant == "org-of-the-platform"
    assert "s3cret" not in json.dumps(run["status"])


# -- TrainJob ------------------------------------------------------------------------------------------------------

def test_a_trainjob_template_runs_its_trials_as_trainjobs():
    ports = FakePorts()
    run = drive(trainjob_run(), ports)
    assert run["status"]["phase"] == "Succeeded", run["status"]["message"]
    job = ports.jobs[ports.jobs_created[0]]
    assert job["apiVersion"] == "trainer.kubeflow.org/v1alpha1" and job["kind"] == "TrainJob"
    trainer = job["spec"]["trainer"]
    env = {e["name"]: e["value"] for e in trainer["env"]}
    assert '"max_steps":62' in env["ATTUNE_TRIAL_SPEC"] and trainer["numProcPerNode"] == 1
    assert job["spec"]["runtimeRef"] == {"name": "torch-distributed"} and job["spec"]["labels"]["attune.dev/run"] == "r"
    assert "ports" not in trainer
    assert ports.trials["r-t001"]["status"]["jobRef"]["kind"] == "TrainJob"
    assert run["status"]["best"]["speedup"] == pytest.approx(1.6, rel=1e-3)


def test_a_missing_trainjob_crd_is_a_clear_condition():
    ports = FakePorts()
    ports.served_kinds = {"pytorchjobs"}  # Kubeflow Trainer not installed
    run = trainjob_run()
    step(run, ports)
    res = step(run, ports)
    assert run["status"]["phase"] == "Failed" and not ports.jobs_created
    c = conds(run)["BackendAvailable"]
    assert c["reason"] == "CRDNotInstalled" and "trainer.kubeflow.org/v1alpha1 trainjobs" in c["message"]
    assert res.permanent


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


# -- URLs, auth, no response bodies, enough steps ------------------------------------------------------------------

@pytest.mark.parametrize(("url", "ok"), [
    ("http://prometheus-operated.monitoring.svc:9090", True),
    ("https://thanos.obs.svc.cluster.local", True),
    ("http://127.0.0.1:8081", True),
    ("http://localhost:9090", True),
    ("http://169.254.169.254/latest/meta-data", False),  # the cloud's metadata service
    ("http://10.0.0.1:9090", False),
    ("http://prometheus-operated.monitoring:9090", False),  # a short name: indistinguishable from a domain
    ("http://evil.example.com", False),
    ("http://user:pw@prom.monitoring.svc", False),
    ("file:///etc/passwd", False),
    ("http://svc", False),
])
def test_only_allowed_hosts_are_fetched(url, ok, monkeypatch):
    from attune.operator import urls

    monkeypatch.delenv(urls.ENV, raising=False)
    assert (urls.url_problem(url, "x") is None) is ok, urls.url_problem(url, "x")
    monkeypatch.setenv(urls.ENV, "*.example.com,10.0.0.0/8")
    assert urls.url_problem("http://evil.example.com", "x") is None and urls.url_problem("http://10.0.0.1", "x") is None
    assert urls.url_problem("http://127.0.0.1", "x") is not None


@pytest.mark.parametrize(("url", "ok"), [
    ("http://prom.ml.svc:9090", True),
    ("http://prom.ml.svc.cluster.local:9090", True),
    ("http://prometheus-operated.monitoring.svc:9090", False),  # another namespace: the platform must allow it
    ("http://agent.other-tenant.svc.cluster.local", False),
    ("http://prom.ml", False),
    ("http://prom", False),  # resolved in the operator's namespace, not the run's
])
def test_by_default_a_run_reaches_services_of_its_own_namespace_only(url, ok, monkeypatch):
    from attune.operator import urls

    monkeypatch.delenv(urls.ENV, raising=False)
    assert (urls.url_problem(url, "x", namespace="ml") is None) is ok, urls.url_problem(url, "x", namespace="ml")
    monkeypatch.setenv(urls.ENV, "namespace,prometheus-operated.monitoring.svc")  # the platform shares one
    assert urls.url_problem("http://prometheus-operated.monitoring.svc:9090", "x", namespace="ml") is None


def test_credentials_go_over_https_or_loopback_only():
    from attune.operator import urls

    assert urls.credentials_problem("https://prom.ml.svc", "x") is None
    assert urls.credentials_problem("http://127.0.0.1:9090", "x") is None
    assert "only over https" in urls.credentials_problem("http://prom.ml.svc", "x")
    try:
        urls.configure(None, insecure_credentials=True)
        assert urls.credentials_problem("http://prom.ml.svc", "x") is None
    finally:
        urls.configure(None)
    ports = FakePorts()
    run = tuning_run()
    run["spec"]["metrics"]["prometheus"] = {"bearerTokenSecretRef": {"name": "prom", "key": "token"}}
    ports.secrets[("prom", "token")] = "s3cret"
    reads = []
    ports.read_secret = lambda *a: reads.append(a) or "s3cret"
    step(run, ports)
    c = conds(run)["MetricsAvailable"]
    assert run["status"]["phase"] == "Failed" and c["reason"] == "InsecureCredentials", c
    assert not reads and not ports.jobs_created, "a Secret was read or a trial ran for an http URL with a token"


def test_the_webhook_refuses_a_url_the_operator_may_not_fetch():
    from attune.operator.webhook import run_problems

    run = good_run("r", "http://169.254.169.254", "http://evil.example.com")
    problems = run_problems(run)
    assert any("prometheusUrl: host 169.254.169.254" in p for p in problems)
    assert any("agent.endpoint: host evil.example.com" in p for p in problems)


class _Recorder:
    """A loopback HTTP(S) server answering every request with ``status`` and ``body``, recording its headers."""

    def __init__(self, status: int, body: bytes, tls: tuple[str, str] | None = None) -> None:
        import http.server
        import ssl
        import threading

        self.headers: list[dict[str, str]] = []
        rec = self

        class H(http.server.BaseHTTPRequestHandler):
            def _answer(self):
                rec.headers.append(dict(self.headers))
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

            def log_message(self, *a):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        if tls:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(*tls)
            self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_prometheus_gets_its_token_and_tenant_and_its_answer_is_not_quoted_in_errors():
    from attune.operator import metrics

    secret = b'{"status": "error", "errorType": "bad_data", "error": "SECRET-INTERNAL-PAGE <html>"}'
    srv = _Recorder(500, b"SECRET-INTERNAL-PAGE " * 20)
    try:
        prom = metrics.PrometheusClient(srv.url, 5, metrics.Access(bearer_token="tok", tenant="team-a",
                                                                  basic_auth=None))
        with pytest.raises(metrics.MetricsUnavailable) as err:
            prom.query("up")
        assert "SECRET" not in str(err.value) and "HTTP 500" in str(err.value)
        assert srv.headers[0]["Authorization"] == "Bearer tok" and srv.headers[0]["X-Scope-OrgID"] == "team-a"
    finally:
        srv.close()
    srv = _Recorder(200, secret)
    try:
        with pytest.raises(metrics.MetricsUnavailable) as err:
            metrics.PrometheusClient(srv.url, 5, metrics.Access(basic_auth=("u", "p"))).query("up")
        assert "SECRET" not in str(err.value) and "bad_data" in str(err.value)
        assert srv.headers[0]["Authorization"].startswith("Basic ")
    finally:
        srv.close()


def test_the_agents_error_page_is_not_quoted():
    from attune.operator import agent_client

    srv = _Recorder(502, b"SECRET-INTERNAL-PAGE")
    try:
        with pytest.raises(agent_client.AgentUnavailable) as err:
            agent_client.ask_sidecar(srv.url, agent_client.ProposeRequest(
                policy="playbook", baseline={}, best={}, records=[], search_space=[], noise_floor=0.02,
                budget_left_hours=1.0), 5)
        assert "SECRET" not in str(err.value) and "502" in str(err.value)
    finally:
        srv.close()


def test_prometheus_over_tls_with_the_runs_ca(tmp_path):
    import shutil
    import subprocess

    from attune.operator import metrics

    if shutil.which("openssl") is None:
        pytest.skip("no openssl to make a test CA")
    d = tmp_path
    run = lambda *a: subprocess.run(["openssl", *a], check=True, capture_output=True, cwd=d)  # noqa: E731
    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
        "-subj", "/CN=test-ca")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "srv.key", "-out", "srv.csr", "-subj", "/CN=127.0.0.1")
    (d / "ext").write_text("subjectAltName=IP:127.0.0.1\n")
    run("x509", "-req", "-in", "srv.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial", "-out", "srv.crt",
        "-days", "2", "-extfile", "ext")
    ok = b'{"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}, "value": [1, "3"]}]}}'
    srv = _Recorder(200, ok, tls=(str(d / "srv.crt"), str(d / "srv.key")))
    try:
        with pytest.raises(metrics.MetricsUnavailable):  # not trusted without the CA
            metrics.PrometheusClient(srv.url, 5).query("up")
        prom = metrics.PrometheusClient(srv.url, 5, metrics.Access(ca_pem=(d / "ca.crt").read_text()))
        assert prom.query("up") == 3.0
    finally:
        srv.close()


def test_two_steps_of_sixty_are_not_a_measurement():
    from attune.operator import metrics
    from attune.operator.resources import MetricsSpec
    from tests.k8s.fakes import ScriptedPrometheus

    m = MetricsSpec(prometheusUrl="http://p.svc", warmupSteps=2, measureSteps=60)
    few = ScriptedPrometheus(dict.fromkeys((1, 2, 3, 4), 1.0), sampled=[3, 4])
    assert metrics.min_steps(m) == 48
    assert metrics.measure_trial(few, m, "ml", "r-t001", 1000.0, 1100.0, tokens_per_step=512, devices=1) is None
    enough = ScriptedPrometheus(dict.fromkeys(range(1, 63), 1.0), sampled=[])
    meas = metrics.measure_trial(enough, m, "ml", "r-t001", 1000.0, 1100.0, tokens_per_step=512, devices=1)
    assert meas is not None and meas.steps_measured == 60


# -- admission of updates never depends on a ConfigMap -------------------------------------------------------------

def test_an_update_with_an_unchanged_spec_is_admitted_without_reading_anything():
    from attune.operator.webhook import run_problems

    run = good_run("r", "http://p.ml.svc", None)
    run["spec"]["recipe"] = {"configMapRef": {"name": "gone"}}
    run["status"] = {"phase": "Tuning"}

    def no_configmap(*_):
        raise AssertionError("an update read the recipe's ConfigMap")

    finalizer_removed = copy.deepcopy(run)
    finalizer_removed["metadata"].update(finalizers=[], deletionTimestamp="2026-01-01T00:00:00Z")
    assert run_problems(finalizer_removed, run, no_configmap) == []
    annotated = copy.deepcopy(run)
    annotated["metadata"]["annotations"] = {"kopf.zalando.org/x": "y"}
    assert run_problems(annotated, run, no_configmap) == []
    suspend = copy.deepcopy(run)
    suspend["spec"]["suspend"] = True
    assert run_problems(suspend, run, no_configmap) == []


# -- the CRD's CEL rules -------------------------------------------------------------------------------------------

def _cel_rules():
    from attune.operator.crdgen import build_crds

    spec = build_crds()["attune.dev_tuningruns.yaml"]["spec"]["versions"][0]["schema"]["openAPIV3Schema"][
        "properties"]["spec"]
    return [(None, r) for r in spec["x-kubernetes-validations"]] + \
           [("budget", r) for r in spec["properties"]["budget"]["x-kubernetes-validations"]]


def _cel_refusals(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    celpy = pytest.importorskip("celpy")
    env = celpy.Environment()
    out = []
    for node, rule in _cel_rules():
        o, n = (old.get(node), new.get(node)) if node else (old, new)
        prog = env.program(env.compile(rule["rule"]))
        if not prog.evaluate({"self": celpy.json_to_cel(n), "oldSelf": celpy.json_to_cel(o)}):
            out.append(rule["message"])
    return out


@pytest.mark.parametrize(("edit", "allowed"), [
    (lambda s: s.update(suspend=True), True),
    (lambda s: s["budget"].update(acceleratorHours=9.0, maxTrials=50, maxFailedTrials=9), True),
    (lambda s: s["budget"].pop("maxTrials"), True),  # no limit: the largest
    (lambda s: s["budget"].update(acceleratorHours=0.01), False),
    (lambda s: s["budget"].update(maxTrials=1), False),
    (lambda s: s["budget"].update(trialDeadlineSeconds=999), False),
    (lambda s: s.update(searchSpace=["micro_batch_size"]), False),
    (lambda s: s.update(containerName="other"), False),
    (lambda s: s["metrics"].update(measureSteps=7), False),
    (lambda s: s.update(agent={"endpoint": "http://x.svc"}), False),
    (lambda s: s.pop("searchSpace"), False),
    (lambda s: s["recipe"].update(configMapRef={"name": "x"}), False),
    (lambda s: s["recipe"]["inline"]["training"].update(seed=7), False),  # inside the opaque inline recipe
    (lambda s: s["trialTemplate"]["spec"].update(runPolicy={"cleanPodPolicy": "None"}), False),  # opaque
])
def test_cel_rules_and_the_webhook_agree_on_spec_edits(edit, allowed):
    from attune.operator.resources import spec_edit_problems

    old = good_run("r", "http://p.ml.svc", None)["spec"]
    new = copy.deepcopy(old)
    edit(new)
    assert (not spec_edit_problems(old, new)) is allowed, spec_edit_problems(old, new)
    assert (not _cel_refusals(old, new)) is allowed, _cel_refusals(old, new)


def test_the_opaque_template_is_frozen_whole_by_cel_and_by_the_webhook():
    """CEL selects no field inside an opaque value, but compares two whole (kube-apiserver does:
    tests/k8s/test_real_crds.py), so the template has a rule of its own like every other frozen field."""
    from attune.operator.crdgen import build_crds, opaque
    from attune.operator.resources import spec_edit_problems

    props = build_crds()["attune.dev_tuningruns.yaml"]["spec"]["versions"][0]["schema"]["openAPIV3Schema"][
        "properties"]["spec"]["properties"]
    assert opaque(props["trialTemplate"])  # x-kubernetes-preserve-unknown-fields
    old = good_run("r", "http://p.ml.svc", None)["spec"]
    new = copy.deepcopy(old)
    new["trialTemplate"]["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["image"] = "x"
    assert spec_edit_problems(old, new) == ["spec.trialTemplate is frozen"]
    assert [m.split(";")[0] for m in _cel_refusals(old, new)] == ["spec.trialTemplate is frozen once the run exists"]


# -- no process outlives the session -------------------------------------------------------------------------------

def test_the_session_check_sees_a_leftover_process():
    """The session-scoped check (conftest.no_process_outlives_the_session) finds every process the session started,
    however it was detached (its own session, reparented to init): they carry the session's mark."""
    import os
    import subprocess
    import sys
    import time

    from tests.k8s.conftest import SESSION_MARK, marked_processes

    mark = os.environ[SESSION_MARK]
    # a grandchild that outlives its parent: reparented to init, the usual leak
    subprocess.run([sys.executable, "-c", "import subprocess, sys; subprocess.Popen([sys.executable, '-c', "
                                          "'import time; time.sleep(60)'], start_new_session=True)"], check=True)
    time.sleep(0.5)
    left = [(pid, cmd) for pid, cmd in marked_processes(mark) if "time.sleep(60)" in cmd]
    assert len(left) == 1, marked_processes(mark)
    os.kill(left[0][0], 9)
    time.sleep(0.2)
    assert not [p for p in marked_processes(mark) if "time.sleep(60)" in p[1]]
