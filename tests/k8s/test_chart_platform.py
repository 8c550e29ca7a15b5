"""What a platform team needs of the chart (issue 39): the ServiceAccount's token reaches the operator container only,
never the agent sidecar that may call an external LLM (item 4); two replicas keep one through a drain and prefer
different nodes, so a drain never leaves the webhook (failurePolicy Fail) without a server (item 10). Rendered with
the real Helm binary, and the rendered objects accepted by the real API server (server-side dry run)."""

from __future__ import annotations

import pytest
import yaml

from tests.k8s.chart import by_kind, render
from tests.k8s.realcluster import ControlPlane

pytestmark = pytest.mark.k8s
TOKEN_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"


def _pod(docs):
    [dep] = by_kind(docs, "Deployment")
    return dep["spec"]["template"]["spec"]


def test_the_token_is_mounted_into_the_operator_container_only(helm):
    pod = _pod(render(helm))
    assert pod["automountServiceAccountToken"] is False  # the kubelet mounts it into no container by itself
    volumes = {v["name"]: v for v in pod["volumes"]}
    containers = {c["name"]: c for c in pod["containers"]}
    token_volumes = {n for n, v in volumes.items()
                     if any("serviceAccountToken" in s for s in (v.get("projected") or {}).get("sources") or [])}
    assert len(token_volumes) == 1
    [name] = token_volumes
    operator_mounts = {m["name"]: m for m in containers["operator"]["volumeMounts"]}
    assert operator_mounts[name]["mountPath"] == TOKEN_PATH and operator_mounts[name]["readOnly"] is True
    sources = volumes[name]["projected"]["sources"]
    assert any(s.get("configMap", {}).get("name") == "kube-root-ca.crt" for s in sources)  # the client trusts the CA
    assert any("downwardAPI" in s for s in sources)  # and knows its namespace, as with the kubelet's own mount
    assert "agent" in containers
    assert all(m["name"] != name for m in containers["agent"].get("volumeMounts") or [])


def test_two_replicas_keep_one_through_a_drain_and_prefer_different_nodes(helm):
    docs = render(helm)  # defaults: two replicas, leader election on
    [pdb] = by_kind(docs, "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 1
    selector = pdb["spec"]["selector"]["matchLabels"]
    assert selector == by_kind(docs, "Deployment")[0]["spec"]["selector"]["matchLabels"]
    term = _pod(docs)["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert term["podAffinityTerm"]["labelSelector"]["matchLabels"] == selector
    # one replica: no budget it could never meet (it would block every drain), no anti-affinity to speak of
    one = render(helm, "operator.replicas=1")
    assert not by_kind(one, "PodDisruptionBudget") and "affinity" not in _pod(one)
    # a team's own affinity wins over the default
    own = render(helm, "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
                       ".nodeSelectorTerms[0].matchExpressions[0].key=pool",
                 "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
                 ".nodeSelectorTerms[0].matchExpressions[0].operator=Exists")
    assert set(_pod(own)["affinity"]) == {"nodeAffinity"}


def test_the_real_api_server_accepts_the_deployment_and_the_budget(helm, control_plane: ControlPlane) -> None:
    """Server-side dry run of the rendered Deployment (its projected token volume) and PodDisruptionBudget."""
    docs = render(helm, "webhook.certManager.enabled=false")
    ns = control_plane.namespace("chart")
    try:
        wanted = [d for d in docs if d["kind"] in ("Deployment", "PodDisruptionBudget")]
        for d in wanted:
            d["metadata"]["namespace"] = ns
        out = control_plane.kubectl("apply", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump_all(wanted))
        assert "deployment.apps/rel-attune created (server dry run)" in out.stdout, out.stdout
        assert "poddisruptionbudget.policy/rel-attune created (server dry run)" in out.stdout, out.stdout
    finally:
        control_plane.delete_namespace(ns)


def test_the_values_teams_expect_reach_the_pod_and_log_level_is_wired(helm):
    """Item 11: what charts conventionally offer, without forking the chart, and ``operator.logLevel`` passed on."""
    docs = render(helm, "imagePullSecrets[0].name=regcred", "priorityClassName=batch-high", "podLabels.team=ml",
                  "podLabels.app\\.kubernetes\\.io/name=forged", "podAnnotations.owner=ml-platform",
                  "topologySpreadConstraints[0].maxSkew=1",
                  "topologySpreadConstraints[0].topologyKey=topology.kubernetes.io/zone",
                  "topologySpreadConstraints[0].whenUnsatisfiable=ScheduleAnyway",
                  "operator.extraArgs[0]=--allow-host=prom.example", "operator.extraEnv[0].name=HTTPS_PROXY",
                  "operator.extraEnv[0].value=http://proxy:3128", "operator.logLevel=debug")
    [dep] = by_kind(docs, "Deployment")
    tmpl = dep["spec"]["template"]
    pod = tmpl["spec"]
    assert pod["imagePullSecrets"] == [{"name": "regcred"}] and pod["priorityClassName"] == "batch-high"
    assert tmpl["metadata"]["labels"]["team"] == "ml" and tmpl["metadata"]["annotations"] == {"owner": "ml-platform"}
    # the selector's labels win over a team's: the Deployment still selects its pods
    assert dep["spec"]["selector"]["matchLabels"].items() <= tmpl["metadata"]["labels"].items()
    assert pod["topologySpreadConstraints"][0]["topologyKey"] == "topology.kubernetes.io/zone"
    [operator] = [c for c in pod["containers"] if c["name"] == "operator"]
    assert "--allow-host=prom.example" in operator["args"] and "--log-level=debug" in operator["args"]
    assert {"name": "HTTPS_PROXY", "value": "http://proxy:3128"} in operator["env"]
    # the defaults: info, and none of the optional fields
    [plain] = by_kind(render(helm), "Deployment")
    assert "--log-level=info" in next(c for c in plain["spec"]["template"]["spec"]["containers"]
                                      if c["name"] == "operator")["args"]
    assert not {"imagePullSecrets", "priorityClassName", "topologySpreadConstraints"} & set(
        plain["spec"]["template"]["spec"])


def test_an_extra_arg_that_is_not_a_flag_is_refused_by_the_values_schema(helm):
    import subprocess

    from tests.k8s.chart import CHART

    res = subprocess.run([str(helm), "template", "rel", str(CHART), "--set", "operator.extraArgs[0]=run; rm -rf /"],
                         capture_output=True, text=True)
    assert res.returncode != 0 and "extraArgs" in res.stderr, res.stderr


def test_the_operator_takes_a_log_level_and_refuses_another_by_name():
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-m", "attune", "operator", "run", "--log-level", "loud"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "--log-level" in res.stderr and "Traceback" not in res.stderr, res.stderr
    assert "debug" in res.stderr  # the choices are named
