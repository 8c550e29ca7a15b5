"""Benchmark: does a run on a related recipe reach its best sooner with the lessons of an earlier run?

For each suite recipe given: tune it with the playbook on the simulator and distil lessons into a fresh
store; then tune a related recipe (the same with the global batch doubled) twice, without lessons (cold)
and with them (warm), and print trials-to-best, the kept recipe's noiseless speedup and the
accelerator-hours of both.

    python benchmarks/lessons_effect.py benchmarks/suite/01-llama3.2-1b-h100x8.yaml benchmarks/suite/14-deepseek-v2-lite-h200x16.yaml
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import yaml

from attune.agent.lessons import LessonStore, record_run
from attune.agent.playbook import PlaybookPolicy
from attune.backends.simulated import SimBackend
from attune.engine.loop import RunState, TuneConfig, Tuner
from attune.recipe import load_recipe, parse_recipe
from attune.recipe.model import Recipe
from attune.sim.perf import simulate


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
    args = ap.parse_args(argv)
    print("| recipe | first run: trials to best, true speedup | related, cold | related, warm (lessons) |")
    print("|---|---|---|---|")
    for path in args.recipes:
        tmp = Path(tempfile.mkdtemp(prefix="attune-lessons-"))
        first = load_recipe(path)
        data = yaml.safe_load(Path(path).read_text())
        data["name"] += "-related"
        data["training"]["global_batch_size"] *= 2
        related = parse_recipe(data)
        store = LessonStore(tmp / "lessons.json")
        st = tune(first, store, tmp / "first", args.max_trials, args.seed)
        record_run(st, store, run_id="first")
        cells = [f"{trials_to_best(st)}, {true_speedup(st):.3f}×"]
        for name, lessons in (("cold", None), ("warm", LessonStore(tmp / "lessons.json"))):
            s = tune(related, lessons, tmp / name, args.max_trials, args.seed)
            cells.append(f"{trials_to_best(s)}, {true_speedup(s):.3f}×, "
                         f"{s.budget().used:.1f} h")
        print(f"| {first.name} | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
