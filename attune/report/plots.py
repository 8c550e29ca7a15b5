"""Matplotlib figures of a run (Agg backend, files only).

The throughput plot draws launched trials against the accelerator-hours spent so far, with the best kept
throughput as a step line. Its y-axis spans measured throughputs only: failed trials (OOM, crash, timeout,
divergence) sit as markers in a lane of their own under the axis, gate refusals in a lane above it, so a
failure never drags the axis to zero and flattens a small gain. Points carry their trial number; the changes
that were kept are listed under the plot; the legend sits below the axes, where it cannot hide a point.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from attune.report.trials import CATEGORIES, FAILED, ChartData, chart_data

#: matplotlib marker per shape name of :data:`attune.report.trials.SHAPES`
_MPL = {"square": "s", "circle": "o", "cross": "P", "triangle-down": "v", "triangle-up": "^", "x": "X", "diamond": "D", "star": "*"}


def _marker(category: str) -> str:
    from attune.report.trials import SHAPES

    return _MPL[SHAPES.get(category, "circle")]


def throughput_figure(result: dict[str, Any]) -> Any:
    """The figure (not saved) of :func:`throughput_plot`, for callers that want to inspect or restyle it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data: ChartData = chart_data(result)
    has_top, has_bottom = bool(data.refused), bool(data.failed)
    ratios = [0.45] * has_top + [5] + [0.45] * has_bottom
    fig = plt.figure(figsize=(9, 4.8 + 0.4 * (has_top + has_bottom)), dpi=110)
    grid = fig.add_gridspec(len(ratios), 1, height_ratios=ratios, hspace=0.08)
    ax = fig.add_subplot(grid[int(has_top)])
    top = fig.add_subplot(grid[0], sharex=ax) if has_top else None
    bottom = fig.add_subplot(grid[len(ratios) - 1], sharex=ax) if has_bottom else None

    if data.best:
        xs = [x for x, _ in data.best]
        ys = [y for _, y in data.best]
        ax.step(xs, ys, where="post", color="tab:blue", lw=1.6, label="best kept so far", zorder=2)
    for cat in CATEGORIES:
        pts = [p for p in data.points if p.category == cat]
        if pts:
            label, colour = CATEGORIES[cat]
            ax.scatter([p.x for p in pts], [p.y or 0.0 for p in pts], c=colour, marker=_marker(cat), s=38,
                       edgecolors="black", linewidths=0.4, label=label, zorder=3)
    if data.kept:
        ax.scatter([p.x for p in data.kept], [p.y or 0.0 for p in data.kept], s=150, facecolors="none",
                   edgecolors="tab:green", linewidths=1.6, zorder=4)
    for p in data.points:
        ax.annotate(str(p.id), (p.x, p.y), fontsize=6.5, xytext=(4, 3), textcoords="offset points",
                    color="#333333", annotation_clip=False)
    lo, hi = data.y_range()
    ax.set_ylim(lo, hi)
    span = data.x_max or 1.0
    ax.set_xlim(-0.02 * span, span * 1.06)
    ax.set_ylabel(data.unit)
    ax.grid(alpha=0.3)
    ax.ticklabel_format(axis="y", style="plain", useOffset=False)

    for lane, pts, name in ((bottom, data.failed, "failed"), (top, data.refused, "refused\nby gate")):
        if lane is None:
            continue
        lane.set_ylim(-1, 1)
        lane.set_yticks([0])
        lane.set_yticklabels([name], fontsize=7)
        lane.grid(axis="x", alpha=0.3)
        lane.tick_params(axis="x", labelbottom=lane is bottom)
        for cat in [*FAILED, "interrupted", "mismeasured", "gate"]:
            sel = [p for p in pts if p.category == cat]
            if sel:
                label, colour = CATEGORIES[cat]
                lane.scatter([p.x for p in sel], [0] * len(sel), c=colour, marker=_marker(cat), s=40,
                             edgecolors="black", linewidths=0.4, label=label, zorder=3)
        for i, p in enumerate(pts):
            lane.annotate(str(p.id), (p.x, 0), fontsize=6, xytext=(4, 2 if i % 2 else -8),
                          textcoords="offset points", annotation_clip=False)
    (bottom or ax).set_xlabel("accelerator-hours spent")
    if bottom is not None:
        ax.tick_params(axis="x", labelbottom=False)

    speedup = result.get("speedup") or 0.0
    gain = (speedup - 1.0) * 100 if speedup else 0.0
    fig.suptitle(f"{result.get('recipe', 'run')}: {speedup:.3f}× the baseline ({gain:+.1f} %)", fontsize=11)
    handles, labels = [], []
    for a in (ax, top, bottom):
        if a is None:
            continue
        for h, lab in zip(*a.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    after = {"loss_check": "after the loss check ", "decision": "at the paired look "}
    kept = "; ".join(f"{p.label} (" + after.get(p.kind, "trial ") + f"#{p.id})"
                     for p in data.kept) or "none"
    fig.text(0.01, 0.01, f"kept: {kept}", fontsize=7, ha="left", va="bottom", wrap=True)
    fig.legend(handles, labels, loc="lower center", ncol=min(4, max(1, len(labels))), fontsize=7, frameon=False,
               bbox_to_anchor=(0.5, 0.035))
    n_rows = (len(labels) + 3) // 4
    fig.subplots_adjust(left=0.1, right=0.97, top=0.92, bottom=0.13 + 0.035 * n_rows)
    return fig


def throughput_plot(result: dict[str, Any], path: Path) -> Path:
    """Throughput of every launched trial against cumulative accelerator-hours, with the best-so-far line."""
    import matplotlib.pyplot as plt

    fig = throughput_figure(result)
    fig.savefig(path)
    plt.close(fig)
    return path
