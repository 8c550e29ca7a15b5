"""The equal-budget tuner benchmark: every tuner, the same engine, gate, simulator and budget rule.

Every tuner runs inside the engine's :class:`~attune.engine.loop.Tuner` on the simulator backend, with the same
budget (accelerator-hours), the same noise floor, confirmation and paired-decision rules, and the same gate; a
refused proposal is recorded and costs nothing. The tuners differ only in their policy:

* ``attune``: the engine with attune's own policy (``--attune-policy``, default ``playbook``), without lessons from
  earlier runs, behind the engine's own gate (one coupling group per step, or two the catalogue declares coupled);
* ``random``, ``tpe``, ``gp``, ``cmaes``: Optuna's RandomSampler, TPESampler, GPSampler and CmaEsSampler proposing
  whole configurations of the gate's admissible space (:mod:`attune.policies.optuna`), behind the gate minus its
  one-coupling-group rule;
* ``grid``: a NeMo AutoConfigurator-style grid over TP/PP/CP/EP/micro-batch with memory-estimate pruning
  (:mod:`attune.policies.grid`), behind the same multi-knob gate;
* ``llm`` (attune's LLM policy) and ``optico`` (an OptiCo-style team of LLM roles, :mod:`attune.policies.optico`):
  only where an OpenAI-compatible endpoint is configured (``ATTUNE_LLM_BASE_URL``); elsewhere they are reported as
  not run, with the reason.

**One budget rule for all**, the engine's own (:func:`attune.engine.loop.decision_hours`, as ``attune tune --backend
sim`` runs it): a candidate is admissible only when what is left of the budget pays for the worst case of its
decision: the candidate run, and, where it could be promising, its re-run and the paired reference run of the best
(and the loss check's calibration run where one is still owed), each at the simulator's upper-bound price of a trial
(slowest launch, noise three sigma up). So no tuner overspends its budget, whatever it proposes, and none may step
outside the declared search space (a change naming another knob is refused). The benchmark adds nothing to the loop
but an in-memory journal and a guard on the number of records.

For each (recipe, tuner, seed, budget) the benchmark records the anytime curve (the *noiseless* throughput of the
best recipe the tuner has kept, against accelerator-hours spent), and from it :func:`metrics`: the fraction of the
exhaustive optimum (:mod:`attune.bench.oracle`), the share of the available gain captured, accelerator-hours to
reach 0.95 of the optimum, the area under the anytime curve, hours spent on failed trials, refusals, budget left
and why the run ended. :func:`summarise_runs` aggregates them per tuner and per recipe group with bootstrap
confidence intervals over recipes × seeds.
"""

from __future__ import annotations

import itertools
import math
import os
import random
import statistics
import tempfile
import time
import zlib
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attune.backends.simulated import SimBackend
from attune.bench.oracle import Oracle, oracle, true_throughput
from attune.bench.suite import Case, load_suite
from attune.engine.journal import MemoryJournal
from attune.engine.loop import Tuner
from attune.engine.policy import Policy
from attune.engine.state import RunState, TuneConfig
from attune.errors import AttuneError, PolicyError
from attune.gate.verdict import ReasonCode
from attune.recipe.model import Recipe
from attune.trial import TrialOutcome, TrialRequest

TUNERS = ("attune", "random", "tpe", "gp", "cmaes", "grid", "llm", "optico", "attune-fixed")
#: the attune tuner with each trial's fixed warm-up and window (``tuning.adaptive_window: false``): the measurement
#: before the adaptive window, run beside it on the same noise (issue 40's comparison)
FIXED_WINDOW = "attune-fixed"
BASELINES = ("random", "tpe", "gp", "cmaes", "grid")
LLM_TUNERS = ("llm", "optico")
MAX_CONSECUTIVE_REFUSALS = 200
"""Refusals in a row that end a run (a guard: the baselines never hand the engine a refused draw)."""
MAX_PROPOSALS = 3000
"""Hard cap on records per run, a guard against a policy that never stops proposing refused changes."""
TARGET = 0.95
"""The fraction of the optimum whose accelerator-hours-to-reach the benchmark reports."""
#: the done criteria of the "agent that learns" issue: the median fraction of the optimum at the largest budget run,
#: and the headroom group's median share of the available gain at 15 trials' worth
CEILING_TARGET = 0.99
SHARE_TARGET = 0.93
HEADROOM = 1.25
"""Recipes whose optimum is at least this many times their start form the ``headroom`` group."""
BOOTSTRAP = 2000
"""Bootstrap resamples of (recipe, seed) runs for the confidence intervals of the medians."""


def trial_cost_hours(recipe: Recipe) -> float:
    """Expected accelerator-hours of one successful trial of ``recipe`` (noiseless, mid launch overhead): the
    simulator's typical price of a trial with the recipe's own steps and timeout."""
    t = recipe.tuning
    request = TrialRequest(trial_id=0, trial_dir=Path("."), warmup_steps=t.warmup_steps, measure_steps=t.measure_steps,
                           timeout_s=t.trial_timeout_s)
    return SimBackend(noise=False, write_files=False).typical_hours(recipe, request) or 0.0


def priced_out(state: RunState) -> int:
    """Proposals refused because the budget left could not pay for their decision at its predicted worst case."""
    return sum(1 for r in state.records if r.outcome is TrialOutcome.REFUSED
               and any(x.get("code") == ReasonCode.BUDGET for x in (r.verdict or {}).get("reasons") or []))


def parse_budget(text: str | float, recipe: Recipe) -> float:
    """Accelerator-hours from ``--budget``: a number of hours, or ``Nt`` for N trials' worth of this recipe."""
    s = str(text).strip().lower()
    try:
        if s.endswith(("trials", "t")):
            hours = float(s.rstrip("trials").rstrip("t")) * trial_cost_hours(recipe)
        else:
            hours = float(s)
    except ValueError:
        raise AttuneError(f"--budget {text!r}: give accelerator-hours (e.g. 40) or trials' worth (e.g. 15t)") from None
    if not hours > 0 or not math.isfinite(hours):
        raise AttuneError("--budget must be positive")
    return hours


def llm_endpoint() -> str | None:
    """The configured OpenAI-compatible endpoint (``ATTUNE_LLM_BASE_URL``), or ``None``."""
    url = (os.environ.get("ATTUNE_LLM_BASE_URL") or "").strip()
    return url or None


def make_tuner(name: str, seed: int, attune_policy: str = "playbook",
               recipe: Recipe | None = None, lessons: str | None = None) -> tuple[Policy, Callable[..., Any] | None, str]:
    """(policy, gate function or None for the engine's gate, description) of a benchmark tuner; ``lessons`` (a
    store's path) runs attune warm, with that store (the lessons benchmark, :mod:`attune.bench.lessons`)."""
    from attune.policies import make_policy

    if name in ("attune", FIXED_WINDOW):
        if lessons is not None:
            from attune.agent.lessons import LessonStore

            return (make_policy(attune_policy, seed=seed, lessons=LessonStore(lessons)), None,
                    f"engine + {attune_policy} policy, warm (lessons from {Path(lessons).name})")
        # the tuner benchmark starts every run without lessons, so seeds and tuners stay independent
        return make_policy(attune_policy, seed=seed, lessons=False), None, f"engine + {attune_policy} policy"
    from attune.policies.optuna import multi_knob_gate

    if name in ("random", "tpe", "gp", "cmaes"):
        return (make_policy("optuna-random" if name == "random" else name, seed=seed), multi_knob_gate,
                f"Optuna {name} sampler over the admissible space, whole configurations")
    if name == "grid":
        return (make_policy("grid"), multi_knob_gate,
                "AutoConfigurator-style grid (TP/PP/CP/EP/MBS), memory-estimate pruning")
    if name in LLM_TUNERS:
        url = llm_endpoint()
        if url is None:
            raise PolicyError("no OpenAI-compatible endpoint is configured (set ATTUNE_LLM_BASE_URL): the LLM tuners "
                              "run only where one is")
        if name == "llm":
            return make_policy("llm", seed=seed, lessons=False), None, f"engine + LLM policy ({url})"
        return make_policy("optico", seed=seed), multi_knob_gate, f"OptiCo-style LLM roles ({url})"
    raise AttuneError(f"unknown tuner '{name}'; choose from {', '.join(TUNERS)}")


@dataclass(frozen=True)
class Job:
    """One benchmark run: a case, a tuner, a seed and the budget."""

    case: Case
    tuner: str
    seed: int
    budget_hours: float
    optimum_tps: float
    attune_policy: str = "playbook"
    budget: str = ""
    lessons: str | None = None  # a lessons store's path: attune runs warm with it
    learn: bool = False  # return the run's observations (what it would teach) with its metrics
    noise_seed: int | None = None  # the simulator's noise stream (default: from the recipe and the seed)


def tune_job(job: Job, policy: Policy, gate: Callable[..., Any] | None) -> tuple[RunState, SimBackend]:
    """One benchmark run: the engine's own :class:`Tuner` on the simulator (what ``attune tune --backend sim`` runs),
    with an in-memory journal and a guard on the number of records."""
    from attune.agent.lessons import noise_prior_overrides

    recipe = job.case.recipe
    backend = SimBackend(seed=_stable_seed(job) if job.noise_seed is None else job.noise_seed, write_files=False)
    config = TuneConfig.from_recipe(recipe, job.budget_hours, max_consecutive_refusals=MAX_CONSECUTIVE_REFUSALS,
                                    max_records=MAX_PROPOSALS,
                                    adaptive_window=False if job.tuner == FIXED_WINDOW else None,
                                    **noise_prior_overrides(getattr(policy, "lessons", None), recipe,
                                                            backend=backend.name))
    with tempfile.TemporaryDirectory(prefix="attune-bench-") as tmp:
        state = Tuner(recipe, backend=backend, policy=policy, config=config, run_dir=Path(tmp), gate=gate,
                      journal=MemoryJournal()).run()
    return state, backend


def run_job(job: Job) -> dict[str, Any]:
    """Run one (recipe, tuner, seed) and return its metrics; an unavailable tuner is reported, not raised."""
    t0 = time.monotonic()
    try:
        policy, gate, desc = make_tuner(job.tuner, job.seed, job.attune_policy, job.case.recipe, job.lessons)
    except (PolicyError, AttuneError) as err:
        return {"recipe": job.case.name, "tuner": job.tuner, "seed": job.seed, "budget": job.budget,
                "available": False, "error": str(err)}
    recipe = job.case.recipe
    state, backend = tune_job(job, policy, gate)
    out = metrics(state, job.optimum_tps, trial_hours=trial_cost_hours(recipe))
    from attune.report.evidence import steered

    moved = steered(state)  # the proposals lessons moved, and whether each was kept
    stats = dict(getattr(policy, "stats", {}) or {})
    usage = getattr(policy, "usage_log", None)
    if usage:
        stats["llm_proposals"] = len(usage)
        stats["llm_seconds"] = math.fsum(u.get("seconds", 0.0) for u in usage)
        stats["llm_tokens"] = sum(u.get("prompt_tokens", 0) + u.get("completion_tokens", 0) for u in usage)
        stats["llm_fallbacks"] = sum(1 for u in usage if u.get("fallback"))
    out.update(recipe=job.case.name, tuner=job.tuner, seed=job.seed, budget=job.budget, available=True,
               description=desc, policy=policy.name, budget_hours=job.budget_hours, unaffordable=priced_out(state),
               policy_stats=stats, seconds=time.monotonic() - t0,
               lesson_moved=len(moved), lesson_moved_kept=sum(1 for m in moved if m["kept"]))
    if job.learn:
        from attune.agent.lessons import distil, run_noise

        out["observations"] = [o.model_dump(mode="json") for o in
                               distil(state.baseline, state.records, state.config.min_gain, backend=backend.name)]
        noise = run_noise(state, backend=backend.name)
        out["noise"] = noise.model_dump(mode="json") if noise is not None else None
    return out


def noise_stream(name: str, seed: int) -> int:
    """The simulator's noise seed of recipe ``name`` at ``seed``: the same stream for every tuner and arm."""
    return zlib.crc32(f"{name}:{seed}".encode())


def _stable_seed(job: Job) -> int:
    return noise_stream(job.case.name, job.seed)


def metrics(state: RunState, optimum_tps: float, *, trial_hours: float | None = None) -> dict[str, Any]:
    """Benchmark figures of one finished run, with true (noiseless) throughputs of the kept recipes.

    ``gain_share`` is (best − start) / (optimum − start), ``None`` where the optimum is within 0.5 % of the start;
    ``hours_to_target`` the accelerator-hours spent when the kept recipe first reached ``TARGET`` of the optimum
    (``None``: never, within the budget); ``auc`` the mean fraction of the optimum over the budget (the anytime
    curve's area, budget normalised to 1). Hours past the budget never count: the curve is cut at the budget.
    """
    cache: dict[str, float] = {}
    budget = state.config.budget_hours
    base_tps = true_throughput(state.baseline, cache)
    best_tps = base_tps
    spent = wasted = 0.0
    curve = [(0.0, base_tps)]
    for r in state.records:
        spent += r.charged_hours
        if r.outcome.failed or r.outcome in (TrialOutcome.INTERRUPTED, TrialOutcome.MISMEASURED):
            wasted += r.charged_hours
        if r.accepted and spent <= budget * (1 + 1e-9):
            best_tps = true_throughput(state.baseline.with_knobs(**r.knobs), cache)
        curve.append((spent, best_tps))
    best_rec = state.best_record()
    frac = best_tps / optimum_tps if optimum_tps else None
    headroom = optimum_tps - base_tps
    share = (best_tps - base_tps) / headroom if optimum_tps > base_tps * 1.005 else None
    to_target = hours_to(curve, TARGET, optimum_tps)
    auc = _auc(curve, budget, optimum_tps)
    changes = state.baseline.knob_changes(best_rec.knobs) if best_rec else {}
    return {
        "baseline_tps": base_tps,
        "best_tps": best_tps,
        "measured_best_tps": state.best_throughput(),
        "speedup": best_tps / base_tps if base_tps else None,
        "fraction_of_optimum": frac,
        "gain_share": share,
        "hours_to_target": to_target,
        "trials_to_target": (to_target / trial_hours if to_target is not None and trial_hours else None),
        "auc": auc,
        "budget_used_hours": spent,
        "budget_left_hours": max(0.0, budget - spent),
        "budget_left_fraction": max(0.0, budget - spent) / budget if budget else 0.0,
        "overspend": max(0.0, spent - budget) / budget if budget else 0.0,
        "wasted_hours": wasted,
        "wasted_fraction": wasted / budget if budget else 0.0,
        "trials_launched": sum(1 for r in state.records if r.launched),
        "trials_failed": sum(1 for r in state.records if r.outcome.failed),
        "refusals": sum(1 for r in state.records if r.outcome is TrialOutcome.REFUSED),
        "accepted": sum(1 for r in state.records if r.accepted),
        "stop_reason": state.finished,
        "best_changes": changes,
        "outside_search_space": sorted(set(changes) - set(state.config.search_space)),
        "curve": curve,
    }


def hours_to(curve: Sequence[tuple[float, float]], target: float, optimum_tps: float | None,
             budget_hours: float | None = None) -> float | None:
    """Accelerator-hours spent when the anytime ``curve`` (hours spent, true throughput of the kept recipe) first
    reached ``target`` of the optimum; None: never (or only past ``budget_hours``, where given)."""
    if not optimum_tps:
        return None
    for h, tps in curve:
        if budget_hours is not None and h > budget_hours * (1 + 1e-9):
            return None
        if tps >= target * optimum_tps - 1e-9:
            return h
    return None


def _auc(curve: Sequence[tuple[float, float]], budget: float, optimum: float) -> float | None:
    """Mean of the step curve ``fraction of optimum`` over [0, budget] (exact integral of the steps)."""
    if not optimum or not budget:
        return None
    area, prev_h, prev_v = 0.0, 0.0, curve[0][1] / optimum
    for h, tps in curve[1:]:
        h = min(h, budget)
        area += (h - prev_h) * prev_v
        prev_h, prev_v = h, tps / optimum
    area += (budget - prev_h) * prev_v
    return area / budget


# -- aggregation -----------------------------------------------------------------------------------------

def _clean(xs: Sequence[float | None]) -> list[float]:
    return [x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]


def _median(xs: Sequence[float | None]) -> float | None:
    xs = _clean(xs)
    return statistics.median(xs) if xs else None


def bootstrap_ci(xs: Sequence[float | None], *, stat: Callable[[list[float]], float] = statistics.median,
                 reps: int = BOOTSTRAP, level: float = 0.95, seed: int = 0) -> tuple[float, float] | None:
    """Percentile bootstrap interval of ``stat`` over the runs (each (recipe, seed) run is one unit)."""
    xs = _clean(xs)
    if len(xs) < 2:
        return None
    rng = random.Random(seed)
    vals = sorted(stat([xs[rng.randrange(len(xs))] for _ in xs]) for _ in range(reps))
    lo = vals[int((1 - level) / 2 * reps)]
    hi = vals[min(reps - 1, int((1 + level) / 2 * reps))]
    return lo, hi


def median_or_never(xs: Sequence[float | None]) -> float | None:
    """Median where ``None`` means never (infinitely late); ``None`` when more than half never got there."""
    vals = sorted(math.inf if x is None else x for x in xs)
    if not vals:
        return None
    m = statistics.median(vals)
    return None if math.isinf(m) else m


def group_of(case: dict[str, Any]) -> str:
    """``headroom`` (optimum at least ``HEADROOM`` × the start) or ``little-left`` (NVIDIA rows and the like)."""
    o = case["oracle"]
    gain = o["optimum_tps"] / o["baseline_tps"] if o["baseline_tps"] else 1.0
    return "headroom" if gain >= HEADROOM else "little-left"


def _aggregate(rs: list[dict[str, Any]]) -> dict[str, Any]:
    budget = sum(r["budget_hours"] for r in rs)
    fr = [r["fraction_of_optimum"] for r in rs]
    sh = [r["gain_share"] for r in rs]
    to = [r["trials_to_target"] for r in rs]
    worst = min(rs, key=lambda r: r["fraction_of_optimum"] or 0.0)
    return {
        "available": True,
        "runs": len(rs),
        "median_fraction_of_optimum": _median(fr),
        "ci_fraction_of_optimum": bootstrap_ci(fr),
        "mean_fraction_of_optimum": statistics.fmean(r["fraction_of_optimum"] or 0.0 for r in rs),
        "min_fraction_of_optimum": worst["fraction_of_optimum"] or 0.0,
        "worst_run": f"{worst['recipe']} seed {worst['seed']}",
        "median_gain_share": _median(sh),
        "ci_gain_share": bootstrap_ci(sh),
        "median_trials_to_target": median_or_never(to),
        "ci_trials_to_target": bootstrap_ci([math.inf if x is None else x for x in to],
                                            stat=lambda v: statistics.median(v)),
        "reached_target": sum(1 for x in to if x is not None),
        "median_auc": _median([r["auc"] for r in rs]),
        "ci_auc": bootstrap_ci([r["auc"] for r in rs]),
        "median_speedup": _median([r["speedup"] for r in rs]),
        "wasted_hours": sum(r["wasted_hours"] for r in rs),
        "wasted_fraction_of_budget": sum(r["wasted_hours"] for r in rs) / budget if budget else 0.0,
        "max_overspend": max(r.get("overspend", 0.0) for r in rs),
        "median_budget_left": _median([r.get("budget_left_fraction") for r in rs]),
        "mean_refusals": statistics.fmean(r["refusals"] for r in rs),
        "mean_trials_launched": statistics.fmean(r["trials_launched"] for r in rs),
        "mean_trials_failed": statistics.fmean(r["trials_failed"] for r in rs),
        "outside_search_space": sum(1 for r in rs if r.get("outside_search_space")),
        "stop_reasons": _stop_reasons(rs),
    }


def _stop_reasons(rs: list[dict[str, Any]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in rs:
        reason = str(r.get("stop_reason") or "")
        key = reason.split(":")[0] if reason.startswith("policy stopped") else reason.split("(")[0].strip()
        if reason.startswith("policy stopped"):
            key = "policy stopped: " + reason.split(":", 1)[1].strip().split(" (")[0][:60]
        out[key] = out.get(key, 0) + 1
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def summarise_runs(runs: list[dict[str, Any]], tuners: list[str],
                   cases: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Per-tuner aggregates over every (recipe, seed), overall and per recipe group."""
    groups = {c["name"]: group_of(c) for c in cases or []}
    per: dict[str, Any] = {}
    by_group: dict[str, dict[str, Any]] = {}
    for t in tuners:
        rs = [r for r in runs if r["tuner"] == t and r.get("available")]
        if not rs:
            err = next((r.get("error") for r in runs if r["tuner"] == t), "not run")
            per[t] = {"available": False, "error": err}
            continue
        per[t] = _aggregate(rs)
        for g in sorted(set(groups.values())):
            grs = [r for r in rs if groups.get(r["recipe"]) == g]
            if grs:
                by_group.setdefault(g, {})[t] = _aggregate(grs)
    return {"tuners": per, "groups": by_group}


def _rises(xs: Sequence[float]) -> bool:
    """True when every figure is above the one before it."""
    return all(b > a for a, b in itertools.pairwise(xs))


def done_criteria(docs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The issue's done criteria over the budgets run (``docs`` maps a budget label to its document)."""
    out: dict[str, Any] = {}
    labels = list(docs)
    medians = []
    for b in labels:
        per = docs[b]["summary"]["tuners"]
        a = per.get("attune", {})
        if not a.get("available"):
            continue
        medians.append(a["median_fraction_of_optimum"])
        others = {t: v for t, v in per.items() if t != "attune" and v.get("available")}
        out[f"{b}: attune median fraction above every baseline"] = all(
            (a["median_fraction_of_optimum"] or 0) > (v["median_fraction_of_optimum"] or 0) for v in others.values())
        worse = [t for t, v in others.items() if a["min_fraction_of_optimum"] <= v["min_fraction_of_optimum"]]
        out[f"{b}: attune worst case above every baseline's"] = not worse
        if worse:
            out[f"{b}: baselines whose worst case attune does not beat"] = worse
    if len(medians) > 1:
        out["attune median fraction rises with budget"] = _rises(medians)
        for group in ("headroom", "little-left"):
            per = [docs[b]["summary"].get("groups", {}).get(group, {}).get("attune", {}) for b in labels]
            if all(a.get("available") for a in per):
                out[f"{group}: attune median fraction rises with budget"] = \
                    _rises([a["median_fraction_of_optimum"] or 0.0 for a in per])
    last = labels[-1] if labels else None
    if last is not None and docs[last]["summary"]["tuners"].get("attune", {}).get("available"):
        top = docs[last]["summary"]["tuners"]["attune"]["median_fraction_of_optimum"] or 0.0
        out[f"{last}: attune median fraction >= {CEILING_TARGET:g}"] = top >= CEILING_TARGET
    mid = "15t" if "15t" in docs else (labels[len(labels) // 2] if labels else None)
    if mid is not None:
        g = docs[mid]["summary"].get("groups", {}).get("headroom", {})
        a = g.get("attune", {})
        if a.get("available"):
            out[f"{mid} headroom: attune median gain share >= {SHARE_TARGET:g}"] = \
                (a["median_gain_share"] or 0) >= SHARE_TARGET
            base = [v["median_trials_to_target"] for t, v in g.items() if t != "attune" and v.get("available")
                    and v["median_trials_to_target"] is not None]
            mine = a["median_trials_to_target"]
            out[f"{mid} headroom: attune reaches {TARGET:g} of the optimum in at most a third of the best "
                "baseline's hours"] = mine is not None and (not base or mine <= min(base) / 3)
    out["met"] = all(v for k, v in out.items() if isinstance(v, bool))
    return out


# -- running ---------------------------------------------------------------------------------------------

def run_bench(suite: str | Path, *, tuners: list[str], budget: str | Sequence[str], seeds: int, out_dir: Path,
              only: list[str] | None = None, limit: int | None = None, jobs: int = 1,
              attune_policy: str = "playbook", cache_dir: Path | None = None,
              on_progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run the benchmark at one or more budgets and write ``bench.json``, ``bench.md`` and plots to ``out_dir``.

    With several budgets (``8t,15t,30t``) each budget's document and plots go to ``out_dir/<budget>/`` and the
    combined report to ``out_dir``; the returned document holds every budget under ``budgets``.
    """
    from attune.bench.report import write_combined, write_report

    progress = on_progress or (lambda msg: None)
    budgets = [b.strip() for b in (budget.split(",") if isinstance(budget, str) else budget) if str(b).strip()]
    if not budgets:
        raise AttuneError("--budget: give at least one budget")
    for t in tuners:
        if t not in TUNERS:
            raise AttuneError(f"unknown tuner '{t}'; choose from {', '.join(TUNERS)}")
    if seeds < 1:
        raise AttuneError("--seeds must be at least 1")
    cases = load_suite(suite, only=only, limit=limit)
    t0 = time.monotonic()
    oracles: dict[str, Oracle] = {}
    for case in cases:
        o = oracle(case.recipe, cache_dir)
        oracles[case.name] = o
        progress(f"oracle {case.name}: {o.admissible:,} admissible of {o.space_size:,}, optimum "
                 f"{o.optimum_tps:,.0f} tok/s/dev = {o.optimum_tps / o.baseline_tps if o.baseline_tps else 0:.2f}× "
                 f"the start ({o.seconds:.1f} s)")
    llm_note = (f"LLM tuners ran against {llm_endpoint()}" if llm_endpoint() else
                "LLM tuners (llm, optico) not run: no OpenAI-compatible endpoint is configured (ATTUNE_LLM_BASE_URL)")
    docs: dict[str, dict[str, Any]] = {}
    for b in budgets:
        hours = {c.name: parse_budget(b, c.recipe) for c in cases}
        job_list = [Job(case=c, tuner=t, seed=s, budget_hours=hours[c.name], optimum_tps=oracles[c.name].optimum_tps,
                        attune_policy=attune_policy, budget=b)
                    for c in cases for t in tuners for s in range(seeds)]
        runs: list[dict[str, Any]] = []
        tb = time.monotonic()
        if jobs > 1:
            with ProcessPoolExecutor(max_workers=jobs) as pool:
                for res in pool.map(run_job, job_list):
                    runs.append(res)
                    progress(_line(res))
        else:
            for job in job_list:
                res = run_job(job)
                runs.append(res)
                progress(_line(res))
        case_docs = [{"name": c.name, "file": c.path.name, "origin": c.origin, "devices": c.recipe.resources.devices,
                      "accelerator": c.recipe.resources.accelerator,
                      "moe": bool(c.recipe.model and c.recipe.model.is_moe),
                      "seq_length": c.recipe.training.seq_length if c.recipe.training else None,
                      "budget_hours": hours[c.name], "trial_cost_hours": trial_cost_hours(c.recipe),
                      "oracle": oracles[c.name].to_dict()} for c in cases]
        for cd in case_docs:
            cd["group"] = group_of(cd)
        docs[b] = {
            "suite": str(suite), "budget": b, "seeds": seeds, "tuners": tuners, "attune_policy": attune_policy,
            "llm": llm_note, "cases": case_docs, "runs": runs,
            "summary": summarise_runs(runs, tuners, case_docs), "seconds": time.monotonic() - tb,
        }
        if len(budgets) > 1:
            write_report(docs[b], Path(out_dir) / b)
    criteria = done_criteria(docs)
    for d in docs.values():
        d["summary"]["done_criteria"] = criteria
    if len(budgets) == 1:
        doc = docs[budgets[0]]
        doc["seconds"] = time.monotonic() - t0
        write_report(doc, out_dir)
        return doc
    combined = {"suite": str(suite), "budgets": docs, "seeds": seeds, "tuners": tuners, "llm": llm_note,
                "attune_policy": attune_policy, "done_criteria": criteria, "seconds": time.monotonic() - t0}
    write_combined(combined, out_dir)
    return combined


def _line(res: dict[str, Any]) -> str:
    if not res.get("available"):
        return f"{res['recipe']} {res['tuner']} seed {res['seed']}: unavailable ({res.get('error')})"
    return (f"[{res['budget']}] {res['recipe']} {res['tuner']} seed {res['seed']}: {res['fraction_of_optimum']:.3f} "
            f"of optimum, {res['speedup']:.2f}×, wasted {res['wasted_hours']:.1f} h, {res['refusals']} refused, "
            f"{res['trials_launched']} launched, {res['budget_left_fraction']:.0%} left ({res['seconds']:.1f} s)")


__all__ = ["BASELINES", "TUNERS", "Job", "bootstrap_ci", "done_criteria", "group_of", "make_tuner", "metrics",
           "parse_budget", "priced_out", "run_bench", "run_job", "summarise_runs", "trial_cost_hours", "tune_job"]
