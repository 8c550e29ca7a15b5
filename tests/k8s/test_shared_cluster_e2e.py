"""The operator on a shared production cluster, end to end: the real operator process (``attune operator run``, the
chart's arguments, a token of its ServiceAccount) against the real control plane (kube-apiserver with its admission
and authorizer, the chart installed with helm, its webhooks called over TLS by URL, the real training operator,
scheduler and garbage collector, the pod runner as the Node), one test per finding of the platform review or a few
findings per test where they share a run. Faults the API server would not show by itself come from
:mod:`tests.k8s.faultproxy` in front of it. Each fails on the operator as it was before the fixes (the finding's
number is in the test's name)."""

from __future__ import annotations

import contextlib
import copy
import re
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from attune.operator.resources import label_value
from tests.k8s import rbac
from tests.k8s.conftest import good_run
from tests.k8s.faultproxy import Answer, Rule, kubeconfig_token
from tests.k8s.harness import NS, ROOT, Operator, crds_before_the_template_rule, free_port, free_port_block, wait_for
from tests.k8s.podrunner import parse_rfc3339
from tests.k8s.realcluster import ControlPlane, Release

pytestmark = [pytest.mark.k8s, pytest.mark.e2e, pytest.mark.slow]

RUNS = ("attune.dev", "v1alpha1", NS, "tuningruns")
TRIALS = ("attune.dev", "v1alpha1", NS, "tuningtrials")
JOBS = ("kubeflow.org", "v1", NS, "pytorchjobs")
PROM = "http://prom.ml.svc:9090"  # a Service of the run's own namespace (nothing serves it: no trial is measured)
RELEASE_N1 = Path(__file__).parent / "data" / "release-0.1.0"
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def _status(rel: Release, name: str) -> dict[str, Any]:
    return (rel.run(name) or {}).get("status") or {}


def _cond(rel: Release, name: str, ctype: str) -> dict[str, Any]:
    return next((c for c in _status(rel, name).get("conditions") or [] if c["type"] == ctype), {})


def _create(rel: Release, run: dict[str, Any]) -> None:
    rel.custom.create_namespaced_custom_object(*RUNS, run)


def _trials(rel: Release, run: str) -> list[dict[str, Any]]:
    return [t for t in rel.trials() if t["spec"]["runRef"] == run]


def _on_the_node(run: dict[str, Any], cpu: str = "2") -> dict[str, Any]:
    """``run``'s trials made to run on the pod runner's Node: the pods share this machine's network, so the run gets
    metrics ports of its own and the training operator's rendezvous port (MASTER_PORT, a port named
    ``pytorchjob-port``) is a free one, not the default another test's trial may hold; ``cpu`` is what each trial
    pod requests of the Node's two."""
    run["spec"]["metrics"]["metricsPort"] = free_port_block(2)
    container = run["spec"]["trialTemplate"]["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"][
        "containers"][0]
    container["ports"] = [{"name": "pytorchjob-port", "containerPort": free_port(), "protocol": "TCP"}]
    container["resources"] = {"requests": {"cpu": cpu, "memory": "1Gi"}, "limits": {"cpu": cpu, "memory": "2Gi"}}
    return run


def _finished(rel: Release, name: str, timeout: float) -> dict[str, Any]:
    return wait_for(lambda: (s := _status(rel, name)).get("phase") in ("Failed", "Succeeded") and s, timeout,
                    f"the run {name} to stop", interval=0.5)


def _kubectl_apply(cp: ControlPlane, *files: Path) -> None:
    """Server-side apply over whatever manager applied them before (CRDs: the README's command)."""
    for f in files:
        cp.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(f))


@contextlib.contextmanager
def _served_crds(cp: ControlPlane, *files: Path) -> Iterator[None]:
    """attune's CRDs served as ``files`` say while the block runs, this repository's again after (the control plane
    is shared by the worker's later tests)."""
    try:
        _kubectl_apply(cp, *files)
        cp.wait_established("tuningruns.attune.dev", "tuningtrials.attune.dev")
        yield
    finally:
        _kubectl_apply(cp, ROOT / "crds")
        cp.wait_established("tuningruns.attune.dev", "tuningtrials.attune.dev")


class Webhooks:
    """The chart's ValidatingWebhookConfiguration, taken down (deleted) and put back as it was (with the caBundle
    the operator patched in): the webhook down, or a platform's failurePolicy Ignore, as an edit slips past it."""

    def __init__(self, rel: Release) -> None:
        self.api = client.AdmissionregistrationV1Api(rel.api)
        self.name = next(d["metadata"]["name"] for d in rel.manifests()
                         if d["kind"] == "ValidatingWebhookConfiguration")
        self.saved: dict[str, Any] | None = None

    def remove(self) -> None:
        obj = self.api.read_validating_webhook_configuration(self.name)
        self.saved = self.api.api_client.sanitize_for_serialization(obj)
        self.api.delete_validating_webhook_configuration(self.name)

    def restore(self) -> None:
        if self.saved is None:
            return
        body = copy.deepcopy(self.saved)
        body["metadata"] = {k: v for k, v in body["metadata"].items() if k in ("name", "labels", "annotations")}
        self.api.create_validating_webhook_configuration(body)
        self.saved = None


def _past_removed_webhooks(write: Callable[[], Any], what: str) -> Any:
    """``write``, once the API server has dropped the webhook configuration just deleted: its informer lags the
    delete by a moment, during which the webhook still refuses the write (or, its server down, cannot be called)."""

    def attempt() -> tuple[Any] | None:
        try:
            return (write(),)
        except client.exceptions.ApiException as err:
            if "webhook" in str(err.body or ""):
                return None
            raise

    return wait_for(attempt, 30, what, interval=0.2)[0]


# -- 1 ------------------------------------------------------------------------------------------------------------

def test_1_a_run_with_a_253_character_name_runs_its_trials_and_can_be_deleted(release, real_operator):
    name = "a" * 60 + "." + "b" * 192
    assert len(name) == 253
    _create(release, good_run(name, PROM, None))
    trial = wait_for(lambda: (ts := _trials(release, name)) and ts[0], 60, "the first TuningTrial (valid labels)")
    assert all(len(v) <= 63 and LABEL_VALUE.match(v) for v in trial["metadata"]["labels"].values())
    job = wait_for(lambda: (js := release.jobs()) and js[0], 60, "its PyTorchJob")
    assert job["metadata"]["labels"]["attune.dev/run"] == label_value(name)
    release.custom.delete_namespaced_custom_object(*RUNS, name)
    # runs carry no finalizer: the deletion is immediate; the real garbage collector takes its trials and jobs
    # (their ownerReferences name the run by uid, whatever its name's length), and the operator stops reconciling it
    wait_for(lambda: release.run(name) is None, 60, "the run to be deleted")
    wait_for(lambda: not release.trials() and not release.jobs(), 120, "the collector to take its trials and jobs")
    wait_for(lambda: f"run ml/{name} is gone: its reconcile timer stops" in real_operator.log(), 60,
             "its timer to stop")


# -- 4 and 5 ------------------------------------------------------------------------------------------------------

def test_4_a_discovery_outage_is_waited_out_not_a_missing_crd(release, proxy, proxied_operator):
    token = kubeconfig_token(release.operator_kubeconfig)
    outage = proxy.add(Rule(Answer(503), method="GET", path=r"^/apis/kubeflow\.org/v1/?$", token=token))
    proxied_operator.start()
    _create(release, good_run("disc", PROM, None))
    cond = wait_for(lambda: (c := _cond(release, "disc", "BackendAvailable")) and c, 60, "a BackendAvailable condition")
    assert cond["status"] == "False" and cond["reason"] == "DiscoveryUnavailable", cond
    assert outage.hits >= 1 and _status(release, "disc")["phase"] != "Failed" and not release.jobs()
    proxy.clear()
    wait_for(release.jobs, 60, "the trial's job once discovery answers")
    # the step creates the job, then patches its status: the condition follows the job by one write
    wait_for(lambda: _cond(release, "disc", "BackendAvailable").get("status") == "True", 60, "BackendAvailable=True")


class PolicyWebhook:
    """A platform's admission policy (as a Kyverno policy would be): a real validating webhook, served here over TLS
    with a certificate of the control plane's CA and registered by URL, that refuses the TuningTrials of run ``run``
    without a ``team`` label. The API server calls it and words its refusal itself."""

    NAME = "require-team-label.kyverno.svc"
    MESSAGE = "label team is required"

    def __init__(self, cp: ControlPlane, tmp: Path, run: str) -> None:
        import base64
        import datetime as dt
        import json
        import ssl
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        from attune.operator import certs

        pki = cp.state / "pki"
        crt, key = certs.new_serving((pki / "ca.crt").read_bytes(), (pki / "ca.key").read_bytes(), ["localhost"],
                                     dt.datetime.now(dt.UTC), ip_addresses=["127.0.0.1"])
        tmp.mkdir(parents=True, exist_ok=True)
        (tmp / "tls.crt").write_bytes(crt)
        (tmp / "tls.key").write_bytes(key)
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.load_cert_chain(tmp / "tls.crt", tmp / "tls.key")
        self.reviews: list[dict[str, Any]] = []
        policy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
                pass

            def do_POST(self) -> None:  # noqa: N802 - the base class's name
                review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                request = review["request"]
                policy.reviews.append(request)
                labels = (request.get("object") or {}).get("metadata", {}).get("labels") or {}
                allowed = "team" in labels
                body = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": {
                    "uid": request["uid"], "allowed": allowed,
                    **({} if allowed else {"status": {"message": PolicyWebhook.MESSAGE}})}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        threading.Thread(target=self.server.serve_forever, daemon=True, name="policy-webhook").start()
        self.adm = client.AdmissionregistrationV1Api(cp.api)
        self.config = f"test-require-team-label-{run}"
        self.adm.create_validating_webhook_configuration({"metadata": {"name": self.config}, "webhooks": [{
            "name": self.NAME, "admissionReviewVersions": ["v1"], "sideEffects": "None", "failurePolicy": "Fail",
            "timeoutSeconds": 5, "objectSelector": {"matchLabels": {"attune.dev/run": run}},
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": NS}},
            "rules": [{"apiGroups": ["attune.dev"], "apiVersions": ["v1alpha1"], "operations": ["CREATE"],
                       "resources": ["tuningtrials"], "scope": "Namespaced"}],
            "clientConfig": {"url": f"https://127.0.0.1:{self.server.server_address[1]}/validate",
                             "caBundle": base64.b64encode((pki / "ca.crt").read_bytes()).decode()}}]})
        # until the API server calls it: a dry run of such a trial (refused, by this policy or by attune's own)
        probe = {"apiVersion": "attune.dev/v1alpha1", "kind": "TuningTrial",
                 "metadata": {"name": f"{run}-probe", "namespace": NS, "labels": {"attune.dev/run": run}},
                 "spec": {"runRef": run, "index": 99, "kind": "baseline"}}

        def called() -> bool:
            with contextlib.suppress(client.exceptions.ApiException):
                cp.custom.create_namespaced_custom_object(*TRIALS, probe, dry_run="All")
            return bool(self.reviews)

        wait_for(called, 30, "the API server to call the policy webhook", interval=0.2)
        self.probes = len(self.reviews)

    def close(self) -> None:
        with contextlib.suppress(client.exceptions.ApiException):
            self.adm.delete_validating_webhook_configuration(self.config)
        self.server.shutdown()
        self.server.server_close()


def test_5_a_refused_trial_creation_is_a_condition_a_quota_is_waited_out_and_a_policy_fails_the_run(
        release, real_operator, tmp_path):
    cp = release.cp
    # a real ResourceQuota allowing no TuningTrial: the API server's quota admission refuses the operator's create
    cp.core.create_namespaced_resource_quota(NS, {"metadata": {"name": "objects"},
                                                  "spec": {"hard": {"count/tuningtrials.attune.dev": "0"}}})
    wait_for(lambda: cp.core.read_namespaced_resource_quota("objects", NS).status.hard, 60,
             "the quota controller to fill in the quota's status")
    _create(release, good_run("quota", PROM, None))
    wait_for(lambda: _cond(release, "quota", "TrialsAccepted").get("reason") == "QuotaExceeded", 60,
             "TrialsAccepted=False QuotaExceeded")
    said = _cond(release, "quota", "TrialsAccepted")["message"]
    # the real quota admission's own words, a 403 Forbidden: "exceeded quota: objects, requested: ..., limited: ...",
    # or, until the quota controller has counted the custom resource (its monitor of a CRD's objects starts with its
    # discovery resync; the quota's usage is counted at the next sync), "status unknown for quota: objects, resources:
    # ...; waiting for quota". Either is the quota's refusal, waited out alike
    assert re.search(r"(exceeded quota|status unknown for quota): objects", said), said
    assert "count/tuningtrials.attune.dev" in said, said
    # waited out, not failed: Reconciling names the quota, Stalled (failed, to kstatus readers) stays False
    assert _cond(release, "quota", "Stalled")["status"] == "False" and _status(release, "quota")["phase"] != "Failed"
    assert _cond(release, "quota", "Reconciling")["reason"] == "QuotaExceeded"
    cp.core.delete_namespaced_resource_quota("objects", NS)  # the quota frees up
    wait_for(lambda: _trials(release, "quota"), 60, "the trial once the quota frees up")
    wait_for(lambda: _cond(release, "quota", "TrialsAccepted").get("status") == "True", 60, "TrialsAccepted=True")
    # a cluster policy (an admission webhook of the platform's) refusing the trial: said, then the run fails
    policy = PolicyWebhook(cp, tmp_path / "policy", "policy")
    try:
        _create(release, good_run("policy", PROM, None))
        st = _finished(release, "policy", 120)
    finally:
        policy.close()
    assert st["phase"] == "Failed" and "label team is required" in st["message"] and "3 times" in st["message"], st
    # the API server's wording of a webhook's denial (its code: 400, the webhook having set none)
    assert f'admission webhook "{PolicyWebhook.NAME}" denied the request' in st["message"], st["message"]
    assert _cond(release, "policy", "TrialsAccepted")["reason"] == "TrialCreateRefused"
    operator_calls = policy.reviews[policy.probes:]
    assert len(operator_calls) >= 3 and all(r["userInfo"]["username"] == rbac.OPERATOR_USER
                                            for r in operator_calls), [r["userInfo"] for r in operator_calls]


# -- 2 ------------------------------------------------------------------------------------------------------------

def test_2_a_pending_deadline_interrupts_uncharged_and_stops_the_run_without_blaming_the_recipe(release,
                                                                                                real_operator):
    run = good_run("queued", PROM, None)
    run["spec"]["trialTemplate"].setdefault("metadata", {})["labels"] = {"kueue.x-k8s.io/queue-name": "gpus"}
    run["spec"]["budget"]["pendingDeadlineSeconds"] = 10
    _create(release, run)
    job = wait_for(lambda: (js := release.jobs()) and js[0], 60, "the trial's job (created suspended for Kueue)")
    assert job["spec"]["runPolicy"]["suspend"] is True
    wait_for(lambda: _cond(release, "queued", "TrialQueued").get("reason") == "KueueSuspended", 60, "TrialQueued")
    st = _finished(release, "queued", 120)
    records = release.records("queued")
    assert [r["outcome"] for r in records] == ["interrupted"] and records[0]["charged_hours"] == 0
    assert "stopped waiting for accelerators" in st["message"] and "baseline recipe" not in st["message"]
    assert st["budget"]["hoursUsed"] == 0 and len(release.trials()) == 1  # never re-created at the back of the queue
    # without an explicit deadline a Kueue trial waits as long as Kueue decides. (The emulator showed this with a
    # Kubeflow Trainer TrainJob; its CRD is not served here, so with the PyTorchJob: the deadline's default is the
    # same for both backends.)
    run = good_run("patient", PROM, None)
    run["spec"]["trialTemplate"].setdefault("metadata", {})["labels"] = {"kueue.x-k8s.io/queue-name": "gpus"}
    _create(release, run)
    assert "pendingDeadlineSeconds" not in release.run("patient")["spec"]["budget"]  # no default of 3600
    wait_for(lambda: _cond(release, "patient", "TrialQueued").get("reason") == "KueueSuspended", 60, "TrialQueued")
    assert "of at most" not in _cond(release, "patient", "TrialQueued")["message"]
    patient = [j for j in release.jobs() if j["metadata"]["labels"]["attune.dev/run"] == "patient"]
    assert [j["spec"]["runPolicy"]["suspend"] for j in patient] == [True]
    release.custom.delete_namespaced_custom_object(*RUNS, "patient")
    wait_for(lambda: not _trials(release, "patient"), 120, "the collector to take its trial and job")
    wait_for(lambda: "run ml/patient is gone: its reconcile timer stops" in real_operator.log(), 60,
             "its timer to stop")


def test_2_a_preempted_trial_is_interrupted_not_failed_and_run_again_once_admitted(training_operator, release,
                                                                                    real_operator, pod_metrics,
                                                                                    prometheus):
    """Kueue admits a trial's job late (unsuspends it), then preempts it for a higher-priority workload (suspends it
    again): the real training operator deletes its pods, and the operator records the trial interrupted, not
    failed, and runs it again, queued again."""
    run = _on_the_node(good_run("preempted", prometheus.url, None))
    run["spec"]["trialTemplate"].setdefault("metadata", {})["labels"] = {"kueue.x-k8s.io/queue-name": "gpus"}
    # long enough to be preempted while it runs (the webhook refuses more than the 1,000 steps the trainer exports)
    run["spec"]["metrics"]["measureSteps"] = 990
    run["spec"]["budget"]["maxFailedTrials"] = 1
    _create(release, run)

    def suspend(name: str, value: bool) -> None:
        release.custom.patch_namespaced_custom_object(*JOBS, name, {"spec": {"runPolicy": {"suspend": value}}})

    first = wait_for(lambda: (js := release.jobs()) and js[0]["metadata"]["name"], 60, "the suspended job")
    assert not release.cp.core.list_namespaced_pod(NS, label_selector=f"training.kubeflow.org/job-name={first}").items
    suspend(first, False)  # Kueue admits it (late: whenever quota frees up)
    wait_for(lambda: release.master_running(first), 480, "its pods to run", interval=0.5)  # loaded CI: > 180 s
    wait_for(lambda: _cond(release, "preempted", "TrialQueued").get("status") == "False", 60, "the trial running")
    suspend(first, True)  # Kueue preempts it for a higher-priority workload
    wait_for(lambda: release.records("preempted"), 120, "the preempted trial's record")
    rec = release.records("preempted")[0]
    assert rec["outcome"] == "interrupted" and "suspended" in rec["message"], rec
    second = wait_for(lambda: [j["metadata"]["name"] for j in release.jobs() if j["metadata"]["name"] != first], 120,
                      "the trial run again, queued again")
    assert _status(release, "preempted")["phase"] not in ("Failed", "Succeeded")  # maxFailedTrials 1: not a failure
    # the training operator took the suspended job's pods away (the pod runner stopped its trainer)
    wait_for(lambda: not release.cp.core.list_namespaced_pod(
        NS, label_selector=f"training.kubeflow.org/job-name={first}").items, 120, "the preempted job's pods to go")
    assert second


# -- 7 and 9 ------------------------------------------------------------------------------------------------------

def test_7_an_edit_that_slipped_past_the_webhook_can_be_reverted_and_9_timeouts_are_bounded(release, real_operator,
                                                                                             tmp_path):
    # the CRD's own rule would refuse the slip: served as before that rule (the webhook then the only guard)
    hooks = Webhooks(release)
    with _served_crds(release.cp, *crds_before_the_template_rule(tmp_path)):
        try:
            _create(release, good_run("slip", PROM, None, suspend=True))
            wait_for(lambda: _status(release, "slip").get("acceptedSpec"), 60, "the run to start")
            template = copy.deepcopy(release.run("slip")["spec"]["trialTemplate"])
            containers = template["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"]
            original = containers[0]["image"]
            hooks.remove()  # the webhook is down (or failurePolicy Ignore): a frozen edit slips through
            containers[0]["image"] = "evil/image:latest"
            _past_removed_webhooks(lambda: release.custom.patch_namespaced_custom_object(
                *RUNS, "slip", {"spec": {"trialTemplate": template}}), "the frozen edit to slip past the webhook")
            wait_for(lambda: _cond(release, "slip", "SpecAccepted").get("reason") == "FrozenFieldChanged", 60,
                     "SpecAccepted=False")
            hooks.restore()
            containers[0]["image"] = "other/image:latest"

            def refused_edit(dry_run: str | None = None) -> client.exceptions.ApiException | None:
                try:
                    release.custom.patch_namespaced_custom_object(*RUNS, "slip", {"spec": {"trialTemplate": template}},
                                                                  dry_run=dry_run)
                except client.exceptions.ApiException as err:
                    return err
                return None

            # the API server reads the restored configuration from its informer: a dry run (which the webhook judges
            # too, and which changes nothing) until it does
            wait_for(lambda: refused_edit("All"), 30, "the restored webhook to judge the edits again")
            refused = refused_edit()  # another frozen edit: still refused
            assert refused is not None and refused.status == 422 and "spec.trialTemplate is frozen" in refused.body, refused.body
            containers[0]["image"] = original
            release.custom.patch_namespaced_custom_object(*RUNS, "slip", {"spec": {"trialTemplate": template}})
            wait_for(lambda: _cond(release, "slip", "SpecAccepted").get("status") == "True", 60,
                     "SpecAccepted=True again")
        finally:
            hooks.restore()
    # 9: endpoint timeouts are bounded (a run cannot hold the operator's threads for an hour)
    run = good_run("slow", PROM, None, suspend=True)
    run["spec"]["agent"]["timeoutSeconds"] = 3600
    with pytest.raises(client.exceptions.ApiException) as refused:
        _create(release, run)
    assert refused.value.status == 422 and "timeoutSeconds" in refused.value.body


# -- 6 ------------------------------------------------------------------------------------------------------------

def test_6_the_operator_refuses_to_run_against_an_older_served_crd_naming_the_fix(release, tmp_path):
    op = Operator(release, tmp_path, args=release.operator_args())  # --preflight
    with _served_crds(release.cp, *sorted(RELEASE_N1.glob("attune.dev_*.yaml"))):
        with pytest.raises(RuntimeError, match="operator exited"):
            op.start()
        op.stop()
    said = " ".join(op.log().split())  # the console wraps its lines
    assert "error: CRD tuningruns.attune.dev is at schema revision 1, older than this operator's" in said, said[-2000:]
    assert "kubectl apply --server-side --force-conflicts -f crds/" in said and "crds.install=true" in said
    assert "Traceback" not in said  # a clear error, exit 1
    assert not release.unexpected_denials()


def test_6_a_run_and_trials_written_by_release_0_1_0_continue_under_this_release(release, tmp_path):
    saved = yaml.safe_load((RELEASE_N1 / "status.yaml").read_text())
    old_run, old_trials = saved["run"], saved["trials"]
    run = {"apiVersion": "attune.dev/v1alpha1", "kind": "TuningRun",
           "metadata": {"name": old_run["metadata"]["name"], "namespace": NS}, "spec": old_run["spec"]}
    # release 0.1.0's objects, as its operator left them (this release's webhook, which lets only its operator write
    # trials, was not there yet: taken down while they are written)
    hooks = Webhooks(release)
    hooks.remove()
    try:
        made = _past_removed_webhooks(lambda: release.custom.create_namespaced_custom_object(*RUNS, run),
                                      "release 0.1.0's run to be written")
        release.custom.patch_namespaced_custom_object_status(*RUNS, made["metadata"]["name"],
                                                             {"status": old_run["status"]})
        for t in old_trials:
            body = {"apiVersion": t["apiVersion"], "kind": t["kind"], "spec": t["spec"],
                    "metadata": {**{k: t["metadata"][k] for k in ("name", "labels")}, "namespace": NS,
                                 "ownerReferences": [{"apiVersion": "attune.dev/v1alpha1", "kind": "TuningRun",
                                                      "name": made["metadata"]["name"],
                                                      "uid": made["metadata"]["uid"], "controller": True}]}}
            release.custom.create_namespaced_custom_object(*TRIALS, body)
            release.custom.patch_namespaced_custom_object_status(*TRIALS, t["metadata"]["name"],
                                                                 {"status": t["status"]})
    finally:
        hooks.restore()
    before = {r["id"]: r for r in release.records(made["metadata"]["name"])}
    assert len(before) == 3  # release 0.1.0's records survived the API server's pruning under this release's CRD
    op = Operator(release, tmp_path, args=release.operator_args())  # --preflight passes
    op.start()
    try:
        wait_for(lambda: len(_trials(release, "r")) == 4, 90, "the next trial, created by this release")
        st = _status(release, "r")
        after = {r["id"]: r for r in release.records("r")}
        assert {i: after[i] for i in before} == before, "a record written by release 0.1.0 was re-recorded"
        assert st["cursor"]["nextTrial"] == 4 and st["cursor"]["lostTrials"] == 0
        assert _cond(release, "r", "JournalIntact").get("status") != "False"
        assert st["budget"]["hoursUsed"] == pytest.approx(sum(r["charged_hours"] for r in before.values()), abs=1e-6)
        assert any(d["resource"] == "customresourcedefinitions" and d["allowed"] for d in release.decisions())
    finally:
        op.stop()
    assert not release.unexpected_denials()


# -- 11 -----------------------------------------------------------------------------------------------------------

def test_11_only_the_operator_writes_trials_and_deleting_them_gives_no_budget_back(release, real_operator):
    _create(release, good_run("owned", PROM, None))
    trial = wait_for(lambda: (ts := _trials(release, "owned")) and ts[0], 60, "the first trial")
    name = trial["metadata"]["name"]
    forged = {"status": {"record": {"id": 1, "kind": "baseline", "outcome": "succeeded", "charged_hours": 0.0}}}
    with pytest.raises(client.exceptions.ApiException) as refused:  # a user (here the cluster's admin) forging one
        release.custom.patch_namespaced_custom_object_status(*TRIALS, name, forged)
    assert refused.value.status == 403 and "only the attune operator" in refused.value.body, refused.value.body
    release.custom.patch_namespaced_custom_object(*TRIALS, name, {"metadata": {"labels": {"team": "a"}}})  # allowed
    ownerless = {"apiVersion": "attune.dev/v1alpha1", "kind": "TuningTrial",
                 "metadata": {"name": "owned-t009", "namespace": NS, "labels": {"attune.dev/run": "owned"}},
                 "spec": {"runRef": "owned", "index": 9, "kind": "baseline"}}
    with pytest.raises(client.exceptions.ApiException) as refused:
        release.custom.create_namespaced_custom_object(*TRIALS, ownerless)
    assert refused.value.status == 403, refused.value.body
    # the operator's own writes pass the same webhook: the trial goes on (its job created, its status written)
    wait_for(lambda: release.jobs() and (release.get(*TRIALS[:2], TRIALS[3], name) or {}).get("status", {}).get(
        "jobRef"), 60, "the operator to write the trial's status through the webhook")


# -- the helpers' own sanity --------------------------------------------------------------------------------------

def test_the_release_0_1_0_fixture_is_what_that_release_wrote():
    """status.yaml came from release 0.1.0's own reconcile (make_status.py says how to regenerate it)."""
    saved = yaml.safe_load((RELEASE_N1 / "status.yaml").read_text())
    assert saved["release"].startswith("0.1.0") and "hoursUsed" not in saved["run"]["status"]["cursor"]
    assert [t["status"]["record"]["kind"] for t in saved["trials"]] == ["baseline", "baseline", "candidate"]


# -- 3 ------------------------------------------------------------------------------------------------------------

def test_3_trials_prometheus_never_scrapes_are_interrupted_and_the_run_says_why(training_operator, release,
                                                                               real_operator, prometheus):
    """The trials run (the real training operator's pods on the Node) and serve their metrics, but no discovery
    hands them to this Prometheus (no ``pod_metrics``: as a PodMonitor the cluster's Prometheus does not select)."""
    run = _on_the_node(good_run("blind", prometheus.url, None))
    run["spec"]["metrics"]["measureSteps"] = 10
    _create(release, run)
    st = _finished(release, "blind", 480)
    records = release.records("blind")
    assert [r["outcome"] for r in records] == ["interrupted", "interrupted"], [(r["outcome"], r["message"])
                                                                               for r in records]
    assert all(r["message"].startswith("measurement lost") for r in records)
    assert "PodMonitor" in st["message"] and "baseline recipe itself fails" not in st["message"]
    assert _cond(release, "blind", "MetricsAvailable")["reason"] == "NoSamples"


# -- 8 and 9: two tenants -----------------------------------------------------------------------------------------

class HangingServer:
    """An endpoint that accepts connections and never answers (a tenant's Prometheus behind a dead proxy)."""

    def __init__(self) -> None:
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


def _cond_in(rel: Release, namespace: str, name: str, ctype: str) -> dict[str, Any]:
    run = rel.custom.get_namespaced_custom_object("attune.dev", "v1alpha1", namespace, "tuningruns", name)
    return next((c for c in (run.get("status") or {}).get("conditions") or [] if c["type"] == ctype), {})


@pytest.mark.parametrize("release", ["cluster"], indirect=True)
def test_8_9_a_tenant_with_slow_endpoints_and_an_ungranted_secret_does_not_hold_up_another(
        training_operator, release, real_operator, pod_metrics, prometheus):
    """Cluster mode. Tenant A (a namespace of its own) has six runs whose Prometheus never answers (their trials ran
    and succeeded: the operator's steps hang reading their metrics) and one whose Prometheus token is in a Secret the
    platform granted the operator no read of. Tenant B's run (namespace ml) still finishes, and the webhook answers
    its create within its timeout meanwhile."""
    import time as _time

    cp, slow = release.cp, HangingServer()
    release.expect_denied("get", "secrets")  # tenant A's Secret: the platform granted none there
    tenant_a = cp.namespace("tenant-a")
    try:
        release.onboard(tenant_a)  # a tenant namespace of the cluster-wide install (ml is one by its values)
        # deleting tenant A's namespace takes its RoleBinding before its runs: the operator's last steps there are
        # refused (a trial's list, a job's get: a whole CI run saw both), as a namespaced install's are in a namespace
        # being deleted
        release.deleting(tenant_a)
        cp.core.create_namespaced_secret(tenant_a, {"metadata": {"name": "prom"}, "stringData": {"token": "s3cret"}})
        # tenant A's trials are short and ask little of the Node (tenant B's trial must fit beside them)
        for i in range(6):  # six runs whose Prometheus never answers
            run = _on_the_node(good_run(f"slow-{i}", slow.url, None), cpu="100m")
            run["metadata"]["namespace"] = tenant_a
            run["spec"]["metrics"].update(timeoutSeconds=30, measureSteps=4)
            release.custom.create_namespaced_custom_object("attune.dev", "v1alpha1", tenant_a, "tuningruns", run)
        run = _on_the_node(good_run("secret", slow.url, None), cpu="100m")
        run["metadata"]["namespace"] = tenant_a
        run["spec"]["metrics"].update(measureSteps=4, prometheus={"bearerTokenSecretRef": {"name": "prom",
                                                                                           "key": "token"}})
        release.custom.create_namespaced_custom_object("attune.dev", "v1alpha1", tenant_a, "tuningruns", run)
        wait_for(lambda: len(slow.held) >= 2, 600, "tenant A's steps to hang on its Prometheus", interval=1)
        # tenant B (namespace ml): a run with real trials finishes, and the webhook answers meanwhile
        t0 = _time.monotonic()
        run = _on_the_node(good_run("b", prometheus.url, None), cpu="500m")
        run["spec"]["metrics"]["measureSteps"] = 10
        run["spec"]["budget"]["maxTrials"] = 3
        _create(release, run)
        admitted = _time.monotonic() - t0
        st = _finished(release, "b", 600)
        took = _time.monotonic() - t0
        print(f"\ntenant B: admitted in {admitted:.2f} s, finished in {took:.0f} s; tenant A holds "
              f"{len(slow.held)} connections")
        assert st["phase"] == "Succeeded", st.get("message")
        assert admitted < 10  # the webhook's timeoutSeconds: a hung tenant's steps do not hold the webhook
        # tenant A's Secret was never read (its run waits behind its own namespace's hung steps, or is refused)
        assert not any(d["allowed"] for d in release.decisions() if d["resource"] == "secrets"
                       and d["namespace"] == tenant_a)
        assert _cond_in(release, tenant_a, "secret", "MetricsAvailable").get("status") != "True"
    finally:
        slow.close()
        cp.delete_namespace(tenant_a, timeout=240)


# -- 16: a node clock behind the operator's --------------------------------------------------------------------------

def test_16_a_node_clock_behind_the_operators_does_not_end_a_queued_trial_early(training_operator, release,
                                                                                real_operator, pod_metrics,
                                                                                prometheus):
    """The pods start after 65 s in the queue, on a node whose clock is 60 s behind: their startedAt says they ran a
    minute before they did. The running deadline (20 s, +30 s grace) counts on the operator's clock from when it saw
    them run, so the trial is measured, not timed out on arrival.

    The queue: the trial pod asks for an accelerator (``nvidia.com/gpu``) the Node does not have, so the real
    scheduler leaves it Pending (Unschedulable); one frees up when the Node advertises one (as a device plugin
    would: its status's capacity), and the scheduler binds the pod. The Node's clock: the pod runner's."""
    cp = release.cp
    run = _on_the_node(good_run("skewed", prometheus.url, None), cpu="1")
    run["spec"]["metrics"]["measureSteps"] = 10
    run["spec"]["budget"].update(trialDeadlineSeconds=20, maxTrials=1)
    resources = run["spec"]["trialTemplate"]["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"][
        "containers"][0]["resources"]
    for kind in ("requests", "limits"):
        resources[kind]["nvidia.com/gpu"] = "1"
    # the scheduler fits pods to allocatable, which a kubelet derives from capacity (the pod runner: the same)
    gpu = [f"/status/{field}/nvidia.com~1gpu" for field in ("capacity", "allocatable")]
    try:
        cp.set_node_clock(-60.0)
        _create(release, run)

        def queued_for() -> float:
            m = re.search(r"queued (\d+) s", _cond(release, "skewed", "TrialQueued").get("message", ""))
            return float(m.group(1)) if m else 0.0

        wait_for(lambda: queued_for() >= 65, 180, "the trial to have waited 65 s for accelerators", interval=0.5)
        assert "Unschedulable" in _cond(release, "skewed", "TrialQueued")["message"]
        # an accelerator frees up: the Node advertises one (a JSON patch of its status, as a device plugin's)
        cp.core.patch_node_status(cp.node, [{"op": "add", "path": p, "value": "1"} for p in gpu],
                                  _content_type="application/json-patch+json")
        wait_for(lambda: release.records("skewed"), 240, "the first trial's record", interval=0.5)
        first = release.records("skewed")[0]
        assert first["outcome"] == "succeeded", (first["outcome"], first["message"])  # not timed_out on arrival
        # the Node's clock showed through: the pods' startedAt put their start a minute before the operator saw them
        # run, beyond the deadline and its grace (50 s) had the deadline counted from it
        seen = _trials(release, "skewed")[0]["status"]
        assert parse_rfc3339(seen["runningObserved"]) - parse_rfc3339(seen["runningSince"]) > 50, seen
    finally:
        cp.set_node_clock(0.0)
        node = cp.core.read_node(cp.node)
        held = [p for p, m in zip(gpu, (node.status.capacity, node.status.allocatable), strict=True)
                if "nvidia.com/gpu" in (m or {})]
        if held:
            cp.core.patch_node_status(cp.node, [{"op": "remove", "path": p} for p in held],
                                      _content_type="application/json-patch+json")


# -- 13: a Megatron template's own command --------------------------------------------------------------------------

def test_13_a_megatron_template_running_a_mounted_script_keeps_its_command(release, real_operator):
    from tests.frameworks.megatron.helpers import FIXTURES, changed_lines

    script = (FIXTURES / "train_gpt3_distributed.sh").read_text()
    release.cp.core.create_namespaced_config_map(NS, {"metadata": {"name": "megatron-run"},
                                                      "data": {"run.sh": script}})
    run = good_run("mega", PROM, None, searchSpace=["micro_batch_size"])
    run["spec"]["recipe"] = {"fromTemplate": {"framework": "megatron", "accelerator": "h100-sxm-80gb"}}
    pod = run["spec"]["trialTemplate"]["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    pod["containers"] = [{"name": "pytorch", "image": "nvcr.io/nvidia/pytorch:25.01-py3", "command": ["bash",
                          "/scripts/run.sh"], "args": ["/ckpt", "/tb"], "workingDir": "/workspace/megatron-lm",
                          "volumeMounts": [{"name": "scripts", "mountPath": "/scripts"}]}]
    pod["volumes"] = [{"name": "scripts", "configMap": {"name": "megatron-run"}}]
    _create(release, run)
    job = wait_for(lambda: (js := release.jobs()) and js[0], 60, "the baseline's PyTorchJob")
    c = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    assert c["command"] == ["bash", "-c"] and c["args"][1:] == ["/scripts/run.sh", "/ckpt", "/tb"]
    removed, added = changed_lines(script, c["args"][0])
    assert not any("--micro-batch-size" in line for line in removed + added)  # the baseline: flags as they were
    # a script baked into the image (nothing mounted) is refused by the webhook, saying what to do
    pod["volumes"], pod["containers"][0]["volumeMounts"] = [], []
    run["metadata"]["name"] = "baked"
    with pytest.raises(client.exceptions.ApiException) as refused:
        _create(release, run)
    assert refused.value.status == 422 and "ConfigMap" in refused.value.body
