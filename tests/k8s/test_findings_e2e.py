"""Operator behaviours that need the real operator process: its admission webhook as the API server
calls it (the emulated API server calls the webhooks of its ValidatingWebhookConfigurations), its deletion
handler, its discovery of the trial backends, and its view of trials waiting for accelerators."""

from __future__ import annotations

import copy
import time
from typing import Any

import pytest
from kubernetes import client

from attune.operator.backends import job_name, valid_job_name
from tests.k8s.conftest import good_run
from tests.k8s.harness import NS, KubeAPI, Operator, wait_for

pytestmark = [pytest.mark.k8s, pytest.mark.e2e]

RUNS = ("attune.dev", "v1alpha1", NS, "tuningruns")


def _cond(kube: KubeAPI, name: str, ctype: str) -> dict[str, Any] | None:
    run = kube.run(name) or {}
    return next((c for c in (run.get("status") or {}).get("conditions") or [] if c["type"] == ctype), None)


def _status(kube: KubeAPI, name: str) -> dict[str, Any]:
    return (kube.run(name) or {}).get("status") or {}


def test_deleting_a_run_whose_recipe_configmap_is_gone_is_not_blocked(kube, operator):
    """kopf removes its finalizer with an UPDATE; the webhook used to re-read the recipe's ConfigMap on it."""
    kube.install_webhooks(operator.webhook_port)
    core = client.CoreV1Api(kube.api)
    run = good_run("cm.run", "http://prom.ml.svc:9090", None, suspend=True)
    inline = run["spec"]["recipe"].pop("inline")
    import yaml

    core.create_namespaced_config_map(NS, {"metadata": {"name": "recipe"}, "data": {"recipe.yaml": yaml.safe_dump(inline)}})
    run["spec"]["recipe"] = {"configMapRef": {"name": "recipe"}}
    kube.custom.create_namespaced_custom_object(*RUNS, run)
    wait_for(lambda: _status(kube, "cm.run").get("phase") == "Suspended", 30, "the run to start (suspended)")
    core.delete_namespaced_config_map("recipe", NS)
    kube.custom.delete_namespaced_custom_object(*RUNS, "cm.run")
    wait_for(lambda: kube.run("cm.run") is None, 30, "the run to be deleted (its finalizer removed)")
    assert "denied" not in operator.log()


@pytest.mark.served_crds("before-template-rule")  # the CRD's own rule would refuse the slip
def test_the_webhook_refuses_frozen_edits_and_the_operator_ignores_those_that_slip_past(kube, operator, kubeflow,
                                                                                          prometheus):
    kube.install_webhooks(operator.webhook_port)
    run = good_run("frozen", prometheus.url, None)
    run["spec"]["recipe"]["inline"]["training"]["seq_length"] = 16
    run["spec"]["metrics"].update(warmupSteps=1, measureSteps=6, baselineRepeats=2)
    kube.custom.create_namespaced_custom_object(*RUNS, run)
    wait_for(lambda: _status(kube, "frozen").get("acceptedSpec"), 30, "the run to start")
    path = ["spec", "trialTemplate", "spec", "pytorchReplicaSpecs", "Master", "template", "spec", "containers"]
    live = kube.run("frozen")
    containers = copy.deepcopy(live)
    for key in path:
        containers = containers[key]
    original = containers[0]["image"]
    containers[0]["image"] = "evil/image:latest"
    edit = {"spec": {"trialTemplate": _set(live["spec"]["trialTemplate"], path[2:], containers)}}
    with pytest.raises(client.exceptions.ApiException) as refused:
        kube.custom.patch_namespaced_custom_object(*RUNS, "frozen", edit)
    assert refused.value.status == 422 and "spec.trialTemplate is frozen" in refused.value.body
    # a budget increase and suspend are allowed
    kube.custom.patch_namespaced_custom_object(*RUNS, "frozen", {"spec": {"budget": {"acceleratorHours": 0.3}}})
    # an edit that skips the webhook (it is gone, or failurePolicy Ignore): the operator ignores and reports it
    kube.remove_webhooks()
    kube.custom.patch_namespaced_custom_object(*RUNS, "frozen", edit)
    cond = wait_for(lambda: (c := _cond(kube, "frozen", "SpecAccepted")) and c["status"] == "False" and c, 30,
                    "SpecAccepted=False")
    assert cond["reason"] == "FrozenFieldChanged" and "spec.trialTemplate is frozen" in cond["message"]
    gen = kube.run("frozen")["metadata"]["generation"]
    wait_for(lambda: _cond(kube, "frozen", "SpecAccepted")["observedGeneration"] == gen, 30, "the generation seen")
    wait_for(lambda: len([j for j in kube.jobs() if j["metadata"]["name"].startswith("frozen-")]) >= 2, 120,
             "a trial's job created after the edit")
    for job in kube.jobs():
        c = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
        assert c["image"] == original, "a frozen edit reached a trial's job"
    assert _status(kube, "frozen")["budget"]["hoursLimit"] == 0.3  # the allowed edit was taken
    # the edit reverted: accepted again
    kube.custom.patch_namespaced_custom_object(*RUNS, "frozen", {"spec": {"trialTemplate": live["spec"]["trialTemplate"]}})
    try:
        wait_for(lambda: _cond(kube, "frozen", "SpecAccepted")["status"] == "True", 30, "SpecAccepted=True again")
    except TimeoutError:
        raise AssertionError((_cond(kube, "frozen", "SpecAccepted"), kube.run("frozen")["spec"],
                              _status(kube, "frozen")["acceptedSpec"])) from None
    kube.custom.delete_namespaced_custom_object(*RUNS, "frozen")
    wait_for(lambda: kube.run("frozen") is None, 30, "the run deleted")


def _set(obj: dict[str, Any], path: list[str], value: Any) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    node = out
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return out


@pytest.fixture()
def kube_without_trainer(tmp_path):
    api = KubeAPI(tmp_path, without=("trainjobs",))
    yield api
    api.close()


def test_a_trainjob_run_on_a_cluster_without_kubeflow_trainer_fails_with_a_clear_condition(kube_without_trainer,
                                                                                             tmp_path):
    kube = kube_without_trainer
    op = Operator(kube, tmp_path)
    op.start()
    try:
        run = good_run("tj", "http://prom.ml.svc:9090", None)
        pod = run["spec"]["trialTemplate"]["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
        run["spec"]["trialTemplate"] = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                                        "spec": {"runtimeRef": {"name": "torch-distributed"},
                                                 "trainer": {"image": pod["containers"][0]["image"]}}}
        kube.custom.create_namespaced_custom_object(*RUNS, run)
        st = wait_for(lambda: _status(kube, "tj").get("phase") == "Failed" and _status(kube, "tj"), 60,
                      "the run to fail")
        c = {x["type"]: x for x in st["conditions"]}
        assert c["BackendAvailable"]["reason"] == "CRDNotInstalled"
        assert "trainer.kubeflow.org/v1alpha1 trainjobs" in c["BackendAvailable"]["message"]
        assert c["Stalled"]["status"] == "True" and c["Ready"]["status"] == "False"
        time.sleep(2)
        assert "PermanentError" in op.log() or "permanently" in op.log()
    finally:
        op.stop()


def test_a_trial_waiting_for_gpus_is_not_charged_and_its_job_name_is_valid(kube, operator, kubeflow,
                                                                                   prometheus):
    """No free accelerators for longer than the trial deadline (plus its grace): the trial waits, uncharged, then
    runs and is measured; its run's name (a dot, upper-case-free but not a DNS label) gives a valid job name."""
    kubeflow.hold = True
    run = good_run("gpu.wait", prometheus.url, None)
    run["spec"]["recipe"]["inline"]["training"]["seq_length"] = 16
    run["spec"]["metrics"].update(warmupSteps=1, measureSteps=6, baselineRepeats=1)
    run["spec"]["budget"].update(trialDeadlineSeconds=20, maxTrials=1)
    kube.custom.create_namespaced_custom_object(*RUNS, run)
    name = job_name("gpu.wait", 1)
    assert valid_job_name(name) and name != "gpu.wait-t001"
    q = wait_for(lambda: (c := _cond(kube, "gpu.wait", "TrialQueued")) and c["status"] == "True" and c, 60,
                 "the trial to wait for accelerators")
    assert q["reason"] == "Unschedulable" and "Insufficient nvidia.com/gpu" in q["message"]
    assert [j["metadata"]["name"] for j in kube.jobs()] == [name]
    time.sleep(55)  # beyond trialDeadlineSeconds + the operator's grace (20 + 30 s): the old clock timed it out
    assert not kube.records("gpu.wait"), "a trial waiting for accelerators was recorded"
    assert _status(kube, "gpu.wait")["budget"]["hoursUsed"] == 0
    kubeflow.hold = False
    st = wait_for(lambda: _status(kube, "gpu.wait").get("phase") in ("Succeeded", "Failed")
                  and _status(kube, "gpu.wait"), 180, "the run to finish")
    [rec] = kube.records("gpu.wait")
    assert rec["outcome"] == "succeeded", rec["message"]
    trial = kube.trials()[0]["status"]
    assert trial["queuedSeconds"] >= 55 and rec["wall_s"] < trial["queuedSeconds"]
    assert rec["charged_hours"] == pytest.approx(rec["wall_s"] / 3600)
    assert st["queuedSeconds"] >= 55
