"""Kueue on the real control plane (issue 38): upstream's manager (``sigs.k8s.io/kueue/cmd/kueue`` at the release
``k8s/modules/kueue`` pins, built unchanged by k8s/build.sh) against the API server of ``k8s/up.sh``, on 127.0.0.1.

Upstream's manifests install Kueue behind a Service with certificates its own cert-controller keeps in a Secret; an API
server on 127.0.0.1 with no cluster network cannot reach that. So :class:`Kueue` does their part the local way, as
:class:`tests.k8s.realcluster_kubeflow.TrainingOperator` does for the training operator: it applies the release's CRDs
and webhook configurations (read from the Go module cache at run time, never copied into this repository), the latter
rewritten to reach the manager by URL on 127.0.0.1 with the control plane's CA as ``caBundle`` and kept to the kinds
it manages here (Kueue's own, ``batch/v1`` Jobs and PyTorchJobs: a webhook for a kind whose integration is off would
refuse every such object); it issues the manager's serving pair for IP 127.0.0.1 and starts it with a configuration
that binds the webhook and health probes to 127.0.0.1, turns metrics, leader election, internal certificates and the
visibility API server off, and enables those two integrations.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from tests.k8s.harness import free_port, wait_for
from tests.k8s.realcluster_kubeflow import (
    RealClusterError,
    _module_dir,
    end_process_group,
    issue_serving_pair,
    k8s_bin,
    status_message,
)

MODULE = "sigs.k8s.io/kueue"
GROUP, VERSION = "kueue.x-k8s.io", "v1beta2"
#: the integrations this harness enables (Kueue's framework names)
FRAMEWORKS = ("batch/job", "kubeflow.org/pytorchjob")
#: the resources whose webhooks are registered: Kueue's own and the enabled integrations' jobs
MANAGED = {("kueue.x-k8s.io", "*"), ("batch", "jobs"), ("kubeflow.org", "pytorchjobs")}
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"


def module_dir() -> Path:
    return _module_dir("kueue", MODULE)


def crds() -> list[dict[str, Any]]:
    """The release's CustomResourceDefinitions (config/components/crd/bases)."""
    folder = module_dir() / "config" / "components" / "crd" / "bases"
    if not folder.is_dir():
        raise RealClusterError(f"no Kueue CRDs in {folder}: run `make k8s-build` (it downloads Kueue's module)")
    return [yaml.safe_load(p.read_text()) for p in sorted(folder.glob("*.yaml"))]


def _manages(webhook: dict[str, Any]) -> bool:
    for rule in webhook.get("rules") or []:
        for group in rule.get("apiGroups") or []:
            for resource in rule.get("resources") or []:
                if (group, "*") in MANAGED or (group, resource) in MANAGED:
                    return True
    return False


def webhook_configurations(port: int, ca_bundle: bytes) -> list[dict[str, Any]]:
    """The release's Mutating and ValidatingWebhookConfigurations (config/components/webhook/manifests.yaml), only
    the webhooks of :data:`MANAGED`, each reaching ``https://127.0.0.1:<port><its path>`` and trusting ``ca_bundle``;
    renamed ``kueue-*`` as upstream's kustomization names them."""
    text = (module_dir() / "config" / "components" / "webhook" / "manifests.yaml").read_text()
    out = []
    for doc in yaml.safe_load_all(text):
        if not doc:
            continue
        doc = copy.deepcopy(doc)
        doc["metadata"] = {"name": "kueue-" + doc["metadata"]["name"]}
        hooks = []
        for hook in doc.get("webhooks") or []:
            if not _manages(hook):
                continue
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}",
                                    "caBundle": base64.b64encode(ca_bundle).decode()}
            hooks.append(hook)
        doc["webhooks"] = hooks
        out.append(doc)
    return out


class Kueue:
    """Kueue's manager against the control plane whose admin kubeconfig and CA are given (see the module doc).
    ``start()`` applies the CRDs, starts the manager, waits for its readiness probe, registers its webhooks and
    waits until the API server calls them; ``stop()`` unregisters them and ends the process group."""

    def __init__(self, state_dir: Path, kubeconfig: Path, ca_crt: Path, ca_key: Path,
                 ready_timeout: float = 180.0) -> None:
        self.state_dir, self.kubeconfig, self.ca_crt, self.ca_key = state_dir, kubeconfig, ca_crt, ca_key
        self.binary = k8s_bin() / "kueue"
        self.ready_timeout = ready_timeout
        self.webhook_port = self.health_port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = state_dir / "kueue.log"
        self.api = config.new_client_from_config(config_file=str(kubeconfig))
        self.registered: list[tuple[str, str]] = []

    def apply_crds(self) -> None:
        ext = client.ApiextensionsV1Api(self.api)
        names = []
        for crd in crds():
            names.append(crd["metadata"]["name"])
            try:
                ext.create_custom_resource_definition(crd)
            except ApiException as err:
                if err.status != 409:
                    raise

        def established(name: str) -> bool:
            conditions = ext.read_custom_resource_definition(name).status.conditions or []
            return any(c.type == "Established" and c.status == "True" for c in conditions)

        for name in names:
            wait_for(lambda n=name: established(n), self.ready_timeout, f"CRD {name} to be established", interval=0.2)

    def configuration(self, cert_dir: Path) -> dict[str, Any]:
        return {"apiVersion": f"config.{GROUP}/v1beta2", "kind": "Configuration",
                "health": {"healthProbeBindAddress": f"127.0.0.1:{self.health_port}"},
                "metrics": {"bindAddress": "0"},  # off: nothing scrapes Kueue here
                "webhook": {"host": "127.0.0.1", "port": self.webhook_port, "certDir": str(cert_dir)},
                "leaderElection": {"leaderElect": False},
                "internalCertManagement": {"enable": False},
                "manageJobsWithoutQueueName": False,
                "integrations": {"frameworks": list(FRAMEWORKS)}}

    def start(self) -> Kueue:
        if not os.access(self.binary, os.X_OK):
            raise RealClusterError(f"no Kueue binary at {self.binary}: run `make k8s-build`")
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.apply_crds()
        cert_dir = issue_serving_pair(self.ca_crt, self.ca_key, self.state_dir / "webhook-certs")
        self.webhook_port, self.health_port = free_port(), free_port()
        cfg = self.state_dir / "kueue-config.yaml"
        cfg.write_text(yaml.safe_dump(self.configuration(cert_dir)))
        cmd = [*self._volumes(cert_dir), str(self.binary), f"--config={cfg}", f"--kubeconfig={self.kubeconfig}",
               "--feature-gates=VisibilityOnDemand=false", "--zap-log-level=info"]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        try:
            wait_for(self._ready, self.ready_timeout, f"Kueue's /readyz (log: {self.log_path})")
            self.register_webhooks()
        except BaseException:
            self.stop()
            raise
        return self

    def _volumes(self, cert_dir: Path) -> list[str]:
        """The command prefix that gives the manager what upstream's Deployment mounts: without internal certificate
        management Kueue reads its metrics serving pair from the fixed path /etc/kueue/metrics/certs (even with
        metrics off). In a private mount namespace an overlay over /etc holds that folder; this machine's /etc is
        not touched."""
        probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "--", "true"], capture_output=True,
                               text=True)
        if probe.returncode != 0:
            raise RealClusterError("Kueue needs its certificates at /etc/kueue/metrics/certs, given here in a private "
                                   f"mount namespace, which this user cannot make: {probe.stderr.strip()} (run as "
                                   "root, or allow unprivileged user namespaces)")
        upper, work = self.state_dir / "etc-upper", self.state_dir / "etc-work"
        upper.mkdir(exist_ok=True)
        work.mkdir(exist_ok=True)
        script = ('mount -t overlay overlay -o "lowerdir=/etc,upperdir=$1,workdir=$2" /etc && '
                  'mkdir -p /etc/kueue/metrics/certs && cp "$3/tls.crt" "$3/tls.key" /etc/kueue/metrics/certs/ && '
                  'shift 3 && exec "$@"')
        return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script, "kueue-volumes",
                str(upper), str(work), str(cert_dir)]

    def _ready(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RealClusterError(f"Kueue exited with status {self.proc.returncode} before it was ready:\n"
                                   f"{self.log()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/readyz", timeout=2) as resp:
                return bool(resp.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def register_webhooks(self) -> None:
        adm = client.AdmissionregistrationV1Api(self.api)
        for body in webhook_configurations(self.webhook_port, self.ca_crt.read_bytes()):
            name = body["metadata"]["name"]
            if body["kind"] == "MutatingWebhookConfiguration":
                adm.create_mutating_webhook_configuration(body)
            else:
                adm.create_validating_webhook_configuration(body)
            self.registered.append((body["kind"], name))
        wait_for(self._webhook_enforced, self.ready_timeout, "the API server to call Kueue's webhooks")

    def _webhook_enforced(self) -> bool:
        """A dry-run ResourceFlavor with an invalid node label is refused by Kueue's validating webhook."""
        probe = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ResourceFlavor",
                 "metadata": {"name": "webhook-probe"}, "spec": {"nodeLabels": {"bad label!": "x"}}}
        try:
            client.CustomObjectsApi(self.api).create_cluster_custom_object(GROUP, VERSION, "resourceflavors", probe,
                                                                           dry_run="All")
        except ApiException as err:
            message = status_message(err)
            if "failed calling webhook" in message:
                raise RealClusterError(f"the API server cannot call Kueue's webhooks: {message}\n--- Kueue log ---\n"
                                       f"{self.log()[-3000:]}") from err
            return "admission webhook" in message or err.status == 422
        return False

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, grace: float = 20.0) -> None:
        adm = client.AdmissionregistrationV1Api(self.api)
        try:
            for kind, name in self.registered:
                try:
                    if kind == "MutatingWebhookConfiguration":
                        adm.delete_mutating_webhook_configuration(name, _request_timeout=5)
                    else:
                        adm.delete_validating_webhook_configuration(name, _request_timeout=5)
                except ApiException as err:
                    if err.status != 404:
                        raise
                except OSError:
                    pass  # the API server is gone already
        finally:
            end_process_group(self.proc, grace, "Kueue")
            self.api.close()

    def __enter__(self) -> Kueue:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def queues(api: client.ApiClient, namespace: str, cpu: str = "2", name: str = "attune") -> str:
    """A ResourceFlavor, a ClusterQueue of ``cpu`` CPUs (preemption within it by priority) and a LocalQueue in
    ``namespace`` pointing at it; returns the LocalQueue's name."""
    custom = client.CustomObjectsApi(api)
    custom.create_cluster_custom_object(GROUP, VERSION, "resourceflavors", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "ResourceFlavor", "metadata": {"name": f"{name}-flavor"}})
    custom.create_cluster_custom_object(GROUP, VERSION, "clusterqueues", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "ClusterQueue", "metadata": {"name": name},
        "spec": {"namespaceSelector": {}, "preemption": {"withinClusterQueue": "LowerPriority"},
                 "resourceGroups": [{"coveredResources": ["cpu", "memory"], "flavors": [
                     {"name": f"{name}-flavor", "resources": [{"name": "cpu", "nominalQuota": cpu},
                                                             {"name": "memory", "nominalQuota": "64Gi"}]}]}]}})
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "localqueues", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "LocalQueue", "metadata": {"name": name},
        "spec": {"clusterQueue": name}})
    return name


def priority_class(api: client.ApiClient, name: str, value: int) -> None:
    client.CustomObjectsApi(api).create_cluster_custom_object(GROUP, VERSION, "workloadpriorityclasses", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "WorkloadPriorityClass", "metadata": {"name": name},
        "value": value, "description": json.dumps(name)})
