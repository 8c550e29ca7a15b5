"""The operator's start-up checks (attune/operator/preflight.py) without a cluster: older or missing CRDs are
refused with the fix, unreadable ones name the permission, and the peering object is created (or its CRD named)."""

from __future__ import annotations

import copy
import json

import kopf
import pytest
from kubernetes.client.exceptions import ApiException

from attune.operator import preflight
from attune.operator.crdgen import REVISION_ANNOTATION, SCHEMA_REVISION, build_crds

pytestmark = pytest.mark.k8s


def served() -> dict[str, dict]:
    return {doc["metadata"]["name"]: doc for doc in build_crds().values()}


def test_the_generated_crds_pass_and_carry_the_revision():
    crds = served()
    assert set(crds) == set(preflight.CRD_NAMES)
    assert all(preflight.served_revision(c) == SCHEMA_REVISION for c in crds.values())
    assert preflight.crd_problems(crds) == []
    preflight.check_crds(crds.get)


def test_an_older_crd_is_refused_with_the_fix():
    crds = served()
    old = copy.deepcopy(crds)
    old["tuningruns.attune.dev"]["metadata"]["annotations"][REVISION_ANNOTATION] = str(SCHEMA_REVISION - 1)
    del old["tuningtrials.attune.dev"]["metadata"]["annotations"]  # a CRD of chart 0.1.0: revision 1
    problems = preflight.crd_problems(old)
    assert len(problems) == 2 and f"schema revision {SCHEMA_REVISION - 1}" in problems[0]
    with pytest.raises(preflight.PreflightError) as err:
        preflight.check_crds(old.get)
    assert "kubectl apply --server-side --force-conflicts -f crds/" in str(err.value) and "crds.install=true" in str(err.value)
    newer = copy.deepcopy(crds)
    newer["tuningruns.attune.dev"]["metadata"]["annotations"][REVISION_ANNOTATION] = str(SCHEMA_REVISION + 1)
    assert preflight.crd_problems(newer) == []  # additive: an older operator may run
    assert preflight.crd_problems({"tuningruns.attune.dev": crds["tuningruns.attune.dev"]}) == [
        "CRD tuningtrials.attune.dev is not installed"]
    unserved = copy.deepcopy(crds)
    unserved["tuningtrials.attune.dev"]["spec"]["versions"][0]["served"] = False
    assert preflight.crd_problems(unserved) == ["CRD tuningtrials.attune.dev does not serve v1alpha1"]


class Raising:
    def __init__(self, status):
        self.status = status

    def __call__(self, *args, **kwargs):
        raise ApiException(status=self.status, reason="Forbidden" if self.status == 403 else "x")


def api_with(ext=None, custom=None):
    api = preflight.KubePreflightApi.__new__(preflight.KubePreflightApi)
    api.ext, api.custom = ext, custom
    return api


class Ext:
    def __init__(self, fn):
        self.read_custom_resource_definition = fn


class Custom:
    def __init__(self, fn):
        self.create_cluster_custom_object = fn
        self.create_namespaced_custom_object = fn


def test_unreadable_crds_name_the_permission():
    with pytest.raises(preflight.PreflightError, match=r"needs 'get' on customresourcedefinitions.apiextensions"
                                                       r".k8s.io/tuningruns.attune.dev"):
        api_with(ext=Ext(Raising(403))).read_crd("tuningruns.attune.dev")
    assert api_with(ext=Ext(Raising(404))).read_crd("tuningruns.attune.dev") is None

    class Resp:
        data = json.dumps(served()["tuningruns.attune.dev"]).encode()

    assert api_with(ext=Ext(lambda name, **_: Resp())).read_crd("x")["metadata"]["name"] == "tuningruns.attune.dev"


def test_peering_object_created_once_and_a_missing_crd_named():
    made = []
    api = api_with(custom=Custom(lambda *a, **_: made.append(a)))
    preflight.prepare(preflight.StartupPlan(peering="rel-attune", namespaces=("ml", "research")), api=api)
    assert [(a[2], a[3], a[4]["kind"], a[4]["metadata"]["name"]) for a in made] == [
        ("ml", "kopfpeerings", "KopfPeering", "rel-attune"), ("research", "kopfpeerings", "KopfPeering", "rel-attune")]
    api_with(custom=Custom(Raising(409))).create_peering("rel-attune", None)  # exists already: fine
    with pytest.raises(preflight.PreflightError, match="installPeeringCRDs=true"):
        api_with(custom=Custom(Raising(404))).create_peering("rel-attune", None)
    with pytest.raises(preflight.PreflightError, match="needs 'create' on clusterkopfpeerings.kopf.dev"):
        api_with(custom=Custom(Raising(403))).create_peering("rel-attune", None)


def test_run_makes_a_failure_fatal_for_kopf(monkeypatch):
    preflight.run(None)  # nothing asked: nothing done
    refusing = api_with(ext=Ext(Raising(403)))
    monkeypatch.setattr(preflight, "KubePreflightApi", lambda: refusing)
    with pytest.raises(kopf.PermanentError, match="preflight failed: forbidden to get"):
        preflight.run(preflight.StartupPlan(check_crds=True))


# -- what the runs will need: one readable line each (issue 39, item 9) -------------------------------------------

LABELS = {"app.kubernetes.io/name": "attune", "release": "kube-prometheus-stack"}


def _prom(name, ns, selector, ns_selector=None):
    spec = {"podMonitorSelector": selector}
    if ns_selector is not None:
        spec["podMonitorNamespaceSelector"] = ns_selector
    return {"metadata": {"name": name, "namespace": ns}, "spec": spec}


def test_label_selectors_read_as_kubernetes_reads_them():
    assert preflight.selects({}, LABELS) and not preflight.selects(None, LABELS)
    assert preflight.selects({"matchLabels": {"release": "kube-prometheus-stack"}}, LABELS)
    assert not preflight.selects({"matchLabels": {"release": "monitoring"}}, LABELS)
    assert preflight.selects({"matchExpressions": [{"key": "release", "operator": "In",
                                                    "values": ["a", "kube-prometheus-stack"]}]}, LABELS)
    assert not preflight.selects({"matchExpressions": [{"key": "release", "operator": "NotIn",
                                                        "values": ["kube-prometheus-stack"]}]}, LABELS)
    assert preflight.selects({"matchExpressions": [{"key": "team", "operator": "DoesNotExist"}]}, LABELS)
    assert not preflight.selects({"matchExpressions": [{"key": "team", "operator": "Exists"}]}, LABELS)


def test_each_missing_piece_is_one_line_naming_the_fix():
    both = {"PyTorchJob": True, "TrainJob": False}
    [(ok, jobs)] = preflight.environment_lines(both, None, None)
    assert ok and jobs == ("trial jobs: PyTorchJob (kubeflow.org/v1) served; TrainJob (trainer.kubeflow.org/v1alpha1) "
                           "not served (install Kubeflow Trainer for TrainJob trial templates)")
    [(ok, jobs)] = preflight.environment_lines({"PyTorchJob": False, "TrainJob": None}, None, None)
    assert not ok and "every run fails CRDNotInstalled" in jobs and "TrainJob" in jobs and "did not answer" in jobs
    pm = (LABELS, "attune-system")
    lines = preflight.environment_lines(both, pm, None)
    assert lines[1] == (False, lines[1][1]) and "the cluster serves no Prometheus" in lines[1][1]
    good = _prom("k", "monitoring", {"matchLabels": {"release": "kube-prometheus-stack"}}, {})
    lines = preflight.environment_lines(both, pm, [good])
    assert lines[1] == (True, "trial scraping: the PodMonitor in attune-system is selected by Prometheus monitoring/k")
    # kube-prometheus-stack under another release name; one that looks only in its own namespace
    other = _prom("k", "monitoring", {"matchLabels": {"release": "monitoring"}}, {})
    local = _prom("p", "monitoring", {})
    [_, (ok, line)] = preflight.environment_lines(both, pm, [other, local])
    assert not ok and "no Prometheus selects the chart's PodMonitor in attune-system" in line
    assert "monitoring/k selects release=monitoring" in line and "monitoring/p selects every PodMonitor in its own " \
                                                                    "namespace monitoring only" in line
    assert "set trials.podMonitor.labels" in line and "\n" not in line
    labelled = _prom("k", "monitoring", {}, {"matchLabels": {"scrape": "yes"}})
    [_, (ok, line)] = preflight.environment_lines(both, pm, [labelled])
    assert ok and "if namespace attune-system's labels match scrape=yes" in line
