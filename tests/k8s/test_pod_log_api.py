"""The operator's pod and log reads (attune.operator.kube over the official client) against the real API server: the
pods are the real scheduler's, run by the pod runner (the Node's kubelet), whose containerLogs endpoint kube-apiserver
calls for pods/log; API errors become LogsUnavailable, never a crash."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client

from attune.frameworks.base import LogParser
from attune.operator.kube import Kube
from attune.operator.podlogs import LogsUnavailable, master_pod, pod_selector, read_log, split_timestamp
from tests.k8s.harness import kubeflow_pod_labels, wait_for
from tests.k8s.realcluster import ControlPlane

pytestmark = pytest.mark.k8s

#: two lines on stdout, one on stderr between them (flushed in order, so the kubelet stamps them in that order)
TRAINER = ("import sys; print('out 1', flush=True); print('err 1', file=sys.stderr, flush=True); "
           "print('out 2', flush=True)")


def _pod(name: str, job: str, rtype: str, code: str = TRAINER, env: list[dict[str, Any]] | None = None) -> dict:
    """A PyTorchJob replica's pod as the training operator labels it, with the trainer's ``pytorch`` container and a
    sidecar."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": kubeflow_pod_labels(job, rtype, 0)},
            "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 5, "containers": [
                {"name": "pytorch", "image": "trainer", "command": ["python", "-c", code], "env": env or []},
                {"name": "sidecar", "image": "sidecar", "command": ["python", "-c", "pass"]}]}}


def test_the_master_pods_log_is_read_with_kubelet_timestamps(control_plane: ControlPlane) -> None:
    cp = control_plane
    ns = cp.namespace("logs")
    core = client.CoreV1Api(cp.api)
    for name, job, rtype in (("j-master-0", "j", "Master"), ("j-worker-0", "j", "Worker"),
                             ("other-master-0", "other", "Master")):
        core.create_namespaced_pod(ns, _pod(name, job, rtype))
    assert cp.wait_pod_phase(ns, "j-master-0", ("Succeeded",), timeout=90).spec.node_name == "attune-node"
    k = Kube(api=cp.api)
    pods = k.list_pods(ns, pod_selector("j"))
    assert sorted(p["metadata"]["name"] for p in pods) == ["j-master-0", "j-worker-0"]  # the selector is applied
    pod = master_pod(pods, "j")
    assert pod is not None and pod["metadata"]["name"] == "j-master-0"
    text = k.read_pod_log(ns, "j-master-0", "pytorch")
    lines = text.splitlines()
    assert sorted(split_timestamp(line)[1] for line in lines) == ["err 1", "out 1", "out 2"]  # both streams
    stamps = [split_timestamp(line)[0] for line in lines]
    assert all(s is not None for s in stamps) and stamps == sorted(stamps)
    assert read_log(text, LogParser()).lines == 3
    # without timestamps=true the kubelet leaves them out
    plain = core.read_namespaced_pod_log("j-master-0", ns, container="pytorch", _preload_content=False).data.decode()
    assert sorted(plain.splitlines()) == ["err 1", "out 1", "out 2"]
    cp.delete_namespace(ns)


def test_api_errors_are_logs_unavailable(control_plane: ControlPlane) -> None:
    cp = control_plane
    ns = cp.namespace("logs")
    core = client.CoreV1Api(cp.api)
    # its environment names a ConfigMap that does not exist: the kubelet holds the container (it never starts)
    held = [{"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "absent", "key": "mode"}}}]
    core.create_namespaced_pod(ns, _pod("j-master-0", "j", "Master", env=held))
    k = Kube(api=cp.api)
    with pytest.raises(LogsUnavailable) as missing:
        k.read_pod_log(ns, "gone-master-0", "pytorch")
    assert missing.value.reason == "NotFound" and "gone-master-0" in str(missing.value)
    with pytest.raises(LogsUnavailable) as wrong:  # the API server itself refuses a container the pod lacks
        k.read_pod_log(ns, "j-master-0", "trainer")
    assert wrong.value.reason == "BadRequest" and "container trainer is not valid" in str(wrong.value)

    def held_back() -> bool:
        statuses = core.read_namespaced_pod("j-master-0", ns).status.container_statuses or []
        waiting = next((s.state.waiting for s in statuses if s.name == "pytorch"), None)
        return waiting is not None and waiting.reason == "CreateContainerConfigError"

    wait_for(held_back, 60, "the kubelet to hold the container back")
    with pytest.raises(LogsUnavailable) as waiting:  # no log written: the kubelet says the container waits
        k.read_pod_log(ns, "j-master-0", "pytorch")
    assert waiting.value.reason == "BadRequest" and "waiting to start" in str(waiting.value)
    cp.delete_namespace(ns)
