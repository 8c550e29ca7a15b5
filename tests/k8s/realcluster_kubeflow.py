"""The real Kubeflow training operator on a real control plane (issue 38): our ``attune-training-operator``
(k8s/modules/training-operator, the v1.9.4 library's PyTorchJob controller and validating webhook) started against the
API server of ``k8s/up.sh``, on 127.0.0.1 only.

Upstream's deployment registers its webhook through a Service (``training-operator.kubeflow.svc``) and keeps the
certificate in a Secret; an API server on 127.0.0.1 with no cluster network cannot reach that. So
:class:`TrainingOperator` does what the deployment's manifests and cert-controller do, the local way: it applies the
release's PyTorchJob CRD (read from the Go module cache at run time, never copied into this repository), issues a
serving certificate for IP 127.0.0.1 from the control plane's CA, starts the binary in its own process group on free
loopback ports, and registers a ValidatingWebhookConfiguration by URL with that CA as its ``caBundle``.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import os
import re
import signal
import subprocess
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import urllib3
import yaml
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from attune.operator import certs
from tests.k8s.harness import free_port, wait_for

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "k8s"
GROUP, VERSION, PLURAL = "kubeflow.org", "v1", "pytorchjobs"
#: the path controller-runtime registers for a kubeflow.org/v1 PyTorchJob validator ("/validate-<group with dashes>-
#: <version>-<kind in lower case>"; upstream's kubebuilder marker names the same)
VALIDATE_PATH = "/validate-kubeflow-org-v1-pytorchjob"
#: the webhook's name, as upstream's manifests call it; the API server quotes it when it refuses a request
WEBHOOK_NAME = "validator.pytorchjob.training-operator.kubeflow.org"
WEBHOOK_CONFIG = "attune-training-operator"
OPERATOR_MODULE = "github.com/kubeflow/training-operator"
CRD_FILE = "manifests/base/crds/kubeflow.org_pytorchjobs.yaml"


class RealClusterError(RuntimeError):
    """The real control plane or operator could not be used: the message says what to do."""


def _required_version(go_mod: Path, module: str) -> str:
    """The version ``go_mod`` requires of ``module`` (a ``require`` line or block entry)."""
    match = re.search(rf"^\s*(?:require\s+)?{re.escape(module)}\s+(v\S+)", go_mod.read_text(), re.MULTILINE)
    if not match:
        raise RealClusterError(f"{go_mod} requires no version of {module}")
    return match.group(1)


def k8s_cache() -> Path:
    """The folder k8s/build.sh builds into (``ATTUNE_K8S_CACHE``; the same rule as k8s/env.sh)."""
    if os.environ.get("ATTUNE_K8S_CACHE"):
        return Path(os.environ["ATTUNE_K8S_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "attune" / "k8s"


def k8s_bin() -> Path:
    """Where the built binaries are: ``<cache>/<Kubernetes version>/bin``."""
    return k8s_cache() / _required_version(K8S / "modules" / "kubernetes" / "go.mod", "k8s.io/kubernetes") / "bin"


def operator_module_dir() -> Path:
    """The training operator release's source in the Go module cache (``ATTUNE_K8S_GOMODCACHE``), which k8s/build.sh
    downloads; the version is the one k8s/modules/training-operator pins."""
    return _module_dir("training-operator", OPERATOR_MODULE)


def _module_dir(wrapper: str, module: str) -> Path:
    """``module``'s source in the Go module cache k8s/build.sh downloads into (``ATTUNE_K8S_GOMODCACHE``), at the
    version the wrapper module ``k8s/modules/<wrapper>`` pins."""
    version = _required_version(K8S / "modules" / wrapper / "go.mod", module)
    gomod = Path(os.environ.get("ATTUNE_K8S_GOMODCACHE") or k8s_cache() / "gomod")
    return gomod / f"{module}@{version}"


MONITORING_MODULE = "github.com/prometheus-operator/prometheus-operator"
MONITOR_KINDS = ("podmonitors", "servicemonitors", "prometheusrules", "prometheuses")


def monitor_crds() -> list[dict[str, Any]]:
    """The Prometheus Operator release's PodMonitor, ServiceMonitor, PrometheusRule and Prometheus CRDs
    (k8s/modules/crds pins it), read from the module cache: with them served, the chart renders and installs its
    monitors and alerts as on a cluster with the operator (the API server validates the rule against the CRD's
    schema), and the operator's start-up reads the Prometheus objects that select its PodMonitor."""
    folder = _module_dir("crds", MONITORING_MODULE) / "example" / "prometheus-operator-crd"
    out = []
    for kind in MONITOR_KINDS:
        path = folder / f"monitoring.coreos.com_{kind}.yaml"
        if not path.is_file():
            raise RealClusterError(f"no {kind} CRD at {path}: run `make k8s-build` (it downloads the Prometheus "
                                   "Operator's module), or set ATTUNE_K8S_GOMODCACHE to the module cache it used")
        out.append(yaml.safe_load(path.read_text()))
    return out


def pytorchjob_crd() -> dict[str, Any]:
    """The release's PyTorchJob CustomResourceDefinition, read from the module cache."""
    path = operator_module_dir() / CRD_FILE
    if not path.is_file():
        raise RealClusterError(f"no PyTorchJob CRD at {path}: run `make k8s-build` (it downloads the training "
                               "operator's module), or set ATTUNE_K8S_GOMODCACHE to the module cache it used")
    crd: dict[str, Any] = yaml.safe_load(path.read_text())
    return crd


def pytorchjob(name: str, namespace: str, master_replicas: int = 1, command: tuple[str, ...] = ("true",),
               image: str = "busybox:1.36") -> dict[str, Any]:
    """A PyTorchJob with a Master replica only (``restartPolicy: Never``) whose container, ``pytorch`` as the
    operator requires, runs ``command``. Nothing pulls the image: the local control plane has no kubelet."""
    container = {"name": "pytorch", "image": image, "command": list(command)}
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "PyTorchJob",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"pytorchReplicaSpecs": {"Master": {
                "replicas": master_replicas, "restartPolicy": "Never",
                "template": {"spec": {"containers": [container]}}}}}}


def status_message(err: ApiException) -> str:
    """The message of the API server's Status in a refused request's body (the body itself if it is not one)."""
    try:
        return str(json.loads(err.body or "")["message"])
    except (ValueError, KeyError, TypeError):
        return str(err.body)


def listening_addresses(pid: int) -> list[tuple[str, int]]:
    """The (address, port) of every TCP socket process ``pid`` listens on, from /proc (IPv6 ones as ``[hex]``)."""
    inodes = set()
    for fd in (Path("/proc") / str(pid) / "fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    found = []
    for table, v6 in (("tcp", False), ("tcp6", True)):
        lines = (Path("/proc") / str(pid) / "net" / table).read_text().splitlines()[1:]
        for line in lines:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state != "0A" or inode not in inodes:  # 0A: LISTEN
                continue
            addr_hex, port_hex = local.split(":")
            addr = f"[{addr_hex}]" if v6 else ".".join(str(b) for b in reversed(bytes.fromhex(addr_hex)))
            found.append((addr, int(port_hex, 16)))
    return found


def issue_serving_pair(ca_crt: Path, ca_key: Path, cert_dir: Path) -> Path:
    """tls.crt and tls.key in ``cert_dir`` for IP 127.0.0.1 (the URL a webhook is registered with), signed by the
    control plane's CA."""
    cert_dir.mkdir(parents=True, exist_ok=True)
    crt, key = certs.new_serving(ca_crt.read_bytes(), ca_key.read_bytes(), ["localhost"], dt.datetime.now(dt.UTC),
                                 ip_addresses=["127.0.0.1"])
    (cert_dir / "tls.crt").write_bytes(crt)
    key_file = cert_dir / "tls.key"
    key_file.touch(mode=0o600)
    key_file.write_bytes(key)
    return cert_dir


def readyz(proc: subprocess.Popen[bytes] | None, health_port: int, what: str, log: Callable[[], str]) -> bool:
    """Whether a controller manager's ``/readyz`` on 127.0.0.1 answers 200; raises, with the end of its log, if the
    process has exited instead."""
    assert proc is not None
    if proc.poll() is not None:
        raise RealClusterError(f"{what} exited with status {proc.returncode} before it was ready:\n{log()[-3000:]}")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{health_port}/readyz", timeout=2) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def end_process_group(proc: subprocess.Popen[bytes] | None, grace: float, what: str) -> None:
    """Ends ``proc``'s process group (it leads one: ``start_new_session``): SIGTERM, then SIGKILL after ``grace``
    seconds; raises if a process of the group is left."""
    if proc is None:
        return
    pgid = proc.pid
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(wait)
            break
        except subprocess.TimeoutExpired:
            continue
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return
    raise RealClusterError(f"process group {pgid} of {what} still runs after SIGKILL")


class TrainingOperator:
    """Our training operator binary against the control plane whose admin kubeconfig and CA are given.

    ``start()`` applies the CRD and waits until it is established, issues the webhook's serving pair under
    ``state_dir``, starts the binary (its log: ``state_dir/training-operator.log``), waits until its ``/readyz``
    answers, registers the webhook, and waits until the API server enforces it. ``stop()`` removes the webhook
    registration and ends the process group (SIGTERM, then SIGKILL). Usable as a context manager.
    """

    def __init__(self, state_dir: Path, kubeconfig: Path, ca_crt: Path, ca_key: Path, binary: Path | None = None,
                 ready_timeout: float = 120.0, webhook_config: str = WEBHOOK_CONFIG,
                 webhook_name: str = WEBHOOK_NAME) -> None:
        self.state_dir, self.kubeconfig, self.ca_crt, self.ca_key = state_dir, kubeconfig, ca_crt, ca_key
        # the ValidatingWebhookConfiguration's name and its webhook's (which the API server's messages quote)
        self.webhook_config, self.webhook_name = webhook_config, webhook_name
        self.binary = binary or k8s_bin() / "training-operator"
        self.ready_timeout = ready_timeout
        self.webhook_port = self.health_port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = state_dir / "training-operator.log"
        self.api = config.new_client_from_config(config_file=str(kubeconfig))

    # --- the pieces upstream's manifests and cert-controller provide ---------------------------------------------
    def apply_crd(self) -> None:
        crd = pytorchjob_crd()
        ext = client.ApiextensionsV1Api(self.api)
        try:
            ext.create_custom_resource_definition(crd)
        except ApiException as err:
            if err.status != 409:
                raise
            crd["metadata"]["resourceVersion"] = ext.read_custom_resource_definition(
                crd["metadata"]["name"]).metadata.resource_version
            ext.replace_custom_resource_definition(crd["metadata"]["name"], crd)

        def established() -> bool:
            conditions = ext.read_custom_resource_definition(crd["metadata"]["name"]).status.conditions or []
            return any(c.type == "Established" and c.status == "True" for c in conditions)

        wait_for(established, self.ready_timeout, "the PyTorchJob CRD to be established")

    def issue_serving_pair(self) -> Path:
        return issue_serving_pair(self.ca_crt, self.ca_key, self.state_dir / "webhook-certs")

    @property
    def webhook_url(self) -> str:
        return f"https://127.0.0.1:{self.webhook_port}{VALIDATE_PATH}"

    def webhook_configuration(self) -> dict[str, Any]:
        rule = {"apiGroups": [GROUP], "apiVersions": [VERSION], "operations": ["CREATE", "UPDATE"],
                "resources": [PLURAL], "scope": "Namespaced"}
        return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
                "metadata": {"name": self.webhook_config},
                "webhooks": [{"name": self.webhook_name, "admissionReviewVersions": ["v1"], "sideEffects": "None",
                              "failurePolicy": "Fail", "timeoutSeconds": 10, "rules": [rule],
                              "clientConfig": {"url": self.webhook_url,
                                               "caBundle": base64.b64encode(self.ca_crt.read_bytes()).decode()}}]}

    def register_webhook(self) -> None:
        adm = client.AdmissionregistrationV1Api(self.api)
        body = self.webhook_configuration()
        try:
            adm.create_validating_webhook_configuration(body)
        except ApiException as err:
            if err.status != 409:
                raise
            body["metadata"]["resourceVersion"] = adm.read_validating_webhook_configuration(
                self.webhook_config).metadata.resource_version
            adm.replace_validating_webhook_configuration(self.webhook_config, body)
        wait_for(self._webhook_enforced, self.ready_timeout, "the API server to call the PyTorchJob webhook")

    def _webhook_enforced(self) -> bool:
        """A dry-run create of a PyTorchJob the webhook refuses (two Masters) is refused by it: the API server has
        picked up the registration and reaches the server over TLS. A failed call is an error at once (the URL or
        the certificate is wrong), not something to wait out. Another registration's answer (the API server reports
        whichever webhook answered first) does not count."""
        try:
            client.CustomObjectsApi(self.api).create_namespaced_custom_object(
                GROUP, VERSION, "default", PLURAL, pytorchjob("webhook-probe", "default", master_replicas=2),
                dry_run="All")
        except ApiException as err:
            message = status_message(err)
            if message.startswith(f'admission webhook "{self.webhook_name}" denied the request'):
                return True
            if f'failed calling webhook "{self.webhook_name}"' in message:
                raise RealClusterError(f"the API server cannot call the webhook at {self.webhook_url}: {message}"
                                       f"\n--- operator log ---\n{self.log()[-3000:]}") from err
            if "admission webhook" in message or "failed calling webhook" in message:
                return False  # another registration answered first
            raise
        return False  # accepted: the API server does not call the webhook yet

    # --- the process ---------------------------------------------------------------------------------------------
    def start(self) -> TrainingOperator:
        if not os.access(self.binary, os.X_OK):
            raise RealClusterError(f"no training operator binary at {self.binary}: run `make k8s-build`")
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.apply_crd()
        cert_dir = self.issue_serving_pair()
        self.webhook_port, self.health_port = free_port(), free_port()
        cmd = [str(self.binary), "--kubeconfig", str(self.kubeconfig), "--webhook-port", str(self.webhook_port),
               "--webhook-cert-dir", str(cert_dir), "--health-port", str(self.health_port), "--zap-log-level", "info"]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        try:
            wait_for(self._ready, self.ready_timeout, f"the training operator's /readyz (log: {self.log_path})")
            self.register_webhook()
        except BaseException:
            self.stop()
            raise
        return self

    def _ready(self) -> bool:
        return readyz(self.proc, self.health_port, "the training operator", self.log)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, grace: float = 20.0) -> None:
        """Unregisters the webhook (so the API server does not refuse PyTorchJobs for want of it) and ends the
        process group: SIGTERM, then SIGKILL after ``grace`` seconds. Raises if a process of the group is left."""
        try:
            client.AdmissionregistrationV1Api(self.api).delete_validating_webhook_configuration(
                self.webhook_config, _request_timeout=5)
        except ApiException as err:
            if err.status != 404:
                raise
        except (OSError, urllib3.exceptions.HTTPError):
            pass  # the API server is gone already: nothing to unregister
        finally:
            self._end_process(grace)
            self.api.close()

    def _end_process(self, grace: float) -> None:
        end_process_group(self.proc, grace, "the training operator")

    def __enter__(self) -> TrainingOperator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
