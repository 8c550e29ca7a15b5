"""Kueue, JobSet and Kubeflow Trainer v2 on the real control plane (issue 38): upstream's managers at the releases
``k8s/modules/{kueue,jobset,trainer}`` pin, built unchanged by k8s/build.sh, against the API server of ``k8s/up.sh``,
on 127.0.0.1.

Upstream's manifests install each behind a Service with certificates its own cert-controller keeps in a Secret; an API
server on 127.0.0.1 with no cluster network cannot reach that. So :class:`Manager` does their part the local way, as
:class:`tests.k8s.realcluster_kubeflow.TrainingOperator` does for the training operator: it applies the release's CRDs
and webhook configurations (read from the Go module cache at run time, never copied into this repository), the latter
rewritten to reach the manager by URL on 127.0.0.1 with the control plane's CA as ``caBundle`` (and, for Kueue, kept
to the kinds it manages here: a webhook for a kind whose integration is off would refuse every such object); it issues
the manager's serving pair for IP 127.0.0.1 and starts it with a configuration that binds its webhook and health probes
to 127.0.0.1 and turns metrics, leader election and internal certificates off.
"""

from __future__ import annotations

import base64
import copy
import os
import subprocess
from pathlib import Path
from typing import Any, ClassVar

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
    readyz,
    status_message,
)

GROUP, VERSION = "kueue.x-k8s.io", "v1beta2"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"


def _manages(webhook: dict[str, Any], managed: set[tuple[str, str]] | None) -> bool:
    if managed is None:
        return True
    for rule in webhook.get("rules") or []:
        for group in rule.get("apiGroups") or []:
            for resource in rule.get("resources") or []:
                if (group, "*") in managed or (group, resource) in managed:
                    return True
    return False


def webhook_configurations(manifests: Path, prefix: str, port: int, ca_bundle: bytes,
                           managed: set[tuple[str, str]] | None = None) -> list[dict[str, Any]]:
    """A release's Mutating and ValidatingWebhookConfigurations (its kubebuilder ``manifests.yaml``), the webhooks of
    ``managed`` (``(group, resource)``, ``"*"`` for a whole group; all when None), each reaching
    ``https://127.0.0.1:<port><its path>`` and trusting ``ca_bundle``; renamed ``<prefix>-*`` as upstream's
    kustomization names them."""
    out = []
    for doc in yaml.safe_load_all(manifests.read_text()):
        if not doc:
            continue
        doc = copy.deepcopy(doc)
        doc["metadata"] = {"name": f"{prefix}-" + doc["metadata"]["name"]}
        hooks = []
        for hook in doc.get("webhooks") or []:
            if not _manages(hook, managed):
                continue
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}",
                                    "caBundle": base64.b64encode(ca_bundle).decode()}
            hooks.append(hook)
        doc["webhooks"] = hooks
        out.append(doc)
    return out


class Manager:
    """An upstream controller manager against the control plane whose admin kubeconfig and CA are given (see the
    module doc). ``start()`` applies the CRDs, starts the manager, waits for its readiness probe, registers its webhooks
    and waits until the API server calls them (:meth:`webhook_probe`); ``stop()`` unregisters them and ends the
    process group. Subclasses say where their release keeps CRDs and webhooks and how it is configured."""

    name: ClassVar[str]
    binary_name: ClassVar[str]
    module: ClassVar[str]  # the Go module of the release
    wrapper: ClassVar[str]  # the folder in k8s/modules pinning it
    crd_dir: ClassVar[str]
    webhook_manifests: ClassVar[str]
    managed: ClassVar[set[tuple[str, str]] | None] = None

    def __init__(self, state_dir: Path, kubeconfig: Path, ca_crt: Path, ca_key: Path,
                 ready_timeout: float = 180.0) -> None:
        self.state_dir, self.kubeconfig, self.ca_crt, self.ca_key = state_dir, kubeconfig, ca_crt, ca_key
        self.binary = k8s_bin() / self.binary_name
        self.ready_timeout = ready_timeout
        self.webhook_port = self.health_port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = state_dir / f"{self.binary_name}.log"
        self.api = config.new_client_from_config(config_file=str(kubeconfig))
        self.registered: list[tuple[str, str]] = []

    def module_dir(self) -> Path:
        return _module_dir(self.wrapper, self.module)

    def crds(self) -> list[dict[str, Any]]:
        folder = self.module_dir() / self.crd_dir
        if not folder.is_dir():
            raise RealClusterError(f"no {self.name} CRDs in {folder}: run `make k8s-build` (it downloads the module)")
        return [yaml.safe_load(p.read_text()) for p in sorted(folder.glob("*.yaml"))
                if p.name != "kustomization.yaml"]

    def apply_crds(self) -> None:
        ext = client.ApiextensionsV1Api(self.api)
        names = []
        for crd in self.crds():
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

    # - what each manager differs in -
    def command(self, cert_dir: Path) -> list[str]:
        raise NotImplementedError

    def environment(self, cert_dir: Path) -> dict[str, str] | None:
        return None

    def webhook_probe(self) -> None:
        """A dry-run request one of the manager's validating webhooks refuses (raises ApiException when refused)."""
        raise NotImplementedError

    # - the process -
    def start(self) -> Manager:
        if not os.access(self.binary, os.X_OK):
            raise RealClusterError(f"no {self.name} binary at {self.binary}: run `make k8s-build`")
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.apply_crds()
        cert_dir = issue_serving_pair(self.ca_crt, self.ca_key, self.state_dir / "webhook-certs")
        self.webhook_port, self.health_port = free_port(), free_port()
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.command(cert_dir), stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True,
                                         env=self.environment(cert_dir))
        try:
            wait_for(self._ready, self.ready_timeout, f"{self.name}'s /readyz (log: {self.log_path})")
            self.register_webhooks()
        except BaseException:
            self.stop()
            raise
        return self

    def _ready(self) -> bool:
        return readyz(self.proc, self.health_port, self.name, self.log)

    def register_webhooks(self) -> None:
        adm = client.AdmissionregistrationV1Api(self.api)
        for body in webhook_configurations(self.module_dir() / self.webhook_manifests, self.binary_name,
                                           self.webhook_port, self.ca_crt.read_bytes(), self.managed):
            name = body["metadata"]["name"]
            if body["kind"] == "MutatingWebhookConfiguration":
                adm.create_mutating_webhook_configuration(body)
            else:
                adm.create_validating_webhook_configuration(body)
            self.registered.append((body["kind"], name))
        wait_for(self._webhook_enforced, self.ready_timeout, f"the API server to call {self.name}'s webhooks")

    def _webhook_enforced(self) -> bool:
        try:
            self.webhook_probe()
        except ApiException as err:
            message = status_message(err)
            if "failed calling webhook" in message:
                raise RealClusterError(f"the API server cannot call {self.name}'s webhooks: {message}\n--- log ---\n"
                                       f"{self.log()[-3000:]}") from err
            return "admission webhook" in message
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
            end_process_group(self.proc, grace, self.name)
            self.api.close()

    def __enter__(self) -> Manager:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _write_config(self, cfg: dict[str, Any]) -> Path:
        path = self.state_dir / f"{self.binary_name}-config.yaml"
        path.write_text(yaml.safe_dump(cfg))
        return path


class Kueue(Manager):
    """Kueue, managing batch Jobs and PyTorchJobs only (``FRAMEWORKS``). Without internal certificate management it
    reads a serving pair from the fixed path /etc/kueue/metrics/certs (even with metrics off): in a private mount
    namespace an overlay over /etc holds that folder, as upstream's Deployment mounts it; this machine's /etc is not
    touched (root is needed, as here). The visibility API server is off."""

    name, binary_name, module, wrapper = "Kueue", "kueue", "sigs.k8s.io/kueue", "kueue"
    crd_dir, webhook_manifests = "config/components/crd/bases", "config/components/webhook/manifests.yaml"
    FRAMEWORKS = ("batch/job", "kubeflow.org/pytorchjob")
    managed = {("kueue.x-k8s.io", "*"), ("batch", "jobs"), ("kubeflow.org", "pytorchjobs")}

    def command(self, cert_dir: Path) -> list[str]:
        cfg = self._write_config({
            "apiVersion": f"config.{GROUP}/v1beta2", "kind": "Configuration",
            "health": {"healthProbeBindAddress": f"127.0.0.1:{self.health_port}"},
            "metrics": {"bindAddress": "0"},  # off: nothing scrapes Kueue here
            "webhook": {"host": "127.0.0.1", "port": self.webhook_port, "certDir": str(cert_dir)},
            "leaderElection": {"leaderElect": False}, "internalCertManagement": {"enable": False},
            "manageJobsWithoutQueueName": False, "integrations": {"frameworks": list(self.FRAMEWORKS)}})
        return [*self._volumes(cert_dir), str(self.binary), f"--config={cfg}", f"--kubeconfig={self.kubeconfig}",
                "--feature-gates=VisibilityOnDemand=false", "--zap-log-level=info"]

    def _volumes(self, cert_dir: Path) -> list[str]:
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

    def webhook_probe(self) -> None:
        """A ResourceFlavor with an invalid node label, refused by Kueue's validating webhook."""
        client.CustomObjectsApi(self.api).create_cluster_custom_object(GROUP, VERSION, "resourceflavors", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "ResourceFlavor", "metadata": {"name": "webhook-probe"},
            "spec": {"nodeLabels": {"bad label!": "x"}}}, dry_run="All")


class JobSet(Manager):
    """JobSet's controller manager (Kubeflow Trainer v2 runs each TrainJob as a JobSet)."""

    name, binary_name, module, wrapper = "JobSet", "jobset", "sigs.k8s.io/jobset", "jobset"
    crd_dir, webhook_manifests = "config/components/crd/bases", "config/components/webhook/manifests.yaml"

    def command(self, cert_dir: Path) -> list[str]:
        cfg = self._write_config({
            "apiVersion": "config.jobset.x-k8s.io/v1alpha1", "kind": "Configuration",
            "health": {"healthProbeBindAddress": f"127.0.0.1:{self.health_port}"},
            "metrics": {"bindAddress": "0"},
            "webhook": {"host": "127.0.0.1", "port": self.webhook_port, "certDir": str(cert_dir)},
            "leaderElection": {"leaderElect": False}, "internalCertManagement": {"enable": False}})
        return [str(self.binary), f"--config={cfg}", f"--kubeconfig={self.kubeconfig}", "--zap-log-level=info"]

    def webhook_probe(self) -> None:
        """A JobSet without replicated jobs' names, refused by its validating webhook."""
        client.CustomObjectsApi(self.api).create_namespaced_custom_object(
            "jobset.x-k8s.io", "v1alpha2", "default", "jobsets",
            {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": "webhook-probe"},
             "spec": {"replicatedJobs": [{"name": "BAD_NAME", "replicas": 1, "template": {"spec": {"template": {
                 "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "x"}]}}}}}]}},
            dry_run="All")


class Trainer(Manager):
    """Kubeflow Trainer v2's controller manager. Its webhook server has no certificate folder setting:
    controller-runtime's default is ``$TMPDIR/k8s-webhook-server/serving-certs``, so the manager gets a ``TMPDIR`` of
    its own holding the pair there."""

    name, binary_name, module, wrapper = "Kubeflow Trainer", "trainer", "github.com/kubeflow/trainer/v2", "trainer"
    crd_dir, webhook_manifests = "manifests/base/crds", "manifests/base/webhook/manifests.yaml"

    def environment(self, cert_dir: Path) -> dict[str, str]:
        tmp = self.state_dir / "tmp"
        serving = tmp / "k8s-webhook-server" / "serving-certs"
        serving.mkdir(parents=True, exist_ok=True)
        for name in ("tls.crt", "tls.key"):
            (serving / name).write_bytes((cert_dir / name).read_bytes())
        return {**os.environ, "TMPDIR": str(tmp)}

    def command(self, cert_dir: Path) -> list[str]:
        cfg = self._write_config({
            "apiVersion": "config.trainer.kubeflow.org/v1alpha1", "kind": "Configuration",
            "health": {"healthProbeBindAddress": f"127.0.0.1:{self.health_port}"},
            "metrics": {"bindAddress": "0"},
            "webhook": {"host": "127.0.0.1", "port": self.webhook_port},
            "leaderElection": {"leaderElect": False}, "certManagement": {"enable": False}})
        return [str(self.binary), f"--config={cfg}", f"--kubeconfig={self.kubeconfig}", "--zap-log-level=info"]

    def runtime(self, name: str = "torch-distributed") -> dict[str, Any]:
        """The release's ClusterTrainingRuntime of that name (manifests/base/runtimes)."""
        for path in sorted((self.module_dir() / "manifests" / "base" / "runtimes").glob("*.yaml")):
            doc = yaml.safe_load(path.read_text())
            if isinstance(doc, dict) and doc.get("kind") == "ClusterTrainingRuntime" and \
                    doc["metadata"]["name"] == name:
                return dict(doc)
        raise RealClusterError(f"no ClusterTrainingRuntime {name} in Trainer's module")

    def webhook_probe(self) -> None:
        """A TrainJob naming no runtime that exists, refused by Trainer's validating webhook."""
        client.CustomObjectsApi(self.api).create_namespaced_custom_object(
            "trainer.kubeflow.org", "v1alpha1", "default", "trainjobs",
            {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "metadata": {"name": "webhook-probe"},
             "spec": {"runtimeRef": {"name": "no-such-runtime"}}}, dry_run="All")


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
        "value": value, "description": f"attune tests: priority {value}"})
