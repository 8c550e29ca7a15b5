"""The equal-budget tuner benchmark: every tuner, the same engine, gate, simulator and budget.

Every tuner runs inside the engine's :class:`~attune.engine.loop.Tuner` on the simulator backend, with the same
budget (accelerator-hours), the same noise floor and confirmation rule, and the same gate; a refused proposal
is recorded and costs nothing. The tuners differ only in their policy:

* ``attune``: the engine with attune's own policy (``--attune-policy``, default ``playbook``), without
  lessons from earlier runs;
* ``random``, ``tpe``, ``gp``: Optuna's RandomSampler, TPESampler and GPSampler proposing whole configurations
  of the search space (:mod:`attune.policies.optuna`), behind the gate minus its one-coupling-group rule;
* ``llm``: attune's LLM policy, when this build has it.

For each (recipe, tuner, seed) the benchmark records the anytime curve (the *noiseless* throughput of the best
recipe the tuner has kept, against accelerator-hours spent), the final speedup over the starting recipe, the
fraction of the exhaustive optimum (:mod:`attune.bench.oracle`), hours spent on failed trials, and refusals.
"""

from __future__ import annotations

import math
import statistics
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attune.backends.simulated import FIRST_STEP_FACTOR, INIT_S_BASE, INIT_S_PER_BPARAM_PER_DEVICE, LAUNCH_S, \
    SimBackend, _params_per_device_b
from attune.bench.oracle import Oracle, oracle, true_throughput
from attune.bench.suite import Case, load_suite
from attune.engine.loop import RunState, TuneConfig, Tuner
from attune.engine.policy import Policy
from attune.engine.state import TrialOutcome
from attune.errors import AttuneError, PolicyError
from attune.recipe.model import Recipe

TUNERS = ("attune", "random", "tpe", "gp", "llm")
MAX_CONSECUTIVE_REFUSALS = 200
"""Refusals in a row that end a run (whole-configuration samplers draw many invalid layouts)."""
MAX_PROPOSALS = 3000
"""Hard cap on records per run, a guard against a policy that never stops proposing refused changes."""


class _MemoryJournal:
    """An in-memory stand-in for the engine's on-disk journal (benchmark runs are never resumed)."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def exists(self) -> bool:
        return bool(self.events)

    def append(self, event: Any, **payload: Any) -> None:
        self.events.append({"event": getattr(event, "value", event), **payload})

    def read(self) -> list[dict[str, Any]]:
        return list(self.events)


class BenchTuner(Tuner):
    """The engine's Tuner with an in-memory journal and a memoised gate history (same decisions, faster)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.journal = _MemoryJournal()  # type: ignore[assignment]
        self._history: dict[int, Recipe] = {}

    def _gate(self, candidate: Recipe | dict[str, Any], parent: Recipe) -> Any:
        for r in self.state.records:
            if r.knobs and r.outcome is not TrialOutcome.INTERRUPTED and r.id not in self._history:
                self._history[r.id] = self.state.baseline.with_knobs(**r.knobs)
        return self.gate(self.state.baseline, candidate, list(self._history.values()), parent=parent)

    def _propose_and_run(self) -> None:
        if len(self.state.records) >= MAX_PROPOSALS:
            self.state.finished = f"benchmark guard: {MAX_PROPOSALS} proposals"
            return
        super()._propose_and_run()


def trial_cost_hours(recipe: Recipe) -> float:
    """Expected accelerator-hours of one successful trial of ``recipe`` (noiseless, mid launch overhead)."""
    from attune.sim.perf import simulate

    res = simulate(recipe)
    step = res.step_time_s or 0.0
    t = recipe.tuning
    wall = (sum(LAUNCH_S) / 2 + INIT_S_BASE + INIT_S_PER_BPARAM_PER_DEVICE * _params_per_device_b(recipe)
            + step * (FIRST_STEP_FACTOR + t.warmup_steps - 1 + t.measure_steps))
    return recipe.resources.devices * min(wall, t.trial_timeout_s) / 3600.0


def parse_budget(text: str | float, recipe: Recipe) -> float:
    """Accelerator-hours from ``--budget``: a number of hours, or ``Nt`` for N trials' worth of this recipe."""
    s = str(text).strip().lower()
    try:
        if s.endswith(("trials", "t")):
            return float(s.rstrip("trials").rstrip("t")) * trial_cost_hours(recipe)
        hours = float(s)
    except ValueError:
        raise AttuneError(f"--budget {text!r}: give accelerator-hours (e.g. 40) or trials' worth (e.g. 15t)") from None
    if hours <= 0:
        raise AttuneError("--budget must be positive")
    return hours


def make_tuner(name: str, seed: int, attune_policy: str = "playbook") -> tuple[Policy, Callable[..., Any] | None, str]:
    """(policy, gate function or None for the engine's gate, description) of a benchmark tuner."""
    from attune.policies import make_policy

    if name == "attune":
        # every benchmark run starts without lessons, so seeds and tuners stay independent
        return make_policy(attune_policy, seed=seed, lessons=False), None, f"engine + {attune_policy} policy"
    if name in ("random", "tpe", "gp"):
        from attune.policies.optuna import OptunaPolicy, make_sampler, multi_knob_gate

        make_sampler(name, seed)  # raises PolicyError if unavailable
        return OptunaPolicy(name, seed=seed), multi_knob_gate, f"Optuna {name} sampler, whole configurations"
    if name == "llm":
        return make_policy("llm", seed=seed), None, "engine + LLM policy"
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


def run_job(job: Job) -> dict[str, Any]:
    """Run one (recipe, tuner, seed) and return its metrics; an unavailable tuner is reported, not raised."""
    t0 = time.monotonic()
    try:
        policy, gate, desc = make_tuner(job.tuner, job.seed, job.attune_policy)
    except (PolicyError, AttuneError) as err:
        return {"recipe": job.case.name, "tuner": job.tuner, "seed": job.seed, "available": False,
                "error": str(err)}
    recipe = job.case.recipe
    config = TuneConfig.from_recipe(recipe, job.budget_hours, max_consecutive_refusals=MAX_CONSECUTIVE_REFUSALS)
    backend = SimBackend(seed=_stable_seed(job), write_files=False)
    with tempfile.TemporaryDirectory(prefix="attune-bench-") as tmp:
        tuner = BenchTuner(recipe, backend=backend, policy=policy, config=config, run_dir=Path(tmp), gate=gate)
        state = tuner.run()
    out = metrics(state, job.optimum_tps)
    out.update(recipe=job.case.name, tuner=job.tuner, seed=job.seed, available=True, description=desc,
               policy=policy.name, budget_hours=job.budget_hours, seconds=time.monotonic() - t0)
    return out


def _stable_seed(job: Job) -> int:
    import zlib

    return zlib.crc32(f"{job.case.name}:{job.seed}".encode())  # same noise stream for every tuner


def metrics(state: RunState, optimum_tps: float) -> dict[str, Any]:
    """Benchmark figures of one finished run, with true (noiseless) throughputs of the kept recipes."""
    cache: dict[str, float] = {}
    base_tps = true_throughput(state.baseline, cache)
    best_tps = base_tps
    spent = wasted = 0.0
    curve = [(0.0, base_tps)]
    for r in state.records:
        spent += r.charged_hours
        if r.outcome.failed or r.outcome is TrialOutcome.INTERRUPTED:
            wasted += r.charged_hours
        if r.accepted:
            best_tps = true_throughput(state.baseline.with_knobs(**r.knobs), cache)
        curve.append((spent, best_tps))
    best_rec = state.best_record()
    return {
        "baseline_tps": base_tps,
        "best_tps": best_tps,
        "measured_best_tps": state.best_throughput(),
        "speedup": best_tps / base_tps if base_tps else None,
        "fraction_of_optimum": best_tps / optimum_tps if optimum_tps else None,
        "budget_used_hours": spent,
        "wasted_hours": wasted,
        "wasted_fraction": wasted / state.config.budget_hours if state.config.budget_hours else 0.0,
        "trials_launched": sum(1 for r in state.records if r.outcome is not TrialOutcome.REFUSED),
        "trials_failed": sum(1 for r in state.records if r.outcome.failed),
        "refusals": sum(1 for r in state.records if r.outcome is TrialOutcome.REFUSED),
        "stop_reason": state.finished,
        "best_changes": (state.baseline.knob_changes(best_rec.knobs)
                         if best_rec else {}),
        "curve": curve,
    }


def _median(xs: list[float]) -> float | None:
    xs = [x for x in xs if x is not None and not math.isnan(x)]
    return statistics.median(xs) if xs else None


def summarise_runs(runs: list[dict[str, Any]], tuners: list[str]) -> dict[str, Any]:
    """Per-tuner aggregates over every (recipe, seed), and the issue's done-criteria check."""
    per: dict[str, Any] = {}
    for t in tuners:
        rs = [r for r in runs if r["tuner"] == t and r.get("available")]
        if not rs:
            err = next((r.get("error") for r in runs if r["tuner"] == t), "not run")
            per[t] = {"available": False, "error": err}
            continue
        budget = sum(r["budget_hours"] for r in rs)
        per[t] = {
            "available": True,
            "runs": len(rs),
            "median_fraction_of_optimum": _median([r["fraction_of_optimum"] for r in rs]),
            "mean_fraction_of_optimum": statistics.fmean(r["fraction_of_optimum"] or 0.0 for r in rs),
            "min_fraction_of_optimum": min(r["fraction_of_optimum"] or 0.0 for r in rs),
            "median_speedup": _median([r["speedup"] for r in rs]),
            "wasted_hours": sum(r["wasted_hours"] for r in rs),
            "wasted_fraction_of_budget": sum(r["wasted_hours"] for r in rs) / budget if budget else 0.0,
            "median_wasted_fraction": _median([r["wasted_fraction"] for r in rs]),
            "mean_refusals": statistics.fmean(r["refusals"] for r in rs),
            "mean_trials_launched": statistics.fmean(r["trials_launched"] for r in rs),
            "mean_trials_failed": statistics.fmean(r["trials_failed"] for r in rs),
        }
    check: dict[str, Any] = {}
    a = per.get("attune", {})
    if a.get("available"):
        others = {t: v for t, v in per.items() if t != "attune" and v.get("available")}
        check = {
            "attune_median_fraction_at_least_0.95": (a["median_fraction_of_optimum"] or 0) >= 0.95,
            "attune_median_fraction_above_every_baseline": all(
                (a["median_fraction_of_optimum"] or 0) > (v["median_fraction_of_optimum"] or 0)
                for v in others.values()),
            "attune_wasted_below_every_baseline": all(
                a["wasted_hours"] < v["wasted_hours"] for v in others.values()),
            "baselines_compared": sorted(others),
        }
        check["met"] = all(v for k, v in check.items() if k != "baselines_compared")
    return {"tuners": per, "done_criteria": check}


def run_bench(suite: str | Path, *, tuners: list[str], budget: str, seeds: int, out_dir: Path,
              only: list[str] | None = None, limit: int | None = None, jobs: int = 1,
              attune_policy: str = "playbook", cache_dir: Path | None = None,
              on_progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run the benchmark and write ``bench.json``, ``bench.md`` and plots to ``out_dir``; return the document."""
    from attune.bench.report import write_report

    progress = on_progress or (lambda msg: None)
    for t in tuners:
        if t not in TUNERS:
            raise AttuneError(f"unknown tuner '{t}'; choose from {', '.join(TUNERS)}")
    if seeds < 1:
        raise AttuneError("--seeds must be at least 1")
    cases = load_suite(suite, only=only, limit=limit)
    t0 = time.monotonic()
    oracles: dict[str, Oracle] = {}
    budgets: dict[str, float] = {}
    for case in cases:
        o = oracle(case.recipe, cache_dir)
        oracles[case.name] = o
        budgets[case.name] = parse_budget(budget, case.recipe)
        progress(f"oracle {case.name}: {o.admissible:,} admissible of {o.space_size:,}, optimum "
                 f"{o.optimum_tps:,.0f} tok/s/dev = {o.optimum_tps / o.baseline_tps if o.baseline_tps else 0:.2f}× "
                 f"the start ({o.seconds:.1f} s)")
    job_list = [Job(case=c, tuner=t, seed=s, budget_hours=budgets[c.name], optimum_tps=oracles[c.name].optimum_tps,
                    attune_policy=attune_policy)
                for c in cases for t in tuners for s in range(seeds)]
    runs: list[dict[str, Any]] = []
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
    doc = {
        "suite": str(suite),
        "budget": str(budget),
        "seeds": seeds,
        "tuners": tuners,
        "attune_policy": attune_policy,
        "cases": [{"name": c.name, "file": c.path.name, "origin": c.origin, "devices": c.recipe.resources.devices,
                   "accelerator": c.recipe.resources.accelerator, "moe": bool(c.recipe.model and c.recipe.model.is_moe),
                   "budget_hours": budgets[c.name], "trial_cost_hours": trial_cost_hours(c.recipe),
                   "oracle": oracles[c.name].to_dict()} for c in cases],
        "runs": runs,
        "summary": summarise_runs(runs, tuners),
        "seconds": time.monotonic() - t0,
    }
    write_report(doc, out_dir)
    return doc


def _line(res: dict[str, Any]) -> str:
    if not res.get("available"):
        return f"{res['recipe']} {res['tuner']} seed {res['seed']}: unavailable ({res.get('error')})"
    return (f"{res['recipe']} {res['tuner']} seed {res['seed']}: {res['fraction_of_optimum']:.3f} of optimum, "
            f"{res['speedup']:.2f}×, wasted {res['wasted_hours']:.1f} h, {res['refusals']} refused, "
            f"{res['trials_launched']} launched ({res['seconds']:.1f} s)")


__all__ = ["TUNERS", "BenchTuner", "Job", "make_tuner", "metrics", "parse_budget", "run_bench", "run_job",
           "summarise_runs", "trial_cost_hours"]
