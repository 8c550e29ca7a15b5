"""Matplotlib figures of a run (Agg backend, files only)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def throughput_plot(result: dict[str, Any], path: Path) -> Path:
    """Throughput of every launched trial against cumulative accelerator-hours, with the best-so-far line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    spent, best = 0.0, 0.0
    xs, ys, colors, labels = [], [], [], []
    curve_x: list[float] = []
    curve_y: list[float] = []
    for t in result["trials"]:
        spent += t["charged_hours"]
        if t["accepted"]:  # kept: the best line steps up to the kept configuration's mean throughput
            best = result["best_throughput"] if t["id"] == result["best_trial"] else max(best, t["gain_tps"] or 0.0)
        if t["outcome"] == "refused" or t["kind"] == "loss_check":
            curve_x.append(spent)
            curve_y.append(best)
            continue
        tp = t["throughput"] or 0.0
        if t["kind"] == "baseline" and t["outcome"] == "succeeded" and not best:
            best = result["baseline_throughput"] or tp
        xs.append(spent)
        ys.append(tp)
        colors.append("tab:green" if t["accepted"] else "tab:grey" if t["outcome"] == "succeeded" else "tab:red")
        change = ", ".join(f"{k}={v}" for k, v in t["change"].items())
        labels.append(t["kind"] if t["kind"] in ("baseline", "calibration") else
                      (f"{change} (re-run)" if t["kind"] == "confirm" else change))
        if best:
            curve_x.append(spent)
            curve_y.append(best)
    ax.step(curve_x, curve_y, where="post", color="tab:blue", label="best kept")
    ax.scatter(xs, ys, c=colors, zorder=3)
    for x, y, lab in zip(xs, ys, labels):
        ax.annotate(lab, (x, y), fontsize=6, rotation=20, xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel("accelerator-hours spent")
    ax.set_ylabel(result["throughput_unit"])
    ax.set_title(f"{result['recipe']}: {result['speedup'] or 0:.2f}× over baseline")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
