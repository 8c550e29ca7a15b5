"""The operator's state machine: one level-triggered step over a TuningRun's status and what it observes.

Everything the run knows lives in ``status.records`` (the engine's trial records, like the CLI's journal)
and in its child TuningTrials, whose names are deterministic (``<run>-t<NNN>``, NNN = record id). Each
call of :func:`reconcile` folds them into the engine's :class:`~attune.engine.loop.RunState`, asks the
engine's pure :func:`~attune.engine.loop.next_action`, and does at most one thing. A restarted operator
therefore continues where it stopped: a trial whose record exists is never run or charged again, and a
trial object that exists without a record is the one in flight.

I/O goes through the :class:`Ports` protocol (the Kubernetes API, Prometheus, pod logs, the agent); the
decisions here are plain functions of their answers, so tests drive them with fakes.

A trial is measured where its framework says (``Framework.metrics_source``): through Prometheus, once its
job has ended (the reference trainer runs exactly the steps asked for and serves them as metrics), or from
its master pod's log (the user's own job), as soon as the log holds warm-up plus measurement steps; that job
is then stopped on the next step, after the record is stored, so a restart between the two loses nothing.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import math
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol


from attune.backends.base import TrialResult
from attune.engine.budget import charge
from attune.engine.measure import summarise
from attune.engine.loop import (
    RunState, TuneConfig, calibration_change, decide, gate_proposal, loss_check_record, next_action, refused_record,
)
from attune.engine.state import Measurement, TrialOutcome, TrialRecord
from attune.errors import RecipeError
from attune.operator.agent_client import Proposal
from attune.operator.manifests import build_pytorchjob, build_trial, template_launch, trial_name
from attune.operator.metrics import MetricsUnavailable
from attune.operator.podlogs import LogsUnavailable, PodLog, log_verdict, master_pod, pod_selector, read_log
from attune.operator.resources import (
    ACTIVE_PHASES, MUTABLE_WHILE_RUNNING, AgentSpec, MetricsSpec, TuningRunSpec, template_frameworks,
)
from attune.recipe.change import Change, apply_change, signature
from attune.recipe.io import parse_recipe, parse_recipe_text, recipe_to_dict
from attune.recipe.model import Recipe

log = logging.getLogger(__name__)

TERMINAL = ("Succeeded", "Failed")
#: phases in which only budget, agent and suspend may change
ACTIVE_PHASES_FROZEN = ACTIVE_PHASES
#: seconds a trial may overrun its deadline before the operator stops its job itself
DEADLINE_GRACE_S = 30.0


class Ports(Protocol):
    """What :func:`reconcile` needs from the outside world."""

    def now(self) -> float: ...
    def read_configmap(self, namespace: str, name: str, key: str) -> str: ...
    def list_trials(self, namespace: str, run: str) -> list[dict[str, Any]]: ...
    def create_trial(self, trial: dict[str, Any]) -> dict[str, Any]: ...
    def patch_trial_status(self, namespace: str, name: str, status: dict[str, Any]) -> None: ...
    def get_job(self, namespace: str, name: str) -> dict[str, Any] | None: ...
    def create_job(self, job: dict[str, Any]) -> None: ...
    def delete_job(self, namespace: str, name: str) -> None: ...
    def measure(self, metrics: MetricsSpec, namespace: str, job: str, start: float, end: float, *,
                tokens_per_step: int, devices: int) -> Measurement | None: ...
    def propose(self, state: RunState, agent: AgentSpec) -> Proposal: ...
    # trials measured from their pod log (frameworks with ``metrics_source = "logs"``); both raise LogsUnavailable
    def list_pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]: ...
    def read_pod_log(self, namespace: str, pod: str, container: str) -> str: ...


@dataclass
class Result:
    """What one reconcile step wants written: the run's status patch and the events to record."""

    status: dict[str, Any] = field(default_factory=dict)
    events: list[tuple[str, str, str]] = field(default_factory=list)  # (type Normal|Warning, reason, message)
    trials_recorded: list[TrialRecord] = field(default_factory=list)

    def event(self, reason: str, message: str, warning: bool = False) -> None:
        self.events.append(("Warning" if warning else "Normal", reason, message))


# -- pure helpers --------------------------------------------------------------------------------

def iso(ts: float) -> str:
    """RFC 3339 UTC timestamp of a POSIX time."""
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: str | None) -> float | None:
    """POSIX time of an RFC 3339 timestamp (``None`` stays ``None``)."""
    if not value:
        return None
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def set_condition(conditions: list[dict[str, Any]], ctype: str, status: bool, reason: str, message: str,
                  now: float) -> list[dict[str, Any]]:
    """Conditions with ``ctype`` set; its transition time moves only when its status changes."""
    value = "True" if status else "False"
    out = [dict(c) for c in conditions if c.get("type") != ctype]
    old = next((c for c in conditions if c.get("type") == ctype), None)
    when = old["lastTransitionTime"] if old and old.get("status") == value and old.get("lastTransitionTime") \
        else iso(now)
    out.append({"type": ctype, "status": value, "reason": reason, "message": message[:1000],
                "lastTransitionTime": when})
    return sorted(out, key=lambda c: c["type"])


def frozen_digest(spec: dict[str, Any]) -> str:
    """Digest of the spec fields that may not change while the run is active."""
    frozen = {k: v for k, v in spec.items() if k not in MUTABLE_WHILE_RUNNING}
    return hashlib.sha256(json.dumps(frozen, sort_keys=True, default=str).encode()).hexdigest()[:16]


def frozen_changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Spec fields (other than budget, agent and suspend) that differ between ``old`` and ``new``."""
    keys = sorted((set(old) | set(new)) - set(MUTABLE_WHILE_RUNNING))
    return [k for k in keys if old.get(k) != new.get(k)]


def resolve_recipe(spec: TuningRunSpec, namespace: str, read_configmap: Any = None, *, run_name: str = "") -> Recipe:
    """The baseline recipe from the spec (inline, a ConfigMap key, or imported from the trial template); raises
    :class:`RecipeError`."""
    src = spec.recipe
    given = [k for k, v in (("inline", src.inline), ("configMapRef", src.config_map_ref),
                            ("fromTemplate", src.from_template)) if v is not None]
    if len(given) > 1:
        raise RecipeError(f"spec.recipe: give one of inline, configMapRef and fromTemplate, not {' and '.join(given)}")
    if src.from_template is not None:
        return recipe_from_template(spec, run_name)
    if src.inline is not None:
        return parse_recipe(src.inline, "spec.recipe.inline")
    if src.config_map_ref is not None:
        if read_configmap is None:
            raise RecipeError("spec.recipe.configMapRef cannot be read here")
        ref = src.config_map_ref
        try:
            text = read_configmap(namespace, ref.name, ref.key)
        except LookupError as err:
            raise RecipeError(f"spec.recipe.configMapRef: {err}") from None
        return parse_recipe_text(text, f"ConfigMap {ref.name} key {ref.key}")
    raise RecipeError("spec.recipe needs inline, configMapRef or fromTemplate")


def recipe_from_template(spec: TuningRunSpec, run_name: str = "") -> Recipe:
    """The recipe of the trial template's own launch: the training container's command and args, imported by the
    framework ``spec.recipe.fromTemplate.framework`` names (its devices from the template); raises
    :class:`RecipeError`."""
    from attune import frameworks

    src = spec.recipe.from_template
    assert src is not None
    supported = template_frameworks()
    if src.framework not in supported:
        known = src.framework in frameworks.names()
        raise RecipeError(f"spec.recipe.fromTemplate.framework: {src.framework!r} "
                          f"{'cannot import a launch into a Kubernetes trial' if known else 'is no known framework'}; "
                          f"frameworks that can: {', '.join(supported) or 'none'}")
    try:
        launch = template_launch(spec)
    except ValueError as err:
        raise RecipeError(f"spec.recipe.fromTemplate: {err}") from None
    fw = frameworks.get(src.framework)
    devices = src.devices_per_node or launch.processes or 1
    # the image's files are not here: the framework must not try to read the script's config files
    options = {"devices_per_node": devices, "tokens_per_sample": src.tokens_per_sample, "read_files": False,
               "accelerator": src.accelerator, "name": src.name or run_name or None}
    where = f"the {launch.replica} container {spec.container_name!r} of spec.trialTemplate"
    try:
        importer = getattr(fw, "import_container", None)  # a framework's own reading of a container, if it has one
        data = importer(launch.container, job_spec=launch.job_spec, options=options) if importer is not None \
            else fw.import_launch(list(launch.argv), cwd=Path(launch.cwd), env=launch.env, options=options)
    except RecipeError as err:
        raise RecipeError(f"spec.recipe.fromTemplate: cannot import {where}: {err}") from None
    data["name"] = src.name or run_name or data.get("name") or "recipe"
    resources = data.setdefault("resources", {})
    resources["nodes"] = launch.nodes
    resources.setdefault("devices_per_node", devices)
    return parse_recipe(data, f"the launch of {where} (`{shlex.join(launch.argv)}`)")


def kubernetes_problems(spec: TuningRunSpec, recipe: Recipe) -> list[str]:
    """Why ``recipe`` cannot be tuned as Kubernetes trials under ``spec`` (empty: it can)."""
    from attune import frameworks

    fw = recipe.framework_impl
    if not fw.k8s:
        supported = [n for n in frameworks.names() if frameworks.get(n).k8s]
        return [f"framework {recipe.framework!r} has no Kubernetes renderer, so a TuningRun cannot run its trials; "
                f"TuningRuns support the frameworks {', '.join(supported) or 'none'} (tune {recipe.framework} "
                f"recipes with `attune tune` on the {', '.join(fw.backends)} backend)"]
    if getattr(fw, "metrics_source", "logs") == "prometheus" and not spec.metrics.prometheus_url:
        return [f"spec.metrics.prometheusUrl: required for framework {recipe.framework}, whose trials are measured "
                "through the metrics they serve"]
    return []


def tune_config(spec: TuningRunSpec, recipe: Recipe) -> TuneConfig:
    """The engine's configuration of this run."""
    m = spec.metrics
    return TuneConfig.from_recipe(
        recipe, spec.budget.accelerator_hours, search_space=spec.search_space or None, warmup_steps=m.warmup_steps,
        measure_steps=m.measure_steps, baseline_repeats=m.baseline_repeats, confirm=m.confirm, paired=m.paired,
        min_gain=spec.objective.min_gain, trial_timeout_s=float(spec.budget.trial_deadline_seconds),
        max_trials=spec.budget.max_trials)


def load_state(spec: TuningRunSpec, recipe: Recipe, status: dict[str, Any]) -> RunState:
    """The engine state folded from ``status.records``."""
    records = sorted((TrialRecord.model_validate(r) for r in status.get("records") or []), key=lambda r: r.id)
    return RunState(baseline=recipe, config=tune_config(spec, recipe), records=records)


def job_state(job: dict[str, Any]) -> tuple[str, str, str]:
    """(phase, reason, message) of a PyTorchJob from its conditions: Pending, Running, Succeeded or Failed."""
    conds = (job.get("status") or {}).get("conditions") or []
    true = [c for c in conds if c.get("status") == "True"]
    for ctype in ("Succeeded", "Failed"):
        hit = [c for c in true if c.get("type") == ctype]
        if hit:
            return ctype, hit[-1].get("reason", ""), hit[-1].get("message", "")
    if any(c.get("type") == "Running" for c in true):
        return "Running", "", ""
    return "Pending", "", ""


def failure_outcome(reason: str, message: str) -> TrialOutcome:
    """How a failed job failed, from its condition."""
    text = f"{reason} {message}"
    if "DeadlineExceeded" in text:
        return TrialOutcome.TIMED_OUT
    if "OOM" in text or "out of memory" in text.lower():
        return TrialOutcome.OOM
    if "diverged" in text.lower():
        return TrialOutcome.DIVERGED
    return TrialOutcome.CRASHED


def trial_status_from_record(rec: TrialRecord) -> dict[str, Any]:
    """The TuningTrial status fields mirroring a finished record."""
    ok = rec.outcome is TrialOutcome.SUCCEEDED
    out: dict[str, Any] = {"phase": "Succeeded" if ok else "Failed", "outcome": rec.outcome.value,
                           "decision": rec.decision, "message": rec.message, "hoursCharged": rec.charged_hours}
    if rec.measurement is not None:
        out["measurements"] = rec.measurement.model_dump(mode="json")
    if rec.verdict is not None:
        out["verdict"] = rec.verdict
    if rec.loss_check is not None:
        out["lossCheck"] = rec.loss_check
    return out


def summary(state: RunState, run_name: str) -> dict[str, Any]:
    """Status fields derived from the records: baseline, best, budget and trial counts."""
    base_tp = state.baseline_throughput()
    first_base = next((r for r in state.records if r.kind == "baseline" and r.outcome is TrialOutcome.SUCCEEDED),
                      None)
    out: dict[str, Any] = {}
    if base_tp is not None and first_base is not None:
        out["baseline"] = {"trial": trial_name(run_name, first_base.id), "throughput": round(base_tp, 3),
                           "speedup": 1.0}
        best = state.best_record()
        best_tp = state.best_throughput() or base_tp
        changed = state.baseline.knob_changes(state.best_recipe().knobs)
        out["best"] = {"trial": trial_name(run_name, best.id) if best else out["baseline"]["trial"],
                       "throughput": round(best_tp, 3), "speedup": round(best_tp / base_tp, 4) if base_tp else None,
                       "knobs": changed}
    budget = state.budget()
    out["budget"] = {"hoursUsed": round(budget.used, 6), "hoursLimit": state.config.budget_hours}
    launched = [r for r in state.records if r.launched]
    out["trials"] = {"total": len(launched) + sum(r.outcome is TrialOutcome.REFUSED for r in state.records),
                     "running": 0,
                     "succeeded": sum(r.outcome is TrialOutcome.SUCCEEDED for r in launched),
                     "failed": sum(r.outcome is not TrialOutcome.SUCCEEDED for r in launched),
                     "refused": sum(r.outcome is TrialOutcome.REFUSED for r in state.records)}
    return out


def failed_trials(state: RunState) -> int:
    return sum(1 for r in state.records if r.launched and r.outcome.failed)


# -- the step ------------------------------------------------------------------------------------

def reconcile(run: dict[str, Any], ports: Ports) -> Result:
    """Advance ``run`` by at most one step; returns the status patch and events (never raises for trial failures)."""
    meta, status = run["metadata"], dict(run.get("status") or {})
    ns, name = meta["namespace"], meta["name"]
    now = ports.now()
    res = Result()
    conds = list(status.get("conditions") or [])
    if status.get("phase") in TERMINAL:
        return res
    try:
        spec = TuningRunSpec.model_validate(run["spec"])
    except ValueError as err:  # only without the webhook and the CRD's schema
        msg = f"spec is invalid: {err}"
        res.status = {"phase": "Failed", "message": msg, "completionTime": iso(now),
                      "conditions": set_condition(conds, "SpecAccepted", False, "InvalidSpec", msg, now)}
        res.event("InvalidSpec", msg, warning=True)
        return res
    # the baseline recipe is resolved once; later ConfigMap edits do not move a running tuning
    try:
        recipe = parse_recipe(status["baselineRecipe"], "status.baselineRecipe") if status.get("baselineRecipe") \
            else resolve_recipe(spec, ns, ports.read_configmap, run_name=name)
    except RecipeError as err:
        res.status = {"phase": "Failed", "message": str(err), "completionTime": iso(now),
                      "conditions": set_condition(conds, "RecipeValid", False, "InvalidRecipe", str(err), now)}
        res.event("InvalidRecipe", str(err), warning=True)
        return res
    unsupported = kubernetes_problems(spec, recipe)
    if unsupported:  # the webhook refuses these; a run that got past it fails instead of retrying forever
        msg = "; ".join(unsupported)
        res.status = {"phase": "Failed", "message": msg, "completionTime": iso(now),
                      "conditions": set_condition(conds, "RecipeValid", False, "NotRunnableOnKubernetes", msg, now)}
        res.event("NotRunnableOnKubernetes", msg, warning=True)
        return res
    digest = frozen_digest(run["spec"])
    patch: dict[str, Any] = {}
    if not status.get("baselineRecipe"):
        patch.update(baselineRecipe=recipe_to_dict(recipe), specHash=digest, startTime=iso(now), phase="Baseline")
        conds = set_condition(conds, "RecipeValid", True, "Parsed", "baseline recipe resolved", now)
        res.event("Started", f"tuning {recipe.name} within {spec.budget.accelerator_hours:g} accelerator-hours")
    elif status.get("specHash") != digest:
        conds = set_condition(conds, "SpecAccepted", False, "FrozenFieldChanged",
                              "only budget, agent and suspend may change while the run is active; "
                              "the run continues with the spec it started with", now)
    state = load_state(spec, recipe, status)
    trials = {t["spec"]["index"]: t for t in ports.list_trials(ns, name)}
    recorded = {r.id for r in state.records}
    # mirror finished records into their trials (idempotent; repairs a crash between the two writes)
    for rec in state.records:
        t = trials.get(rec.id)
        if t is not None and (t.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
            _stop_job(ports, ns, t["metadata"]["name"])  # a trial measured from its log while its job ran on
            ports.patch_trial_status(ns, t["metadata"]["name"], trial_status_from_record(rec))
    _mirror_loss_checks(state, trials, ports, ns)
    open_trials = sorted(i for i in trials if i not in recorded)
    if open_trials:
        conds = _follow(run, spec, state, trials[open_trials[-1]], ports, now, res, conds)
    elif spec.suspend:
        patch["phase"] = "Suspended"
        conds = set_condition(conds, "Suspended", True, "SuspendedByUser", "no new trial is launched", now)
    else:
        conds = set_condition(conds, "Suspended", False, "Running", "", now)
        conds = _advance(run, spec, state, ports, now, res, conds, patch)
    current = next((trial_name(name, i) for i in open_trials), None)
    if res.trials_recorded:
        current = None
    patch.update(summary(state, name))
    if current is not None:
        patch["trials"]["running"] = 1
        patch["trials"]["total"] += 1
    patch["currentTrial"] = current
    patch["records"] = [r.model_dump(mode="json") for r in state.records]
    patch["observedGeneration"] = meta.get("generation")
    if "phase" not in patch and patch.get("phase") is None and status.get("phase") not in TERMINAL:
        patch["phase"] = "Baseline" if len(state.baselines()) < state.config.baseline_repeats else "Tuning"
    patch["conditions"] = conds
    res.status = {**patch, **res.status}
    return res


def _record(state: RunState, rec: TrialRecord, res: Result) -> None:
    state.records.append(rec)
    res.trials_recorded.append(rec)
    res.event("TrialFinished", f"trial {rec.id} ({rec.kind} {rec.label()}): {rec.outcome.value}; {rec.decision}",
              warning=rec.outcome.failed)


def _mirror_loss_checks(state: RunState, trials: dict[int, dict[str, Any]], ports: Ports, ns: str) -> None:
    """Show each loss-equivalence check's result on the candidate and confirm trials it judged (idempotent)."""
    for chk in (r for r in state.records if r.kind == "loss_check"):
        result = chk.loss_check or {"passed": False, "reason": chk.decision}
        for rec in state.records:
            t = trials.get(rec.id)
            if rec.id > chk.id or rec.kind not in ("candidate", "confirm") or rec.signature != chk.signature \
                    or t is None or (t.get("status") or {}).get("lossCheck") is not None:
                continue
            ports.patch_trial_status(ns, t["metadata"]["name"], {"lossCheck": result, "decision": chk.decision})


def _stop_job(ports: Ports, ns: str, name: str) -> None:
    """Delete a recorded trial's job if it still runs (idempotent: the record is already stored)."""
    job = ports.get_job(ns, name)
    if job is not None and job_state(job)[0] in ("Pending", "Running"):
        ports.delete_job(ns, name)


def _follow(run: dict[str, Any], spec: TuningRunSpec, state: RunState, trial: dict[str, Any], ports: Ports,
            now: float, res: Result, conds: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Launch, watch, measure and record the trial in flight."""
    ns, tname = trial["metadata"]["namespace"], trial["metadata"]["name"]
    tspec, tstatus = trial["spec"], trial.get("status") or {}
    index, kind = int(tspec["index"]), tspec["kind"]
    try:
        recipe = apply_change(state.baseline, {k: v for k, v in state.baseline.knob_changes(tspec["knobs"]).items()
                                               if k in state.baseline.catalogue})
    except RecipeError as err:
        _record(state, TrialRecord(id=index, kind=kind, change=tspec.get("change", {}), outcome=TrialOutcome.CRASHED,
                                   message=f"invalid trial: {err}", decision="rejected: invalid trial"), res)
        return conds
    verdict = tstatus.get("verdict") or _verdict_for(state, kind, recipe, dict(tspec.get("change") or {}))
    job = ports.get_job(ns, tname)
    started = parse_time(tstatus.get("startTime"))
    if job is None and started is None:
        try:
            manifest = build_pytorchjob(run, trial, recipe)
        except (ValueError, RecipeError) as err:
            _record(state, TrialRecord(id=index, kind=kind, change=tspec.get("change", {}),
                                       outcome=TrialOutcome.CRASHED, message=f"cannot build the trial's job: {err}",
                                       decision="rejected: invalid trial job"), res)
            return set_condition(conds, "TrialsHealthy", False, "InvalidJob", f"{tname}: {err}", now)
        ports.create_job(manifest)
        ports.patch_trial_status(ns, tname, {"phase": "Running", "startTime": iso(now),
                                             "jobRef": {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
                                                        "name": tname}})
        res.event("TrialStarted", f"trial {index} ({kind} {', '.join(f'{k}={v}' for k, v in tspec['change'].items()) or 'baseline'})")
        return conds
    devices = recipe.resources.devices
    started = started or now
    jstatus = (job or {}).get("status") or {}
    jstart = parse_time(jstatus.get("startTime")) or started
    base = dict(id=index, kind=kind, change=dict(tspec.get("change") or {}), knobs=recipe.effective_knobs,
                signature=signature(recipe), rationale=(tspec.get("proposal") or {}).get("rationale", ""),
                source=(tspec.get("proposal") or {}).get("source", ""), verdict=verdict)
    if job is None:
        wall = max(now - started, 0.0)
        _finish(state, res, base, TrialResult(TrialOutcome.CRASHED, None, wall, devices, charge(devices, wall),
                                              "the trial's PyTorchJob disappeared while it ran"))
        return set_condition(conds, "TrialsHealthy", False, "JobDeleted", f"{tname}: job deleted", now)
    phase, reason, message = job_state(job)
    deadline = spec.budget.trial_deadline_seconds
    if phase in ("Pending", "Running") and now - started > deadline + DEADLINE_GRACE_S:
        ports.delete_job(ns, tname)
        why = "pods stayed pending beyond the trial deadline" if phase == "Pending" else \
            "the trial ran beyond its deadline"
        wall = now - started
        _finish(state, res, base, TrialResult(TrialOutcome.TIMED_OUT, None, wall, devices, charge(devices, wall),
                                              f"{why} ({deadline} s)"))
        return set_condition(conds, "TrialsHealthy", False, "PodsPending" if phase == "Pending" else "Deadline",
                             f"{tname}: {why}", now)
    if getattr(recipe.framework_impl, "metrics_source", "logs") == "logs":
        return _follow_log(spec, state, recipe, tname, job, ports, now, res, conds, base, jstart)
    if phase in ("Pending", "Running"):
        return conds
    jend = parse_time(jstatus.get("completionTime")) or now
    wall = max(jend - jstart, 0.0)
    if phase == "Failed":
        outcome = failure_outcome(reason, message)
        _finish(state, res, base, TrialResult(outcome, None, wall, devices, charge(devices, wall),
                                              f"job failed: {reason} {message}".strip()))
        return set_condition(conds, "TrialsHealthy", False, "JobFailed", f"{tname}: {reason} {message}", now)
    try:
        meas = ports.measure(spec.metrics, ns, tname, jstart, jend,
                             tokens_per_step=recipe.tokens_per_step, devices=devices)
    except MetricsUnavailable as err:
        res.event("MetricsUnavailable", str(err), warning=True)
        return set_condition(conds, "MetricsAvailable", False, "PrometheusUnreachable", str(err), now)
    conds = set_condition(conds, "MetricsAvailable", meas is not None, "Measured" if meas else "NoSamples",
                          "" if meas else f"{tname}: Prometheus holds fewer than 2 measured steps", now)
    if meas is None:
        _finish(state, res, base, TrialResult(TrialOutcome.CRASHED, None, wall, devices, charge(devices, wall),
                                              "the job succeeded but Prometheus holds too few of its steps"))
        return conds
    _finish(state, res, base, TrialResult(TrialOutcome.SUCCEEDED, meas, wall, devices, charge(devices, wall)))
    return set_condition(conds, "TrialsHealthy", True, "TrialSucceeded", f"{tname} succeeded", now)


def _follow_log(spec: TuningRunSpec, state: RunState, recipe: Recipe, tname: str, job: dict[str, Any], ports: Ports,
                now: float, res: Result, conds: list[dict[str, Any]], base: dict[str, Any],
                jstart: float) -> list[dict[str, Any]]:
    """Watch and measure a trial from its master pod's log (the user's own job, which does not stop by itself)."""
    ns = job["metadata"]["namespace"]
    phase, reason, message = job_state(job)
    if phase == "Pending":
        return conds  # no pod has a log yet
    m = spec.metrics
    needed = m.warmup_steps + m.measure_steps
    devices = recipe.resources.devices
    plog: PodLog | None = None
    try:
        plog, pod = _read_trial_log(ports, ns, tname, spec.container_name, recipe)
        conds = set_condition(conds, "MetricsAvailable", True, "PodLogRead",
                              f"{tname}: {len(plog.steps)} of {needed} steps in the log of pod {pod}", now)
    except LogsUnavailable as err:
        conds = set_condition(conds, "MetricsAvailable", False, f"PodLog{err.reason}", str(err), now)
        # wait while the job runs, and for a finished job's log unless its pod is gone (a refused read, like an
        # unreachable Prometheus, is a condition: a fixed Role lets the run go on, nothing is recorded on a guess)
        if phase == "Running" or err.reason != "NotFound":
            return conds
    verdict = log_verdict(phase, plog, needed, reason=reason, message=message)
    if verdict.action == "wait":
        return conds
    jend = parse_time((job.get("status") or {}).get("completionTime")) or now
    if verdict.action == "measure":
        assert plog is not None
        end = plog.arrivals[needed - 1]
        wall = max(end - jstart, 0.0)
        meas = summarise(measured_steps(plog.steps[:needed], recipe.tokens_per_step), warmup_steps=m.warmup_steps,
                         devices=devices)
        if meas is None or meas.tokens_per_s <= 0:
            why = "the pod log gives no token count per step: set spec.recipe.fromTemplate.tokensPerSample " \
                  "(or the recipe's launch.tokens_per_sample)"
            _finish(state, res, base, TrialResult(TrialOutcome.CRASHED, None, wall, devices, charge(devices, wall),
                                                  why))
            return set_condition(conds, "MetricsAvailable", False, "NoTokenCount", f"{tname}: {why}", now)
        _finish(state, res, base, TrialResult(TrialOutcome.SUCCEEDED, meas, wall, devices, charge(devices, wall),
                                              f"measured from the log of its master pod ({needed} steps)"))
        return set_condition(conds, "TrialsHealthy", True, "TrialSucceeded", f"{tname} succeeded", now)
    outcome = verdict.outcome or failure_outcome(reason, message)
    end = now if verdict.stop else jend
    wall = max(end - jstart, 0.0)
    meas = None
    if outcome is TrialOutcome.DIVERGED and plog is not None and plog.steps:
        meas = summarise(measured_steps(plog.steps, recipe.tokens_per_step), warmup_steps=0, devices=devices)
    _finish(state, res, base, TrialResult(outcome, meas, wall, devices, charge(devices, wall), verdict.message))
    return set_condition(conds, "TrialsHealthy", False, "JobFailed" if phase == "Failed" else "TrialFailed",
                         f"{tname}: {verdict.message}", now)


def _read_trial_log(ports: Ports, ns: str, job: str, container: str, recipe: Recipe) -> tuple[PodLog, str]:
    """The parsed log of ``job``'s master pod (rank 0) and the pod's name; raises :class:`LogsUnavailable`."""
    pod = master_pod(ports.list_pods(ns, pod_selector(job)), job)
    if pod is None:
        raise LogsUnavailable("NotFound", f"{job}: no master pod (labels {pod_selector(job)}, "
                                          "training.kubeflow.org/replica-type=master, replica-index=0) yet")
    name = pod["metadata"]["name"]
    text = ports.read_pod_log(ns, name, container)
    return read_log(text, recipe.framework_impl.pod_parser(recipe)), name


def measured_steps(steps: list[dict[str, Any]], tokens_per_step: int | None) -> list[dict[str, Any]]:
    """Parsed step records ready for :func:`summarise`: a missing token count from the recipe, a missing loss NaN."""
    out = []
    for r in steps:
        r = dict(r)
        if r.get("tokens") is None:
            r["tokens"] = tokens_per_step or 0
        if r.get("loss") is None:
            r["loss"] = math.nan
        out.append(r)
    return out


def _verdict_for(state: RunState, kind: str, recipe: Recipe, change: dict[str, Any]) -> dict[str, Any] | None:
    """The gate's verdict of a trial whose stored one was lost (e.g. the operator died right after creating it)."""
    if kind == "confirm":
        sig = signature(recipe)
        return next((r.verdict for r in reversed(state.records) if r.kind == "candidate" and r.signature == sig), None)
    if kind == "candidate":
        return gate_proposal(state, Change(set=change)).verdict.to_dict()
    return None


def _finish(state: RunState, res: Result, base: dict[str, Any], result: TrialResult) -> None:
    decision, accepted, g = decide(state, base["kind"], base["signature"], result, base["verdict"])
    rec = TrialRecord(**base, outcome=result.outcome, message=result.message, measurement=result.measurement,
                      charged_hours=result.charged_hours, wall_s=result.wall_s, accepted=accepted,
                      decision=decision, gain=g)
    _record(state, rec, res)


def _advance(run: dict[str, Any], spec: TuningRunSpec, state: RunState, ports: Ports, now: float, res: Result,
             conds: list[dict[str, Any]], patch: dict[str, Any]) -> list[dict[str, Any]]:
    """No trial in flight: decide the next step and start it (or finish)."""
    action = next_action(state)
    if action.kind != "finish" and failed_trials(state) >= spec.budget.max_failed_trials:
        action = type(action)("finish", reason=f"{failed_trials(state)} trials failed "
                                               f"(maxFailedTrials {spec.budget.max_failed_trials})")
    if action.kind == "finish":
        return _complete(state, action.reason, now, res, conds, patch)
    if action.kind == "loss_check" and action.target is not None:
        _record(state, loss_check_record(state, action.target), res)
        return conds
    if action.kind == "baseline":
        return _launch(run, state, ports, "baseline", state.baseline, {}, "baseline", "baseline run", None, res,
                       conds)
    if action.kind == "confirm" and action.target is not None:
        t = action.target
        return _launch(run, state, ports, "confirm", apply_change(state.best_recipe(), t.change), t.change,
                       t.source, "confirmation re-run", t.verdict, res, conds)
    if action.kind == "reference" and action.target is not None:  # A-B-A: the best, between a candidate's runs
        return _launch(run, state, ports, "reference", state.best_recipe(), {}, "engine",
                       f"paired reference for trial {action.target.id}", None, res, conds)
    if action.kind == "calibrate":
        change = calibration_change(state) or {}
        return _launch(run, state, ports, "calibration", apply_change(state.baseline, change), change, "gate",
                       "equivalent layout: measures rounding drift", None, res, conds)
    proposal = ports.propose(state, spec.agent)
    if proposal.fallback_reason:
        conds = set_condition(conds, "AgentAvailable", False, "AgentUnreachable",
                              f"{proposal.fallback_reason}; proposing with the local "
                              f"{spec.agent.fallback_policy} policy", now)
        res.event("AgentFallback", proposal.fallback_reason, warning=True)
    else:
        conds = set_condition(conds, "AgentAvailable", True, "Answered", "", now)
    resp = proposal.response
    if resp.action == "stop":
        return _complete(state, f"policy stopped: {resp.reason}", now, res, conds, patch)
    change = Change(set=resp.change, rationale=resp.rationale, source=resp.source)
    gated = gate_proposal(state, change)
    if gated.candidate is None:
        rec = refused_record(state, gated, resp.source)
        _record(state, rec, res)
        res.event("ProposalRefused", f"{change.label()}: {rec.message}", warning=True)
        return conds
    return _launch(run, state, ports, "candidate", gated.candidate, dict(change.set), resp.source, resp.rationale,
                   gated.verdict.to_dict(), res, conds)


def _launch(run: dict[str, Any], state: RunState, ports: Ports, kind: str, recipe: Recipe, change: dict[str, Any],
            source: str, rationale: str, verdict: dict[str, Any] | None, res: Result,
            conds: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Create the next TuningTrial (its job is created on the next step, once the trial has a uid)."""
    trial = build_trial(run, state.next_id(), kind, change, recipe.effective_knobs, source, rationale)
    created = ports.create_trial(trial)
    if verdict is not None:
        ports.patch_trial_status(created["metadata"]["namespace"], created["metadata"]["name"],
                                 {"phase": "Pending", "verdict": verdict})
    res.event("TrialCreated", f"{trial['metadata']['name']}: {kind} {rationale}")
    return conds


def _complete(state: RunState, reason: str, now: float, res: Result, conds: list[dict[str, Any]],
              patch: dict[str, Any]) -> list[dict[str, Any]]:
    ok = bool(state.baselines())
    best = state.best_recipe()
    patch.update(phase="Succeeded" if ok else "Failed", message=reason, completionTime=iso(now),
                 tunedRecipe=recipe_to_dict(best) if ok else None)
    res.event("Finished", reason, warning=not ok)
    return set_condition(conds, "Ready", ok, "Tuned" if ok else "NoBaseline", reason, now)
