"""The kopf handlers: thin adapters from kopf's events to :func:`reconcile.reconcile` and the webhook checks."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import kopf

from attune.operator import identity, preflight, quota, telemetry, webhook
from attune.operator import reconcile as rc
from attune.operator.kube import REQUEST_TIMEOUT_S, Kube, KubePorts, describe_error, retry_after
from attune.operator.outcomes import HOLDS
from attune.operator.resources import (
    FINALIZER,
    GROUP,
    RUN_PLURAL,
    TRIAL_PLURAL,
    VERSION,
)

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class Options:
    """How the operator runs (from ``attune operator run``)."""

    interval_s: float = 10.0
    metrics_port: int | None = 8080
    webhook_port: int | None = None
    webhook_addr: str = "0.0.0.0"
    webhook_cert: str | None = None
    webhook_key: str | None = None
    webhook_host: str | None = None
    allowed_hosts: tuple[str, ...] = ()
    insecure_credentials: bool = False
    trial_writers: tuple[str, ...] = ()  # users who may write TuningTrials (empty: the operator's own account)
    prometheus_orgs: tuple[str, ...] = ()  # NAMESPACE=ORG: the X-Scope-OrgID of each namespace's runs (orgs.py)
    hours_quotas: tuple[str, ...] = ()  # NAMESPACE=HOURS/PERIOD: the platform's accelerator-hours quotas (quota.py)
    ledger_namespace: str | None = None  # where the ledger of hours spent lives (the operator's own namespace)
    step_workers: int = 8  # threads running reconcile steps (they may wait on a run's endpoints)
    steps_per_namespace: int = 2  # of which one namespace may hold at most this many at once
    startup: preflight.StartupPlan | None = None  # start-up checks: CRD revision, peering object, webhook certs


class Pools:
    """Separate threads for reconcile steps and for admission checks, and a per-namespace share of the steps' threads:
    a tenant whose Prometheus or agent hangs holds at most ``per_namespace`` of them, never the webhook's."""

    def __init__(self, step_workers: int, per_namespace: int) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self.steps = ThreadPoolExecutor(max(step_workers, 1), thread_name_prefix="attune-step")
        self.admission = ThreadPoolExecutor(4, thread_name_prefix="attune-admission")
        self.per_namespace = max(min(per_namespace, step_workers), 1)
        self._limits: dict[str, asyncio.Semaphore] = {}

    async def step(self, namespace: str, fn: Callable[..., T], *args: Any) -> T:
        limit = self._limits.setdefault(namespace, asyncio.Semaphore(self.per_namespace))
        async with limit:
            return await asyncio.get_running_loop().run_in_executor(self.steps, functools.partial(fn, *args))

    async def admit(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.admission, functools.partial(fn, *args))


def build_registry(opts: Options) -> kopf.OperatorRegistry:
    """A registry holding every handler of the operator, configured by ``opts``."""
    registry = kopf.OperatorRegistry()
    state: dict[str, Any] = {}
    gone: dict[str, float] = {}  # uids of deleted runs whose timers may still run (monotonic time of the deletion)
    pools = Pools(opts.step_workers, opts.steps_per_namespace)

    def kube() -> Kube:
        if "kube" not in state:
            state["kube"] = Kube()
        return state["kube"]

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        from attune.operator import orgs, urls

        urls.configure(opts.allowed_hosts, opts.insecure_credentials)
        orgs.configure(opts.prometheus_orgs)
        preflight.run(opts.startup)  # before the webhook server reads its certificate files
        settings.persistence.finalizer = FINALIZER
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
            prefix=GROUP, key="last-handled-configuration")
        settings.scanning.disabled = True
        settings.posting.level = logging.INFO
        settings.watching.server_timeout = 120
        settings.watching.client_timeout = 150
        settings.networking.request_timeout = REQUEST_TIMEOUT_S[1]  # as the operator's own requests
        if opts.webhook_port is not None:
            settings.admission.server = kopf.WebhookServer(
                addr=opts.webhook_addr, port=opts.webhook_port, host=opts.webhook_host,
                certfile=opts.webhook_cert, pkeyfile=opts.webhook_key, insecure=opts.webhook_cert is None)
        if opts.metrics_port is not None:
            telemetry.serve(opts.metrics_port)

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        import os

        if os.environ.get("KUBECONFIG"):
            return kopf.login_with_kubeconfig(**kwargs)
        return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)

    quotas = quota.parse(opts.hours_quotas)
    unledgered = quota.Unledgered()

    def hours_left(namespace: str) -> quota.Left | None:
        """What ``namespace`` has left of the platform's quota this period (None: no quota there)."""
        q = quota.quota_for(quotas, namespace)
        if q is None or opts.ledger_namespace is None:
            return None
        return quota.left(q, quota.entry_of(kube().ledger(opts.ledger_namespace), namespace), time.time())

    def reconcile_now(body: kopf.Body, namespace: str, name: str) -> rc.Result | object | None:
        # the run as the API has it now: kopf's body can lag its own last status patch, and a step decided on a
        # stale status would write back conditions and summaries the previous step had replaced
        run = kube().get_run(namespace, name)
        if run is None:
            return GONE  # deleted: never reconcile kopf's last copy of it (that would start its trials again)
        if (run.get("metadata") or {}).get("deletionTimestamp"):
            return None
        result = rc.reconcile(run, KubePorts(kube(), hours_left))  # effects applied; the status patch is ours
        q = quota.quota_for(quotas, namespace)
        if q is not None and opts.ledger_namespace is not None:  # the records are written: count their hours
            ledger_ns, period = opts.ledger_namespace, q.period
            err = unledgered.settle(
                namespace, [(f"{run['metadata'].get('uid')}/{rec.id}", rec.charged_hours)
                            for rec in result.trials_recorded],
                lambda key, hours: kube().ledger_add(ledger_ns, namespace, hours, key, period, time.time()))
            if err is not None:
                telemetry.ERRORS.inc()
                log.warning("accelerator-hours ledger of %s: not written, tried again at the next step: %s", namespace,
                            describe_error(err))
        return result

    @kopf.on.event(GROUP, VERSION, RUN_PLURAL, registry=registry)
    def noticed(type: str, body: kopf.Body, namespace: str | None, name: str, **_: Any) -> None:
        if type == "DELETED":  # the run is gone (its RBAC may be too, in a namespace being deleted): its timer stops
            _forget(gone, str(body.metadata.uid), namespace or "", name)

    @kopf.timer(GROUP, VERSION, RUN_PLURAL, interval=opts.interval_s, when=_stepping,  # type: ignore[arg-type]
                registry=registry)  # (kopf's keywords; namespaced)
    async def step(body: kopf.Body, patch: kopf.Patch, namespace: str, name: str, **_: Any) -> None:
        uid = str(body.metadata.uid)
        if uid in gone:
            await _stop_timer(gone, uid, namespace, name)
        try:
            # a step may wait on the run's own endpoints (Prometheus, the agent): it runs on the steps' own threads,
            # at most a few of a namespace at once, so one tenant's slow endpoints never hold another's steps or the
            # admission webhook (which has threads of its own)
            with telemetry.RECONCILE.time():
                result = await pools.step(namespace, reconcile_now, body, namespace, name)
        except Exception as err:
            telemetry.ERRORS.inc()
            # a throttled request (429 Retry-After) is tried again no sooner than the API server asked
            delay = max(opts.interval_s, retry_after(err) or 0.0)
            raise kopf.TemporaryError(f"reconcile failed: {describe_error(err)}", delay=delay) from err
        if result is GONE:
            await _stop_timer(gone, uid, namespace, name)
        if not isinstance(result, rc.Result):
            return
        patch.setdefault("status", {}).update(result.status)
        for kind, reason, message in result.events:
            kopf.event(body, type=kind, reason=reason, message=message[:1000])
        for rec in result.trials_recorded:
            telemetry.observe_trial(namespace, rec)
        best = result.status.get("best") or {}
        held = {c.get("type"): c.get("reason") for c in result.status.get("conditions") or []
                if c.get("status") == "True"}
        waiting = held.get("Reconciling") if held.get("Reconciling") in HOLDS else None
        telemetry.observe_run(namespace, name, result.status.get("phase"), best.get("speedup"), held.get("Stalled"),
                              waiting)
        if result.permanent:  # a configuration error: the run is Failed (patched above); say so to kopf too
            raise kopf.PermanentError(result.permanent)

    @kopf.timer(GROUP, VERSION, RUN_PLURAL, interval=opts.interval_s, when=_expiring,  # type: ignore[arg-type]
                registry=registry)  # (kopf's keywords; namespaced)
    async def expire(body: kopf.Body, namespace: str, name: str, **_: Any) -> None:
        """spec.ttlSecondsAfterFinished: delete a finished run once its time is up (read from the watched copy: no
        request until then)."""
        due = finished_due(dict(body), time.time())
        if due is None or due > 0:
            return
        await pools.admit(kube().delete_run, namespace, name)
        log.info("run %s/%s deleted: its spec.ttlSecondsAfterFinished (%ss) after it finished is up", namespace,
                 name, body.get("spec", {}).get("ttlSecondsAfterFinished"))
        # this timer's work is done: kopf would go on calling it until the watch drops the run (a DELETE a tick,
        # seen on the real API server: 70 in 35 s)
        await _end_this_timer()

    # no deletion handler: a run has no finalizer (see _without_finalizer), so kopf never calls one; its trials, jobs
    # and pods are its dependents, which the garbage collector removes (background and foreground deletion alike:
    # tests/k8s/test_real_lifecycle.py), and its reconcile timer ends itself (_stop_timer)

    def writers() -> tuple[str, ...]:
        """The users who may write trials and runs' status: read once (the operator's own account, its token, or
        --trial-writer)."""
        if "writers" not in state:
            state["writers"] = identity.own_users(opts.trial_writers)
        return tuple(state["writers"])

    @kopf.on.validate(GROUP, VERSION, TRIAL_PLURAL, operations=["CREATE", "UPDATE"],  # type: ignore[arg-type]
                      subresource="*", id="validate-trial", registry=registry)  # (kopf's keywords, namespaced)
    async def admit_trial(body: kopf.Body, old: Any, namespace: str, operation: str, subresource: str | None,
                          userinfo: dict[str, Any], **_: Any) -> None:
        problem = webhook.trial_writer_problem(writers(), userinfo, operation, subresource,
                                               dict(old) if old else None, dict(body))
        if problem:
            telemetry.DENIALS.labels("validate-trial").inc()
            raise kopf.AdmissionError(problem, code=403)
        if operation != "CREATE" or subresource:
            return

        def check() -> list[str]:
            run_name = (body.get("spec") or {}).get("runRef", "")
            run = kube().get_run(namespace, run_name)
            trials = kube().list_trials(namespace, run_name) if run is not None else []
            return webhook.trial_problems(run, dict(body), kube().read_configmap, trials)

        problems = await pools.admit(check)
        if problems:
            telemetry.DENIALS.labels("validate-trial").inc()
            raise kopf.AdmissionError("refused by the attune gate: " + "; ".join(problems), code=422)

    @kopf.on.validate(GROUP, VERSION, RUN_PLURAL, operations=["CREATE", "UPDATE"],  # type: ignore[arg-type]
                      subresource="*", id="validate-run", registry=registry)  # (the same: kopf's keywords)
    async def admit_run(body: kopf.Body, old: Any, namespace: str, subresource: str | None,
                        userinfo: dict[str, Any], **_: Any) -> None:
        if subresource == "status":
            problem = webhook.run_status_writer_problem(writers(), userinfo, dict(old) if old else None,
                                                        dict(body))
            if problem:
                telemetry.DENIALS.labels("validate-run").inc()
                raise kopf.AdmissionError(problem, code=403)
            return
        if subresource:
            return
        # an update is judged on its spec alone (never a ConfigMap): finalizer removal cannot be refused
        problems = await pools.admit(webhook.run_problems, dict(body), dict(old) if old else None,
                                     None if old else kube().read_configmap)
        if not problems and quota.quota_for(quotas, namespace) is not None:
            try:
                room = await pools.admit(hours_left, namespace)
            except Exception as err:  # fail closed, as for the permission checks below
                raise kopf.AdmissionError(f"could not read the accelerator-hours ledger: {describe_error(err)}",
                                          code=503) from None
            problem = quota.admission_problem(namespace, webhook.budget_hours(dict(body)),
                                              webhook.budget_hours(dict(old)) if old else None, room)
            problems = [problem] if problem else []
        if problems:
            telemetry.DENIALS.labels("validate-run").inc()
            raise kopf.AdmissionError("; ".join(problems), code=422)
        backend = webhook.job_kind_to_check(dict(body), dict(old) if old else None)
        if backend is None:
            return
        try:  # fail closed: the API server is asked again on the next attempt
            # the operator does a run's work only in its tenant namespaces (a cluster-wide install binds it per
            # namespace): a run elsewhere would only fail later
            tenant, _why = await pools.admit(kube().may_self, namespace, "create", GROUP, TRIAL_PLURAL)
            # no confused deputy: the writer may create the jobs the operator will create for them
            allowed, reason = await pools.admit(kube().may, userinfo, namespace, "create", backend.group,
                                                backend.plural)
        except Exception as err:
            raise kopf.AdmissionError(f"could not check the run's permissions: {describe_error(err)}",
                                      code=503) from None
        problem = webhook.tenant_problem(namespace, tenant) or \
            webhook.job_permission_problem(userinfo, namespace, backend, allowed, reason)
        if problem:
            telemetry.DENIALS.labels("validate-run").inc()
            raise kopf.AdmissionError(problem, code=403)

    _without_finalizer(registry)
    return registry


def _finished(status: Any) -> bool:
    return (status or {}).get("phase") in rc.TERMINAL


def _stepping(body: kopf.Body, status: Any, **_: Any) -> bool:
    """Whether a run's reconcile timer runs: not for a finished run whose status already observes its spec (kopf
    checks this on each watch event, without a request: an edit after the end starts the timer for the step that
    observes it, then it stops again). Finished runs used to be fetched every interval for ever."""
    if not _finished(status):
        return True
    generation = (body.get("metadata") or {}).get("generation")
    return generation is None or (status or {}).get("observedGeneration") != generation


def _expiring(spec: Any, status: Any, **_: Any) -> bool:
    return _finished(status) and (spec or {}).get("ttlSecondsAfterFinished") is not None


def finished_due(run: dict[str, Any], now: float) -> float | None:
    """Seconds until a finished run with ``spec.ttlSecondsAfterFinished`` is due for deletion (<= 0: due); ``None``
    when it has no TTL or is not finished (its status's completionTime is when it finished)."""
    from attune.operator.backends import rfc3339_time

    ttl = (run.get("spec") or {}).get("ttlSecondsAfterFinished")
    status = run.get("status") or {}
    if ttl is None or not _finished(status) or not status.get("completionTime"):
        return None
    done = rfc3339_time(status["completionTime"])
    if done is None:
        return 0.0  # an unreadable time: due (the run is finished either way)
    return done + float(ttl) - now


#: what a step returns for a run that no longer exists
GONE = object()


def _forget(gone: dict[str, float], uid: str, namespace: str, name: str) -> None:
    """The run is gone: drop its metrics and mark its timer to stop. Once in deletion (a foreground deletion keeps the
    run while the collector deletes its dependents) kopf stops the timer itself, which then never comes to read the
    mark: marks older than an hour are dropped."""
    now = time.monotonic()
    for old in [u for u, t in gone.items() if now - t > 3600]:
        del gone[old]
    if uid not in gone:
        gone[uid] = now
        telemetry.forget_run(namespace, name)
        log.info("run %s/%s is gone: its reconcile timer stops", namespace, name)


async def _stop_timer(gone: dict[str, float], uid: str, namespace: str, name: str) -> None:
    """End the calling timer for good: the run is gone. kopf stops a timer before its object goes only through a
    finalizer, which runs do not have (see :func:`_without_finalizer`), or once the object is in deletion; else the
    timer ends itself: its own task is cancelled, which kopf takes as the timer's end."""
    _forget(gone, uid, namespace, name)
    gone.pop(uid, None)
    await _end_this_timer()


async def _end_this_timer() -> None:
    """Cancel the calling timer's own task, which kopf takes as the timer's end."""
    task = asyncio.current_task()
    if task is not None:
        task.cancel()
    await asyncio.sleep(0)  # the cancellation is raised here


def _without_finalizer(registry: kopf.OperatorRegistry) -> None:
    """No finalizer on runs. A run's trials and jobs are its dependents (ownerReferences), which the garbage collector
    removes by itself, so a finalizer added nothing but a deadlock: a namespaced install's Role and RoleBinding live in
    the tenant's namespace, and deleting that namespace took away the operator's permission to remove the finalizer
    before the run went, so the namespace never went (shown on a real API server: tests/k8s/test_real_lifecycle.py).
    kopf puts a finalizer on every object with a timer, to stop the timer before the object goes; without one it
    stops it when the object is gone. Runs that carry the finalizer from an earlier version lose it on their next
    event (kopf removes a finalizer no handler requires)."""
    import dataclasses

    spawning = registry._spawning  # kopf 1.x keeps no public switch for this
    spawning._handlers[:] = [dataclasses.replace(h, requires_finalizer=False) for h in spawning._handlers]
