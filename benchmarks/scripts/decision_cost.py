"""What deciding costs the shipped tuner today: the figures issue 40 starts from, read from a tuner benchmark.

``make bench`` (``attune bench``) keeps, for every run, the anytime curve of the kept recipe's true throughput against
the accelerator-hours spent. This script reads one or more of its ``bench.json`` files and prints, per budget and
recipe group, for the tuner ``--tuner`` (default ``attune``):

- the median fraction of the exhaustive optimum the run ends with;
- the median accelerator-hours, in trials' worth (one trial of the starting recipe), until the kept recipe first
  reached 0.95 and 0.98 of the optimum, with how many runs reached it ("never" where fewer than half did: a run that
  never reached it counts as infinitely late, not as its budget);
- the cost per kept change: trials' worth spent per change kept (the median over runs that kept one), and the trials
  launched per change kept;
- where the hours went: the median share of the budget left unspent.

    python benchmarks/scripts/decision_cost.py runs/bench/bench.json [more bench.json ...] [--tuner attune]
        [--markdown FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from attune.bench.run import hours_to, median_or_never

TARGETS = (0.95, 0.98)


def trials_to(run: dict[str, Any], target: float, trial_hours: float) -> float | None:
    """Trials' worth spent when the kept recipe first reached ``target`` of the optimum within the budget (None:
    never), read from the run's anytime curve as the benchmark reads its own 0.95."""
    frac, best = run.get("fraction_of_optimum"), run.get("best_tps")
    if not frac or not best or not trial_hours:
        return None
    hours = hours_to(run["curve"], target, best / frac, run["budget_hours"])
    return None if hours is None else hours / trial_hours


def _median_or_never(values: list[float | None]) -> tuple[str, int]:
    m = median_or_never(values)
    return ("—" if not values else "never" if m is None else f"{m:.1f}"), sum(v is not None for v in values)


def rows(benches: list[dict[str, Any]], tuner: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for bench in benches:
        cases = {c["name"]: c for c in bench["cases"]}
        for run in bench["runs"]:
            if run.get("tuner") != tuner or not run.get("available", True):
                continue
            case = cases[run["recipe"]]
            trial = case["trial_cost_hours"]
            out.append({
                "budget": run["budget"], "group": case["group"], "recipe": run["recipe"], "seed": run["seed"],
                "fraction": run["fraction_of_optimum"],
                **{f"to_{t}": trials_to(run, t, trial) for t in TARGETS},
                "spent_trials": run["budget_used_hours"] / trial, "accepted": run["accepted"],
                "launched": run["trials_launched"], "left": run["budget_left_fraction"],
            })
    return out


def table(rs: list[dict[str, Any]], tuner: str) -> str:
    by: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in rs:
        by[(r["budget"], "all")].append(r)
        by[(r["budget"], r["group"])].append(r)
    budgets = sorted({r["budget"] for r in rs}, key=lambda b: float(b.rstrip("t")) if b.endswith("t") else 0.0)
    lines = [f"tuner `{tuner}`: {len(rs)} runs", "",
             "| budget | group | runs | median fraction of optimum | trials' worth to 0.95, median (reached) | "
             "trials' worth to 0.98, median (reached) | trials' worth per kept change, median | trials launched per "
             "kept change, median | runs keeping nothing | budget left, median |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for b in budgets:
        for g in ("all", "headroom", "little-left"):
            group = by.get((b, g)) or []
            if not group:
                continue
            t95, n95 = _median_or_never([r["to_0.95"] for r in group])
            t98, n98 = _median_or_never([r["to_0.98"] for r in group])
            kept = [r for r in group if r["accepted"]]
            per_kept = statistics.median(r["spent_trials"] / r["accepted"] for r in kept) if kept else math.nan
            launched = statistics.median(r["launched"] / r["accepted"] for r in kept) if kept else math.nan
            lines.append(
                f"| {b} | {g} | {len(group)} | {statistics.median(r['fraction'] for r in group):.3f} | "
                f"{t95} ({n95}/{len(group)}) | {t98} ({n98}/{len(group)}) | {per_kept:.1f} | {launched:.1f} | "
                f"{len(group) - len(kept)} | {statistics.median(r['left'] for r in group):.0%} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bench", nargs="+", type=Path, help="bench.json files of `attune bench`")
    ap.add_argument("--tuner", default="attune")
    ap.add_argument("--markdown", type=Path, help="also write the table here")
    args = ap.parse_args(argv)
    benches = []
    for path in args.bench:
        try:
            bench = json.loads(path.read_text())
            # a run of several budgets keeps each budget's runs in <out>/<budget>/bench.json
            parts = ([json.loads((path.parent / b / "bench.json").read_text()) for b in bench["budgets"]]
                     if "budgets" in bench and "runs" not in bench else [bench])
        except (OSError, ValueError, KeyError) as err:
            print(f"decision_cost: cannot read {path}: {err}", file=sys.stderr)
            return 2
        benches += parts
    text = table(rows(benches, args.tuner), args.tuner)
    print(text)
    if args.markdown:
        args.markdown.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
