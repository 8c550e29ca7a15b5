"""The operator's own Prometheus metrics: runs by phase, trials, hours charged, best speedup, reconcile errors."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from attune.trial import TrialRecord

REGISTRY = CollectorRegistry()
RUNS = Gauge("attune_operator_runs", "TuningRuns by phase", ["phase"], registry=REGISTRY)
TRIALS = Counter("attune_operator_trials", "finished trials by kind and outcome", ["kind", "outcome"],
                 registry=REGISTRY)
HOURS = Counter("attune_operator_accelerator_hours_charged", "accelerator-hours charged to trials",
                registry=REGISTRY)
SPEEDUP = Gauge("attune_operator_best_speedup", "best throughput over baseline throughput", ["namespace", "run"],
                registry=REGISTRY)
ERRORS = Counter("attune_operator_reconcile_errors", "reconcile steps that raised", registry=REGISTRY)

_phases: dict[tuple[str, str], str] = {}


def observe_run(namespace: str, name: str, phase: str | None, speedup: float | None) -> None:
    """Record the latest phase and best speedup of a run."""
    if phase:
        _phases[(namespace, name)] = phase
    if speedup is not None:
        SPEEDUP.labels(namespace, name).set(speedup)
    _publish()


def forget_run(namespace: str, name: str) -> None:
    _phases.pop((namespace, name), None)
    try:
        SPEEDUP.remove(namespace, name)
    except KeyError:
        pass
    _publish()


def _publish() -> None:
    counts: dict[str, int] = dict.fromkeys(("Pending", "Baseline", "Tuning", "Suspended", "Succeeded", "Failed"), 0)
    for phase in _phases.values():
        counts[phase] = counts.get(phase, 0) + 1
    for phase, n in counts.items():
        RUNS.labels(phase).set(n)


def observe_trial(rec: TrialRecord) -> None:
    TRIALS.labels(rec.kind, rec.outcome.value).inc()
    if rec.charged_hours > 0:
        HOURS.inc(rec.charged_hours)


def serve(port: int, addr: str = "0.0.0.0") -> None:
    """Serve ``/metrics`` on ``addr:port`` in a background thread."""
    start_http_server(port, addr=addr, registry=REGISTRY)
