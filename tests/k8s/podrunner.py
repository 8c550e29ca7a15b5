"""The pod runner: plays the kubelet of one Node of the real control plane (``k8s/up.sh`` starts it), since no image
can be pulled here and there is no container runtime.

Through the real API server, with the Node's own credentials (``system:node:<name>``, so the Node authorizer and
NodeRestriction apply to it as to a kubelet), it
- registers the Node at 127.0.0.1 (its only address; ``daemonEndpoints`` name the runner's port) with this
  machine's CPUs and memory, and renews its Lease so the node lifecycle controller keeps it Ready;
- watches the pods bound to it and runs each container's ``command`` + ``args`` as a local process, init
  containers first: in a working folder of its own (the files of its image when ``--images`` maps the image to a
  local folder, the way the image would hold them), with the container's environment as the kubelet resolves it
  (values with ``$(VAR)`` references, the downward API, ConfigMap and Secret keys, ``envFrom``) over a small machine
  environment (this virtual environment's ``bin`` first on ``PATH``, ``HOME`` in the pod's folder, no network
  caches);
- reports what a kubelet reports: phase, conditions, ``hostIP``/``podIP`` 127.0.0.1, container states with exit
  codes and restart counts (``restartPolicy`` honoured, with back-off), ``activeDeadlineSeconds``;
- stops a pod's processes on graceful deletion (SIGTERM, then SIGKILL after the grace period) and then removes the
  pod, as a kubelet does;
- serves the kubelet's ``/containerLogs`` endpoint over TLS to the API server only (its client certificate), with
  ``follow``, ``timestamps``, ``tailLines``, ``sinceSeconds``/``sinceTime``, ``limitBytes`` and ``previous``, so
  ``pods/log`` goes through the API server as on a cluster. Logs are kept in the CRI format (a timestamp, the stream,
  a partial-line tag).

The Node's clock: ``node-clock.json`` beside the images file (``{"offsetSeconds": -60}``, read anew whenever a
status is stamped; absent means 0) sets how far this Node's clock runs ahead of (or, negative, behind) the control
plane's, as a kubelet on a node whose clock drifted would: the times it writes into its pods' status (``startTime``,
containers' ``startedAt``/``finishedAt``, conditions) are stamped on it. Its own deadlines and its Lease keep real time.

Each container gets its own ``TMPDIR`` and, where ``unshare --mount`` is allowed (root here), the pod's kubelet-style
hosts file over /etc/hosts, so the pod's own name resolves (the training operator's ``MASTER_ADDR``).

What it cannot do: pods share this machine's network and file system (two pods binding one port collide; volumes
other than ``emptyDir`` are not mounted), images are not pulled, and resource limits are not enforced.

``python -m tests.k8s.podrunner --ready NODE`` (with ``KUBECONFIG``) exits 0 when that Node is Ready.
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import json
import os
import re
import signal
import ssl
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException

from tests.k8s.harness import rfc3339_nano

APISERVER_CLIENT_CN = "kube-apiserver-kubelet-client"  # the only client the log endpoint serves (k8s/up.sh)
LEASE_S = 40  # the lease duration the node lifecycle controller reads; renewed every quarter of it
BACKOFF_MAX_S = 10.0  # a kubelet backs a crashing container off up to 5 minutes; tests want it shorter
POD_IP = "127.0.0.1"  # the Node's and every pod's address: they share this machine's loopback network


def now_rfc3339(ts: float | None = None) -> str:
    return dt.datetime.fromtimestamp(time.time() if ts is None else ts, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_rfc3339(text: str) -> float:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


# --- logs -------------------------------------------------------------------------------------------------------


class ContainerLog:
    """One run of a container: its stdout and stderr lines in the CRI format (``<time> <stream> <F|P> <text>``)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = path.open("ab", buffering=0)
        self._lock = threading.Lock()
        self.closed = threading.Event()
        self._pumps: list[threading.Thread] = []

    def pump(self, stream: Any, name: str) -> None:
        t = threading.Thread(target=self._pump, args=(stream, name), daemon=True, name=f"log-{self.path.name}")
        t.start()
        self._pumps.append(t)

    def _pump(self, stream: Any, name: str) -> None:
        for raw in iter(stream.readline, b""):
            tag = b"F" if raw.endswith(b"\n") else b"P"
            line = raw.rstrip(b"\n")
            with self._lock:
                self._file.write(f"{rfc3339_nano(time.time_ns())} {name} ".encode() + tag + b" " + line + b"\n")
        stream.close()

    def close(self) -> None:
        for t in self._pumps:
            t.join(30)
        with self._lock:
            self._file.close()
        self.closed.set()


@dataclass
class LogQuery:
    follow: bool = False
    timestamps: bool = False
    tail_lines: int | None = None
    since: float | None = None
    limit_bytes: int | None = None
    previous: bool = False

    @classmethod
    def parse(cls, query: dict[str, list[str]]) -> LogQuery:
        def one(key: str) -> str | None:
            values = query.get(key)
            return values[-1] if values else None

        q = cls(follow=one("follow") in ("true", "1"), timestamps=one("timestamps") in ("true", "1"),
                previous=one("previous") in ("true", "1"))
        if (tail := one("tailLines")) is not None:
            q.tail_lines = int(tail)
        if (limit := one("limitBytes")) is not None:
            q.limit_bytes = int(limit)
        if (since_s := one("sinceSeconds")) is not None:
            q.since = time.time() - int(since_s)
        elif (since_t := one("sinceTime")) is not None:
            q.since = parse_rfc3339(since_t)
        return q


def render(line: bytes, q: LogQuery) -> tuple[float, bytes] | None:
    """A CRI log line as the kubelet serves it (its text, or ``<time> <text>``), with its time; None if torn."""
    parts = line.rstrip(b"\n").split(b" ", 3)
    if len(parts) < 3:
        return None
    ts = parse_rfc3339(parts[0].decode())
    text = parts[3] if len(parts) == 4 else b""
    end = b"\n" if parts[2] == b"F" else b""
    return ts, (parts[0] + b" " + text + end) if q.timestamps else text + end


# --- pods -------------------------------------------------------------------------------------------------------


@dataclass
class ContainerRun:
    name: str
    proc: subprocess.Popen[bytes] | None = None
    log: ContainerLog | None = None
    logs: list[ContainerLog] = field(default_factory=list)  # every run, oldest first
    restarts: int = 0
    started_at: str | None = None
    state: dict[str, Any] = field(default_factory=lambda: {"waiting": {"reason": "ContainerCreating"}})
    last_state: dict[str, Any] = field(default_factory=dict)
    image: str = ""


class EnvError(Exception):
    """A container's environment cannot be resolved (a missing ConfigMap, Secret or key): the kubelet's
    CreateContainerConfigError."""


class PodWorker:
    """Runs one pod's containers and keeps its status, on a thread of its own."""

    def __init__(self, runner: PodRunner, pod: client.V1Pod) -> None:
        self.runner, self.pod = runner, pod
        self.ns, self.name, self.uid = pod.metadata.namespace, pod.metadata.name, pod.metadata.uid
        self.dir = runner.work / self.ns / f"{self.name}-{self.uid[:8]}"
        self.containers = {c.name: ContainerRun(c.name, image=c.image or "") for c in pod.spec.containers}
        self.inits = {c.name: ContainerRun(c.name, image=c.image or "") for c in pod.spec.init_containers or []}
        self.stop = threading.Event()
        self.grace_s = float(pod.spec.termination_grace_period_seconds or 30)
        self.start_time = time.time()
        self.phase = "Pending"
        self.reason: str | None = None
        self.message: str | None = None
        self.initialized = not self.inits
        self.thread = threading.Thread(target=self._main, daemon=True, name=f"pod-{self.name}")

    # - environment -
    def _machine_env(self) -> dict[str, str]:
        venv_bin = str(Path(sys.executable).parent)
        home, tmp = self.dir / "home", self.dir / "tmp"  # a container's own /tmp: TMPDIR
        home.mkdir(parents=True, exist_ok=True)
        tmp.mkdir(exist_ok=True)
        keep = {k: v for k, v in os.environ.items() if k in ("LANG", "LC_ALL", "TZ", "ATTUNE_TEST_SESSION")}
        return {**keep, "PATH": venv_bin + os.pathsep + os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home),
                "TMPDIR": str(tmp), "HOSTNAME": self.pod.spec.hostname or self.name, "PYTHONUNBUFFERED": "1",
                "HF_HOME": str(self.runner.work / "hf-home"), "HF_HUB_OFFLINE": "1",
                "TORCHINDUCTOR_CACHE_DIR": str(self.runner.work / "inductor"),
                "PYTHONPYCACHEPREFIX": str(self.runner.work / "pycache")}

    def _field(self, path: str) -> str:
        meta = self.pod.metadata
        simple = {"metadata.name": meta.name, "metadata.namespace": meta.namespace, "metadata.uid": meta.uid,
                  "spec.nodeName": self.pod.spec.node_name, "spec.serviceAccountName":
                  self.pod.spec.service_account_name, "status.hostIP": POD_IP, "status.podIP": POD_IP,
                  "status.hostIPs": POD_IP, "status.podIPs": POD_IP}
        if path in simple:
            return str(simple[path] or "")
        m = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path)
        if m:
            return str(((meta.labels if m.group(1) == "labels" else meta.annotations) or {}).get(m.group(2), ""))
        raise EnvError(f"fieldRef {path!r} is not supported")

    def _key(self, kind: str, name: str, key: str | None, optional: bool) -> dict[str, str] | str | None:
        core = self.runner.core
        try:
            obj = (core.read_namespaced_config_map(name, self.ns) if kind == "ConfigMap"
                   else core.read_namespaced_secret(name, self.ns))
        except ApiException as err:
            if err.status == 404 and optional:
                return None
            raise EnvError(f'{kind.lower()} "{name}" not found') from err
        if kind == "Secret":
            import base64

            data = {k: base64.b64decode(v).decode() for k, v in (obj.data or {}).items()}
        else:
            data = dict(obj.data or {})
        if key is None:
            return data
        if key not in data:
            if optional:
                return None
            raise EnvError(f"couldn't find key {key} in {kind} {self.ns}/{name}")
        return data[key]

    def env(self, c: client.V1Container) -> dict[str, str]:
        env: dict[str, str] = {}
        for src in c.env_from or []:
            ref = src.config_map_ref or src.secret_ref
            kind = "ConfigMap" if src.config_map_ref else "Secret"
            data = self._key(kind, ref.name, None, bool(ref.optional))
            for k, v in (data or {}).items() if isinstance(data, dict) else ():
                env[(src.prefix or "") + k] = v
        for e in c.env or []:
            if e.value_from is None:
                env[e.name] = expand(e.value or "", env)
                continue
            vf = e.value_from
            if vf.field_ref is not None:
                env[e.name] = self._field(vf.field_ref.field_path)
            elif vf.config_map_key_ref is not None or vf.secret_key_ref is not None:
                ref = vf.config_map_key_ref or vf.secret_key_ref
                value = self._key("ConfigMap" if vf.config_map_key_ref else "Secret", ref.name, ref.key,
                                  bool(ref.optional))
                if isinstance(value, str):
                    env[e.name] = value
            elif vf.resource_field_ref is not None:
                env[e.name] = self._resource(c, vf.resource_field_ref.resource)
        return env

    def _resource(self, c: client.V1Container, resource: str) -> str:
        kind, _, name = resource.partition(".")
        given = ((c.resources.limits if kind == "limits" else c.resources.requests) or {}) if c.resources else {}
        if name in given:
            return str(given[name])
        return str(self.runner.capacity.get(name, "0"))

    # - running -
    def _hosts_file(self) -> Path:
        """The pod's hosts file as the kubelet writes it: localhost, the pod's own names at its IP (its hostname, and
        its fully qualified name under a ``subdomain``), then ``hostAliases``. The training operator points
        ``MASTER_ADDR`` at the master pod's name, which resolves here for a one-node job."""
        spec, meta = self.pod.spec, self.pod.metadata
        host = spec.hostname or meta.name
        # under a subdomain also "<host>.<subdomain>", which cluster DNS answers through the pod's search path
        # (<namespace>.svc.cluster.local): how JobSet's pods (Kubeflow Trainer's PET_MASTER_ADDR) name rank 0
        names = [host] if not spec.subdomain else [f"{host}.{spec.subdomain}.{meta.namespace}.svc.cluster.local",
                                                    f"{host}.{spec.subdomain}", host]
        lines = ["# Kubernetes-managed hosts file (the pod runner's).", "127.0.0.1\tlocalhost",
                 "::1\tlocalhost ip6-localhost ip6-loopback", f"{POD_IP}\t" + "\t".join(names)]
        for alias in spec.host_aliases or []:
            lines.append(f"{alias.ip}\t" + "\t".join(alias.hostnames or []))
        path = self.dir / "etc-hosts"
        path.write_text("\n".join(lines) + "\n")
        return path

    def _workdir(self, c: client.V1Container) -> Path:
        cwd = self.dir / "containers" / c.name
        if not cwd.exists():
            cwd.mkdir(parents=True)
            image_dir = self.runner.image_dir(c.image or "")
            for item in sorted(image_dir.iterdir()) if image_dir else []:
                if not item.name.startswith((".", "__pycache__")):
                    (cwd / item.name).symlink_to(item.resolve())
        return cwd

    def _spawn(self, c: client.V1Container, run: ContainerRun) -> bool:
        argv = [str(a) for a in (c.command or []) + (c.args or [])]
        if not argv:
            run.state = {"waiting": {"reason": "CreateContainerError",
                                     "message": "no command: the pod runner runs a container's command and args only "
                                                "(it has no image to read an entrypoint from)"}}
            return False
        try:
            env = {**self._machine_env(), **self.env(c)}
        except EnvError as err:
            run.state = {"waiting": {"reason": "CreateContainerConfigError", "message": str(err)}}
            return False
        argv = [expand(a, env) for a in argv]
        log = ContainerLog(self.dir / "logs" / c.name / f"{run.restarts}.log")
        try:
            # its own process group (stopped as a whole); killed with the runner should the runner be killed; the
            # pod's kubelet-managed /etc/hosts where a private mount namespace can be had
            proc = subprocess.Popen([*self.runner.hosts_prefix(self._hosts_file()), "setpriv", "--pdeathsig", "KILL",
                                     "--", *argv], cwd=self._workdir(c), env=env,
                                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    start_new_session=True)
        except OSError as err:
            log.close()
            run.state = {"waiting": {"reason": "RunContainerError", "message": str(err)}}
            return False
        log.pump(proc.stdout, "stdout")
        log.pump(proc.stderr, "stderr")
        run.proc, run.log = proc, log
        run.logs.append(log)
        run.started_at = now_rfc3339(self.runner.node_time())
        run.state = {"running": {"startedAt": run.started_at}}
        return True

    def _wait(self, run: ContainerRun) -> int:
        assert run.proc is not None and run.log is not None
        while True:
            try:
                rc = run.proc.wait(0.2)
                break
            except subprocess.TimeoutExpired:
                if self.stop.is_set() or self._deadline_passed():
                    self._kill(run.proc)
        run.log.close()
        exit_code = rc if rc >= 0 else 128 - rc
        reason = "Completed" if exit_code == 0 else "Error"
        run.state = {"terminated": {"exitCode": exit_code, "reason": reason, "startedAt": run.started_at,
                                    "finishedAt": now_rfc3339(self.runner.node_time())}}
        return exit_code

    def _kill(self, proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            proc.wait(self.grace_s)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()

    def _deadline_passed(self) -> bool:
        deadline = self.pod.spec.active_deadline_seconds
        if deadline and time.time() - self.start_time > deadline and self.reason != "DeadlineExceeded":
            self.reason, self.message = "DeadlineExceeded", "Pod was active on the node longer than the specified " \
                                                            "deadline"
            self.grace_s = min(self.grace_s, 2.0)
            return True
        return False

    def _main(self) -> None:
        try:
            self._run()
        except Exception as err:  # noqa: BLE001 - the pod fails with the reason; the runner lives on
            self.runner.log(f"pod {self.ns}/{self.name}: {err!r}")
            self.phase, self.reason, self.message = "Failed", "PodRunnerError", repr(err)
            self.report()

    def _run(self) -> None:
        policy = self.pod.spec.restart_policy or "Always"
        self.report()
        for c in self.pod.spec.init_containers or []:
            run = self.inits[c.name]
            while not self.stop.is_set():
                if not self._spawn(c, run):
                    self.phase = "Failed"
                    self.report()
                    return
                self.report()
                if self._wait(run) == 0:
                    break
                if policy == "Never" or self.reason == "DeadlineExceeded":
                    self.phase = "Failed"
                    self.report()
                    return
                self._back_off(run)
            if self.stop.is_set():
                return
        self.initialized = True
        waiters = [threading.Thread(target=self._keep, args=(c, policy), daemon=True) for c in self.pod.spec.containers]
        for t in waiters:
            t.start()
        for t in waiters:
            t.join()
        if self.stop.is_set() and self.reason != "DeadlineExceeded":
            return  # deleted: the pod goes away, its status no longer matters
        codes = [r.state.get("terminated", {}).get("exitCode", 1) for r in self.containers.values()]
        self.phase = "Succeeded" if all(code == 0 for code in codes) and self.reason is None else "Failed"
        self.report()

    def _keep(self, c: client.V1Container, policy: str) -> None:
        run = self.containers[c.name]
        while not self.stop.is_set():
            if not self._spawn(c, run):
                self.report()
                if self.stop.wait(2.0):
                    return
                continue  # a kubelet retries a container it cannot create
            if self.phase == "Pending":
                self.phase = "Running"
            self.report()
            code = self._wait(run)
            if self.stop.is_set() or self.reason == "DeadlineExceeded":
                return
            if policy == "Never" or (policy == "OnFailure" and code == 0):
                self.report()
                return
            self._back_off(run)

    def _back_off(self, run: ContainerRun) -> None:
        run.last_state = run.state
        run.restarts += 1
        run.state = {"waiting": {"reason": "CrashLoopBackOff",
                                 "message": f"back-off restarting failed container {run.name}"}}
        self.report()
        self.stop.wait(min(BACKOFF_MAX_S, 2.0 ** (run.restarts - 1)))

    # - status -
    def _statuses(self, runs: dict[str, ContainerRun]) -> list[dict[str, Any]]:
        out = []
        for run in runs.values():
            s: dict[str, Any] = {"name": run.name, "image": run.image, "imageID": "", "restartCount": run.restarts,
                                 "state": run.state, "ready": "running" in run.state, "started": "running" in run.state}
            if run.last_state:
                s["lastState"] = run.last_state
            out.append(s)
        return out

    def report(self) -> None:
        ready = self.phase == "Running" and all("running" in r.state for r in self.containers.values())
        t = now_rfc3339(self.runner.node_time())

        def cond(ctype: str, ok: bool) -> dict[str, Any]:
            return {"type": ctype, "status": "True" if ok else "False", "lastTransitionTime": t}

        status: dict[str, Any] = {
            "phase": self.phase, "hostIP": POD_IP, "hostIPs": [{"ip": POD_IP}], "podIP": POD_IP,
            "podIPs": [{"ip": POD_IP}], "startTime": now_rfc3339(self.runner.node_time(self.start_time)),
            "conditions": [cond("PodScheduled", True), cond("Initialized", self.initialized),
                           cond("ContainersReady", ready), cond("Ready", ready)],
            "containerStatuses": self._statuses(self.containers)}
        if self.inits:
            status["initContainerStatuses"] = self._statuses(self.inits)
        if self.reason:
            status["reason"], status["message"] = self.reason, self.message
        self.runner.patch_status(self, status)


def expand(text: str, env: dict[str, str]) -> str:
    """The kubelet's ``$(VAR)`` expansion: defined variables are replaced, ``$$`` escapes, others stay as written."""
    def one(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))

    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)", one, text)


# --- the node ---------------------------------------------------------------------------------------------------


class PodRunner:
    def __init__(self, api: client.ApiClient, node: str, port: int, work: Path, images: Path | None) -> None:
        self.api, self.node, self.port, self.work, self.images_file = api, node, port, work, images
        self.core = client.CoreV1Api(api)
        self.coord = client.CoordinationV1Api(api)
        self.pods: dict[str, PodWorker] = {}  # uid → worker
        self.lock = threading.Lock()
        self.ready = threading.Event()
        self.stopping = threading.Event()
        self.capacity = {"cpu": str(os.cpu_count() or 1), "memory": f"{_mem_kib()}Ki", "pods": "110",
                         "ephemeral-storage": "100Gi"}

    def log(self, text: str) -> None:
        print(f"{now_rfc3339()} pod-runner: {text}", file=sys.stderr, flush=True)

    @functools.cached_property
    def _private_mounts(self) -> bool:
        """Whether a container can have a private mount namespace (``unshare --mount``: root, or a kernel that lets
        this user make one), in which the pod's hosts file is bound over /etc/hosts as a container's would be."""
        probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "--", "true"], capture_output=True,
                               text=True)
        if probe.returncode != 0:
            self.log(f"no private mount namespace ({probe.stderr.strip()}): pods see this machine's /etc/hosts, so a "
                     "pod's own name does not resolve")
        return probe.returncode == 0

    def hosts_prefix(self, hosts: Path) -> list[str]:
        """The command prefix that runs a container with ``hosts`` as its /etc/hosts (none without the means)."""
        if not self._private_mounts:
            return []
        return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
                'mount --bind "$0" /etc/hosts && exec "$@"', str(hosts)]

    def image_dir(self, image: str) -> Path | None:
        """The local folder standing for ``image`` (``--images``: a JSON object of image → folder, read anew for
        every container so tests may add images while the runner runs)."""
        if self.images_file is None or not self.images_file.exists():
            return None
        folder = json.loads(self.images_file.read_text()).get(image)
        return Path(folder) if folder else None

    def node_time(self, ts: float | None = None) -> float:
        """``ts`` (default now) on this Node's clock: real time plus ``offsetSeconds`` of ``node-clock.json`` in the
        images file's folder (the control plane's state folder), read anew each time so a test may set it while the
        runner runs."""
        real = time.time() if ts is None else ts
        path = self.images_file.parent / "node-clock.json" if self.images_file is not None else None
        if path is None or not path.exists():
            return real
        return real + float(json.loads(path.read_text()).get("offsetSeconds", 0.0))

    # - registration -
    def register(self) -> None:
        labels = {"kubernetes.io/hostname": self.node, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}
        try:
            self.core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": self.node,
                                                                                     "labels": labels}})
        except ApiException as err:
            if err.status != 409:
                raise
        self._node_status()
        self._renew()
        self.ready.set()
        threading.Thread(target=self._heartbeat, daemon=True, name="heartbeat").start()

    def _node_status(self) -> None:
        t = now_rfc3339()
        conditions = [{"type": ctype, "status": "False", "reason": f"KubeletHas{reason}", "lastHeartbeatTime": t,
                       "lastTransitionTime": t, "message": "pod runner"}
                      for ctype, reason in (("MemoryPressure", "SufficientMemory"), ("DiskPressure", "NoDiskPressure"),
                                            ("PIDPressure", "SufficientPID"))]
        conditions.append({"type": "Ready", "status": "True", "reason": "KubeletReady", "lastHeartbeatTime": t,
                           "lastTransitionTime": t, "message": "the pod runner is posting ready status"})
        self.core.patch_node_status(self.node, {"status": {
            "capacity": self.capacity, "allocatable": self.capacity, "conditions": conditions,
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": self.node}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": self.port}},
            "nodeInfo": {"kubeletVersion": os.environ.get("ATTUNE_K8S_VERSION", "v0.0.0"), "kubeProxyVersion": "",
                         "operatingSystem": "linux", "architecture": "amd64", "containerRuntimeVersion": "pod-runner://1",
                         "osImage": "attune pod runner", "kernelVersion": os.uname().release, "machineID": "",
                         "systemUUID": "", "bootID": ""}}})

    def _renew(self) -> None:
        body = {"metadata": {"name": self.node, "namespace": "kube-node-lease"},
                "spec": {"holderIdentity": self.node, "leaseDurationSeconds": LEASE_S,
                         "renewTime": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")}}
        try:
            self.coord.patch_namespaced_lease(self.node, "kube-node-lease", body)
        except ApiException as err:
            if err.status != 404:
                raise
            self.coord.create_namespaced_lease("kube-node-lease", body)

    def _heartbeat(self) -> None:
        beats = 0
        while not self.stopping.wait(LEASE_S / 4):
            beats += 1
            try:
                self._renew()
                if beats % 4 == 0:
                    self._node_status()
            except Exception as err:  # noqa: BLE001 - the next beat tries again
                self.log(f"heartbeat: {err!r}")

    # - pods -
    def watch_pods(self) -> None:
        selector = f"spec.nodeName={self.node}"
        while not self.stopping.is_set():
            try:
                listed = self.core.list_pod_for_all_namespaces(field_selector=selector)
                for pod in listed.items:
                    self.on_pod(pod)
                w = watch.Watch()
                for event in w.stream(self.core.list_pod_for_all_namespaces, field_selector=selector,
                                      resource_version=listed.metadata.resource_version, timeout_seconds=60,
                                      allow_watch_bookmarks=True):
                    if self.stopping.is_set():
                        w.stop()
                        break
                    if event["type"] in ("ADDED", "MODIFIED"):
                        self.on_pod(event["object"])
                    elif event["type"] == "DELETED":
                        self.on_deleted(event["object"])
            except ApiException as err:
                if err.status != 410:
                    self.log(f"watch: {err.status} {err.reason}")
                    self.stopping.wait(1.0)
            except Exception as err:  # noqa: BLE001 - a dropped watch is listed again
                self.log(f"watch: {err!r}")
                self.stopping.wait(1.0)

    def on_pod(self, pod: client.V1Pod) -> None:
        uid = pod.metadata.uid
        with self.lock:
            worker = self.pods.get(uid)
            if worker is None:
                if pod.metadata.deletion_timestamp is not None:
                    threading.Thread(target=self._remove, args=(pod, None), daemon=True).start()
                    return
                if (pod.status.phase or "Pending") in ("Succeeded", "Failed"):
                    return  # finished before this runner started
                worker = PodWorker(self, pod)
                self.pods[uid] = worker
                worker.thread.start()
                return
            worker.pod = pod
        if pod.metadata.deletion_timestamp is not None and not worker.stop.is_set():
            worker.grace_s = float(pod.metadata.deletion_grace_period_seconds
                                   if pod.metadata.deletion_grace_period_seconds is not None else worker.grace_s)
            worker.stop.set()
            threading.Thread(target=self._remove, args=(pod, worker), daemon=True).start()

    def _remove(self, pod: client.V1Pod, worker: PodWorker | None) -> None:
        """A pod being deleted: its processes stop (the grace period), then the pod object goes, as the kubelet
        deletes it once its containers are gone."""
        if worker is not None:
            worker.thread.join()
            for run in [*worker.inits.values(), *worker.containers.values()]:
                if run.proc is not None:
                    worker._kill(run.proc)
        try:
            self.core.delete_namespaced_pod(pod.metadata.name, pod.metadata.namespace, grace_period_seconds=0,
                                            body=client.V1DeleteOptions(
                                                grace_period_seconds=0,
                                                preconditions=client.V1Preconditions(uid=pod.metadata.uid)))
        except ApiException as err:
            if err.status not in (404, 409):
                self.log(f"delete {pod.metadata.namespace}/{pod.metadata.name}: {err.status} {err.reason}")

    def on_deleted(self, pod: client.V1Pod) -> None:
        with self.lock:
            worker = self.pods.pop(pod.metadata.uid, None)
        if worker is not None and not worker.stop.is_set():
            worker.grace_s = 0.5
            worker.stop.set()

    def patch_status(self, worker: PodWorker, status: dict[str, Any]) -> None:
        if worker.stop.is_set() and worker.reason != "DeadlineExceeded":
            return
        try:
            self.core.patch_namespaced_pod_status(worker.name, worker.ns, {"status": status})
        except ApiException as err:
            if err.status != 404:
                self.log(f"status of {worker.ns}/{worker.name}: {err.status} {err.reason}")

    def find(self, ns: str, name: str) -> PodWorker | None:
        with self.lock:
            found = [w for w in self.pods.values() if w.ns == ns and w.name == name]
        return max(found, key=lambda w: w.start_time) if found else None

    def shutdown(self) -> None:
        """The Node goes: every pod's processes stop (SIGTERM, then SIGKILL after 5 s)."""
        self.stopping.set()
        with self.lock:
            workers = list(self.pods.values())
        for w in workers:
            w.grace_s = min(w.grace_s, 5.0)
            w.stop.set()
        for w in workers:
            for run in [*w.inits.values(), *w.containers.values()]:
                if run.proc is not None:
                    w._kill(run.proc)


def _mem_kib() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1])
    return 1 << 20


# --- the kubelet's endpoint -------------------------------------------------------------------------------------


class KubeletHandler(BaseHTTPRequestHandler):
    runner: PodRunner
    protocol_version = "HTTP/1.0"  # a followed log ends when the connection closes

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass

    def _plain(self, code: int, text: str) -> None:
        body = text.encode()
        self.send_response(code)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _client_cn(self) -> str | None:
        cert = self.connection.getpeercert() if isinstance(self.connection, ssl.SSLSocket) else None
        for rdn in (cert or {}).get("subject", ()):
            for key, value in rdn:
                if key == "commonName":
                    return str(value)
        return None

    def do_GET(self) -> None:  # noqa: N802 - the base class's name
        if self._client_cn() != APISERVER_CLIENT_CN:
            self._plain(403, f"Forbidden (user={self._client_cn()}, verb=get, resource=nodes, subresource=proxy)")
            return
        url = urllib.parse.urlsplit(self.path)
        if url.path == "/healthz":
            self._plain(200 if self.runner.ready.is_set() else 503, "ok" if self.runner.ready.is_set() else "starting")
            return
        m = re.fullmatch(r"/containerLogs/([^/]+)/([^/]+)/([^/]+)", url.path)
        if not m:
            self._plain(404, "404 page not found")
            return
        try:
            q = LogQuery.parse(urllib.parse.parse_qs(url.query))
        except ValueError as err:
            self._plain(400, f"invalid log options: {err}")
            return
        self._logs(*(urllib.parse.unquote(g) for g in m.groups()), q)

    def _logs(self, ns: str, pod: str, container: str, q: LogQuery) -> None:
        worker = self.runner.find(ns, pod)
        if worker is None:
            self._plain(404, f'pod "{pod}" in namespace "{ns}" is not known to the node')
            return
        run = worker.containers.get(container) or worker.inits.get(container)
        if run is None:
            self._plain(400, f"container {container} is not valid for pod {pod}")
            return
        logs = run.logs[:-1] if q.previous else run.logs
        if q.previous:
            logs = logs[-1:]
            if not logs:
                self._plain(400, f'previous terminated container "{container}" in pod "{pod}" not found')
                return
        elif not logs:
            waiting = run.state.get("waiting", {})
            self._plain(400, f'container "{container}" in pod "{pod}" is waiting to start: '
                             f'{waiting.get("reason", "ContainerCreating")}')
            return
        log = logs[-1]
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Connection", "close")
        self.end_headers()
        sent = 0
        try:
            for chunk in self._lines(log, q):
                if q.limit_bytes is not None:
                    chunk = chunk[: max(0, q.limit_bytes - sent)]
                self.wfile.write(chunk)
                self.wfile.flush()
                sent += len(chunk)
                if q.limit_bytes is not None and sent >= q.limit_bytes:
                    break
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError):
            return

    def _lines(self, log: ContainerLog, q: LogQuery) -> Iterator[bytes]:
        with log.path.open("rb") as f:
            lines = f.readlines()
            rendered = [r for r in (render(line, q) for line in lines if line.endswith(b"\n")) if r]
            if q.since is not None:
                rendered = [r for r in rendered if r[0] >= q.since]
            if q.tail_lines is not None:
                rendered = rendered[-q.tail_lines:] if q.tail_lines > 0 else []
            for _, text in rendered:
                yield text
            if not q.follow:
                return
            f.seek(sum(len(line) for line in lines if line.endswith(b"\n")))
            pending = b""
            while True:
                done = log.closed.is_set()
                data = f.readline()
                if data:
                    pending += data
                    if pending.endswith(b"\n"):
                        r = render(pending, q)
                        pending = b""
                        if r and (q.since is None or r[0] >= q.since):
                            yield r[1]
                    continue
                if done or self.runner.stopping.is_set():
                    return
                log.closed.wait(0.1)


def serve(runner: PodRunner, port: int, cert: Path, key: Path, client_ca: Path) -> ThreadingHTTPServer:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    ctx.load_verify_locations(client_ca)
    ctx.verify_mode = ssl.CERT_REQUIRED
    handler = type("Handler", (KubeletHandler,), {"runner": runner})
    server = ThreadingHTTPServer(("127.0.0.1", port), handler)
    server.daemon_threads = True
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True, name="kubelet-api").start()
    return server


def node_ready(name: str) -> bool:
    config.load_kube_config()
    node = client.CoreV1Api().read_node(name)
    return any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.k8s.podrunner", description=__doc__.split("\n\n")[0])
    p.add_argument("--ready", metavar="NODE", help="exit 0 if NODE is Ready (KUBECONFIG), 1 otherwise")
    p.add_argument("--kubeconfig", type=Path, help="the Node's credentials (system:node:<name>)")
    p.add_argument("--node", default="attune-node")
    p.add_argument("--port", type=int, default=10250, help="the kubelet endpoint's port on 127.0.0.1")
    p.add_argument("--cert", type=Path, help="the endpoint's serving certificate (IP 127.0.0.1)")
    p.add_argument("--key", type=Path)
    p.add_argument("--client-ca", type=Path, help="the CA of the API server's client certificate")
    p.add_argument("--work", type=Path, help="where pods' folders and logs are kept")
    p.add_argument("--images", type=Path, help="a JSON file mapping image names to local folders")
    args = p.parse_args(argv)
    if args.ready:
        try:
            return 0 if node_ready(args.ready) else 1
        except Exception:  # noqa: BLE001 - not ready, whatever the reason
            return 1
    missing = [f"--{n.replace('_', '-')}" for n in ("kubeconfig", "cert", "key", "client_ca", "work")
               if getattr(args, n) is None]
    if missing:
        p.error(f"{', '.join(missing)} required")
    cfg = client.Configuration()
    config.load_kube_config(config_file=str(args.kubeconfig), client_configuration=cfg)
    runner = PodRunner(client.ApiClient(cfg), args.node, args.port, args.work, args.images)
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    signal.signal(signal.SIGINT, lambda *_: stopped.set())
    server = serve(runner, args.port, args.cert, args.key, args.client_ca)
    runner.register()
    runner.log(f"node {args.node} registered; kubelet endpoint https://127.0.0.1:{args.port}")
    threading.Thread(target=runner.watch_pods, daemon=True, name="pods").start()
    stopped.wait()
    runner.shutdown()
    server.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
