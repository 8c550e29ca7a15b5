"""Issue 39, item 15: the chart's PrometheusRule, checked and exercised by the real ``promtool`` (Debian's
prometheus package): the rules parse, and each alert fires on the series the operator exports (names and labels as
attune/operator/telemetry.py writes them) and stays quiet otherwise."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.k8s.chart import by_kind, render

pytestmark = pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool: apt-get install prometheus")

RULES = ("--api-versions", "monitoring.coreos.com/v1", "--api-versions", "monitoring.coreos.com/v1/PrometheusRule")
TESTS = """
rule_files: [rules.yaml]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'up{job="rel-attune", namespace="attune-system"}'
        values: '1 1 0x20'
      - series: 'attune_operator_run_stalled{job="rel-attune", namespace="ml", run="r", reason="SecretNotFound"}'
        values: '1x45'
      - series: 'attune_operator_run_waiting{job="rel-attune", namespace="ml", run="w", reason="PrometheusUnreachable"}'
        values: '1x150'
      - series: 'attune_operator_trials_total{job="rel-attune", namespace="ml", kind="candidate", outcome="mismeasured"}'
        values: '0 0 1 1 1'
      - series: 'attune_operator_reconcile_errors_total{job="rel-attune", namespace="attune-system"}'
        values: '0+1x30'
    alert_rule_test:
      - {eval_time: 4m, alertname: AttuneOperatorDown, exp_alerts: []}
      - eval_time: 10m
        alertname: AttuneOperatorDown
        exp_alerts: [{exp_labels: {severity: critical}}]
      - {eval_time: 20m, alertname: AttuneRunStalled, exp_alerts: []}
      - eval_time: 35m
        alertname: AttuneRunStalled
        exp_alerts: [{exp_labels: {severity: warning, namespace: ml, run: r, reason: SecretNotFound}}]
      - {eval_time: 100m, alertname: AttuneRunWaiting, exp_alerts: []}
      - eval_time: 125m
        alertname: AttuneRunWaiting
        exp_alerts: [{exp_labels: {severity: warning, namespace: ml, run: w, reason: PrometheusUnreachable}}]
      - eval_time: 3m
        alertname: AttuneTrialsWithoutSamples
        exp_alerts: [{exp_labels: {severity: warning, namespace: ml}}]
      - eval_time: 20m
        alertname: AttuneReconcileErrors
        exp_alerts: [{exp_labels: {severity: warning}}]
"""


def test_the_charts_alerts_fire_on_the_operators_series(helm, tmp_path: Path) -> None:
    docs = render(helm, extra=RULES)
    [rule] = by_kind(docs, "PrometheusRule")
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rule["spec"]))
    check = subprocess.run(["promtool", "check", "rules", str(tmp_path / "rules.yaml")], capture_output=True,
                           text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    # when each fires (its annotations' templates are what `check rules` above parsed)
    for r in rule["spec"]["groups"][0]["rules"]:
        r.pop("annotations", None)
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rule["spec"]))
    (tmp_path / "tests.yaml").write_text(TESTS)
    res = subprocess.run(["promtool", "test", "rules", "tests.yaml"], capture_output=True, text=True, timeout=60,
                         cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    sm = by_kind(docs, "ServiceMonitor")[0]
    assert sm["spec"]["endpoints"][0]["honorLabels"] is True  # the run's namespace label stays the run's


def test_no_operator_down_alert_for_an_operator_outside_the_cluster(helm) -> None:
    [rule] = by_kind(render(helm, "operator.replicas=0", extra=RULES),
                     "PrometheusRule")
    assert "AttuneOperatorDown" not in {r["alert"] for r in rule["spec"]["groups"][0]["rules"]}
    assert not by_kind(render(helm), "PrometheusRule")  # no Prometheus Operator: no rule
    # the Prometheus Operator's group served without its PrometheusRule CRD: none either (the install would fail)
    assert not by_kind(render(helm, extra=("--api-versions", "monitoring.coreos.com/v1")), "PrometheusRule")
