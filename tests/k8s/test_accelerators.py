"""Issue 39, item 7: a trial is charged for the accelerators its pods request, and ``nprocPerNode: auto`` resolves
to them (torchrun starts a process per visible GPU): a template with ``nvidia.com/gpu: 8`` was charged as one."""

from __future__ import annotations

import yaml

from attune.operator.backends import accelerators_of, template_accelerators
from attune.operator.reconcile import recipe_from_template
from attune.operator.resources import TuningRunSpec
from tests.k8s.conftest import ROOT
from tests.k8s.fakes import FakePorts, drive, records, tuning_run


def _master(template: dict) -> dict:
    return template["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]


def test_accelerator_resources_are_counted_by_their_device_plugins_names():
    assert accelerators_of({"limits": {"nvidia.com/gpu": "8", "cpu": "16", "memory": "64Gi"}}) == 8
    assert accelerators_of({"requests": {"amd.com/gpu": 2}}) == 2
    assert accelerators_of({"limits": {"nvidia.com/mig-1g.10gb": "3", "habana.ai/gaudi": "1"}}) == 4
    assert accelerators_of({"limits": {"cpu": "2", "example.com/fpga": "1"}}) == 0


def test_nproc_auto_is_the_pods_gpus_and_workers_count_too():
    run = yaml.safe_load((ROOT / "examples" / "tuningrun-hf.yaml").read_text())
    run["spec"]["recipe"]["fromTemplate"].pop("devicesPerNode")  # the example says 1: here the pods say
    template = run["spec"]["trialTemplate"]
    template["spec"]["nprocPerNode"] = "auto"
    _master(template)["resources"] = {"limits": {"nvidia.com/gpu": 8}}
    spec = TuningRunSpec.model_validate(run["spec"])
    recipe = recipe_from_template(spec, "hf", read_configmap=lambda *a: "")
    assert recipe.resources.devices_per_node == 8  # not 1
    worker = {"replicas": 3, "template": template["spec"]["pytorchReplicaSpecs"]["Master"]["template"]}
    template["spec"]["pytorchReplicaSpecs"]["Worker"] = worker
    assert template_accelerators(template) == (8, 32)
    trainjob = {"kind": "TrainJob", "spec": {"trainer": {"numNodes": 2, "resourcesPerNode": {
        "limits": {"nvidia.com/gpu": 4}}}}}
    assert template_accelerators(trainjob) == (4, 8)


def test_a_trial_is_charged_for_the_gpus_its_pods_hold_not_the_processes_it_starts():
    ports = FakePorts()
    run = tuning_run()
    _master(run["spec"]["trialTemplate"])["resources"] = {"limits": {"nvidia.com/gpu": "4", "cpu": "2"}}
    drive(run, ports, steps=30)
    recs = [r for r in records(ports, run) if r.get("wall_s")]
    assert recs, "no trial ran"
    for r in recs:  # the recipe's one process per node, the pod's four GPUs held
        assert abs(r["charged_hours"] - 4 * r["wall_s"] / 3600) < 1e-9, r
