"""The operator's own Prometheus metrics: runs by namespace and phase, stalled runs, trials and accelerator-hours by
namespace (chargeback), best speedup, reconcile errors and durations, the latency of the endpoints it calls
(Prometheus, the agent), and admission denials. The chart's PrometheusRule alerts on them."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from attune.trial import TrialRecord

REGISTRY = CollectorRegistry()
RUNS = Gauge("attune_operator_runs", "TuningRuns by namespace and phase", ["namespace", "phase"], registry=REGISTRY)
STALLED = Gauge("attune_operator_run_stalled", "1 while a run's Stalled condition is True (it cannot go on without a "
                "change), by its reason", ["namespace", "run", "reason"], registry=REGISTRY)
WAITING = Gauge("attune_operator_run_waiting", "1 while a run waits on what clears by itself (Reconciling=True with "
                "a hold's reason: Prometheus unreachable, a discovery 503, a quota), by that reason",
                ["namespace", "run", "reason"], registry=REGISTRY)
TRIALS = Counter("attune_operator_trials", "finished trials by namespace, kind and outcome",
                 ["namespace", "kind", "outcome"], registry=REGISTRY)
HOURS = Counter("attune_operator_accelerator_hours_charged", "accelerator-hours charged to trials, by namespace",
                ["namespace"], registry=REGISTRY)
SPEEDUP = Gauge("attune_operator_best_speedup", "best throughput over baseline throughput", ["namespace", "run"],
                registry=REGISTRY)
ERRORS = Counter("attune_operator_reconcile_errors", "reconcile steps that raised", registry=REGISTRY)
RECONCILE = Histogram("attune_operator_reconcile_duration_seconds", "one reconcile step of a run, its requests and "
                      "the endpoints it waits on included", registry=REGISTRY,
                      buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120))
ENDPOINT = Histogram("attune_operator_endpoint_request_duration_seconds", "requests to a run's endpoints, by "
                     "endpoint (prometheus, agent) and outcome (ok, error)", ["endpoint", "outcome"],
                     registry=REGISTRY, buckets=(0.005, 0.025, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
DENIALS = Counter("attune_operator_webhook_denials", "admission requests the webhook refused, by webhook",
                  ["webhook"], registry=REGISTRY)

_phases: dict[tuple[str, str], str] = {}
_stalled: dict[tuple[str, str], str] = {}
_waiting: dict[tuple[str, str], str] = {}
PHASES = ("Pending", "Baseline", "Tuning", "Suspended", "Succeeded", "Failed")


def observe_run(namespace: str, name: str, phase: str | None, speedup: float | None,
                stalled: str | None = None, waiting: str | None = None) -> None:
    """Record the latest phase, best speedup, Stalled reason (None: not stalled) and the reason of a hold that
    clears by itself (None: not waiting) of a run."""
    if phase:
        _phases[(namespace, name)] = phase
    if speedup is not None:
        SPEEDUP.labels(namespace, name).set(speedup)
    _set_reason(STALLED, _stalled, namespace, name, stalled)
    _set_reason(WAITING, _waiting, namespace, name, waiting)
    _publish()


def _set_reason(gauge: Gauge, held: dict[tuple[str, str], str], namespace: str, name: str,
                reason: str | None) -> None:
    """``gauge`` at 1 for the run's current ``reason`` only (its series for an earlier reason removed)."""
    old = held.pop((namespace, name), None)
    if old is not None and old != reason:
        gauge.remove(namespace, name, old)
    if reason:
        held[(namespace, name)] = reason
        gauge.labels(namespace, name, reason).set(1)


def forget_run(namespace: str, name: str) -> None:
    _phases.pop((namespace, name), None)
    _set_reason(STALLED, _stalled, namespace, name, None)
    _set_reason(WAITING, _waiting, namespace, name, None)
    try:
        SPEEDUP.remove(namespace, name)
    except KeyError:
        pass
    _publish()


def _publish() -> None:
    counts: dict[tuple[str, str], int] = {}
    for (namespace, _), phase in _phases.items():
        counts[(namespace, phase)] = counts.get((namespace, phase), 0) + 1
    for namespace in {ns for ns, _ in _phases} | {ns for ns, _ in counts}:
        for phase in PHASES:
            counts.setdefault((namespace, phase), 0)
    RUNS.clear()
    for (namespace, phase), n in counts.items():
        RUNS.labels(namespace, phase).set(n)


def observe_trial(namespace: str, rec: TrialRecord) -> None:
    TRIALS.labels(namespace, rec.kind, rec.outcome.value).inc()
    if rec.charged_hours > 0:
        HOURS.labels(namespace).inc(rec.charged_hours)


@contextmanager
def timed_request(endpoint: str) -> Iterator[None]:
    """Observe the duration of one request to a run's ``endpoint`` (prometheus, agent), by its outcome."""
    t0 = time.monotonic()
    outcome = "error"
    try:
        yield
        outcome = "ok"
    finally:
        ENDPOINT.labels(endpoint, outcome).observe(time.monotonic() - t0)


def serve(port: int, addr: str = "0.0.0.0") -> None:
    """Serve ``/metrics`` on ``addr:port`` in a background thread."""
    start_http_server(port, addr=addr, registry=REGISTRY)
