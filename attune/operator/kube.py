"""The only module that talks to the Kubernetes API (through the official ``kubernetes`` client).

Creates are idempotent (409 AlreadyExists returns the existing object, for the caller to check its owner), a
permanent refusal of a job is an :class:`~attune.operator.reconcile.ApiRefusal` with the API's code, reason and
message, status writes are merge-patches of the ``status`` subresource, and nothing uses PUT, so
optimistic-concurrency conflicts cannot stall a run. Jobs are addressed by kind (PyTorchJob or TrainJob, see
:mod:`attune.operator.backends`), and API discovery says whether the cluster serves a kind at all.
"""

from __future__ import annotations

import base64
import functools
import json
import logging
import os
import time
from collections.abc import Callable
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from attune.engine.state import RunState
from attune.operator import agent_client, metrics
from attune.operator.backends import BACKENDS, JobBackend
from attune.operator.podlogs import LOG_LIMIT_BYTES, LogsUnavailable
from attune.operator.reconcile import ApiRefusal, DiscoveryUnavailable
from attune.operator.resources import (
    GROUP,
    LABEL_RUN,
    RUN_PLURAL,
    TRIAL_PLURAL,
    VERSION,
    AgentSpec,
    MetricsSpec,
    label_value,
)
from attune.trial import Measurement

log = logging.getLogger(__name__)

JOB_GROUP, JOB_VERSION, JOB_PLURAL = "kubeflow.org", "v1", "pytorchjobs"
#: how long one of the operator's API requests may take (connect, then read) before it fails and its step is tried
#: again; kopf's own requests have the same bound (handlers: ``settings.networking.request_timeout``)
REQUEST_TIMEOUT_S = (10.0, 30.0)


def _backend(kind: str) -> JobBackend:
    return BACKENDS[kind]


def api_message(err: ApiException) -> tuple[str, str]:
    """(reason, message) of an API error: the Status object's, else the HTTP reason."""
    body = err.body.decode("utf-8", errors="replace") if isinstance(err.body, bytes) else str(err.body or "")
    try:
        data = json.loads(body)
        return str(data.get("reason") or err.reason or ""), str(data.get("message") or "")
    except (ValueError, AttributeError):
        return str(err.reason or ""), body[:300]


def retry_after(err: BaseException) -> float | None:
    """The seconds a throttled request asks the client to wait before trying again (the API server's 429 from API
    priority and fairness or a not-ready cache, a 503 of an aggregated API): its Retry-After header, else the Status's
    ``details.retryAfterSeconds``; None for any other error. The official client retries only idempotent requests
    itself, so a throttled create or patch reaches the operator, which must wait that long, not its own interval."""
    if not isinstance(err, ApiException) or err.status not in (429, 503):
        return None
    header = (err.headers or {}).get("Retry-After")
    try:
        if header is not None:
            return max(float(header), 0.0)
        body = err.body.decode("utf-8", errors="replace") if isinstance(err.body, bytes) else str(err.body or "")
        seconds = ((json.loads(body) or {}).get("details") or {}).get("retryAfterSeconds")
        return max(float(seconds), 0.0) if seconds is not None else None
    except (ValueError, TypeError, AttributeError):
        return None


def describe_error(err: BaseException) -> str:
    """An error in one line: an API error's status, reason and message (not the client's dump of every header)."""
    if isinstance(err, ApiException):
        reason, message = api_message(err)
        return f"{err.status} {reason}: {message}".strip().rstrip(":")
    return str(err) or type(err).__name__


class BoundedApiClient(client.ApiClient):
    """The official client, each request bounded by :data:`REQUEST_TIMEOUT_S` unless the call sets its own. The
    client sets none by default: a connection the API server (or a load balancer before it) accepted and never
    answered held a reconcile step's thread, and with it the run's timer, for ever."""

    def call_api(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("_request_timeout") is None:
            kwargs["_request_timeout"] = REQUEST_TIMEOUT_S
        return super().call_api(*args, **kwargs)


def api_client() -> client.ApiClient:
    """A client for ``$KUBECONFIG`` (read now, not at import), in-cluster credentials, or the default kubeconfig;
    its requests are bounded (:class:`BoundedApiClient`)."""
    cfg = client.Configuration()
    if os.environ.get("KUBECONFIG"):
        config.load_kube_config(config_file=os.environ["KUBECONFIG"], client_configuration=cfg)
    else:
        try:
            config.load_incluster_config(client_configuration=cfg)
        except config.ConfigException:
            config.load_kube_config(client_configuration=cfg)
    return BoundedApiClient(cfg)


class Kube:
    """Reads and writes TuningRuns, TuningTrials, PyTorchJobs and ConfigMaps."""

    def __init__(self, api: client.ApiClient | None = None) -> None:
        self.api = api or api_client()
        self.custom = client.CustomObjectsApi(self.api)
        self.core = client.CoreV1Api(self.api)

    # authorization
    def may(self, userinfo: dict[str, Any], namespace: str, verb: str, group: str, resource: str) -> tuple[bool, str]:
        """Whether the user an admission request names may ``verb`` ``resource`` in ``namespace`` (a
        SubjectAccessReview: the API server's own authorizers judge, RBAC or whatever the cluster runs), and why."""
        info = userinfo or {}
        review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                  "spec": {"user": info.get("username"), "groups": info.get("groups"), "uid": info.get("uid"),
                           "extra": info.get("extra"),
                           "resourceAttributes": {"namespace": namespace, "verb": verb, "group": group,
                                                  "resource": resource}}}
        answer = client.AuthorizationV1Api(self.api).create_subject_access_review(review)
        status = answer.status
        return bool(status and status.allowed), str((status and (status.reason or status.evaluation_error)) or "")

    def may_self(self, namespace: str, verb: str, group: str, resource: str) -> tuple[bool, str]:
        """Whether the operator itself may ``verb`` ``resource`` in ``namespace`` (a SelfSubjectAccessReview, which
        every authenticated user may ask), and why."""
        review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                  "spec": {"resourceAttributes": {"namespace": namespace, "verb": verb, "group": group,
                                                  "resource": resource}}}
        status = client.AuthorizationV1Api(self.api).create_self_subject_access_review(review).status
        return bool(status and status.allowed), str((status and (status.reason or status.evaluation_error)) or "")

    # runs and trials
    def get_run(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, RUN_PLURAL, name)
        except ApiException as err:
            if err.status == 404:
                return None
            raise

    def delete_run(self, namespace: str, name: str) -> None:
        """Delete a run (spec.ttlSecondsAfterFinished): its dependents go through the garbage collector."""
        self._delete(GROUP, VERSION, RUN_PLURAL, namespace, name)

    def list_trials(self, namespace: str, run: str, include_deleting: bool = False) -> list[dict[str, Any]]:
        """The TuningTrials naming ``run``; those being deleted only with ``include_deleting`` (the reconciler needs
        them: an earlier run's trial lingering in deletion still holds its name)."""
        items = self.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, TRIAL_PLURAL,
                                                          label_selector=f"{LABEL_RUN}={label_value(run)}")["items"]
        # filter again: a selector-ignoring API server must not mix runs
        return [t for t in items if (t.get("spec") or {}).get("runRef") == run and
                (include_deleting or not (t.get("metadata") or {}).get("deletionTimestamp"))]

    def create_trial(self, trial: dict[str, Any]) -> dict[str, Any]:
        ns, name = trial["metadata"]["namespace"], trial["metadata"]["name"]
        try:
            return self.custom.create_namespaced_custom_object(GROUP, VERSION, ns, TRIAL_PLURAL, trial)
        except ApiException as err:
            if err.status == 409:  # the one of that name (listed: the operator has no get on trials)
                items = self.custom.list_namespaced_custom_object(GROUP, VERSION, ns, TRIAL_PLURAL)["items"]
                found = next((t for t in items if (t.get("metadata") or {}).get("name") == name), None)
                if found is None:
                    raise
                return found
            if err.status is not None and 400 <= err.status < 500 and err.status != 429:
                reason, message = api_message(err)  # a webhook's 422, a quota's 403, an invalid object
                raise ApiRefusal(err.status, reason, message) from None
            raise

    def patch_trial_status(self, namespace: str, name: str, status: dict[str, Any]) -> str | None:
        """Merge-patch the trial's status; its new resourceVersion."""
        obj = self.custom.patch_namespaced_custom_object_status(GROUP, VERSION, namespace, TRIAL_PLURAL, name,
                                                                {"status": status})
        return ((obj or {}).get("metadata") or {}).get("resourceVersion")

    def record_trial_status(self, namespace: str, name: str, status: dict[str, Any], version: str) -> bool:
        """Write ``status`` onto the trial only if it is still at ``version``: a JSON patch whose first operation tests
        the resourceVersion, so the API applies all of it or none (False: someone wrote it meanwhile)."""
        ops: list[dict[str, Any]] = [{"op": "test", "path": "/metadata/resourceVersion", "value": version}]
        ops += [{"op": "add", "path": "/status/" + k.replace("~", "~0").replace("/", "~1"), "value": v}
                for k, v in status.items() if v is not None]
        try:
            # named: the client sends any body as a merge patch unless told (a real API server then refuses the
            # list: "cannot unmarshal array into Go value of type map[string]interface {}")
            self.custom.patch_namespaced_custom_object_status(GROUP, VERSION, namespace, TRIAL_PLURAL, name, ops,
                                                              _content_type="application/json-patch+json")
        except ApiException as err:
            if err.status in (409, 422):
                return False
            raise
        return True

    # jobs (of either backend)
    def served(self, api_version: str, plural: str) -> bool:
        """Whether API discovery lists ``plural`` under ``api_version`` (the CRD is installed and served); a 404 of the
        group/version is "not served", any other failure (503 of an aggregated API, 429, 500) is
        :class:`DiscoveryUnavailable`, which a run waits out."""
        try:
            if "/" in api_version:
                group, version = api_version.split("/", 1)
                data = self.custom.get_api_resources(group, version)
            else:
                data = self.core.get_api_resources()
        except ApiException as err:
            if err.status == 404:  # the group/version is not registered: not installed
                return False
            reason, message = api_message(err)
            raise DiscoveryUnavailable(f"{err.status} {reason}: {message}".strip()) from None
        return any(r.name == plural for r in (data.resources if data is not None else None) or [])

    def get_job(self, namespace: str, name: str, kind: str = "PyTorchJob") -> dict[str, Any] | None:
        b = _backend(kind)
        try:
            job = self.custom.get_namespaced_custom_object(b.group, b.version, namespace, b.plural, name)
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        return None if (job.get("metadata") or {}).get("deletionTimestamp") else job

    def create_job(self, job: dict[str, Any]) -> dict[str, Any] | None:
        """Create ``job``: ``None`` when created, the existing job on 409 (whose owner the caller checks); a
        permanent refusal (another 4xx) raises :class:`ApiRefusal`."""
        b = _backend(job.get("kind") or "PyTorchJob")
        ns = job["metadata"]["namespace"]
        try:
            self.custom.create_namespaced_custom_object(b.group, b.version, ns, b.plural, job)
            return None
        except ApiException as err:
            if err.status == 409:
                existing = self.get_job(ns, job["metadata"]["name"], b.kind)
                if existing is not None:
                    return existing
                raise
            if err.status is not None and 400 <= err.status < 500 and err.status != 429:
                reason, message = api_message(err)
                raise ApiRefusal(err.status, reason, message) from None
            raise

    def delete_job(self, namespace: str, name: str, kind: str = "PyTorchJob") -> None:
        b = _backend(kind)
        self._delete(b.group, b.version, b.plural, namespace, name)

    def _delete(self, group: str, version: str, plural: str, namespace: str, name: str) -> None:
        try:
            self.custom.delete_namespaced_custom_object(group, version, namespace, plural, name,
                                                        propagation_policy="Background")
        except ApiException as err:
            if err.status != 404:
                raise

    # pods of trials measured from their logs
    def list_pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        """The pods matching ``label_selector``, as plain mappings; :class:`LogsUnavailable` when refused."""
        try:
            pods = self.core.list_namespaced_pod(namespace, label_selector=label_selector)
        except ApiException as err:
            raise _logs_unavailable(err, f"cannot list the pods of {namespace} ({label_selector})") from None
        return [self.api.sanitize_for_serialization(p) for p in pods.items or []]

    def job_warnings(self, namespace: str, kind: str, name: str) -> list[dict[str, Any]]:
        """The Warning events recorded against job ``name`` of ``kind``, oldest first, as ``reason``, ``message``
        and ``time`` (the event's last time); :class:`LogsUnavailable` when refused."""
        selector = f"involvedObject.kind={kind},involvedObject.name={name},type=Warning"
        try:
            events = self.core.list_namespaced_event(namespace, field_selector=selector)
        except ApiException as err:
            raise _logs_unavailable(err, f"cannot list the events of {kind} {namespace}/{name}") from None
        out = []
        for e in events.items or []:
            when = e.last_timestamp or e.event_time or e.first_timestamp or e.metadata.creation_timestamp
            out.append({"reason": e.reason or "", "message": e.message or "",
                        "time": when.timestamp() if when is not None else 0.0})
        return sorted(out, key=lambda e: e["time"])

    def workload_admission(self, namespace: str, job_uid: str) -> dict[str, Any] | None:
        """Kueue's word on the job whose uid is ``job_uid``: its Workload's ``QuotaReserved`` condition (status,
        reason, message: "LocalQueue q doesn't exist", or why quota is not assigned yet), or None when there is no
        such Workload, Kueue's API is not served or may not be read (the generic wait then)."""
        try:
            items = self.custom.list_namespaced_custom_object(
                KUEUE_GROUP, KUEUE_VERSION, namespace, "workloads",
                label_selector=f"{KUEUE_JOB_UID_LABEL}={job_uid}")["items"]
        except ApiException as err:
            if err.status in (403, 404):
                return None
            raise
        for w in items:
            for c in (w.get("status") or {}).get("conditions") or []:
                if c.get("type") == "QuotaReserved":
                    return {k: str(c.get(k) or "") for k in ("status", "reason", "message")}
        return None

    def ledger(self, namespace: str) -> dict[str, str]:
        """The data of the accelerator-hours ledger (:data:`attune.operator.quota.LEDGER`) in ``namespace`` (the
        operator's own); empty before the first trial is counted."""
        from attune.operator.quota import LEDGER

        try:
            return dict(self.core.read_namespaced_config_map(LEDGER, namespace).data or {})
        except ApiException as err:
            if err.status == 404:
                return {}
            raise

    def ledger_add(self, namespace: str, tenant: str, hours: float, counted_as: str, period: Any,
                   now: float) -> None:
        """Count ``hours`` spent by ``tenant`` in the ledger of ``namespace``, once per ``counted_as`` (a replace
        carrying the version read: two writers never lose each other's hours)."""
        from attune.operator import quota

        for _ in range(8):
            try:
                cm = self.core.read_namespaced_config_map(quota.LEDGER, namespace)
            except ApiException as err:
                if err.status != 404:
                    raise
                cm = None
            data = dict((cm.data if cm is not None else None) or {})
            entry = quota.add(quota.entry_of(data, tenant), hours, counted_as, period, now)
            if entry is None:
                return
            data[tenant] = json.dumps(entry, sort_keys=True)
            try:
                if cm is None:
                    self.core.create_namespaced_config_map(namespace, {
                        "metadata": {"name": quota.LEDGER, "labels": {"app.kubernetes.io/managed-by": "attune"}},
                        "data": data})
                else:
                    cm.data = data
                    self.core.replace_namespaced_config_map(quota.LEDGER, namespace, cm)
                return
            except ApiException as err:
                if err.status != 409:  # 409: written meanwhile (or created): read again
                    raise
        raise RuntimeError(f"ConfigMap {namespace}/{quota.LEDGER} kept changing while it was written")

    def read_pod_log(self, namespace: str, pod: str, container: str) -> str:
        """The log of ``container`` in ``pod``, each line prefixed with the kubelet's RFC 3339 timestamp."""
        try:
            # raw bytes: the client would otherwise try to deserialize a log that happens to look like JSON
            resp = self.core.read_namespaced_pod_log(pod, namespace, container=container, timestamps=True,
                                                     limit_bytes=LOG_LIMIT_BYTES, _preload_content=False)
        except ApiException as err:
            raise _logs_unavailable(err, f"cannot read the log of {namespace}/{pod} container {container}") from None
        return resp.data.decode("utf-8", errors="replace")

    def read_configmap(self, namespace: str, name: str, key: str) -> str:
        try:
            cm = self.core.read_namespaced_config_map(name, namespace)
        except ApiException as err:
            if err.status == 404:
                raise LookupError(f"ConfigMap {namespace}/{name} not found") from None
            raise
        data = cm.data or {}
        if key not in data:
            raise LookupError(f"ConfigMap {namespace}/{name} has no key {key!r}")
        return data[key]

    def read_secret(self, namespace: str, name: str, key: str) -> str:
        try:
            secret = self.core.read_namespaced_secret(name, namespace)
        except ApiException as err:
            if err.status in (403, 404):
                raise LookupError(f"Secret {namespace}/{name} {'not found' if err.status == 404 else 'forbidden'}") \
                    from None
            raise
        data = secret.data or {}
        if key not in data:
            raise LookupError(f"Secret {namespace}/{name} has no key {key!r}")
        return base64.b64decode(data[key]).decode("utf-8")

    def write_configmap(self, cm: dict[str, Any]) -> None:
        """Create ``cm``, or merge-patch its data and labels where it exists."""
        ns, name = cm["metadata"]["namespace"], cm["metadata"]["name"]
        try:
            self.core.create_namespaced_config_map(ns, cm)
        except ApiException as err:
            if err.status != 409:
                raise
            self.core.patch_namespaced_config_map(name, ns, {"metadata": {"labels": cm["metadata"].get("labels")},
                                                             "data": cm["data"]})

    def write_output_configmap(self, cm: dict[str, Any]) -> Any:
        """Create ``cm`` (an output object of a run, see :mod:`attune.operator.results`), or replace the existing
        one of that name only when it is attune's output of the same run (optimistic concurrency: the replace
        carries the resourceVersion read); a foreign one is never written. Returns the
        :class:`~attune.operator.results.WriteDecision` (``foreign``: nothing was written, ``message`` says why)."""
        from attune.operator.results import write_decision

        ns, name = cm["metadata"]["namespace"], cm["metadata"]["name"]
        for _ in range(5):
            try:
                existing = self.api.sanitize_for_serialization(self.core.read_namespaced_config_map(name, ns))
            except ApiException as err:
                if err.status != 404:
                    raise
                existing = None
            decision = write_decision(existing, cm)
            try:
                if decision.action == "create":
                    self.core.create_namespaced_config_map(ns, cm)
                elif decision.action == "replace":  # a patch carrying the version read: 409 if it moved since
                    version = (existing or {}).get("metadata", {}).get("resourceVersion")
                    body = {"metadata": {k: v for k, v in cm["metadata"].items() if k in ("labels", "annotations")},
                            "data": {**dict.fromkeys((existing or {}).get("data") or {}), **cm["data"]}}
                    if version:
                        body["metadata"]["resourceVersion"] = version
                    self.core.patch_namespaced_config_map(name, ns, body)
                return decision
            except ApiException as err:
                if err.status != 409:  # 409: created or changed meanwhile; read again and decide again
                    raise
        raise RuntimeError(f"ConfigMap {ns}/{name} kept changing while it was written")


def _logs_unavailable(err: ApiException, what: str) -> LogsUnavailable:
    """An API error of a pod or log read as a condition reason and message (the API's Status message if any)."""
    reason = {400: "BadRequest", 401: "Unauthorized", 403: "Forbidden", 404: "NotFound"}.get(err.status or 0, "APIError")
    body = err.body.decode("utf-8", errors="replace") if isinstance(err.body, bytes) else str(err.body or "")
    try:
        detail = str(json.loads(body).get("message") or body)
    except (ValueError, AttributeError):
        detail = body or str(err.reason or "")
    return LogsUnavailable(reason, f"{what}: {err.status} {detail.strip()[:300]}".strip())


#: Kueue's Workload API (v1beta2: Kueue 0.15 and later) and the label it puts on a job's Workload
KUEUE_GROUP, KUEUE_VERSION, KUEUE_JOB_UID_LABEL = "kueue.x-k8s.io", "v1beta2", "kueue.x-k8s.io/job-uid"


class KubePorts:
    """The reconciler's ports over the real API, Prometheus and the agent sidecar."""

    def __init__(self, kube: Kube, hours_left: Callable[[str], Any] | None = None) -> None:
        self.kube = kube
        self.hours_left = hours_left or (lambda namespace: None)  # a quota.Left, or None: no quota
        self.read_configmap = kube.read_configmap
        self.read_secret = kube.read_secret
        self.served = kube.served
        self.write_configmap = kube.write_configmap
        self.write_output_configmap = kube.write_output_configmap
        self.list_trials = functools.partial(kube.list_trials, include_deleting=True)
        self.create_trial = kube.create_trial
        self.patch_trial_status = kube.patch_trial_status
        self.record_trial_status = kube.record_trial_status
        self.get_job = kube.get_job
        self.create_job = kube.create_job
        self.delete_job = kube.delete_job
        self.list_pods = kube.list_pods
        self.job_warnings = kube.job_warnings
        self.workload_admission = kube.workload_admission
        self.read_pod_log = kube.read_pod_log

    def now(self) -> float:
        return time.time()

    def measure(self, m: MetricsSpec, namespace: str, job: str, start: float, end: float, *,
                tokens_per_step: int, devices: int, access: metrics.Access | None = None,
                pod_regex: str | None = None) -> Measurement | None:
        from attune.operator.urls import credentials_problem, url_problem

        problem = url_problem(m.prometheus_url, "spec.metrics.prometheusUrl", namespace)
        if problem is None and access is not None and (access.bearer_token or access.basic_auth):
            problem = credentials_problem(m.prometheus_url, "spec.metrics.prometheusUrl")
        if problem or not m.prometheus_url:
            raise metrics.MetricsUnavailable(problem or "spec.metrics.prometheusUrl is not set")
        prom = metrics.PrometheusClient(m.prometheus_url, m.timeout_seconds, access)
        return metrics.measure_trial(prom, m, namespace, job, start, end, tokens_per_step=tokens_per_step,
                                     devices=devices, pod_regex=pod_regex)

    def propose(self, state: RunState, agent: AgentSpec, namespace: str | None = None) -> agent_client.Proposal:
        """The agent's proposal, steered by the lessons of the run's namespace (its ``attune-lessons`` ConfigMap,
        where lessons steer): the sidecar holds no tenant's lessons, and every replica reads the same ones."""
        from attune.agent.lessons import lessons_steer

        lessons = None
        if namespace and lessons_steer():
            from attune.operator.lessons import LESSONS_CONFIGMAP, store_from_data

            try:
                data = self.kube.core.read_namespaced_config_map(LESSONS_CONFIGMAP, namespace).data
            except ApiException as err:
                if err.status not in (403, 404):
                    raise
                data = None
            lessons = store_from_data(data)
        return agent_client.propose(state, agent, lessons, namespace)
