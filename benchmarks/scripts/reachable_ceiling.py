"""The best recipe a one-change-at-a-time tuner can reach on each suite recipe, on the noiseless simulator.

attune's contract is to change one setting (one coupled group) at a time and to keep a change only when it gains at
least the recipe's ``tuning.min_gain``. The oracle's optimum ignores the path. This script asks what the path
allows: starting from the recipe, follow every move the gate admits (``attune.gate.evaluate`` with the current
best as parent) whose noiseless gain is at least ``min_gain``, exhaustively over the enumerated space, and report
the best configuration reachable that way as a fraction of the oracle's optimum.

    python benchmarks/scripts/reachable_ceiling.py [--only NAME,...] [--min-gain 0.02]

Moves considered from a configuration: every configuration of the enumerated space that differs from it in at most
``max_knobs`` (3) knobs and that the gate admits as one change from it. The gate also admits some coupled moves of
four knobs or more (fewer pipeline stages with the distributed optimizer and both overlaps), which this skips for
speed, so the ceiling is a lower bound on what one change at a time can reach: enough to show a target *is*
reachable, not that a higher one is not.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from attune.bench.oracle import configurations, search_domains
from attune.bench.suite import load_suite
from attune.gate import evaluate
from attune.sim import simulate


def space_table(recipe):
    """Noiseless tokens/s per device of every configuration the oracle enumerates (0 where it runs out of memory)."""
    space, domains = search_domains(recipe)
    table: dict[tuple, float] = {}
    for combo, cand in configurations(recipe, space, domains):
        res = simulate(cand)
        table[combo] = res.tokens_per_s_per_device if res.outcome == "succeeded" else 0.0
    return space, table


def admits(recipe, space: list[str], parent: tuple, cand: tuple) -> bool:
    """Whether the gate admits configuration ``cand`` as one change from ``parent`` (both as values of ``space``)."""
    p = recipe.with_knobs(**dict(zip(space, parent, strict=True)))
    c = recipe.with_knobs(**dict(zip(space, cand, strict=True)))
    return bool(evaluate(recipe, c, (), parent=p).admitted)


def ceiling(recipe, min_gain: float, max_knobs: int = 3):
    space, table = space_table(recipe)
    start = tuple(recipe.knob(k) for k in space)
    if start not in table:
        return None
    optimum = max(table.values())
    verdicts: dict[tuple, bool] = {}

    def admitted(parent: tuple, cand: tuple) -> bool:
        key = (parent, cand)
        if key not in verdicts:
            verdicts[key] = admits(recipe, space, parent, cand)
        return verdicts[key]

    ranked = sorted(table.items(), key=lambda kv: -kv[1])  # fastest first: each look scans only what clears its bar
    seen = {start}
    todo = [start]
    while todo:
        cur = todo.pop()
        bar = table[cur] * (1 + min_gain)
        for cand, tps in ranked:
            if tps < bar:
                break
            if cand in seen:
                continue
            diff = sum(a != b for a, b in zip(cur, cand))
            if diff > max_knobs:
                continue
            if admitted(cur, cand):
                seen.add(cand)
                todo.append(cand)
    best = max(seen, key=lambda c: table[c])
    return {"start": table[start] / optimum, "ceiling": table[best] / optimum, "reachable": len(seen),
            "space": len(table), "best": dict(zip(space, best))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", default="suite")
    ap.add_argument("--only", default="")
    ap.add_argument("--min-gain", type=float, default=None, help="default: each recipe's own tuning.min_gain")
    args = ap.parse_args()
    cases = load_suite(args.suite, only=[s for s in args.only.split(",") if s] or None)
    ceilings = []
    print(f"{'recipe':38s} {'min_gain':>8s} {'start':>6s} {'ceiling':>7s} {'reachable':>9s} {'space':>7s}  secs")
    for case in cases:
        t0 = time.monotonic()
        mg = args.min_gain if args.min_gain is not None else case.recipe.tuning.min_gain
        r = ceiling(case.recipe, mg)
        if r is None:
            print(f"{case.name:38s} start outside the enumerated space")
            continue
        ceilings.append(r["ceiling"])
        print(f"{case.name:38s} {mg:8.3f} {r['start']:6.3f} {r['ceiling']:7.3f} {r['reachable']:9d} {r['space']:7d}"
              f"  {time.monotonic() - t0:.0f}", flush=True)
    print(f"median ceiling {statistics.median(ceilings):.3f} over {len(ceilings)} recipes; "
          f"{sum(c >= 0.99 for c in ceilings)} at or above 0.99")
    return 0


if __name__ == "__main__":
    sys.exit(main())
