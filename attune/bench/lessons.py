"""The lessons benchmark: does what attune learnt from some jobs make it tune an unseen job faster, never slower?

Two designs, both on the simulator with the tuner benchmark's engine, gate and budget rule (:mod:`attune.bench.run`):

* **leave one family out** (``--lessons loo``): every recipe of the suite is tuned once per seed, cold, and what
  each run teaches is kept (the *learning* runs, on a noise stream of their own); then each recipe is tuned cold
  and warm at equal budget and seed, warm with a fresh store holding the lessons of every *other* model family's
  learning runs (the recipe's own family never teaches it);
* **learn from A, apply to B** (``--lessons learn=A,apply=B``): the learning runs are the recipes of suite A; every
  recipe of suite B is tuned cold and warm, warm with the lessons of all of A.

The warm tuner is the shipped tuner with its shipped defaults, lessons included; the cold one is the same with
lessons off. Each (recipe, seed) pair of runs shares its noise stream, so the difference is the lessons'. The
report gives, overall and per family, the medians of the fraction of the optimum, the share of the available gain,
trials' worth to 0.95 of the optimum, and the paired difference warm − cold with a bootstrap interval; and how
many proposals the lessons moved and how many of those were kept.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from attune.bench.oracle import oracle
from attune.bench.run import (
    TARGET,
    Job,
    _median,
    bootstrap_ci,
    median_or_never,
    noise_stream,
    parse_budget,
    run_job,
)
from attune.bench.suite import Case, load_suite
from attune.errors import AttuneError

LEARN_SEED_OFFSET = 7919
"""The learning runs' seeds are offset by this, so their noise is not the noise the evaluated runs see."""
MAX_TRIALS_TO_TARGET_RATIO = 0.75
"""Done when warm's median trials' worth to 0.95 of the optimum is at most this share of cold's."""
FAMILY_TOLERANCE = 0.02
"""Done when no family's warm median fraction of the optimum is more than this below cold's."""


def family_of(case: Case) -> str:
    m = case.recipe.model
    return m.family if m is not None else "native"


def parse_design(text: str) -> tuple[str, str | None, str | None]:
    """``loo`` or ``learn=A,apply=B`` → (design, suite A, suite B)."""
    t = text.strip()
    if t in ("loo", "leave-one-family-out"):
        return "loo", None, None
    parts = dict(p.split("=", 1) for p in t.split(",") if "=" in p)
    if set(parts) == {"learn", "apply"} and all(parts.values()):
        return "transfer", parts["learn"].strip(), parts["apply"].strip()
    raise AttuneError(f"--lessons {text!r}: give 'loo' (leave one model family out) or 'learn=SUITE_A,apply=SUITE_B'")


def _map(fn: Callable[[Job], dict[str, Any]], jobs: list[Job], workers: int,
         progress: Callable[[str], None], label: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if workers > 1:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            for i, res in enumerate(pool.map(fn, jobs), 1):
                out.append(res)
                if i % 10 == 0 or i == len(jobs):
                    progress(f"{label}: {i}/{len(jobs)} runs")
    else:
        for i, job in enumerate(jobs, 1):
            out.append(fn(job))
            if i % 10 == 0 or i == len(jobs):
                progress(f"{label}: {i}/{len(jobs)} runs")
    return out


def _write_store(path: Path, learnt: Sequence[dict[str, Any]]) -> int:
    """A fresh lessons store at ``path`` holding what the given learning runs teach (in suite order)."""
    from attune.agent.lessons import LessonStore, NoiseRecord, Observation

    store = LessonStore(path)
    for run in learnt:
        rid = f"{run['recipe']}#{run['seed']}"
        obs = [Observation.model_validate(o) for o in run.get("observations", [])]
        if obs:
            store.add(obs, rid)
        if run.get("noise"):
            store.add_noise(NoiseRecord.model_validate({**run["noise"], "run": rid}))
    store.save()
    return len(store.all())


def run_lessons_bench(suite: str | Path, *, design: str = "loo", budget: str = "15t", seeds: int = 3,
                      out_dir: Path, only: list[str] | None = None, jobs: int = 1, attune_policy: str = "playbook",
                      cache_dir: Path | None = None, on_progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run the lessons benchmark and write ``lessons.json`` and ``lessons.md`` (and a plot) to ``out_dir``."""
    progress = on_progress or (lambda msg: None)
    kind, suite_a, suite_b = parse_design(design)
    if seeds < 1:
        raise AttuneError("--seeds must be at least 1")
    if "," in budget:
        raise AttuneError("--budget: the lessons benchmark runs at one budget (e.g. 15t)")
    if kind == "loo":
        learn_cases = apply_cases = load_suite(suite, only=only)
    else:
        learn_cases = load_suite(suite_a or "", only=None)
        apply_cases = load_suite(suite_b or "", only=only)
    t0 = time.monotonic()
    every = {c.name: c for c in [*learn_cases, *apply_cases]}
    optimum = {}
    for name, c in every.items():
        o = oracle(c.recipe, cache_dir)
        optimum[name] = o.optimum_tps
    hours = {name: parse_budget(budget, c.recipe) for name, c in every.items()}
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    # 1. the learning runs: the shipped tuner, cold, on a noise stream of their own; keep what each run teaches
    learn_jobs = [Job(case=c, tuner="attune", seed=s, budget_hours=hours[c.name], optimum_tps=optimum[c.name],
                      attune_policy=attune_policy, budget=budget, learn=True,
                      noise_seed=noise_stream(c.name, s + LEARN_SEED_OFFSET))
                  for s in range(seeds) for c in learn_cases]
    learnt = _map(run_job, learn_jobs, jobs, progress, "learning runs")
    tmp = out_dir / "stores"  # kept: `attune lessons list --store` reads them
    tmp.mkdir(exist_ok=True)
    # 2. one store per (held-out family or all of A, seed): the lessons of the seed's learning runs
    stores: dict[tuple[str, int], str] = {}
    store_sizes: dict[str, int] = {}
    families = sorted({family_of(c) for c in apply_cases})
    for s in range(seeds):
        runs_s = [r for r in learnt if r["seed"] == s and r.get("available")]
        keys = families if kind == "loo" else ["*"]
        for fam in keys:
            taught = [r for r in runs_s if kind != "loo" or family_of(every[r["recipe"]]) != fam]
            path = tmp / f"{fam}-{s}.json"
            path.unlink(missing_ok=True)
            n = _write_store(path, taught)
            stores[(fam, s)] = str(path)
            store_sizes[f"{fam} seed {s}"] = n
    progress("lessons stores: " + ", ".join(f"{k}: {v}" for k, v in list(store_sizes.items())[:8])
             + (" …" if len(store_sizes) > 8 else ""))
    # 3. every evaluated recipe cold and warm, on the same noise stream
    eval_jobs = []
    for s in range(seeds):
        for c in apply_cases:
            key = (family_of(c) if kind == "loo" else "*", s)
            common = dict(case=c, tuner="attune", seed=s, budget_hours=hours[c.name], optimum_tps=optimum[c.name],
                          attune_policy=attune_policy, budget=budget, noise_seed=noise_stream(c.name, s))
            eval_jobs.append(Job(**common))  # type: ignore[arg-type]
            eval_jobs.append(Job(**common, lessons=stores[key]))  # type: ignore[arg-type]
    evaluated = _map(run_job, eval_jobs, jobs, progress, "cold and warm runs")
    for r in evaluated:
        r["arm"] = "warm" if "warm" in str(r.get("description", "")) else "cold"
        r["family"] = family_of(every[r["recipe"]])
        r.pop("curve", None)
    for r in learnt:
        r.pop("curve", None)
        r["observations"] = len(r.get("observations", []))
        r.pop("noise", None)
    summary = summarise(evaluated)
    doc = {"suite": str(suite), "design": kind, "learn": suite_a or str(suite), "apply": suite_b or str(suite),
           "budget": budget, "seeds": seeds, "attune_policy": attune_policy, "store_sizes": store_sizes,
           "families": {f: sorted(c.name for c in apply_cases if family_of(c) == f) for f in
                        sorted({family_of(c) for c in apply_cases})},
           "learning_runs": learnt, "runs": evaluated, "summary": summary, "seconds": time.monotonic() - t0}
    (out_dir / "lessons.json").write_text(json.dumps(doc, indent=1, default=str))
    (out_dir / "lessons.md").write_text(markdown(doc))
    _plot(doc, out_dir / "lessons.png")
    return doc


def _arm_figures(rs: list[dict[str, Any]]) -> dict[str, Any]:
    fr = [r["fraction_of_optimum"] for r in rs]
    sh = [r["gain_share"] for r in rs]
    to = [r["trials_to_target"] for r in rs]
    return {"runs": len(rs), "median_fraction": _median(fr), "ci_fraction": bootstrap_ci(fr),
            "median_gain_share": _median(sh), "ci_gain_share": bootstrap_ci(sh),
            "median_trials_to_target": median_or_never(to),
            "ci_trials_to_target": bootstrap_ci([math.inf if x is None else x for x in to]),
            "reached_target": sum(1 for x in to if x is not None),
            "worst_fraction": min((x for x in fr if x is not None), default=None),
            "lesson_moved": sum(r.get("lesson_moved", 0) for r in rs),
            "lesson_moved_kept": sum(r.get("lesson_moved_kept", 0) for r in rs)}


def _paired(cold: list[dict[str, Any]], warm: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """Median of warm − cold over (recipe, seed) pairs with its bootstrap interval."""
    by = {(r["recipe"], r["seed"]): r for r in cold}
    diffs = []
    for w in warm:
        c = by.get((w["recipe"], w["seed"]))
        if c is None or w.get(key) is None or c.get(key) is None:
            continue
        diffs.append(w[key] - c[key])
    return {"median": _median(diffs), "ci": bootstrap_ci(diffs), "pairs": len(diffs),
            "warm_better": sum(1 for d in diffs if d > 1e-9), "warm_worse": sum(1 for d in diffs if d < -1e-9)}


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Cold and warm side by side, overall and per family, with the done criteria."""
    ok = [r for r in runs if r.get("available")]

    def block(rs: list[dict[str, Any]]) -> dict[str, Any]:
        cold = [r for r in rs if r["arm"] == "cold"]
        warm = [r for r in rs if r["arm"] == "warm"]
        return {"cold": _arm_figures(cold), "warm": _arm_figures(warm),
                "fraction_difference": _paired(cold, warm, "fraction_of_optimum"),
                "share_difference": _paired(cold, warm, "gain_share")}

    overall = block(ok)
    per_family = {f: block([r for r in ok if r["family"] == f]) for f in sorted({r["family"] for r in ok})}
    c, w = overall["cold"], overall["warm"]
    crit: dict[str, Any] = {}
    ct, wt = c["median_trials_to_target"], w["median_trials_to_target"]
    crit[f"warm reaches {TARGET:g} of the optimum in at most {MAX_TRIALS_TO_TARGET_RATIO:g} of cold's trials' worth"] = (
        wt is not None and ct is not None and wt <= MAX_TRIALS_TO_TARGET_RATIO * ct + 1e-9)
    crit["warm's median share of the gain is at least cold's"] = (
        (w["median_gain_share"] or 0.0) >= (c["median_gain_share"] or 0.0) - 1e-9)
    lagging = [f for f, b in per_family.items()
               if (b["warm"]["median_fraction"] or 0.0) < (b["cold"]["median_fraction"] or 0.0) - FAMILY_TOLERANCE]
    crit[f"no family's warm median fraction is more than {FAMILY_TOLERANCE:g} below cold's"] = not lagging
    if lagging:
        crit["families where warm lags"] = lagging
    crit["met"] = all(v for v in crit.values() if isinstance(v, bool))
    return {"overall": overall, "families": per_family, "done_criteria": crit,
            "trials_to_target_ratio": (wt / ct if wt is not None and ct else None)}


def _f(x: Any, fmt: str = "{:.3f}") -> str:
    if x is None:
        return "never"
    if isinstance(x, float) and math.isinf(x):
        return "never"
    return fmt.format(x)


def _ci(ci: Any, fmt: str = "{:.3f}") -> str:
    return f" [{_f(ci[0], fmt)}, {_f(ci[1], fmt)}]" if ci else ""


def _row(name: str, b: dict[str, Any]) -> str:
    c, w, d, ds = b["cold"], b["warm"], b["fraction_difference"], b["share_difference"]
    return (f"| {name} | {c['runs']} | {_f(c['median_fraction'])} | {_f(w['median_fraction'])} | "
            f"{_f(d['median'], '{:+.3f}')}{_ci(d['ci'], '{:+.3f}')} ({d['warm_better']}↑ {d['warm_worse']}↓) | "
            f"{_f(c['median_gain_share'])} | {_f(w['median_gain_share'])} | {_f(ds['median'], '{:+.3f}')}"
            f"{_ci(ds['ci'], '{:+.3f}')} | {_f(c['median_trials_to_target'], '{:.1f}')} ({c['reached_target']}) | "
            f"{_f(w['median_trials_to_target'], '{:.1f}')} ({w['reached_target']}) | {_f(c['worst_fraction'])} | "
            f"{_f(w['worst_fraction'])} | {w['lesson_moved']} ({w['lesson_moved_kept']}) |")


def markdown(doc: dict[str, Any]) -> str:
    s = doc["summary"]
    design = ("leave one model family out: each recipe is tuned warm with the lessons of every other family's "
              "learning runs" if doc["design"] == "loo" else
              f"learn from `{doc['learn']}`, apply to `{doc['apply']}`")
    lines = [f"# attune lessons benchmark: `{doc['suite']}` at {doc['budget']}", "",
             f"{design}; {doc['seeds']} seed(s); the shipped tuner (`{doc['attune_policy']}`) cold (lessons off) "
             "and warm (a fresh store of what the learning runs taught) at equal budget, each (recipe, seed) pair on "
             "one noise stream; the learning runs use noise streams of their own. Simulator backend. fraction = "
             "noiseless throughput of the kept recipe / exhaustive optimum; share = (best − start) / (optimum − "
             "start); Δ = median of warm − cold over (recipe, seed) pairs with its 95 % bootstrap interval and how "
             "many pairs warm won (↑) or lost (↓); trials to 0.95 = trials' worth of budget until the kept recipe "
             "reached 0.95 of the optimum, median (runs that got there); lessons moved = proposals whose rank the "
             "lessons changed (of them kept).", "",
             "| family | runs | cold fraction | warm fraction | Δ fraction | cold share | warm share | Δ share | "
             "cold trials to 0.95 | warm trials to 0.95 | cold worst | warm worst | lessons moved (kept) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
             _row("**all**", s["overall"])]
    for fam, b in s["families"].items():
        lines.append(_row(fam, b))
    ratio = s.get("trials_to_target_ratio")
    lines += ["", f"Warm needs {_f(ratio, '{:.2f}')}× cold's trials' worth to reach {TARGET:g} of the optimum "
              "(medians).", "", "Done criteria:", ""]
    lines += [f"- {k}: {v}" for k, v in s["done_criteria"].items()]
    lines += ["", "Store sizes (lessons): " + ", ".join(f"{k}: {v}" for k, v in doc["store_sizes"].items()), ""]
    lines += ["Families: " + "; ".join(f"{f}: {', '.join(ns)}" for f, ns in doc["families"].items()), ""]
    return "\n".join(lines)


def _plot(doc: dict[str, Any], path: Path) -> None:
    """Per family: cold and warm median fraction of the optimum, and warm − cold with its interval."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fams = list(doc["summary"]["families"])
    blocks = [doc["summary"]["families"][f] for f in fams]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    xs = range(len(fams))
    ax1.bar([x - 0.2 for x in xs], [b["cold"]["median_fraction"] or 0 for b in blocks], 0.4, label="cold")
    ax1.bar([x + 0.2 for x in xs], [b["warm"]["median_fraction"] or 0 for b in blocks], 0.4, label="warm")
    ax1.set_xticks(list(xs), fams, rotation=30)
    lo = min([b[a]["median_fraction"] or 1 for b in blocks for a in ("cold", "warm")] + [0.9])
    ax1.set_ylim(lo - 0.05, 1.0)
    ax1.set_ylabel("median fraction of the optimum")
    ax1.legend()
    meds = [b["fraction_difference"]["median"] or 0.0 for b in blocks]
    cis = [b["fraction_difference"]["ci"] or (m, m) for b, m in zip(blocks, meds, strict=True)]
    ax2.errorbar(list(xs), meds, yerr=[[m - c[0] for m, c in zip(meds, cis, strict=True)],
                                       [c[1] - m for m, c in zip(meds, cis, strict=True)]], fmt="o", capsize=4)
    ax2.axhline(0, color="grey", lw=0.8)
    ax2.axhline(-FAMILY_TOLERANCE, color="red", lw=0.8, ls="--")
    ax2.set_xticks(list(xs), fams, rotation=30)
    ax2.set_ylabel("warm − cold (fraction), median [95% CI]")
    fig.suptitle(f"lessons benchmark ({doc['design']}, {doc['budget']}, {doc['seeds']} seeds)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


__all__ = ["family_of", "markdown", "parse_design", "run_lessons_bench", "summarise"]
