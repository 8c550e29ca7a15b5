"""Pure builders of a finished run's results, the objects a team commits (GitOps).

The result of a TuningRun is the user's own ``spec.trialTemplate`` with exactly the kept changes applied
(:func:`tuned_manifest`): the template's kind, metadata, image, resources and the user's own command, never
attune's trial job (no trial labels, names, owner references, deadlines or measurement instrumentation). With it
come an RFC 6902 JSON patch from the template to the tuned manifest (:func:`json_patch`) and a unified diff of the
two as YAML, so a reviewer sees the change in one glance. They are written into the ConfigMap ``<run>-tuned``
(:func:`tuned_configmap`) under keys ``kubectl`` can extract, e.g.
``kubectl get cm <run>-tuned -o jsonpath='{.data.trainjob\\.yaml}'``.

**Ownership.** Each output object is marked as attune's output of one run: labels
``app.kubernetes.io/managed-by: attune`` and ``attune.dev/run: <run>``, and annotation ``attune.dev/run-uid``. A
write may replace an existing object of that name only when it carries these marks for the same run
(:func:`write_decision`); anything else is someone else's object and is never written over. Output objects
survive the run's deletion (no owner reference) unless the run asks otherwise
(``spec.output.deleteWithRun: true``).
"""

from __future__ import annotations

import copy
import difflib
import json
import shlex
from dataclasses import dataclass
from typing import Any, Literal

import yaml

from attune.errors import RecipeError
from attune.operator import kubeyaml
from attune.operator.backends import backend_for, owner_ref
from attune.operator.resources import LABEL_RUN, TuningRunSpec, label_value
from attune.recipe.io import recipe_to_dict
from attune.recipe.model import Recipe

#: the standard label saying which tool manages an object
MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "attune"
#: annotation holding the uid of the run an output object belongs to
ANNOTATION_RUN_UID = "attune.dev/run-uid"
#: label marking the tuned-result ConfigMap of a run
LABEL_TUNED = "attune.dev/tuned-recipe"
#: the data key of the JSON patch (template → tuned manifest) and of its unified diff
PATCH_KEY = "tuned.patch.json"
DIFF_KEY = "tuned.diff"


def manifest_key(kind: str) -> str:
    """The data key holding the tuned manifest of a template of ``kind`` (``pytorchjob.yaml``, ``trainjob.yaml``)."""
    return f"{kind.lower()}.yaml"


def delete_with_run(run: dict[str, Any]) -> bool:
    """Whether the run's outputs are garbage-collected with it (``spec.output.deleteWithRun``, default false)."""
    out = (run.get("spec") or {}).get("output") or {}
    return bool(isinstance(out, dict) and out.get("deleteWithRun") is True)


def ownership_marks(run: dict[str, Any]) -> tuple[dict[str, str], dict[str, str]]:
    """(labels, annotations) marking an object as attune's output of ``run``."""
    meta = run["metadata"]
    labels = {MANAGED_BY: MANAGER, LABEL_RUN: label_value(str(meta["name"]))}
    annotations = {ANNOTATION_RUN_UID: str(meta.get("uid") or "")}
    return labels, annotations


# -- the tuned manifest ----------------------------------------------------------------------------------------------

def _containers(job: dict[str, Any], spec: TuningRunSpec) -> list[dict[str, Any]]:
    """The training containers of ``job`` (each replica's for a PyTorchJob, ``spec.trainer`` for a TrainJob)."""
    jspec = job.get("spec") or {}
    if job.get("kind") == "TrainJob":
        trainer = jspec.get("trainer")
        return [trainer] if isinstance(trainer, dict) else []
    out = []
    for rspec in (jspec.get("pytorchReplicaSpecs") or {}).values():
        pod = ((rspec or {}).get("template") or {}).get("spec") or {}
        out += [c for c in pod.get("containers") or [] if c.get("name") == spec.container_name]
    return out


def _set_env(container: dict[str, Any], values: dict[str, str]) -> None:
    if not values:
        return
    env = [e for e in container.get("env") or [] if e.get("name") not in values]
    env += [{"name": k, "value": v} for k, v in sorted(values.items())]
    container["env"] = env


def _render(recipe: Recipe) -> Any:
    fw = recipe.framework_impl
    if fw.name == "hf":  # the Kubernetes form of the launch (the pods' launcher, not a standalone one)
        from attune.frameworks.hf import render_launch

        return render_launch(recipe, k8s=True)
    return fw.render(recipe)


def tuned_manifest(run: dict[str, Any], best: Recipe, baseline: Recipe) -> dict[str, Any]:
    """The user's ``spec.trialTemplate`` with exactly the kept changes (``baseline`` → ``best``) applied.

    Launch-based frameworks (HF, torchtitan, Megatron) keep the user's command: the tuned launch goes into the
    container's ``args`` where it still starts with the container's ``command``, and only the environment
    variables the changes set are added. The reference trainer (framework ``torch``) runs attune's trainer from
    the image, configured by its spec environment variable, for the recipe's full training. Nothing of attune's
    trial job is added: no trial labels or names, owner references, deadlines, retries or instrumentation."""
    spec = TuningRunSpec.model_validate(run["spec"])
    backend = backend_for(spec.trial_template)
    job = copy.deepcopy(spec.trial_template)
    job["apiVersion"], job["kind"] = backend.api_version, backend.kind
    meta = dict(job.get("metadata") or {})
    meta.setdefault("name", run["metadata"]["name"])
    meta.setdefault("namespace", run["metadata"]["namespace"])
    job["metadata"] = meta
    containers = _containers(job, spec)
    if not containers:
        raise ValueError(f"the trial template has no training container {spec.container_name!r}")
    fw = best.framework_impl
    changes = baseline.knob_changes(best.knobs)
    if not changes:
        return job
    apply = getattr(fw, "apply_to_container", None)  # a framework that edits the user's own launch in place
    if apply is not None and best.launch is not None:
        for c in containers:
            apply(best, c)  # e.g. a Megatron template's `bash /scripts/run.sh`: its command stays, its flags change
    elif best.launch is not None:
        tuned, before = _render(best), _render(baseline)
        from attune.frameworks.cmdline import set_container_argv

        for c in containers:
            set_container_argv(c, list(tuned.argv))
            _set_env(c, {k: str(v) for k, v in tuned.env.items() if before.env.get(k) != v})
    else:  # the reference trainer: its spec (the recipe, full length) is what the tuned job runs
        steps = best.training.steps if best.training is not None else 0
        for c in containers:
            if job["kind"] == "TrainJob":
                shim: dict[str, Any] = {"kind": "PyTorchJob", "spec": {}}
                fw.patch_job(best, shim, c, steps=steps, metrics_port=spec.metrics.metrics_port, linger_s=0)
                nproc = str(shim["spec"].get("nprocPerNode", "")).strip()
                if nproc:
                    c["numProcPerNode"] = int(nproc) if nproc.isdigit() else nproc
                c.pop("ports", None)
                c.pop("name", None)
            else:
                fw.patch_job(best, job, c, steps=steps, metrics_port=spec.metrics.metrics_port, linger_s=0)
    return job


def command_script(manifest: dict[str, Any], spec: TuningRunSpec, run_name: str) -> str:
    """The tuned job's own command as a shell script (the user's image runs it; no path of the operator's)."""
    container = _containers(manifest, spec)[0]
    env = "".join(f"export {e['name']}={shlex.quote(str(e['value']))}\n" for e in container.get("env") or []
                  if "name" in e and "value" in e)
    cd = f"cd {shlex.quote(str(container['workingDir']))}\n" if container.get("workingDir") else ""
    argv = [str(a) for a in (container.get("command") or []) + (container.get("args") or [])]
    line = shlex.join(argv) if argv else "# the image's own entrypoint (the template sets no command)"
    return f"#!/bin/sh\n# tuned by attune (TuningRun {run_name}): the training container's command\n{env}{cd}{line}\n"


# -- the patch -------------------------------------------------------------------------------------------------------

def json_patch(before: Any, after: Any) -> list[dict[str, Any]]:
    """An RFC 6902 JSON patch turning ``before`` into ``after`` (the ``jsonpatch`` library's diff)."""
    import jsonpatch

    return list(jsonpatch.make_patch(before, after).patch)


def apply_json_patch(doc: Any, ops: list[dict[str, Any]]) -> Any:
    """``doc`` with ``ops`` applied (``doc`` itself unchanged)."""
    import jsonpatch

    return jsonpatch.apply_patch(doc, ops, in_place=False)


def unified_diff(before: dict[str, Any], after: dict[str, Any], name: str) -> str:
    a = kubeyaml.dump(before).splitlines(keepends=True)
    b = kubeyaml.dump(after).splitlines(keepends=True)
    return "".join(difflib.unified_diff(a, b, f"a/{name}", f"b/{name}"))


# -- the output ConfigMap --------------------------------------------------------------------------------------------

def tuned_configmap_name(run_name: str) -> str:
    return run_name[:240] + "-tuned"


def tuned_configmap(run: dict[str, Any], best: Recipe, baseline: Recipe, summary: dict[str, Any]) -> dict[str, Any]:
    """The ConfigMap ``<run>-tuned``: ``recipe.yaml``, ``summary.yaml``, the tuned manifest
    (``pytorchjob.yaml`` / ``trainjob.yaml``), its JSON patch against the template (``tuned.patch.json``) and unified
    diff (``tuned.diff``), and the tuned container's own command (``command.sh``). Marked as attune's output of the
    run; owned by the run (deleted with it) only with ``spec.output.deleteWithRun: true``."""
    meta = run["metadata"]
    data = {"recipe.yaml": yaml.safe_dump(recipe_to_dict(best), sort_keys=False),
            "summary.yaml": yaml.safe_dump(summary, sort_keys=False)}
    annotations: dict[str, str] = {}
    try:
        spec = TuningRunSpec.model_validate(run.get("spec") or {})
        manifest = tuned_manifest(run, best, baseline)
    except (RecipeError, NotImplementedError, TypeError, ValueError, KeyError) as err:  # ValidationError too
        annotations["attune.dev/manifest-error"] = str(err)[:1000]
    else:
        template = copy.deepcopy(spec.trial_template)
        template["apiVersion"], template["kind"] = manifest["apiVersion"], manifest["kind"]
        template["metadata"] = manifest["metadata"]
        key = manifest_key(manifest["kind"])
        data[key] = kubeyaml.dump(manifest)  # for kubectl apply: strings Go's YAML would misread are quoted
        data[PATCH_KEY] = json.dumps(json_patch(template, manifest), indent=2) + "\n"
        data[DIFF_KEY] = unified_diff(template, manifest, key)
        data["command.sh"] = command_script(manifest, spec, meta["name"])
    labels, marks = ownership_marks(run)
    labels[LABEL_TUNED] = "true"
    owners = [owner_ref(run, controller=False)] if meta.get("uid") and delete_with_run(run) else []
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": tuned_configmap_name(meta["name"]), "namespace": meta["namespace"],
                         "labels": labels, "annotations": {**marks, **annotations}, "ownerReferences": owners},
            "data": data}


# -- ownership of a write ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class WriteDecision:
    """What to do with an output object: ``create`` it, ``replace`` our own, or leave a ``foreign`` one alone
    (``message`` says whose it is)."""

    action: Literal["create", "replace", "foreign"]
    message: str = ""


def write_decision(existing: dict[str, Any] | None, desired: dict[str, Any]) -> WriteDecision:
    """Whether ``desired`` may be written over ``existing`` (the object of that name, None where there is none):
    only when ``existing`` is marked as attune's output of the same run (managed-by label, run label and run uid
    annotation; an object of an earlier run of that name, with another uid, is not ours)."""
    if existing is None:
        return WriteDecision("create")
    meta = desired["metadata"]
    emeta = existing.get("metadata") or {}
    labels, annotations = emeta.get("labels") or {}, emeta.get("annotations") or {}
    kind, name = desired.get("kind", "object"), f"{meta.get('namespace', '')}/{meta['name']}"
    want_run = (meta.get("labels") or {}).get(LABEL_RUN)
    want_uid = (meta.get("annotations") or {}).get(ANNOTATION_RUN_UID)
    if labels.get(MANAGED_BY) != MANAGER or labels.get(LABEL_RUN) != want_run:
        who = labels.get(MANAGED_BY) or "someone else"
        return WriteDecision("foreign", f"{kind} {name} exists and is not attune's output of run {want_run} "
                                        f"(managed by {who}); it was left as it is: delete or rename it, or "
                                        "rename the run")
    if want_uid and annotations.get(ANNOTATION_RUN_UID) not in (None, "", want_uid):
        return WriteDecision("foreign", f"{kind} {name} is the output of an earlier run named {want_run} (uid "
                                        f"{annotations.get(ANNOTATION_RUN_UID)}); it was left as it is: delete it "
                                        "to write this run's")
    return WriteDecision("replace")


__all__ = ["ANNOTATION_RUN_UID", "DIFF_KEY", "LABEL_TUNED", "MANAGED_BY", "MANAGER", "PATCH_KEY", "WriteDecision",
           "apply_json_patch", "command_script", "delete_with_run", "json_patch", "manifest_key", "ownership_marks",
           "tuned_configmap", "tuned_configmap_name", "tuned_manifest", "unified_diff", "write_decision"]
