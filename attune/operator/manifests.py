"""Pure builders of the objects the operator creates: TuningTrials and the PyTorchJob that runs each trial.

A trial's job is the run's ``trialTemplate`` with only these changes: the name, labels and owner reference;
the run policy (deadline, no retries); and what the recipe's framework changes (``Framework.patch_job``):
``nprocPerNode`` and the training container, e.g. the reference trainer's launch and spec, or the user's own
command with the knob change applied to its arguments. Image, resources, volumes and node selectors stay as
given. Trials measured from their pod log keep their pods after the job ends (``cleanPodPolicy: None`` unless
the template says otherwise), so a failed trial's log can still be read.
"""

from __future__ import annotations

import copy
import shlex
from dataclasses import dataclass
from typing import Any

from attune.operator.resources import API_VERSION, LABEL_INDEX, LABEL_RUN, LABEL_TRIAL, TuningRunSpec
from attune.recipe.model import Recipe


@dataclass(frozen=True)
class TemplateLaunch:
    """The user's own launch as the trial template runs it: rank 0's training container's command and args."""

    argv: tuple[str, ...]
    cwd: str
    env: dict[str, str]
    replica: str  # replica type whose container it is (Master, or Worker without one)
    processes: int | None  # spec.nprocPerNode when it is a number
    nodes: int  # pods of the job (Master plus Worker replicas)
    container: dict[str, Any]  # the container itself
    job_spec: dict[str, Any]  # the template's spec


def template_launch(spec: TuningRunSpec) -> TemplateLaunch:
    """The training container's launch in ``spec.trialTemplate``; :class:`ValueError` saying what is missing."""
    jspec = spec.trial_template.get("spec") or {}
    replicas = jspec.get("pytorchReplicaSpecs") or {}
    if not replicas:
        raise ValueError("spec.trialTemplate.spec.pytorchReplicaSpecs is empty: give at least a Master replica")
    rtype = "Master" if "Master" in replicas else sorted(replicas)[0]
    pod = ((replicas[rtype] or {}).get("template") or {}).get("spec") or {}
    container = next((c for c in pod.get("containers") or [] if c.get("name") == spec.container_name), None)
    if container is None:
        raise ValueError(f"replica {rtype} has no container named {spec.container_name!r} (spec.containerName)")
    argv = [str(a) for a in (container.get("command") or []) + (container.get("args") or [])]
    if not container.get("command"):
        raise ValueError(f"the {rtype} container {spec.container_name!r} sets no command: the operator cannot see "
                         "the image's entrypoint, so give the launch as command (and args)")
    env = {e["name"]: str(e["value"]) for e in container.get("env") or [] if "name" in e and "value" in e}
    nproc = str(jspec.get("nprocPerNode", "")).strip()
    nodes = sum(int((r or {}).get("replicas", 1) or 0) for r in replicas.values())
    return TemplateLaunch(argv=tuple(argv), cwd=str(container.get("workingDir") or "/"), env=env, replica=rtype,
                          processes=int(nproc) if nproc.isdigit() and int(nproc) > 0 else None,
                          nodes=max(nodes, 1), container=copy.deepcopy(container), job_spec=copy.deepcopy(jspec))


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
    policy.setdefault("cleanPodPolicy", "None" if getattr(fw, "metrics_source", "logs") == "logs" else "All")
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
