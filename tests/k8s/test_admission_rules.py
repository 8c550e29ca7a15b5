"""Admission of spec edits: an update with an unchanged spec is admitted without reading anything, and the CRD's CEL
rules and the webhook agree on which edits are allowed (the opaque trial template is frozen whole by both)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.k8s.conftest import good_run

pytestmark = pytest.mark.k8s


# -- admission of updates never depends on a ConfigMap -------------------------------------------------------------

def test_an_update_with_an_unchanged_spec_is_admitted_without_reading_anything():
    from attune.operator.webhook import run_problems

    run = good_run("r", "http://p.ml.svc", None)
    run["spec"]["recipe"] = {"configMapRef": {"name": "gone"}}
    run["status"] = {"phase": "Tuning"}

    def no_configmap(*_):
        raise AssertionError("an update read the recipe's ConfigMap")

    finalizer_removed = copy.deepcopy(run)
    finalizer_removed["metadata"].update(finalizers=[], deletionTimestamp="2026-01-01T00:00:00Z")
    assert run_problems(finalizer_removed, run, no_configmap) == []
    annotated = copy.deepcopy(run)
    annotated["metadata"]["annotations"] = {"kopf.zalando.org/x": "y"}
    assert run_problems(annotated, run, no_configmap) == []
    suspend = copy.deepcopy(run)
    suspend["spec"]["suspend"] = True
    assert run_problems(suspend, run, no_configmap) == []


# -- the CRD's CEL rules -------------------------------------------------------------------------------------------

def _cel_rules():
    from attune.operator.crdgen import build_crds

    spec = build_crds()["attune.dev_tuningruns.yaml"]["spec"]["versions"][0]["schema"]["openAPIV3Schema"][
        "properties"]["spec"]
    return [(None, r) for r in spec["x-kubernetes-validations"]] + \
           [("budget", r) for r in spec["properties"]["budget"]["x-kubernetes-validations"]]


def _cel_refusals(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    celpy = pytest.importorskip("celpy")
    env = celpy.Environment()
    out = []
    for node, rule in _cel_rules():
        o, n = (old.get(node), new.get(node)) if node else (old, new)
        prog = env.program(env.compile(rule["rule"]))
        if not prog.evaluate({"self": celpy.json_to_cel(n), "oldSelf": celpy.json_to_cel(o)}):
            out.append(rule["message"])
    return out


@pytest.mark.parametrize(("edit", "allowed"), [
    (lambda s: s.update(suspend=True), True),
    (lambda s: s["budget"].update(acceleratorHours=9.0, maxTrials=50, maxFailedTrials=9), True),
    (lambda s: s["budget"].pop("maxTrials"), True),  # no limit: the largest
    (lambda s: s["budget"].update(acceleratorHours=0.01), False),
    (lambda s: s["budget"].update(maxTrials=1), False),
    (lambda s: s["budget"].update(trialDeadlineSeconds=999), False),
    (lambda s: s.update(searchSpace=["micro_batch_size"]), False),
    (lambda s: s.update(containerName="other"), False),
    (lambda s: s["metrics"].update(measureSteps=7), False),
    (lambda s: s.update(agent={"endpoint": "http://x.svc"}), False),
    (lambda s: s.pop("searchSpace"), False),
    (lambda s: s["recipe"].update(configMapRef={"name": "x"}), False),
    (lambda s: s["recipe"]["inline"]["training"].update(seed=7), False),  # inside the opaque inline recipe
    (lambda s: s["trialTemplate"]["spec"].update(runPolicy={"cleanPodPolicy": "None"}), False),  # opaque
])
def test_cel_rules_and_the_webhook_agree_on_spec_edits(edit, allowed):
    from attune.operator.resources import spec_edit_problems

    old = good_run("r", "http://p.ml.svc", None)["spec"]
    new = copy.deepcopy(old)
    edit(new)
    assert (not spec_edit_problems(old, new)) is allowed, spec_edit_problems(old, new)
    assert (not _cel_refusals(old, new)) is allowed, _cel_refusals(old, new)


def test_the_opaque_template_is_frozen_whole_by_cel_and_by_the_webhook():
    """CEL selects no field inside an opaque value, but compares two whole (kube-apiserver does:
    tests/k8s/test_real_crds.py), so the template has a rule of its own like every other frozen field."""
    from attune.operator.crdgen import build_crds, opaque
    from attune.operator.resources import spec_edit_problems

    props = build_crds()["attune.dev_tuningruns.yaml"]["spec"]["versions"][0]["schema"]["openAPIV3Schema"][
        "properties"]["spec"]["properties"]
    assert opaque(props["trialTemplate"])  # x-kubernetes-preserve-unknown-fields
    old = good_run("r", "http://p.ml.svc", None)["spec"]
    new = copy.deepcopy(old)
    new["trialTemplate"]["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["image"] = "x"
    assert spec_edit_problems(old, new) == ["spec.trialTemplate is frozen"]
    assert [m.split(";")[0] for m in _cel_refusals(old, new)] == ["spec.trialTemplate is frozen once the run exists"]
