"""The chart with and without cert-manager, cluster-wide and namespaced, at the oldest and newest Kubernetes it
claims: every mode renders a complete, valid webhook configuration, the same bytes on every render (GitOps), the
certificate plumbing of its mode, a webhook scoped to the namespaces the operator serves, Secrets readable only where
granted, kopf's peering CRDs only when asked, and a PodMonitor Prometheus can trust and find."""

from __future__ import annotations

import subprocess

import pytest

from tests.k8s.chart import CHART, CRD_DEFINED, NEWEST, OLDEST, VERSIONS, by_kind, named, render, render_text

pytestmark = pytest.mark.k8s


def verbs_of(role):
    out: dict[tuple[str, str], list[dict]] = {}
    for rule in role["rules"]:
        for g in rule["apiGroups"]:
            for r in rule["resources"]:
                out.setdefault((g, r), []).append(rule)
    return out


@pytest.mark.parametrize("kube_version", [OLDEST, NEWEST])
@pytest.mark.parametrize("cert_manager", [True, False])
@pytest.mark.parametrize("namespaces", [None, "{ml,research}"])
def test_webhook_is_complete_in_every_mode(helm, cert_manager, namespaces, kube_version):
    kv = pytest.importorskip("kubernetes_validate")
    sets = [f"webhook.certManager.enabled={str(cert_manager).lower()}"]
    if namespaces:
        sets.append(f"operator.namespaces={namespaces}")
    docs = render(helm, *sets, kube_version=kube_version)
    for version in VERSIONS:
        for doc in docs:
            if not doc["apiVersion"].startswith(CRD_DEFINED):
                kv.validate(doc, version, strict=True)
    [hook] = by_kind(docs, "ValidatingWebhookConfiguration")
    deployment = by_kind(docs, "Deployment")[0]
    pod = deployment["spec"]["template"]["spec"]
    args = pod["containers"][0]["args"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "certs")
    assert "--webhook-cert=/certs/tls.crt" in args and "--webhook-key=/certs/tls.key" in args
    for webhook in hook["webhooks"]:
        cfg = webhook["clientConfig"]
        assert cfg["service"]["name"] == "rel-attune" and cfg["service"]["path"].startswith("/validate-")
        assert "caBundle" not in cfg  # never rendered: cert-manager's cainjector or the operator sets it
        if namespaces:
            [expr] = webhook["namespaceSelector"]["matchExpressions"]
            assert expr["values"] == ["ml", "research"]  # namespaced installs never judge other namespaces
        else:
            assert "namespaceSelector" not in webhook
    assert not by_kind(docs, "Secret")  # no certificate material in the chart, ever
    startup = verbs_of(named(docs, "ClusterRole", "rel-attune-startup"))
    if cert_manager:
        assert hook["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == "attune-system/rel-attune-webhook"
        assert by_kind(docs, "Certificate")[0]["spec"]["secretName"] == "rel-attune-webhook-tls"
        assert volumes["certs"]["secret"]["secretName"] == "rel-attune-webhook-tls" and mount["readOnly"] is True
        assert not [a for a in args if a.startswith(("--webhook-cert-secret", "--webhook-config"))]
        assert ("admissionregistration.k8s.io", "validatingwebhookconfigurations") not in startup
        assert not [r for r in by_kind(docs, "Role") if r["metadata"]["name"] == "rel-attune-webhook-cert"]
    else:
        assert not by_kind(docs, "Certificate") and not by_kind(docs, "Issuer")
        assert {"--webhook-cert-secret=rel-attune-webhook-tls", "--webhook-cert-namespace=attune-system",
                "--webhook-service=rel-attune", "--webhook-config=rel-attune-gate"} <= set(args)
        assert "emptyDir" in volumes["certs"] and mount["readOnly"] is False  # the operator writes the pair
        # RBAC for exactly what certs.ensure does, by name where RBAC allows it
        [vwc] = startup[("admissionregistration.k8s.io", "validatingwebhookconfigurations")]
        assert vwc["verbs"] == ["get", "patch"] and vwc["resourceNames"] == ["rel-attune-gate"]
        role = named(docs, "Role", "rel-attune-webhook-cert", "attune-system")
        secret_rules = verbs_of(role)[("", "secrets")]
        assert [(r["verbs"], r.get("resourceNames")) for r in secret_rules] == [
            (["get", "patch"], ["rel-attune-webhook-tls"]), (["create"], None)]  # create cannot take resourceNames
        binding = named(docs, "RoleBinding", "rel-attune-webhook-cert", "attune-system")
        assert binding["subjects"][0]["name"] == "rel-attune" and binding["roleRef"]["name"] == "rel-attune-webhook-cert"


@pytest.mark.parametrize("sets", [
    ("webhook.certManager.enabled=true",),
    ("webhook.certManager.enabled=false",),
    ("webhook.certManager.enabled=false", "operator.namespaces={ml}", "operator.leaderElection.installPeeringCRDs=true"),
])
def test_render_is_byte_identical_every_time(helm, sets):
    """Argo CD and Flux render the chart on every sync: anything random (a generated certificate) or looked up would
    show the application OutOfSync forever and rotate the certificate on each sync."""
    first = render_text(helm, *sets, extra=("--api-versions", "monitoring.coreos.com/v1"))
    second = render_text(helm, *sets, extra=("--api-versions", "monitoring.coreos.com/v1"))
    assert first == second
    assert "BEGIN CERTIFICATE" not in first and "caBundle:" not in first


def test_values_schema_refuses_a_typo(helm):
    res = subprocess.run([str(helm), "template", "rel", str(CHART), "--set", "webhook.failurPolicy=Fail"],
                         capture_output=True, text=True)
    assert res.returncode != 0 and "failurPolicy" in res.stderr


def test_peering_crds_where_the_cluster_has_none_or_when_asked_and_objects_never(helm):
    default = render(helm)  # "auto", and helm template knows of no kopf.dev/v1: installed (as on a fresh cluster)
    assert {d["metadata"]["name"] for d in by_kind(default, "CustomResourceDefinition")
            if d["spec"]["group"] == "kopf.dev"} == {"clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev"}
    for served in (render(helm, extra=("--api-versions", "kopf.dev/v1")),  # another kopf operator installed them
                   render(helm, "operator.leaderElection.installPeeringCRDs=false")):
        assert not [d for d in by_kind(served, "CustomResourceDefinition") if d["spec"]["group"] == "kopf.dev"]
    asked = render(helm, "operator.leaderElection.installPeeringCRDs=true", extra=("--api-versions", "kopf.dev/v1"))
    peering_crds = {d["metadata"]["name"]: d for d in by_kind(asked, "CustomResourceDefinition")
                    if d["spec"]["group"] == "kopf.dev"}
    assert set(peering_crds) == {"clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev"}
    assert all(d["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep" for d in peering_crds.values())
    for docs in (default, asked, render(helm, "operator.namespaces={ml}")):
        assert not by_kind(docs, "KopfPeering") and not by_kind(docs, "ClusterKopfPeering")
    namespaced = render(helm, "operator.namespaces={ml}")
    assert "--peering=rel-attune" in by_kind(namespaced, "Deployment")[0]["spec"]["template"]["spec"][
        "containers"][0]["args"]
    role = named(namespaced, "Role", "rel-attune", "ml")
    assert [r["verbs"] for r in verbs_of(role)[("kopf.dev", "kopfpeerings")]] == [
        ["get", "list", "watch", "patch", "create"]]
    named_peering = render(helm, "operator.leaderElection.peeringName=shared")
    assert "--peering=shared" in by_kind(named_peering, "Deployment")[0]["spec"]["template"]["spec"][
        "containers"][0]["args"]
    single = render(helm, "operator.leaderElection.enabled=false", "operator.leaderElection.installPeeringCRDs=true")
    dep = by_kind(single, "Deployment")[0]
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"]["type"] == "Recreate"
    assert not [a for a in dep["spec"]["template"]["spec"]["containers"][0]["args"] if a.startswith("--peering")]
    assert not [d for d in by_kind(single, "CustomResourceDefinition") if d["spec"]["group"] == "kopf.dev"]
    rules = named(single, "ClusterRole", "rel-attune")["rules"]
    assert not [r for r in rules if "kopf.dev" in r["apiGroups"]]


def secret_grants(docs):
    """namespace → the rules granting anything on secrets, over every Role and ClusterRole rendered."""
    out: dict[str | None, list[dict]] = {}
    for role in by_kind(docs, "Role") + by_kind(docs, "ClusterRole"):
        for rule in role["rules"]:
            if "" in rule["apiGroups"] and "secrets" in rule["resources"]:
                out.setdefault(role["metadata"].get("namespace"), []).append(rule)
    return out


def test_secrets_only_where_the_platform_grants_them(helm):
    # cluster-wide, nothing granted: no Secret rule anywhere (with cert-manager: not even the certificate's)
    assert secret_grants(render(helm, "webhook.certManager.enabled=true")) == {}
    granted = render(helm, "webhook.certManager.enabled=true", "operator.secretNamespaces={team-a,team-b}")
    grants = secret_grants(granted)
    assert set(grants) == {"team-a", "team-b"}
    assert all(r == [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}] for r in grants.values())
    binding = named(granted, "RoleBinding", "rel-attune-secrets", "team-a")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "rel-attune", "namespace": "attune-system"}]
    by_name = secret_grants(render(helm, "webhook.certManager.enabled=true", "operator.secretNamespaces={team-a}",
                                       "operator.secretNames={prom-creds}"))
    assert by_name == {"team-a": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"],
                                   "resourceNames": ["prom-creds"]}]}
    # namespaced: the watched namespaces, optionally by name; the operator's Roles themselves carry no Secret rule
    namespaced = render(helm, "webhook.certManager.enabled=true", "operator.namespaces={ml,research}",
                        "operator.secretNames={prom-creds}")
    grants = secret_grants(namespaced)
    assert set(grants) == {"ml", "research"} and all(r[0]["resourceNames"] == ["prom-creds"] for r in grants.values())
    assert ("", "secrets") not in verbs_of(named(namespaced, "Role", "rel-attune", "ml"))
    # without cert-manager: only the certificate Secret in the release namespace (get/patch by name, create)
    self_signed = secret_grants(render(helm, "webhook.certManager.enabled=false"))
    assert list(self_signed) == ["attune-system"]
    assert [r.get("resourceNames") for r in self_signed["attune-system"]] == [["rel-attune-webhook-tls"], None]


def test_pod_monitor_trusts_target_labels_and_is_selected_by_kube_prometheus_stack(helm):
    docs = render(helm, extra=("--api-versions", "monitoring.coreos.com/v1"))
    monitor = named(docs, "PodMonitor", "rel-attune-trials")
    [endpoint] = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["honorLabels"] is False  # a trial pod cannot forge namespace/pod and poison another run
    # kube-prometheus-stack (podMonitorSelectorNilUsesHelmValues: true) selects release=<its release name>
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert named(docs, "ServiceMonitor", "rel-attune")["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    other = named(render(helm, "trials.podMonitor.labels.release=monitoring",
                         extra=("--api-versions", "monitoring.coreos.com/v1")), "PodMonitor", "rel-attune-trials")
    assert other["metadata"]["labels"]["release"] == "monitoring"
    assert other["metadata"]["labels"]["app.kubernetes.io/instance"] == "rel"  # the chart's own labels stay
    notes = subprocess.run([str(helm), "install", "rel", str(CHART), "--dry-run=client", "--namespace", "attune-system"],
                           capture_output=True, text=True)
    assert notes.returncode == 0, notes.stderr
    assert "`release: <its release name>`" in notes.stdout and "trials.podMonitor.labels" in notes.stdout


def test_cert_manager_where_the_cluster_serves_it_else_the_operators_own(helm):
    """webhook.certManager.enabled "auto" (the default): a fresh cluster without cert-manager gets the operator's
    self-signed certificate (the install no longer fails on an unknown Certificate kind); one serving
    cert-manager.io/v1 gets a Certificate; true and false decide."""
    def certificate(docs: list[dict]) -> bool:
        return bool(by_kind(docs, "Certificate"))

    assert not certificate(render(helm))
    assert certificate(render(helm, extra=("--api-versions", "cert-manager.io/v1")))
    assert certificate(render(helm, "webhook.certManager.enabled=true"))
    assert not certificate(render(helm, "webhook.certManager.enabled=false", extra=("--api-versions",
                                                                                    "cert-manager.io/v1")))
    args = by_kind(render(helm), "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert any(a.startswith("--webhook-cert-secret=") for a in args)  # the operator keeps its own
