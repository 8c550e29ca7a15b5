"""Admission on the real API server, where the emulator had none: the webhook's namespace scope and its timeout and
failure policy as the chart configures them, and the built-in admission plugins that refuse a trial's pods after the
operator's own requests succeeded (LimitRanger's maximum, PodSecurity's ``restricted`` level). The training operator
creates those pods, so only it meets the refusal: the PyTorchJob gets no status and no pod, only a FailedCreatePod
Warning event; the run must say so while its trial waits and when it stops waiting."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from tests.k8s.conftest import good_run
from tests.k8s.harness import NS, ROOT, Operator, wait_for
from tests.k8s.realcluster import Release
from tests.k8s.realcluster_kubeflow import TrainingOperator

pytestmark = [pytest.mark.k8s, pytest.mark.slow]
RUNS = ("attune.dev", "v1alpha1")
UNSERVED = "http://prom.ml.svc:9090"  # a Service of the run's namespace nobody serves: nothing is measured here


def _bad_run(namespace: str) -> dict:
    bad = yaml.safe_load((ROOT / "examples" / "tuningrun-bad.yaml").read_text())
    bad["metadata"]["namespace"] = namespace
    return bad


def _refusal(err: client.exceptions.ApiException) -> str:
    return str(json.loads(err.body)["message"])


def test_a_namespaced_release_gates_its_own_namespaces_only(release: Release, real_operator: Operator) -> None:
    """The chart's namespaceSelector: the webhook judges runs of the namespaces the operator watches (the bad example
    refused in ``ml``), and the API server never calls it for another namespace's (admitted on the CRD's schema and
    rules alone): with failurePolicy Fail, an operator that is down blocks only its own tenants."""
    cp = release.cp
    with pytest.raises(client.exceptions.ApiException) as err:
        cp.custom.create_namespaced_custom_object(*RUNS, NS, "tuningruns", _bad_run(NS))
    assert 'admission webhook "validate-run.attune.dev" denied the request' in _refusal(err.value)
    other = cp.namespace("other")
    try:
        calls_before = real_operator.log().count("POST /validate-run")
        created = cp.custom.create_namespaced_custom_object(*RUNS, other, "tuningruns", _bad_run(other))
        assert created["metadata"]["namespace"] == other
        # then one call the webhook must get: once it is in the operator's log, so would be any call before it
        with pytest.raises(client.exceptions.ApiException):
            cp.custom.create_namespaced_custom_object(*RUNS, NS, "tuningruns", _bad_run(NS))
        calls = wait_for(lambda: (n := real_operator.log().count("POST /validate-run")) > calls_before and n, 30,
                         "the operator to log the webhook call for ml")
        assert calls == calls_before + 1, "the webhook was asked about a run outside the namespaces it gates"
    finally:
        cp.delete_namespace(other)


def test_a_stalled_webhook_times_out_and_the_charts_failure_policy_refuses(release: Release,
                                                                           real_operator: Operator) -> None:
    """The operator stopped (SIGSTOP: it accepts connections but never answers): the API server gives up after the
    chart's timeoutSeconds (10 s) and, failurePolicy being Fail, refuses the run with its own message; once the
    operator runs again the same run is admitted."""
    cp = release.cp
    assert real_operator.proc is not None
    run = good_run("waited", UNSERVED, None, suspend=True)
    os.killpg(real_operator.proc.pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        with pytest.raises(client.exceptions.ApiException) as err:
            cp.custom.create_namespaced_custom_object(*RUNS, NS, "tuningruns", run)
        waited = time.monotonic() - t0
    finally:
        os.killpg(real_operator.proc.pid, signal.SIGCONT)
    message = _refusal(err.value)
    assert 'failed calling webhook "validate-run.attune.dev"' in message, message
    assert "context deadline exceeded" in message or "timeout" in message.lower(), message
    assert waited >= 9.5, f"the API server gave up after {waited:.1f} s, before the chart's timeoutSeconds (10 s)"
    created = wait_for(lambda: _try_create(cp, run), 60, "the run to be admitted once the operator answers")
    assert created["metadata"]["name"] == "waited"


def _try_create(cp, run):
    try:
        return cp.custom.create_namespaced_custom_object(*RUNS, NS, "tuningruns", run)
    except client.exceptions.ApiException as err:
        if err.status == 500 or "failed calling webhook" in (err.body or ""):
            return None  # the operator catching up on its backlog
        raise


@pytest.mark.parametrize("policy", ["limitrange", "podsecurity"])
def test_pods_refused_by_admission_are_named_in_the_runs_status(training_operator: TrainingOperator,
                                                                release: Release, real_operator: Operator,
                                                                policy: str) -> None:
    """A LimitRange whose maximum the trial template exceeds, or a namespace enforcing PodSecurity ``restricted``:
    the operator's trial and job are created, the training operator's pods are refused. The run's TrialQueued
    condition quotes the refusal while the trial waits (uncharged), and the run stops at the pending deadline with
    the refusal in its message, not "waiting for its pods to be scheduled"."""
    cp = release.cp
    core = client.CoreV1Api(cp.api)
    if policy == "limitrange":
        core.create_namespaced_limit_range(NS, {"metadata": {"name": "small"}, "spec": {"limits": [
            {"type": "Container", "max": {"cpu": "1"}}]}})
        expected = "maximum cpu usage per Container is 1, but limit is 2"
    else:
        core.patch_namespace(NS, {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "restricted"}}})
        expected = 'violates PodSecurity "restricted:latest"'
    run = good_run("refused", UNSERVED, None)  # the example's pods: cpu 2 (limit), no securityContext
    run["spec"]["budget"]["pendingDeadlineSeconds"] = 30
    cp.custom.create_namespaced_custom_object(*RUNS, NS, "tuningruns", run)

    def queued() -> dict | None:
        conds = {c["type"]: c for c in ((release.run("refused") or {}).get("status") or {}).get("conditions") or []}
        q = conds.get("TrialQueued") or {}
        return q if q.get("reason") == "FailedCreatePod" else None

    q = wait_for(queued, 60, "the run to say why its trial's pods do not exist")
    assert expected in q["message"] and "pods could not be created" in q["message"] and "not charged" in q["message"]
    assert not core.list_namespaced_pod(NS).items
    done = wait_for(lambda: (s := (release.run("refused") or {}).get("status") or {}).get("phase") == "Failed" and s,
                    120, "the run to stop at its pending deadline")
    assert expected in done["message"] and "pendingDeadlineSeconds (30 s)" in done["message"], done["message"]
    [rec] = release.records("refused")
    assert rec["outcome"] == "interrupted" and rec["charged_hours"] == 0 and expected in rec["message"]


def test_owner_references_that_block_deletion_need_the_charts_finalizers_rules(release: Release) -> None:
    """OwnerReferencesPermissionEnforcement (enabled in k8s/up.sh, as OpenShift enables it): only a user who may
    update an owner's finalizers may set ``blockOwnerDeletion`` on a reference to it, which every ownerReference
    the operator writes does (a trial's to its run, a job's to its trial, the results ConfigMap's to its run). As
    the operator's ServiceAccount (its own token), an object owned by a run and one owned by a trial are accepted
    under the chart's Role and refused with the plugin's reason once the Role's finalizers rule is gone. The audit
    log records only a request's own authorization, not the plugin's, so this test is the evidence the session's
    least-privilege check counts for those two permissions."""
    from attune.operator.backends import owner_ref
    from tests.k8s import rbac

    cp = release.cp
    as_operator = client.CoreV1Api(cp.client_for(release.operator_kubeconfig))
    owners = {"tuningruns": {"apiVersion": "attune.dev/v1alpha1", "kind": "TuningRun"},
              "tuningtrials": {"apiVersion": "attune.dev/v1alpha1", "kind": "TuningTrial"}}
    count = iter(range(10_000))

    def create(plural: str) -> client.exceptions.ApiException | None:
        owner = {**owners[plural], "metadata": {"name": f"owner-{next(count)}", "uid": str(uuid.uuid4())}}
        ref = owner_ref(owner)
        assert ref["blockOwnerDeletion"] is True  # the operator's own references
        body = {"metadata": {"name": f"owned-{next(count)}", "ownerReferences": [ref]}}
        try:
            as_operator.create_namespaced_config_map(NS, body)  # the collector removes it: its owner never existed
        except client.exceptions.ApiException as err:
            return err
        return None

    assert create("tuningruns") is None and create("tuningtrials") is None
    rbac_api = client.RbacAuthorizationV1Api(cp.api)
    role = rbac_api.read_namespaced_role(rbac.RELEASE, NS)
    kept = [r for r in role.rules if not any(res.endswith("/finalizers") for res in r.resources or [])]
    assert len(kept) == len(role.rules) - 1, "the chart's Role has no finalizers rule to take away"
    original = role.rules
    role.rules = kept
    rbac_api.replace_namespaced_role(rbac.RELEASE, NS, role)
    try:
        for plural in owners:
            err = wait_for(lambda p=plural: create(p), 30, f"a reference to a {plural[:-1]} refused without the rule")
            assert err.status == 403, err.body
            assert "cannot set blockOwnerDeletion if an ownerReference refers to a resource you can't set " \
                   "finalizers on" in _refusal(err), _refusal(err)
    finally:
        role = rbac_api.read_namespaced_role(rbac.RELEASE, NS)
        role.rules = original
        rbac_api.replace_namespaced_role(rbac.RELEASE, NS, role)
    folder = os.environ.get(rbac.USAGE_ENV)
    if folder:
        rule = "OwnerReferencesPermissionEnforcement (test_real_admission: refused without it)"
        used = [{"verb": "update", "group": "attune.dev", "resource": plural, "subresource": "finalizers",
                 "allowed": True, "rule": rule} for plural in owners]
        rbac.write_usage(Path(folder), f"finalizers-{os.getpid()}-{time.monotonic_ns()}", release.install, used)


@contextlib.contextmanager
def _tenant(cp, user: str, role: str, rules: list[dict]) -> Iterator[client.CustomObjectsApi]:
    """A user the platform grants ``rules`` in the tests' namespace (a Role and RoleBinding, removed after), and a
    client that acts as that user (impersonated by the admin)."""
    rbac_api = client.RbacAuthorizationV1Api(cp.api)
    rbac_api.create_namespaced_role(NS, {"metadata": {"name": role}, "rules": rules})
    rbac_api.create_namespaced_role_binding(NS, {
        "metadata": {"name": role},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]})
    api = cp.client_for(cp.kubeconfig)
    api.set_default_header("Impersonate-User", user)
    try:
        yield client.CustomObjectsApi(api)
    finally:
        rbac_api.delete_namespaced_role_binding(role, NS)
        rbac_api.delete_namespaced_role(role, NS)


def test_only_the_operator_writes_a_runs_status(release: Release, real_operator: Operator) -> None:
    """A tenant the platform let patch ``tuningruns/status`` (RBAC allows it: a Role of the test's) tries to rewrite
    ``status.acceptedSpec`` (what the operator runs: a budget the webhook would refuse) and the hours cursor: the
    chart's webhook sees the status subresource and refuses with its reason; the status is as it was, and the
    operator's own status writes still pass (it observes an allowed edit of the spec)."""
    cp = release.cp
    cp.custom.create_namespaced_custom_object(*RUNS, NS, "tuningruns", good_run("owned", UNSERVED, None, suspend=True))
    accepted = wait_for(lambda: ((release.run("owned") or {}).get("status") or {}).get("acceptedSpec"), 60,
                        "the operator to accept the run's spec")
    rules = [{"apiGroups": ["attune.dev"], "resources": ["tuningruns/status"], "verbs": ["get", "patch"]}]
    forged = {"status": {"acceptedSpec": {**accepted, "budget": {**accepted["budget"], "acceleratorHours": 1000}},
                         "budget": {"hoursUsed": 0}}}
    with _tenant(cp, "tenant-b", "status-writer", rules) as tenant:
        def attempt() -> client.exceptions.ApiException | None:
            try:
                tenant.patch_namespaced_custom_object_status(*RUNS, NS, "tuningruns", "owned", forged)
            except client.exceptions.ApiException as err:
                return None if err.status == 403 and "RBAC" in (err.body or "") else err  # the Role not yet seen
            raise AssertionError("a tenant rewrote the run's status")

        err = wait_for(attempt, 30, "the tenant's status patch to reach the webhook")
        assert err.status == 403, err.body
        message = _refusal(err)
        assert 'admission webhook "validate-run.attune.dev" denied the request' in message, message
        assert "only the attune operator" in message and "tenant-b may not" in message, message
        assert (release.run("owned") or {})["status"]["acceptedSpec"] == accepted
        cp.custom.patch_namespaced_custom_object(*RUNS, NS, "tuningruns", "owned",
                                                 {"spec": {"budget": {"maxTrials": 6}}})  # an allowed edit
        edited = cp.custom.get_namespaced_custom_object(*RUNS, NS, "tuningruns", "owned")["metadata"]["generation"]
        wait_for(lambda: (release.run("owned") or {})["status"].get("observedGeneration") == edited, 60,
                 "the operator's own status write observing the edit")


def test_a_run_cannot_get_jobs_its_writer_may_not_create(release: Release, real_operator: Operator) -> None:
    """No confused deputy: a tenant whom the platform lets create TuningRuns but not PyTorchJobs would otherwise get
    PyTorchJobs (and pods under any ServiceAccount of the namespace) created by the operator. The webhook asks the API
    server (a SubjectAccessReview, as the request's user and groups) and refuses, naming the permission; once the
    tenant is granted it, the same run is admitted."""
    cp = release.cp
    rules = [{"apiGroups": ["attune.dev"], "resources": ["tuningruns"], "verbs": ["create", "get"]}]
    run = good_run("deputy", UNSERVED, None, suspend=True)
    with _tenant(cp, "tenant-c", "run-writer", rules) as tenant:
        def attempt() -> client.exceptions.ApiException | dict | None:
            try:
                return tenant.create_namespaced_custom_object(*RUNS, NS, "tuningruns", run)
            except client.exceptions.ApiException as err:
                return None if err.status == 403 and "RBAC" in (err.body or "") else err  # the Role not yet seen

        err = wait_for(attempt, 30, "the tenant's run to reach the webhook")
        assert isinstance(err, client.exceptions.ApiException), "a run whose writer may not create PyTorchJobs"
        message = _refusal(err)
        assert err.status == 403 and 'admission webhook "validate-run.attune.dev" denied' in message, message
        assert "tenant-c may not create pytorchjobs.kubeflow.org in namespace ml" in message, message
        assert release.run("deputy") is None
        rules.append({"apiGroups": ["kubeflow.org"], "resources": ["pytorchjobs"], "verbs": ["create"]})
        client.RbacAuthorizationV1Api(cp.api).patch_namespaced_role("run-writer", NS, {"rules": rules})
        created = wait_for(lambda: (lambda r: r if isinstance(r, dict) else None)(attempt()), 30,
                           "the run admitted once the tenant may create PyTorchJobs")
        assert created["metadata"]["name"] == "deputy"


@pytest.mark.parametrize("release", ["cluster"], indirect=True)
def test_a_cluster_wide_install_works_only_in_its_tenant_namespaces(release: Release, real_operator: Operator) -> None:
    """A cluster-wide install watches runs everywhere but holds a run's work (ConfigMaps, trials, jobs, pods and their
    logs) only where its tenant ClusterRole is bound: with its own token the operator cannot patch a ConfigMap in
    kube-system or read a pod's log there; a run in a namespace not onboarded is refused at admission, naming the
    chart's value; once the platform binds the ClusterRole there, the same run is admitted and gets its trial."""
    cp = release.cp
    as_operator = client.CoreV1Api(cp.client_for(release.operator_kubeconfig))
    with pytest.raises(client.exceptions.ApiException) as err:
        as_operator.patch_namespaced_config_map("extension-apiserver-authentication", "kube-system",
                                                {"metadata": {"labels": {"attune": "was-here"}}})
    assert err.value.status == 403, err.value.body
    with pytest.raises(client.exceptions.ApiException) as err:
        as_operator.create_namespaced_config_map("kube-system", {"metadata": {"name": "attune-lessons"}})
    assert err.value.status == 403, err.value.body
    with pytest.raises(client.exceptions.ApiException) as err:
        as_operator.read_namespaced_pod_log("kube-apiserver", "kube-system")
    assert err.value.status == 403, err.value.body  # authorization comes before the lookup: no such pod here
    for verb, resource in (("patch", "configmaps"), ("create", "configmaps"), ("get", "pods/log")):
        release.expect_denied(verb, resource)
    team = cp.namespace("team-new")
    try:
        run = good_run("elsewhere", f"http://prom.{team}.svc:9090", None, suspend=True)
        run["metadata"]["namespace"] = team
        with pytest.raises(client.exceptions.ApiException) as err:
            cp.custom.create_namespaced_custom_object(*RUNS, team, "tuningruns", run)
        message = _refusal(err.value)
        assert err.value.status == 403 and f"namespace {team} is not one of attune's tenant namespaces" in message
        assert "operator.tenantNamespaces" in message, message
        release.onboard(team)
        created = wait_for(lambda: _try_create_in(cp, team, run), 30, "the run admitted once team-new is onboarded")
        assert created["metadata"]["namespace"] == team
        wait_for(lambda: ((cp.custom.get_namespaced_custom_object(*RUNS, team, "tuningruns", "elsewhere")
                           .get("status") or {}).get("phase")) == "Suspended", 60, "the operator to take the run")
    finally:
        release.deleting(team)  # a whole-directory run saw the operator's last list there refused
        cp.delete_namespace(team)


def _try_create_in(cp, namespace: str, run: dict) -> dict | None:
    try:
        return cp.custom.create_namespaced_custom_object(*RUNS, namespace, "tuningruns", run)
    except client.exceptions.ApiException as err:
        if err.status == 403 and "tenant namespaces" in (err.body or ""):
            return None  # the RoleBinding not yet seen by the authorizer
        raise
