"""Benchmark: does a run on a related recipe reach its best sooner with the lessons of an earlier run?

For each suite recipe given: tune it with the playbook on the simulator and distil lessons into a fresh
store; then tune a related recipe (the same with the global batch doubled) twice, without lessons (cold)
and with them (warm), and print trials-to-best, the kept recipe's noiseless speedup and the
accelerator-hours of both.

    python benchmarks/lessons_effect.py benchmarks/suite/01-llama3.2-1b-h100x8.yaml benchmarks/suite/14-deepseek-v2-lite-h200x16.yaml

``--seeds N`` repeats each comparison with N noise seeds and adds a row of medians (one seed's warm run can lose
a close call to measurement noise that another seed's does not).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import yaml

from attune.agent.lessons import LessonStore, record_run
from attune.backends.simulated import SimBackend
from attune.engine.loop import RunState, TuneConfig, Tuner
from attune.policies.playbook import PlaybookPolicy
from attune.recipe import load_recipe, parse_recipe
from attune.recipe.model import Recipe
from attune.sim import simulate


def tune(recipe: Recipe, store: LessonStore | None, out: Path, max_trials: int, seed: int) -> RunState:
    cfg = TuneConfig.from_recipe(recipe, 1e9, max_trials=max_trials)
    return Tuner(recipe, backend=SimBackend(seed=seed), policy=PlaybookPolicy(lessons=store), config=cfg,
                 run_dir=out).run()


def true_speedup(state: RunState) -> float:
    """Noiseless simulated speedup of the kept recipe (measured speedups carry the winner's curse)."""
    base = simulate(state.baseline).tokens_per_s_per_device
    return simulate(state.best_recipe()).tokens_per_s_per_device / base


def trials_to_best(state: RunState) -> int:
    best = state.best_record()
    return 0 if best is None else sum(1 for r in state.records if r.launched and r.id <= best.id)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("recipes", nargs="+")
    ap.add_argument("--max-trials", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seeds", type=int, default=1, help="noise seeds from --seed on; more than one adds medians")
    args = ap.parse_args(argv)
    print("| recipe | seed | first run: trials to best, true speedup | related, cold | related, warm (lessons) |")
    print("|---|---|---|---|---|")
    for path in args.recipes:
        rows: list[list[tuple[int, float, float]]] = []
        for seed in range(args.seed, args.seed + args.seeds):
            tmp = Path(tempfile.mkdtemp(prefix="attune-lessons-"))
            first = load_recipe(path)
            data = yaml.safe_load(Path(path).read_text())
            data["name"] += "-related"
            data["training"]["global_batch_size"] *= 2
            related = parse_recipe(data)
            store = LessonStore(tmp / "lessons.json")
            st = tune(first, store, tmp / "first", args.max_trials, seed)
            record_run(st, store, run_id="first")
            row = [(trials_to_best(st), true_speedup(st), st.budget().used)]
            for name, lessons in (("cold", None), ("warm", LessonStore(tmp / "lessons.json"))):
                s = tune(related, lessons, tmp / name, args.max_trials, seed)
                row.append((trials_to_best(s), true_speedup(s), s.budget().used))
            rows.append(row)
            print(f"| {first.name} | {seed} | {row[0][0]}, {row[0][1]:.3f}× | " + " | ".join(
                f"{t}, {x:.3f}×, {h:.1f} h" for t, x, h in row[1:]) + " |", flush=True)
        if len(rows) > 1:
            med = [tuple(statistics.median(r[i][j] for r in rows) for j in range(3)) for i in range(3)]
            print(f"| {first.name} | median | {med[0][0]:g}, {med[0][1]:.3f}× | " + " | ".join(
                f"{t:g}, {x:.3f}×, {h:.1f} h" for t, x, h in med[1:]) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
