"""The chart with and without cert-manager, cluster-wide and namespaced: every mode renders a complete, valid
webhook configuration (a CA the API server can use), a Secret where nothing else creates one, and a webhook
scoped to the namespaces the operator serves."""

from __future__ import annotations

import base64
import subprocess

import pytest
import yaml

from tests.k8s.chart import CHART, VERSIONS

pytestmark = pytest.mark.k8s


def render(helm_bin, *sets: str) -> list[dict]:
    args = [a for s in sets for a in ("--set", s)]
    out = subprocess.run([str(helm_bin), "template", "rel", str(CHART), "--namespace", "attune-system", *args],
                         check=True, capture_output=True, text=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def by_kind(docs, kind):
    return [d for d in docs if d["kind"] == kind]


@pytest.mark.parametrize("cert_manager", [True, False])
@pytest.mark.parametrize("namespaces", [None, "{ml,research}"])
def test_webhook_is_complete_in_every_mode(helm, cert_manager, namespaces):
    kv = pytest.importorskip("kubernetes_validate")
    sets = [f"webhook.certManager.enabled={str(cert_manager).lower()}"]
    if namespaces:
        sets.append(f"operator.namespaces={namespaces}")
    docs = render(helm, *sets)
    for version in VERSIONS:
        for doc in docs:
            if not doc["apiVersion"].startswith(("cert-manager.io", "monitoring.coreos.com", "kopf.dev")):
                kv.validate(doc, version, strict=True)
    [hook] = by_kind(docs, "ValidatingWebhookConfiguration")
    deployment = by_kind(docs, "Deployment")[0]
    mounted = {v["secret"]["secretName"] for v in deployment["spec"]["template"]["spec"]["volumes"] if "secret" in v}
    for webhook in hook["webhooks"]:
        cfg = webhook["clientConfig"]
        assert cfg["service"]["name"] == "rel-attune" and cfg["service"]["path"].startswith("/validate-")
        if namespaces:
            [expr] = webhook["namespaceSelector"]["matchExpressions"]
            assert expr["values"] == ["ml", "research"]  # namespaced installs never judge other namespaces
        else:
            assert "namespaceSelector" not in webhook
        if cert_manager:
            assert "caBundle" not in cfg  # cert-manager's cainjector fills it
            assert hook["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == "attune-system/rel-attune-webhook"
        else:
            pem = base64.b64decode(cfg["caBundle"]).decode()
            assert pem.startswith("-----BEGIN CERTIFICATE-----")
    secrets = {s["metadata"]["name"]: s for s in by_kind(docs, "Secret")}
    if cert_manager:
        assert "rel-attune-webhook-tls" not in secrets and by_kind(docs, "Certificate")
    else:
        tls = secrets["rel-attune-webhook-tls"]  # the Secret the pod mounts exists: nothing else would create it
        assert tls["type"] == "kubernetes.io/tls" and set(tls["data"]) == {"ca.crt", "tls.crt", "tls.key"}
        assert tls["data"]["ca.crt"] == hook["webhooks"][0]["clientConfig"]["caBundle"]
        assert not by_kind(docs, "Certificate")
    assert "rel-attune-webhook-tls" in mounted


def test_values_schema_refuses_a_typo(helm):
    res = subprocess.run([str(helm), "template", "rel", str(CHART), "--set", "webhook.failurPolicy=Fail"],
                         capture_output=True, text=True)
    assert res.returncode != 0 and "failurPolicy" in res.stderr


def test_namespaced_peering_objects(helm):
    docs = render(helm, "operator.namespaces={ml}")
    assert [d["metadata"]["namespace"] for d in by_kind(docs, "KopfPeering")] == ["ml"]
    assert not by_kind(docs, "ClusterKopfPeering")
    single = render(helm, "operator.leaderElection.enabled=false")
    dep = by_kind(single, "Deployment")[0]
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"]["type"] == "Recreate"
    assert not by_kind(single, "ClusterKopfPeering")
