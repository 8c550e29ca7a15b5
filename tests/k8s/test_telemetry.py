"""Issue 39, items 8 and 15: the operator's metrics carry the run's namespace (chargeback), say which runs are stalled
and why, time reconcile steps and the endpoints they call, and count the webhook's denials."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest

from attune.operator import telemetry
from attune.trial import TrialOutcome, TrialRecord


def _value(name: str, **labels: str) -> float | None:
    return telemetry.REGISTRY.get_sample_value(name, labels)


def test_hours_and_trials_are_counted_per_namespace():
    rec = TrialRecord(id=1, kind="baseline", outcome=TrialOutcome.SUCCEEDED, charged_hours=0.25)
    before = _value("attune_operator_accelerator_hours_charged_total", namespace="team-a") or 0.0
    telemetry.observe_trial("team-a", rec)
    assert _value("attune_operator_accelerator_hours_charged_total", namespace="team-a") == before + 0.25
    assert _value("attune_operator_trials_total", namespace="team-a", kind="baseline", outcome="succeeded") >= 1


def test_a_stalled_run_is_exported_with_its_reason_until_it_recovers_or_goes():
    telemetry.observe_run("team-b", "r", "Baseline", None, stalled="SecretNotFound")
    assert _value("attune_operator_run_stalled", namespace="team-b", run="r", reason="SecretNotFound") == 1
    assert _value("attune_operator_runs", namespace="team-b", phase="Baseline") == 1
    telemetry.observe_run("team-b", "r", "Baseline", None, stalled="KueueInadmissible")
    assert _value("attune_operator_run_stalled", namespace="team-b", run="r", reason="SecretNotFound") is None
    telemetry.observe_run("team-b", "r", "Tuning", None, waiting="PrometheusUnreachable")
    assert _value("attune_operator_run_stalled", namespace="team-b", run="r", reason="KueueInadmissible") is None
    assert _value("attune_operator_run_waiting", namespace="team-b", run="r", reason="PrometheusUnreachable") == 1
    telemetry.forget_run("team-b", "r")
    assert _value("attune_operator_run_waiting", namespace="team-b", run="r", reason="PrometheusUnreachable") is None
    assert _value("attune_operator_runs", namespace="team-b", phase="Tuning") is None


def test_endpoint_requests_are_timed_by_outcome():
    ok = _value("attune_operator_endpoint_request_duration_seconds_count", endpoint="agent", outcome="ok") or 0
    with telemetry.timed_request("agent"):
        pass
    with pytest.raises(RuntimeError), telemetry.timed_request("agent"):
        raise RuntimeError("unreachable")
    assert _value("attune_operator_endpoint_request_duration_seconds_count", endpoint="agent", outcome="ok") == ok + 1
    assert _value("attune_operator_endpoint_request_duration_seconds_count", endpoint="agent", outcome="error") >= 1
    text = generate_latest(telemetry.REGISTRY).decode()
    for name in ("attune_operator_reconcile_duration_seconds", "attune_operator_webhook_denials"):
        assert f"# TYPE {name}" in text
