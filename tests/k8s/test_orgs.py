"""Issue 39, item 2: the Prometheus organisation (X-Scope-OrgID) is the platform's, per namespace, never a run's
(what the operator sends: tests/k8s/test_metrics_access.py::test_prometheus_credentials_come_from_secrets)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from attune.operator import orgs
from attune.operator.webhook import run_problems
from tests.k8s.conftest import good_run


@pytest.fixture()
def mapping():
    orgs.configure(["team-a=org-a", "*=shared"])
    yield
    orgs.configure([])


def test_each_namespace_gets_the_platforms_organisation(mapping):
    assert orgs.org_for("team-a") == "org-a"
    assert orgs.org_for("team-b") == "shared"  # the * entry
    orgs.configure(["team-a=org-a"])
    assert orgs.org_for("team-b") is None  # no header


@pytest.mark.parametrize("item", ["team-a", "team-a=", "=org", "Team_A=org", "team-a=org a", "team-a=o,rg"])
def test_a_bad_mapping_is_refused_naming_the_item(item):
    with pytest.raises(ValueError, match="NAMESPACE=ORG"):
        orgs.parse([item])


def test_a_run_naming_another_organisation_is_refused_at_admission(mapping):
    run = good_run("r", "http://prom.ml.svc:9090", None)
    run["metadata"]["namespace"] = "team-a"
    run["spec"]["metrics"]["prometheusUrl"] = "http://prom.team-a.svc:9090"
    run["spec"]["metrics"]["prometheus"] = {"tenant": "org-b"}  # another team's series, behind an allowed Mimir
    problems = run_problems(run)
    assert any("X-Scope-OrgID" in p and "maps namespace team-a to org-a" in p for p in problems), problems
    run["spec"]["metrics"]["prometheus"] = {"tenant": "org-a"}  # the platform's own: admitted (an older run)
    assert not [p for p in run_problems(run) if "X-Scope-OrgID" in p]
    # an edit to another organisation is refused too
    edited = {**run, "spec": {**run["spec"], "metrics": {**run["spec"]["metrics"], "prometheus": {"tenant": "x"}}}}
    assert run_problems(edited, run)  # refused (a frozen field, or the organisation)


def test_the_cli_refuses_a_bad_mapping_before_starting():
    res = subprocess.run([sys.executable, "-m", "attune", "operator", "run", "--prometheus-org", "team-a"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "NAMESPACE=ORG" in res.stderr and "Traceback" not in res.stderr, res.stderr


def test_the_cli_refuses_a_kubeconfig_that_is_not_there(tmp_path):
    env = {**os.environ, "KUBECONFIG": str(tmp_path / "missing")}
    res = subprocess.run([sys.executable, "-m", "attune", "operator", "run"], capture_output=True, text=True,
                         timeout=120, env=env)
    assert res.returncode == 2 and "KUBECONFIG names" in res.stderr and "Traceback" not in res.stderr, res.stderr


def test_json_log_lines_for_log_collectors(tmp_path):
    """``--log-format json`` (the chart's operator.logFormat): every line the operator writes is one JSON object."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\\nkind: Config\\n")  # nothing to log in to: the operator says so, in JSON
    proc = subprocess.Popen([sys.executable, "-m", "attune", "operator", "run", "--log-format", "json"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            env={**os.environ, "KUBECONFIG": str(kubeconfig)})
    try:
        lines = [proc.stdout.readline() for _ in range(3)]  # type: ignore[union-attr]
    finally:  # (kopf keeps retrying its login: stopped outright, its lines are what is checked)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    records = [json.loads(line) for line in lines if line.strip()]
    assert records and all({"message", "severity", "timestamp"} <= set(r) for r in records), lines
