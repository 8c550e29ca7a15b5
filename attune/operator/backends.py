"""Trial backends: the kinds of training job a trial runs as, behind one interface.

Two implementations: Kubeflow's ``kubeflow.org/v1`` **PyTorchJob** (the training operator) and Kubeflow Trainer
v2's ``trainer.kubeflow.org/v1alpha1`` **TrainJob**, its successor. The run's ``trialTemplate`` kind chooses one
(:func:`backend_for`); the operator checks through API discovery that the cluster serves it before creating a job
(a missing CRD is a condition and a Failed run, not a retry loop).

Each backend knows how to turn the template into a trial's job (name, labels, owner, run policy, the framework's
knob changes), read a job's phase and whether Kueue holds it suspended, and find its pods: the selector of all of
them, rank 0's pod (whose log a log-measured trial is read from), and the PromQL pod-name pattern. Everything here
is pure.

Job names are always valid (:func:`job_name`): DNS-1035 labels of at most :data:`MAX_JOB_NAME` characters, so the
pods and services each backend derives from them fit too. A run name that is not one already (a dot, a leading
digit, upper case, too long) is sanitised and given a short hash of the original, so two runs never share one.
"""

from __future__ import annotations

import copy
import datetime as dt
import hashlib
import re
import shlex
from dataclasses import dataclass
from typing import Any, ClassVar

from attune.operator.resources import (
    API_VERSION,
    LABEL_INDEX,
    LABEL_QUEUE,
    LABEL_RUN,
    LABEL_TRIAL,
    TuningRunSpec,
    label_value,
)
from attune.recipe.model import Recipe

#: longest job name: a TrainJob's pods are ``<job>-node-<i>-<j>-<5 random>`` and hostnames are 63 characters at most
MAX_JOB_NAME = 48
_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def job_name(run_name: str, index: int, attempt: int = 0) -> str:
    """The name of trial ``index``'s job: ``<run>-t<NNN>`` (``-<attempt>`` after a name found taken), with the run
    name sanitised into a DNS-1035 label and hashed where it had to change or be shortened."""
    suffix = f"-t{index:03d}" + (f"-{attempt}" if attempt else "")
    base = re.sub(r"[^a-z0-9-]+", "-", run_name.lower()).strip("-")
    base = re.sub(r"-{2,}", "-", base)
    if not base or not base[0].isalpha():
        base = "r" + (f"-{base}" if base else "")
    limit = MAX_JOB_NAME - len(suffix)
    if base != run_name or len(base) > limit:
        digest = hashlib.sha256(run_name.encode()).hexdigest()[:6]
        base = f"{base[:limit - 7].rstrip('-')}-{digest}"
    name = base + suffix
    assert _DNS1035.match(name) and len(name) <= MAX_JOB_NAME, name
    return name


def _template_queue(spec: TuningRunSpec) -> str | None:
    """The Kueue queue the trial template's metadata names (label ``kueue.x-k8s.io/queue-name``), if any."""
    return ((spec.trial_template.get("metadata") or {}).get("labels") or {}).get(LABEL_QUEUE)


def valid_job_name(name: str) -> bool:
    return bool(_DNS1035.match(name)) and len(name) <= MAX_JOB_NAME


def owner_ref(obj: dict[str, Any], controller: bool = True) -> dict[str, Any]:
    """An ownerReference to ``obj`` (which must carry a uid)."""
    meta = obj["metadata"]
    return {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": meta["name"], "uid": meta["uid"],
            "controller": controller, "blockOwnerDeletion": True}


def owned_by(obj: dict[str, Any], uid: str | None) -> bool:
    """True when one of ``obj``'s owner references names ``uid``."""
    return bool(uid) and any(r.get("uid") == uid for r in (obj.get("metadata") or {}).get("ownerReferences") or [])


def rfc3339_time(value: Any) -> float | None:
    """POSIX time of an RFC 3339 timestamp as the API server writes them; None when absent or unreadable."""
    if not value:
        return None
    try:
        return dt.datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


@dataclass(frozen=True)
class TemplateLaunch:
    """The user's own launch as the trial template runs it: rank 0's training container's command and args."""

    argv: tuple[str, ...]
    cwd: str
    env: dict[str, str]
    replica: str  # replica type whose container it is (Master, or Worker without one; "trainer" for a TrainJob)
    processes: int | None  # processes per node when the template gives a number
    nodes: int  # pods (nodes) of the job
    container: dict[str, Any]  # the container itself (a TrainJob's spec.trainer)
    job_spec: dict[str, Any]  # the template's spec
    #: ConfigMap volumes mounted into the container: (mount path, ConfigMap name, items key → path, subPath)
    configmap_mounts: tuple[tuple[str, str, tuple[tuple[str, str], ...], str], ...] = ()
    #: accelerators rank 0's pod requests (what torchrun's ``--nproc-per-node auto`` starts one process per)
    accelerators_per_pod: int = 0
    #: accelerators all the job's pods request together: what a trial holds, and is charged for
    accelerators_held: int = 0

    def configmap_file(self, path: str) -> tuple[str, str] | None:
        """The (ConfigMap, key) a file the container sees at ``path`` comes from; None: not from a ConfigMap."""
        for mount, name, items, sub in self.configmap_mounts:
            if sub:
                if path == mount:
                    return name, next((k for k, p in items if p == sub), sub) if items else sub
                continue
            rel = path[len(mount.rstrip("/")) + 1:] if path.startswith(mount.rstrip("/") + "/") else None
            if not rel:
                continue
            if items:
                key = next((k for k, p in items if p == rel), None)
                if key is not None:
                    return name, key
            elif "/" not in rel:
                return name, rel
        return None

    def configmap_files(self) -> dict[str, tuple[str, str]]:
        """Files from ConfigMaps that the container's command names (``bash /scripts/run.sh``): path → (ConfigMap,
        key); relative paths are taken from the working directory."""
        out = {}
        for tok in self.argv:
            if not tok or tok.startswith("-"):
                continue
            path = tok if tok.startswith("/") else f"{self.cwd.rstrip('/')}/{tok}"
            hit = self.configmap_file(path)
            if hit is not None:
                out[path] = hit
        return out


@dataclass(frozen=True)
class PodsView:
    """What a trial's pods say: when the first training container started, why they are not running, and how a
    container that failed ended (``failure``: its exit code and the kubelet's reason, e.g. OOMKilled)."""

    running_since: float | None
    waiting_reason: str = ""
    waiting_message: str = ""
    count: int = 0
    failure: str = ""


def pods_view(pods: list[dict[str, Any]]) -> PodsView:
    """The earliest container start among ``pods`` (a running or finished container's ``startedAt``, else a Running
    pod's start), or why none runs yet: the scheduler's reason (Unschedulable) or a container's (ImagePullBackOff);
    and the first container that ended with a non-zero exit code. The training operator's Failed condition only
    says that a replica failed: its exit code and an OOM kill show on the pod alone."""
    starts: list[float] = []
    reason, message, failure = "", "", ""
    for pod in pods:
        st = pod.get("status") or {}
        for cs in st.get("containerStatuses") or []:
            state = cs.get("state") or {}
            for key in ("running", "terminated"):
                t = rfc3339_time((state.get(key) or {}).get("startedAt"))
                if t is not None:
                    starts.append(t)
            if not failure:
                failure = _container_failure(str((pod.get("metadata") or {}).get("name", "")), cs)
            waiting = state.get("waiting") or {}
            if waiting.get("reason") and not reason:
                reason, message = str(waiting["reason"]), str(waiting.get("message", ""))
        if st.get("phase") == "Running" and not st.get("containerStatuses"):
            t = rfc3339_time(st.get("startTime"))
            if t is not None:
                starts.append(t)
        for cond in st.get("conditions") or []:
            if cond.get("type") == "PodScheduled" and cond.get("status") == "False" and not reason:
                reason, message = str(cond.get("reason") or "Unschedulable"), str(cond.get("message", ""))
    return PodsView(running_since=min(starts) if starts else None, waiting_reason=reason,
                    waiting_message=message[:300], count=len(pods), failure=failure)


def pod_uids(pods: list[dict[str, Any]]) -> list[str]:
    return sorted(str(uid) for p in pods if (uid := (p.get("metadata") or {}).get("uid")))


def pods_replaced(seen: list[str] | None, pods: list[dict[str, Any]]) -> bool:
    """Whether the pods a trial was first seen running on (``seen``, their UIDs) have gone and others run in their
    place: a job suspended and admitted again (a Kueue preemption between two looks), or pods evicted and recreated
    by the training operator. Judged by identity, not by clocks (a node's clock may be behind the operator's). Pods
    merely gone (cleaned up after the job ended) are not a replacement."""
    first, now = set(seen or ()), set(pod_uids(pods))
    return bool(first) and bool(now - first) and not first <= now


def _container_failure(pod: str, status: dict[str, Any]) -> str:
    """How a container ended, if it failed (its current run, else its last): e.g. ``container pytorch of pod
    r-t001-master-0 exited with 137 (OOMKilled)``; empty for a container that did not fail."""
    for state in (status.get("state") or {}, status.get("lastState") or {}):
        term = state.get("terminated") or {}
        code = term.get("exitCode")
        if code is not None and code != 0:
            why = f" ({term['reason']})" if term.get("reason") else ""
            said = f": {str(term['message']).strip()[:200]}" if str(term.get("message") or "").strip() else ""
            return f"container {status.get('name', '')} of pod {pod} exited with {code}{why}{said}"
    return ""


class JobBackend:
    """One kind of training job (see the module doc)."""

    kind: ClassVar[str]
    group: ClassVar[str]
    version: ClassVar[str]
    plural: ClassVar[str]
    #: where a job's start of running shows when its pods are gone (a fallback for charging)
    default_container: ClassVar[str] = "pytorch"

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"

    def describe(self) -> str:
        return f"{self.api_version} {self.plural}"

    # -- building ---------------------------------------------------------------------------------------------
    def template_launch(self, spec: TuningRunSpec) -> TemplateLaunch:
        raise NotImplementedError

    def build(self, run: dict[str, Any], trial: dict[str, Any], recipe: Recipe, name: str) -> dict[str, Any]:
        """The job that runs ``trial`` (a TuningTrial with a uid) of ``run``, named ``name``."""
        spec = TuningRunSpec.model_validate(run["spec"])
        job = copy.deepcopy(spec.trial_template)
        tmeta = trial["metadata"]
        labels = {LABEL_RUN: label_value(run["metadata"]["name"]), LABEL_TRIAL: label_value(tmeta["name"]),
                  LABEL_INDEX: str(trial["spec"]["index"])}
        tmpl_meta = job.get("metadata") or {}
        job["apiVersion"] = self.api_version
        job["kind"] = self.kind
        job["metadata"] = {"name": name, "namespace": tmeta["namespace"],
                           "labels": {**(tmpl_meta.get("labels") or {}), **labels},
                           "annotations": {**(tmpl_meta.get("annotations") or {}),
                                           "attune.dev/change": shlex.join(f"{k}={v}" for k, v in
                                                                           trial["spec"]["change"].items())},
                           "ownerReferences": [owner_ref(trial)]}
        self._patch(spec, job, recipe, labels)
        return job

    def _patch(self, spec: TuningRunSpec, job: dict[str, Any], recipe: Recipe, labels: dict[str, str]) -> None:
        raise NotImplementedError

    @staticmethod
    def active_deadline(spec: TuningRunSpec) -> int:
        """The job's own deadline: a backstop for a trial the operator cannot watch, beyond its running deadline
        and its pending deadline (Kubeflow counts it from the job's start, before the pods are scheduled)."""
        b = spec.budget
        return b.trial_deadline_seconds + (b.pending_deadline(bool(_template_queue(spec))) or 24 * 3600) + 120

    @staticmethod
    def kueue(spec: TuningRunSpec) -> bool:
        """Whether the trial template names a Kueue queue (its jobs are created suspended and admitted by Kueue)."""
        return bool(_template_queue(spec))

    @staticmethod
    def queued(job: dict[str, Any]) -> bool:
        return bool(((job.get("metadata") or {}).get("labels") or {}).get(LABEL_QUEUE))

    # -- reading ----------------------------------------------------------------------------------------------
    def state(self, job: dict[str, Any]) -> tuple[str, str, str]:
        """(phase, reason, message): Pending, Running, Succeeded or Failed."""
        raise NotImplementedError

    def suspended(self, job: dict[str, Any]) -> bool:
        """True while the job is suspended (by Kueue, waiting for quota)."""
        raise NotImplementedError

    def was_suspended(self, job: dict[str, Any]) -> bool:
        """Whether the job carries a Suspended condition, true or false (false: suspended once, then resumed)."""
        return any(c.get("type") == "Suspended" for c in (job.get("status") or {}).get("conditions") or [])

    def pod_selector(self, name: str) -> str:
        raise NotImplementedError

    def master_pod(self, pods: list[dict[str, Any]], name: str) -> dict[str, Any] | None:
        raise NotImplementedError

    def pod_regex(self, name: str) -> str:
        """RE2 pattern of the job's pod names (for PromQL), ``name`` already escaped."""
        raise NotImplementedError

    def container(self, pod: dict[str, Any], spec: TuningRunSpec) -> str:
        """The training container's name in a pod of this job."""
        return spec.container_name


def _conds(job: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for c in (job.get("status") or {}).get("conditions") or [] if c.get("status") == "True"]


class PyTorchJobBackend(JobBackend):
    """Kubeflow training operator v1: ``kubeflow.org/v1`` PyTorchJob (Master and Worker replicas)."""

    kind = "PyTorchJob"
    group = "kubeflow.org"
    version = "v1"
    plural = "pytorchjobs"
    JOB_NAME_LABEL = "training.kubeflow.org/job-name"
    REPLICA_TYPE_LABEL = "training.kubeflow.org/replica-type"
    REPLICA_INDEX_LABEL = "training.kubeflow.org/replica-index"
    JOB_ROLE_LABEL = "training.kubeflow.org/job-role"

    def template_launch(self, spec: TuningRunSpec) -> TemplateLaunch:
        jspec = spec.trial_template.get("spec") or {}
        replicas = jspec.get("pytorchReplicaSpecs") or {}
        if not replicas:
            raise ValueError("spec.trialTemplate.spec.pytorchReplicaSpecs is empty: give at least a Master replica")
        rtype = "Master" if "Master" in replicas else sorted(replicas)[0]
        pod = ((replicas[rtype] or {}).get("template") or {}).get("spec") or {}
        container = next((c for c in pod.get("containers") or [] if c.get("name") == spec.container_name), None)
        if container is None:
            raise ValueError(f"replica {rtype} has no container named {spec.container_name!r} (spec.containerName)")
        nproc = str(jspec.get("nprocPerNode", "")).strip()
        nodes = sum(int((r or {}).get("replicas", 1) or 0) for r in replicas.values())
        mounts = _configmap_mounts(pod.get("volumes") or [], container.get("volumeMounts") or [])
        return _launch_of(container, rtype, f"the {rtype} container {spec.container_name!r}", nproc, nodes, jspec,
                          mounts, template_accelerators(spec.trial_template))

    def _patch(self, spec: TuningRunSpec, job: dict[str, Any], recipe: Recipe, labels: dict[str, str]) -> None:
        steps = spec.metrics.warmup_steps + spec.metrics.measure_steps
        fw = recipe.framework_impl
        jspec = job.setdefault("spec", {})
        policy = jspec.setdefault("runPolicy", {})
        policy["activeDeadlineSeconds"] = self.active_deadline(spec)
        policy["backoffLimit"] = 0
        # finished pods stay until the job goes (its trial's): a failed trial's exit code and OOM kill are read
        # from them, and a log-measured trial's log; pods still running when the job ends are removed
        policy.setdefault("cleanPodPolicy", "None" if fw.metrics_source == "logs" else "Running")
        if self.queued(job):
            policy.setdefault("suspend", True)  # Kueue admits it; never unsuspended here
        replicas = jspec.get("pytorchReplicaSpecs") or {}
        if not replicas:
            raise ValueError("trialTemplate.spec.pytorchReplicaSpecs is empty: give at least a Master replica")
        for rtype, rspec in replicas.items():
            pod = rspec.setdefault("template", {})
            pod.setdefault("metadata", {}).setdefault("labels", {}).update(labels)
            containers = pod.setdefault("spec", {}).get("containers") or []
            target = [c for c in containers if c.get("name") == spec.container_name]
            if not target:
                raise ValueError(f"replica {rtype} has no container named {spec.container_name!r}")
            fw.patch_job(recipe, job, target[0], steps=steps, metrics_port=spec.metrics.metrics_port,
                         linger_s=spec.metrics.linger_seconds)

    def state(self, job: dict[str, Any]) -> tuple[str, str, str]:
        true = _conds(job)
        for ctype in ("Succeeded", "Failed"):
            hit = [c for c in true if c.get("type") == ctype]
            if hit:
                return ctype, hit[-1].get("reason", ""), hit[-1].get("message", "")
        if any(c.get("type") == "Running" for c in true):
            return "Running", "", ""
        return "Pending", "", ""

    def suspended(self, job: dict[str, Any]) -> bool:
        policy = ((job.get("spec") or {}).get("runPolicy") or {})
        return bool(policy.get("suspend")) or any(c.get("type") == "Suspended" for c in _conds(job))

    def pod_selector(self, name: str) -> str:
        return f"{self.JOB_NAME_LABEL}={name}"

    def master_pod(self, pods: list[dict[str, Any]], name: str) -> dict[str, Any] | None:
        def rank(pod: dict[str, Any]) -> int | None:
            meta = pod.get("metadata") or {}
            labels = meta.get("labels") or {}
            if labels.get(self.JOB_NAME_LABEL) != name or meta.get("deletionTimestamp"):
                return None
            if str(labels.get(self.REPLICA_INDEX_LABEL, "")) != "0":
                return None
            rtype = str(labels.get(self.REPLICA_TYPE_LABEL, "")).lower()
            if rtype == "master" or labels.get(self.JOB_ROLE_LABEL) == "master":
                return 0
            return 1 if rtype == "worker" else None

        ranked = sorted(((r, p["metadata"].get("name", "")), p) for p in pods if (r := rank(p)) is not None)
        return ranked[0][1] if ranked else None

    def pod_regex(self, name: str) -> str:
        return name + "-(master|worker)-[0-9]+"


class TrainJobBackend(JobBackend):
    """Kubeflow Trainer v2: ``trainer.kubeflow.org/v1alpha1`` TrainJob (a runtime reference and ``spec.trainer``);
    its pods belong to a JobSet of the same name, rank 0 in replicated job ``node``, job index 0, completion 0."""

    kind = "TrainJob"
    group = "trainer.kubeflow.org"
    version = "v1alpha1"
    plural = "trainjobs"
    default_container = "node"
    JOBSET_LABEL = "jobset.sigs.k8s.io/jobset-name"
    REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
    JOB_INDEX_LABEL = "jobset.sigs.k8s.io/job-index"
    COMPLETION_INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
    #: the replicated job of a torch TrainingRuntime that runs the trainer (its container is ``node`` too)
    TRAINER_JOB = "node"
    #: who owns attune's entry in ``spec.runtimePatches`` (Trainer v2.2+; one entry per manager, like Kueue's)
    PATCH_MANAGER = "attune.dev/operator"

    @classmethod
    def _runtime_patch_pod_specs(cls, jspec: dict[str, Any]) -> list[dict[str, Any]]:
        """The pod specs a TrainJob's ``spec.runtimePatches`` (Trainer v2.2+) give the trainer's replicated job."""
        out = []
        for patch in jspec.get("runtimePatches") or []:
            tmpl = (((patch or {}).get("trainingRuntimeSpec") or {}).get("template") or {})
            for rjob in (tmpl.get("spec") or {}).get("replicatedJobs") or []:
                if (rjob or {}).get("name") == cls.TRAINER_JOB:
                    pod = ((((rjob.get("template") or {}).get("spec") or {}).get("template") or {}).get("spec"))
                    if isinstance(pod, dict):
                        out.append(pod)
        return out

    def template_launch(self, spec: TuningRunSpec) -> TemplateLaunch:
        jspec = spec.trial_template.get("spec") or {}
        trainer = jspec.get("trainer")
        if not isinstance(trainer, dict):
            raise ValueError("spec.trialTemplate.spec.trainer is missing: a TrainJob template gives the trainer's "
                             "image, command and args")
        nproc = str(trainer.get("numProcPerNode", "")).strip()
        volumes: list[Any] = []
        volume_mounts: list[Any] = []
        # the trainer has no volumes of its own: a TrainJob adds them to the runtime's pods through its overrides
        # (podSpecOverrides, renamed podTemplateOverrides in Trainer v2.1, then runtimePatches in v2.2)
        for ov in ((jspec.get("podSpecOverrides") or []) + (jspec.get("podTemplateOverrides") or [])
                   + self._runtime_patch_pod_specs(jspec)):
            pspec = (ov or {}).get("spec") or ov or {}
            volumes += pspec.get("volumes") or []
            for c in pspec.get("containers") or []:
                if c.get("name") in (self.default_container, spec.container_name):
                    volume_mounts += c.get("volumeMounts") or []
        return _launch_of(trainer, "trainer", "spec.trainer", nproc, int(trainer.get("numNodes") or 1), jspec,
                          _configmap_mounts(volumes, volume_mounts), template_accelerators(spec.trial_template))

    def _patch(self, spec: TuningRunSpec, job: dict[str, Any], recipe: Recipe, labels: dict[str, str]) -> None:
        steps = spec.metrics.warmup_steps + spec.metrics.measure_steps
        fw = recipe.framework_impl
        jspec = job.setdefault("spec", {})
        if not isinstance(jspec.get("runtimeRef"), dict):
            raise ValueError("trialTemplate.spec.runtimeRef is missing: a TrainJob names its (Cluster)TrainingRuntime")
        jspec["activeDeadlineSeconds"] = self.active_deadline(spec)
        if self.queued(job):
            jspec.setdefault("suspend", True)
        trainer = jspec.setdefault("trainer", {})
        shim: dict[str, Any] = {"kind": "PyTorchJob", "spec": {}}  # the frameworks patch a PyTorchJob's nprocPerNode
        fw.patch_job(recipe, shim, trainer, steps=steps, metrics_port=spec.metrics.metrics_port,
                     linger_s=spec.metrics.linger_seconds)
        nproc = str(shim["spec"].get("nprocPerNode", "")).strip()
        if nproc:
            trainer["numProcPerNode"] = int(nproc) if nproc.isdigit() else nproc
        trainer.pop("ports", None)  # a trainer has no ports: its runtime's pod template exposes them
        trainer.pop("name", None)
        # the run's labels on the trial's pods, which the chart's TrainJob PodMonitor selects by: Trainer v2.0 and
        # v2.1 apply ``spec.labels`` to the JobSet, its Jobs and pods; v2.2 has no such field (its schema prunes it)
        # and takes pod labels from a runtime patch of the trainer's replicated job, merged into its pod template.
        # Both are written: each version's schema drops the field it does not have.
        jspec.setdefault("labels", {}).update(labels)
        patch = {"manager": self.PATCH_MANAGER, "trainingRuntimeSpec": {"template": {
            "metadata": {"labels": dict(labels)},
            "spec": {"replicatedJobs": [{"name": self.TRAINER_JOB, "template": {
                "metadata": {"labels": dict(labels)},
                "spec": {"template": {"metadata": {"labels": dict(labels)}}}}}]}}}}
        others = [p for p in jspec.get("runtimePatches") or [] if (p or {}).get("manager") != self.PATCH_MANAGER]
        jspec["runtimePatches"] = [*others, patch]

    def state(self, job: dict[str, Any]) -> tuple[str, str, str]:
        true = _conds(job)
        for ctype, phase in (("Complete", "Succeeded"), ("Failed", "Failed")):
            hit = [c for c in true if c.get("type") == ctype]
            if hit:
                return phase, hit[-1].get("reason", ""), hit[-1].get("message", "")
        jobs = (job.get("status") or {}).get("jobsStatus") or []
        if any(int(j.get("active") or 0) > 0 or int(j.get("ready") or 0) > 0 for j in jobs):
            return "Running", "", ""
        return "Pending", "", ""

    def suspended(self, job: dict[str, Any]) -> bool:
        return bool((job.get("spec") or {}).get("suspend")) or any(c.get("type") == "Suspended" for c in _conds(job))

    def pod_selector(self, name: str) -> str:
        return f"{self.JOBSET_LABEL}={name}"

    def master_pod(self, pods: list[dict[str, Any]], name: str) -> dict[str, Any] | None:
        def rank0(pod: dict[str, Any]) -> bool:
            meta = pod.get("metadata") or {}
            labels = meta.get("labels") or {}
            return (labels.get(self.JOBSET_LABEL) == name and not meta.get("deletionTimestamp")
                    and labels.get(self.REPLICATED_JOB_LABEL, "node") == "node"
                    and str(labels.get(self.JOB_INDEX_LABEL, "0")) == "0"
                    and str(labels.get(self.COMPLETION_INDEX_LABEL, "0")) == "0")

        hits = sorted((p for p in pods if rank0(p)), key=lambda p: p["metadata"].get("name", ""))
        return hits[0] if hits else None

    def pod_regex(self, name: str) -> str:
        return name + "-node-[0-9]+-[0-9]+-[a-z0-9]+"

    def container(self, pod: dict[str, Any], spec: TuningRunSpec) -> str:
        names = [c.get("name") for c in (pod.get("spec") or {}).get("containers") or []]
        return "node" if "node" in names or not names else str(names[0])


def _configmap_mounts(volumes: list[Any], mounts: list[Any]) -> tuple[tuple[str, str, tuple[tuple[str, str], ...],
                                                                             str], ...]:
    """The container's mounts of ConfigMap volumes: (mount path, ConfigMap, items key → path, subPath)."""
    by_name = {v.get("name"): v["configMap"] for v in volumes
               if isinstance(v, dict) and isinstance(v.get("configMap"), dict) and v["configMap"].get("name")}
    out = []
    for m in mounts:
        cm = by_name.get((m or {}).get("name")) if isinstance(m, dict) else None
        if cm is None or not m.get("mountPath"):
            continue
        items = tuple((str(i.get("key")), str(i.get("path"))) for i in cm.get("items") or [] if i.get("key"))
        out.append((str(m["mountPath"]), str(cm["name"]), items, str(m.get("subPath") or "")))
    return tuple(out)


#: extended resources that are accelerators (device plugins' names: NVIDIA, its MIG slices, AMD, Intel, Gaudi,
#: Neuron, TPU)
ACCELERATOR_RESOURCE = re.compile(r"^(nvidia\.com/(gpu|mig-[-.a-z0-9]+)|amd\.com/gpu|gpu\.intel\.com/[-.a-z0-9]+|"
                                  r"habana\.ai/gaudi|aws\.amazon\.com/neuron(core|device)?|google\.com/tpu)$")


def accelerators_of(resources: dict[str, Any] | None) -> int:
    """Accelerators a container's resources ask for (its limits, which extended resources must set, else its
    requests): the sum of every accelerator resource's count."""
    res = resources or {}
    asked = res.get("limits") or res.get("requests") or {}
    total = 0
    for name, qty in asked.items():
        if ACCELERATOR_RESOURCE.match(str(name)):
            try:
                total += int(str(qty))
            except ValueError:
                continue  # not a whole count: the API server refuses it for an extended resource anyway
    return total


def pod_accelerators(pod_spec: dict[str, Any]) -> int:
    """Accelerators a pod's containers ask for together."""
    return sum(accelerators_of(c.get("resources")) for c in pod_spec.get("containers") or [])


def template_accelerators(template: dict[str, Any]) -> tuple[int, int]:
    """(accelerators rank 0's pod requests, accelerators all the job's pods request) of a trial template: a
    PyTorchJob's replicas (Master's pod is rank 0's), a TrainJob's ``trainer.resourcesPerNode`` times its nodes."""
    jspec = template.get("spec") or {}
    if (template.get("kind") or "PyTorchJob") == "TrainJob":
        trainer = jspec.get("trainer") or {}
        per_node = accelerators_of(trainer.get("resourcesPerNode"))
        return per_node, per_node * int(trainer.get("numNodes") or 1)
    replicas = jspec.get("pytorchReplicaSpecs") or {}

    def pod(rtype: str) -> dict[str, Any]:
        return (((replicas.get(rtype) or {}).get("template") or {}).get("spec")) or {}

    first = "Master" if "Master" in replicas else (sorted(replicas)[0] if replicas else "")
    held = sum(int((r or {}).get("replicas", 1) or 0) * pod_accelerators(pod(t)) for t, r in replicas.items())
    return (pod_accelerators(pod(first)) if first else 0), held


def _launch_of(container: dict[str, Any], replica: str, where: str, nproc: str, nodes: int,
               jspec: dict[str, Any], mounts: tuple[tuple[str, str, tuple[tuple[str, str], ...], str], ...] = (),
               accelerators: tuple[int, int] = (0, 0)) -> TemplateLaunch:
    argv = [str(a) for a in (container.get("command") or []) + (container.get("args") or [])]
    if not container.get("command"):
        raise ValueError(f"{where} sets no command: the operator cannot see the image's entrypoint, so give the "
                         "launch as command (and args)")
    env = {e["name"]: str(e["value"]) for e in container.get("env") or [] if "name" in e and "value" in e}
    return TemplateLaunch(argv=tuple(argv), cwd=str(container.get("workingDir") or "/"), env=env, replica=replica,
                          processes=int(nproc) if nproc.isdigit() and int(nproc) > 0 else None,
                          nodes=max(nodes, 1), container=copy.deepcopy(container), job_spec=copy.deepcopy(jspec),
                          configmap_mounts=mounts, accelerators_per_pod=accelerators[0],
                          accelerators_held=accelerators[1])


BACKENDS: dict[str, JobBackend] = {"PyTorchJob": PyTorchJobBackend(), "TrainJob": TrainJobBackend()}


def backend_for(template: dict[str, Any]) -> JobBackend:
    """The backend the trial template's kind names (PyTorchJob when it names none); :class:`ValueError` otherwise."""
    kind = template.get("kind") or "PyTorchJob"
    api = template.get("apiVersion")
    backend = BACKENDS.get(kind)
    if backend is None:
        raise ValueError(f"spec.trialTemplate.kind {kind!r} is not a trial backend; use one of "
                         f"{', '.join(f'{b.api_version} {k}' for k, b in BACKENDS.items())}")
    if api and api != backend.api_version:
        raise ValueError(f"spec.trialTemplate.apiVersion {api!r}: a {kind} is {backend.api_version}")
    return backend


__all__ = ["API_VERSION", "BACKENDS", "MAX_JOB_NAME", "JobBackend", "PodsView", "PyTorchJobBackend",
           "TemplateLaunch", "TrainJobBackend", "backend_for", "job_name", "owned_by", "owner_ref", "pods_view",
           "template_accelerators", "valid_job_name"]
