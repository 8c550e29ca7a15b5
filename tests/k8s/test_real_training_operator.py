"""The real Kubeflow training operator (v1.9.4's PyTorchJob controller and webhook, in our attune-training-operator)
on the real control plane (the ``control_plane`` and ``training_operator`` fixtures): it creates a PyTorchJob's
Master pod and Service with the labels the reconciler's fakes use (tests/k8s/harness.py's ``kubeflow_pod_labels``), the real
scheduler binds the pod, the pod runner runs it and the operator sees the job succeed; its webhook, registered by URL
on 127.0.0.1, refuses an invalid PyTorchJob over TLS.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from attune.operator import certs
from tests.k8s.harness import kubeflow_pod_labels, wait_for
from tests.k8s.realcluster import ControlPlane
from tests.k8s.realcluster_kubeflow import (
    GROUP,
    PLURAL,
    VERSION,
    WEBHOOK_CONFIG,
    WEBHOOK_NAME,
    RealClusterError,
    TrainingOperator,
    listening_addresses,
    pytorchjob,
    status_message,
)

ROOT = Path(__file__).resolve().parents[2]
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "training-operator")
pytestmark = [pytest.mark.k8s, pytest.mark.slow]


@pytest.fixture(scope="module")
def api(control_plane: ControlPlane) -> client.ApiClient:
    return control_plane.api


@pytest.fixture(scope="module")
def namespace(control_plane: ControlPlane) -> str:
    return control_plane.namespace("to")


def test_operator_serves_on_loopback_only(training_operator: TrainingOperator) -> None:
    """Every socket the operator listens on is on 127.0.0.1: its webhook and its health port, nothing else."""
    op = training_operator
    assert op.proc is not None
    assert sorted(listening_addresses(op.proc.pid)) == sorted([("127.0.0.1", op.webhook_port),
                                                               ("127.0.0.1", op.health_port)])


def test_pytorchjob_gets_its_master_pod_and_service(training_operator: TrainingOperator, api: client.ApiClient,
                                                   namespace: str, control_plane: ControlPlane) -> None:
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    job = custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, pytorchjob("smoke", namespace))
    selector = "training.kubeflow.org/job-name=smoke"
    pods = wait_for(lambda: core.list_namespaced_pod(namespace, label_selector=selector).items, 60,
                    f"the operator to create the Master pod (log: {training_operator.log_path})")
    [pod] = pods
    assert pod.metadata.name == "smoke-master-0"
    # the labels the reconciler's fakes give pods are the real operator's
    assert kubeflow_pod_labels("smoke", "Master", 0).items() <= pod.metadata.labels.items()
    [owner] = pod.metadata.owner_references
    assert (owner.kind, owner.name, owner.uid, owner.controller) == ("PyTorchJob", "smoke", job["metadata"]["uid"],
                                                                     True)
    [container] = pod.spec.containers
    assert container.command == ["true"] and pod.spec.restart_policy == "Never"
    env = {e.name: e.value for e in container.env}
    assert {"MASTER_ADDR": "smoke-master-0", "MASTER_PORT": "23456", "WORLD_SIZE": "1", "RANK": "0"}.items() \
        <= env.items()
    # the real scheduler binds it, the pod runner runs it, the real operator sees it succeed
    control_plane.wait_pod_phase(namespace, "smoke-master-0", ("Succeeded",))

    services = wait_for(lambda: core.list_namespaced_service(namespace, label_selector=selector).items, 60,
                        "the operator to create the Master's Service")
    [svc] = services
    assert svc.metadata.name == "smoke-master-0" and svc.spec.cluster_ip == "None"  # headless
    assert svc.spec.selector.items() >= {"training.kubeflow.org/job-name": "smoke",
                                         "training.kubeflow.org/replica-type": "master",
                                         "training.kubeflow.org/replica-index": "0"}.items()
    assert [p.port for p in svc.spec.ports] == [23456]

    def condition(kind: str) -> bool:
        status = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "smoke").get("status") or {}
        return any(c["type"] == kind and c["status"] == "True" for c in status.get("conditions") or [])

    wait_for(lambda: condition("Created"), 60, "the PyTorchJob's Created condition")
    wait_for(lambda: condition("Succeeded"), 60, "the PyTorchJob's Succeeded condition")


def test_webhook_refuses_an_invalid_pytorchjob_over_tls(training_operator: TrainingOperator, api: client.ApiClient,
                                                        namespace: str) -> None:
    """Two Master replicas pass the CRD's schema, and v1.9.4's webhook refuses them with its own message, which the
    API server (calling https://127.0.0.1:<port>/validate-kubeflow-org-v1-pytorchjob) passes on; nothing is stored."""
    custom = client.CustomObjectsApi(api)
    with pytest.raises(ApiException) as refused:
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL,
                                               pytorchjob("two-masters", namespace, master_replicas=2))
    message = status_message(refused.value)
    assert message.startswith(f'admission webhook "{WEBHOOK_NAME}" denied the request')
    assert "spec.pytorchReplicaSpecs[Master].replicas: Forbidden: must be 1" in message
    with pytest.raises(ApiException) as absent:
        custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "two-masters")
    assert absent.value.status == 404
    # the same job with one Master is accepted: the refusal was the replica count
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, pytorchjob("one-master", namespace))


class _PairWithoutTheAddress(TrainingOperator):
    """An operator whose serving certificate names only ``localhost``, not the 127.0.0.1 it is registered with."""

    def issue_serving_pair(self) -> Path:
        cert_dir = super().issue_serving_pair()
        crt, key = certs.new_serving(self.ca_crt.read_bytes(), self.ca_key.read_bytes(), ["localhost"],
                                     dt.datetime.now(dt.UTC))
        (cert_dir / "tls.crt").write_bytes(crt)
        (cert_dir / "tls.key").write_bytes(key)
        return cert_dir


def test_api_server_checks_the_webhook_certificate(training_operator: TrainingOperator, control_plane: ControlPlane,
                                                   api: client.ApiClient) -> None:
    """The API server verifies the webhook's certificate against the caBundle and the URL's address: a second operator
    whose certificate lacks IP 127.0.0.1 is reported at start with the API server's TLS error, and leaves neither a
    process nor its registration behind. The first operator's registration is set aside meanwhile (the API server
    reports whichever webhook answers first) and restored."""
    adm = client.AdmissionregistrationV1Api(api)
    pki = control_plane.state / "pki"
    bad = _PairWithoutTheAddress(control_plane.state / "training-operator-bad", control_plane.kubeconfig,
                                 pki / "ca.crt", pki / "ca.key", ready_timeout=60, webhook_config="attune-to-bad",
                                 webhook_name="bad.validator.pytorchjob.training-operator.kubeflow.org")
    adm.delete_validating_webhook_configuration(WEBHOOK_CONFIG)
    try:
        with pytest.raises(RealClusterError, match=r'failed calling webhook "bad\.validator.*x509: cannot validate '
                                                   r"certificate for 127\.0\.0\.1"):
            bad.start()
        assert bad.proc is not None and bad.proc.poll() is not None
        assert "attune-to-bad" not in [c.metadata.name for c in adm.list_validating_webhook_configuration().items]
    finally:
        bad.stop()
        training_operator.register_webhook()
    names = [c.metadata.name for c in adm.list_validating_webhook_configuration().items]
    assert WEBHOOK_CONFIG in names and "attune-to-bad" not in names
