"""The operator on a shared production cluster, end to end: the real operator process (``attune operator run``)
against the strict emulated API server (apimachinery's validation, the chart's RBAC for the operator's
ServiceAccount, injected faults), one test per finding of the platform review or a few findings per test where they
share a run. Each fails on the operator as it was before the fixes (the finding's number is in the test's name)."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from attune.operator.resources import label_value
from tests.k8s.conftest import good_run
from tests.k8s.harness import NS, KubeAPI, Operator, wait_for

pytestmark = [pytest.mark.k8s, pytest.mark.e2e, pytest.mark.slow]

RUNS = ("attune.dev", "v1alpha1", NS, "tuningruns")
TRIALS = ("attune.dev", "v1alpha1", NS, "tuningtrials")
PROM = "http://prom.ml.svc:9090"  # a Service of the run's own namespace (nothing listens: no trial is measured here)
RELEASE_N1 = Path(__file__).parent / "data" / "release-0.1.0"
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def _status(kube: KubeAPI, name: str) -> dict[str, Any]:
    return (kube.run(name) or {}).get("status") or {}


def _cond(kube: KubeAPI, name: str, ctype: str) -> dict[str, Any]:
    return next((c for c in _status(kube, name).get("conditions") or [] if c["type"] == ctype), {})


def _create(kube: KubeAPI, run: dict[str, Any]) -> None:
    kube.custom.create_namespaced_custom_object(*RUNS, run)


def _trials(kube: KubeAPI, run: str) -> list[dict[str, Any]]:
    return [t for t in kube.trials() if t["spec"]["runRef"] == run]


# -- 1 ------------------------------------------------------------------------------------------------------------

def test_1_a_run_with_a_253_character_name_runs_its_trials_and_can_be_deleted(kube, operator):
    name = "a" * 60 + "." + "b" * 192
    assert len(name) == 253
    _create(kube, good_run(name, PROM, None))
    trial = wait_for(lambda: (ts := _trials(kube, name)) and ts[0], 30, "the first TuningTrial (valid labels)")
    assert all(len(v) <= 63 and LABEL_VALUE.match(v) for v in trial["metadata"]["labels"].values())
    job = wait_for(lambda: (js := kube.jobs()) and js[0], 30, "its PyTorchJob")
    assert job["metadata"]["labels"]["attune.dev/run"] == label_value(name)
    kube.custom.delete_namespaced_custom_object(*RUNS, name)
    # runs carry no finalizer: the deletion is immediate, and its trials and jobs go with the real garbage collector
    # (tests/k8s/test_real_lifecycle.py; this emulator has none); the operator stops reconciling it
    wait_for(lambda: kube.run(name) is None, 30, "the run to be deleted")
    wait_for(lambda: f"run ml/{name} is gone: its reconcile timer stops" in operator.log(), 30, "its timer to stop")


# -- 4 and 5 ------------------------------------------------------------------------------------------------------

def test_4_a_discovery_outage_is_waited_out_not_a_missing_crd(kube, operator):
    for path in ("/apis/kubeflow.org/v1", "/apis/kubeflow.org/v1/"):
        kube.inject(503, path=path, message="the server is currently unable to handle the request")
    _create(kube, good_run("disc", PROM, None))
    cond = wait_for(lambda: (c := _cond(kube, "disc", "BackendAvailable")) and c, 30, "a BackendAvailable condition")
    assert cond["status"] == "False" and cond["reason"] == "DiscoveryUnavailable", cond
    assert _status(kube, "disc")["phase"] != "Failed" and not kube.jobs()
    kube.clear_faults()
    wait_for(lambda: kube.jobs(), 30, "the trial's job once discovery answers")
    # the step creates the job, then patches its status: the condition follows the job by one write
    wait_for(lambda: _cond(kube, "disc", "BackendAvailable").get("status") == "True", 30, "BackendAvailable=True")


def test_5_a_refused_trial_creation_is_a_condition_a_quota_is_waited_out_and_a_policy_fails_the_run(kube, operator):
    kube.quota_exceeded("tuningtrials", group="attune.dev", quota="objects")
    _create(kube, good_run("quota", PROM, None))
    wait_for(lambda: _cond(kube, "quota", "TrialsAccepted").get("reason") == "QuotaExceeded", 30,
             "TrialsAccepted=False QuotaExceeded")
    assert "exceeded quota" in _cond(kube, "quota", "TrialsAccepted")["message"]
    assert _cond(kube, "quota", "Stalled")["status"] == "True" and _status(kube, "quota")["phase"] != "Failed"
    kube.clear_faults()
    wait_for(lambda: _trials(kube, "quota"), 30, "the trial once the quota frees up")
    wait_for(lambda: _cond(kube, "quota", "TrialsAccepted").get("status") == "True", 30, "TrialsAccepted=True")
    # a cluster policy (an admission webhook of the platform's) refusing the trial: said, then the run fails
    kube.inject(400, verb="create", resource="tuningtrials", reason="BadRequest",
                message='admission webhook "require-team-label.kyverno.svc" denied the request: label team is required')
    _create(kube, good_run("policy", PROM, None))
    st = wait_for(lambda: (s := _status(kube, "policy")).get("phase") == "Failed" and s, 60, "the run to fail")
    assert "label team is required" in st["message"] and "3 times" in st["message"]
    assert _cond(kube, "policy", "TrialsAccepted")["reason"] == "TrialCreateRefused"


# -- 2 ------------------------------------------------------------------------------------------------------------

def test_2_a_pending_deadline_interrupts_uncharged_and_stops_the_run_without_blaming_the_recipe(kube, operator):
    run = good_run("queued", PROM, None)
    run["spec"]["trialTemplate"].setdefault("metadata", {})["labels"] = {"kueue.x-k8s.io/queue-name": "gpus"}
    run["spec"]["budget"]["pendingDeadlineSeconds"] = 10
    _create(kube, run)
    job = wait_for(lambda: (js := kube.jobs()) and js[0], 30, "the trial's job (created suspended for Kueue)")
    assert job["spec"]["runPolicy"]["suspend"] is True
    wait_for(lambda: _cond(kube, "queued", "TrialQueued").get("reason") == "KueueSuspended", 30, "TrialQueued")
    st = wait_for(lambda: (s := _status(kube, "queued")).get("phase") in ("Failed", "Succeeded") and s, 60,
                  "the run to stop")
    records = kube.records("queued")
    assert [r["outcome"] for r in records] == ["interrupted"] and records[0]["charged_hours"] == 0
    assert "stopped waiting for accelerators" in st["message"] and "baseline recipe" not in st["message"]
    assert st["budget"]["hoursUsed"] == 0 and len(kube.trials()) == 1  # never re-created at the back of the queue
    # without an explicit deadline a Kueue trial waits as long as Kueue decides (here a TrainJob's)
    run = good_run("patient", PROM, None)
    pod = run["spec"]["trialTemplate"]["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    run["spec"]["trialTemplate"] = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                                    "metadata": {"labels": {"kueue.x-k8s.io/queue-name": "gpus"}},
                                    "spec": {"runtimeRef": {"name": "torch-distributed"},
                                             "trainer": {"image": pod["containers"][0]["image"], "numNodes": 1}}}
    _create(kube, run)
    assert "pendingDeadlineSeconds" not in kube.run("patient")["spec"]["budget"]  # no default of 3600
    wait_for(lambda: _cond(kube, "patient", "TrialQueued").get("reason") == "KueueSuspended", 30, "TrialQueued")
    assert "of at most" not in _cond(kube, "patient", "TrialQueued")["message"]
    assert [j["spec"]["suspend"] for j in kube.trainjobs()] == [True]
    kube.custom.delete_namespaced_custom_object(*RUNS, "patient")
    # its trial and TrainJob go with the real garbage collector (tests/k8s/test_real_lifecycle.py; none here)
    wait_for(lambda: "run ml/patient is gone: its reconcile timer stops" in operator.log(), 30, "its timer to stop")


def test_2_a_preempted_trial_is_interrupted_not_failed_and_run_again_once_admitted(kube, operator, kubeflow,
                                                                                    prometheus):
    run = good_run("preempted", prometheus.url, None)
    run["spec"]["trialTemplate"].setdefault("metadata", {})["labels"] = {"kueue.x-k8s.io/queue-name": "gpus"}
    run["spec"]["metrics"]["measureSteps"] = 2000  # long enough to be preempted while it runs
    run["spec"]["budget"]["maxFailedTrials"] = 1
    _create(kube, run)
    jobs = ("kubeflow.org", "v1", NS, "pytorchjobs")

    def suspend(name: str, value: bool) -> None:
        kube.custom.patch_namespaced_custom_object(*jobs, name, {"spec": {"runPolicy": {"suspend": value}}})

    first = wait_for(lambda: (js := kube.jobs()) and js[0]["metadata"]["name"], 30, "the suspended job")
    suspend(first, False)  # Kueue admits it (late: whenever quota frees up)
    wait_for(lambda: kubeflow.alive(first), 60, "its pods to run", interval=0.2)
    wait_for(lambda: _cond(kube, "preempted", "TrialQueued").get("status") == "False", 30, "the trial running")
    suspend(first, True)  # Kueue preempts it for a higher-priority workload
    wait_for(lambda: kube.records("preempted"), 60, "the preempted trial's record")
    rec = kube.records("preempted")[0]
    assert rec["outcome"] == "interrupted" and "suspended" in rec["message"], rec
    second = wait_for(lambda: [j["metadata"]["name"] for j in kube.jobs() if j["metadata"]["name"] != first], 60,
                      "the trial run again, queued again")
    assert _status(kube, "preempted")["phase"] not in ("Failed", "Succeeded")  # maxFailedTrials 1: not a failure
    assert not kubeflow.alive(first) and second


# -- 7 and 9 ------------------------------------------------------------------------------------------------------

@pytest.mark.served_crds("before-template-rule")  # the CRD's own rule would refuse the slip
def test_7_an_edit_that_slipped_past_the_webhook_can_be_reverted_and_9_timeouts_are_bounded(kube, operator):
    kube.install_webhooks(operator.webhook_port)
    _create(kube, good_run("slip", PROM, None, suspend=True))
    wait_for(lambda: _status(kube, "slip").get("acceptedSpec"), 30, "the run to start")
    template = copy.deepcopy(kube.run("slip")["spec"]["trialTemplate"])
    containers = template["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"]
    original = containers[0]["image"]
    kube.remove_webhooks()  # the webhook is down (or failurePolicy Ignore): a frozen edit slips through
    containers[0]["image"] = "evil/image:latest"
    kube.custom.patch_namespaced_custom_object(*RUNS, "slip", {"spec": {"trialTemplate": template}})
    wait_for(lambda: _cond(kube, "slip", "SpecAccepted").get("reason") == "FrozenFieldChanged", 30,
             "SpecAccepted=False")
    kube.install_webhooks(operator.webhook_port)
    containers[0]["image"] = "other/image:latest"
    with pytest.raises(client.exceptions.ApiException) as refused:  # another frozen edit: still refused
        kube.custom.patch_namespaced_custom_object(*RUNS, "slip", {"spec": {"trialTemplate": template}})
    assert refused.value.status == 422 and "spec.trialTemplate is frozen" in refused.value.body
    containers[0]["image"] = original
    kube.custom.patch_namespaced_custom_object(*RUNS, "slip", {"spec": {"trialTemplate": template}})  # the revert
    wait_for(lambda: _cond(kube, "slip", "SpecAccepted").get("status") == "True", 30, "SpecAccepted=True again")
    # 9: endpoint timeouts are bounded (a run cannot hold the operator's threads for an hour)
    run = good_run("slow", PROM, None, suspend=True)
    run["spec"]["agent"]["timeoutSeconds"] = 3600
    with pytest.raises(client.exceptions.ApiException) as refused:
        _create(kube, run)
    assert refused.value.status == 422 and "timeoutSeconds" in refused.value.body


# -- 6 ------------------------------------------------------------------------------------------------------------

@pytest.fixture()
def old_kube(tmp_path):
    api = KubeAPI(tmp_path, crds=tuple(sorted(RELEASE_N1.glob("attune.dev_*.yaml"))))
    yield api
    api.close()


def test_6_the_operator_refuses_to_run_against_an_older_served_crd_naming_the_fix(old_kube, tmp_path):
    op = Operator(old_kube, tmp_path, args=("--preflight",))
    with pytest.raises(RuntimeError, match="operator exited"):
        op.start()
    op.stop()
    said = " ".join(op.log().split())  # the console wraps its lines
    assert "error: CRD tuningruns.attune.dev is at schema revision 1, older than this operator's" in said, said[-2000:]
    assert "kubectl apply --server-side --force-conflicts -f crds/" in said and "crds.install=true" in said
    assert "Traceback" not in said  # a clear error, exit 1


def test_6_a_run_and_trials_written_by_release_0_1_0_continue_under_this_release(kube, tmp_path):
    saved = yaml.safe_load((RELEASE_N1 / "status.yaml").read_text())
    old_run, old_trials = saved["run"], saved["trials"]
    run = {"apiVersion": "attune.dev/v1alpha1", "kind": "TuningRun",
           "metadata": {"name": old_run["metadata"]["name"], "namespace": NS}, "spec": old_run["spec"]}
    made = kube.custom.create_namespaced_custom_object(*RUNS, run)
    kube.custom.patch_namespaced_custom_object_status(*RUNS, made["metadata"]["name"], {"status": old_run["status"]})
    for t in old_trials:
        body = {"apiVersion": t["apiVersion"], "kind": t["kind"], "spec": t["spec"],
                "metadata": {**{k: t["metadata"][k] for k in ("name", "labels")}, "namespace": NS,
                             "ownerReferences": [{"apiVersion": "attune.dev/v1alpha1", "kind": "TuningRun",
                                                  "name": made["metadata"]["name"], "uid": made["metadata"]["uid"],
                                                  "controller": True}]}}
        kube.custom.create_namespaced_custom_object(*TRIALS, body)
        kube.custom.patch_namespaced_custom_object_status(*TRIALS, t["metadata"]["name"], {"status": t["status"]})
    before = {r["id"]: r for r in kube.records(made["metadata"]["name"])}
    assert len(before) == 3  # release 0.1.0's records survived the API's pruning under this release's CRD
    op = Operator(kube, tmp_path, args=("--preflight",))  # this release's CRDs are served: the check passes
    op.start()
    try:
        wait_for(lambda: len(_trials(kube, "r")) == 4, 60, "the next trial, created by this release")
        st = _status(kube, "r")
        after = {r["id"]: r for r in kube.records("r")}
        assert {i: after[i] for i in before} == before, "a record written by release 0.1.0 was re-recorded"
        assert st["cursor"]["nextTrial"] == 4 and st["cursor"]["lostTrials"] == 0
        assert _cond(kube, "r", "JournalIntact").get("status") != "False"
        assert st["budget"]["hoursUsed"] == pytest.approx(sum(r["charged_hours"] for r in before.values()), abs=1e-6)
        assert any(d["resource"] == "customresourcedefinitions" and d["allowed"] for d in kube.decisions())
    finally:
        op.stop()
    assert not kube.unexpected_denials()


# -- 11 -----------------------------------------------------------------------------------------------------------

def test_11_only_the_operator_writes_trials_and_deleting_them_gives_no_budget_back(kube, operator):
    kube.install_webhooks(operator.webhook_port)
    _create(kube, good_run("owned", PROM, None))
    trial = wait_for(lambda: (ts := _trials(kube, "owned")) and ts[0], 30, "the first trial")
    name = trial["metadata"]["name"]
    forged = {"status": {"record": {"id": 1, "kind": "baseline", "outcome": "succeeded", "charged_hours": 0.0}}}
    with pytest.raises(client.exceptions.ApiException) as refused:  # a user forging a record
        kube.custom.patch_namespaced_custom_object_status(*TRIALS, name, forged)
    assert refused.value.status == 403 and "only the attune operator" in refused.value.body
    kube.custom.patch_namespaced_custom_object(*TRIALS, name, {"metadata": {"labels": {"team": "a"}}})  # allowed
    ownerless = {"apiVersion": "attune.dev/v1alpha1", "kind": "TuningTrial",
                 "metadata": {"name": "owned-t009", "namespace": NS, "labels": {"attune.dev/run": "owned"}},
                 "spec": {"runRef": "owned", "index": 9, "kind": "baseline"}}
    with pytest.raises(client.exceptions.ApiException) as refused:
        kube.custom.create_namespaced_custom_object(*TRIALS, ownerless)
    assert refused.value.status == 403
    # the operator's own writes pass the same webhook: the trial goes on (its job created, its status written)
    wait_for(lambda: kube.jobs() and (kube.get(*TRIALS[:2], TRIALS[3], name) or {}).get("status", {}).get("jobRef"),
             30, "the operator to write the trial's status through the webhook")


# -- the helpers' own sanity --------------------------------------------------------------------------------------

def test_the_release_0_1_0_fixture_is_what_that_release_wrote():
    """status.yaml came from release 0.1.0's own reconcile (make_status.py says how to regenerate it)."""
    saved = yaml.safe_load((RELEASE_N1 / "status.yaml").read_text())
    assert saved["release"].startswith("0.1.0") and "hoursUsed" not in saved["run"]["status"]["cursor"]
    assert [t["status"]["record"]["kind"] for t in saved["trials"]] == ["baseline", "baseline", "candidate"]


# -- 3 ------------------------------------------------------------------------------------------------------------

def test_3_trials_prometheus_never_scrapes_are_interrupted_and_the_run_says_why(kube, operator, kubeflow, prometheus):
    kubeflow.unscraped = True  # a PodMonitor the cluster's Prometheus does not select
    run = good_run("blind", prometheus.url, None)
    run["spec"]["metrics"]["measureSteps"] = 10
    _create(kube, run)
    st = wait_for(lambda: (s := _status(kube, "blind")).get("phase") in ("Failed", "Succeeded") and s, 240,
                  "the run to stop", interval=0.5)
    records = kube.records("blind")
    assert [r["outcome"] for r in records] == ["interrupted", "interrupted"], [(r["outcome"], r["message"])
                                                                               for r in records]
    assert all(r["message"].startswith("measurement lost") for r in records)
    assert "PodMonitor" in st["message"] and "baseline recipe itself fails" not in st["message"]
    assert _cond(kube, "blind", "MetricsAvailable")["reason"] == "NoSamples"


# -- 8 and 9: two tenants -----------------------------------------------------------------------------------------

class HangingServer:
    """An endpoint that accepts connections and never answers (a tenant's Prometheus behind a dead proxy)."""

    def __init__(self) -> None:
        import socket
        import threading

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.held: list[Any] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        self.sock.settimeout(0.2)
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
                self.held.append(conn)
            except OSError:
                continue

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        for c in self.held:
            c.close()
        self.sock.close()


def _finish_jobs_of(kube: KubeAPI, namespace: str, stop: Any) -> None:
    """Stands in for tenant A's training operator: each of its PyTorchJobs ran and succeeded at once."""
    import time as _time

    while not stop.is_set():
        for job in kube.custom.list_namespaced_custom_object("kubeflow.org", "v1", namespace, "pytorchjobs")["items"]:
            if not (job.get("status") or {}).get("completionTime"):
                now = _time.strftime("%Y-%m-%dT%H:%M:%SZ", _time.gmtime())
                kube.custom.patch_namespaced_custom_object_status(
                    "kubeflow.org", "v1", namespace, "pytorchjobs", job["metadata"]["name"], {"status": {
                        "startTime": now, "completionTime": now,
                        "conditions": [{"type": "Succeeded", "status": "True", "reason": "PyTorchJobSucceeded"}]}})
        stop.wait(0.5)


@pytest.fixture()
def cluster_kube(tmp_path):
    (tmp_path / "api").mkdir()
    api = KubeAPI(tmp_path / "api", install="cluster")
    yield api
    api.close()


def test_8_9_a_tenant_with_slow_endpoints_and_an_ungranted_secret_does_not_hold_up_another(cluster_kube, prometheus,
                                                                                           tmp_path):
    import threading
    import time as _time

    from tests.k8s.harness import FakeTrainingOperator

    kube, slow = cluster_kube, HangingServer()
    kube.expect_denied("get", "secrets")  # tenant A's Secret: the platform granted none there
    op = Operator(kube, tmp_path)
    fake = FakeTrainingOperator(kube, prometheus, tmp_path / "pods")
    stop = threading.Event()
    finisher = threading.Thread(target=_finish_jobs_of, args=(kube, "tenant-a", stop), daemon=True)
    try:
        op.start()
        kube.install_webhooks(op.webhook_port)
        core = client.CoreV1Api(kube.api)
        core.create_namespaced_secret("tenant-a", {"metadata": {"name": "prom"}, "stringData": {"token": "s3cret"}})
        for i in range(6):  # tenant A: six runs whose Prometheus never answers
            run = good_run(f"slow-{i}", slow.url, None)
            run["metadata"]["namespace"] = "tenant-a"
            run["spec"]["metrics"]["timeoutSeconds"] = 30
            kube.custom.create_namespaced_custom_object("attune.dev", "v1alpha1", "tenant-a", "tuningruns", run)
        run = good_run("secret", slow.url, None)
        run["metadata"]["namespace"] = "tenant-a"
        run["spec"]["metrics"]["prometheus"] = {"bearerTokenSecretRef": {"name": "prom", "key": "token"}}
        kube.custom.create_namespaced_custom_object("attune.dev", "v1alpha1", "tenant-a", "tuningruns", run)
        finisher.start()
        wait_for(lambda: len(slow.held) >= 2, 60, "tenant A's steps to hang on its Prometheus")
        # tenant B (namespace ml): a run with real trials finishes, and the webhook answers meanwhile
        t0 = _time.monotonic()
        run = good_run("b", prometheus.url, None)
        run["spec"]["metrics"]["measureSteps"] = 10
        run["spec"]["budget"]["maxTrials"] = 3
        _create(kube, run)
        admitted = _time.monotonic() - t0
        st = wait_for(lambda: (s := _status(kube, "b")).get("phase") in ("Failed", "Succeeded") and s, 300,
                      "tenant B's run to finish", interval=0.5)
        took = _time.monotonic() - t0
        print(f"\ntenant B: admitted in {admitted:.2f} s, finished in {took:.0f} s; tenant A holds "
              f"{len(slow.held)} connections")
        assert st["phase"] == "Succeeded", st.get("message")
        assert admitted < 10  # the webhook's timeoutSeconds
        # tenant A's Secret was never read (its run waits behind its own namespace's hung steps, or is refused)
        assert not any(d["allowed"] for d in kube.decisions() if d["resource"] == "secrets")
        assert _cond_in(kube, "tenant-a", "secret", "MetricsAvailable").get("status") != "True"
    finally:
        stop.set()
        op.stop()
        fake.close()
        slow.close()


def _cond_in(kube: KubeAPI, namespace: str, name: str, ctype: str) -> dict[str, Any]:
    run = kube.custom.get_namespaced_custom_object("attune.dev", "v1alpha1", namespace, "tuningruns", name)
    return next((c for c in (run.get("status") or {}).get("conditions") or [] if c["type"] == ctype), {})


# -- 16: a node clock behind the operator's --------------------------------------------------------------------------

def test_16_a_node_clock_behind_the_operators_does_not_end_a_queued_trial_early(kube, operator, kubeflow, prometheus):
    """The pods start after 65 s in the queue, on a node whose clock is 60 s behind: their startedAt says they ran a
    minute before they did. The running deadline (20 s, +30 s grace) counts on the operator's clock from when it saw
    them run, so the trial is measured, not timed out on arrival."""
    kubeflow.hold = True  # no free accelerators: the pods wait
    kubeflow.node_clock_s = -60.0
    run = good_run("skewed", prometheus.url, None)
    run["spec"]["metrics"]["measureSteps"] = 10
    run["spec"]["budget"].update(trialDeadlineSeconds=20, maxTrials=1)
    _create(kube, run)

    def queued_for() -> float:
        m = re.search(r"queued (\d+) s", _cond(kube, "skewed", "TrialQueued").get("message", ""))
        return float(m.group(1)) if m else 0.0

    wait_for(lambda: queued_for() >= 65, 120, "the trial to have waited 65 s for accelerators", interval=0.5)
    kubeflow.hold = False
    wait_for(lambda: kube.records("skewed"), 120, "the first trial's record", interval=0.5)
    first = kube.records("skewed")[0]
    assert first["outcome"] == "succeeded", (first["outcome"], first["message"])  # not timed_out on arrival


# -- 13: a Megatron template's own command --------------------------------------------------------------------------

def test_13_a_megatron_template_running_a_mounted_script_keeps_its_command(kube, operator):
    from tests.frameworks.megatron.helpers import FIXTURES, changed_lines

    script = (FIXTURES / "train_gpt3_distributed.sh").read_text()
    client.CoreV1Api(kube.api).create_namespaced_config_map(NS, {"metadata": {"name": "megatron-run"},
                                                                 "data": {"run.sh": script}})
    run = good_run("mega", PROM, None, searchSpace=["micro_batch_size"])
    run["spec"]["recipe"] = {"fromTemplate": {"framework": "megatron", "accelerator": "h100-sxm-80gb"}}
    pod = run["spec"]["trialTemplate"]["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    pod["containers"] = [{"name": "pytorch", "image": "nvcr.io/nvidia/pytorch:25.01-py3", "command": ["bash",
                          "/scripts/run.sh"], "args": ["/ckpt", "/tb"], "workingDir": "/workspace/megatron-lm",
                          "volumeMounts": [{"name": "scripts", "mountPath": "/scripts"}]}]
    pod["volumes"] = [{"name": "scripts", "configMap": {"name": "megatron-run"}}]
    kube.install_webhooks(operator.webhook_port)
    _create(kube, run)
    job = wait_for(lambda: (js := kube.jobs()) and js[0], 30, "the baseline's PyTorchJob")
    c = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    assert c["command"] == ["bash", "-c"] and c["args"][1:] == ["/scripts/run.sh", "/ckpt", "/tb"]
    removed, added = changed_lines(script, c["args"][0])
    assert not any("--micro-batch-size" in line for line in removed + added)  # the baseline: flags as they were
    # a script baked into the image (nothing mounted) is refused by the webhook, saying what to do
    pod["volumes"], pod["containers"][0]["volumeMounts"] = [], []
    run["metadata"]["name"] = "baked"
    with pytest.raises(client.exceptions.ApiException) as refused:
        _create(kube, run)
    assert refused.value.status == 422 and "ConfigMap" in refused.value.body
