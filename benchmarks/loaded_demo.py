"""`make demo` on a busy machine: the demo's tuning run repeated while a load generator keeps every core busy, and
the same on a quiet machine, side by side. Prints each run's speedup, what it kept and what it cost.

    python benchmarks/loaded_demo.py --runs 5 [--quiet-runs 5] [--budget 0.12] [--out runs/loaded-demo]

The load generator is one busy-looping process per core (plain Python arithmetic, no I/O), started before and
stopped after each loaded run; nothing it starts outlives the script. Figures are printed, not asserted: this is a
benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _spin(stop: mp.synchronize.Event) -> None:  # type: ignore[name-defined]
    x = 0
    while not stop.is_set():
        for _ in range(100_000):
            x = (x * 1103515245 + 12345) & 0x7FFFFFFF


def one_run(out: Path, budget: float, loaded: bool) -> dict:
    stop = mp.Event()
    hogs = [mp.Process(target=_spin, args=(stop,), daemon=True) for _ in range(os.cpu_count() or 2)] if loaded else []
    for h in hogs:
        h.start()
    t0 = time.monotonic()
    try:
        res = subprocess.run([sys.executable, "-m", "attune", "tune", str(ROOT / "examples" / "tiny-gpt-cpu.yaml"),
                              "--budget", str(budget), "--out", str(out)], capture_output=True, text=True,
                             env={**os.environ, "ATTUNE_LESSONS": "off"}, cwd=ROOT)
    finally:
        stop.set()
        for h in hogs:
            h.join(5)
            if h.is_alive():
                h.kill()
    wall = time.monotonic() - t0
    result = json.loads((out / "result.json").read_text()) if (out / "result.json").exists() else {}
    return {"loaded": loaded, "exit": res.returncode, "wall_s": round(wall, 1), "speedup": result.get("speedup"),
            "kept": result.get("best_changes"), "noise_floor": result.get("noise_floor"),
            "hours": result.get("budget_used_hours"), "trials": result.get("trials_launched"),
            "stop": result.get("stop_reason")}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=5, help="loaded runs")
    p.add_argument("--quiet-runs", type=int, default=5, help="quiet runs (0: none)")
    p.add_argument("--budget", type=float, default=0.12)
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "loaded-demo")
    a = p.parse_args(argv)
    rows = []
    order = [True] * a.runs + [False] * a.quiet_runs
    for i, loaded in enumerate(order):
        row = one_run(a.out / f"{'loaded' if loaded else 'quiet'}-{i}", a.budget, loaded)
        rows.append(row)
        print(json.dumps(row), flush=True)
    for label, flag in (("loaded", True), ("quiet", False)):
        sp = [r["speedup"] or 1.0 for r in rows if r["loaded"] is flag]
        if sp:
            print(f"{label}: speedups {', '.join(f'{s:.2f}×' for s in sp)}; min {min(sp):.2f}×, "
                  f"{sum(s >= 1.5 for s in sp)}/{len(sp)} at or above 1.5×")
    (a.out / "summary.json").write_text(json.dumps(rows, indent=2))
    (a.out / "summary.md").write_text(markdown(rows, a.budget))
    print(f"tables: {a.out / 'summary.md'} (benchmarks/results/loaded-demo.md is one such file)")
    return 0


def markdown(rows: list[dict], budget: float) -> str:
    """The runs as a Markdown table with each machine state's minimum, median and maximum speedup."""
    lines = ["# `make demo` on a loaded and on a quiet machine", "",
             "`python benchmarks/loaded_demo.py` (loaded: one busy-looping process per core for the whole run;",
             f"`examples/tiny-gpt-cpu.yaml`, budget {budget:g} accelerator-hours, lessons off).", "",
             "| run | machine | speedup | kept | noise floor | hours | trials | wall s |", "|---|---|---|---|---|---|---|---|"]
    for i, r in enumerate(rows):
        kept = ", ".join(f"{k}={v}" for k, v in (r["kept"] or {}).items())
        lines.append(f"| {i} | {'loaded' if r['loaded'] else 'quiet'} | {r['speedup'] or 1.0:.2f}× | {kept} | "
                     f"{r['noise_floor'] or 0:.1%} | {r['hours'] or 0:.3f} | {r['trials']} | {r['wall_s']:.0f} |")
    for label, flag in (("loaded", True), ("quiet", False)):
        sp = sorted(r["speedup"] or 1.0 for r in rows if r["loaded"] is flag)
        if sp:
            lines += ["", f"{label}: min {sp[0]:.2f}×, median {sp[len(sp) // 2]:.2f}×, max {sp[-1]:.2f}×; "
                          f"{sum(s >= 1.5 for s in sp)}/{len(sp)} at or above 1.5×"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
