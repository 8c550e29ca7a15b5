"""What the shipped engine reaches when every proposal is the right one: the benchmark with a policy that knows.

The tuner benchmark's figures mix two things: the order of the moves (the policy's job, and all that lessons can
change) and what it costs to decide each one under run-to-run noise (the engine's paired decisions, the loss check,
the certification reserve). This script holds the second fixed and makes the first as good as knowledge can: its
policy reads the noiseless simulator's throughput of every configuration of the enumerated space and, from the
current best, proposes one of the admissible moves (up to three knobs, the gate's verdict from that best) that truly
gain at least ``min_gain``:

- ``--goal furthest`` (default): the move that leads to the best configuration reachable one such move at a time, in
  as many moves as the budget left pays for (about MOVE_TRIALS trials' worth each, after CERTIFY_TRIALS for the
  certification), ties broken by its own throughput;
- ``--goal fastest``: the fastest such move now (greedy; what reaching 0.95 of the optimum soonest asks for).

When none is left it proposes the untried admissible move that is truly fastest, then stops. Everything else (the
engine, the budget rule, the noise streams, the metrics) is the benchmark's (``attune.bench.run``).

Its figures are not a proof of a bound (a cleverer plan can weigh how cheaply each move is decided), but they show
what any ordering of proposals, lessons included, can be expected to give the engine as it ships.

    python benchmarks/scripts/oracle_order.py [--only NAME,...] [--budget 8t,15t,30t] [--seeds 5] [--jobs 2]
        [--goal furthest|fastest] [--compare runs/bench] [--markdown FILE] [--report-only]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from functools import lru_cache
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from reachable_ceiling import admits, space_table  # noqa: E402

from attune.backends.simulated import SimBackend  # noqa: E402
from attune.bench.oracle import oracle  # noqa: E402
from attune.bench.run import (  # noqa: E402
    HEADROOM,
    MAX_CONSECUTIVE_REFUSALS,
    MAX_PROPOSALS,
    metrics,
    noise_stream,
    parse_budget,
    trial_cost_hours,
)
from attune.bench.suite import load_suite  # noqa: E402
from attune.engine.journal import MemoryJournal  # noqa: E402
from attune.engine.loop import TuneConfig, Tuner  # noqa: E402
from attune.engine.policy import Policy, PolicyContext, Stop  # noqa: E402
from attune.recipe.change import Change  # noqa: E402

MAX_KNOBS = 3
MOVE_TRIALS = 3.5
"""Trials' worth of a typical decided move: the candidate, a reference run and a confirmation, sometimes more."""
CERTIFY_TRIALS = 6
"""Trials' worth the engine keeps for the final certification (interleaved runs of the baseline and the best)."""


class OracleOrder(Policy):
    """Proposes, from the current best, the move that leads furthest on the noiseless simulator."""

    name = "oracle-order"

    def __init__(self, recipe, space: list[str], table: dict[tuple, float], min_gain: float,
                 trial_hours: float, goal: str = "furthest") -> None:
        self.recipe, self.space, self.table, self.min_gain = recipe, space, table, min_gain
        #: "furthest": the move leading to the best reachable configuration; "fastest": the fastest move now
        self.goal = goal
        self.trial_hours = trial_hours
        self.ranked = sorted(table.items(), key=lambda kv: -kv[1])
        self._children: dict[tuple, list[tuple]] = {}
        self._reach: dict[tuple[tuple, int], float] = {}

    def children(self, cur: tuple) -> list[tuple]:
        """Admissible moves from ``cur`` that truly gain at least ``min_gain``."""
        if cur not in self._children:
            bar = self.table.get(cur, 0.0) * (1 + self.min_gain)
            out = []
            for cand, tps in self.ranked:
                if tps < bar:
                    break
                near = sum(a != b for a, b in zip(cur, cand, strict=True)) <= MAX_KNOBS
                if near and admits(self.recipe, self.space, cur, cand):
                    out.append(cand)
            self._children[cur] = out
        return self._children[cur]

    def reach(self, cur: tuple, moves: int) -> float:
        """The best throughput reachable from ``cur`` in at most ``moves`` admissible ``min_gain`` moves."""
        key = (cur, moves)
        if key not in self._reach:
            nexts = self.children(cur) if moves > 0 else []
            self._reach[key] = max([self.table.get(cur, 0.0), *(self.reach(c, moves - 1) for c in nexts)])
        return self._reach[key]

    def moves_left(self, ctx: PolicyContext) -> int:
        """How many more moves the budget pays for: each costs about MOVE_TRIALS trials' worth, after the
        certification's CERTIFY_TRIALS."""
        return max(1, int((ctx.budget_left_hours / self.trial_hours - CERTIFY_TRIALS) / MOVE_TRIALS))

    def propose(self, ctx: PolicyContext) -> Change | Stop:
        cur = tuple(ctx.best.knob(k) for k in self.space)

        def change_to(cand: tuple) -> dict[str, Any]:
            return {k: v for k, a, v in zip(self.space, cur, cand, strict=True) if a != v}

        if self.goal == "fastest":
            ranked = sorted(self.children(cur), key=lambda c: -self.table[c])
            why = "the fastest admissible move"
        else:
            left = self.moves_left(ctx)
            ranked = sorted(self.children(cur), key=lambda c: (-self.reach(c, left - 1), -self.table[c]))
            why = f"the move leading furthest in {left} moves"
        for cand in ranked:
            if ctx.admissible(change_to(cand)):
                return Change(set=change_to(cand), source=self.name, rationale=f"oracle: {why}")
        now = self.table.get(cur, 0.0)
        for cand, tps in self.ranked:  # no min_gain move left: the fastest untried one that gains at all
            if tps <= now:
                break
            if sum(a != b for a, b in zip(cur, cand, strict=True)) <= MAX_KNOBS and ctx.admissible(change_to(cand)):
                return Change(set=change_to(cand), source=self.name, rationale="oracle: small gain")
        return Stop("oracle: no admissible move gains")


@lru_cache(maxsize=2)
def _policy(name: str, goal: str) -> tuple[Any, OracleOrder]:
    """The case and its policy: one per recipe and process, since the policy keeps no state of a run (only its
    caches of the move graph, which every run of the recipe shares)."""
    case = load_suite("suite", only=[name])[0]
    space, table = space_table(case.recipe)
    return case, OracleOrder(case.recipe, space, table, case.recipe.tuning.min_gain, trial_cost_hours(case.recipe),
                             goal)


def run_one(args: tuple[str, str, int, str]) -> dict[str, Any]:
    name, budget, seed, goal = args
    case, policy = _policy(name, goal)
    recipe = case.recipe
    o = oracle(recipe, Path.home() / ".cache" / "attune" / "oracle")
    config = TuneConfig.from_recipe(recipe, parse_budget(budget, recipe),
                                    max_consecutive_refusals=MAX_CONSECUTIVE_REFUSALS, max_records=MAX_PROPOSALS)
    backend = SimBackend(seed=noise_stream(name, seed), write_files=False)
    with tempfile.TemporaryDirectory(prefix="attune-oracle-order-") as tmp:
        state = Tuner(recipe, backend=backend, policy=policy, config=config, run_dir=Path(tmp),
                      journal=MemoryJournal()).run()
    m = metrics(state, o.optimum_tps, trial_hours=trial_cost_hours(recipe))
    group = "headroom" if o.optimum_tps >= HEADROOM * m["baseline_tps"] else "little-left"
    return {"recipe": name, "group": group, "budget": budget, "seed": seed,
            **{k: m[k] for k in ("fraction_of_optimum", "gain_share", "trials_to_target", "budget_left_fraction")}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="")
    ap.add_argument("--budget", default="8t,15t,30t")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--goal", choices=("furthest", "fastest"), default="furthest",
                    help="furthest: the move that leads to the best configuration the budget left can reach; "
                         "fastest: the fastest admissible move now (greedy)")
    ap.add_argument("--out", default="runs/oracle-order.json")
    ap.add_argument("--compare", default="", help="a `make bench` output directory: attune's runs beside these")
    ap.add_argument("--markdown", default="", help="write the summary and the per-recipe table here")
    ap.add_argument("--report-only", action="store_true", help="only the report, from the runs in --out")
    args = ap.parse_args()
    if args.report_only:
        rows = json.loads(Path(args.out).read_text())
        budgets = list(dict.fromkeys(r["budget"] for r in rows))
        text = report(rows, budgets, _attune_runs(Path(args.compare)) if args.compare else {})
        print(text)
        if args.markdown:
            Path(args.markdown).write_text(text)
        return 0
    names = [c.name for c in load_suite("suite", only=[s for s in args.only.split(",") if s] or None)]
    budgets = args.budget.split(",")
    jobs = [(n, b, s, args.goal) for n in names for b in budgets for s in range(args.seeds)]
    t0 = time.monotonic()
    rows = []
    with ProcessPoolExecutor(args.jobs) as ex:
        for row in ex.map(run_one, jobs, chunksize=len(budgets) * args.seeds):
            rows.append(row)
            print(f"{row['recipe']} {row['budget']} seed {row['seed']}: {row['fraction_of_optimum']:.3f} "
                  f"({time.monotonic() - t0:.0f} s)", flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(rows, indent=1))
    print(f"{len(rows)} runs in {time.monotonic() - t0:.0f} s")
    text = report(rows, budgets, _attune_runs(Path(args.compare)) if args.compare else {})
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text)
    return 0


def _attune_runs(bench_dir: Path) -> dict[tuple[str, str, int], dict[str, Any]]:
    out = {}
    for path in sorted(bench_dir.glob("*/bench.json")):
        for r in json.loads(path.read_text())["runs"]:
            if r["tuner"] == "attune" and r.get("available", True):
                out[(r["recipe"], r["budget"], r["seed"])] = r
    return out


def _median(values: list[float]) -> str:
    return f"{statistics.median(values):.3f}" if values else "n/a"


def _summary(rs: list[dict[str, Any]]) -> str:
    hd = [r for r in rs if r["group"] == "headroom"]
    shares = [r["gain_share"] for r in hd if r["gain_share"] is not None]
    return (f"median fraction {_median([r['fraction_of_optimum'] for r in rs])} (headroom group "
            f"{_median([r['fraction_of_optimum'] for r in hd])}), headroom share {_median(shares)}, worst "
            f"{min(r['fraction_of_optimum'] for r in rs):.3f}, runs at >= 0.99: "
            f"{sum(r['fraction_of_optimum'] >= 0.99 for r in rs)} of {len(rs)}")


def report(rows: list[dict[str, Any]], budgets: list[str], attune: dict[tuple[str, str, int], dict[str, Any]]) -> str:
    """Markdown: per budget, the oracle-ordered runs' figures (and attune's on the same recipes and seeds), then
    the per-recipe medians."""
    med = statistics.median
    lines = ["| budget | tuner | figures |", "|---|---|---|"]
    for b in budgets:
        rs = [r for r in rows if r["budget"] == b]
        lines.append(f"| {b} | oracle order | {_summary(rs)} |")
        paired = [attune[(r["recipe"], b, r["seed"])] | {"group": r["group"]} for r in rs
                  if (r["recipe"], b, r["seed"]) in attune]
        if len(paired) == len(rs):
            lines.append(f"| {b} | attune | {_summary(paired)} |")
            both = [(r["trials_to_target"], attune[(r["recipe"], b, r["seed"])]["trials_to_target"]) for r in rs]
            both = [(o, a) for o, a in both if o and a]  # reached 0.95 from below, both
            if both:
                lines.append(f"| {b} | oracle / attune | trials' worth to 0.95 of the optimum, on the {len(both)} runs "
                             f"both reached it from below: {med(o for o, _ in both):.2f} / "
                             f"{med(a for _, a in both):.2f} (ratio of medians "
                             f"{med(o for o, _ in both) / med(a for _, a in both):.2f}) |")
    names = sorted({r["recipe"] for r in rows})
    lines += ["", "| recipe | " + " | ".join(f"{b} oracle | {b} attune" for b in budgets) + " |",
              "|---|" + "---|---|" * len(budgets)]
    for n in names:
        cells = []
        for b in budgets:
            rs = [r for r in rows if r["recipe"] == n and r["budget"] == b]
            at = [attune[(n, b, r["seed"])]["fraction_of_optimum"] for r in rs if (n, b, r["seed"]) in attune]
            cells += [f"{med(r['fraction_of_optimum'] for r in rs):.3f}" if rs else "",
                      f"{med(at):.3f}" if at else ""]
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
