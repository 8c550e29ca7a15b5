"""The operator on a shared production cluster (issue "tenants, Kueue, outages, upgrades"): each finding of the
platform review, through :func:`reconcile` with the real resources (only the API and Prometheus are fakes), the
webhook's checks, the URL rules and the handlers' thread pools. What needs the real operator process on the real
control plane is in ``test_shared_cluster_e2e.py``."""

from __future__ import annotations

import asyncio
import re
import threading
import time

import pytest

from attune.operator.manifests import build_trial
from attune.operator.reconcile import ApiRefusal, DiscoveryUnavailable
from attune.operator.resources import LABEL_QUEUE, LABEL_RUN, LABEL_TRIAL, TuningRunSpec, label_value
from attune.operator.webhook import run_problems, run_status_writer_problem, trial_writer_problem
from tests.k8s.fakes import FakePorts, conds, drive, records, step, tuning_run

pytestmark = pytest.mark.k8s

#: apimachinery's label value rule (k8s.io/apimachinery/pkg/util/validation: IsValidLabelValue)
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


# -- 1: long run names -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["r", "x" * 63, "x" * 64, "a-" * 40 + "b", "run." * 60 + "z"])
def test_label_values_are_valid_and_distinct_for_any_run_name(name):
    v = label_value(name)
    assert len(v) <= 63 and LABEL_VALUE.match(v), v
    assert label_value(name + "x") != v
    if len(name) <= 63:
        assert v == name


def test_a_trial_of_a_253_character_run_carries_valid_labels():
    run = tuning_run()
    run["metadata"]["name"] = "a" * 253
    trial = build_trial(run, 1, "baseline", {}, {}, "baseline", "")
    labels = trial["metadata"]["labels"]
    assert all(len(v) <= 63 and LABEL_VALUE.match(v) for v in labels.values()), labels
    assert labels[LABEL_RUN] == label_value("a" * 253) and labels[LABEL_TRIAL] == label_value(trial["metadata"]["name"])


# -- 4: discovery outages ----------------------------------------------------------------------------------------

def test_a_discovery_outage_waits_and_never_fails_the_run():
    ports = FakePorts()
    real = ports.served
    ports.served = lambda *a: (_ for _ in ()).throw(DiscoveryUnavailable("503 ServiceUnavailable: the server is "
                                                                         "currently unable to handle the request"))
    run = tuning_run()
    for _ in range(4):
        step(run, ports)
    c = conds(run)["BackendAvailable"]
    assert run["status"]["phase"] != "Failed" and c["reason"] == "DiscoveryUnavailable", c
    # it clears by itself: Reconciling names it, Stalled (failed, to kstatus readers such as Flux) stays False
    assert conds(run)["Stalled"]["status"] == "False" and not ports.jobs_created
    assert conds(run)["Reconciling"]["status"] == "True" and conds(run)["Reconciling"]["reason"] == "DiscoveryUnavailable"
    ports.served = real
    step(run, ports)
    assert ports.jobs_created and conds(run)["BackendAvailable"]["status"] == "True"


# -- 5: refused TuningTrial creations ----------------------------------------------------------------------------

def test_a_refused_trial_creation_is_reported_and_then_fails_the_run():
    ports = FakePorts()
    ports.create_trial = lambda t: (_ for _ in ()).throw(ApiRefusal(
        422, "Invalid", 'admission webhook "policy.example.com" denied the request: missing label team'))
    run = tuning_run()
    step(run, ports)
    st = run["status"]
    assert st["trialCreate"]["refusals"] == 1 and st.get("currentTrial") is None
    c = conds(run)["TrialsAccepted"]
    assert c["reason"] == "TrialCreateRefused" and "missing label team" in c["message"], c
    assert conds(run)["Stalled"]["status"] == "False" and conds(run)["Reconciling"]["reason"] == "TrialCreateRefused"
    for _ in range(3):
        step(run, ports)
    assert run["status"]["phase"] == "Failed" and "3 times" in run["status"]["message"]
    assert conds(run)["TrialsAccepted"]["reason"] == "TrialCreateRefused"


def test_a_quota_refusing_trials_is_waited_out():
    ports = FakePorts()
    real = ports.create_trial
    ports.create_trial = lambda t: (_ for _ in ()).throw(ApiRefusal(
        403, "Forbidden", 'tuningtrials.attune.dev "r-t001" is forbidden: exceeded quota: objects, requested: '
                          'count/tuningtrials.attune.dev=1, used: 10, limited: 10'))
    run = tuning_run()
    for _ in range(6):
        step(run, ports)
    assert run["status"]["phase"] != "Failed" and conds(run)["TrialsAccepted"]["reason"] == "QuotaExceeded"
    ports.create_trial = real
    step(run, ports)
    step(run, ports)
    assert ports.trials and run["status"].get("trialCreate") is None
    assert conds(run)["TrialsAccepted"]["status"] == "True"


# -- 7: reverting an edit that slipped past the webhook ----------------------------------------------------------

def test_reverting_a_slipped_edit_is_admitted_and_any_other_frozen_edit_is_not():
    run = tuning_run()
    accepted = run["spec"]
    slipped = {**run, "spec": {**accepted, "searchSpace": ["micro_batch_size"]},
               "status": {"acceptedSpec": accepted}}
    reverted = {**run, "spec": accepted}
    assert run_problems(reverted, slipped) == []
    other = {**run, "spec": {**accepted, "searchSpace": ["grad_accum"]}}
    assert run_problems(other, slipped) and "spec.searchSpace" in run_problems(other, slipped)[0]


# -- 2: Kueue ----------------------------------------------------------------------------------------------------

def _kueue_run():
    run = tuning_run()
    run["spec"]["budget"].pop("pendingDeadlineSeconds", None)
    run["spec"]["trialTemplate"].setdefault("metadata", {})["labels"] = {LABEL_QUEUE: "gpus"}
    return run


def test_a_trial_queued_by_kueue_has_no_default_deadline_and_costs_nothing():
    ports = FakePorts()
    run = _kueue_run()
    assert TuningRunSpec.model_validate(run["spec"]).budget.pending_deadline_seconds is None
    for _ in range(300):  # 300 steps of 40 s: over three hours in the queue
        step(run, ports)
    assert not records(ports, run) and run["status"]["phase"] not in ("Failed", "Succeeded")
    assert conds(run)["TrialQueued"]["reason"] == "KueueSuspended" and len(ports.jobs_created) == 1
    assert run["status"]["budget"]["hoursUsed"] == 0
    run = drive(run, ports, each=_kueue_admits_all)
    assert run["status"]["phase"] == "Succeeded"


def test_a_typod_kueue_queue_stalls_the_run_with_kueues_words_until_fixed():
    """Issue 39, item 17: a LocalQueue that does not exist leaves the job suspended for good (no deadline by default
    under Kueue): Kueue's own message on its Workload is the condition, and the run is Stalled, not waiting."""
    ports = FakePorts()
    run = _kueue_run()
    step(run, ports)
    step(run, ports)
    assert conds(run)["Stalled"]["status"] == "False"  # no word from Kueue yet: a queue like any
    ports.kueue_says = {"status": "False", "reason": "Inadmissible", "message": "LocalQueue attune-qq doesn't exist"}
    step(run, ports)
    c = conds(run)
    assert c["TrialQueued"]["reason"] == "KueueInadmissible", c["TrialQueued"]
    assert "Kueue says: LocalQueue attune-qq doesn't exist" in c["TrialQueued"]["message"]
    assert c["Stalled"]["status"] == "True" and c["Stalled"]["reason"] == "KueueInadmissible"
    assert "LocalQueue attune-qq doesn't exist" in c["Stalled"]["message"]
    # quota not free yet is Kueue's ordinary wait: its words shown, nothing stalled
    ports.kueue_says = {"status": "False", "reason": "Pending",
                        "message": "couldn't assign flavors to pod set master: insufficient quota for cpu"}
    step(run, ports)
    c = conds(run)
    assert c["TrialQueued"]["reason"] == "KueueSuspended" and "insufficient quota for cpu" in c["TrialQueued"]["message"]
    assert c["Stalled"]["status"] == "False"
    ports.kueue_says = None
    run = drive(run, ports, each=_kueue_admits_all)
    assert run["status"]["phase"] == "Succeeded"


def _kueue_admits_all(ports):
    for name, job in list(ports.jobs.items()):
        if (job["spec"].get("runPolicy") or {}).get("suspend"):
            ports.admit(name)
    ports.finish()


def test_a_trial_the_scheduler_cannot_place_still_has_the_default_deadline():
    ports = FakePorts()
    ports.pods_running = False
    run = tuning_run()
    run["spec"]["budget"].pop("pendingDeadlineSeconds", None)
    run = drive(run, ports, each=lambda p: None)
    rec = records(ports, run)
    assert [r["outcome"] for r in rec] == ["interrupted"] and "(3600 s)" in rec[0]["message"]
    assert rec[0]["charged_hours"] == 0 and run["status"]["budget"]["hoursUsed"] == 0


def test_a_preempted_trial_is_interrupted_and_counts_toward_neither_limit():
    ports = FakePorts()
    run = _kueue_run()
    run["spec"]["budget"].update(maxFailedTrials=1, maxTrials=3)
    step(run, ports)
    step(run, ports)
    name = ports.jobs_created[0]
    ports.admit(name)
    step(run, ports)
    ports.jobs[name]["spec"]["runPolicy"]["suspend"] = True  # Kueue preempts it
    step(run, ports)
    rec = records(ports, run)
    assert [r["outcome"] for r in rec] == ["interrupted"] and rec[0]["charged_hours"] > 0  # it ran: charged
    run = drive(run, ports, each=_kueue_admits_all)
    rec = records(ports, run)
    assert run["status"]["phase"] == "Succeeded", run["status"]["message"]
    plain = _kueue_run()  # the same run, never preempted
    plain["spec"]["budget"].update(maxFailedTrials=1, maxTrials=3)
    plain_rec = records(ports2 := FakePorts(), drive(plain, ports2, each=_kueue_admits_all))
    assert [r["kind"] for r in rec if r["outcome"] != "interrupted"] == [r["kind"] for r in plain_rec]
    assert "reached max_trials (3)" in run["status"]["message"]


def test_a_trial_preempted_and_admitted_again_between_two_looks_is_interrupted_not_measured():
    """Kueue evicts a running trial for a short urgent job and admits it again before the operator looks (the real
    Kueue did so within 10 s on the real control plane): the job is no longer suspended, but its pods are new and its
    processes started over, so a measurement would mix two starts. The pods' identity says so, not a clock."""
    ports = FakePorts()
    run = _kueue_run()
    run["spec"]["budget"].update(maxTrials=3)
    step(run, ports)
    step(run, ports)
    name = ports.jobs_created[0]
    ports.admit(name)
    first_start = ports.t
    step(run, ports)
    assert ports.trials[next(iter(ports.trials))]["status"]["runningPods"] == [f"uid-{name}-master-0-0"]
    step(run, ports)  # the same pods: nothing happens
    assert not records(ports, run) and name in ports.jobs
    ports.t += 20
    ports.bounce(name)
    ports.t += 5
    looked = ports.t
    step(run, ports)
    rec = records(ports, run)
    assert [r["outcome"] for r in rec] == ["interrupted"], rec
    assert "suspended (preempted, e.g. by Kueue) and admitted again" in rec[0]["message"], rec[0]["message"]
    assert rec[0]["charged_hours"] > 0 and rec[0]["wall_s"] == pytest.approx(looked - first_start)  # first start to now
    assert conds(run)["TrialsHealthy"]["reason"] == "Preempted"
    step(run, ports)
    assert name not in ports.jobs  # its job, running again, is stopped: its pods give the quota back
    run = drive(run, ports, each=_kueue_admits_all)
    assert run["status"]["phase"] == "Succeeded", run["status"]["message"]
    assert next(r["outcome"] for r in records(ports, run)) == "interrupted"


def test_pods_gone_after_the_job_ended_are_no_replacement():
    from attune.operator.backends import pods_replaced

    pod = {"metadata": {"uid": "a"}}
    assert not pods_replaced(["a"], [pod]) and not pods_replaced(["a"], []) and not pods_replaced(None, [pod])
    assert not pods_replaced(["a"], [pod, {"metadata": {"uid": "b"}}])  # a worker that came later
    assert pods_replaced(["a"], [{"metadata": {"uid": "b"}}])


# -- 3: Prometheus missing points --------------------------------------------------------------------------------

def test_missing_points_interrupt_the_trial_and_then_stop_the_run_saying_why():
    ports = FakePorts()
    ports.missing_points = True
    run = drive(tuning_run(), ports)
    rec = records(ports, run)
    assert [r["outcome"] for r in rec] == ["interrupted", "interrupted"], rec
    assert all(r["outcome"] != "crashed" for r in rec)
    assert conds(run)["MetricsAvailable"]["reason"] == "NoSamples"
    assert "PodMonitor" in run["status"]["message"] and "baseline recipe itself fails" not in run["status"]["message"]


def test_one_lost_measurement_is_run_again():
    ports = FakePorts()
    ports.missing_points = True

    def each(p):
        p.finish()
        if records(p):
            p.missing_points = False

    run = drive(tuning_run(), ports, each=each)
    rec = records(ports, run)
    assert rec[0]["outcome"] == "interrupted" and rec[1]["outcome"] == "succeeded" and rec[1]["kind"] == "baseline"
    assert run["status"]["phase"] == "Succeeded"


# -- 11: the journal and the budget do not depend on objects users can edit ----------------------------------------

def test_deleting_trials_gives_no_budget_back():
    ports = FakePorts()
    run = tuning_run()
    for _ in range(12):
        step(run, ports)
        ports.finish()
    used, ran = run["status"]["budget"]["hoursUsed"], run["status"]["cursor"]["trialsRun"]
    assert used > 0 and ran >= 2
    for name in [n for n, t in ports.trials.items() if (t.get("status") or {}).get("record")]:
        del ports.trials[name]  # kubectl delete tuningtrials --all
    step(run, ports)
    st = run["status"]
    assert st["budget"]["hoursUsed"] >= used and st["cursor"]["trialsRun"] >= ran
    c = conds(run)["JournalIntact"]
    assert c["status"] == "False" and c["reason"] == "RecordsMissing", c
    assert st["cursor"]["lostHours"] > 0 and st["cursor"]["lostTrials"] >= 2
    for _ in range(3):  # the loss is remembered, however many steps follow
        step(run, ports)
        ports.finish()
    assert run["status"]["budget"]["hoursUsed"] >= used


def test_an_ownerless_trial_naming_the_run_is_never_adopted():
    ports = FakePorts()
    run = tuning_run()
    forged = build_trial(run, 1, "baseline", {}, {}, "baseline", "")
    forged["metadata"]["ownerReferences"] = []
    forged["metadata"]["uid"] = "forged"
    forged["status"] = {"record": {"id": 1, "kind": "baseline", "outcome": "succeeded", "charged_hours": 0.0}}
    ports.trials[forged["metadata"]["name"]] = forged
    step(run, ports)
    assert not records(ports, run)[0:0] and conds(run)["TrialsAccepted"]["reason"] == "TrialNameTaken"
    assert ("patch", forged["metadata"]["name"]) not in ports.ops


def test_only_the_operator_writes_trials():
    op = ("system:serviceaccount:attune-system:attune",)
    old = {"spec": {"index": 1}, "status": {"record": {"id": 1}}}
    forged = {"spec": {"index": 1}, "status": {"record": {"id": 1, "charged_hours": 0}}}
    user = {"username": "alice"}
    assert trial_writer_problem(op, user, "UPDATE", "status", old, forged)
    assert trial_writer_problem(op, user, "CREATE", None, None, forged)
    assert trial_writer_problem(op, {"username": op[0]}, "UPDATE", "status", old, forged) is None
    labelled = {**old, "metadata": {"labels": {"team": "a"}}}
    assert trial_writer_problem(op, user, "UPDATE", None, old, labelled) is None  # metadata only: kubectl label
    assert trial_writer_problem((), user, "UPDATE", "status", old, forged) is None  # identity unknown: no check


def test_only_the_operator_writes_a_runs_status():
    op = ("system:serviceaccount:attune-system:attune",)
    old = {"spec": {"budget": {"acceleratorHours": 1}}, "status": {"acceptedSpec": {"budget": {"acceleratorHours": 1}}}}
    forged = {**old, "status": {"acceptedSpec": {"budget": {"acceleratorHours": 1000}}}}
    problem = run_status_writer_problem(op, {"username": "alice"}, old, forged)
    assert problem and "alice may not" in problem and "status.acceptedSpec" in problem
    assert run_status_writer_problem(op, {"username": op[0]}, old, forged) is None
    assert run_status_writer_problem(op, {"username": "alice"}, old, {**old, "metadata": {"labels": {"a": "b"}}}) is None
    assert run_status_writer_problem((), {"username": "alice"}, old, forged) is None  # identity unknown: no check


def test_the_operator_knows_its_own_service_account_from_its_token(tmp_path):
    import base64
    import json

    from attune.operator.identity import own_users

    claims = base64.urlsafe_b64encode(json.dumps({"sub": "system:serviceaccount:attune-system:attune"}).encode())
    (tmp_path / "token").write_text(f"e30.{claims.decode().rstrip('=')}.sig")
    assert own_users((), tmp_path / "token") == ("system:serviceaccount:attune-system:attune",)
    assert own_users(("u",), tmp_path / "token") == ("u",)
    assert own_users((), tmp_path / "missing") == ()


# -- 16: peering hand-over, clocks, interrupted trials -----------------------------------------------------------

def test_a_replica_that_lost_the_race_writes_no_verdict_and_no_status():
    ports = FakePorts()
    run = tuning_run()
    for _ in range(3):
        step(run, ports)
    ports.finish()
    trial = next(iter(ports.trials))
    real = ports.list_trials

    def stale(namespace, name):  # the trials as this replica read them; the winner records one meanwhile
        out = real(namespace, name)
        ports.patch_trial_status("ml", trial, {"record": {"id": 1, "kind": "baseline", "outcome": "succeeded",
                                                         "decision": "the winner's"}})
        return out

    ports.list_trials = stale
    before = dict(run["status"])
    res = step(run, ports)
    assert ("record-refused", trial) in ports.ops
    assert ports.trials[trial]["status"]["record"]["decision"] == "the winner's"
    assert res.status == {} and run["status"] == before


def test_a_node_clock_behind_the_operators_does_not_end_a_trial_early():
    ports = FakePorts()
    ports.pods_running = False  # queued for accelerators first: the clamp to the job's creation does not help
    run = tuning_run()
    deadline = run["spec"]["budget"]["trialDeadlineSeconds"]
    for _ in range(10):
        step(run, ports)
    name = ports.jobs_created[0]
    ports.pod_start[name] = ports.t - 120  # the pods start now; the node's clock says two minutes ago
    t0 = ports.t
    while ports.t - t0 < deadline:
        step(run, ports, dt=20)
    assert not records(ports, run), "the trial was timed out before its deadline on the operator's clock"
    while ports.t - t0 < deadline + 60:
        step(run, ports, dt=20)
    assert records(ports, run)[0]["outcome"] == "timed_out"  # and it is timed out once that deadline passes


def test_interrupted_trials_do_not_use_up_max_trials():
    ports = FakePorts()
    run = tuning_run()
    run["spec"]["budget"]["maxTrials"] = 2
    step(run, ports)
    step(run, ports)
    ports.jobs.clear()  # someone deletes the baseline's job: interrupted, run again
    run = drive(run, ports)
    rec = records(ports, run)
    assert [r["outcome"] for r in rec][:1] == ["interrupted"]
    assert sum(r["outcome"] != "interrupted" for r in rec) == 2


# -- 9: bounded timeouts and threads a tenant cannot exhaust --------------------------------------------------------

def test_endpoint_timeouts_are_bounded():
    run = tuning_run()
    run["spec"]["agent"]["timeoutSeconds"] = 3600
    assert any("agent.timeoutSeconds" in p or "less than or equal" in p for p in run_problems(run))
    run = tuning_run()
    run["spec"]["metrics"]["timeoutSeconds"] = 600
    assert any("less than or equal" in p for p in run_problems(run))


def test_one_namespaces_slow_steps_never_hold_anothers_or_the_webhooks():
    from attune.operator.handlers import Pools

    pools = Pools(step_workers=3, per_namespace=2)
    release, entered = threading.Event(), threading.Semaphore(0)

    def slow() -> str:
        entered.release()
        release.wait(30)
        return "slow"

    async def scenario() -> tuple[float, float]:
        hung = [asyncio.ensure_future(pools.step("tenant-a", slow)) for _ in range(6)]
        for _ in range(2):  # tenant-a holds its two workers (per_namespace), its other four steps wait for them
            assert await asyncio.to_thread(entered.acquire, True, 10), "tenant-a's steps never started"
        t = time.monotonic()
        assert await asyncio.wait_for(pools.step("tenant-b", lambda: "fast"), 5) == "fast"
        other = time.monotonic() - t
        t = time.monotonic()
        assert await asyncio.wait_for(pools.admit(lambda: "admitted"), 5) == "admitted"
        admit = time.monotonic() - t
        release.set()
        assert await asyncio.gather(*hung) == ["slow"] * 6
        return other, admit

    other, admit = asyncio.run(scenario())
    assert other < 5 and admit < 5


def test_suspending_a_run_releases_the_running_trials_pods_and_runs_it_again_on_resume():
    """Issue 39, item 17: spec.suspend gives the accelerators back now (the trial's job is deleted, as Kubeflow's own
    suspend deletes its pods), charges the time they ran, and the trial runs again from its start on resume: no
    decision rests on a measurement cut in two."""
    ports = FakePorts()
    run = tuning_run()
    for _ in range(3):  # the baseline's job created, its pods running
        step(run, ports)
    [job] = list(ports.jobs)
    assert run["status"].get("currentTrial") and not records(ports, run)
    run["spec"]["suspend"] = True
    step(run, ports)
    assert not ports.jobs, "the running trial's job (and with it its pods) was not released"
    [rec] = records(ports, run)
    assert rec["outcome"] == "interrupted" and rec["charged_hours"] > 0 and "spec.suspend" in rec["message"]
    assert run["status"]["phase"] == "Suspended" and conds(run)["Suspended"]["status"] == "True"
    assert run["status"]["budget"]["hoursUsed"] == pytest.approx(rec["charged_hours"], abs=1e-6)
    for _ in range(5):  # suspended: nothing new is launched
        step(run, ports)
    assert ports.jobs_created == [job]
    run["spec"]["suspend"] = False
    run = drive(run, ports)
    rec = records(ports, run)
    assert run["status"]["phase"] == "Succeeded"
    assert rec[0]["outcome"] == "interrupted" and rec[1]["kind"] == "baseline" and rec[1]["outcome"] == "succeeded"
    assert rec[1]["signature"] == rec[0]["signature"]  # the same recipe, run again from its start


def test_suspending_as_the_trial_ends_keeps_its_measurement():
    ports = FakePorts()
    run = tuning_run()
    for _ in range(3):
        step(run, ports)
    ports.finish()  # the job succeeded just before the edit
    run["spec"]["suspend"] = True
    step(run, ports)
    [rec] = records(ports, run)
    assert rec["outcome"] == "succeeded" and run["status"]["phase"] == "Suspended"
