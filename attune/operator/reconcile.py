"""The operator's run driver: one level-triggered step of a TuningRun, a pure decision between two edges.

:func:`decide` is a pure function of the run (its spec and status) and what has been observed: the run's
TuningTrials, the in-flight trial's job and pods, a pod log, a Prometheus measurement, the agent's proposal. It
returns the run's status patch and the *effects* to carry out (create a trial or a job, patch a trial's status,
delete a job, write the tuned recipe's ConfigMap) and never does I/O. When it needs an observation it has not been
given, it says which (:class:`NeedObservation`); :func:`reconcile` (the edge) fetches it through the :class:`Ports`
and asks again, then applies the effects in order (:func:`apply_effects`). What to do next is the engine's
:func:`~attune.engine.loop.next_action` (every stop rule, ``maxFailedTrials`` included, lives there), and each
trial's record is assembled by the engine's :func:`~attune.engine.loop.trial_record`, as for ``attune tune``.

**State** lives in the TuningTrials: each holds its own record (``status.record``, loss curves capped at
:data:`~attune.operator.resources.CURVE_CAP` values), and a loss-equivalence check's record sits on the trial it
judged. The run keeps only summaries, a cursor and the last refusals (which create no trial), so its size is
bounded however many trials run. A trial without a record is the one in flight. A restarted operator continues
where it stopped: a recorded trial is never run or charged again.

**Charging starts when a trial's pods run** (the earliest container start), not when its job is created: time
waiting for accelerators (unschedulable pods, a job suspended by Kueue) is shown (``TrialQueued``,
``queuedSeconds``) but not charged, and bounded by ``budget.pendingDeadlineSeconds``. The running deadline counts
from the same moment.

A trial is measured where its framework says (``Framework.metrics_source``): through Prometheus once its job has
ended, or from its rank-0 pod's log as soon as the log holds warm-up plus measurement steps; such a job is then
stopped, after its record is stored (effects run in order; ``jobStopping`` repeats the stop after a crash).
"""

from __future__ import annotations

import copy
import datetime as dt
import logging
import math
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from attune.backends.base import TrialResult
from attune.engine.budget import charge
from attune.engine.loop import (
    ActionKind,
    TrialPlan,
    certification_note,
    decision_record,
    loss_check_record,
    measure_plan,
    next_action,
    plan_candidate,
    plan_trial,
    trial_record,
)
from attune.engine.measure import summarise, window_end
from attune.engine.state import RunState, TuneConfig
from attune.errors import RecipeError
from attune.gate import evaluate
from attune.operator import orgs
from attune.operator.agent_client import Proposal
from attune.operator.backends import (
    JobBackend,
    backend_for,
    job_name,
    owned_by,
    pod_uids,
    pods_replaced,
    pods_view,
    template_accelerators,
)
from attune.operator.manifests import (
    build_job,
    build_trial,
    template_launch,
    trial_name,
)
from attune.operator.metrics import Access, MetricsUnavailable
from attune.operator.outcomes import RunOutcome, hold
from attune.operator.podlogs import LogsUnavailable, PodLog, log_verdict, read_log
from attune.operator.resources import (
    CURVE_CAP,
    LABEL_QUEUE,
    REFUSED_KEPT,
    AgentSpec,
    MetricsSpec,
    TuningRunSpec,
    merge_allowed_edits,
    template_frameworks,
)
from attune.operator.urls import credentials_problem, url_problem
from attune.recipe.change import Change, apply_change
from attune.recipe.io import parse_recipe, parse_recipe_text, recipe_to_dict
from attune.recipe.model import Recipe
from attune.trial import Measurement, TrialOutcome, TrialRecord, TrialRequest

log = logging.getLogger(__name__)

TERMINAL = ("Succeeded", "Failed")
#: seconds a trial may overrun its deadline before the operator stops its job itself
DEADLINE_GRACE_S = 30.0
#: refused job creations of one trial before it is recorded failed
MAX_CREATE_REFUSALS = 3
#: the start of the message of a trial whose measurement Prometheus lost (recorded interrupted, run again)
MEASUREMENT_LOST = "measurement lost"
#: trials in a row whose measurement was lost before the run stops and says why
MAX_LOST_MEASUREMENTS = 2
#: conditions in the kstatus shape, maintained on every step (Argo CD and Flux read them)
KSTATUS = ("Ready", "Reconciling", "Stalled")


class ApiRefusal(Exception):
    """The API server refused a request for good (a 4xx other than 409): ``code``, ``reason`` and its message."""

    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(f"{code} {reason}: {message}")
        self.code, self.reason, self.message = code, reason, message


class DiscoveryUnavailable(LookupError):
    """API discovery could not answer now (a 5xx or 429, e.g. an aggregated API server down): whether a kind is
    served is unknown, which is never the same as "not installed"."""


class Ports(Protocol):
    """What the edges of :func:`reconcile` need from the outside world."""

    def now(self) -> float: ...
    def read_configmap(self, namespace: str, name: str, key: str) -> str: ...  # LookupError
    def read_secret(self, namespace: str, name: str, key: str) -> str: ...  # LookupError
    def list_trials(self, namespace: str, run: str) -> list[dict[str, Any]]: ...
    def create_trial(self, trial: dict[str, Any]) -> dict[str, Any]: ...  # the existing one on 409; ApiRefusal
    def patch_trial_status(self, namespace: str, name: str, status: dict[str, Any]) -> str | None: ...  # its new rv
    #: the guarded write of a trial's record: False (nothing written) when the trial is no longer at ``version``
    def record_trial_status(self, namespace: str, name: str, status: dict[str, Any], version: str) -> bool: ...
    def served(self, api_version: str, plural: str) -> bool: ...  # DiscoveryUnavailable
    def get_job(self, namespace: str, name: str, kind: str = "PyTorchJob") -> dict[str, Any] | None: ...
    def create_job(self, job: dict[str, Any]) -> dict[str, Any] | None: ...  # the existing job on 409; ApiRefusal
    def delete_job(self, namespace: str, name: str, kind: str = "PyTorchJob") -> None: ...
    def list_pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]: ...  # LogsUnavailable
    #: the Warning events recorded against a job (a controller's FailedCreatePod), newest last; LogsUnavailable
    def job_warnings(self, namespace: str, kind: str, name: str) -> list[dict[str, Any]]: ...
    def workload_admission(self, namespace: str, job_uid: str) -> dict[str, Any] | None: ...  # Kueue's word
    def hours_left(self, namespace: str) -> Any: ...  # a quota.Left (the namespace's quota), or None
    def read_pod_log(self, namespace: str, pod: str, container: str) -> str: ...  # LogsUnavailable
    def measure(self, metrics: MetricsSpec, namespace: str, job: str, start: float, end: float, *,
                tokens_per_step: int, devices: int, access: Access | None = None,
                pod_regex: str | None = None) -> Measurement | None: ...  # MetricsUnavailable
    def propose(self, state: RunState, agent: AgentSpec, namespace: str | None = None) -> Proposal: ...
    def write_configmap(self, configmap: dict[str, Any]) -> None: ...
    def write_output_configmap(self, configmap: dict[str, Any]) -> Any: ...  # a results.WriteDecision


# -- effects -------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CreateTrial:
    trial: dict[str, Any]
    status: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PatchTrial:
    """Patch a trial's status; with ``guard`` (the resourceVersion the decision read it at) only if nobody else wrote
    it since: a trial's record is written once, by one replica (:func:`apply_effects`)."""

    namespace: str
    name: str
    status: dict[str, Any]
    guard: str | None = None


@dataclass(frozen=True)
class CreateJob:
    """Create a trial's job; the applier reports a refusal or a taken name on the trial (``jobCreate``), and patches
    ``on_created`` onto it once the job exists (created, or found already owned by the trial)."""

    namespace: str
    trial: str
    trial_uid: str
    job: dict[str, Any]
    on_created: dict[str, Any]
    job_create: dict[str, Any]


@dataclass(frozen=True)
class DeleteJob:
    namespace: str
    name: str
    kind: str


@dataclass(frozen=True)
class WriteConfigMap:
    """Write a ConfigMap; an ``output`` one (the tuned result) is never written over another owner's."""

    configmap: dict[str, Any]
    output: bool = False
    best_effort: bool = False  # a failed write is logged, never retried (the namespace's lessons)


Effect = CreateTrial | PatchTrial | CreateJob | DeleteJob | WriteConfigMap


@dataclass
class Result:
    """What one step decided: the run's status patch, the effects to apply, events, and the trials recorded."""

    status: dict[str, Any] = field(default_factory=dict)
    events: list[tuple[str, str, str]] = field(default_factory=list)  # (type Normal|Warning, reason, message)
    trials_recorded: list[TrialRecord] = field(default_factory=list)
    effects: list[Effect] = field(default_factory=list)
    permanent: str | None = None  # a configuration error: the handler reports it as kopf.PermanentError

    def event(self, reason: str, message: str, warning: bool = False) -> None:
        self.events.append(("Warning" if warning else "Normal", reason, message))


# -- observations --------------------------------------------------------------------------------------------------

class NeedObservation(Exception):
    """:func:`decide` needs ``key`` observed (``args`` say how); the edge fetches it and asks again."""

    def __init__(self, key: tuple[Any, ...], args: dict[str, Any]) -> None:
        super().__init__(key[0])
        self.key, self.how = key, args


class Observations:
    """What the edge has observed for one step; ``get`` raises :class:`NeedObservation` for what is missing, and
    re-raises an observation that failed (e.g. :class:`LogsUnavailable`)."""

    def __init__(self, now: float, values: dict[tuple[Any, ...], Any] | None = None) -> None:
        self.now = now
        self.values: dict[tuple[Any, ...], Any] = dict(values or {})

    def get(self, *key: Any, **args: Any) -> Any:
        if key not in self.values:
            raise NeedObservation(key, args)
        value = self.values[key]
        if isinstance(value, BaseException):
            raise value
        return value


# -- pure helpers --------------------------------------------------------------------------------------------------

def iso(ts: float) -> str:
    """RFC 3339 UTC timestamp of a POSIX time."""
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: str | None) -> float | None:
    """POSIX time of an RFC 3339 timestamp (``None`` stays ``None``)."""
    if not value:
        return None
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def set_condition(conditions: list[dict[str, Any]], ctype: str, status: bool, reason: str, message: str,
                  now: float, generation: int | None = None) -> list[dict[str, Any]]:
    """Conditions with ``ctype`` set; its transition time moves only when its status changes, and it carries the
    generation it was judged at."""
    value = "True" if status else "False"
    out = [dict(c) for c in conditions if c.get("type") != ctype]
    old = next((c for c in conditions if c.get("type") == ctype), None)
    when = old["lastTransitionTime"] if old and old.get("status") == value and old.get("lastTransitionTime") \
        else iso(now)
    cond = {"type": ctype, "status": value, "reason": reason, "message": message[:1000], "lastTransitionTime": when}
    if generation is not None:
        cond["observedGeneration"] = generation
    out.append(cond)
    return sorted(out, key=lambda c: c["type"])


def stamp_conditions(conditions: list[dict[str, Any]], now: float, generation: int | None) -> list[dict[str, Any]]:
    """Every condition with a transition time and the generation this step judged."""
    out = []
    for c in conditions:
        c = dict(c)
        c["lastTransitionTime"] = c.get("lastTransitionTime") or iso(now)
        if generation is not None:
            c["observedGeneration"] = generation
        out.append(c)
    return sorted(out, key=lambda c: c["type"])


def resolve_recipe(spec: TuningRunSpec, namespace: str, read_configmap: Any = None, *, run_name: str = "") -> Recipe:
    """The baseline recipe from the spec (inline, a ConfigMap key, or imported from the trial template); raises
    :class:`RecipeError`."""
    src = spec.recipe
    given = [k for k, v in (("inline", src.inline), ("configMapRef", src.config_map_ref),
                            ("fromTemplate", src.from_template)) if v is not None]
    if len(given) > 1:
        raise RecipeError(f"spec.recipe: give one of inline, configMapRef and fromTemplate, not {' and '.join(given)}")
    if src.from_template is not None:
        return recipe_from_template(spec, run_name, read_configmap=read_configmap, namespace=namespace)
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


def recipe_from_template(spec: TuningRunSpec, run_name: str = "", *, read_configmap: Any = None,
                         namespace: str = "") -> Recipe:
    """The recipe of the trial template's own launch: the training container's command and args, imported by the
    framework ``spec.recipe.fromTemplate.framework`` names (its devices from the template); raises
    :class:`RecipeError`. A file the command names that is mounted from a ConfigMap (``bash /scripts/run.sh``) is
    read through ``read_configmap(namespace, name, key)`` and given to the framework (``options["files"]``)."""
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
    # torchrun's --nproc-per-node auto (or none) starts a process per accelerator the pod has: the pod's request
    devices = src.devices_per_node or launch.processes or launch.accelerators_per_pod or 1
    # the image's files are not here: the framework must not try to read the script's config files
    options: dict[str, Any] = {"devices_per_node": devices, "tokens_per_sample": src.tokens_per_sample,
                               "read_files": False, "accelerator": src.accelerator, "name": src.name or run_name or None}
    where = f"the {launch.replica} container {spec.container_name!r} of spec.trialTemplate"
    mounted = launch.configmap_files()
    if mounted and read_configmap is None:
        raise RecipeError(f"spec.recipe.fromTemplate: {where} runs {', '.join(sorted(mounted))} from a ConfigMap, "
                          "which cannot be read here")
    files: dict[str, str] = {}
    for path, (cm, key) in sorted(mounted.items()):
        try:
            files[path] = read_configmap(namespace, cm, key)
        except LookupError as err:
            raise RecipeError(f"spec.recipe.fromTemplate: {where} runs {path}, mounted from ConfigMap {cm} key "
                              f"{key}: {err}") from None
    if files:
        options["files"] = files
    try:
        data = fw.import_container(launch.container, job_spec=launch.job_spec, options=options)  # its own reading
        if data is None:
            data = fw.import_launch(list(launch.argv), cwd=Path(launch.cwd), env=launch.env, options=options)
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
    if fw.metrics_source == "prometheus" and not spec.metrics.prometheus_url:
        return [f"spec.metrics.prometheusUrl: required for framework {recipe.framework}, whose trials are measured "
                "through the metrics they serve"]
    return []




def tune_config(spec: TuningRunSpec, recipe: Recipe) -> TuneConfig:
    """The engine's configuration of this run (``maxFailedTrials`` included: the engine stops on it)."""
    m = spec.metrics
    return TuneConfig.from_recipe(
        recipe, spec.budget.accelerator_hours, search_space=spec.search_space or None, warmup_steps=m.warmup_steps,
        measure_steps=m.measure_steps, adaptive_window=m.adaptive_window, baseline_repeats=m.baseline_repeats,
        confirm=m.confirm, paired=m.paired,
        min_gain=spec.objective.min_gain, trial_timeout_s=float(spec.budget.trial_deadline_seconds),
        max_trials=spec.budget.max_trials, max_failed_trials=spec.budget.max_failed_trials,
        certify_share=m.certify_share)


def _with_failure(message: str, failure: str) -> str:
    """A failed job's condition message with how its failed container ended, from its pods (the training
    operator's condition does not say)."""
    return f"{message}; {failure}" if message and failure else message or failure


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


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def stored_record(rec: TrialRecord) -> dict[str, Any]:
    """``rec`` as JSON the API server accepts (no NaN or infinity) and of bounded size: a loss curve longer than
    :data:`CURVE_CAP` values, or with a non-finite value, is dropped (no loss check can pass on it)."""
    data = rec.model_dump(mode="json")
    m = data.get("measurement")
    if m is not None:
        for key in ("losses", "grad_norms"):
            values = m.get(key) or []
            if len(values) > CURVE_CAP or not all(_finite(v) for v in values):
                m[key] = []
        for key, value in list(m.items()):
            if isinstance(value, float) and not math.isfinite(value):
                m[key] = None if key == "peak_memory_mb" else 0.0
        m["signals"] = {k: v for k, v in (m.get("signals") or {}).items() if _finite(v)}
        m["phases"] = {k: v for k, v in (m.get("phases") or {}).items() if _finite(v)}
    for key in ("gain", "wall_s", "charged_hours"):
        if isinstance(data.get(key), float) and not math.isfinite(data[key]):
            data[key] = None if key == "gain" else 0.0
    return data


def trial_status_from_record(rec: TrialRecord) -> dict[str, Any]:
    """The TuningTrial status fields of a finished record: the record itself and what ``kubectl`` shows."""
    ok = rec.outcome is TrialOutcome.SUCCEEDED
    stored = stored_record(rec)
    out: dict[str, Any] = {"phase": "Succeeded" if ok else "Failed", "outcome": rec.outcome.value,
                           "decision": rec.decision, "message": rec.message, "hoursCharged": rec.charged_hours,
                           "record": stored}
    if stored.get("measurement") is not None:
        out["measurements"] = {k: v for k, v in stored["measurement"].items() if k not in ("losses", "grad_norms")}
    if rec.verdict is not None:
        out["verdict"] = rec.verdict
    if rec.loss_check is not None:
        out["lossCheck"] = rec.loss_check
    return out


def summary(state: RunState, run_name: str, refused_total: int) -> dict[str, Any]:
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
        search = round(best_tp / base_tp, 4) if base_tp else None
        certified = state.certified()
        out["best"] = {"trial": trial_name(run_name, best.id) if best else out["baseline"]["trial"],
                       "throughput": round(best_tp, 3), "speedup": round(certified.speedup, 4) if certified else search,
                       "searchSpeedup": search, "certification": certification_note(state, certified),
                       "knobs": changed}
        if certified:
            out["best"].update(speedupLow=round(certified.low, 4), speedupHigh=round(certified.high, 4))
    budget = state.budget()
    out["budget"] = {"hoursUsed": round(budget.used, 6), "hoursLimit": state.config.budget_hours}
    launched = [r for r in state.records if r.launched]
    out["trials"] = {"total": len(launched) + refused_total, "running": 0,
                     "succeeded": sum(r.outcome is TrialOutcome.SUCCEEDED for r in launched),
                     "failed": sum(r.outcome.failed for r in launched),
                     "refused": refused_total}
    interrupted = sum(r.outcome is TrialOutcome.INTERRUPTED for r in launched)
    if interrupted:
        out["trials"]["interrupted"] = interrupted
    return out


def fold_records(trials: list[dict[str, Any]], status: dict[str, Any]) -> list[TrialRecord]:
    """The run's journal: each trial's record, the loss checks stored on the trials they judged, the paired looks
    stored on the reference runs they followed, and the refusals
    the run's status keeps; in id order, each id once."""
    by_id: dict[int, TrialRecord] = {}
    for t in trials:
        st = t.get("status") or {}
        for key in ("record", "lossCheckRecord", "decisionRecord"):
            if st.get(key):
                rec = TrialRecord.model_validate(st[key])
                by_id[rec.id] = rec
    for raw in status.get("refused") or []:
        rec = TrialRecord.model_validate(raw)
        by_id.setdefault(rec.id, rec)
    return [by_id[i] for i in sorted(by_id)]


def load_state(spec: TuningRunSpec, recipe: Recipe, records: list[TrialRecord] | None = None,
               status: dict[str, Any] | None = None) -> RunState:
    """The engine state of the run from its records (and, from its status, whether the search has ended)."""
    return RunState(baseline=recipe, config=tune_config(spec, recipe), records=list(records or []),
                    finished=(status or {}).get("searchStopped"))


def run_problem_for_refusal(code: int | None, reason: str, message: str) -> str | None:
    """A job creation refusal that is the run's configuration, not one trial's: the resource not served, or the
    operator not allowed to create it (``None``: the trial's own, or transient)."""
    low = message.lower()
    if code == 404:
        return "NotFound"
    if code == 403 and "quota" not in low and ("cannot create" in low or "forbidden: user" in low):
        return "Forbidden"
    return None


def _quota(code: int | None, message: str) -> bool:
    return code == 403 and "quota" in message.lower()


# -- the decision ----------------------------------------------------------------------------------------------------

class _Step:
    """One decision in progress: the run, what is known, and what it has decided so far."""

    def __init__(self, run: dict[str, Any], obs: Observations) -> None:
        self.run = run
        self.meta = run["metadata"]
        self.status = dict(run.get("status") or {})
        self.ns, self.name = self.meta["namespace"], self.meta["name"]
        self.uid = self.meta.get("uid")
        self.gen = self.meta.get("generation")
        self.obs = obs
        self.now = obs.now
        self.res = Result()
        self.patch: dict[str, Any] = {}
        self.conds = list(self.status.get("conditions") or [])
        self.blocking: list[tuple[str, str]] = []  # (reason, message): why the run cannot progress right now
        self.stalled: tuple[str, str] | None = None  # why the run failed
        self.new_refused: list[TrialRecord] = []

    def cond(self, ctype: str, ok: bool, reason: str, message: str = "") -> None:
        self.conds = set_condition(self.conds, ctype, ok, reason, message, self.now, self.gen)

    def old_cond(self, ctype: str) -> dict[str, Any] | None:
        return next((c for c in self.status.get("conditions") or [] if c.get("type") == ctype), None)

    def effect(self, e: Effect) -> None:
        self.res.effects.append(e)

    def fail(self, ctype: str, reason: str, message: str, *, permanent: bool = True) -> Result:
        """The run fails with ``reason`` (a configuration error unless ``permanent`` is False)."""
        self.cond(ctype, False, reason, message)
        self.patch.update(phase="Failed", message=message, completionTime=iso(self.now))
        self.res.event(reason, message, warning=True)
        if permanent:
            self.res.permanent = message
        self.stalled = (reason, message)
        self.patch["outcome"] = RunOutcome.FAILED.value
        return self.finish_status()

    def finish_status(self) -> Result:
        phase = self.patch.get("phase") or self.status.get("phase") or "Pending"
        message = self.patch.get("message", self.status.get("message", ""))
        outcome = self.patch.get("outcome") or self.status.get("outcome")
        kstatus_conditions(self, phase, str(message or ""), self.stalled, outcome)
        self.patch["conditions"] = stamp_conditions(self.conds, self.now, self.gen)
        self.patch["observedGeneration"] = self.gen
        self.res.status = self.patch
        return self.res


def kstatus_conditions(s: _Step, phase: str, message: str, stalled: tuple[str, str] | None,
                       outcome: str | None = None) -> None:
    """Ready, Reconciling and Stalled in the kstatus shape: Succeeded is Ready, its reason the run's outcome
    (:class:`~attune.operator.outcomes.RunOutcome`); Failed, or a run held by what someone must change (a missing
    Secret, a Kueue queue that does not exist), is Stalled; a run at work is Reconciling, its reason naming a hold
    that clears by itself (Prometheus unreachable, a discovery 503) while one holds it (:data:`~attune.operator.
    outcomes.HOLDS`)."""
    waiting = None
    if stalled is None and s.blocking and phase not in TERMINAL:
        stuck = [b for b in s.blocking if not hold(b[0]).clears]
        stalled = stuck[0] if stuck else None
        waiting = None if stuck else s.blocking[0]
    if phase == "Succeeded":
        why = outcome or "Succeeded"
        s.cond("Ready", True, why, message or "tuned")
        s.cond("Reconciling", False, why, "")
        s.cond("Stalled", False, why, "")
    elif phase == "Failed":
        reason, msg = stalled or ("Failed", message)
        s.cond("Ready", False, reason, msg)
        s.cond("Reconciling", False, "Failed", "")
        s.cond("Stalled", True, reason, msg)
    elif phase == "Suspended":
        s.cond("Ready", False, "Suspended", "spec.suspend is true: no new trial is launched")
        s.cond("Reconciling", False, "Suspended", "")
        s.cond("Stalled", False, "Suspended", "")
    else:
        current = s.patch.get("currentTrial") or s.status.get("currentTrial")
        what = f"{phase}: trial {current} in flight" if current else f"{phase}"
        if stalled is not None:
            s.cond("Stalled", True, stalled[0], stalled[1])
            s.cond("Reconciling", False, stalled[0], "cannot progress: " + stalled[1])
        elif waiting is not None:
            s.cond("Stalled", False, "Progressing", "")
            s.cond("Reconciling", True, waiting[0], "waiting (clears by itself): " + waiting[1])
            what = f"{what}; waiting: {waiting[1]}"
        else:
            s.cond("Stalled", False, "Progressing", "")
            s.cond("Reconciling", True, phase, what)
        s.cond("Ready", False, phase, what)


def _refresh_terminal(s: _Step) -> Result:
    """A finished run changes nothing but follows its generation (an edit after the end is observed, not acted on)."""
    conds = s.status.get("conditions") or []
    current = s.status.get("observedGeneration") == s.gen and all(
        c.get("lastTransitionTime") and c.get("observedGeneration") == s.gen for c in conds) and \
        {c.get("type") for c in conds} >= set(KSTATUS)
    if current or s.gen is None:
        return Result()
    kstatus_conditions(s, s.status["phase"], s.status.get("message", ""), None, s.status.get("outcome"))
    s.res.status = {"conditions": stamp_conditions(s.conds, s.now, s.gen), "observedGeneration": s.gen}
    return s.res


def decide(run: dict[str, Any], obs: Observations) -> Result:
    """The run's next step, from its spec, its status and ``obs`` alone (pure; see the module doc)."""
    s = _Step(run, obs)
    if s.status.get("phase") in TERMINAL:
        return _refresh_terminal(s)
    live = run.get("spec") or {}
    accepted = s.status.get("acceptedSpec")
    raw, ignored = merge_allowed_edits(accepted, live) if accepted is not None else (live, [])
    try:
        spec = TuningRunSpec.model_validate(raw)
    except ValueError as err:  # only without the webhook and the CRD's schema
        return s.fail("SpecAccepted", "InvalidSpec", f"spec is invalid: {err}")
    if ignored:
        msg = ("edits the spec does not allow are ignored: " + "; ".join(ignored) +
               "; the run goes on with the spec it started with (status.acceptedSpec)")
        old = s.old_cond("SpecAccepted")
        if not old or old.get("status") != "False" or old.get("message") != msg:
            s.res.event("FrozenFieldChanged", msg, warning=True)
        s.cond("SpecAccepted", False, "FrozenFieldChanged", msg)
    else:
        s.cond("SpecAccepted", True, "Accepted", "the spec is the one the run started with, with allowed edits"
               if accepted is not None else "")
    try:
        backend = backend_for(spec.trial_template)
    except ValueError as err:
        return s.fail("SpecAccepted", "InvalidTemplate", str(err))
    try:
        recipe = parse_recipe(s.status["baselineRecipe"], "status.baselineRecipe") \
            if s.status.get("baselineRecipe") else \
            resolve_recipe(spec, s.ns, lambda ns, n, k: obs.get("configmap", ns, n, k), run_name=s.name)
    except RecipeError as err:
        return s.fail("RecipeValid", "InvalidRecipe", str(err))
    unsupported = kubernetes_problems(spec, recipe)
    if unsupported:  # the webhook refuses these; a run that got past it fails instead of retrying forever
        return s.fail("RecipeValid", "NotRunnableOnKubernetes", "; ".join(unsupported))
    if _prometheus(recipe):
        problem = url_problem(spec.metrics.prometheus_url, "spec.metrics.prometheusUrl", s.ns)
        if problem:
            return s.fail("MetricsAvailable", "URLNotAllowed", problem)
        if spec.metrics.prometheus is not None and spec.metrics.prometheus.has_credentials():
            problem = credentials_problem(spec.metrics.prometheus_url, "spec.metrics.prometheusUrl")
            if problem:  # before any Secret is read: a token never goes where it could be read on the way
                return s.fail("MetricsAvailable", "InsecureCredentials", problem)
    if not s.status.get("baselineRecipe"):
        s.patch.update(baselineRecipe=recipe_to_dict(recipe), acceptedSpec=copy.deepcopy(live),
                       startTime=iso(s.now), phase="Baseline")
        s.cond("RecipeValid", True, "Parsed", "baseline recipe resolved")
        s.res.event("Started", f"tuning {recipe.name} within {spec.budget.accelerator_hours:g} accelerator-hours")

    listed = [t for t in obs.get("trials", s.ns, s.name) if (t.get("spec") or {}).get("runRef") == s.name]
    # a trial of this run being deleted is no longer one of its trials; another owner's, even being deleted, still
    # holds its name (TrialNameTaken below), as a real API server keeps it until its finalizers are done
    trials = [t for t in listed if _ours(t, s.uid) and not (t.get("metadata") or {}).get("deletionTimestamp")]
    by_index = {int(t["spec"]["index"]): t for t in trials}
    state = load_state(spec, recipe, fold_records(trials, s.status), s.status)
    recorded = {r.id for r in state.records}
    for t in trials:  # recorded trials whose job is still being stopped (a crash between the two writes)
        st = t.get("status") or {}
        if st.get("record") and st.get("jobStopping"):
            ref = st.get("jobRef") or {}
            s.effect(DeleteJob(s.ns, ref.get("name") or t["metadata"]["name"], ref.get("kind") or backend.kind))
            s.effect(PatchTrial(s.ns, t["metadata"]["name"], {"jobStopping": None}))
    lost = _lost(s, state)
    open_trials = sorted(i for i in by_index if i not in recorded)
    if (s.status.get("trialCreate") or {}).get("index") in by_index:
        s.patch["trialCreate"] = None  # created at last
        s.cond("TrialsAccepted", True, "Created", "")
    ctx = _Ctx(s, spec, backend, recipe, state)
    ctx.foreign = {t["metadata"]["name"]: t for t in listed if not _ours(t, s.uid)}
    if open_trials and spec.suspend:  # the trial in flight gives its pods back, unless it has already ended
        ctx.release(by_index[open_trials[-1]])
        s.patch["phase"] = "Suspended"
        s.cond("Suspended", True, "SuspendedByUser", "no new trial is launched; the trial in flight was stopped, "
                                                     "its pods released, and runs again from its start on resume")
    elif open_trials:
        ctx.follow(by_index[open_trials[-1]])
    elif spec.suspend:
        s.patch["phase"] = "Suspended"
        s.cond("Suspended", True, "SuspendedByUser", "no new trial is launched")
    else:
        s.cond("Suspended", False, "Running", "")
        ctx.advance()
    current = next((trial_name(s.name, i) for i in open_trials), None)
    if s.res.trials_recorded:
        current = None
    if ctx.created is not None:
        current = ctx.created
    refused_total = int((s.status.get("cursor") or {}).get("refused") or 0) + len(s.new_refused)
    s.patch.update(summary(state, s.name, refused_total))
    if current is not None:
        s.patch["trials"]["running"] = 1
        s.patch["trials"]["total"] += 1
    s.patch["currentTrial"] = current
    kept = list(s.status.get("refused") or []) + [stored_record(r) for r in s.new_refused]
    s.patch["refused"] = kept[-REFUSED_KEPT:]
    s.patch["cursor"] = {"nextTrial": state.next_id(), "recorded": len(state.records) +
                         max(refused_total - len(kept[-REFUSED_KEPT:]), 0), "refused": refused_total,
                         "hoursUsed": round(state.budget().used + lost[0], 6),
                         "trialsRun": _ran(state) + lost[1], "lostHours": round(lost[0], 6), "lostTrials": lost[1]}
    if lost != (0.0, 0):
        s.patch["budget"].update(hoursUsed=s.patch["cursor"]["hoursUsed"], hoursLimit=spec.budget.accelerator_hours)
    s.patch["queuedSeconds"] = round(sum(float((t.get("status") or {}).get("queuedSeconds") or 0) for t in trials), 3)
    if s.patch.get("phase") is None and s.status.get("phase") not in TERMINAL:
        s.patch["phase"] = "Baseline" if len(state.baselines()) < state.config.baseline_repeats else "Tuning"
    return s.finish_status()


def _ran(state: RunState) -> int:
    """Trials that ran to an end (what maxTrials counts: interrupted ones run again)."""
    return sum(1 for r in state.records if r.launched and r.outcome is not TrialOutcome.INTERRUPTED)


def _lost(s: _Step, state: RunState) -> tuple[float, int]:
    """Hours and trials the run's status counted but its TuningTrials no longer hold (deleted by a user): they stay
    spent. The budget and ``maxTrials`` the engine decides with shrink by them, ``JournalIntact`` says so, and the
    cursor keeps both totals monotone (a status written before they were kept has none: nothing is lost then)."""
    import dataclasses

    cur = s.status.get("cursor") or {}
    hours = max(float(cur.get("lostHours") or 0.0), float(cur.get("hoursUsed") or 0.0) - state.budget().used)
    hours = hours if hours > 1e-5 else 0.0
    trials = max(int(cur.get("lostTrials") or 0), int(cur.get("trialsRun") or 0) - _ran(state), 0)
    if not hours and not trials:
        if (s.old_cond("JournalIntact") or {}).get("status") == "False":
            s.cond("JournalIntact", True, "RecordsHeld", "")
        return 0.0, 0
    cfg = state.config
    state.config = dataclasses.replace(cfg, budget_hours=max(cfg.budget_hours - hours, 0.0),
                                       max_trials=None if cfg.max_trials is None else max(cfg.max_trials - trials, 0))
    msg = (f"{trials} trial record(s) and {hours:.4g} accelerator-hours are missing from the run's TuningTrials "
           "(deleted?): they stay charged and counted; the budget and maxTrials left shrink by them")
    if (s.old_cond("JournalIntact") or {}).get("message") != msg:
        s.res.event("RecordsMissing", msg, warning=True)
    s.cond("JournalIntact", False, "RecordsMissing", msg)
    return hours, trials


def _trailing_lost(state: RunState) -> int:
    """Trials at the end of the journal whose measurement Prometheus lost, in a row."""
    n = 0
    for r in reversed([r for r in state.records if r.launched]):
        if r.outcome is not TrialOutcome.INTERRUPTED or not r.message.startswith(MEASUREMENT_LOST):
            break
        n += 1
    return n


def _ours(trial: dict[str, Any], uid: str | None) -> bool:
    """A trial of this run: owned by it (an ownerless TuningTrial naming the run is never adopted)."""
    return not uid or owned_by(trial, uid)


def _prometheus(recipe: Recipe) -> bool:
    return bool(recipe.framework_impl.metrics_source == "prometheus")


class _Ctx:
    """The trial-level part of one decision."""

    def __init__(self, s: _Step, spec: TuningRunSpec, backend: JobBackend, recipe: Recipe, state: RunState) -> None:
        self.s, self.spec, self.backend, self.recipe, self.state = s, spec, backend, recipe, state
        self.created: str | None = None
        self.foreign: dict[str, dict[str, Any]] = {}  # TuningTrials of this run's name another owner holds
        self.versions: dict[str, str | None] = {}  # resourceVersion of each trial followed, as read
        self.held_accelerators = template_accelerators(spec.trial_template)[1]  # what each trial's pods request

    # -- recording ---------------------------------------------------------------------------------------------
    def record(self, tname: str, plan: TrialPlan, result: TrialResult, *, stop_job: tuple[str, str] | None = None,
               extra: dict[str, Any] | None = None) -> TrialRecord:
        """Record a finished trial on its TuningTrial (then stop its job, if it still runs)."""
        s = self.s
        rec = trial_record(self.state, plan, result)
        self.state.records.append(rec)
        s.res.trials_recorded.append(rec)
        status = {**trial_status_from_record(rec), "completionTime": iso(s.now), **(extra or {})}
        if stop_job is not None:
            status["jobStopping"] = True
        s.effect(PatchTrial(s.ns, tname, status, guard=self.versions.get(tname)))
        if stop_job is not None:
            s.effect(DeleteJob(s.ns, stop_job[0], stop_job[1]))
            s.effect(PatchTrial(s.ns, tname, {"jobStopping": None}))
        s.res.event("TrialFinished", f"trial {rec.id} ({rec.kind} {rec.label()}): {rec.outcome.value}; "
                                     f"{rec.decision}", warning=rec.outcome.failed)
        return rec

    def result(self, outcome: TrialOutcome, wall: float, message: str = "",
               measurement: Measurement | None = None) -> TrialResult:
        devices = self.recipe.resources.devices if self.recipe else 1
        wall = max(wall, 0.0)
        # a trial holds what its pods request, whatever its processes use: charged for that (item: a template with
        # nvidia.com/gpu: 8 and nprocPerNode 1 holds 8)
        held = max(devices, self.held_accelerators)
        return TrialResult(outcome, measurement, wall, devices, charge(held, wall), message)

    # -- the trial in flight -------------------------------------------------------------------------------------
    def plan_of(self, trial: dict[str, Any]) -> TrialPlan | None:
        """The plan of an open trial, as created (None: its knobs are invalid, and it is recorded crashed)."""
        tname = trial["metadata"]["name"]
        self.versions[tname] = (trial.get("metadata") or {}).get("resourceVersion")
        tspec, tstatus = trial["spec"], trial.get("status") or {}
        index, kind = int(tspec["index"]), tspec["kind"]
        base = self.state.baseline
        proposal = tspec.get("proposal") or {}
        try:
            recipe = apply_change(base, {k: v for k, v in base.knob_changes(tspec["knobs"]).items()
                                         if k in base.catalogue})
        except RecipeError as err:
            plan = TrialPlan(index, kind, base, dict(tspec.get("change") or {}), proposal.get("rationale", ""),
                             proposal.get("source", ""), tstatus.get("verdict"))
            self.record(tname, plan, self.result(TrialOutcome.CRASHED, 0.0, f"invalid trial: {err}"))
            return None
        self.recipe = recipe
        verdict = tstatus.get("verdict") or _verdict_for(self.state, kind, recipe, dict(tspec.get("change") or {}))
        return TrialPlan(index, kind, recipe, dict(tspec.get("change") or {}), proposal.get("rationale", ""),
                         proposal.get("source", ""), verdict)

    def follow(self, trial: dict[str, Any]) -> None:
        plan = self.plan_of(trial)
        if plan is None:
            return
        ref = (trial.get("status") or {}).get("jobRef")
        if not ref:
            self.create_job(trial, plan)
            return
        self.watch(trial, plan, str(ref.get("name") or trial["metadata"]["name"]))

    def release(self, trial: dict[str, Any]) -> None:
        """spec.suspend with a trial in flight: its job is deleted, so its pods give their accelerators back (what
        Kubeflow's own suspend does), and the trial is recorded interrupted: charged for the time its pods ran, not a
        failure, and run again from its start on resume (a measurement cut in two would not be the recipe's). A job
        that has already ended is followed as usual, so a finished trial's measurement is kept."""
        s, backend = self.s, self.backend
        plan = self.plan_of(trial)
        if plan is None:
            return
        tname, tstatus = trial["metadata"]["name"], trial.get("status") or {}
        ref = tstatus.get("jobRef") or {}
        jname = str(ref.get("name") or job_name(s.name, plan.id, int((tstatus.get("jobCreate") or {}).get("conflicts")
                                                                     or 0)))
        job = s.obs.get("job", s.ns, jname, backend.kind)
        tuid = trial["metadata"].get("uid", "")
        if job is not None and tuid and not owned_by(job, tuid):
            job = None  # a job of that name this trial does not own: never stopped here
        if job is not None and ref and backend.state(job)[0] in ("Succeeded", "Failed"):
            self.watch(trial, plan, jname)
            return
        running_since = parse_time(tstatus.get("runningSince"))
        if running_since is None and job is not None:
            try:
                running_since = pods_view(s.obs.get("pods", s.ns, backend.pod_selector(jname))).running_since
            except LogsUnavailable:
                running_since = None
        ran = max(s.now - running_since, 0.0) if running_since is not None else 0.0
        held = f"after its pods ran {ran:.0f} s (charged)" if running_since is not None else \
            "before its pods ran (nothing charged)"
        msg = (f"spec.suspend: its {backend.kind} {jname} was stopped {held}, releasing its pods; interrupted, not a "
               "failure: it runs again from its start on resume")
        self.record(tname, plan, self.result(TrialOutcome.INTERRUPTED, ran, msg),
                    stop_job=(jname, backend.kind) if job is not None else None)
        s.res.event("TrialReleased", f"{tname}: {msg}")

    def create_job(self, trial: dict[str, Any], plan: TrialPlan) -> None:
        s, backend = self.s, self.backend
        tname, tuid = trial["metadata"]["name"], trial["metadata"].get("uid", "")
        tstatus = trial.get("status") or {}
        jc = dict(tstatus.get("jobCreate") or {})
        attempt = int(jc.get("conflicts") or 0)
        jname = job_name(s.name, plan.id, attempt)
        try:
            served = s.obs.get("served", backend.api_version, backend.plural)
        except DiscoveryUnavailable as err:  # transient: wait and ask again, never fail the run on it
            msg = f"{tname}: API discovery of {backend.describe()} did not answer: {err}; retrying"
            s.cond("BackendAvailable", False, "DiscoveryUnavailable", msg)
            s.blocking.append(("DiscoveryUnavailable", msg))
            return
        if not served:
            other = next(k for k in ("PyTorchJob", "TrainJob") if k != backend.kind)
            msg = (f"the cluster serves no {backend.describe()} (API discovery): install "
                   f"{'the Kubeflow training operator' if backend.kind == 'PyTorchJob' else 'Kubeflow Trainer'} "
                   f"or give a {other} trial template")
            s.fail("BackendAvailable", "CRDNotInstalled", msg)
            return
        s.cond("BackendAvailable", True, "Served", f"{backend.describe()} served")
        existing = s.obs.get("job", s.ns, jname, backend.kind)
        ref = {"apiVersion": backend.api_version, "kind": backend.kind, "name": jname}
        if existing is not None:
            if owned_by(existing, tuid):  # created before a crash, not yet noted: adopt it
                created = parse_time((existing.get("metadata") or {}).get("creationTimestamp")) or s.now
                s.effect(PatchTrial(s.ns, tname, {"phase": "Queued", "jobRef": ref, "startTime": iso(created),
                                                   "jobCreate": None}))
                return
            nxt = job_name(s.name, plan.id, attempt + 1)
            msg = f"{tname}: a {backend.kind} named {jname} exists and is not this trial's; its job will be {nxt}"
            s.cond("JobsAccepted", False, "JobNameTaken", msg)
            s.res.event("JobNameTaken", msg, warning=True)
            s.effect(PatchTrial(s.ns, tname, {"jobCreate": {**jc, "conflicts": attempt + 1, "at": iso(s.now)}}))
            return
        refusals = int(jc.get("refusals") or 0)
        if refusals:
            code, reason, message = jc.get("code"), str(jc.get("reason") or ""), str(jc.get("message") or "")
            said = f"the API refused {tname}'s {backend.kind} {jname}: {code} {reason}: {message}".strip()
            config = run_problem_for_refusal(code, reason, message)
            if config is not None:
                s.fail("JobsAccepted", f"JobCreate{config}", said)
                return
            if _quota(code, message):
                created = parse_time(jc.get("since")) or s.now
                waited = s.now - created
                pdl = self.spec.budget.pending_deadline(backend.kueue(self.spec))
                s.cond("TrialQueued", True, "QuotaExceeded", f"{said} (waiting {waited:.0f} s, not charged)")
                if pdl is not None and waited > pdl:
                    self.gave_up_waiting(tname, plan, None, waited,
                                         f"its job could not be created within pendingDeadlineSeconds ({pdl} s): "
                                         f"{said}")
                    return
            elif refusals >= MAX_CREATE_REFUSALS:
                self.record(tname, plan, self.result(TrialOutcome.CRASHED, 0.0,
                                                     f"{said} ({refusals} times); nothing ran, nothing is charged"))
                s.cond("JobsAccepted", False, reason or "Refused", said)
                s.cond("TrialsHealthy", False, "JobRefused", said)
                return
            else:
                s.cond("JobsAccepted", False, reason or "Refused", f"{said} (attempt {refusals} of "
                                                                    f"{MAX_CREATE_REFUSALS})")
                s.blocking.append(("JobRefused", said))
        try:
            manifest = build_job({**s.run, "spec": _spec_wire(self.spec)}, trial, plan.recipe, attempt)
        except (ValueError, RecipeError) as err:
            self.record(tname, plan, self.result(TrialOutcome.CRASHED, 0.0, f"cannot build the trial's job: {err}"))
            s.cond("TrialsHealthy", False, "InvalidJob", f"{tname}: {err}")
            return
        s.effect(CreateJob(s.ns, tname, tuid, manifest, on_created={
            "phase": "Queued", "startTime": iso(s.now), "jobRef": ref, "jobCreate": None}, job_create=jc))
        if not refusals and not attempt:
            change = ", ".join(f"{k}={v}" for k, v in plan.change.items()) or "baseline"
            s.res.event("TrialStarted", f"trial {plan.id} ({plan.kind} {change}) as {backend.kind} {jname}")

    def watch(self, trial: dict[str, Any], plan: TrialPlan, jname: str) -> None:
        s, spec, backend = self.s, self.spec, self.backend
        tname, tuid = trial["metadata"]["name"], trial["metadata"].get("uid", "")
        tstatus = trial.get("status") or {}
        job = s.obs.get("job", s.ns, jname, backend.kind)
        created = parse_time(tstatus.get("startTime")) or s.now
        running_since = parse_time(tstatus.get("runningSince"))
        if job is None or (tuid and not owned_by(job, tuid)):
            ran = max(s.now - running_since, 0.0) if running_since is not None else 0.0
            what = "was deleted" if job is None else "was replaced by a job this trial does not own"
            msg = (f"its {backend.kind} {jname} {what} while it {'ran' if running_since else 'waited for its pods'}"
                   f"; interrupted, not a failure: the engine runs it again")
            self.record(tname, plan, self.result(TrialOutcome.INTERRUPTED, ran, msg))
            s.cond("TrialsHealthy", False, "JobDeleted", f"{tname}: {msg}")
            return
        phase, reason, message = backend.state(job)
        suspended = backend.suspended(job)
        try:
            pods = s.obs.get("pods", s.ns, backend.pod_selector(jname))
            pods_error: LogsUnavailable | None = None
        except LogsUnavailable as err:
            pods, pods_error = [], err
        view = pods_view(pods)
        if running_since is None:
            if view.running_since is not None:
                running_since = view.running_since
            elif phase == "Running" and not suspended and (pods_error is not None or not view.count):
                running_since = s.now  # pods not readable or not listed: the job's own word that they run
            elif phase in ("Succeeded", "Failed"):  # ran while nobody watched, its pods gone: the job's start
                running_since = parse_time((job.get("status") or {}).get("startTime")) or created
            if running_since is not None:
                running_since = max(running_since, created)
                s.effect(PatchTrial(s.ns, tname, {"phase": "Running", "runningSince": iso(running_since),
                                                   "runningObserved": iso(s.now),
                                                   "runningPods": pod_uids(pods) or None,
                                                   "queuedSeconds": round(running_since - created, 3)}))
        if running_since is None:
            self.queued(trial, plan, jname, job, suspended, view, created)
            return
        s.cond("TrialQueued", False, "Running", f"{tname}: running since {iso(running_since)} "
                                                f"(queued {running_since - created:.0f} s, not charged)")
        if suspended and phase not in ("Succeeded", "Failed"):
            ran = s.now - running_since
            msg = f"its {backend.kind} {jname} was suspended (preempted, e.g. by Kueue) after running {ran:.0f} s"
            self.record(tname, plan, self.result(TrialOutcome.INTERRUPTED, ran, msg), stop_job=(jname, backend.kind))
            s.cond("TrialsHealthy", False, "Preempted", f"{tname}: {msg}")
            return
        if pods_replaced(tstatus.get("runningPods"), pods):
            # suspended and admitted again between two looks (Kueue's preemption of a short urgent job), or evicted
            # and recreated: its processes started over, so a measurement would mix two starts
            finished = phase in ("Succeeded", "Failed")
            end = parse_time((job.get("status") or {}).get("completionTime")) if finished else None
            ran = (end or s.now) - running_since
            why = ("was suspended (preempted, e.g. by Kueue) and admitted again" if backend.was_suspended(job)
                   else "had its pods deleted and recreated (e.g. evicted)")
            msg = (f"its {backend.kind} {jname} {why} after its pods first ran: its processes started over, so it "
                   f"cannot be measured; interrupted after {ran:.0f} s (charged from its first start, the time it "
                   f"waited between included)")
            self.record(tname, plan, self.result(TrialOutcome.INTERRUPTED, ran, msg),
                        stop_job=None if finished else (jname, backend.kind))
            s.cond("TrialsHealthy", False, "Preempted", f"{tname}: {msg}")
            return
        deadline = spec.budget.trial_deadline_seconds
        # the deadline runs on the operator's own clock, from when it first saw the pods run: a node clock behind
        # the operator's (the container's startedAt) must not end a trial early
        seen = parse_time(tstatus.get("runningObserved")) or (running_since if tstatus.get("runningSince") else s.now)
        if phase in ("Pending", "Running") and s.now - max(running_since, seen) > deadline + DEADLINE_GRACE_S:
            self.record(tname, plan, self.result(TrialOutcome.TIMED_OUT, s.now - running_since,
                                                 f"the trial ran beyond its deadline ({deadline} s)"),
                        stop_job=(jname, backend.kind))
            s.cond("TrialsHealthy", False, "Deadline", f"{tname}: the trial ran beyond its deadline")
            return
        if not _prometheus(plan.recipe):
            self.follow_log(tname, plan, jname, job, pods, pods_error, running_since)
            return
        if phase in ("Pending", "Running"):
            return
        jend = parse_time((job.get("status") or {}).get("completionTime")) or s.now
        wall = jend - running_since
        if phase == "Failed":
            why = _with_failure(f"{reason} {message}".strip(), view.failure)
            self.record(tname, plan, self.result(failure_outcome(reason, why), wall, f"job failed: {why}"))
            s.cond("TrialsHealthy", False, "JobFailed", f"{tname}: {why}")
            return
        self.measure(tname, plan, jname, running_since, jend)

    def queued(self, trial: dict[str, Any], plan: TrialPlan, jname: str, job: dict[str, Any], suspended: bool,
               view: Any, created: float) -> None:
        """The trial's job exists but its pods do not run yet: waiting for accelerators, uncharged."""
        s, backend = self.s, self.backend
        tname = trial["metadata"]["name"]
        waited = s.now - created
        queue = ((job.get("metadata") or {}).get("labels") or {}).get(LABEL_QUEUE)
        if suspended:
            reason = "KueueSuspended" if queue else "JobSuspended"
            why = f"suspended by Kueue (queue {queue}) until admitted" if queue else "suspended"
            said = s.obs.get("workload", s.ns, (job.get("metadata") or {}).get("uid") or "") if queue else None
            if said and said["status"] == "False" and said["message"]:
                why = f"{why}: Kueue says: {said['message']}"
                if said["reason"] == "Inadmissible":  # its LocalQueue or ClusterQueue is missing or stopped
                    reason = "KueueInadmissible"
                    s.blocking.append((reason, f"{tname}: {why}"))
        elif not view.count and (refused := self.pods_refused(jname)) is not None:
            reason, why = "FailedCreatePod", refused
        else:
            reason = view.waiting_reason or "PodsPending"
            why = (f"pods not running: {view.waiting_reason}: {view.waiting_message}".rstrip(": ")
                   if view.waiting_reason else "waiting for its pods to be scheduled and start")
        pdl = self.spec.budget.pending_deadline(bool(queue))
        s.cond("TrialQueued", True, reason, f"{tname}: {why}; queued {waited:.0f} s"
                                            + (f" of at most {pdl} s" if pdl else "") + " (not charged)")
        if (trial.get("status") or {}).get("phase") != "Queued":
            s.effect(PatchTrial(s.ns, tname, {"phase": "Queued"}))
        if pdl is not None and waited > pdl:
            self.gave_up_waiting(tname, plan, (jname, backend.kind), waited,
                                 f"its pods did not run within pendingDeadlineSeconds ({pdl} s): {why}")

    def pods_refused(self, jname: str) -> str | None:
        """Why the job's controller could not create its pods, from the newest ``FailedCreate*`` Warning event on
        the job (admission refused them: a LimitRange's maximum, PodSecurity, a pod quota), else None. A training
        operator says so only in an event: the job's status stays empty and no pod exists to carry a reason."""
        s, backend = self.s, self.backend
        try:
            events = s.obs.get("job_warnings", s.ns, backend.kind, jname)
        except LogsUnavailable:
            return None  # events not readable: the generic wait
        failed = [e for e in events if str(e.get("reason", "")).startswith("FailedCreate")]
        if not failed:
            return None
        return f"its {backend.kind}'s pods could not be created: {str(failed[-1].get('message', ''))[:400]}"

    def gave_up_waiting(self, tname: str, plan: TrialPlan, job: tuple[str, str] | None, waited: float,
                        why: str) -> None:
        """The pending deadline passed: waiting is not the recipe's failure, so the trial is recorded interrupted
        (nothing charged, counted neither as failed nor toward maxTrials) and the run stops there, with what it has
        (re-creating the job would only send it to the back of the queue)."""
        s = self.s
        msg = f"{why}; nothing is charged"
        self.record(tname, plan, self.result(TrialOutcome.INTERRUPTED, 0.0, msg), stop_job=job,
                    extra={"queuedSeconds": round(waited, 3)})
        s.cond("TrialsHealthy", False, "PendingDeadline", f"{tname}: {msg}")
        self.state.finished = s.patch["searchStopped"] = f"stopped waiting for accelerators: {tname} {why}"
        self.complete(self.state.finished, RunOutcome.STOPPED_WAITING)

    def measure(self, tname: str, plan: TrialPlan, jname: str, start: float, end: float) -> None:
        s, m = self.s, self.spec.metrics
        wall = end - start
        try:
            access = self.access()
        except LookupError as err:
            msg = f"{tname}: cannot read Prometheus credentials: {err}"
            s.cond("MetricsAvailable", False, "SecretNotFound", msg)
            s.blocking.append(("SecretNotFound", msg))
            return
        try:
            meas = s.obs.get("measure", s.ns, jname, start, end, metrics=m, access=access,
                             tokens_per_step=plan.recipe.tokens_per_step, devices=plan.recipe.resources.devices,
                             pod_regex=self.backend.pod_regex("{job}"))
        except MetricsUnavailable as err:
            old = s.old_cond("MetricsAvailable")
            if not old or old.get("reason") != "PrometheusUnreachable":
                s.res.event("MetricsUnavailable", str(err), warning=True)
            s.cond("MetricsAvailable", False, "PrometheusUnreachable", str(err))
            s.blocking.append(("PrometheusUnreachable", str(err)))
            return
        if meas is None:
            from attune.operator.metrics import min_steps

            why = (f"Prometheus holds fewer than {min_steps(m)} of the {m.measure_steps} measured steps "
                   f"(minMeasuredFraction {m.min_measured_fraction:g})")
            lost = 1 + _trailing_lost(self.state)
            s.cond("MetricsAvailable", False, "TooFewSteps", f"{tname}: {why}")
            # Prometheus missing points (an outage, missed scrapes, a PodMonitor it does not select) is not the
            # recipe's failure: the trial is interrupted (its hours were spent, so charged) and run again
            self.record(tname, plan, self.result(TrialOutcome.INTERRUPTED, wall,
                                                 f"{MEASUREMENT_LOST}: the job succeeded but {why}"))
            if lost >= MAX_LOST_MEASUREMENTS:
                reason = (f"{lost} trials in a row ran but Prometheus holds too few of their steps ({why}): is "
                          "Prometheus scraping the trial pods (port attune-metrics of pods labelled attune.dev/run, "
                          "e.g. through the chart's PodMonitor, which its podMonitorSelector must select)?")
                s.cond("MetricsAvailable", False, "NoSamples", reason)
                self.state.finished = s.patch["searchStopped"] = reason
                self.complete(reason, RunOutcome.NO_SAMPLES)
            return
        s.cond("MetricsAvailable", True, "Measured", f"{tname}: {meas.steps_measured} steps measured")
        self.gpu_signals(tname, plan, meas)
        self.record(tname, plan, self.result(TrialOutcome.SUCCEEDED, wall, measurement=meas))
        s.cond("TrialsHealthy", True, "TrialSucceeded", f"{tname} succeeded")

    def gpu_signals(self, tname: str, plan: TrialPlan, meas: Measurement) -> None:
        """Report a GPU trial measured without DCGM data (utilisation signals guide the proposals)."""
        from attune.operator.metrics import DCGM_SIGNALS

        if str(getattr(plan.recipe.resources.accelerator, "value", plan.recipe.resources.accelerator)) == "cpu":
            return
        missing = sorted(set(DCGM_SIGNALS) - set(meas.signals))
        if len(missing) == len(DCGM_SIGNALS):
            self.s.cond("GPUMetricsAvailable", False, "NoDCGMData",
                        f"{tname}: Prometheus holds no DCGM exporter data for its pods (is dcgm-exporter running with "
                        f"--kubernetes, and are its pod labels {self.spec.metrics.dcgm.namespace_label}/"
                        f"{self.spec.metrics.dcgm.pod_label}, as spec.metrics.dcgm says? exported_namespace/"
                        f"exported_pod with its chart's honorLabels: false, namespace/pod with true)")
        elif missing:
            self.s.cond("GPUMetricsAvailable", True, "PartialDCGMData", f"{tname}: missing {', '.join(missing)}")
        else:
            self.s.cond("GPUMetricsAvailable", True, "DCGMData", "")

    def access(self) -> Access:
        """Prometheus credentials, CA and tenant, read from their Secrets and ConfigMaps (LookupError if missing)."""
        p = self.spec.metrics.prometheus
        ns, obs = self.s.ns, self.s.obs
        if p is None:
            return Access(tenant=orgs.org_for(ns))  # the platform's organisation of the namespace, never the run's
        token = obs.get("secret", ns, p.bearer_token_secret_ref.name, p.bearer_token_secret_ref.key) \
            if p.bearer_token_secret_ref else None
        basic = None
        if p.basic_auth_secret_ref:
            b = p.basic_auth_secret_ref
            basic = (obs.get("secret", ns, b.name, b.username_key), obs.get("secret", ns, b.name, b.password_key))
        ca = None
        if p.ca_config_map_ref:
            ca = obs.get("configmap", ns, p.ca_config_map_ref.name, p.ca_config_map_ref.key)
        elif p.ca_secret_ref:
            ca = obs.get("secret", ns, p.ca_secret_ref.name, p.ca_secret_ref.key)
        return Access(bearer_token=token, basic_auth=basic, ca_pem=ca, tenant=orgs.org_for(ns))

    def follow_log(self, tname: str, plan: TrialPlan, jname: str, job: dict[str, Any], pods: list[dict[str, Any]],
                   pods_error: LogsUnavailable | None, jstart: float) -> None:
        """Watch and measure a trial from its rank-0 pod's log (the user's own job, which does not stop by itself)."""
        s, backend, m = self.s, self.backend, self.spec.metrics
        phase, reason, message = backend.state(job)
        if phase == "Pending":
            return  # no pod has a log yet
        if phase == "Failed":
            message = _with_failure(message, pods_view(pods).failure)
        needed = m.warmup_steps + m.measure_steps
        plog: PodLog | None = None
        try:
            if pods_error is not None:
                raise pods_error
            pod = backend.master_pod(pods, jname)
            if pod is None:
                raise LogsUnavailable("NotFound", f"{jname}: no rank-0 pod (labels {backend.pod_selector(jname)}) yet")
            pname = pod["metadata"]["name"]
            text = s.obs.get("log", s.ns, pname, backend.container(pod, self.spec))
            plog = read_log(text, plan.recipe.framework_impl.pod_parser(plan.recipe))
            s.cond("MetricsAvailable", True, "PodLogRead",
                   f"{tname}: {len(plog.steps)} of {needed} steps in the log of pod {pname}")
        except LogsUnavailable as err:
            s.cond("MetricsAvailable", False, f"PodLog{err.reason}", str(err))
            if phase == "Running" or err.reason != "NotFound":
                if err.reason != "NotFound":
                    s.blocking.append((f"PodLog{err.reason}", str(err)))
                return
        window = None
        if plog is not None and plog.steps:  # the adaptive window (the engine's measure_plan) may end it sooner
            request = TrialRequest(trial_id=0, trial_dir=Path(tname), warmup_steps=m.warmup_steps,
                                   measure_steps=m.measure_steps, timeout_s=math.inf,
                                   plan=measure_plan(self.state, plan))
            window = window_end(measured_steps(plog.steps[:needed], plan.recipe.tokens_per_step), request,
                                plan.recipe.resources.devices)
            if window is not None and request.plan is not None:
                needed = min(needed, len(plog.steps))
        verdict = log_verdict(phase, plog, needed, reason=reason, message=message)
        if verdict.action == "wait":
            return
        jend = parse_time((job.get("status") or {}).get("completionTime")) or s.now
        running = phase in ("Pending", "Running")
        stop = (jname, backend.kind) if running else None
        if verdict.action == "measure":
            assert plog is not None
            end = plog.arrivals[needed - 1]
            wall = end - jstart
            meas = summarise(measured_steps(plog.steps[:needed], plan.recipe.tokens_per_step),
                             warmup_steps=window.warmup if window is not None else m.warmup_steps,
                             devices=plan.recipe.resources.devices, reported=plog.reported,
                             ended=window.reason if window is not None and window.reason != "fixed" else None)
            if meas is None or meas.tokens_per_s <= 0:
                why = "the pod log gives no token count per step: set spec.recipe.fromTemplate.tokensPerSample " \
                      "(or the recipe's launch.tokens_per_sample)"
                self.record(tname, plan, self.result(TrialOutcome.CRASHED, wall, why), stop_job=stop)
                s.cond("MetricsAvailable", False, "NoTokenCount", f"{tname}: {why}")
                return
            self.record(tname, plan, self.result(TrialOutcome.SUCCEEDED, wall,
                                                 f"measured from the log of its master pod ({needed} steps)", meas),
                        stop_job=stop)
            s.cond("TrialsHealthy", True, "TrialSucceeded", f"{tname} succeeded")
            return
        outcome = verdict.outcome or failure_outcome(reason, message)
        end = s.now if verdict.stop else jend
        meas = None
        if outcome is TrialOutcome.DIVERGED and plog is not None and plog.steps:
            meas = summarise(measured_steps(plog.steps, plan.recipe.tokens_per_step), warmup_steps=0,
                             devices=plan.recipe.resources.devices)
        self.record(tname, plan, self.result(outcome, end - jstart, verdict.message, meas),
                    stop_job=stop if verdict.stop or running else None)
        s.cond("TrialsHealthy", False, "JobFailed" if phase == "Failed" else "TrialFailed",
               f"{tname}: {verdict.message}")

    # -- no trial in flight ------------------------------------------------------------------------------------
    def advance(self) -> None:
        s, state = self.s, self.state
        held = self.foreign.get(trial_name(s.name, state.next_id()))
        if held is not None:  # a leftover of an earlier run of this name: never adopted, never patched
            owners = ", ".join(f"{r.get('kind', '?')} {r.get('name', '?')} (uid {r.get('uid', '?')})"
                               for r in (held.get("metadata") or {}).get("ownerReferences") or [])
            msg = (f"TuningTrial {held['metadata']['name']} exists and belongs to {owners or 'another owner'}, not "
                   "this run: waiting for Kubernetes to garbage-collect it (delete it to continue now)")
            s.cond("TrialsAccepted", False, "TrialNameTaken", msg)
            if (s.old_cond("TrialsAccepted") or {}).get("reason") != "TrialNameTaken":
                s.res.event("TrialNameTaken", msg, warning=True)
            return
        if (s.old_cond("TrialsAccepted") or {}).get("status") == "False":
            s.cond("TrialsAccepted", True, "Created", "")
        action = next_action(state)
        if action.kind is ActionKind.FINISH:
            self.complete(action.reason)
            return
        if action.kind is ActionKind.LOSS_CHECK and action.target is not None:
            self.loss_check(action.target)
            return
        if action.kind is ActionKind.DECIDE and action.target is not None:
            self.look(action.target)
            return
        room = s.obs.get("hours_left", s.ns)  # the platform's quota of the namespace: no new trial once it is spent
        if room is not None and room.hours <= 0:
            msg = f"no new trial until the period ends: {room.says(s.ns)}"
            s.cond("QuotaAvailable", False, "HoursQuotaSpent", msg)
            s.blocking.append(("HoursQuotaSpent", msg))
            if (s.old_cond("QuotaAvailable") or {}).get("status") != "False":
                s.res.event("HoursQuotaSpent", msg, warning=True)
            return
        if room is not None and (s.old_cond("QuotaAvailable") or {}).get("status") == "False":
            s.cond("QuotaAvailable", True, "HoursLeft", room.says(s.ns))
        if action.kind is ActionKind.PROPOSE:
            proposal: Proposal = s.obs.get("propose", state=state, agent=self.spec.agent, namespace=s.ns)
            if proposal.fallback_reason:
                s.cond("AgentAvailable", False, proposal.fallback_code,
                       f"{proposal.fallback_reason}; proposing with the local {self.spec.agent.fallback_policy} "
                       "policy")
                old = s.old_cond("AgentAvailable")
                if not old or old.get("status") != "False":
                    s.res.event("AgentFallback", proposal.fallback_reason, warning=True)
            else:
                s.cond("AgentAvailable", True, "Answered", "")
            resp = proposal.response
            if resp.action == "stop":  # the search is over: certify what it kept (the CLI's tuner does the same)
                state.finished = s.patch["searchStopped"] = f"policy stopped: {resp.reason}"
                after = next_action(state)
                if after.kind is ActionKind.CERTIFY:
                    self.launch(plan_trial(state, after))
                else:
                    self.complete(after.reason)
                return
            planned = plan_candidate(state, Change(set=resp.change, rationale=resp.rationale, source=resp.source),
                                     resp.source)
            if isinstance(planned, TrialRecord):
                state.records.append(planned)
                s.new_refused.append(planned)
                s.res.trials_recorded.append(planned)
                s.res.event("ProposalRefused", f"{planned.label()}: {planned.message}", warning=True)
                return
            self.launch(planned)
            return
        self.launch(plan_trial(state, action))

    def launch(self, plan: TrialPlan) -> None:
        """Create the next TuningTrial (its job is created on the next step, once the trial has a uid); after
        :data:`MAX_CREATE_REFUSALS` refusals of its creation that are neither a quota nor transient, the run fails
        saying what the API said (a cluster policy or webhook refusing the object is the platform's to fix)."""
        s = self.s
        tc = s.status.get("trialCreate") or {}
        if tc.get("index") == plan.id and not _quota(tc.get("code"), str(tc.get("message") or "")) and \
                int(tc.get("refusals") or 0) >= MAX_CREATE_REFUSALS:
            s.fail("TrialsAccepted", "TrialCreateRefused",
                   f"the API refused to create TuningTrial {trial_name(s.name, plan.id)} {tc.get('refusals')} times: "
                   f"{tc.get('code')} {tc.get('reason')}: {tc.get('message')}", permanent=False)
            return
        trial = build_trial(s.run, plan.id, plan.kind, plan.change, plan.recipe.effective_knobs, plan.source,
                            plan.rationale)
        s.effect(CreateTrial(trial, {"phase": "Pending", "verdict": plan.verdict}))
        self.created = trial["metadata"]["name"]
        s.res.event("TrialCreated", f"{self.created}: {plan.kind} {plan.rationale}".strip())

    def loss_check(self, target: TrialRecord) -> None:
        s, state = self.s, self.state
        # stored on the target's latest run (a look that sent it here is a record of no trial of its own)
        home = next(r for r in reversed(state.records) if r.launched and r.signature == target.signature)
        rec = loss_check_record(state, target)
        state.records.append(rec)
        s.res.trials_recorded.append(rec)
        result = rec.loss_check or {"passed": False, "reason": rec.decision}
        s.effect(PatchTrial(s.ns, trial_name(s.name, home.id), {"lossCheckRecord": stored_record(rec)}))
        for r in state.records:  # show the result on the candidate and confirm trials it judged
            if r.id < rec.id and r.kind in ("candidate", "confirm") and r.signature == rec.signature:
                s.effect(PatchTrial(s.ns, trial_name(s.name, r.id), {"lossCheck": result, "decision": rec.decision}))
        s.res.event("LossCheck", f"trial {target.id} ({target.label()}): {rec.decision}")

    def look(self, target: TrialRecord) -> None:
        """A look at ``target``'s paired decision on the runs made: its record is stored on the best's reference
        run it followed (each such run is followed by at most one look)."""
        s, state = self.s, self.state
        after = next(r for r in reversed(state.records) if r.launched)
        rec = decision_record(state, target)
        state.records.append(rec)
        s.res.trials_recorded.append(rec)
        s.effect(PatchTrial(s.ns, trial_name(s.name, after.id), {"decisionRecord": stored_record(rec)}))
        s.res.event("Decision", f"trial {target.id} ({target.label()}): {rec.decision}")

    def complete(self, reason: str, ending: RunOutcome | None = None) -> None:
        """The run ends: Succeeded with its tuned recipe written when a baseline ran, else Failed; ``ending`` is what
        stopped it early (waiting, no samples), else the outcome follows from the certification."""
        s, state = self.s, self.state
        ok = bool(state.baselines())
        best = state.best_recipe()
        if ending is None:
            ending = _outcome(state) if ok else RunOutcome.NO_BASELINE
        s.patch.update(phase="Succeeded" if ok else "Failed", message=reason, completionTime=iso(s.now),
                       outcome=ending.value)
        if ok:
            cm = tuned_configmap(s.run, best, state)
            s.effect(WriteConfigMap(cm, output=True))
            from attune.operator.lessons import lessons_configmap  # the namespace's lessons learn from this run
            s.effect(WriteConfigMap(lessons_configmap(s.run, state), best_effort=True))
            s.patch["tunedRecipe"] = recipe_to_dict(best)
            s.patch["tunedRecipeRef"] = {"configMap": cm["metadata"]["name"], "keys": sorted(cm["data"])}
        s.res.event("Finished", reason, warning=not ok)
        s.cond("Tuned", ok, ending.value, reason)
        if not ok:
            s.stalled = (ending.value, reason)


def _outcome(state: RunState) -> RunOutcome:
    """How a run with a baseline ended: a gain certified, found but not certified, or none shown."""
    if not state.baseline.knob_changes(state.best_recipe().knobs):
        return RunOutcome.NO_GAIN_SHOWN
    certified = state.certified()
    if certified is None:
        return RunOutcome.GAIN_NOT_CERTIFIED
    return RunOutcome.GAIN_CERTIFIED if certified.shown else RunOutcome.NO_GAIN_SHOWN


def _spec_wire(spec: TuningRunSpec) -> dict[str, Any]:
    return spec.model_dump(mode="json", by_alias=True, exclude_none=False)


def _verdict_for(state: RunState, kind: str, recipe: Recipe, change: dict[str, Any]) -> dict[str, Any] | None:
    """The gate's verdict of a trial whose stored one was lost (e.g. the operator died right after creating it)."""
    from attune.engine.loop import gate_proposal
    from attune.recipe.change import signature

    if kind == "confirm":
        sig = signature(recipe)
        return next((r.verdict for r in reversed(state.records) if r.kind == "candidate" and r.signature == sig), None)
    if kind == "candidate":
        return gate_proposal(state, Change(set=change)).verdict.to_dict()
    return evaluate(state.baseline, recipe, (), parent=state.baseline).to_dict()


def tuned_configmap(run: dict[str, Any], best: Recipe, state: RunState) -> dict[str, Any]:
    """The ConfigMap ``<run>-tuned`` holding the result, ready to commit (built by
    :func:`attune.operator.results.tuned_configmap`): ``recipe.yaml``, ``summary.yaml``, the user's trial template
    with exactly the kept changes (``pytorchjob.yaml`` / ``trainjob.yaml``), its patch (``tuned.patch.json``,
    ``tuned.diff``), the tuned container's own command (``command.sh``), and each file the tuned launch writes
    (``files.<name>``)."""
    from attune.operator import results

    meta = run["metadata"]
    summary = {"run": meta["name"], "baselineThroughput": state.baseline_throughput(),
               "bestThroughput": state.best_throughput(), "changes": state.baseline.knob_changes(best.knobs)}
    cm = results.tuned_configmap(run, best, state.baseline, summary)
    data = cm["data"]
    try:
        files = best.framework_impl.render(best).files if best.launch is not None else {}
    except (RecipeError, NotImplementedError, TypeError, ValueError):
        files = {}
    for i, (path, text) in enumerate(sorted(files.items())):
        key = "files." + "".join(ch if ch.isalnum() or ch in "-._" else "_" for ch in Path(path).name)
        data[key if key not in data else f"{key}.{i}"] = text
    return cm


# -- the edges -------------------------------------------------------------------------------------------------------

def observe(ports: Ports, key: tuple[Any, ...], args: dict[str, Any]) -> Any:
    """Fetch one observation; an expected failure is returned (and re-raised inside :func:`decide`)."""
    what = key[0]
    try:
        if what == "trials":
            return ports.list_trials(key[1], key[2])
        if what == "configmap":
            return ports.read_configmap(*key[1:])
        if what == "secret":
            return ports.read_secret(*key[1:])
        if what == "served":
            return ports.served(key[1], key[2])
        if what == "job":
            return ports.get_job(key[1], key[2], kind=key[3])
        if what == "pods":
            return ports.list_pods(key[1], key[2])
        if what == "job_warnings":
            return ports.job_warnings(key[1], key[2], key[3])
        if what == "workload":
            return ports.workload_admission(key[1], key[2])
        if what == "hours_left":
            return ports.hours_left(key[1])
        if what == "log":
            return ports.read_pod_log(key[1], key[2], key[3])
        if what == "measure":
            return ports.measure(args["metrics"], key[1], key[2], key[3], key[4],
                                 tokens_per_step=args["tokens_per_step"], devices=args["devices"],
                                 access=args["access"], pod_regex=args["pod_regex"])
        if what == "propose":
            return ports.propose(args["state"], args["agent"], namespace=args.get("namespace"))
    except (LookupError, LogsUnavailable, MetricsUnavailable) as err:
        return err
    raise ValueError(f"unknown observation {what!r}")


@dataclass
class Applied:
    """What applying a step's effects met: refused trial creations, and trials another writer recorded first."""

    refused: list[tuple[CreateTrial, ApiRefusal]] = field(default_factory=list)
    lost_race: list[str] = field(default_factory=list)
    foreign_outputs: list[str] = field(default_factory=list)  # why an output was not written


def apply_effects(effects: list[Effect], ports: Ports) -> Applied:
    """Carry out a step's effects in order; an API refusal of a job is reported on its trial (``jobCreate``), and
    refused trial creations are returned (the run's status reports them: :func:`report_trial_refusals`).

    A guarded trial patch (its record) is written only if the trial is still at the version the decision read,
    or at the one this step's own patches left: when another replica recorded it meanwhile (a peering hand-over),
    nothing more is written to that trial and the step's status is dropped (:func:`reconcile`)."""
    out = Applied()
    versions: dict[str, str] = {}  # each trial's version after this step's own writes
    for e in effects:
        if isinstance(e, PatchTrial) and e.name in out.lost_race:
            continue
        if isinstance(e, PatchTrial) and e.guard is not None:
            if not ports.record_trial_status(e.namespace, e.name, e.status, versions.get(e.name, e.guard)):
                log.info("trial %s/%s was written by another replica since it was read: not recording it",
                         e.namespace, e.name)
                out.lost_race.append(e.name)
            continue
        if isinstance(e, CreateTrial):
            try:
                created = ports.create_trial(e.trial)
            except ApiRefusal as err:
                out.refused.append((e, err))
                continue
            owner = next((r.get("uid") for r in e.trial["metadata"].get("ownerReferences") or []), None)
            if owner and not owned_by(created, owner):
                continue  # a 409 returned another owner's trial of this name: never patch it (decide waits it out)
            if e.status:
                meta = created.get("metadata") or {}
                ports.patch_trial_status(meta.get("namespace", e.trial["metadata"]["namespace"]),
                                         meta.get("name", e.trial["metadata"]["name"]), e.status)
        elif isinstance(e, PatchTrial):
            version = ports.patch_trial_status(e.namespace, e.name, e.status)
            if version:
                versions[e.name] = version
        elif isinstance(e, CreateJob):
            try:
                existing = ports.create_job(e.job)
            except ApiRefusal as err:
                jc = dict(e.job_create)
                ports.patch_trial_status(e.namespace, e.trial, {"jobCreate": {
                    **jc, "refusals": int(jc.get("refusals") or 0) + 1, "code": err.code, "reason": err.reason,
                    "message": err.message[:500], "at": e.on_created.get("startTime"),
                    "since": jc.get("since") or e.on_created.get("startTime")}})
                continue
            if existing is not None and not owned_by(existing, e.trial_uid):
                jc = dict(e.job_create)
                ports.patch_trial_status(e.namespace, e.trial, {"jobCreate": {
                    **jc, "conflicts": int(jc.get("conflicts") or 0) + 1, "at": e.on_created.get("startTime")}})
                continue
            status = dict(e.on_created)
            if existing is not None:
                born = parse_time((existing.get("metadata") or {}).get("creationTimestamp"))
                if born is not None:
                    status["startTime"] = iso(born)
            ports.patch_trial_status(e.namespace, e.trial, status)
        elif isinstance(e, DeleteJob):
            ports.delete_job(e.namespace, e.name, kind=e.kind)
        elif isinstance(e, WriteConfigMap) and e.output:
            decision = ports.write_output_configmap(e.configmap)
            if decision.action == "foreign":
                out.foreign_outputs.append(decision.message)
        elif isinstance(e, WriteConfigMap):
            try:
                ports.write_configmap(e.configmap)
            except Exception as err:  # noqa: BLE001 - only a best-effort write gets here without re-raising
                if not e.best_effort:
                    raise
                log.warning("ConfigMap %s/%s not written: %s", e.configmap["metadata"]["namespace"],
                            e.configmap["metadata"]["name"], str(err).splitlines()[0][:300])
    return out


def report_outputs(res: Result, run: dict[str, Any], foreign: list[str], now: float) -> None:
    """An output the run could not write because another owner holds its name: ``OutputWritten=False`` and a
    Warning event say whose it is, and the status no longer points at it."""
    if not foreign and not res.status.get("tunedRecipeRef"):
        return
    gen = (run.get("metadata") or {}).get("generation")
    conds = res.status.get("conditions") or []
    if foreign:
        message = "; ".join(foreign)
        conds = set_condition(conds, "OutputWritten", False, "OutputNameTaken", message, now, gen)
        res.status["tunedRecipeRef"] = None
        res.event("OutputNameTaken", message, warning=True)
    else:
        ref = res.status["tunedRecipeRef"]
        conds = set_condition(conds, "OutputWritten", True, "Written", f"ConfigMap {ref.get('configMap')}", now, gen)
    res.status["conditions"] = stamp_conditions(conds, now, gen)


def report_trial_refusals(res: Result, run: dict[str, Any], refused: list[tuple[CreateTrial, ApiRefusal]],
                          now: float) -> None:
    """Put refused TuningTrial creations on the run's status patch: ``trialCreate`` counts them (the decision fails
    the run after :data:`MAX_CREATE_REFUSALS` that are not a quota's), a condition and an event say what the API said,
    and no trial is in flight. A quota's refusal is waited out, as a job's is."""
    if not refused:
        return
    e, err = refused[-1]
    index = int(e.trial["spec"]["index"])
    old = (run.get("status") or {}).get("trialCreate") or {}
    count = int(old.get("refusals") or 0) + 1 if old.get("index") == index else 1
    quota = _quota(err.code, err.message)
    said = f"the API refused to create TuningTrial {e.trial['metadata']['name']}: {err.code} {err.reason}: " \
           f"{err.message}"
    reason = "QuotaExceeded" if quota else "TrialCreateRefused"
    message = said + ("; waiting for quota" if quota else f" (attempt {count} of {MAX_CREATE_REFUSALS})")
    st = res.status
    st["trialCreate"] = {"index": index, "refusals": count, "code": err.code, "reason": err.reason,
                         "message": err.message[:500], "at": iso(now), "since": old.get("since") or iso(now)}
    if st.get("currentTrial") == e.trial["metadata"]["name"]:
        st["currentTrial"] = None
        trials = st.get("trials") or {}
        if trials.get("running"):
            trials["running"] -= 1
            trials["total"] = max(int(trials.get("total") or 1) - 1, 0)
    gen = (run.get("metadata") or {}).get("generation")
    conds = st.get("conditions") or []
    conds = set_condition(conds, "TrialsAccepted", False, reason, message, now, gen)
    conds = set_condition(conds, "Stalled", False, "Progressing", "", now, gen)  # both clear by themselves (HOLDS)
    conds = set_condition(conds, "Reconciling", True, reason, "waiting (clears by itself): " + message, now, gen)
    st["conditions"] = stamp_conditions(conds, now, gen)
    res.event(reason, message, warning=True)


def reconcile(run: dict[str, Any], ports: Ports) -> Result:
    """Advance ``run`` by one step: observe what :func:`decide` asks for, decide, apply the effects. Returns the
    decision (its status patch is the caller's to write, after the effects)."""
    obs = Observations(ports.now())
    for _ in range(64):
        try:
            res = decide(run, obs)
        except NeedObservation as need:
            obs.values[need.key] = observe(ports, need.key, need.how)
            continue
        applied = apply_effects(res.effects, ports)
        if applied.lost_race:  # another replica decided this step first: its status stands, this one writes none
            return Result()
        report_trial_refusals(res, run, applied.refused, obs.now)
        report_outputs(res, run, applied.foreign_outputs, obs.now)
        return res
    raise RuntimeError("reconcile asked for too many observations")
