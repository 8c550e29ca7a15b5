"""Finding C through the operator: a Megatron trial template keeps its own command. ``recipe.fromTemplate:
{framework: megatron}`` imports the recipe from the template's command line, or from the script it runs when that
script is mounted from a ConfigMap (read through the reconciler's ConfigMap port); each trial's job runs the
template's command with exactly the changed flags edited (a script: a changed copy of it, run by the same shell with
the same arguments); a script baked into the image is refused, saying what to do. The script is our own, in the
form Megatron-LM's example scripts use (tests/frameworks/megatron/fixtures/train_gpt3_distributed.sh)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from attune.operator import reconcile as rc
from attune.operator.reconcile import recipe_from_template, reconcile
from attune.operator.resources import TuningRunSpec, template_frameworks
from attune.operator.webhook import run_problems
from tests.frameworks.megatron.helpers import FIXTURES, changed_lines, changed_tokens
from tests.k8s.fakes import FakePorts, tuning_run

pytestmark = pytest.mark.k8s

TEXT = (FIXTURES / "train_gpt3_distributed.sh").read_text()
PATH = "/scripts/run.sh"
ARGV = ["torchrun", "--nproc_per_node", "8", "pretrain_gpt.py", "--num-layers", "24", "--hidden-size", "2048",
        "--num-attention-heads", "16", "--seq-length", "2048", "--max-position-embeddings", "2048",
        "--micro-batch-size", "1", "--global-batch-size", "256", "--train-iters", "500000", "--lr", "6.0e-5", "--bf16",
        "--mock-data", "--vocab-size", "50257", "--tensor-model-parallel-size", "2", "--log-interval", "100"]


def megatron_run(command: list[str], args: list[str], *, configmap: bool = False, kind: str = "PyTorchJob"):
    run = tuning_run(searchSpace=["micro_batch_size"])
    run["spec"]["recipe"] = {"fromTemplate": {"framework": "megatron", "accelerator": "h100-sxm-80gb"}}
    c: dict[str, Any] = {"name": "pytorch", "image": "nvcr.io/nvidia/pytorch:25.01-py3", "command": command,
                         "args": args, "workingDir": "/workspace/megatron-lm"}
    volumes = [{"name": "scripts", "configMap": {"name": "megatron-run"}}] if configmap else []
    mounts = [{"name": "scripts", "mountPath": "/scripts"}] if configmap else []
    if kind == "TrainJob":
        c.pop("name")
        run["spec"]["containerName"] = "node"
        run["spec"]["trialTemplate"] = {
            "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "spec": {"runtimeRef": {"name": "torch-distributed"}, "trainer": {**c, "numNodes": 1},
                     "podSpecOverrides": [{"targetJobs": [{"name": "node"}], "volumes": volumes,
                                           "containers": [{"name": "node", "volumeMounts": mounts}]}]}}
    else:
        pod = run["spec"]["trialTemplate"]["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
        pod["containers"] = [{**c, "volumeMounts": mounts}]
        pod["volumes"] = volumes
    return run


def ports_with_script() -> FakePorts:
    ports = FakePorts()
    ports.configmaps["megatron-run"] = {"metadata": {"name": "megatron-run"}, "data": {"run.sh": TEXT}}
    return ports


def trial(index, change):
    return {"apiVersion": "attune.dev/v1alpha1", "kind": "TuningTrial",
            "metadata": {"name": f"r-t{index:03d}", "namespace": "ml", "uid": "u"},
            "spec": {"index": index, "change": change}}


def first_job(run, ports):
    for _ in range(6):
        res = reconcile(run, ports)
        run["status"] = {k: v for k, v in {**(run.get("status") or {}), **res.status}.items() if v is not None}
        if ports.jobs or run["status"].get("phase") == "Failed":
            break
    assert ports.jobs, run["status"].get("conditions")
    return run, next(iter(ports.jobs.values()))


def container_of(job):
    if job["kind"] == "TrainJob":
        return job["spec"]["trainer"]
    return job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]


def test_megatron_is_a_template_framework():
    assert "megatron" in template_frameworks()


@pytest.mark.parametrize("kind", ["PyTorchJob", "TrainJob"])
def test_a_command_line_in_args_is_imported_and_the_trial_keeps_the_command(kind):
    run = megatron_run(ARGV[:1], ARGV[1:], kind=kind)
    assert run_problems(run) == []
    run, job = first_job(run, FakePorts())
    c = container_of(job)
    assert c["command"] == ["torchrun"] and c["image"] == "nvcr.io/nvidia/pytorch:25.01-py3"
    removed, added = changed_tokens(ARGV[1:], c["args"])
    assert removed == ["100"] and added == ["1", "--log-throughput", "--eval-iters", "0", "--exit-interval", "62"]
    base = rc.parse_recipe(run["status"]["baselineRecipe"], "baseline")
    trial_job = rc.build_job(run, trial(9, {"micro_batch_size": 2}), base.with_knobs(micro_batch_size=2))
    assert changed_tokens(c["args"], container_of(trial_job)["args"]) == (["1"], ["2"])


@pytest.mark.parametrize("kind", ["PyTorchJob", "TrainJob"])
def test_a_script_mounted_from_a_configmap_runs_as_a_changed_copy(kind):
    run = megatron_run(["bash", PATH], ["/ckpt", "/tb"], configmap=True, kind=kind)
    ports = ports_with_script()
    assert run_problems(run, None, ports.read_configmap) == []
    run, job = first_job(run, ports)
    c = container_of(job)
    assert c["command"] == ["bash", "-c"] and c["args"][1:] == [PATH, "/ckpt", "/tb"]
    removed, added = changed_lines(TEXT, c["args"][0])
    assert "    --micro-batch-size 1" not in removed and "    --log-interval 1" in added  # baseline: instrumentation


def test_the_recipe_is_read_from_the_mounted_script_through_the_configmap_port():
    run = megatron_run(["bash", PATH], ["/ckpt", "/tb"], configmap=True)
    ports = ports_with_script()
    recipe = recipe_from_template(TuningRunSpec.model_validate(run["spec"]), "r", read_configmap=ports.read_configmap,
                                  namespace="ml")
    assert recipe.launch.files[PATH] == TEXT and recipe.knobs["tensor_model_parallel_size"] == 2
    # the trial's job: a copy of the script with exactly the changed flag
    base_job = rc.build_job(run, trial(1, {}), recipe)
    job = rc.build_job(run, trial(2, {"micro_batch_size": 2}), recipe.with_knobs(micro_batch_size=2))
    assert changed_lines(container_of(base_job)["args"][0], container_of(job)["args"][0]) == (
        ["    --micro-batch-size 1"], ["    --micro-batch-size 2"])
    missing = FakePorts()
    with pytest.raises(rc.RecipeError, match="ConfigMap megatron-run key run.sh"):
        recipe_from_template(TuningRunSpec.model_validate(run["spec"]), "r", read_configmap=missing.read_configmap)


def test_a_script_baked_into_the_image_is_refused_by_the_webhook_and_the_run():
    run = megatron_run(["bash", "run.sh"], [])
    problems = run_problems(run)
    assert len(problems) == 1 and "/workspace/megatron-lm/run.sh" in problems[0], problems
    assert "put the script in a ConfigMap" in problems[0] and "command line itself" in problems[0]
    res = reconcile(copy.deepcopy(run), FakePorts())
    assert res.status["phase"] == "Failed"
    cond = next(c for c in res.status["conditions"] if c["type"] == "RecipeValid")
    assert cond["status"] == "False" and "put the script in a ConfigMap" in cond["message"]


def test_the_tuned_manifest_keeps_the_templates_script_with_only_the_kept_change():
    from attune.operator.results import tuned_manifest

    run = megatron_run(["bash", PATH], ["/ckpt", "/tb"], configmap=True)
    ports = ports_with_script()
    recipe = recipe_from_template(TuningRunSpec.model_validate(run["spec"]), "r", read_configmap=ports.read_configmap,
                                  namespace="ml")
    tuned = tuned_manifest(run, recipe.with_knobs(micro_batch_size=2), recipe)
    c = container_of(tuned)
    assert c["args"][1:] == [PATH, "/ckpt", "/tb"] and c["command"] == ["bash", "-c"]
    assert changed_lines(TEXT, c["args"][0]) == (["    --micro-batch-size 1"], ["    --micro-batch-size 2"])
    assert tuned_manifest(run, recipe, recipe) == {**run["spec"]["trialTemplate"], **{
        k: tuned[k] for k in ("apiVersion", "kind", "metadata")}}  # no change: the template as it is
