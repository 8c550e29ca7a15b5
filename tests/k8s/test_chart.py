"""The Helm chart, rendered and linted by a real Helm 4 at the oldest and newest Kubernetes it claims, every manifest
validated with kubernetes-validate."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.k8s.chart import CHART, CRD_DEFINED, NEWEST, OLDEST, VERSIONS

pytestmark = pytest.mark.k8s


def _render(helm: Path, *args: str, kube_version: str = NEWEST) -> list[dict]:
    out = subprocess.run([str(helm), "template", "rel", str(CHART), "--namespace", "attune-system", "--include-crds",
                          "--kube-version", kube_version, *args], check=True, capture_output=True, text=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def test_helm_lint_strict(helm):
    for version in (OLDEST, NEWEST):
        res = subprocess.run([str(helm), "lint", "--strict", "--kube-version", version, str(CHART)],
                             capture_output=True, text=True)
        assert res.returncode == 0, res.stdout + res.stderr


def test_kube_version_floor_is_enforced(helm):
    """Chart.yaml's kubeVersion (>= the oldest version tested) refuses an older cluster instead of half-working."""
    res = subprocess.run([str(helm), "template", "rel", str(CHART), "--kube-version", "1.26.0"],
                         capture_output=True, text=True)
    assert res.returncode != 0 and "kubeVersion" in res.stderr


@pytest.mark.parametrize("kube_version", [OLDEST, NEWEST])
@pytest.mark.parametrize("args", [
    ("--api-versions", "monitoring.coreos.com/v1"),
    ("--api-versions", "monitoring.coreos.com/v1", "--set", "webhook.certManager.enabled=false",
     "--set", "operator.leaderElection.installPeeringCRDs=true", "--set", "operator.secretNamespaces={ml}"),
    ("--set", "webhook.enabled=false", "--set", "agent.enabled=false", "--set", "operator.namespaces={ml,research}"),
    ("--set", "webhook.certManager.enabled=false", "--set", "operator.namespaces={ml,research}",
     "--set", "operator.secretNames={prom-creds}", "--set", "operator.leaderElection.installPeeringCRDs=true"),
])
def test_rendered_manifests_validate(helm, args, kube_version):
    kv = pytest.importorskip("kubernetes_validate")
    docs = _render(helm, *args, kube_version=kube_version)
    kinds = {d["kind"] for d in docs}
    assert "CustomResourceDefinition" in kinds and "Deployment" in kinds
    for version in VERSIONS:
        for doc in docs:
            if doc["apiVersion"].startswith(CRD_DEFINED):
                continue  # CRD-defined kinds have no bundled schema
            kv.validate(doc, version, strict=True)


def rule_verbs(rules):
    return {(g, r): set(rule["verbs"]) for rule in rules for g in rule["apiGroups"] for r in rule["resources"]}


def test_chart_shape(helm):
    # a cluster with the Prometheus Operator, cert-manager and kopf's peering CRDs
    docs = {(d["kind"], d["metadata"]["name"]): d for d in _render(
        helm, "--api-versions", "monitoring.coreos.com/v1", "--api-versions", "cert-manager.io/v1",
        "--api-versions", "kopf.dev/v1")}
    dep = docs[("Deployment", "rel-attune")]
    pod = dep["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["containers"]] == ["operator", "agent"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert dep["spec"]["replicas"] == 2 and dep["spec"]["strategy"]["type"] == "RollingUpdate"  # kopf peering
    args = pod["containers"][0]["args"]
    assert "--peering=rel-attune" in args and "--preflight" in args  # release-specific peering object
    assert pod["containers"][0]["readinessProbe"]
    hook = docs[("ValidatingWebhookConfiguration", "rel-attune-gate")]
    assert hook["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == "attune-system/rel-attune-webhook"
    assert {w["clientConfig"]["service"]["path"] for w in hook["webhooks"]} == {"/validate-trial", "/validate-run"}
    assert ("ServiceMonitor", "rel-attune") in docs and ("Certificate", "rel-attune-webhook") in docs
    # cluster-wide: the runs everywhere; a run's work only where the tenant ClusterRole is bound (none by default)
    watch = rule_verbs(docs[("ClusterRole", "rel-attune")]["rules"])
    assert set(watch) == {("attune.dev", "tuningruns"), ("attune.dev", "tuningruns/status"),
                          ("kopf.dev", "clusterkopfpeerings")}
    assert not [k for k in docs if k[0] == "RoleBinding" and k[1] == "rel-attune-tenant"]
    tenant = rule_verbs(docs[("ClusterRole", "rel-attune-tenant")]["rules"])
    verbs = {k: watch.get(k, set()) | tenant.get(k, set()) for k in set(watch) | set(tenant)}
    assert "*" not in set().union(*verbs.values())
    assert {k for k, v in verbs.items() if "update" in v} == {("attune.dev", "tuningruns/finalizers"),
                                                              ("attune.dev", "tuningtrials/finalizers")}
    assert watch[("attune.dev", "tuningruns")] == {"get", "list", "watch", "patch"}  # never creates runs
    assert tenant[("attune.dev", "tuningruns")] == {"delete"}  # ttlSecondsAfterFinished, in a tenant namespace only
    assert "watch" not in verbs[("kubeflow.org", "pytorchjobs")]
    assert verbs[("", "pods")] == {"list"} and verbs[("", "pods/log")] == {"get"}
    assert verbs[("kueue.x-k8s.io", "workloads")] == {"list"}  # Kueue's word on a suspended trial job, read only
    assert verbs[("attune.dev", "tuningtrials")] == {"list", "create"}  # its status: patch only; the collector deletes
    assert verbs[("attune.dev", "tuningtrials/status")] == {"patch"} and ("events.k8s.io", "events") not in verbs
    assert ("", "namespaces") not in verbs
    assert ("", "secrets") not in verbs  # no Secret cluster-wide: only where operator.secretNamespaces grants
    assert ("kopf.dev", "kopfpeerings") not in verbs  # cluster-wide kopf uses the cluster peering only
    assert verbs[("kopf.dev", "clusterkopfpeerings")] == {"get", "list", "watch", "patch", "create"}
    startup = docs[("ClusterRole", "rel-attune-startup")]["rules"]
    assert startup == [{"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"],
                        "verbs": ["get"], "resourceNames": ["tuningruns.attune.dev", "tuningtrials.attune.dev"]},
                       {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"],
                        "verbs": ["create"]},
                       # --preflight: which Prometheus selects the trials' PodMonitor
                       {"apiGroups": ["monitoring.coreos.com"], "resources": ["prometheuses"], "verbs": ["list"]}]
    assert ("PodMonitor", "rel-attune-trials") in docs
    assert ("ConfigMap", "rel-attune-dashboard") in docs
    assert not [k for k in docs if k[0] in ("KopfPeering", "ClusterKopfPeering")]  # the operator creates its own
    assert not [k for k in docs if k[1].endswith("kopf.dev")]  # kopf's CRDs: served already, not installed


def test_tenant_namespaces_get_a_rolebinding_to_the_tenant_clusterrole_each(helm):
    docs = _render(helm, "--set", "operator.tenantNamespaces={team-a,team-b}")
    bindings = {d["metadata"]["namespace"]: d for d in docs if d["kind"] == "RoleBinding"
                and d["metadata"]["name"] == "rel-attune-tenant"}
    assert set(bindings) == {"team-a", "team-b"}
    for b in bindings.values():
        assert b["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                "name": "rel-attune-tenant"}
        assert b["subjects"] == [{"kind": "ServiceAccount", "name": "rel-attune", "namespace": "attune-system"}]
    # nothing of a run's work is bound cluster-wide
    crb = [d for d in docs if d["kind"] == "ClusterRoleBinding"]
    assert not [d for d in crb if d["roleRef"]["name"] == "rel-attune-tenant"]
    namespaced = _render(helm, "--set", "operator.namespaces={ml}", "--set", "operator.tenantNamespaces={team-a}")
    assert not [d for d in namespaced if d["metadata"]["name"] == "rel-attune-tenant"]  # ignored: ml is the tenant


def test_prometheus_orgs_render_as_the_operators_flags(helm):
    docs = _render(helm, "--set", "operator.prometheusOrgs.team-a=org-a", "--set", "operator.prometheusOrgs.\\*=shared")
    dep = next(d for d in docs if d["kind"] == "Deployment")
    args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--prometheus-org=team-a=org-a" in args and "--prometheus-org=*=shared" in args
    res = subprocess.run([str(helm), "template", "rel", str(CHART), "--set", "operator.prometheusOrgs.team-a=a b"],
                         capture_output=True, text=True)
    assert res.returncode != 0 and "prometheusOrgs" in res.stderr


def test_the_dashboard_selects_a_runs_pods_of_either_backend_by_namespace_and_run():
    board = json.loads((CHART / "dashboards" / "attune.json").read_text())
    names = {v["name"] for v in board["templating"]["list"]}
    assert {"namespace", "run", "dcgm_pod_label", "dcgm_namespace_label"} <= names
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    assert not [e for e in exprs if "master|worker" in e]  # a TrainJob's pods are <job>-node-0-0-<hash>
    gpu = next(e for e in exprs if "DCGM_FI_PROF_SM_ACTIVE" in e)
    assert '${dcgm_pod_label}=~"$run-t[0-9]+-.+"' in gpu and '${dcgm_namespace_label}="$namespace"' in gpu
    pods = re.search(r'=~"(\$run-t\[0-9\]\+-\.\+)"', gpu).group(1).replace("$run", "r")  # Prometheus anchors it
    assert re.fullmatch(pods, "r-t001-master-0") and re.fullmatch(pods, "r-t001-node-0-0-x7k2p")
    assert not re.fullmatch(pods, "r2-t001-master-0")
