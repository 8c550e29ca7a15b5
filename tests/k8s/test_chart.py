"""The Helm chart, rendered and linted by a real Helm 4, every manifest validated with kubernetes-validate."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from tests.k8s.chart import CHART, VERSIONS

pytestmark = pytest.mark.k8s


def _render(helm: Path, *args: str) -> list[dict]:
    out = subprocess.run([str(helm), "template", "rel", str(CHART), "--namespace", "attune-system", "--include-crds",
                          *args], check=True, capture_output=True, text=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def test_helm_lint_strict(helm):
    res = subprocess.run([str(helm), "lint", "--strict", str(CHART)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.parametrize("args", [
    ("--api-versions", "monitoring.coreos.com/v1"),
    ("--set", "webhook.enabled=false", "--set", "agent.enabled=false", "--set", "operator.namespaces={ml,research}"),
])
def test_rendered_manifests_validate(helm, args):
    kv = pytest.importorskip("kubernetes_validate")
    docs = _render(helm, *args)
    kinds = {d["kind"] for d in docs}
    assert "CustomResourceDefinition" in kinds and "Deployment" in kinds
    for version in VERSIONS:
        for doc in docs:
            if doc["apiVersion"].startswith(("cert-manager.io", "monitoring.coreos.com", "kopf.dev")):
                continue  # CRD-defined kinds have no bundled schema
            kv.validate(doc, version, strict=True)


def test_chart_shape(helm):
    docs = {(d["kind"], d["metadata"]["name"]): d for d in _render(helm, "--api-versions", "monitoring.coreos.com/v1")}
    dep = docs[("Deployment", "rel-attune")]
    pod = dep["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["containers"]] == ["operator", "agent"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert dep["spec"]["replicas"] == 2 and dep["spec"]["strategy"]["type"] == "RollingUpdate"  # kopf peering
    assert "--peering=attune" in pod["containers"][0]["args"] and pod["containers"][0]["readinessProbe"]
    hook = docs[("ValidatingWebhookConfiguration", "rel-attune-gate")]
    assert hook["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == "attune-system/rel-attune-webhook"
    assert {w["clientConfig"]["service"]["path"] for w in hook["webhooks"]} == {"/validate-trial", "/validate-run"}
    assert ("ServiceMonitor", "rel-attune") in docs and ("Certificate", "rel-attune-webhook") in docs
    rules = docs[("ClusterRole", "rel-attune")]["rules"]
    verbs = {(g, r): set(rule["verbs"]) for rule in rules for g in rule["apiGroups"] for r in rule["resources"]}
    assert "*" not in set().union(*verbs.values())
    assert {k for k, v in verbs.items() if "update" in v} == {("attune.dev", "tuningruns/finalizers"),
                                                              ("attune.dev", "tuningtrials/finalizers")}
    assert verbs[("attune.dev", "tuningruns")] == {"get", "list", "watch", "patch"}  # never creates or deletes runs
    assert "watch" not in verbs[("kubeflow.org", "pytorchjobs")]
    assert verbs[("", "pods")] == {"get", "list"} and verbs[("", "pods/log")] == {"get"}
    assert ("", "namespaces") not in verbs
    assert ("PodMonitor", "rel-attune-trials") in docs
    assert ("ConfigMap", "rel-attune-dashboard") in docs
