"""Pure builders of the objects the operator creates: TuningTrials and the job (PyTorchJob or TrainJob, see
:mod:`attune.operator.backends`) that runs each trial.

A trial's job is the run's ``trialTemplate`` with only these changes: the name, labels and owner reference;
the run policy (a backstop deadline, no retries; suspended where Kueue queues it); and what the recipe's framework
changes (``Framework.patch_job``):
``nprocPerNode`` and the training container, e.g. the reference trainer's launch and spec, or the user's own
command with the knob change applied to its arguments. Image, resources, volumes and node selectors stay as
given. Trials measured from their pod log keep their pods after the job ends (``cleanPodPolicy: None`` unless
the template says otherwise), so a failed trial's log can still be read; the others keep their finished pods
(``Running``: only pods still running go), so a failed trainer's exit code and an OOM kill can be read.
"""

from __future__ import annotations

from typing import Any

from attune.operator.backends import TemplateLaunch, backend_for, job_name, owner_ref
from attune.operator.resources import (
    API_VERSION,
    LABEL_INDEX,
    LABEL_RUN,
    LABEL_TRIAL,
    TuningRunSpec,
    label_value,
)
from attune.recipe.model import Recipe

__all__ = ["TemplateLaunch", "build_job", "build_pytorchjob", "build_trial", "owner_ref", "template_launch",
           "trial_name"]


def template_launch(spec: TuningRunSpec) -> TemplateLaunch:
    """The training container's launch in ``spec.trialTemplate`` (a PyTorchJob's or a TrainJob's); :class:`ValueError`
    saying what is missing."""
    return backend_for(spec.trial_template).template_launch(spec)


def trial_name(run_name: str, index: int) -> str:
    """Deterministic TuningTrial name: ``<run>-t<NNN>`` (its job's name is :func:`backends.job_name`)."""
    name = f"{run_name}-t{index:03d}"
    if len(name) > 253:
        import hashlib

        name = f"{run_name[:240]}-{hashlib.sha256(run_name.encode()).hexdigest()[:6]}-t{index:03d}"
    return name


def build_trial(run: dict[str, Any], index: int, kind: str, change: dict[str, Any], knobs: dict[str, Any],
                source: str, rationale: str) -> dict[str, Any]:
    """The TuningTrial object for one attempted configuration of ``run``."""
    meta = run["metadata"]
    name = trial_name(meta["name"], index)
    return {
        "apiVersion": API_VERSION, "kind": "TuningTrial",
        "metadata": {"name": name, "namespace": meta["namespace"],
                     "labels": {LABEL_RUN: label_value(meta["name"]), LABEL_TRIAL: label_value(name),
                                LABEL_INDEX: str(index)},
                     "ownerReferences": [owner_ref(run)]},
        "spec": {"runRef": meta["name"], "index": index, "kind": kind, "change": dict(change), "knobs": dict(knobs),
                 "proposal": {"source": source, "rationale": rationale}},
    }


def build_pytorchjob(run: dict[str, Any], trial: dict[str, Any], recipe: Recipe) -> dict[str, Any]:
    """The ``kubeflow.org/v1`` PyTorchJob that runs ``trial`` (a TuningTrial with a uid) of ``run``."""
    return build_job(run, trial, recipe)


def build_job(run: dict[str, Any], trial: dict[str, Any], recipe: Recipe, attempt: int = 0) -> dict[str, Any]:
    """The job (of the backend the run's trial template names) that runs ``trial`` of ``run``."""
    backend = backend_for(run["spec"].get("trialTemplate") or {})
    return backend.build(run, trial, recipe, job_name(run["metadata"]["name"], int(trial["spec"]["index"]), attempt))
