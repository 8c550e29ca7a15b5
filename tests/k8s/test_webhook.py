"""The gate webhook answers real AdmissionReview requests over HTTPS, served by the real operator process with the
chart's arguments (its serving certificate, issued by the CA it keeps in the chart's Secret and patches into the
chart's ValidatingWebhookConfiguration; the reviews are sent trusting that caBundle, as kube-apiserver does)."""

from __future__ import annotations

import base64
import ssl
import uuid

import httpx
import pytest
from kubernetes import client

from attune.operator.manifests import build_trial
from tests.k8s.conftest import good_run
from tests.k8s.harness import NS, Operator, wait_for
from tests.k8s.realcluster import Release

pytestmark = pytest.mark.k8s


def _trusted(release: Release) -> ssl.SSLContext:
    """TLS trusting the caBundle the operator patched into the chart's ValidatingWebhookConfiguration."""
    name = next(d["metadata"]["name"] for d in release.manifests() if d["kind"] == "ValidatingWebhookConfiguration")
    adm = client.AdmissionregistrationV1Api(release.api)

    def bundle() -> str | None:
        hooks = adm.read_validating_webhook_configuration(name).webhooks
        return hooks[0].client_config.ca_bundle if hooks and hooks[0].client_config.ca_bundle else None

    ca = wait_for(bundle, 30, "the operator to patch the webhook's caBundle")
    return ssl.create_default_context(cadata=base64.b64decode(ca).decode())


def _review(operator, path, obj, operation="CREATE", old=None, user=None):
    """The operator's webhook's answer to an admission review of ``obj`` by ``user`` (TuningTrials: by default the
    operator's own ServiceAccount, the only writer the webhook admits; TuningRuns: a user)."""
    from tests.k8s.rbac import OPERATOR_USER

    user = user or (OPERATOR_USER if obj["kind"] == "TuningTrial" else "tester")
    uid = str(uuid.uuid4())
    group, version = obj["apiVersion"].split("/")
    plural = {"TuningRun": "tuningruns", "TuningTrial": "tuningtrials"}[obj["kind"]]
    body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": uid, "kind": {"group": group, "version": version, "kind": obj["kind"]},
        "resource": {"group": group, "version": version, "resource": plural},
        "requestKind": {"group": group, "version": version, "kind": obj["kind"]},
        "requestResource": {"group": group, "version": version, "resource": plural},
        "name": obj["metadata"]["name"], "namespace": NS, "operation": operation,
        "userInfo": {"username": user}, "object": obj, "oldObject": old, "dryRun": False}}
    resp = httpx.post(f"https://127.0.0.1:{operator.webhook_port}/{path}", json=body, timeout=30,
                      verify=_trusted(operator.kube))
    assert resp.status_code == 200, resp.text
    answer = resp.json()["response"]
    assert answer["uid"] == uid
    return answer


@pytest.fixture()
def suspended_run(release: Release, real_operator: Operator):
    """A suspended run, created through the API server (which asked the webhook over TLS)."""
    run = good_run("gated", "http://127.0.0.1:9", None, suspend=True,
                   searchSpace=["activation_checkpointing", "matmul_precision"])
    release.custom.create_namespaced_custom_object("attune.dev", "v1alpha1", NS, "tuningruns", run)
    return wait_for(lambda: ((release.run("gated") or {}).get("status") or {}).get("phase") == "Suspended"
                    and release.run("gated"), 60, "the run to be suspended")


def _trial(run, change):
    from attune.recipe.io import parse_recipe

    base = parse_recipe(run["status"]["baselineRecipe"])
    knobs = {**base.effective_knobs, **change}
    return build_trial(run, 1, "candidate", change, knobs, "test", "webhook test")


def test_admits_a_good_trial(real_operator, suspended_run):
    answer = _review(real_operator, "validate-trial", _trial(suspended_run, {"activation_checkpointing": "selective"}))
    assert answer["allowed"] is True
    # the same trial from anybody but the operator: refused (a trial's record is its run's journal and budget)
    answer = _review(real_operator, "validate-trial", _trial(suspended_run, {"activation_checkpointing": "selective"}),
                     user="alice")
    assert answer["allowed"] is False and answer["status"]["code"] == 403
    assert "only the attune operator" in answer["status"]["message"]


def test_refuses_a_numerics_changing_trial_with_the_gates_reason(real_operator, suspended_run):
    answer = _review(real_operator, "validate-trial", _trial(suspended_run, {"matmul_precision": "medium"}))
    assert answer["allowed"] is False
    assert answer["status"]["code"] == 422
    assert "[numerics_not_opted_in] knobs.matmul_precision" in answer["status"]["message"]


def test_refuses_a_trial_outside_the_search_space(real_operator, suspended_run):
    answer = _review(real_operator, "validate-trial", _trial(suspended_run, {"micro_batch_size": 2}))
    assert answer["allowed"] is False and "outside the run's search space" in answer["status"]["message"]


def test_run_edits_while_active(real_operator, suspended_run):
    old = suspended_run
    budget = {**old, "spec": {**old["spec"], "budget": {**old["spec"]["budget"], "acceleratorHours": 1.0}}}
    assert _review(real_operator, "validate-run", budget, "UPDATE", old)["allowed"] is True
    template = {**old, "spec": {**old["spec"], "searchSpace": ["micro_batch_size"]}}
    answer = _review(real_operator, "validate-run", template, "UPDATE", old)
    assert answer["allowed"] is False
    assert "spec.searchSpace is frozen: cannot change while the run is Suspended" in answer["status"]["message"]
    smaller = {**old, "spec": {**old["spec"], "budget": {**old["spec"]["budget"], "acceleratorHours": 0.01}}}
    answer = _review(real_operator, "validate-run", smaller, "UPDATE", old)
    assert answer["allowed"] is False and "acceleratorHours may only increase" in answer["status"]["message"]
    agent = {**old, "spec": {**old["spec"], "agent": {"endpoint": "http://other.ml.svc:8081"}}}
    assert _review(real_operator, "validate-run", agent, "UPDATE", old)["allowed"] is False
    suspend = {**old, "spec": {**old["spec"], "suspend": False}}
    assert _review(real_operator, "validate-run", suspend, "UPDATE", old)["allowed"] is True


def test_refuses_the_bad_example(real_operator):
    import yaml

    from tests.k8s.conftest import ROOT

    bad = yaml.safe_load((ROOT / "examples" / "tuningrun-bad.yaml").read_text())
    bad["metadata"]["namespace"] = NS
    answer = _review(real_operator, "validate-run", bad)
    assert answer["allowed"] is False
    assert "micro_batch_size" in answer["status"]["message"]


def test_operator_exports_its_metrics(real_operator, suspended_run):
    def scraped():
        text = httpx.get(f"http://127.0.0.1:{real_operator.metrics_port}/metrics", timeout=5).text
        return f'attune_operator_runs{{namespace="{NS}",phase="Suspended"}} 1.0' in text and text
    text = wait_for(scraped, 20, "the operator's metrics")
    assert "attune_operator_reconcile_duration_seconds_count" in text  # its steps were timed
    for name in ("attune_operator_trials_total", "attune_operator_accelerator_hours_charged_total",
                 "attune_operator_best_speedup", "attune_operator_reconcile_errors_total",
                 "attune_operator_run_stalled", "attune_operator_endpoint_request_duration_seconds",
                 "attune_operator_webhook_denials_total"):
        assert f"# TYPE {name.removesuffix('_total')}" in text, name
