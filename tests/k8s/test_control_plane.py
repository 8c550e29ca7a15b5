"""The real control plane itself (k8s/up.sh, k8s/down.sh) and the pod runner that plays its Node's kubelet: what the
operator tests rely on, shown on the real API server, scheduler and controllers."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from kubernetes import client

from tests.k8s.harness import wait_for
from tests.k8s.realcluster import ControlPlane
from tests.k8s.realcluster_kubeflow import k8s_bin, listening_addresses

pytestmark = [pytest.mark.k8s]


def _pod(name: str, code: str, restart: str = "Never", settings: bool = True) -> dict:
    env = [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
           {"name": "GREETING", "value": "hello $(POD_NAME)"}]
    if settings:
        env.append({"name": "FROM_MAP", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "mode"}}})
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"restartPolicy": restart, "terminationGracePeriodSeconds": 5, "containers": [{
                "name": "main", "image": "python:3", "command": ["python", "-c", code], "env": env,
                "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}]}}


def test_up_lists_the_node_and_down_leaves_no_process(tmp_path: Path) -> None:
    cp = ControlPlane(tmp_path / "k8s")
    try:
        nodes = cp.core.list_node().items
        assert [n.metadata.name for n in nodes] == ["attune-node"]
        node = nodes[0]
        assert [(a.type, a.address) for a in node.status.addresses if a.type == "InternalIP"] == [("InternalIP",
                                                                                                   "127.0.0.1")]
        assert any(c.type == "Ready" and c.status == "True" for c in node.status.conditions)
        assert client.VersionApi(cp.api).get_code().git_version == k8s_bin().parent.name
        pids = cp.pids()
        assert len(pids) == 5  # etcd, kube-apiserver, kube-controller-manager, kube-scheduler, pod runner
        # every listener of these processes is on 127.0.0.1
        for pid in pids:
            for addr, port in listening_addresses(pid):
                assert addr == "127.0.0.1", (pid, addr, port)
    finally:
        out = cp.stop()
    assert "k8s-down: stopped" in out
    assert not cp.pids()
    # a second start reuses the cached binaries
    again = ControlPlane(tmp_path / "k8s-again", node=False)
    try:
        assert "reused" in again.up_output and "building" not in again.up_output
    finally:
        again.stop()


def test_a_pod_is_scheduled_run_and_its_log_read_through_the_api_server(control_plane: ControlPlane) -> None:
    cp = control_plane
    ns = cp.namespace("pods")
    cp.core.create_namespaced_config_map(ns, {"metadata": {"name": "settings"}, "data": {"mode": "fast"}})
    code = ("import os, sys, time\nfor i in range(3):\n    print('step', i, os.environ['GREETING'], "
            "os.environ['FROM_MAP'], flush=True)\n    time.sleep(0.2)\nprint('oops', file=sys.stderr)\nsys.exit(3)")
    cp.core.create_namespaced_pod(ns, _pod("hello", code))
    pod = cp.wait_pod_phase(ns, "hello", ("Failed", "Succeeded"))
    assert pod.status.phase == "Failed" and pod.spec.node_name == "attune-node"  # bound by the real scheduler
    assert pod.status.pod_ip == "127.0.0.1" and pod.status.host_ip == "127.0.0.1"
    term = pod.status.container_statuses[0].state.terminated
    assert term.exit_code == 3 and term.reason == "Error"
    log = cp.pod_log(ns, "hello")
    assert log.splitlines() == [f"step {i} hello hello fast" for i in range(3)] + ["oops"]
    stamped = cp.pod_log(ns, "hello", timestamps=True, tail_lines=2).splitlines()
    assert len(stamped) == 2 and stamped[1].endswith(" oops") and stamped[0].split(" ")[0].endswith("Z")
    assert cp.pod_log(ns, "hello", limit_bytes=6) == "step 0"
    cp.delete_namespace(ns)


def test_a_missing_config_map_holds_the_container_as_a_kubelet_does(control_plane: ControlPlane) -> None:
    cp = control_plane
    ns = cp.namespace("cfg")
    cp.core.create_namespaced_pod(ns, _pod("waits", "print('ran')"))

    def reason() -> str | None:
        statuses = cp.core.read_namespaced_pod("waits", ns).status.container_statuses or []
        waiting = statuses[0].state.waiting if statuses else None
        return waiting.reason if waiting else None

    # (ContainerCreating first, while the pod runner resolves the environment)
    wait_for(lambda: reason() == "CreateContainerConfigError", 30, "the pod runner to hold the container")
    with pytest.raises(client.exceptions.ApiException) as err:
        cp.pod_log(ns, "waits")
    assert err.value.status == 400 and "waiting to start" in err.value.body
    cp.core.create_namespaced_config_map(ns, {"metadata": {"name": "settings"}, "data": {"mode": "late"}})
    assert cp.wait_pod_phase(ns, "waits", ("Succeeded",), timeout=30)
    assert cp.pod_log(ns, "waits") == "ran\n"
    cp.delete_namespace(ns)


def test_deleting_a_running_pod_stops_its_process_and_a_crash_is_restarted(control_plane: ControlPlane) -> None:
    cp = control_plane
    ns = cp.namespace("del")
    pidfile = cp.state / f"{ns}.pid"
    code = (f"import os, time, signal, sys\nopen({str(pidfile)!r}, 'w').write(str(os.getpid()))\n"
            "signal.signal(signal.SIGTERM, lambda *a: (print('bye', flush=True), sys.exit(0)))\n"
            "while True:\n    print('tick', flush=True)\n    time.sleep(0.2)")
    cp.core.create_namespaced_pod(ns, _pod("loop", code, settings=False))
    cp.wait_pod_phase(ns, "loop", ("Running",))
    wait_for(lambda: "tick" in cp.pod_log(ns, "loop"), 30, "the pod's first line")
    pid = int(wait_for(lambda: pidfile.exists() and pidfile.read_text(), 10, "the pid"))
    # follow=true streams through the API server until the container ends
    stream = cp.core.read_namespaced_pod_log("loop", ns, follow=True, _preload_content=False)
    cp.core.delete_namespaced_pod("loop", ns)
    wait_for(lambda: not _alive(pid), 20, "the process to stop on the pod's deletion")
    followed = stream.read().decode()
    assert followed.rstrip().endswith("bye")  # it got SIGTERM first
    wait_for(lambda: not cp.core.list_namespaced_pod(ns).items, 20, "the pod object to go")

    crash = "import sys, os\nprint('run', flush=True)\nsys.exit(1)"
    cp.core.create_namespaced_pod(ns, _pod("crash", crash, restart="OnFailure", settings=False))

    def restarted() -> int:
        statuses = cp.core.read_namespaced_pod("crash", ns).status.container_statuses or []
        return statuses[0].restart_count if statuses else 0

    wait_for(lambda: restarted() >= 2, 30, "two restarts")
    assert cp.pod_log(ns, "crash", previous=True) == "run\n"
    cp.delete_namespace(ns)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] if Path(f"/proc/{pid}").exists() \
        else "X"
    return state not in ("Z", "X")


def test_the_job_controller_and_the_garbage_collector_are_real(control_plane: ControlPlane) -> None:
    """A batch Job's pod is created by the real job controller; deleting the Job in the background lets the real
    garbage collector remove its pods through their ownerReferences (which the emulator never did)."""
    cp = control_plane
    ns = cp.namespace("gc")
    batch = client.BatchV1Api(cp.api)
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "sleepy"}, "spec": {
        "backoffLimit": 0, "template": {"spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 2,
                                                 "containers": [{"name": "main", "image": "python:3", "command": [
                                                     "python", "-c", "import time; print('up', flush=True); "
                                                     "time.sleep(600)"]}]}}}}
    batch.create_namespaced_job(ns, job)
    pod = wait_for(lambda: next(iter(cp.core.list_namespaced_pod(ns, label_selector="job-name=sleepy").items), None),
                   30, "the job controller to create the pod")
    owner = pod.metadata.owner_references[0]
    assert (owner.kind, owner.name, owner.controller) == ("Job", "sleepy", True)
    cp.wait_pod_phase(ns, pod.metadata.name, ("Running",))
    started = time.monotonic()
    batch.delete_namespaced_job("sleepy", ns, propagation_policy="Background")
    wait_for(lambda: not cp.core.list_namespaced_pod(ns).items, 60, "the garbage collector to delete the pod")
    print(f"pod collected {time.monotonic() - started:.1f} s after its Job's deletion")
    cp.delete_namespace(ns)


def test_the_kubelet_endpoint_serves_the_api_server_only(control_plane: ControlPlane) -> None:
    import ssl

    import httpx

    port = control_plane.ports["KUBELET"]
    pki = control_plane.state / "pki"
    anonymous = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    with pytest.raises(httpx.HTTPError):  # no client certificate: the TLS handshake is refused
        httpx.get(f"https://127.0.0.1:{port}/healthz", verify=anonymous, timeout=5)
    admin = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    admin.load_cert_chain(pki / "admin.crt", pki / "admin.key")
    answer = httpx.get(f"https://127.0.0.1:{port}/containerLogs/default/x/y", verify=admin, timeout=5)
    assert answer.status_code == 403  # another client of the same CA is not the API server
