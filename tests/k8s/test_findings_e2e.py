"""Operator behaviours that need the real operator process on the real control plane: its admission webhook as
kube-apiserver calls it (the chart's ValidatingWebhookConfiguration, over TLS), its deletion handler, its discovery
of the trial backends (this control plane has no Kubeflow Trainer: the TrainJob CRD is not installed), and its view
of trials waiting for accelerators (the Node has no ``nvidia.com/gpu``: the real scheduler leaves such a pod
Pending, Unschedulable)."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from attune.operator.backends import job_name, valid_job_name
from tests.k8s.conftest import good_run
from tests.k8s.harness import NS, ROOT, Operator, crds_before_the_template_rule, free_port, free_port_block, wait_for
from tests.k8s.realcluster import ControlPlane, Release

pytestmark = [pytest.mark.k8s, pytest.mark.e2e]

RUNS = ("attune.dev", "v1alpha1", NS, "tuningruns")
GPU = "nvidia.com/gpu"


def _cond(rel: Release, name: str, ctype: str) -> dict[str, Any] | None:
    run = rel.run(name) or {}
    return next((c for c in (run.get("status") or {}).get("conditions") or [] if c["type"] == ctype), None)


def _status(rel: Release, name: str) -> dict[str, Any]:
    return (rel.run(name) or {}).get("status") or {}


def _master(run: dict[str, Any]) -> dict[str, Any]:
    """The trial template's trainer container."""
    container: dict[str, Any] = run["spec"]["trialTemplate"]["spec"]["pytorchReplicaSpecs"]["Master"]["template"][
        "spec"]["containers"][0]
    return container


def _on_the_node(run: dict[str, Any]) -> dict[str, Any]:
    """A short reference-trainer run whose trials run on the pod runner's Node: one baseline and short sequences
    (a trial takes seconds), metrics ports of its own and a free rendezvous port (MASTER_PORT, the port named
    ``pytorchjob-port``): the pods share this machine's network."""
    run["spec"]["recipe"]["inline"]["training"]["seq_length"] = 16
    run["spec"]["metrics"].update(warmupSteps=1, measureSteps=6, baselineRepeats=1,
                                  metricsPort=free_port_block(2))
    _master(run)["ports"] = [{"name": "pytorchjob-port", "containerPort": free_port(), "protocol": "TCP"}]
    return run


def test_deleting_a_run_whose_recipe_configmap_is_gone_is_not_blocked(release: Release,
                                                                      real_operator: Operator) -> None:
    """kopf removes its finalizer with an UPDATE; the webhook used to re-read the recipe's ConfigMap on it."""
    core = client.CoreV1Api(release.api)
    run = good_run("cm.run", "http://prom.ml.svc:9090", None, suspend=True)
    inline = run["spec"]["recipe"].pop("inline")
    core.create_namespaced_config_map(NS, {"metadata": {"name": "recipe"},
                                           "data": {"recipe.yaml": yaml.safe_dump(inline)}})
    run["spec"]["recipe"] = {"configMapRef": {"name": "recipe"}}
    release.custom.create_namespaced_custom_object(*RUNS, run)  # through the chart's webhook, over TLS
    wait_for(lambda: _status(release, "cm.run").get("phase") == "Suspended", 60, "the run to start (suspended)")
    core.delete_namespaced_config_map("recipe", NS)
    release.custom.delete_namespaced_custom_object(*RUNS, "cm.run")
    wait_for(lambda: release.run("cm.run") is None, 60, "the run to be deleted (its finalizer removed)")
    assert "denied" not in real_operator.log()


@pytest.fixture()
def crds_before_the_template_rule_served(crds: ControlPlane, tmp_path: Path) -> Iterator[ControlPlane]:
    """The CRDs of a cluster that upgraded the operator but not its CRDs (Helm never upgrades a chart's CRDs): the
    revision before the spec.trialTemplate rule (the same schema revision, which the operator accepts), so that an
    edit of the template that skips the webhook is stored. The repository's CRDs are applied again after."""
    crds.kubectl("apply", "--server-side", *[a for p in crds_before_the_template_rule(tmp_path) for a in ("-f", str(p))])
    try:
        yield crds
    finally:
        crds.kubectl("apply", "--server-side", "-f", str(ROOT / "crds"))
        crds.wait_established("tuningruns.attune.dev", "tuningtrials.attune.dev")


def test_the_webhook_refuses_frozen_edits_and_the_operator_ignores_those_that_slip_past(
        crds_before_the_template_rule_served: ControlPlane, training_operator: Any, release: Release,
        real_operator: Operator, pod_metrics: Any, prometheus: Any) -> None:
    run = _on_the_node(good_run("frozen", prometheus.url, None))
    run["spec"]["metrics"]["baselineRepeats"] = 2
    release.custom.create_namespaced_custom_object(*RUNS, run)
    wait_for(lambda: _status(release, "frozen").get("acceptedSpec"), 60, "the run to start")
    path = ["spec", "trialTemplate", "spec", "pytorchReplicaSpecs", "Master", "template", "spec", "containers"]
    live = release.run("frozen")
    assert live is not None
    containers = copy.deepcopy(live)
    for key in path:
        containers = containers[key]
    original = containers[0]["image"]
    containers[0]["image"] = "evil/image:latest"
    edit = {"spec": {"trialTemplate": _set(live["spec"]["trialTemplate"], path[2:], containers)}}
    with pytest.raises(client.exceptions.ApiException) as refused:
        release.custom.patch_namespaced_custom_object(*RUNS, "frozen", edit)
    # the refusal is the webhook's (these CRDs have no rule on the template)
    message = json.loads(refused.value.body)["message"]
    assert refused.value.status == 422 and "spec.trialTemplate is frozen" in message
    assert message.startswith('admission webhook "validate-run.attune.dev" denied the request'), message
    # a budget increase and suspend are allowed
    release.custom.patch_namespaced_custom_object(*RUNS, "frozen", {"spec": {"budget": {"acceleratorHours": 0.3}}})
    # an edit that skips the webhook: an admin removed the chart's ValidatingWebhookConfiguration (helm uninstall
    # passes over it when gone); the operator ignores the edit and reports it
    adm = client.AdmissionregistrationV1Api(release.api)
    config = next(d["metadata"]["name"] for d in release.manifests() if d["kind"] == "ValidatingWebhookConfiguration")
    adm.delete_validating_webhook_configuration(config)
    wait_for(lambda: _patched(release, edit), 30, "the API server to stop calling the removed webhook", interval=0.2)
    cond = wait_for(lambda: (c := _cond(release, "frozen", "SpecAccepted")) and c["status"] == "False" and c, 60,
                    "SpecAccepted=False")
    assert cond["reason"] == "FrozenFieldChanged" and "spec.trialTemplate is frozen" in cond["message"]
    gen = release.run("frozen")["metadata"]["generation"]  # type: ignore[index]
    wait_for(lambda: (_cond(release, "frozen", "SpecAccepted") or {}).get("observedGeneration") == gen, 60,
             "the generation seen")
    wait_for(lambda: len([j for j in release.jobs() if j["metadata"]["name"].startswith("frozen-")]) >= 2, 300,
             "a trial's job created after the edit")
    for job in release.jobs():
        c = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
        assert c["image"] == original, "a frozen edit reached a trial's job"
    assert _status(release, "frozen")["budget"]["hoursLimit"] == 0.3  # the allowed edit was taken
    # the edit reverted: accepted again
    release.custom.patch_namespaced_custom_object(*RUNS, "frozen",
                                                  {"spec": {"trialTemplate": live["spec"]["trialTemplate"]}})
    try:
        wait_for(lambda: (_cond(release, "frozen", "SpecAccepted") or {}).get("status") == "True", 60,
                 "SpecAccepted=True again")
    except TimeoutError:
        raise AssertionError((_cond(release, "frozen", "SpecAccepted"), release.run("frozen"))) from None
    release.custom.delete_namespaced_custom_object(*RUNS, "frozen")
    wait_for(lambda: release.run("frozen") is None, 60, "the run deleted")


def _patched(rel: Release, edit: dict[str, Any]) -> bool:
    """Whether ``edit`` was stored; False while the API server still calls the webhook (its configuration cache)."""
    try:
        rel.custom.patch_namespaced_custom_object(*RUNS, "frozen", edit)
        return True
    except client.exceptions.ApiException as err:
        if err.status == 422 and "validate-run.attune.dev" in str(err.body):
            return False
        raise


def _set(obj: dict[str, Any], path: list[str], value: Any) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    node = out
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return out


def test_a_trainjob_run_on_a_cluster_without_kubeflow_trainer_fails_with_a_clear_condition(
        release: Release, real_operator: Operator) -> None:
    """This control plane serves no trainer.kubeflow.org API (the TrainJob CRD is not installed): a cluster without
    Kubeflow Trainer."""
    served = {g.name for g in client.ApisApi(release.api).get_api_versions().groups}
    assert "kubeflow.org" in served and "trainer.kubeflow.org" not in served
    run = good_run("tj", "http://prom.ml.svc:9090", None)
    pod = run["spec"]["trialTemplate"]["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    run["spec"]["trialTemplate"] = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                                    "spec": {"runtimeRef": {"name": "torch-distributed"},
                                             "trainer": {"image": pod["containers"][0]["image"]}}}
    release.custom.create_namespaced_custom_object(*RUNS, run)
    st = wait_for(lambda: _status(release, "tj").get("phase") == "Failed" and _status(release, "tj"), 60,
                  "the run to fail")
    c = {x["type"]: x for x in st["conditions"]}
    assert c["BackendAvailable"]["reason"] == "CRDNotInstalled"
    assert "trainer.kubeflow.org/v1alpha1 trainjobs" in c["BackendAvailable"]["message"]
    assert c["Stalled"]["status"] == "True" and c["Ready"]["status"] == "False"
    wait_for(lambda: "PermanentError" in real_operator.log() or "permanently" in real_operator.log(), 30,
             "the operator to give the run up for good")
    assert not release.jobs()


@pytest.fixture()
def gpus_on_the_node(control_plane: ControlPlane) -> Iterator[Any]:
    """``advertise()`` makes the Node advertise one ``nvidia.com/gpu`` (what a device plugin does when its GPU
    becomes available); removed after the test."""
    node = control_plane.node
    assert node is not None

    def advertise(count: str | None = "1") -> None:
        control_plane.core.patch_node_status(node, {"status": {"capacity": {GPU: count},
                                                               "allocatable": {GPU: count}}})

    yield advertise
    advertise(None)


def test_a_trial_waiting_for_gpus_is_not_charged_and_its_job_name_is_valid(
        training_operator: Any, release: Release, real_operator: Operator, pod_metrics: Any, prometheus: Any,
        gpus_on_the_node: Any) -> None:
    """No free accelerators for longer than the trial deadline (plus its grace): the trial waits, uncharged, then
    runs and is measured; its run's name (a dot, upper-case-free but not a DNS label) gives a valid job name."""
    node = release.cp.core.read_node(release.cp.node)
    assert GPU not in (node.status.allocatable or {}), "the Node already has GPUs"
    run = _on_the_node(good_run("gpu.wait", prometheus.url, None))
    resources = _master(run)["resources"]
    resources["requests"][GPU] = resources["limits"][GPU] = 1
    run["spec"]["budget"].update(trialDeadlineSeconds=20, maxTrials=1)
    release.custom.create_namespaced_custom_object(*RUNS, run)
    name = job_name("gpu.wait", 1)
    assert valid_job_name(name) and name != "gpu.wait-t001"
    # the real scheduler's verdict on the trial's pod, as the operator reads it
    q = wait_for(lambda: (c := _cond(release, "gpu.wait", "TrialQueued")) and c["status"] == "True" and c, 120,
                 "the trial to wait for accelerators")
    assert q["reason"] == "Unschedulable" and f"Insufficient {GPU}" in q["message"]
    assert [j["metadata"]["name"] for j in release.jobs()] == [name]
    # the operator looks at the trial beyond trialDeadlineSeconds + its grace (20 + 30 s) while the pod cannot be
    # scheduled, and says so ("queued N s"): the old clock timed it out there
    def queued_beyond_the_deadline() -> bool:
        said = re.search(r"; queued (\d+) s", (_cond(release, "gpu.wait", "TrialQueued") or {}).get("message", ""))
        return bool(said) and int(said.group(1)) > 50 + 2

    wait_for(queued_beyond_the_deadline, 180, "the operator to see the trial queued beyond its deadline and grace")
    assert not release.records("gpu.wait"), "a trial waiting for accelerators was recorded"
    assert _status(release, "gpu.wait")["budget"]["hoursUsed"] == 0
    assert not release.master_running(name)
    gpus_on_the_node()  # a GPU frees up: the scheduler binds the pod, the pod runner runs it
    st = wait_for(lambda: _status(release, "gpu.wait").get("phase") in ("Succeeded", "Failed")
                  and _status(release, "gpu.wait"), 300, "the run to finish")
    [rec] = release.records("gpu.wait")
    assert rec["outcome"] == "succeeded", rec["message"]
    trial = release.trials()[0]["status"]
    assert trial["queuedSeconds"] >= 52 and rec["wall_s"] < trial["queuedSeconds"]
    assert rec["charged_hours"] == pytest.approx(rec["wall_s"] / 3600)
    assert st["queuedSeconds"] >= 52
