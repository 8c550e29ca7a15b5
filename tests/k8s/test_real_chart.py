"""The chart installed for real (``helm install`` into the real API server, in both install modes), the operator
run with exactly its RBAC (a token of the chart's ServiceAccount, judged by the real authorizer), and its webhook
reached by the API server over TLS, trusting the caBundle the operator patched in itself."""

from __future__ import annotations

import base64
import json

import pytest
import yaml
from cryptography import x509
from kubernetes import client

from tests.k8s.harness import NS, ROOT, Operator, wait_for
from tests.k8s.realcluster import ControlPlane, Release

pytestmark = [pytest.mark.k8s, pytest.mark.slow,
              pytest.mark.parametrize("release", ["namespaced", "cluster"], indirect=True)]


def _ca_bundle(cp: ControlPlane, name: str) -> bytes | None:
    adm = client.AdmissionregistrationV1Api(cp.api)
    hooks = adm.read_validating_webhook_configuration(name).webhooks
    bundles = {h.client_config.ca_bundle for h in hooks}
    return base64.b64decode(bundles.pop()) if len(bundles) == 1 and None not in bundles else None


def test_the_chart_installs_and_its_webhook_refuses_a_bad_run_over_tls(release: Release,
                                                                       real_operator: Operator) -> None:
    cp = release.cp
    kinds = sorted({d["kind"] for d in release.manifests()})
    deployment = client.AppsV1Api(cp.api).read_namespaced_deployment(release.name, release.namespace)
    assert deployment.spec.replicas == 0  # the operator runs here, outside the cluster
    assert {"Deployment", "ServiceAccount", "ValidatingWebhookConfiguration", "Service"} <= set(kinds)
    tenant_roles = [d for d in release.manifests() if d["kind"] == "Role" and d["metadata"].get("namespace") == NS]
    assert bool(tenant_roles) == (release.install == "namespaced")
    config_name = next(d["metadata"]["name"] for d in release.manifests()
                       if d["kind"] == "ValidatingWebhookConfiguration")
    # the operator kept its CA in the chart's Secret and patched the caBundle itself
    bundle = wait_for(lambda: _ca_bundle(cp, config_name), 30, "the operator to patch the caBundle")
    ca = x509.load_pem_x509_certificates(bundle)[0]
    served = x509.load_pem_x509_certificate((release.certs / "tls.crt").read_bytes())
    served.verify_directly_issued_by(ca)
    names = served.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "127.0.0.1" in [str(ip) for ip in names.get_values_for_type(x509.IPAddress)]

    bad = yaml.safe_load((ROOT / "examples" / "tuningrun-bad.yaml").read_text())
    bad["metadata"]["namespace"] = NS
    with pytest.raises(client.exceptions.ApiException) as err:
        cp.custom.create_namespaced_custom_object("attune.dev", "v1alpha1", NS, "tuningruns", bad)
    assert err.value.status == 422, err.value.body
    message = json.loads(err.value.body)["message"]
    assert message.startswith('admission webhook "validate-run.attune.dev" denied the request'), message
    assert "micro_batch_size: 3 is not a legal value" in message
    assert release.cp.audit(since=release.since) and not release.unexpected_denials()


def test_a_webhook_the_api_server_cannot_trust_fails_closed(release: Release, real_operator: Operator) -> None:
    """The TLS is real: with the caBundle replaced by another CA, the API server refuses to call the webhook and,
    the chart's failurePolicy being Fail, refuses the request."""
    cp = release.cp
    config_name = next(d["metadata"]["name"] for d in release.manifests()
                       if d["kind"] == "ValidatingWebhookConfiguration")
    wait_for(lambda: _ca_bundle(cp, config_name), 30, "the operator to patch the caBundle")
    other = (cp.state / "pki" / "ca.crt").read_bytes()  # a CA that did not sign the webhook's certificate
    adm = client.AdmissionregistrationV1Api(cp.api)
    hooks = adm.read_validating_webhook_configuration(config_name).webhooks
    patch = {"webhooks": [{"name": h.name, "clientConfig": {"caBundle": base64.b64encode(other).decode()}}
                          for h in hooks]}
    adm.patch_validating_webhook_configuration(config_name, patch)
    good = yaml.safe_load((ROOT / "examples" / "tuningrun-good.yaml").read_text())
    good["metadata"] = {"name": "good", "namespace": NS}
    with pytest.raises(client.exceptions.ApiException) as err:
        cp.custom.create_namespaced_custom_object("attune.dev", "v1alpha1", NS, "tuningruns", good)
    message = json.loads(err.value.body)["message"]
    assert 'failed calling webhook "validate-run.attune.dev"' in message and "certificate" in message, message


def test_a_certificate_secret_left_for_other_names_is_rotated(release: Release, tmp_path) -> None:
    """An install that finds the certificate Secret an earlier one left, issued for other DNS names: the operator
    re-issues it in place (a patch of its own Secret, by name: what the chart's patch of it is for)."""
    import datetime as dt

    from attune.operator import certs

    cp = release.cp
    old = certs.CertPlan(secret_name="attune-webhook-tls", namespace=release.namespace, service="elsewhere",
                         cert_file="-", key_file="-")
    bundle, _ = certs.plan_bundle(None, ["elsewhere.example"], "an earlier install's CA", dt.datetime.now(dt.UTC))
    cp.core.create_namespaced_secret(release.namespace, certs.secret_body(old, bundle))
    op = Operator(release, tmp_path, args=release.operator_args())
    try:
        op.start()
        wait_for(lambda: "webhook certificate: wrote Secret" in op.log(), 60, "the operator to re-issue it")
    finally:
        op.stop()
    secret = cp.core.read_namespaced_secret("attune-webhook-tls", release.namespace)
    assert certs.Bundle.from_secret(cp.api.sanitize_for_serialization(secret)) != bundle


def test_the_start_up_says_in_one_line_each_what_the_runs_will_need(release: Release, tmp_path) -> None:
    """Issue 39, item 9: with --preflight (as the chart runs it) the operator says which trial job kinds the cluster
    serves and which Prometheus selects the chart's PodMonitor, read from the real API server with the chart's RBAC
    (list prometheuses) and discovery."""
    cp = release.cp
    if not cp.exists("monitoring"):
        cp.core.create_namespace({"metadata": {"name": "monitoring"}})
    prom = {"apiVersion": "monitoring.coreos.com/v1", "kind": "Prometheus", "metadata": {"name": "kps"},
            "spec": {"podMonitorSelector": {"matchLabels": {"release": "kube-prometheus-stack"}},
                     "podMonitorNamespaceSelector": {}}}
    cp.custom.create_namespaced_custom_object("monitoring.coreos.com", "v1", "monitoring", "prometheuses", prom)
    op = Operator(release, tmp_path, args=release.operator_args())
    try:
        op.start()
        line = wait_for(lambda: next((x for x in op.log().splitlines() if "preflight: trial scraping:" in x), None), 60,
                        "the start-up's scraping line")
        assert f"the PodMonitor in {release.namespace} is selected by Prometheus monitoring/kps" in line, line
        jobs = next(x for x in op.log().splitlines() if "preflight: trial jobs:" in x)
        assert "PyTorchJob (kubeflow.org/v1) served" in jobs and "TrainJob (trainer.kubeflow.org/v1alpha1) not " \
                                                                "served (install Kubeflow Trainer" in jobs, jobs
    finally:
        op.stop()
        cp.custom.delete_namespaced_custom_object("monitoring.coreos.com", "v1", "monitoring", "prometheuses", "kps")
    assert not release.unexpected_denials(), release.unexpected_denials()
