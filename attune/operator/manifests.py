"""Pure builders of the objects the operator creates: TuningTrials and the PyTorchJob that runs each trial.

A trial's job is the run's ``trialTemplate`` with only these changes: the name, labels and owner reference;
``nprocPerNode`` and the run policy (deadline, no retries); and, in the training container, the launch
command, the knob environment and the trial spec. Image, resources, volumes and node selectors stay as given.
"""

from __future__ import annotations

import copy
import shlex
from typing import Any

from attune.operator.resources import API_VERSION, LABEL_INDEX, LABEL_RUN, LABEL_TRIAL, TuningRunSpec
from attune.recipe.model import Recipe



def trial_name(run_name: str, index: int) -> str:
    """Deterministic trial (and job) name: ``<run>-t<NNN>``."""
    return f"{run_name}-t{index:03d}"


def owner_ref(obj: dict[str, Any], controller: bool = True) -> dict[str, Any]:
    """An ownerReference to ``obj`` (which must carry a uid)."""
    meta = obj["metadata"]
    return {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": meta["name"], "uid": meta["uid"],
            "controller": controller, "blockOwnerDeletion": True}


def build_trial(run: dict[str, Any], index: int, kind: str, change: dict[str, Any], knobs: dict[str, Any],
                source: str, rationale: str) -> dict[str, Any]:
    """The TuningTrial object for one attempted configuration of ``run``."""
    meta = run["metadata"]
    name = trial_name(meta["name"], index)
    return {
        "apiVersion": API_VERSION, "kind": "TuningTrial",
        "metadata": {"name": name, "namespace": meta["namespace"],
                     "labels": {LABEL_RUN: meta["name"], LABEL_TRIAL: name, LABEL_INDEX: str(index)},
                     "ownerReferences": [owner_ref(run)]},
        "spec": {"runRef": meta["name"], "index": index, "kind": kind, "change": dict(change), "knobs": dict(knobs),
                 "proposal": {"source": source, "rationale": rationale}},
    }


def build_pytorchjob(run: dict[str, Any], trial: dict[str, Any], recipe: Recipe) -> dict[str, Any]:
    """The ``kubeflow.org/v1`` PyTorchJob that runs ``trial`` (a TuningTrial with a uid) of ``run``."""
    spec = TuningRunSpec.model_validate(run["spec"])
    steps = spec.metrics.warmup_steps + spec.metrics.measure_steps
    fw = recipe.framework_impl
    job = copy.deepcopy(spec.trial_template)
    tmeta = trial["metadata"]
    labels = {LABEL_RUN: run["metadata"]["name"], LABEL_TRIAL: tmeta["name"],
              LABEL_INDEX: str(trial["spec"]["index"])}
    job["apiVersion"] = job.get("apiVersion") or "kubeflow.org/v1"
    job["kind"] = job.get("kind") or "PyTorchJob"
    job["metadata"] = {"name": tmeta["name"], "namespace": tmeta["namespace"],
                       "labels": {**(job.get("metadata") or {}).get("labels", {}), **labels},
                       "annotations": {**(job.get("metadata") or {}).get("annotations", {}),
                                       "attune.dev/change": shlex.join(f"{k}={v}" for k, v in
                                                                       trial["spec"]["change"].items())},
                       "ownerReferences": [owner_ref(trial)]}
    jspec = job.setdefault("spec", {})
    policy = jspec.setdefault("runPolicy", {})
    policy["activeDeadlineSeconds"] = spec.budget.trial_deadline_seconds
    policy["backoffLimit"] = 0
    policy.setdefault("cleanPodPolicy", "All")
    replicas = jspec.get("pytorchReplicaSpecs") or {}
    if not replicas:
        raise ValueError("trialTemplate.spec.pytorchReplicaSpecs is empty: give at least a Master replica")
    for rtype, rspec in replicas.items():
        pod = rspec.setdefault("template", {})
        pod.setdefault("metadata", {}).setdefault("labels", {}).update(labels)
        containers = pod.setdefault("spec", {}).get("containers") or []
        target = [c for c in containers if c.get("name") == spec.container_name]
        if not target:
            raise ValueError(f"replica {rtype} has no container named {spec.container_name!r}")
        fw.patch_job(recipe, job, target[0], steps=steps, metrics_port=spec.metrics.metrics_port,
                     linger_s=spec.metrics.linger_seconds)
    return job
