"""Benchmark outputs: ``bench.json``, a Markdown table (``bench.md``) and PNG plots (Agg backend, files only)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

GRID = 41
"""Points of the budget-fraction grid on which anytime curves are resampled and averaged over seeds."""


def _fmt(x: Any, spec: str = ".3f") -> str:
    return "—" if x is None else format(x, spec)


def markdown(doc: dict[str, Any]) -> str:
    """The benchmark as Markdown: per-tuner summary, per-recipe fraction of optimum, and the done criteria."""
    tuners = doc["tuners"]
    per = doc["summary"]["tuners"]
    lines = [f"# attune tuner benchmark: `{doc['suite']}`", "",
             f"Budget {doc['budget']} per recipe, {doc['seeds']} seed(s), attune policy "
             f"`{doc['attune_policy']}`; simulator backend; fraction = noiseless throughput of the best kept "
             "recipe / exhaustive optimum.", "",
             "| tuner | runs | median fraction of optimum | mean | worst | median speedup | wasted h (share of "
             "budget) | mean refusals | mean trials (failed) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for t in tuners:
        s = per.get(t, {})
        if not s.get("available"):
            lines.append(f"| {t} | 0 | unavailable: {s.get('error', '')} | | | | | | |")
            continue
        lines.append(f"| {t} | {s['runs']} | {_fmt(s['median_fraction_of_optimum'])} | "
                     f"{_fmt(s['mean_fraction_of_optimum'])} | {_fmt(s['min_fraction_of_optimum'])} | "
                     f"{_fmt(s['median_speedup'], '.2f')}× | {s['wasted_hours']:,.1f} "
                     f"({s['wasted_fraction_of_budget']:.1%}) | {s['mean_refusals']:.1f} | "
                     f"{s['mean_trials_launched']:.1f} ({s['mean_trials_failed']:.1f}) |")
    avail = [t for t in tuners if per.get(t, {}).get("available")]
    lines += ["", "## Median fraction of optimum per recipe", "",
              "| recipe | origin | devices | optimum × start | " + " | ".join(avail) + " |",
              "|---|---|---|---|" + "---|" * len(avail)]
    for c in doc["cases"]:
        o = c["oracle"]
        gain = o["optimum_tps"] / o["baseline_tps"] if o["baseline_tps"] else None
        cells = []
        for t in avail:
            fr = [r["fraction_of_optimum"] for r in doc["runs"]
                  if r["recipe"] == c["name"] and r["tuner"] == t and r.get("available")]
            cells.append(_fmt(statistics.median(fr)) if fr else "—")
        lines.append(f"| {c['name']} | {c['origin']} | {c['devices']} × {c['accelerator']} | {_fmt(gain, '.2f')}× | "
                     + " | ".join(cells) + " |")
    lines += ["", "## Oracle", "", "| recipe | search space | admissible | OOM | optimum tok/s/dev | optimum knobs |",
              "|---|---|---|---|---|---|"]
    for c in doc["cases"]:
        o = c["oracle"]
        changed = {k: v for k, v in o["optimum_knobs"].items()}
        lines.append(f"| {c['name']} | {o['space_size']:,} | {o['admissible']:,} | {o['oom']:,} | "
                     f"{o['optimum_tps']:,.0f} | {', '.join(f'{k}={v}' for k, v in changed.items())} |")
    check = doc["summary"].get("done_criteria") or {}
    if check:
        lines += ["", "## Done criteria (issue)", ""]
        for k, v in check.items():
            lines.append(f"- {k}: {v}")
    return "\n".join(lines) + "\n"


def _resample(curve: list[list[float]], budget: float, optimum: float) -> list[float]:
    out, j, cur = [], 0, (curve[0][1] if curve else 0.0)
    for i in range(GRID):
        x = budget * i / (GRID - 1)
        while j < len(curve) and curve[j][0] <= x + 1e-12:
            cur = curve[j][1]
            j += 1
        out.append(cur / optimum if optimum else 0.0)
    return out


def anytime_plot(doc: dict[str, Any], path: Path) -> Path:
    """Median (over seeds) fraction of optimum against the share of budget spent, one panel per recipe."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = doc["cases"]
    cols = min(4, len(cases))
    rows = (len(cases) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3 * rows), dpi=100, squeeze=False)
    xs = [i / (GRID - 1) for i in range(GRID)]
    for ax, c in zip(axes.flat, cases):
        opt = c["oracle"]["optimum_tps"]
        for t in doc["tuners"]:
            rs = [r for r in doc["runs"] if r["recipe"] == c["name"] and r["tuner"] == t and r.get("available")]
            if not rs:
                continue
            ys = [_resample(r["curve"], r["budget_hours"], opt) for r in rs]
            med = [statistics.median(col) for col in zip(*ys)]
            ax.step(xs, med, where="post", label=t)
        ax.set_title(c["name"], fontsize=8)
        ax.set_ylim(0, 1.05)
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(cases):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7, loc="lower right")
    fig.supxlabel("share of budget spent")
    fig.supylabel("best kept throughput / optimum")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def summary_plot(doc: dict[str, Any], path: Path) -> Path:
    """Fraction of optimum per tuner (box over recipes × seeds) and wasted share of budget."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    per = doc["summary"]["tuners"]
    tuners = [t for t in doc["tuners"] if per.get(t, {}).get("available")]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4), dpi=100)
    data = [[r["fraction_of_optimum"] or 0.0 for r in doc["runs"] if r["tuner"] == t and r.get("available")]
            for t in tuners]
    if tuners:
        a1.boxplot(data, tick_labels=tuners)
        a2.bar(tuners, [per[t]["wasted_fraction_of_budget"] for t in tuners], color="tab:red")
    a1.set_ylabel("fraction of exhaustive optimum")
    a1.axhline(0.95, color="grey", ls="--", lw=0.8)
    a1.grid(alpha=0.3)
    a2.set_ylabel("share of budget spent on failed trials")
    a2.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def write_report(doc: dict[str, Any], out_dir: Path) -> dict[str, Path]:
    """Write ``bench.json``, ``bench.md``, ``anytime.png`` and ``summary.png`` under ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "bench.json", "markdown": out / "bench.md", "anytime": out / "anytime.png",
             "summary": out / "summary.png"}
    paths["json"].write_text(json.dumps(doc, indent=1, default=str))
    paths["markdown"].write_text(markdown(doc))
    anytime_plot(doc, paths["anytime"])
    summary_plot(doc, paths["summary"])
    return paths
