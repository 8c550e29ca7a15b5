"""The real control plane under the tests: ``k8s/up.sh`` (etcd, kube-apiserver, kube-controller-manager,
kube-scheduler built from the pinned Go modules, and the pod runner as the Node's kubelet) in a state folder of its
own on free 127.0.0.1 ports, stopped with ``k8s/down.sh``. One per test worker (``control_plane`` fixture); tests
share it through namespaces of their own."""

from __future__ import annotations

import json
import os
import re
import subprocess
import uuid
from pathlib import Path
from typing import Any

from kubernetes import client, config

from tests.k8s.harness import ROOT, child_env, free_port, free_port_block, wait_for

UP_TIMEOUT_S = 3600  # a cold cache builds the components first (tens of minutes on two cores: k8s/BUILD.md)


def k8s_version() -> str:
    text = (ROOT / "k8s" / "modules" / "kubernetes" / "go.mod").read_text()
    m = re.search(r"^\s*(?:require\s+)?k8s\.io/kubernetes\s+(v1\.\d+\.\d+)\b", text, re.M)
    if not m:
        raise RuntimeError("no k8s.io/kubernetes release in k8s/modules/kubernetes/go.mod")
    return m.group(1)


def bin_dir() -> Path:
    cache = os.environ.get("ATTUNE_K8S_CACHE") or str(Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
                                                      / "attune" / "k8s")
    return Path(cache) / k8s_version() / "bin"


class ControlPlane:
    """A running control plane (see the module doc). ``api`` is an admin client (system:masters)."""

    def __init__(self, state: Path, node: bool = True) -> None:
        self.state = state
        etcd = free_port_block(2)
        self.ports = {"API": free_port(), "KCM": free_port(), "SCHED": free_port(), "KUBELET": free_port(),
                      "ETCD": etcd}
        self.env = {**{f"ATTUNE_K8S_{k}_PORT": str(v) for k, v in self.ports.items()},
                    "ATTUNE_K8S_STATE": str(state), "ATTUNE_K8S_NODE": "runner" if node else "none"}
        self.up_output = self._script("up.sh", UP_TIMEOUT_S)
        self.url = f"https://127.0.0.1:{self.ports['API']}"
        self.kubeconfig = state / "admin.kubeconfig"
        self.ca = state / "pki" / "ca.crt"
        cfg = client.Configuration()
        config.load_kube_config(config_file=str(self.kubeconfig), client_configuration=cfg)
        self.api = client.ApiClient(cfg)
        self.core = client.CoreV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)
        self.node = "attune-node" if node else None

    def _script(self, name: str, timeout: float) -> str:
        res = subprocess.run(["bash", str(ROOT / "k8s" / name)], capture_output=True, text=True, timeout=timeout,
                             env=child_env(self.env), cwd=ROOT)
        if res.returncode != 0:
            raise RuntimeError(f"k8s/{name} failed ({res.returncode}):\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
        return res.stdout + res.stderr

    def stop(self) -> str:
        return self._script("down.sh", 120)

    def pids(self) -> list[int]:
        """The processes k8s/up.sh recorded that still run."""
        out = []
        for f in (self.state / "pids").glob("*.pid"):
            pid = int(f.read_text())
            try:
                os.kill(pid, 0)
                out.append(pid)
            except ProcessLookupError:
                pass
        return out

    # - tools -
    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True,
                kubeconfig: Path | None = None) -> subprocess.CompletedProcess[str]:
        """The kubectl built at the same Kubernetes release."""
        res = subprocess.run([str(bin_dir() / "kubectl"), f"--kubeconfig={kubeconfig or self.kubeconfig}", *args],
                             input=stdin, capture_output=True, text=True, timeout=120)
        if check and res.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed: {res.stderr.strip()}")
        return res

    def namespace(self, prefix: str = "t") -> str:
        """A new namespace of its own for a test."""
        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        self.core.create_namespace({"metadata": {"name": name}})
        return name

    def delete_namespace(self, name: str, timeout: float = 120) -> None:
        """Deletes ``name`` and waits until the namespace controller has removed it and everything in it."""
        try:
            self.core.delete_namespace(name)
        except client.exceptions.ApiException as err:
            if err.status != 404:
                raise
        wait_for(lambda: not self._exists(name), timeout, f"namespace {name} to be deleted", interval=0.25)

    def _exists(self, ns: str) -> bool:
        try:
            self.core.read_namespace(ns)
            return True
        except client.exceptions.ApiException as err:
            if err.status == 404:
                return False
            raise

    def token(self, namespace: str, service_account: str, seconds: int = 3600) -> str:
        """A token of ``service_account`` issued by the API server (TokenRequest), as a pod would mount."""
        req = self.core.create_namespaced_service_account_token(
            service_account, namespace, {"spec": {"expirationSeconds": seconds}})
        return str(req.status.token)

    def token_kubeconfig(self, path: Path, token: str, namespace: str = "default") -> Path:
        """A kubeconfig for ``token`` against this API server, verifying its serving certificate."""
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "attune",
            "clusters": [{"name": "attune", "cluster": {"server": self.url, "certificate-authority": str(self.ca)}}],
            "users": [{"name": "u", "user": {"token": token}}],
            "contexts": [{"name": "attune", "context": {"cluster": "attune", "user": "u", "namespace": namespace}}]}))
        return path

    def client_for(self, kubeconfig: Path) -> client.ApiClient:
        cfg = client.Configuration()
        config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
        return client.ApiClient(cfg)

    def audit(self, user: str | None = None, since: float = 0.0) -> list[dict[str, Any]]:
        """The API server's audit events (stage ResponseComplete), of ``user`` when given, at or after ``since``."""
        out = []
        path = self.state / "logs" / "audit.log"
        for line in path.read_text().splitlines() if path.exists() else []:
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line being written
            if event.get("stage") != "ResponseComplete":
                continue
            if user is not None and (event.get("user") or {}).get("username") != user:
                continue
            if since and _event_time(event) < since:
                continue
            out.append(event)
        return out

    def set_images(self, images: dict[str, Path]) -> None:
        """Tell the pod runner which local folder holds each image's files (read when a container starts)."""
        path = self.state / "images.json"
        current = json.loads(path.read_text()) if path.exists() else {}
        current.update({k: str(v) for k, v in images.items()})
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(current))
        tmp.replace(path)

    def pod_log(self, namespace: str, pod: str, **kw: Any) -> str:
        return str(self.core.read_namespaced_pod_log(pod, namespace, **kw))

    def wait_pod_phase(self, namespace: str, pod: str, phases: tuple[str, ...], timeout: float = 60) -> Any:
        def phase() -> Any:
            try:
                p = self.core.read_namespaced_pod(pod, namespace)
            except client.exceptions.ApiException as err:
                if err.status == 404:
                    return None
                raise
            return p if p.status.phase in phases else None

        return wait_for(phase, timeout, f"pod {namespace}/{pod} to be {' or '.join(phases)}", interval=0.2)


def _event_time(event: dict[str, Any]) -> float:
    stamp = str(event.get("stageTimestamp") or event.get("requestReceivedTimestamp") or "")
    if not stamp:
        return 0.0
    from datetime import datetime

    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()

