"""Finding D: TrainJob trials of the reference trainer can be scraped. A TrainJob's ``spec.trainer`` has no ``ports``
(the operator drops them), so its pods declare no port named ``attune-metrics`` for the trials' PodMonitor; the chart
renders a second PodMonitor that selects TrainJob trial pods by their JobSet label and scrapes the trainer container
at the port number the reference trainer listens on (``spec.metrics.metricsPort``, 9464 by default), by rewriting
the target address (``portNumber`` / ``targetPort`` keep only targets of a declared container port)."""

from __future__ import annotations

import re

import pytest

from attune.operator.backends import TrainJobBackend
from attune.operator.resources import MetricsSpec
from tests.k8s.chart import named, render

pytestmark = pytest.mark.k8s

MONITORING = ("--api-versions", "monitoring.coreos.com/v1")


def _relabel(endpoint, source_labels, labels):
    """Prometheus' relabelling of one target (keep and replace actions), as the endpoint's rules say."""
    labels = dict(labels)
    for rule in endpoint["relabelings"]:
        value = ";".join(labels.get(s, "") for s in rule["sourceLabels"])
        m = re.fullmatch(rule.get("regex", "(.*)"), value)
        if rule["action"] == "keep":
            if not m:
                return None
        elif rule["action"] == "replace" and m:
            labels[rule["targetLabel"]] = m.expand(rule["replacement"].replace("$1", r"\1"))
    return labels


def test_trainjob_trial_pods_are_scraped_by_port_number(helm):
    docs = render(helm, extra=MONITORING)
    monitor = named(docs, "PodMonitor", "rel-attune-trainjob-trials")
    exprs = monitor["spec"]["selector"]["matchExpressions"]
    assert {"key": "attune.dev/run", "operator": "Exists"} in exprs
    assert {"key": TrainJobBackend.JOBSET_LABEL, "operator": "Exists"} in exprs  # the label TrainJob pods carry
    assert monitor["spec"]["namespaceSelector"] == {"any": True}
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"  # found like the other PodMonitor
    [endpoint] = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["honorLabels"] is False and "port" not in endpoint
    port = MetricsSpec().metrics_port  # what the operator gives the reference trainer by default
    assert port == 9464
    target = _relabel(endpoint, None, {"__meta_kubernetes_pod_container_name": "node",
                                       "__meta_kubernetes_pod_ip": "10.1.2.3", "__address__": "10.1.2.3"})
    assert target is not None and target["__address__"] == f"10.1.2.3:{port}"
    v6 = _relabel(endpoint, None, {"__meta_kubernetes_pod_container_name": "node",
                                   "__meta_kubernetes_pod_ip": "fd00::5", "__address__": "fd00::5"})
    assert v6 is not None and v6["__address__"] == f"[fd00::5]:{port}"
    # a sidecar or init container of the pod is no second target
    assert _relabel(endpoint, None, {"__meta_kubernetes_pod_container_name": "istio-proxy",
                                     "__meta_kubernetes_pod_ip": "10.1.2.3"}) is None


def test_the_pytorchjob_podmonitor_is_unchanged_and_the_trainjob_one_follows_the_values(helm):
    docs = render(helm, "operator.namespaces={ml}", "trials.podMonitor.trainJob.portNumber=9500", extra=MONITORING)
    first = named(docs, "PodMonitor", "rel-attune-trials")
    assert [e["port"] for e in first["spec"]["podMetricsEndpoints"]] == ["attune-metrics"]
    monitor = named(docs, "PodMonitor", "rel-attune-trainjob-trials")
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["ml"]}
    assert monitor["spec"]["podMetricsEndpoints"][0]["relabelings"][1]["replacement"] == "$1:9500"
    off = render(helm, "trials.podMonitor.trainJob.enabled=false", extra=MONITORING)
    assert not [d for d in off if d["kind"] == "PodMonitor" and d["metadata"]["name"].endswith("trainjob-trials")]
    assert not [d for d in render(helm) if d["kind"] == "PodMonitor"]  # no Prometheus Operator: none


def test_trainjob_trials_declare_no_port_so_only_the_number_reaches_them():
    """The reason for the second PodMonitor: the operator's TrainJob drops the trainer's ports."""
    from tests.k8s.harness import trainjob_pod_labels

    assert TrainJobBackend.JOBSET_LABEL in trainjob_pod_labels("r-t001")
