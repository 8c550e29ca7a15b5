"""The operator's pod and log reads (attune.operator.kube over the official client) against the emulated API server,
whose pods/log endpoint serves what the stand-in kubelet wrote; API errors become LogsUnavailable, never a crash."""

from __future__ import annotations

import subprocess
import sys

import pytest
from kubernetes import client

from attune.frameworks.base import LogParser
from attune.operator.kube import Kube
from attune.operator.podlogs import LogsUnavailable, master_pod, pod_selector, read_log, split_timestamp
from tests.k8s.harness import NS, KubeletLog, kubeflow_pod_labels
from tests.k8s.kmock_plus import LOG_PATH_ANNOTATION

pytestmark = pytest.mark.k8s


def _pod(name: str, job: str, rtype: str, log_path: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NS, "labels": kubeflow_pod_labels(job, rtype, 0),
                         "annotations": {LOG_PATH_ANNOTATION: log_path}},
            "spec": {"containers": [{"name": "pytorch", "image": "x"}, {"name": "sidecar", "image": "y"}]}}


def test_the_master_pods_log_is_read_with_kubelet_timestamps(kube, tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", "import sys; print('out 1'); print('err 1', file=sys.stderr); "
                                                   "sys.stdout.flush(); print('out 2')"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    log = KubeletLog(proc, tmp_path / "kubelet.log")
    proc.wait(30)
    log.close()
    core = client.CoreV1Api(kube.api)
    core.create_namespaced_pod(NS, _pod("j-master-0", "j", "Master", str(log.path)))
    core.create_namespaced_pod(NS, _pod("j-worker-0", "j", "Worker", str(log.path)))
    core.create_namespaced_pod(NS, _pod("other-master-0", "other", "Master", str(log.path)))
    k = Kube(api=kube.api)
    pods = k.list_pods(NS, pod_selector("j"))
    assert sorted(p["metadata"]["name"] for p in pods) == ["j-master-0", "j-worker-0"]  # the selector is applied
    pod = master_pod(pods, "j")
    assert pod is not None and pod["metadata"]["name"] == "j-master-0"
    text = k.read_pod_log(NS, "j-master-0", "pytorch")
    lines = text.splitlines()
    assert sorted(split_timestamp(line)[1] for line in lines) == ["err 1", "out 1", "out 2"]  # both streams
    stamps = [split_timestamp(line)[0] for line in lines]
    assert all(s is not None for s in stamps) and stamps == sorted(stamps)
    assert read_log(text, LogParser()).lines == 3
    # without timestamps=true the API strips them, as the real one does
    plain = core.read_namespaced_pod_log("j-master-0", NS, container="pytorch", _preload_content=False).data.decode()
    assert sorted(plain.splitlines()) == ["err 1", "out 1", "out 2"]


def test_api_errors_are_logs_unavailable(kube, tmp_path):
    core = client.CoreV1Api(kube.api)
    core.create_namespaced_pod(NS, _pod("j-master-0", "j", "Master", str(tmp_path / "none.log")))
    k = Kube(api=kube.api)
    with pytest.raises(LogsUnavailable) as missing:
        k.read_pod_log(NS, "gone-master-0", "pytorch")
    assert missing.value.reason == "NotFound" and "gone-master-0" in str(missing.value)
    with pytest.raises(LogsUnavailable) as wrong:
        k.read_pod_log(NS, "j-master-0", "trainer")
    assert wrong.value.reason == "BadRequest" and "container trainer is not valid" in str(wrong.value)
    with pytest.raises(LogsUnavailable) as waiting:  # no log written yet: the container is still starting
        k.read_pod_log(NS, "j-master-0", "pytorch")
    assert waiting.value.reason == "BadRequest" and "waiting to start" in str(waiting.value)
