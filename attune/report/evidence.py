"""The evidence a report and a recipe card show, computed from a run's state.

* :func:`loss_evidence`: the baseline's and the tuned recipe's loss curves and the tolerance band the gate's
  loss-equivalence check applies (re-derived from the same drift runs by :func:`attune.engine.loop.loss_band`, as
  :func:`attune.engine.loop.loss_check_record` does), with every loss-check verdict of the run;
* :func:`recipe_diff`: baseline → tuned in the framework's own form: the rendered launch (command line,
  environment, config files) where the framework renders one, else the recipe's YAML knobs;
* :func:`diagnoses`: each trial's diagnosed bottleneck (where attune's agent is installed);
* :func:`run_lessons`: the lessons this run added or changed (or, with lessons off, what it would teach).
"""

from __future__ import annotations

import difflib
import logging
import math
import shlex
import sys
from typing import Any

import yaml

from attune.engine.loop import common_steps, drift_runs, loss_band
from attune.engine.state import RunState
from attune.gate import LOSS_EQUIVALENCE, compare_losses
from attune.recipe.model import Recipe
from attune.trial import TrialOutcome

log = logging.getLogger(__name__)


def _finite(xs: list[float]) -> bool:
    return bool(xs) and all(isinstance(x, (int, float)) and math.isfinite(x) for x in xs)


def loss_evidence(state: RunState) -> dict[str, Any]:
    """Loss curves, tolerance band and loss-check verdicts of a run (JSON-serialisable)."""
    baseline_runs = [list(r.measurement.losses) for r in state.baselines() if r.measurement and r.measurement.losses]
    best = state.best_record()
    tuned_runs: list[list[float]] = []
    if best is not None:
        tuned_runs = [list(r.measurement.losses) for r in state.records
                      if r.signature == best.signature and r.kind in ("candidate", "confirm")
                      and r.outcome is TrialOutcome.SUCCEEDED and r.measurement and r.measurement.losses]
    # the engine's own drift reference for the tuned configuration (never a run of that configuration itself)
    drift = [list(d) for d in drift_runs(state, best.signature if best is not None else None) if d]
    tolerance: list[float] = []
    basis = ""
    comparison: dict[str, Any] | None = None
    if len(drift) >= 2 and all(_finite(d) for d in drift) and baseline_runs and min(map(len, drift)):
        cut = common_steps([*drift, *baseline_runs[:1], *tuned_runs])  # the steps every run ran, as the check did
        drift, baseline_runs = cut[:len(drift)], [cut[len(drift)], *baseline_runs[1:]]
        tuned_runs = cut[len(drift) + 1:]
        tol = loss_band(state, drift, baseline_runs[0])
        tolerance, basis = list(tol.per_step), tol.basis
        if tuned_runs and baseline_runs:
            worst = None
            for run in tuned_runs:
                res = compare_losses(baseline_runs[0], run, tol)
                if worst is None or (not res.passed and worst.passed) or (
                        res.passed == worst.passed and (res.worst_ratio or 0) > (worst.worst_ratio or 0)):
                    worst = res
            if worst is not None:
                comparison = {"passed": worst.passed, "reason": worst.reason,
                              "max_abs_diff": None if math.isnan(worst.max_abs_diff) else worst.max_abs_diff,
                              "worst_ratio": None if math.isnan(worst.worst_ratio) else worst.worst_ratio}
    checks = [{"trial": r.id, "change": dict(r.change), "accepted": r.accepted, "decision": r.decision,
               **(r.loss_check or {})} for r in state.records if r.kind == "loss_check"]
    owed = bool(best and best.verdict and LOSS_EQUIVALENCE in best.verdict.get("owed", []))
    # a recipe of several kept changes owes the check if any of its kept changes did
    owed = owed or any(r.accepted and r.verdict and LOSS_EQUIVALENCE in r.verdict.get("owed", [])
                       for r in state.records)
    own = [c for c in checks if best is not None and c["trial"] == best.id]
    if best is None:
        verdict = "no change kept"
    elif not owed:
        verdict = "not required"
    elif own:
        verdict = "passed" if own[0].get("passed") else "failed"
    else:
        kept_checks = [c for c in checks if c["accepted"]]
        verdict = "passed" if kept_checks and all(c.get("passed") for c in kept_checks) else "unchecked"
    values = [v for run in baseline_runs + tuned_runs for v in run]
    modelled = any(abs(v) > 0 for v in values if isinstance(v, (int, float)))
    return {"required": owed, "verdict": verdict, "modelled": modelled,
            "steps": max((len(r) for r in baseline_runs + tuned_runs), default=0),
            "reference": baseline_runs[0] if baseline_runs else [], "baseline_runs": baseline_runs,
            "tuned_runs": tuned_runs, "drift_runs": len(drift), "tolerance": tolerance, "tolerance_basis": basis,
            "comparison": comparison, "checks": checks, "numerics_opt_in": list(state.baseline.numerics_opt_in)}


# -- the diff, in the framework's own form ----------------------------------------------------------------

def launch_text(launch: Any) -> str:
    """A rendered launch as text to diff: environment, the command one argument per line, then its files."""
    argv = [("python" if a == sys.executable else a) for a in launch.argv]
    lines = [f"{k}={shlex.quote(str(v))}" for k, v in sorted(dict(launch.env).items())]
    if argv:
        parts = [shlex.quote(argv[0])]
        i = 1
        while i < len(argv):  # keep `--flag value` pairs on one line so the diff names the flag
            a = argv[i]
            if a.startswith("-") and "=" not in a and i + 1 < len(argv) and not argv[i + 1].startswith("-"):
                parts.append(f"{shlex.quote(a)} {shlex.quote(argv[i + 1])}")
                i += 2
            else:
                parts.append(shlex.quote(a))
                i += 1
        lines += [" \\\n    ".join(parts)]
    if launch.cwd:
        cwd = str(launch.cwd)
        lines.insert(0, f"# in {cwd if cwd.isprintable() else repr(cwd)}")  # a newline would end the comment
    for path, text in sorted(dict(launch.files).items()):
        lines.append(f"# file {path}:")
        lines.append(text.rstrip("\n"))
    return "\n".join(lines) + "\n"


def knobs_text(recipe: Recipe) -> str:
    return yaml.safe_dump({"knobs": dict(recipe.knobs)}, sort_keys=True)


def render_launch(recipe: Recipe) -> Any | None:
    """The framework's launch of ``recipe``, or ``None`` where the framework renders none."""
    try:
        return recipe.framework_impl.render(recipe)
    except Exception as err:  # noqa: BLE001 - frameworks without a renderer raise RecipeError; any failure: no launch
        log.debug("no rendered launch for %s: %s", recipe.name, err)
        return None


def recipe_diff(baseline: Recipe, tuned: Recipe) -> dict[str, Any]:
    """Baseline → tuned as a unified diff in the framework's own form (launch where rendered, else YAML knobs)."""
    lb, lt = render_launch(baseline), render_launch(tuned)
    if lb is not None and lt is not None:
        form, a, b = "launch", launch_text(lb), launch_text(lt)
        label = f"the {baseline.framework} launch (`attune render`): environment, command line and files"
    else:
        form, a, b = "knobs", knobs_text(baseline), knobs_text(tuned)
        label = f"the recipe's knobs (YAML; framework {baseline.framework} renders no launch command)"
    diff = list(difflib.unified_diff(a.splitlines(), b.splitlines(), "baseline", "tuned", lineterm="", n=2))
    changes = {k: {"from": baseline.effective_knobs.get(k), "to": v}
               for k, v in baseline.knob_changes(tuned.effective_knobs).items()}
    return {"form": form, "label": label, "baseline": a, "tuned": b, "diff": diff, "changes": changes}


# -- diagnosis and lessons ------------------------------------------------------------------------------

def diagnoses(state: RunState) -> dict[int, dict[str, Any]]:
    """Trial id → its diagnosis (bottleneck, confidence, evidence); empty where attune's agent is absent."""
    try:
        from attune.agent.diagnose import diagnose
    except ImportError:
        return {}
    out: dict[int, dict[str, Any]] = {}
    for r in state.records:
        if not r.launched:
            continue
        try:
            recipe = state.baseline.with_knobs(**state.baseline.knob_changes(r.knobs)) if r.knobs else state.baseline
            d = diagnose(r, recipe)
        except Exception as err:  # noqa: BLE001 - a diagnosis is commentary; never fail a report on it
            log.debug("no diagnosis of trial %s: %s", r.id, err)
            continue
        out[r.id] = {"label": d.label(), "confidence": d.confidence, "evidence": list(d.evidence)}
    return out


def _obs_summary(o: Any) -> str:
    action = f"{o.action.knob} {o.action.direction}" + ("" if o.action.value is None else f" → {o.action.value}")
    effect = getattr(o, "effect", None)
    result = f"{effect:+.1%}" if isinstance(effect, (int, float)) else f"failed ({getattr(o, 'outcome', '?')})"
    return f"{action} when {o.condition.bottleneck}: {result} [{getattr(o, 'verdict', '')}]".replace(" []", "")


def steered(state: RunState) -> list[dict[str, Any]]:
    """The proposals lessons moved in this run, and what came of each: its trial, the lessons, its outcome, its
    measured gain and whether the change was kept."""
    kept = {r.signature for r in state.records if r.accepted}
    return [{"trial": r.id, "change": dict(r.change), "lessons": list(r.lessons), "outcome": r.outcome.value,
             "gain": r.gain, "kept": bool(r.signature) and r.signature in kept, "decision": r.decision}
            for r in state.records if r.lessons and r.kind == "candidate"]


def run_lessons(state: RunState, run_id: str, backend: str | None = None) -> dict[str, Any]:
    """The lessons run ``run_id`` added or changed in the user's store, or what it would teach (lessons off), and
    the proposals lessons moved in it (``steered``)."""
    out = _run_lessons(state, run_id, backend)
    out["steered"] = steered(state)
    return out


def _run_lessons(state: RunState, run_id: str, backend: str | None = None) -> dict[str, Any]:
    try:
        from attune.agent import lessons as L
    except ImportError:
        return {"available": False, "recorded": False, "note": "attune's agent (lessons) is not installed",
                "lessons": []}
    if L.lessons_disabled():
        try:
            try:
                obs = L.distil(state.baseline, state.records, state.config.min_gain, backend=backend)
            except TypeError:  # an agent whose distil takes no backend
                obs = L.distil(state.baseline, state.records, state.config.min_gain)
        except Exception as err:  # noqa: BLE001
            log.debug("could not distil lessons: %s", err)
            obs = []
        items = [{"id": None, "change": "would add", "status": "hypothesis", "summary": _obs_summary(o),
                  "scope": o.scope.key()} for o in obs]
        return {"available": True, "recorded": False, "lessons": items,
                "note": "lessons are off (ATTUNE_LESSONS=off): nothing was recorded; this is what the run would "
                        "teach"}
    store = L.LessonStore()
    try:
        touched = [lz for lz in store.all() if run_id in lz.runs]
    except Exception as err:  # noqa: BLE001
        return {"available": True, "recorded": False, "note": f"could not read the lessons store: {err}",
                "lessons": []}
    items = [{"id": lz.id, "change": "added" if tuple(lz.runs) == (run_id,) else "changed", "status": lz.status,
              "summary": lz.summary(), "scope": lz.scope.key()} for lz in touched]
    return {"available": True, "recorded": True, "store": str(store.path), "lessons": items,
            "note": "" if items else "this run added or changed no lesson"}
