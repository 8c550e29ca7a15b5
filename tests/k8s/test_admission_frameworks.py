"""Admission and the operator agree on which recipes a TuningRun can run: a framework without a Kubernetes
renderer, a torch run without Prometheus, a template the operator cannot turn into a job."""

from __future__ import annotations

import copy

import pytest

from attune import frameworks
from attune.operator.reconcile import reconcile
from attune.operator.webhook import run_problems
from tests.k8s.conftest import good_run
from tests.k8s.fakes import FakePorts, tuning_run

pytestmark = pytest.mark.k8s


@pytest.fixture()
def no_renderer(monkeypatch):
    """The torch framework as if it had no Kubernetes renderer (as frameworks without ``patch_job`` are)."""
    fw = frameworks.get("torch")
    monkeypatch.setattr(type(fw), "k8s", False)
    return fw


def test_a_framework_without_a_kubernetes_renderer_is_refused_by_name(no_renderer):
    problems = run_problems(tuning_run())
    assert len(problems) == 1, problems
    supported = [n for n in frameworks.names() if frameworks.get(n).k8s]
    assert "torch" not in supported
    assert problems[0] == (f"framework 'torch' has no Kubernetes renderer, so a TuningRun cannot run its trials; "
                           f"TuningRuns support the frameworks {', '.join(supported) or 'none'} (tune torch recipes "
                           f"with `attune tune` on the local backend)")


def test_the_operator_fails_such_a_run_instead_of_retrying(no_renderer):
    ports = FakePorts()
    run = tuning_run()
    res = reconcile(run, ports)
    assert res.status["phase"] == "Failed" and "'torch' has no Kubernetes renderer" in res.status["message"]
    cond = next(c for c in res.status["conditions"] if c["type"] == "RecipeValid")
    assert cond["status"] == "False" and cond["reason"] == "NotRunnableOnKubernetes"
    assert not ports.trials and not ports.jobs_created
    run["status"] = res.status
    assert reconcile(run, ports).status == {}  # terminal: nothing more happens


def test_a_torch_run_needs_prometheus():
    run = good_run("r", "http://p.ml.svc", None)
    del run["spec"]["metrics"]["prometheusUrl"]
    problems = run_problems(run)
    assert problems == ["spec.metrics.prometheusUrl: required for framework torch, whose trials are measured "
                        "through the metrics they serve"]
    run = tuning_run()
    del run["spec"]["metrics"]["prometheusUrl"]
    assert reconcile(run, FakePorts()).status["phase"] == "Failed"


def test_a_template_the_operator_cannot_build_a_job_from_is_refused():
    run = good_run("r", "http://p.ml.svc", None)
    run["spec"]["containerName"] = "trainer"
    problems = run_problems(run)
    assert problems == ["spec.trialTemplate: replica Master has no container named 'trainer'"], problems


def test_from_template_names_the_frameworks_that_can_import_a_launch():
    run = good_run("r", "http://p.ml.svc", None)
    run["spec"]["recipe"] = {"fromTemplate": {"framework": "torch"}}
    problems = run_problems(run)
    assert len(problems) == 1 and "'torch' cannot import a launch" in problems[0], problems
    run["spec"]["recipe"] = {"fromTemplate": {"framework": "nosuch"}}
    assert "'nosuch' is no known framework" in run_problems(run)[0]
    both = copy.deepcopy(run)
    both["spec"]["recipe"] = {"fromTemplate": {"framework": "torch"}, "inline": {"name": "x"}}
    assert run_problems(both) == ["spec.recipe: give one of inline, configMapRef and fromTemplate, not inline and "
                                  "fromTemplate"]
