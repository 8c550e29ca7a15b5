"""Stand-ins for the reconcile tests: in-memory ports (API, jobs, pods, Prometheus, agent), a scripted Prometheus
client, the run under test and its journal."""

from __future__ import annotations

import copy
from typing import Any

from attune.engine.measure import summarise
from attune.operator import agent_client, metrics
from attune.operator.metrics import MetricsUnavailable
from attune.operator.reconcile import iso, reconcile
from attune.operator.resources import AgentSpec
from tests.k8s.conftest import good_run
from tests.k8s.harness import kubeflow_pod_labels


def _merge(into: dict, patch: dict) -> None:
    """A JSON merge patch (None deletes), as the API server applies a status patch."""
    for k, v in patch.items():
        if v is None:
            into.pop(k, None)
        elif isinstance(v, dict) and isinstance(into.get(k), dict):
            _merge(into[k], v)
        else:
            into[k] = copy.deepcopy(v)


class FakePorts:
    """In-memory API plus scripted Prometheus and jobs; ``finish`` makes every running job succeed or fail. Every
    job's pods run at once (``pods_running`` False: they stay pending, as without free accelerators; ``pods_refused``
    a message: admission refuses to create them, and the training operator says so in a FailedCreatePod event)."""

    def __init__(self, measure_error: bool = False) -> None:
        self.t = 1_000_000.0
        self.trials: dict[str, dict[str, Any]] = {}
        self.jobs: dict[str, dict[str, Any]] = {}
        self.jobs_created: list[str] = []
        self.measure_error = measure_error
        self.tps = {"full": 100.0, "selective": 130.0, "none": 160.0}
        self.served_kinds = {"pytorchjobs", "trainjobs"}
        self.pods_running = True
        self.pods_refused: str | None = None
        self.pod_start: dict[str, float] = {}
        self.pod_generation: dict[str, int] = {}  # how often a job's pods were replaced (their UIDs change)
        self.ops: list[tuple[str, str]] = []
        self.configmaps: dict[str, dict[str, Any]] = {}
        self.secrets: dict[tuple[str, str], str] = {}
        self.rv = 100
        self.missing_points = False
        self.lessons_steer = False  # KubePorts: the agent's lessons setting (ATTUNE_LESSONS_STEER)
        self.signals: dict[str, float] = {}
        self.kueue_says: dict[str, str] | None = None
        self.quota_left = None

    def now(self) -> float:
        return self.t

    def read_configmap(self, namespace, name, key):
        data = (self.configmaps.get(name) or {}).get("data") or {}
        if key not in data:
            raise LookupError(f"ConfigMap {namespace}/{name} not found")
        return data[key]

    def read_secret(self, namespace, name, key):
        if (name, key) not in self.secrets:
            raise LookupError(f"Secret {namespace}/{name} not found")
        return self.secrets[(name, key)]

    def write_configmap(self, cm):
        self.ops.append(("configmap", cm["metadata"]["name"]))
        old = self.configmaps.get(cm["metadata"]["name"])  # as Kube.write_configmap: create, or merge the data in
        self.configmaps[cm["metadata"]["name"]] = copy.deepcopy(cm)
        if old is not None:
            self.configmaps[cm["metadata"]["name"]]["data"] = {**old.get("data", {}), **cm["data"]}

    def write_output_configmap(self, cm):
        from attune.operator.results import write_decision

        decision = write_decision(self.configmaps.get(cm["metadata"]["name"]), cm)
        if decision.action != "foreign":
            self.write_configmap(cm)
        return decision

    def list_trials(self, namespace, run):
        return [copy.deepcopy(t) for t in self.trials.values()]

    def create_trial(self, trial):
        trial = copy.deepcopy(trial)
        trial["metadata"]["uid"] = f"uid-{trial['metadata']['name']}"
        if trial["metadata"]["name"] not in self.trials:
            self.trials[trial["metadata"]["name"]] = trial
            self._bump(trial["metadata"]["name"])
        return self.trials[trial["metadata"]["name"]]

    def patch_trial_status(self, namespace, name, status):
        self.ops.append(("patch", name))
        _merge(self.trials[name].setdefault("status", {}), status)
        return self._bump(name)

    def record_trial_status(self, namespace, name, status, version):
        """The guarded write: refused when the trial moved past ``version`` (as the API's JSON-patch test op)."""
        if self.trials[name]["metadata"].get("resourceVersion") != version:
            self.ops.append(("record-refused", name))
            return False
        self.patch_trial_status(namespace, name, {k: v for k, v in status.items() if v is not None})
        return True

    def _bump(self, name):
        self.rv += 1
        self.trials[name]["metadata"]["resourceVersion"] = str(self.rv)
        return str(self.rv)

    def served(self, api_version, plural):
        return plural in self.served_kinds

    def get_job(self, namespace, name, kind="PyTorchJob"):
        return copy.deepcopy(self.jobs.get(name))

    def create_job(self, job):
        assert job["metadata"]["name"] not in self.jobs_created, "a job was created twice"
        self.jobs_created.append(job["metadata"]["name"])
        self.ops.append(("create", job["metadata"]["name"]))
        spec = job.get("spec") or {}
        if (spec.get("runPolicy") or {}).get("suspend") or spec.get("suspend"):  # created suspended (Kueue)
            job["status"] = {"conditions": [{"type": "Suspended", "status": "True"}]}
            self.jobs[job["metadata"]["name"]] = job
            return None
        job["status"] = {"startTime": iso(self.t), "conditions": [{"type": "Running", "status": "True"}]}
        if self.pods_refused is not None:  # the real training operator (v1.9.4) then writes no status at all
            job["status"] = {}
        elif job["kind"] == "TrainJob":
            job["status"] = {"startTime": iso(self.t), "conditions": [], "jobsStatus": [{"name": "node", "active": 1}]}
        self.jobs[job["metadata"]["name"]] = job
        if self.pods_running:
            self.pod_start[job["metadata"]["name"]] = self.t
        return None

    def admit(self, name: str) -> None:
        """Kueue admits a suspended job: it is unsuspended, its pods start now."""
        job = self.jobs[name]
        job["spec"].setdefault("runPolicy", {})["suspend"] = False
        job["status"] = {"startTime": iso(self.t), "conditions": [{"type": "Running", "status": "True"}]}
        self.pod_start[name] = self.t

    def delete_job(self, namespace, name, kind="PyTorchJob"):
        self.ops.append(("delete", name))
        self.jobs.pop(name, None)

    def hours_left(self, namespace):
        return self.quota_left  # a quota.Left, or None: no quota

    def workload_admission(self, namespace, job_uid):
        return self.kueue_says  # a Workload's QuotaReserved condition, as Kueue writes it

    def job_warnings(self, namespace, kind, name):
        if self.pods_refused is None or name not in self.jobs:
            return []
        return [{"reason": "FailedCreatePod", "message": f"Error creating: {self.pods_refused}", "time": self.t}]

    def list_pods(self, namespace, label_selector):
        name = label_selector.split("=", 1)[1]
        if self.pods_refused is not None:
            return []
        if "jobset" in label_selector and name in self.jobs and name in self.pod_start:
            from tests.k8s.harness import trainjob_pod_labels

            return [{"metadata": {"name": f"{name}-node-0-0-abcde", "labels": trainjob_pod_labels(name)},
                     "spec": {"containers": [{"name": "node"}]},
                     "status": {"phase": "Running", "containerStatuses": [
                         {"name": "node", "state": {"running": {"startedAt": iso(self.pod_start[name])}}}]}}]
        if name not in self.jobs:
            return []
        start = self.pod_start.get(name)
        status = {"phase": "Pending", "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
             "message": "0/4 nodes are available: 4 Insufficient nvidia.com/gpu."}]} if start is None else \
            {"phase": "Running", "containerStatuses": [
                {"name": "pytorch", "state": {"running": {"startedAt": iso(start)}}}]}
        return [{"metadata": {"name": f"{name}-master-0", "labels": kubeflow_pod_labels(name, "Master", 0),
                              "uid": f"uid-{name}-master-0-{self.pod_generation.get(name, 0)}"},
                 "spec": {"containers": [{"name": "pytorch"}]}, "status": status}]

    def bounce(self, name: str) -> None:
        """Kueue preempts the job and admits it again between two looks: the training operator deleted its pods on
        the suspension and created new ones on the resumption (other UIDs, started now); the job says Resumed."""
        self.pod_generation[name] = self.pod_generation.get(name, 0) + 1
        self.pod_start[name] = self.t
        self.jobs[name]["status"]["conditions"].insert(0, {"type": "Suspended", "status": "False",
                                                           "reason": "PyTorchJobResumed"})

    def start_pods(self) -> None:
        """Accelerators free up: every pending job's pods start now."""
        for name in self.jobs:
            self.pod_start.setdefault(name, self.t)

    def read_pod_log(self, namespace, pod, container):
        return ""

    def finish(self, ok: bool = True, reason: str = "") -> None:
        for name, job in self.jobs.items():
            conds = job["status"]["conditions"]
            if job["kind"] == "TrainJob" and name in self.pod_start and not conds:
                conds.append({"type": "Complete" if ok else "Failed", "status": "True", "reason": reason})
                job["status"]["jobsStatus"] = [{"name": "node", "active": 0, "succeeded": int(ok)}]
                job["status"]["completionTime"] = self.completion_time()
            elif conds and conds[-1]["type"] == "Running" and name in self.pod_start:
                conds.append({"type": "Succeeded" if ok else "Failed", "status": "True", "reason": reason})
                job["status"]["completionTime"] = self.completion_time()

    def completion_time(self) -> str:
        return iso(self.t)

    def measure(self, m, namespace, job, start, end, *, tokens_per_step, devices, access=None, pod_regex=None):
        if self.measure_error:
            raise MetricsUnavailable("Prometheus at http://x is unreachable: refused")
        if self.missing_points:  # Prometheus answered but holds too few of the trial's steps (missed scrapes)
            return None
        self.measured = (start, end, access)
        trial = next(t for t in self.trials.values() if (t.get("status") or {}).get("jobRef", {}).get("name") == job)
        ckpt = trial["spec"]["knobs"]["activation_checkpointing"]
        n = m.warmup_steps + m.measure_steps
        steps = [{"step": i, "step_time_s": tokens_per_step / self.tps[ckpt], "tokens": tokens_per_step,
                  "loss": 5.0 - i / 1000, "grad_norm": 1.0} for i in range(1, n + 1)]
        return summarise(steps, warmup_steps=m.warmup_steps, devices=devices, signals=dict(self.signals))

    def propose(self, state, agent: AgentSpec, namespace=None):
        from attune.operator.lessons import LESSONS_CONFIGMAP, store_from_data

        cm = self.configmaps.get(LESSONS_CONFIGMAP)
        self.proposed_with = store_from_data(cm["data"]) if cm and self.lessons_steer else None
        return agent_client.propose(state, agent, self.proposed_with)


def records(ports, run=None):
    """The run's journal: its trials' records, the loss checks on them, and the refusals its status keeps."""
    from attune.operator.reconcile import fold_records

    return [r.model_dump(mode="json") for r in fold_records(list(ports.trials.values()),
                                                            (run or {}).get("status") or {})]


def tuning_run(**over):
    """The example TuningRun as the API server hands it to reconcile (named ``r``, with a uid and generation)."""
    run = good_run("r", "http://prom.ml.svc", None, **over)  # a Service of the run's own namespace
    run["metadata"].update(uid="run-uid", generation=1)
    run["apiVersion"], run["kind"] = "attune.dev/v1alpha1", "TuningRun"
    return run


class ScriptedPrometheus:
    """A PrometheusClient stand-in answering the trainer queries from a script of per-step values."""

    def __init__(self, losses: dict[int, float], sampled: list[int], per_step_times: bool = True) -> None:
        self.losses, self.sampled, self.per_step_times, self.queries = losses, sampled, per_step_times, []

    def query_range(self, promql, start, end, step_s=1.0):
        if promql.startswith(f"max({metrics.STEPS}"):
            return [(float(s), float(s)) for s in self.sampled]
        return [(float(s), 0.25) for s in self.sampled]

    def query(self, promql, at=None):
        return None

    def query_vector(self, promql, at=None):
        self.queries.append((promql, at))
        if metrics.STEP_SECONDS in promql:
            return [({"step": str(s)}, 0.5) for s in self.losses] if self.per_step_times else []
        return [({"step": str(s)}, v) for s, v in self.losses.items()]


# -- driving reconcile() step by step, as the timer handler does ----------------------------------------------

def step(run: dict[str, Any], ports: FakePorts, dt: float = 40.0):
    res = reconcile(run, ports)
    run["status"] = {k: v for k, v in {**(run.get("status") or {}), **res.status}.items() if v is not None}
    ports.t += dt
    return res


def waited_out(ports: FakePorts, pending_deadline: int = 300) -> dict[str, Any]:
    """The example run driven to its end while its pods never run (no accelerator frees up), giving up after
    ``pending_deadline`` seconds."""
    ports.pods_running = False
    run = tuning_run()
    run["spec"]["budget"]["pendingDeadlineSeconds"] = pending_deadline
    return drive(run, ports, each=lambda p: None)


def conds(run: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in run["status"]["conditions"]}


def drive(run, ports, steps=400, each=None, dt=40.0):
    for _ in range(steps):
        step(run, ports, dt)
        (each or (lambda p: p.finish()))(ports)
        if run["status"].get("phase") in ("Succeeded", "Failed"):
            return run
    raise AssertionError("the run did not finish")


def trainjob_run():
    """The example TuningRun with a TrainJob trial template (the ``torch-distributed`` runtime) in place of its
    PyTorchJob, the same image and resources."""
    run = tuning_run()
    pod = run["spec"]["trialTemplate"]["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    run["spec"]["trialTemplate"] = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
        "spec": {"runtimeRef": {"name": "torch-distributed"},
                 "trainer": {"image": pod["containers"][0]["image"], "numNodes": 1,
                             "resourcesPerNode": pod["containers"][0]["resources"]}}}
    return run
