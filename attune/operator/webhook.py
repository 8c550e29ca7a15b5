"""The gate as admission control: pure checks of TuningTrial creation and TuningRun changes.

Each function returns the problems found (empty: admit). The kopf validation handlers in
:mod:`attune.operator.handlers` call them and raise ``kopf.AdmissionError`` with the messages; the
operator calls the same checks itself, so a missing webhook weakens nothing.
"""

from __future__ import annotations

from typing import Any

from attune.engine.state import RunState
from attune.errors import RecipeError
from attune.gate import Verdict, evaluate
from attune.gate.rules import whole_recipe
from attune.operator import orgs
from attune.operator.backends import JobBackend, backend_for
from attune.operator.manifests import build_job, build_trial
from attune.operator.reconcile import (
    fold_records,
    kubernetes_problems,
    load_state,
    resolve_recipe,
)
from attune.operator.resources import (
    API_VERSION,
    EDIT_RULE_MESSAGE,
    TuningRunSpec,
    spec_edit_problems,
)
from attune.operator.urls import credentials_problem, url_problem
from attune.recipe.change import apply_change
from attune.recipe.io import parse_recipe, recipe_to_dict
from attune.trainer.sinks import STEP_SERIES_CAP


def _spec(data: dict[str, Any]) -> TuningRunSpec | str:
    try:
        return TuningRunSpec.model_validate(data)
    except ValueError as err:
        return f"spec is invalid: {err}"


def _org_problems(spec: TuningRunSpec, run: dict[str, Any]) -> list[str]:
    """A run naming a Prometheus organisation other than the platform's for its namespace (:mod:`orgs`)."""
    access = spec.metrics.prometheus
    problem = orgs.run_org_problem(str((run.get("metadata") or {}).get("namespace") or ""),
                                   access.tenant if access is not None else None)
    return [problem] if problem else []


def budget_hours(run: dict[str, Any] | None) -> float | None:
    """A run's ``spec.budget.acceleratorHours`` (None: unset, or not a number: the schema refuses that)."""
    hours = (((run or {}).get("spec") or {}).get("budget") or {}).get("acceleratorHours")
    return float(hours) if isinstance(hours, (int, float)) and not isinstance(hours, bool) else None


def run_problems(new: dict[str, Any], old: dict[str, Any] | None = None, read_configmap: Any = None) -> list[str]:
    """Why a TuningRun create (``old`` None) or update must be refused.

    An update is judged on the spec alone: an unchanged spec (kopf's finalizer and annotation patches, a deletion)
    is always admitted, whatever happened to the recipe's ConfigMap meanwhile; a changed one must keep to the edit
    policy (:func:`~attune.operator.resources.spec_edit_problems`) and stay valid. Only a create resolves the
    recipe (reading its ConfigMap)."""
    if old is not None:
        old_spec, new_spec = old.get("spec") or {}, new.get("spec") or {}
        if old_spec == new_spec or (new.get("metadata") or {}).get("deletionTimestamp"):
            return []
        spec = _spec(new_spec)
        if isinstance(spec, str):
            return [spec]
        changed = spec_edit_problems(old_spec, new_spec, (old.get("status") or {}).get("acceptedSpec"))
        if changed:
            phase = (old.get("status") or {}).get("phase")
            where = f" while the run is {phase}" if phase else " once the run exists"
            return [f"{', '.join(changed)}: cannot change{where}; {EDIT_RULE_MESSAGE.split(': ', 1)[1]}"]
        return _org_problems(spec, new)
    spec = _spec(new.get("spec") or {})
    if isinstance(spec, str):
        return [spec]
    problems: list[str] = _org_problems(spec, new)
    meta = new.get("metadata") or {}
    try:
        recipe = resolve_recipe(spec, meta.get("namespace", ""), read_configmap, run_name=meta.get("name", ""))
    except RecipeError as err:
        return problems + [str(err)]
    unsupported = kubernetes_problems(spec, recipe)
    if unsupported:
        return problems + unsupported
    for name in spec.search_space:
        if name not in recipe.catalogue:
            problems.append(f"spec.searchSpace: {recipe.catalogue.unknown_knob_message(name)}")
    steps = spec.metrics.warmup_steps + spec.metrics.measure_steps
    if recipe.framework_impl.metrics_source == "prometheus":
        if steps > STEP_SERIES_CAP:
            problems.append(f"spec.metrics: warmupSteps + measureSteps is {steps}, but the trainer exports per-step "
                            f"losses for at most {STEP_SERIES_CAP} steps (no loss check could ever pass)")
        problem = url_problem(spec.metrics.prometheus_url, "spec.metrics.prometheusUrl", meta.get("namespace"))
        if problem:
            problems.append(problem)
        if spec.metrics.prometheus is not None and spec.metrics.prometheus.has_credentials():
            problem = credentials_problem(spec.metrics.prometheus_url, "spec.metrics.prometheusUrl")
            if problem:
                problems.append(problem)
    problem = url_problem(spec.agent.endpoint, "spec.agent.endpoint", meta.get("namespace"))
    if problem:
        problems.append(problem)
    problems += _job_problems(new, recipe)
    return problems


def _job_problems(run: dict[str, Any], recipe: Any) -> list[str]:
    """Whether the trial template turns into a job for the baseline (what every trial's job starts from)."""
    meta = run.get("metadata") or {}
    owner = {"apiVersion": API_VERSION, "kind": "TuningRun",
             "metadata": {"name": meta.get("name") or "run", "namespace": meta.get("namespace") or "default",
                          "uid": meta.get("uid") or "admission"}}
    trial = build_trial(owner, 1, "baseline", {}, recipe.effective_knobs, "baseline", "admission check")
    trial["metadata"]["uid"] = "admission"
    try:
        build_job({**owner, "spec": run.get("spec") or {}}, trial, recipe)
    except (ValueError, RecipeError) as err:
        return [f"spec.trialTemplate: {err}"]
    return []


def trial_verdict(run: dict[str, Any], trial: dict[str, Any], read_configmap: Any = None,
                  trials: list[dict[str, Any]] | None = None) -> Verdict | str:
    """The gate's verdict on a TuningTrial of ``run``, or why it cannot be judged at all."""
    status = run.get("status") or {}
    spec = _spec(status.get("acceptedSpec") or run.get("spec") or {})
    if isinstance(spec, str):
        return spec
    try:
        baseline = parse_recipe(status["baselineRecipe"], "status.baselineRecipe") if status.get("baselineRecipe") \
            else resolve_recipe(spec, run["metadata"].get("namespace", ""), read_configmap,
                                run_name=run["metadata"].get("name", ""))
    except RecipeError as err:
        return f"the run's baseline recipe is invalid: {err}"
    state: RunState = load_state(spec, baseline, fold_records(trials or [], status), status)
    tspec = trial.get("spec") or {}
    knobs = dict(tspec.get("knobs") or {})
    kind = tspec.get("kind", "candidate")
    outside = sorted(set(tspec.get("change") or {}) - set(state.config.search_space)) if kind == "candidate" else []
    if outside:
        return f"spec.change sets {', '.join(outside)}, outside the run's search space"
    changed = baseline.knob_changes(knobs)
    try:
        candidate: Any = apply_change(baseline, changed)
    except RecipeError:
        candidate = {**recipe_to_dict(baseline), "knobs": {**baseline.knobs, **changed}}
    if kind == "candidate":
        return evaluate(baseline, candidate, state.history(), parent=state.best_recipe())
    if kind == "certify":  # the final best or the baseline, whole: reached one group at a time, judged as a recipe
        return whole_recipe(evaluate(baseline, candidate, (), parent=baseline))
    # baselines, confirmations, paired references and calibrations repeat a configuration on purpose: no
    # never-repeat rule
    return evaluate(baseline, candidate, (), parent=state.best_recipe() if kind in ("confirm", "reference")
                    else baseline)


def trial_problems(run: dict[str, Any] | None, trial: dict[str, Any], read_configmap: Any = None,
                   trials: list[dict[str, Any]] | None = None) -> list[str]:
    """Why a TuningTrial must be refused (empty: admit); ``trials`` are the run's others (their records)."""
    if run is None:
        return [f"TuningRun {(trial.get('spec') or {}).get('runRef')!r} does not exist in this namespace"]
    verdict = trial_verdict(run, trial, read_configmap, trials)
    if isinstance(verdict, str):
        return [verdict]
    return [] if verdict.admitted else [r.render() for r in verdict.reasons]


def job_kind_to_check(new: dict[str, Any], old: dict[str, Any] | None) -> JobBackend | None:
    """The job kind whose ``create`` the writer of this run must hold themselves (the operator creates those jobs for
    them: a user who may only create TuningRuns must not get PyTorchJobs, or pods under any ServiceAccount, through
    it). Checked when a run is created and when an update changes its trial template; ``None`` otherwise, and for a
    template naming no backend (:func:`run_problems` refuses that)."""
    template = (new.get("spec") or {}).get("trialTemplate")
    if not isinstance(template, dict) or (new.get("metadata") or {}).get("deletionTimestamp"):
        return None
    if old is not None and (old.get("spec") or {}).get("trialTemplate") == template:
        return None
    try:
        return backend_for(template)
    except ValueError:
        return None


def job_permission_problem(userinfo: dict[str, Any], namespace: str, backend: JobBackend, allowed: bool,
                           reason: str) -> str | None:
    """The refusal of a run whose writer may not create its trials' jobs (a SubjectAccessReview's answer)."""
    if allowed:
        return None
    user = str((userinfo or {}).get("username") or "this user")
    why = f" ({reason})" if reason else ""
    return (f"{user} may not create {backend.plural}.{backend.group} in namespace {namespace}{why}: the operator "
            f"creates the run's trials as {backend.kind}s, so whoever writes the run's trialTemplate must hold that "
            f"permission themselves (ask for create on {backend.plural}.{backend.group} in {namespace})")


def tenant_problem(namespace: str, allowed: bool) -> str | None:
    """The refusal of a run in a namespace where the operator may not do a run's work (a cluster-wide install binds
    that work per tenant namespace: the chart's ``operator.tenantNamespaces``)."""
    if allowed:
        return None
    return (f"namespace {namespace} is not one of attune's tenant namespaces: the operator may not create its trials "
            f"there; ask the platform team to add it to the chart's operator.tenantNamespaces (or bind the ClusterRole "
            f"<release>-tenant in {namespace} with a RoleBinding)")


def run_status_writer_problem(writers: tuple[str, ...], userinfo: dict[str, Any], old: dict[str, Any] | None,
                              new: dict[str, Any]) -> str | None:
    """Why a write of a TuningRun's status subresource by ``userinfo`` must be refused (``None``: admit). The status
    holds what the operator runs (``status.acceptedSpec``) and what it has charged (the hours cursor): a user who may
    patch ``tuningruns/status`` could otherwise run a spec the webhook refused or spend hours twice. Only the
    operator (``writers``) changes it; a write that leaves it as it was (metadata) is admitted. No ``writers``: no
    check (as for trials)."""
    user = str((userinfo or {}).get("username") or "")
    if not writers or user in writers:
        return None
    if old is not None and old.get("status") == new.get("status"):
        return None
    return (f"only the attune operator ({', '.join(writers)}) may change a TuningRun's status: status.acceptedSpec "
            f"is the spec it runs and status.budget what it has charged; {user or 'this user'} may not (change "
            f"spec instead: the operator takes an edit its rules allow)")


def trial_writer_problem(writers: tuple[str, ...], userinfo: dict[str, Any], operation: str, subresource: str | None,
                         old: dict[str, Any] | None, new: dict[str, Any]) -> str | None:
    """Why a write of a TuningTrial by ``userinfo`` must be refused (``None``: admit). A trial's record is the run's
    journal and its budget: only the operator (``writers``) creates trials or changes their spec or status. Others
    may still change metadata (labels, annotations, the garbage collector's owner references). No ``writers``
    (the operator's own user unknown): no check."""
    user = str((userinfo or {}).get("username") or "")
    if not writers or user in writers:
        return None
    if operation == "UPDATE" and old is not None and old.get("spec") == new.get("spec") and \
            old.get("status") == new.get("status"):
        return None
    what = {"CREATE": "create TuningTrials", "UPDATE": f"change a TuningTrial's {subresource or 'spec'}"}.get(
        operation, operation.lower())
    return (f"only the attune operator ({', '.join(writers)}) may {what}: a trial's record is its run's journal and "
            f"budget; {user or 'this user'} may not (delete the TuningRun to start over)")
