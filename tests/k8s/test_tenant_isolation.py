"""Tenant isolation (issue 39): what one tenant writes in its TuningRun must never reach another tenant's data.

Item 1, PromQL injection: ``metrics.namespaceLabel`` and ``metrics.podLabel`` were pasted unquoted into the
operator's selectors, so ``namespaceLabel: 'namespace="team-b", x!'`` made the operator query
``{namespace="team-b", x!="team-a", ...}`` (team B's series, for team A's run). Label names are now Prometheus label
names by the model, the webhook and the CRD's schema (refused by the real API server), and every value in a selector is
a PromQL string literal whatever it holds."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kubernetes import client
from pydantic import ValidationError

from attune.operator import metrics
from attune.operator.resources import MetricsSpec
from attune.operator.webhook import run_problems
from tests.k8s.fakes import tuning_run
from tests.k8s.realcluster import ControlPlane

pytestmark = pytest.mark.k8s
INJECTIONS = ['namespace="team-b", x!', 'pod=~".+"} or {a', "name space", 'pod"', "0pod", "pod\n", ""]


@pytest.mark.parametrize("field", ["namespaceLabel", "podLabel"])
@pytest.mark.parametrize("value", INJECTIONS)
def test_a_label_setting_that_is_not_a_label_name_is_refused_by_the_model_and_the_webhook(field, value):
    with pytest.raises(ValidationError) as err:
        MetricsSpec.model_validate({field: value})
    assert field in str(err.value) or field.replace("L", "_l") in str(err.value)
    run = tuning_run()
    run["spec"]["metrics"][field] = value
    problems = run_problems(run)
    assert any(field in p for p in problems), problems


def test_the_selector_keeps_each_setting_in_its_place():
    m = MetricsSpec.model_validate({"namespaceLabel": "exported_namespace", "podLabel": "exported_pod"})
    sel = metrics.pod_selector(m, "team-a", "r-t001", {"rank": "0"})
    assert sel == '{exported_namespace="team-a", exported_pod=~"r-t001-(master|worker)-[0-9]+", rank="0"}'
    # a model built around validation still cannot put a matcher into the query
    forged = MetricsSpec.model_construct(namespace_label='namespace="team-b", x!', pod_label="pod")
    with pytest.raises(ValueError, match="not a Prometheus label name"):
        metrics.pod_selector(forged, "team-a", "r-t001")


def _go_unquote(literal: str) -> str:
    """A PromQL (Go) double-quoted literal's value, for the escapes :func:`metrics.quote` writes."""
    assert literal[0] == literal[-1] == '"'
    out, i, body = [], 0, literal[1:-1]
    simple = {"\\": "\\", '"': '"', "n": "\n", "r": "\r", "t": "\t"}
    while i < len(body):
        ch = body[i]
        assert ch != '"' and ord(ch) >= 0x20, f"raw {ch!r} inside the literal"
        if ch != "\\":
            out.append(ch)
            i += 1
            continue
        nxt = body[i + 1]
        if nxt == "x":
            out.append(chr(int(body[i + 2:i + 4], 16)))
            i += 4
        else:
            out.append(simple[nxt])
            i += 2
    return "".join(out)


@given(st.text())
def test_every_value_is_one_string_literal_whatever_it_holds(value):
    literal = metrics.quote(value)
    assert _go_unquote(literal) == value


def test_the_real_api_server_refuses_a_label_setting_that_is_not_a_label_name(crds: ControlPlane) -> None:
    ns = crds.namespace("iso")
    try:
        run = tuning_run()
        run["metadata"] = {"name": "inject", "namespace": ns}
        run["spec"]["metrics"]["namespaceLabel"] = INJECTIONS[0]
        with pytest.raises(client.exceptions.ApiException) as err:
            crds.custom.create_namespaced_custom_object("attune.dev", "v1alpha1", ns, "tuningruns", run)
        assert err.value.status == 422
        message = json.loads(err.value.body)["message"]
        assert "spec.metrics.namespaceLabel" in message and "should match" in message, message
    finally:
        crds.delete_namespace(ns)
