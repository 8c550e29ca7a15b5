"""Benchmark: exhaustive sweep of a recipe's search space vs the playbook policy, on the local backend.

Runs real ``torchrun`` trials of the bundled CPU example. The target is: playbook best throughput ≥ 95 % of
the sweep's best, at ≤ 1/3 of the sweep's accelerator-hours. The full space is expensive, so the knobs and
their values are configurable; the script also prints the size of the full space and the sweep cost
extrapolated to it from the measured mean trial cost.

    python benchmarks/sweep_vs_playbook.py --knobs nproc_per_node,activation_checkpointing,micro_batch_size \\
        --values micro_batch_size=1,2,4 --warmup 1 --measure 4
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from attune.backends.base import TrialRequest
from attune.backends.local import LocalBackend
from attune.engine.loop import TuneConfig, Tuner
from attune.gate import evaluate
from attune.recipe.io import load_recipe
from attune.recipe.model import Recipe
from attune.trial import TrialOutcome


def _parse_value(text: str, sample: Any) -> Any:
    if isinstance(sample, bool):
        return text.lower() == "true"
    if isinstance(sample, int):
        return int(text)
    return None if text in ("None", "null") else text


def space(recipe: Recipe, knobs: list[str], restrict: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """Every valid, gate-admissible assignment of ``knobs`` (other knobs at the baseline)."""
    cat = recipe.catalogue
    domains = [restrict.get(k) or list(cat[k].values) for k in knobs]
    out = []
    for values in itertools.product(*domains):
        change = dict(zip(knobs, values, strict=True))
        try:
            cand = recipe.with_knobs(**change)
        except ValueError:
            continue
        if evaluate(recipe, cand, parent=cand).admitted:
            out.append(change)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", default="examples/tiny-gpt-cpu.yaml")
    ap.add_argument("--knobs", default="", help="comma-separated knobs (default: the recipe's search space)")
    ap.add_argument("--values", action="append", default=[], help="restrict a knob's sweep domain: knob=v1,v2")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--measure", type=int, default=4)
    ap.add_argument("--max-configs", type=int, default=0, help="cap the sweep (0: no cap)")
    ap.add_argument("--out", default="", help="directory for trial outputs and results.json")
    ap.add_argument("--baseline-repeats", type=int, default=0, help="tuner baseline repeats (0: the recipe's)")
    ap.add_argument("--final-repeats", type=int, default=2,
                    help="re-measure both winners this many times each, interleaved (0: skip)")
    ap.add_argument("--skip-sweep", action="store_true")
    ap.add_argument("--reuse-sweep", default="", help="results.json of an earlier run whose sweep to reuse")
    args = ap.parse_args(argv)

    recipe = load_recipe(args.recipe)
    knobs = [k for k in args.knobs.split(",") if k] or list(recipe.tuning.search_space)
    restrict: dict[str, list[Any]] = {}
    for item in args.values:
        name, _, vals = item.partition("=")
        sample = recipe.catalogue[name].values[-1] if recipe.catalogue[name].type != "bool" else True
        restrict[name] = [_parse_value(v, recipe.knob(name) if recipe.knob(name) is not None else sample)
                          for v in vals.split(",")]
    out = Path(args.out or tempfile.mkdtemp(prefix="attune-bench-"))
    out.mkdir(parents=True, exist_ok=True)
    backend = LocalBackend(cache_dir=out / "inductor-cache")
    full = space(recipe, list(recipe.tuning.search_space), {})
    configs = space(recipe, knobs, restrict)
    if args.max_configs:
        configs = configs[: args.max_configs]
    print(f"search space: {knobs} → {len(configs)} configurations (full recipe space: {len(full)})", flush=True)

    sweep: list[dict[str, Any]] = []
    if args.reuse_sweep:
        sweep = json.loads(Path(args.reuse_sweep).read_text())["sweep"]["entries"]
        print(f"reusing {len(sweep)} sweep trials from {args.reuse_sweep}", flush=True)
    elif not args.skip_sweep:
        for i, change in enumerate(configs):
            cand = recipe.with_knobs(**change)
            t0 = time.time()
            res = backend.run(cand, TrialRequest(trial_id=i, trial_dir=out / "sweep" / f"{i:04d}",
                                                 warmup_steps=args.warmup, measure_steps=args.measure,
                                                 timeout_s=recipe.tuning.trial_timeout_s))
            tps = res.measurement.tokens_per_s_per_device if res.measurement and res.outcome is TrialOutcome.SUCCEEDED \
                else None
            sweep.append({"change": change, "outcome": res.outcome.value, "tps": tps, "hours": res.charged_hours})
            print(f"sweep {i + 1}/{len(configs)} {change}: {res.outcome.value} "
                  f"{'' if tps is None else f'{tps:.1f} tok/s/dev'} ({time.time() - t0:.0f}s)", flush=True)

    cfg = TuneConfig.from_recipe(recipe, budget_hours=100.0, search_space=tuple(knobs), warmup_steps=args.warmup,
                                 measure_steps=args.measure, baseline_repeats=args.baseline_repeats or None)
    from attune.policies.playbook import PlaybookPolicy

    tuner = Tuner(recipe, backend=backend, policy=PlaybookPolicy(), config=cfg, run_dir=out / "playbook")
    state = tuner.run()
    pb_hours = sum(r.charged_hours for r in state.records)
    pb_best = state.best_throughput() or 0.0
    best_rec = state.best_record()
    pb_knobs = recipe.knob_changes(best_rec.knobs) if best_rec else {}
    for r in state.records:
        print(f"playbook #{r.id} {r.kind} {r.label()}: {r.outcome.value} "
              f"{'' if r.throughput is None else f'{r.throughput:.1f}'} {r.decision}", flush=True)
    print(f"playbook stopped: {state.finished}")

    result: dict[str, Any] = {"knobs": knobs, "configs": len(configs), "full_space_configs": len(full),
                              "playbook": {"best_tps": pb_best, "hours": pb_hours, "trials": len(state.records),
                                           "best_change": pb_knobs}}
    if sweep:
        ok = [s for s in sweep if s["tps"]]
        best = max(ok, key=lambda s: s["tps"]) if ok else None
        sweep_hours = sum(s["hours"] for s in sweep)
        mean_cost = statistics.fmean(s["hours"] for s in sweep)
        same = next((s["tps"] for s in sweep if s["change"] == {k: pb_knobs.get(k, recipe.knob(k)) for k in knobs}), None)
        result["sweep"] = {"best_tps": best["tps"] if best else None, "best_change": best["change"] if best else None,
                           "hours": sweep_hours, "trials": len(sweep), "entries": sweep,
                           "extrapolated_full_space_hours": mean_cost * len(full),
                           "playbook_best_config_in_sweep_tps": same}
        if best:
            ratio, hours_ratio = pb_best / best["tps"], pb_hours / sweep_hours
            full_ratio = pb_hours / (mean_cost * len(full))
            result["ratios"] = {"throughput": ratio, "hours": hours_ratio, "hours_vs_full_space": full_ratio}
            print(f"\nsweep:    best {best['tps']:.1f} tok/s/dev {best['change']} in {sweep_hours:.4f} acc-h "
                  f"({len(sweep)} trials; full space {len(full)} configs ≈ {mean_cost * len(full):.4f} acc-h)")
            print(f"playbook: best {pb_best:.1f} tok/s/dev {pb_knobs} in {pb_hours:.4f} acc-h ({len(state.records)} trials)")
            print(f"playbook/sweep: throughput {ratio:.1%} (target ≥ 95%), hours {hours_ratio:.1%} of this sweep, "
                  f"{full_ratio:.1%} of the full-space sweep (target ≤ 33%)")
            if args.final_repeats:
                result["head_to_head"] = head_to_head(recipe, backend, best["change"], pb_knobs, args, out)
                h = result["head_to_head"]
                print(f"head-to-head re-measurement ({args.final_repeats}× each, interleaved): sweep winner "
                      f"{h['sweep_tps']:.1f}, playbook winner {h['playbook_tps']:.1f} tok/s/dev → "
                      f"{h['ratio']:.1%}")
    else:
        print(f"playbook: best {pb_best:.1f} tok/s/dev {pb_knobs} in {pb_hours:.4f} acc-h")
    (out / "results.json").write_text(json.dumps(result, indent=2, default=str))
    print(f"results: {out / 'results.json'}")
    return 0


def head_to_head(recipe: Recipe, backend: LocalBackend, sweep_change: dict[str, Any], pb_change: dict[str, Any],
                 args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """Re-measure both winners alternately, so the comparison is not a single noisy sweep sample (winner's curse)."""
    tps: dict[str, list[float]] = {"sweep": [], "playbook": []}
    for i in range(args.final_repeats):
        for who, change in (("sweep", sweep_change), ("playbook", pb_change)):
            res = backend.run(recipe.with_knobs(**change), TrialRequest(
                trial_id=9000 + i, trial_dir=out / "final" / f"{who}-{i}", warmup_steps=args.warmup,
                measure_steps=args.measure, timeout_s=recipe.tuning.trial_timeout_s))
            if res.measurement is not None and res.outcome is TrialOutcome.SUCCEEDED:
                tps[who].append(res.measurement.tokens_per_s_per_device)
    s, p = statistics.fmean(tps["sweep"] or [0.0]), statistics.fmean(tps["playbook"] or [0.0])
    return {"sweep_tps": s, "playbook_tps": p, "ratio": p / s if s else 0.0, "samples": tps}


if __name__ == "__main__":
    sys.exit(main())
