"""The results a team commits: the user's own trial template with exactly the kept changes, its patch, and output
objects that survive the run and are never written over when they are someone else's (attune.operator.results)."""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

from attune.operator import results
from attune.operator.reconcile import recipe_from_template, tuned_configmap
from attune.operator.resources import TuningRunSpec
from attune.recipe.io import parse_recipe
from tests.k8s.fakes import FakePorts, tuning_run

ROOT = Path(__file__).resolve().parents[2]


def hf_run():
    run = yaml.safe_load((ROOT / "examples" / "tuningrun-hf.yaml").read_text())
    run["metadata"] = {"name": "hf", "namespace": "ml", "uid": "uid-hf"}
    run["apiVersion"], run["kind"] = "attune.dev/v1alpha1", "TuningRun"
    return run


def _container(job):
    return job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]


class _State:
    def __init__(self, baseline):
        self.baseline = baseline

    def baseline_throughput(self):
        return 100.0

    def best_throughput(self):
        return 150.0


def test_hf_tuned_manifest_is_the_template_with_the_kept_change_and_the_users_command():
    run = hf_run()
    base = recipe_from_template(TuningRunSpec.model_validate(run["spec"]), "hf")
    best = base.with_knobs(per_device_train_batch_size=2)
    cm = tuned_configmap(run, best, _State(base))  # what the operator writes
    data = cm["data"]
    assert "launch.sh" not in data  # no script embedding the operator's interpreter
    tuned = yaml.safe_load(data["pytorchjob.yaml"])
    template = run["spec"]["trialTemplate"]
    c, t = _container(tuned), _container(template)
    assert c["command"] == ["python", "train.py"] and c["image"] == t["image"]
    assert c["args"][c["args"].index("--per_device_train_batch_size") + 1] == "2"
    assert c["args"][c["args"].index("--gradient_accumulation_steps") + 1] == "2"  # the global batch stays
    # nothing of attune's trial job: no trial labels, owner, deadline, retries or instrumentation
    text = data["pytorchjob.yaml"]
    for absent in ("attune.dev/trial", "ownerReferences", "activeDeadlineSeconds", "backoffLimit", "--logging_steps"):
        assert absent not in text, absent
    assert tuned["kind"] == "PyTorchJob" and tuned["metadata"]["name"] == "hf"
    # the patch turns the template into the tuned manifest, and touches only the container's args
    ops = yaml.safe_load(data[results.PATCH_KEY])
    start = copy.deepcopy(template)
    start["metadata"] = tuned["metadata"]
    assert results.apply_json_patch(start, ops) == tuned
    assert ops and all("/containers/0/args" in op["path"] for op in ops), ops
    assert "--per_device_train_batch_size" in data[results.DIFF_KEY]
    assert "python train.py" in data["command.sh"] and "/.venv/" not in data["command.sh"]


def test_reference_trainer_tuned_trainjob_is_extractable_and_clean():
    run = tuning_run()
    pod = run["spec"]["trialTemplate"]["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    run["spec"]["trialTemplate"] = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
        "spec": {"runtimeRef": {"name": "torch-distributed"},
                 "trainer": {"image": pod["containers"][0]["image"], "numNodes": 1}}}
    base = parse_recipe(run["spec"]["recipe"]["inline"], "inline")
    best = base.with_knobs(activation_checkpointing="none")
    cm = tuned_configmap(run, best, _State(base))
    tuned = yaml.safe_load(cm["data"]["trainjob.yaml"])  # kubectl ... jsonpath='{.data.trainjob\.yaml}'
    assert tuned["kind"] == "TrainJob" and tuned["spec"]["runtimeRef"] == {"name": "torch-distributed"}
    assert "activeDeadlineSeconds" not in tuned["spec"] and "labels" not in tuned["spec"]
    assert '"activation_checkpointing":"none"' in yaml.safe_dump(tuned).replace(" ", "") or \
        "activation_checkpointing" in cm["data"]["trainjob.yaml"]


def test_outputs_survive_the_run_unless_it_asks_and_carry_ownership_marks():
    run = hf_run()
    base = recipe_from_template(TuningRunSpec.model_validate(run["spec"]), "hf")
    cm = tuned_configmap(run, base.with_knobs(per_device_train_batch_size=2), _State(base))
    meta = cm["metadata"]
    assert meta["ownerReferences"] == []  # not garbage-collected with the run
    assert meta["labels"][results.MANAGED_BY] == "attune" and meta["labels"]["attune.dev/run"] == "hf"
    assert meta["annotations"][results.ANNOTATION_RUN_UID] == "uid-hf"
    run["spec"]["output"] = {"deleteWithRun": True}
    assert results.delete_with_run(run)


def test_a_foreign_configmap_of_that_name_is_never_written_over():
    run = hf_run()
    base = recipe_from_template(TuningRunSpec.model_validate(run["spec"]), "hf")
    cm = tuned_configmap(run, base, _State(base))
    assert results.write_decision(None, cm).action == "create"
    assert results.write_decision(copy.deepcopy(cm), cm).action == "replace"
    foreign = {"metadata": {"name": cm["metadata"]["name"], "labels": {"app": "team-a"}}, "data": {"x": "y"}}
    d = results.write_decision(foreign, cm)
    assert d.action == "foreign" and "hf-tuned" in d.message
    earlier = copy.deepcopy(cm)
    earlier["metadata"]["annotations"][results.ANNOTATION_RUN_UID] = "uid-of-an-earlier-run"
    assert results.write_decision(earlier, cm).action == "foreign"


def test_the_operator_writes_the_result_without_an_owner_reference():
    from tests.k8s.fakes import drive as _drive

    ports = FakePorts()
    run = _drive(tuning_run(), ports)
    assert run["status"]["phase"] == "Succeeded"
    cm = ports.configmaps[run["status"]["tunedRecipeRef"]["configMap"]]
    assert cm["metadata"]["ownerReferences"] == [] and "pytorchjob.yaml" in cm["data"]
    assert "launch.sh" not in cm["data"]


def test_the_output_write_never_overwrites_a_foreign_configmap_on_the_api(control_plane):
    """Against the real API server: create, replace our own (resourceVersion-checked), leave a foreign one."""
    from kubernetes import client

    from attune.operator.kube import Kube

    cp = control_plane
    ns = cp.namespace("results")
    core = client.CoreV1Api(cp.api)
    run = hf_run()
    run["metadata"]["namespace"] = ns
    base = recipe_from_template(TuningRunSpec.model_validate(run["spec"]), "hf")
    cm = tuned_configmap(run, base.with_knobs(per_device_train_batch_size=2), _State(base))
    k = Kube(cp.api)
    assert k.write_output_configmap(cm).action == "create"
    assert "pytorchjob.yaml" in core.read_namespaced_config_map(cm["metadata"]["name"], ns).data
    # our own output of the same run, tuned further: replaced (an identical write would change nothing on the server)
    better = tuned_configmap(run, base.with_knobs(per_device_train_batch_size=4), _State(base))
    assert k.write_output_configmap(better).action == "replace"
    assert core.read_namespaced_config_map(cm["metadata"]["name"], ns).data == better["data"]
    core.create_namespaced_config_map(ns, {"metadata": {"name": "other-tuned", "labels": {"team": "a"}},
                                           "data": {"mine": "keep"}})
    foreign = copy.deepcopy(cm)
    foreign["metadata"]["name"] = "other-tuned"
    decision = k.write_output_configmap(foreign)
    assert decision.action == "foreign" and "other-tuned" in decision.message
    assert core.read_namespaced_config_map("other-tuned", ns).data == {"mine": "keep"}
    cp.delete_namespace(ns)
