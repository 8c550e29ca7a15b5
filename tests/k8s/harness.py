"""Test-only pieces around the real operator on the real control plane: the operator process, Prometheus, the agent
sidecar, free ports, and reads of the cluster's runs and trials. Each is a real process speaking the real protocol."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
from kubernetes import client

from attune.testing.procs import wait_for  # noqa: F401  (re-exported for the k8s tests)

if TYPE_CHECKING:
    from tests.k8s.realcluster import Release

ROOT = Path(__file__).resolve().parents[2]
NS = "ml"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_port_block(n: int) -> int:
    """A port P such that P..P+n-1 look free."""
    for _ in range(50):
        p = free_port()
        if p + n < 65000 and all(_is_free(p + i) for i in range(n)):
            return p
    raise RuntimeError("no free port block")


def _is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False




def stop_process(proc: subprocess.Popen[Any], grace: float = 5.0) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(5)


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment for a child, with the repository importable and one thread per process."""
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **(extra or {})}


class ClusterReads:
    """What tests read back from an API server (``custom``: a CustomObjectsApi with admin credentials)."""

    custom: client.CustomObjectsApi

    def get(self, group: str, version: str, plural: str, name: str, ns: str = NS) -> dict[str, Any] | None:
        try:
            return self.custom.get_namespaced_custom_object(group, version, ns, plural, name)
        except client.exceptions.ApiException as err:
            if err.status == 404:
                return None
            raise

    def list(self, group: str, version: str, plural: str, ns: str = NS) -> list[dict[str, Any]]:
        return self.custom.list_namespaced_custom_object(group, version, ns, plural)["items"]

    def run(self, name: str) -> dict[str, Any] | None:
        return self.get("attune.dev", "v1alpha1", "tuningruns", name)

    def trials(self) -> list[dict[str, Any]]:
        return self.list("attune.dev", "v1alpha1", "tuningtrials")

    def jobs(self) -> list[dict[str, Any]]:
        return self.list("kubeflow.org", "v1", "pytorchjobs")

    def trainjobs(self) -> list[dict[str, Any]]:
        return self.list("trainer.kubeflow.org", "v1alpha1", "trainjobs")

    def records(self, run: str) -> list[dict[str, Any]]:
        """The run's journal as the operator folds it: its trials' records, the loss checks stored on them, and
        the refusals its status keeps (each id once, in order)."""
        from attune.operator.reconcile import fold_records

        status = (self.run(run) or {}).get("status") or {}
        trials = [t for t in self.trials() if (t.get("spec") or {}).get("runRef") == run]
        return [r.model_dump(mode="json") for r in fold_records(trials, status)]


def crds_before_the_template_rule(tmp: Path) -> tuple[Path, ...]:
    """The CRDs as served before the spec.trialTemplate rule (schema revision 2 as first published): with the
    webhook down, an edit of the template then reaches the operator, which ignores it (SpecAccepted=False)."""
    from attune.operator.crdgen import build_crds, render

    out = []
    for name, doc in build_crds().items():
        spec = doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
        rules = spec.get("x-kubernetes-validations") or []
        kept = [r for r in rules if not r["message"].startswith("spec.trialTemplate ")]
        assert len(kept) == len(rules) - (name == "attune.dev_tuningruns.yaml"), "no trialTemplate rule to drop"
        if rules:
            spec["x-kubernetes-validations"] = kept
        path = tmp / f"before-template-rule-{name}"
        path.write_text(render(doc))
        out.append(path)
    return tuple(out)


class Prometheus:
    """The Debian ``prometheus`` server scraping file-discovered trial pods every second."""

    def __init__(self, tmp: Path) -> None:
        self.sd_dir = tmp / "sd"
        self.sd_dir.mkdir()
        self.port = free_port()
        cfg = tmp / "prometheus.yml"
        cfg.write_text(json.dumps({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "900ms"},
            "scrape_configs": [{"job_name": "attune-trials", "honor_labels": False,
                                "file_sd_configs": [{"files": [str(self.sd_dir / "*.json")], "refresh_interval": "1s"}]}],
        }))
        self.log = open(tmp / "prometheus.log", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            ["prometheus", f"--config.file={cfg}", f"--storage.tsdb.path={tmp / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        self.url = f"http://127.0.0.1:{self.port}"
        wait_for(self._ready, 30, "Prometheus to be ready")

    def _ready(self) -> bool:
        try:
            return httpx.get(self.url + "/-/ready", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def close(self) -> None:
        stop_process(self.proc)
        self.log.close()


def kubeflow_pod_labels(job: str, rtype: str, index: int) -> dict[str, str]:
    """The labels the Kubeflow training operator (v1.9) sets on pod ``<job>-<rtype>-<index>`` of a PyTorchJob."""
    labels = {"training.kubeflow.org/job-name": job, "training.kubeflow.org/operator-name": "pytorchjob-controller",
              "training.kubeflow.org/replica-type": rtype.lower(), "training.kubeflow.org/replica-index": str(index)}
    if rtype == "Master":
        labels["training.kubeflow.org/job-role"] = "master"
    return labels


def rfc3339_nano(ns: int) -> str:
    """The kubelet's log timestamp: RFC 3339 with nanoseconds, UTC (``2026-01-01T00:00:00.123456789Z``)."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ns // 1_000_000_000)) + f".{ns % 1_000_000_000:09d}Z"


def trainjob_pod_labels(job: str, index: int = 0) -> dict[str, str]:
    """The labels Kubeflow Trainer's JobSet gives the pods of TrainJob ``job`` (replicated job ``node``)."""
    return {"jobset.sigs.k8s.io/jobset-name": job, "jobset.sigs.k8s.io/replicatedjob-name": "node",
            "jobset.sigs.k8s.io/job-index": "0", "batch.kubernetes.io/job-completion-index": str(index),
            "trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}


class RealAgent:
    """The real agent sidecar, ``attune agent serve`` (playbook policy, no lessons), as a subprocess."""

    def __init__(self, tmp: Path) -> None:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = tmp / "agent.log"
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "attune", "agent", "serve", "--host", "127.0.0.1",
                                      "--port", str(port), "--no-lessons"],
                                     stdout=self._log, stderr=subprocess.STDOUT, env=child_env(),
                                     start_new_session=True)  # its own process group: stop_process ends it
        wait_for(self._healthy, 60, "the agent sidecar to answer /healthz")

    def _healthy(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"the agent sidecar exited: {self.log_path.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(self.url + "/healthz", timeout=2) as resp:
                return resp.status == 200
        except OSError:
            return False

    def close(self) -> None:
        stop_process(self.proc)
        self._log.close()


class Operator:
    """The real operator (``attune operator run``) as a subprocess that tests may kill and restart, with the
    credentials of the chart's ServiceAccount (``kube.operator_kubeconfig``, a token the API server issued), its
    webhook where the release's webhook URL points, and the chart's arguments for the release's install mode
    (``--namespace ml`` namespaced, none cluster-wide) besides ``args`` (``kube.operator_args()``)."""

    def __init__(self, kube: Release, tmp: Path, interval: float = 0.5, args: tuple[str, ...] = (),
                 namespaces: tuple[str, ...] = (NS,)) -> None:
        self.kube, self.tmp, self.interval = kube, tmp, interval
        self.args, self.namespaces = args, namespaces
        self.webhook_port = kube.webhook_port
        self.metrics_port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        self.log_path = self.tmp / f"operator-{self.starts}.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115
        self.kube.operator_ran = True
        from tests.k8s import rbac

        # namespaced: the chart's --namespace flags; cluster: all namespaces
        scope = [f"--namespace={ns}" for ns in self.namespaces] if self.kube.install == "namespaced" else []
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "attune", "operator", "run", *scope, f"--interval={self.interval}",
             f"--metrics-port={self.metrics_port}", f"--webhook-port={self.webhook_port}",
             "--webhook-addr=127.0.0.1", f"--trial-writer={rbac.OPERATOR_USER}",  # in a pod: from its token
             *self.args],
            stdout=self._log, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True,
            env=child_env({"KUBECONFIG": str(self.kube.operator_kubeconfig)}))
        wait_for(self._webhook_up, 30, "the operator's webhook to listen")

    def _webhook_up(self) -> bool:
        """Whether the webhook accepts connections (plain HTTP or TLS alike)."""
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"operator exited: {self.log_path.read_text()[-3000:]}")
        try:
            with socket.create_connection(("127.0.0.1", self.webhook_port), timeout=0.5):
                return True
        except OSError:
            return False

    def kill(self) -> None:
        """SIGKILL: no graceful shutdown, like a node failure."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self._log.close()

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc, grace=10)
            self._log.close()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def workdir() -> Path:
    return Path(tempfile.mkdtemp(prefix="attune-k8s-"))
