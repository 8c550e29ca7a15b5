"""Test-only stand-ins around the real operator: the API server (kmock), Kubeflow's training operator,
Prometheus, and the agent sidecar. Each is a real process or thread speaking the real protocol."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import httpx
from kubernetes import client, config

from attune.testing.procs import wait_for  # noqa: F401  (re-exported for the k8s tests)

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


ADMIN_TOKEN = "admin-token"  # the tests' own client: allowed everything (system:masters)
OPERATOR_TOKEN = "operator-token"  # the operator's: its ServiceAccount, authorized by the chart's RBAC


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


#: CRD files the emulator may serve instead of the repository's (``@pytest.mark.served_crds(name)``): name → writer
SERVED_CRDS = {"before-template-rule": crds_before_the_template_rule}


class KubeAPI(ClusterReads):
    """kmock's emulator served on loopback in a subprocess, as strict as a real API server (see :mod:`kmock_plus`),
    with two kubeconfigs: ``kubeconfig`` (the tests' admin client, ``api``) and ``operator_kubeconfig`` (the
    operator's ServiceAccount, authorized by the RBAC the chart renders for ``install``: ``namespaced``, a Role in
    ``ml``, or ``cluster``, a ClusterRole). It calls the validating webhooks its ValidatingWebhookConfigurations name
    (``clientConfig.url``), as an API server does; ``without`` lists resources it does not serve (e.g. ``trainjobs``:
    Kubeflow Trainer not installed); ``crds`` the CRD files it serves (default: the repository's).

    Every authorization decision on the operator's requests is recorded (:meth:`decisions`); a test that expects the
    operator to be refused something says so with :meth:`expect_denied`, and the ``operator`` fixture fails a test
    whose operator was refused anything else. :meth:`inject` and :meth:`clear_faults` control injected faults."""

    def __init__(self, tmp: Path, without: tuple[str, ...] = (), install: str = "namespaced",
                 crds: tuple[Path, ...] | None = None) -> None:
        from tests.k8s import rbac

        self.install, self.tmp = install, tmp
        self.rbac = rbac.chart_rbac(install)
        rbac_file = tmp / "chart-rbac.json"
        rbac_file.write_text(json.dumps(self.rbac))
        self.expected_denials: set[tuple[str, str]] = set()
        self.operator_ran = False  # set by Operator.start: its decisions then count as the chart's RBAC used
        self.port = free_port()
        env = {"KMOCK_WITHOUT": ",".join(without), "KMOCK_RBAC": str(rbac_file),
               "KMOCK_TOKENS": json.dumps({ADMIN_TOKEN: rbac.ADMIN_USER, OPERATOR_TOKEN: rbac.OPERATOR_USER}),
               "KMOCK_AUDITED": json.dumps([rbac.OPERATOR_USER])}
        if crds is not None:
            env["KMOCK_CRDS"] = os.pathsep.join(str(p) for p in crds)
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.k8s.kmock_server", str(self.port)],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                                     env=child_env(env), start_new_session=True)
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if "listening" not in line:
            raise RuntimeError(f"kmock did not start: {line}{self.proc.stdout.read() if self.proc.stdout else ''}")
        self.url = f"http://127.0.0.1:{self.port}"
        self.kubeconfig = self._kubeconfig(tmp / "kubeconfig", ADMIN_TOKEN)
        self.operator_kubeconfig = self._kubeconfig(tmp / "operator-kubeconfig", OPERATOR_TOKEN)
        cfg = client.Configuration()
        config.load_kube_config(config_file=str(self.kubeconfig), client_configuration=cfg)
        self.api = client.ApiClient(cfg)
        self.custom = client.CustomObjectsApi(self.api)

    def _kubeconfig(self, path: Path, token: str) -> Path:
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "kmock",
            "clusters": [{"name": "kmock", "cluster": {"server": self.url}}],
            "users": [{"name": "u", "user": {"token": token}}],
            "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "u", "namespace": NS}}]}))
        return path

    def client_as_operator(self) -> client.ApiClient:
        """An API client with the operator's credentials (its ServiceAccount's token)."""
        cfg = client.Configuration()
        config.load_kube_config(config_file=str(self.operator_kubeconfig), client_configuration=cfg)
        return client.ApiClient(cfg)

    def _control(self, method: str, path: str, body: Any = None) -> Any:
        resp = httpx.request(method, self.url + path, json=body, timeout=10,
                             headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
        resp.raise_for_status()
        return resp.json()

    def inject(self, status: int | None = None, *, verb: str | None = None, method: str | None = None,
               group: str | None = None, resource: str | None = None, subresource: str | None = None,
               namespace: str | None = None, name: str | None = None, path: str | None = None,
               user: str = "operator", times: int | None = None, delay: float = 0.0, retry_after: int | None = None,
               message: str | None = None, reason: str | None = None) -> dict[str, Any]:
        """Make the API server answer matching requests with ``status`` (e.g. 503 on the discovery ``path``
        ``/apis/kubeflow.org/v1``, 429 with ``retry_after``, 403 ``exceeded quota: ...`` as a ResourceQuota refuses,
        500), ``times`` times (None: until cleared), or stall them ``delay`` seconds first (``status`` None: then
        served). ``user``: ``operator`` (its requests only) or ``any``. Returns the rule as the emulator keeps it."""
        rule = {"status": status, "verb": verb, "method": method, "group": group, "resource": resource,
                "subresource": subresource, "namespace": namespace, "name": name, "path": path, "user": user,
                "times": times, "delay": delay, "retry_after": retry_after, "message": message, "reason": reason}
        return self._control("POST", "/_test/faults", rule)[0]

    def quota_exceeded(self, resource: str, group: str = "", verb: str = "create", quota: str = "compute",
                       times: int | None = None) -> dict[str, Any]:
        """A ResourceQuota refusal (403 Forbidden, ``exceeded quota: ...``) of the operator's ``verb`` on ``resource``."""
        qualified = f"{resource}.{group}" if group else resource
        return self.inject(403, verb=verb, group=group, resource=resource, times=times, message=(
            f'{qualified} is forbidden: exceeded quota: {quota}, requested: count/{qualified}=1, '
            f'used: count/{qualified}=4, limited: count/{qualified}=4'))

    def faults(self) -> list[dict[str, Any]]:
        return list(self._control("GET", "/_test/faults"))

    def clear_faults(self) -> None:
        self._control("DELETE", "/_test/faults")

    def decisions(self) -> list[dict[str, Any]]:
        """Every authorization decision on the operator's requests so far (verb, group, resource, subresource,
        namespace, name, allowed, the granting rule)."""
        return list(self._control("GET", "/_test/authz"))

    def expect_denied(self, verb: str, resource: str) -> None:
        """Declare that this test expects the operator to be refused ``verb`` on ``resource`` (``plural`` or
        ``plural/subresource``): the operator fixture then does not fail the test for it."""
        self.expected_denials.add((verb, resource))

    def unexpected_denials(self) -> list[dict[str, Any]]:
        out = []
        for d in self.decisions():
            res = f"{d['resource']}/{d['subresource']}" if d["subresource"] else d["resource"]
            if not d["allowed"] and (d["verb"], res) not in self.expected_denials:
                out.append(d)
        return out

    def install_webhooks(self, port: int, operations: tuple[str, ...] = ("CREATE", "UPDATE")) -> None:
        """A ValidatingWebhookConfiguration sending TuningRun and TuningTrial admissions to the operator's
        webhook on ``port`` (plain HTTP on loopback), as the chart's does through its Service."""
        body = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
                "metadata": {"name": "attune-gate"}, "webhooks": [
                    {"name": f"{path}.attune.dev", "failurePolicy": "Fail", "sideEffects": "None",
                     "admissionReviewVersions": ["v1"], "clientConfig": {"url": f"http://127.0.0.1:{port}/{path}"},
                     "rules": [{"apiGroups": ["attune.dev"], "apiVersions": ["v1alpha1"], "operations": list(ops),
                                "resources": list(plurals)}]}
                    for path, plurals, ops in (("validate-run", ("tuningruns",), operations),
                                               ("validate-trial", ("tuningtrials", "tuningtrials/status"),
                                                ("CREATE", "UPDATE")))]}
        adm = client.AdmissionregistrationV1Api(self.api)
        try:
            adm.delete_validating_webhook_configuration("attune-gate")
        except client.exceptions.ApiException as err:
            if err.status != 404:
                raise
        adm.create_validating_webhook_configuration(body)

    def remove_webhooks(self) -> None:
        client.AdmissionregistrationV1Api(self.api).delete_validating_webhook_configuration("attune-gate")

    def close(self) -> None:
        from tests.k8s import rbac

        folder = os.environ.get(rbac.USAGE_ENV)
        if folder and self.operator_ran and self.proc.poll() is None:  # only the operator's own requests count
            try:
                decisions = self.decisions()
            except httpx.HTTPError:
                decisions = []
            if decisions:
                rbac.write_usage(Path(folder), f"{os.getpid()}-{self.port}-{time.monotonic_ns()}", self.install,
                                 decisions)
        stop_process(self.proc)


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


class KubeletLog:
    """A container's stdout and stderr as the kubelet keeps them: one file, each line as it arrives, prefixed with
    its arrival time (RFC 3339 nano) and a space; the kmock test server serves it as the pod's log."""

    def __init__(self, proc: subprocess.Popen[bytes], path: Path) -> None:
        self.path = path
        self._file = path.open("wb")
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._pump, args=(stream,), daemon=True, name=f"kubelet-{path}")
                         for stream in (proc.stdout, proc.stderr) if stream is not None]
        for t in self._threads:
            t.start()

    def _pump(self, stream: Any) -> None:
        for raw in iter(stream.readline, b""):
            with self._lock:  # stamped as written, like the kubelet's one writer: the file's times never go back
                stamp = rfc3339_nano(time.time_ns()).encode()
                self._file.write(stamp + b" " + raw.rstrip(b"\n") + b"\n")
                self._file.flush()
        stream.close()

    def close(self) -> None:
        for t in self._threads:
            t.join(10)
        with self._lock:
            self._file.close()


class FakeTrainingOperator:
    """Stands in for Kubeflow's training operator (PyTorchJob), Kubeflow Trainer (TrainJob) and the kubelet: each job
    becomes real local processes; the job's status follows them, and deleting the job kills them.

    Like the real controllers, it sets a job's ``startTime`` when it first sees the job, before its pods run. While
    ``hold`` is set (no free accelerators) a new job's pod stays Pending (PodScheduled False, Unschedulable); a
    suspended job (``runPolicy.suspend``/``spec.suspend``, as Kueue creates them) gets a Suspended condition and no
    pod until it is unsuspended. A running pod carries its container's ``startedAt``.

    A job whose training container runs the reference trainer (its spec in ``ATTUNE_TRIAL_SPEC``) becomes local
    torchrun processes of it, scraped by the test's Prometheus. Any other job runs its master container's own
    command and args, as the image would: in a work directory holding the image's files (``images`` maps an
    image name to a local directory), with the container's environment plus what the training operator injects
    (``PET_*``, ``MASTER_ADDR``/``MASTER_PORT``), the virtual environment's ``bin`` first on ``PATH``. Its
    stdout and stderr go to a kubelet-style timestamped log, and a Pod object with the controller's labels stands
    for the rank-0 replica, so the operator reads its log through the API. Other replicas are not run.
    """

    KINDS = {"PyTorchJob": ("kubeflow.org", "v1", "pytorchjobs"),
             "TrainJob": ("trainer.kubeflow.org", "v1alpha1", "trainjobs")}

    def __init__(self, kube: KubeAPI, prom: Prometheus, workdir: Path,
                 images: dict[str, Path] | None = None) -> None:
        self.kube, self.prom, self.workdir = kube, prom, workdir
        self.images = dict(images or {})
        self.core = client.CoreV1Api(kube.api)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.logs: dict[str, KubeletLog] = {}
        self.specs: dict[str, dict[str, Any]] = {}  # each job as it was when its pods started
        self.kinds: dict[str, str] = {}
        self.scraped: set[str] = set()  # jobs given a Prometheus target
        self.pods: dict[str, str] = {}  # job → its rank-0 pod
        self.started: dict[str, float] = {}
        self.seen: set[str] = set()  # jobs given a startTime
        self.done: set[str] = set()
        self.launched: list[str] = []
        self.pids: dict[str, int] = {}
        self.errors: list[str] = []
        self.hold = False
        self.unscraped = False  # Prometheus does not select the trial pods (e.g. a PodMonitor it ignores)
        self.node_clock_s = 0.0  # how far the node's clock (its pods' startedAt) is ahead of the operator's
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="fake-kubeflow", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._tick()
            except Exception as err:  # noqa: BLE001 - keep the stand-in alive; the test's waits report stalls
                self.errors.append(repr(err))
            self._stop.wait(0.25)

    def _status(self, name: str, status: dict[str, Any]) -> None:
        group, version, plural = self.KINDS[self.kinds.get(name, "PyTorchJob")]
        try:
            self.kube.custom.patch_namespaced_custom_object_status(group, version, NS, plural, name,
                                                                   {"status": status})
        except client.exceptions.ApiException as err:
            if err.status != 404:
                raise

    def _jobs(self) -> dict[str, dict[str, Any]]:
        out = {}
        for kind, (group, version, plural) in self.KINDS.items():
            try:
                items = self.kube.list(group, version, plural)
            except client.exceptions.ApiException as err:
                if err.status == 404:
                    continue  # the kind is not served
                raise
            for j in items:
                if not j["metadata"].get("deletionTimestamp"):
                    out[j["metadata"]["name"]] = j
                    self.kinds[j["metadata"]["name"]] = kind
        return out

    @staticmethod
    def suspended(job: dict[str, Any]) -> bool:
        spec = job.get("spec") or {}
        return bool((spec.get("runPolicy") or {}).get("suspend") or spec.get("suspend"))

    def _tick(self) -> None:
        jobs = self._jobs()
        for name, proc in list(self.procs.items()):
            if name not in jobs:  # deleted: the pods go away
                stop_process(proc, grace=2)
                del self.procs[name]
                self._close_log(name)
                (self.prom.sd_dir / f"{name}.json").unlink(missing_ok=True)
                self._delete_pod(name)
                continue
            job = jobs[name]
            spec = job.get("spec") or {}
            deadline = (spec.get("runPolicy") or {}).get("activeDeadlineSeconds") or spec.get("activeDeadlineSeconds")
            rc = proc.poll()
            if rc is None and deadline and time.time() - self.started[name] > deadline:
                stop_process(proc, grace=2)
                self._finish(name, "Failed", "DeadlineExceeded", "job exceeded its active deadline")
            elif rc is not None:
                what = "torchrun" if name in self.scraped else Path(str(proc.args[0])).name
                self._finish(name, "Succeeded" if rc == 0 else "Failed", "" if rc == 0 else "Error",
                             f"{what} exited with {rc}")
        for name, job in jobs.items():
            if name in self.procs or name in self.done:
                continue
            now = _iso(time.time())
            if self.suspended(job):
                if name not in self.seen:
                    self.seen.add(name)
                    self._status(name, {"conditions": [{"type": "Suspended", "status": "True", "reason": "Suspended",
                                                        "message": "job is suspended", "lastTransitionTime": now}]})
                continue
            if name not in self.seen:  # the controller's startTime: before any pod is scheduled
                self.seen.add(name)
                self._status(name, {"startTime": now, "conditions": [self._cond("Created", now)]})
            if self.hold:
                if name not in self.pods:
                    self._create_pod(name, job, None, running=False)
                continue
            self._launch(name, job)
        for name in [n for n in self.pods if n not in jobs]:  # a finished job deleted: its pods go too
            self._delete_pod(name)

    def _cond(self, ctype: str, now: str, status: str = "True", reason: str = "", message: str = "") -> dict[str, Any]:
        kind = self.kinds.get("", "PyTorchJob")
        return {"type": ctype, "status": status, "reason": reason or f"{kind}{ctype}", "message": message,
                "lastTransitionTime": now}

    def _finish(self, name: str, ctype: str, reason: str, message: str) -> None:
        now = _iso(time.time())
        self.procs.pop(name, None)
        self.done.add(name)
        self._close_log(name)
        (self.prom.sd_dir / f"{name}.json").unlink(missing_ok=True)
        if name in self.pods:
            policy = ((self.specs[name].get("spec") or {}).get("runPolicy") or {}).get("cleanPodPolicy", "Running")
            if policy == "None" or self.kinds.get(name) == "TrainJob":
                self._pod_phase(name, "Succeeded" if ctype == "Succeeded" else "Failed")
            else:  # All, or Running (the pod is no longer running)
                self._delete_pod(name)
        if self.kinds.get(name) == "TrainJob":
            final = "Complete" if ctype == "Succeeded" else "Failed"
            self._status(name, {"completionTime": now, "jobsStatus": [{"name": "node", "active": 0,
                                                                       "succeeded": int(final == "Complete"),
                                                                       "failed": int(final == "Failed")}],
                                "conditions": [{"type": final, "status": "True", "reason": reason or "JobsCompleted",
                                                "message": message, "lastTransitionTime": now}]})
            return
        self._status(name, {"completionTime": now, "conditions": [
            {"type": "Created", "status": "True", "reason": "PyTorchJobCreated", "lastTransitionTime": now},
            {"type": "Running", "status": "False", "reason": "PyTorchJobRunning", "lastTransitionTime": now},
            {"type": ctype, "status": "True", "reason": reason or f"PyTorchJob{ctype}", "message": message,
             "lastTransitionTime": now}]})

    def _container(self, name: str, job: dict[str, Any]) -> tuple[dict[str, Any], str]:
        """The rank-0 training container (a TrainJob's trainer) and its processes per node."""
        if self.kinds.get(name) == "TrainJob":
            trainer = job["spec"].get("trainer") or {}
            return trainer, str(trainer.get("numProcPerNode") or 1)
        master = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
        return next(c for c in master["containers"] if c["name"] == "pytorch"), str(job["spec"].get("nprocPerNode")
                                                                                    or 1)

    def _running(self, name: str) -> None:
        now = _iso(time.time())
        if self.kinds.get(name) == "TrainJob":
            self._status(name, {"jobsStatus": [{"name": "node", "active": 1, "ready": 1}]})
            return
        self._status(name, {"conditions": [self._cond("Created", now), {
            "type": "Running", "status": "True", "reason": "PyTorchJobRunning", "lastTransitionTime": now}]})

    def _launch(self, name: str, job: dict[str, Any]) -> None:
        self.specs[name] = json.loads(json.dumps(job))
        container, nproc_s = self._container(name, job)
        env = {e["name"]: e["value"] for e in container.get("env") or []}
        if "ATTUNE_TRIAL_SPEC" not in env:
            self._launch_own(name, job, container, env)
            return
        nproc = int(nproc_s) if nproc_s.isdigit() else 1
        spec = json.loads(env.pop("ATTUNE_TRIAL_SPEC"))
        port = free_port_block(nproc)  # each pod has its own network namespace; here ports must differ
        spec["metrics_port"] = port
        jobdir = self.workdir / name
        jobdir.mkdir(parents=True, exist_ok=True)
        spec["out_dir"] = str(jobdir / "out")
        (jobdir / "spec.json").write_text(json.dumps(spec))
        log = open(jobdir / "log.txt", "wb")  # noqa: SIM115
        argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
                "-m", "attune.frameworks.torch.trainer.train", "--spec", str(jobdir / "spec.json")]
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=jobdir, start_new_session=True,
                                env=child_env({**env, "TORCHINDUCTOR_CACHE_DIR": str(self.workdir / "inductor")}))
        log.close()
        self.procs[name] = proc
        self.pids[name] = proc.pid
        self.started[name] = time.time()
        self.launched.append(name)
        self.scraped.add(name)
        pod = self._create_pod(name, job, None)
        targets = [{"targets": [f"127.0.0.1:{port + r}" for r in range(nproc)],
                    "labels": {"namespace": NS, "pod": pod, "container": "pytorch"}}]
        if not self.unscraped:
            tmp = self.prom.sd_dir / f".{name}.tmp"
            tmp.write_text(json.dumps(targets))
            tmp.rename(self.prom.sd_dir / f"{name}.json")
        self._running(name)

    def _launch_own(self, name: str, job: dict[str, Any], container: dict[str, Any], env: dict[str, str]) -> None:
        """Run the master container's own command and args locally, as its image would (see the class doc)."""
        argv = [str(a) for a in (container.get("command") or []) + (container.get("args") or [])]
        jobdir = self.workdir / name
        cwd = jobdir / "work"
        cwd.mkdir(parents=True, exist_ok=True)
        image_dir = self.images.get(container.get("image", ""))
        for item in sorted(image_dir.iterdir()) if image_dir else []:
            if not item.name.startswith((".", "__pycache__")):
                (cwd / item.name).symlink_to(item.resolve())
        _, nproc = self._container(name, job)
        venv_bin = str(Path(sys.executable).parent)
        injected = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "PET_MASTER_ADDR": "127.0.0.1",
                    "PET_NNODES": "1", "PET_NODE_RANK": "0", "PET_NPROC_PER_NODE": nproc if nproc.isdigit() else "1",
                    "PYTHONUNBUFFERED": "1"}
        machine = {"PATH": venv_bin + os.pathsep + os.environ.get("PATH", ""), "HOME": str(jobdir),
                   "HF_HOME": str(self.workdir / "hf-home"), "HF_HUB_OFFLINE": "1",  # no network here
                   "TORCHINDUCTOR_CACHE_DIR": str(self.workdir / "inductor")}
        injected["PET_MASTER_PORT"] = injected["MASTER_PORT"]
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd,
                                start_new_session=True, env=child_env({**machine, **env, **injected}))
        self.logs[name] = KubeletLog(proc, jobdir / "kubelet.log")
        self.procs[name] = proc
        self.pids[name] = proc.pid
        self.started[name] = time.time()
        self.launched.append(name)
        self._create_pod(name, job, self.logs[name].path)
        self._running(name)

    def _create_pod(self, name: str, job: dict[str, Any], log_path: Path | None, running: bool = True) -> str:
        """The rank-0 pod of ``name`` (Pending and unschedulable unless ``running``); an existing one is updated."""
        from tests.k8s.kmock_plus import LOG_PATH_ANNOTATION

        kind = self.kinds.get(name, "PyTorchJob")
        container, _ = self._container(name, job)
        if kind == "TrainJob":
            pod_name = f"{name}-node-0-0-x{abs(hash(name)) % 10000:04d}"
            labels = {**((job["spec"].get("labels")) or {}), **trainjob_pod_labels(name)}
            spec = {"containers": [{**{k: v for k, v in container.items() if k in ("image", "command", "args",
                                                                                   "env")}, "name": "node"}]}
            cname = "node"
        else:
            template = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]
            pod_name = f"{name}-master-0"
            labels = {**((template.get("metadata") or {}).get("labels") or {}),
                      **kubeflow_pod_labels(name, "Master", 0)}
            spec = {**template.get("spec", {})}
            cname = "pytorch"
        annotations = {LOG_PATH_ANNOTATION: str(log_path)} if log_path else {}
        if name not in self.pods:
            pod = {"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": pod_name, "namespace": NS, "labels": labels, "annotations": annotations,
                                "ownerReferences": [{"apiVersion": job["apiVersion"], "kind": kind, "name": name,
                                                     "uid": job["metadata"].get("uid", ""), "controller": True}]},
                   "spec": {**spec, "restartPolicy": "Never"}}
            self.core.create_namespaced_pod(NS, pod)
            self.pods[name] = pod_name
        elif annotations:
            self.core.patch_namespaced_pod(self.pods[name], NS, {"metadata": {"annotations": annotations}})
        if running:
            self.core.patch_namespaced_pod_status(self.pods[name], NS, {"status": {
                "phase": "Running", "conditions": [{"type": "PodScheduled", "status": "True"}],
                "containerStatuses": [{"name": cname, "ready": True, "image": str(container.get("image", "")),
                                       "imageID": "", "restartCount": 0,
                                       "state": {"running": {"startedAt": _iso(time.time() + self.node_clock_s)}}}]}})
        else:
            self.core.patch_namespaced_pod_status(self.pods[name], NS, {"status": {
                "phase": "Pending", "conditions": [{
                    "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                    "message": "0/4 nodes are available: 4 Insufficient nvidia.com/gpu."}]}})
        return self.pods[name]

    def _pod_phase(self, name: str, phase: str) -> None:
        try:
            self.core.patch_namespaced_pod_status(self.pods[name], NS, {"status": {"phase": phase}})
        except client.exceptions.ApiException as err:
            if err.status != 404:
                raise

    def _delete_pod(self, name: str) -> None:
        pod = self.pods.pop(name, None)
        if pod is None:
            return
        try:
            self.core.delete_namespaced_pod(pod, NS)
        except client.exceptions.ApiException as err:
            if err.status != 404:
                raise

    def _close_log(self, name: str) -> None:
        log = self.logs.pop(name, None)
        if log is not None:
            log.close()

    def alive(self, name: str) -> bool:
        pid = self.pids.get(name)
        if pid is None:
            return False
        try:
            os.killpg(pid, 0)
            return True
        except ProcessLookupError:
            return False

    def close(self) -> None:
        self._stop.set()
        self._thread.join(60)  # a tick in progress may still launch a job's processes: wait for it, then stop all
        for proc in list(self.procs.values()):
            stop_process(proc, grace=2)
        for name in list(self.logs):
            self._close_log(name)


def trainjob_pod_labels(job: str, index: int = 0) -> dict[str, str]:
    """The labels Kubeflow Trainer's JobSet gives the pods of TrainJob ``job`` (replicated job ``node``)."""
    return {"jobset.sigs.k8s.io/jobset-name": job, "jobset.sigs.k8s.io/replicatedjob-name": "node",
            "jobset.sigs.k8s.io/job-index": "0", "batch.kubernetes.io/job-completion-index": str(index),
            "trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


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
    """The real operator (``attune operator run``) as a subprocess that tests may kill and restart, with its
    ServiceAccount's credentials (``kube.operator_kubeconfig``) and the chart's arguments for ``kube.install``:
    ``--namespace ml`` (namespaced) or none (cluster-wide)."""

    def __init__(self, kube: KubeAPI, tmp: Path, interval: float = 0.5, args: tuple[str, ...] = (),
                 namespaces: tuple[str, ...] = (NS,)) -> None:
        self.kube, self.tmp, self.interval = kube, tmp, interval
        self.args, self.namespaces = args, namespaces
        self.webhook_port = free_port()
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
