"""Issue 39, item 2: the Prometheus organisation (X-Scope-OrgID) is the platform's, per namespace, never a run's
(what the operator sends: tests/k8s/test_findings.py::test_prometheus_credentials_come_from_secrets)."""

from __future__ import annotations

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
