"""Inline SVG charts for the HTML report and the leaderboard (no JavaScript, no external files).

Two charts: the search (throughput of every trial against accelerator-hours, best-so-far steps, failed and
refused trials in lanes of their own) and the loss curves (baseline and tuned runs over the tolerance band).
Every marker carries a ``<title>`` (the browser's tooltip) and ``data-*`` attributes tests can select.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape
from typing import Any

from attune.report.trials import CATEGORIES, FAILED, SHAPES, ChartData, chart_data


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About ``n`` round tick values covering ``[lo, hi]`` (at most ``n + 1``).

    Each tick is an integer multiple of the step, counted by index: adding the step to a running value never moves
    it when the step is below the value's float resolution (a span of 1e-12 around 8,550), which spun for minutes.
    """
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return [lo]
    n = max(n, 1)
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first, last = math.ceil(lo / step - 1e-9), math.floor(hi / step + 1e-9)
    ticks = [round(k * step, 12) for k in range(first, last + 1)] if last - first <= n else []
    if len(set(ticks)) < len(ticks) or not ticks:  # the span is below the values' resolution: the ends are all
        return [lo, hi]
    return ticks


def fmt_num(v: float) -> str:
    """A tick or value label: thousands separators for big numbers, significant digits for small ones."""
    a = abs(v)
    if a >= 1000:
        return f"{v:,.0f}"
    if a >= 10:
        return f"{v:.0f}" if float(v).is_integer() else f"{v:.1f}"
    if a >= 0.01 or a == 0:
        return f"{v:.3g}"
    return f"{v:.2e}"


def marker(shape: str, x: float, y: float, r: float, fill: str, attrs: str = "", title: str = "") -> str:
    """One marker of ``shape`` (see :data:`attune.report.trials.SHAPES`) centred on (x, y)."""
    t = f"<title>{escape(title)}</title>" if title else ""
    common = f'fill="{fill}" stroke="#222" stroke-width="0.8" {attrs}'
    if shape == "square":
        return f'<rect x="{x - r:.1f}" y="{y - r:.1f}" width="{2 * r:.1f}" height="{2 * r:.1f}" {common}>{t}</rect>'
    if shape == "triangle-down":
        pts = f"{x - r:.1f},{y - r * 0.8:.1f} {x + r:.1f},{y - r * 0.8:.1f} {x:.1f},{y + r:.1f}"
        return f'<polygon points="{pts}" {common}>{t}</polygon>'
    if shape == "triangle-up":
        pts = f"{x - r:.1f},{y + r * 0.8:.1f} {x + r:.1f},{y + r * 0.8:.1f} {x:.1f},{y - r:.1f}"
        return f'<polygon points="{pts}" {common}>{t}</polygon>'
    if shape == "diamond":
        pts = f"{x:.1f},{y - r * 1.2:.1f} {x + r:.1f},{y:.1f} {x:.1f},{y + r * 1.2:.1f} {x - r:.1f},{y:.1f}"
        return f'<polygon points="{pts}" {common}>{t}</polygon>'
    if shape in ("x", "cross", "star"):
        a = r * 0.9
        if shape == "cross":
            d = f"M{x - a:.1f},{y:.1f}H{x + a:.1f}M{x:.1f},{y - a:.1f}V{y + a:.1f}"
        else:
            d = f"M{x - a:.1f},{y - a:.1f}L{x + a:.1f},{y + a:.1f}M{x - a:.1f},{y + a:.1f}L{x + a:.1f},{y - a:.1f}"
            if shape == "star":
                d += f"M{x:.1f},{y - a * 1.2:.1f}V{y + a * 1.2:.1f}"
        hit = f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{r + 1:.1f}" fill="{fill}" fill-opacity="0.25" stroke="none"/>'
        return (f'<g {attrs}>{hit}<path d="{d}" stroke="{fill}" stroke-width="2.6" stroke-linecap="round" '
                f'fill="none"/>{t}</g>')
    return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{r:.1f}" {common}>{t}</circle>'


class Frame:
    """A plot area with linear scales, axes, grid and tick labels, inside an SVG of ``width`` × ``height``."""

    def __init__(self, width: int, height: int, x: tuple[float, float], y: tuple[float, float], *,
                 left: int = 72, right: int = 16, top: int = 14, bottom: int = 44) -> None:
        self.width, self.height = width, height
        self.x0, self.x1 = x
        self.y0, self.y1 = y
        if self.x1 <= self.x0:
            self.x1 = self.x0 + 1.0
        if self.y1 <= self.y0:
            self.y1 = self.y0 + 1.0
        self.left, self.right, self.top, self.bottom = left, right, top, bottom

    @property
    def pw(self) -> float:
        return self.width - self.left - self.right

    @property
    def ph(self) -> float:
        return self.height - self.top - self.bottom

    def sx(self, v: float) -> float:
        return self.left + (v - self.x0) / (self.x1 - self.x0) * self.pw

    def sy(self, v: float) -> float:
        return self.top + (1 - (v - self.y0) / (self.y1 - self.y0)) * self.ph

    def axes(self, x_label: str, y_label: str, *, y_ticks: bool = True, x_ticks: bool = True,
             x_tick_labels: bool = True, x_integer: bool = False) -> list[str]:
        out = [f'<rect class="plot-bg" x="{self.left}" y="{self.top}" width="{self.pw:.1f}" height="{self.ph:.1f}" '
               f'fill="#fff" stroke="#888"/>']
        if x_ticks:
            for t in nice_ticks(self.x0, self.x1, 6):
                if x_integer and not float(t).is_integer():
                    continue
                px = self.sx(t)
                out.append(f'<line x1="{px:.1f}" y1="{self.top}" x2="{px:.1f}" y2="{self.top + self.ph:.1f}" '
                           f'stroke="#e5e5e5"/>')
                if x_tick_labels:
                    out.append(f'<text x="{px:.1f}" y="{self.top + self.ph + 15:.1f}" text-anchor="middle" '
                               f'class="tick">{escape(fmt_num(t))}</text>')
        if y_ticks:
            for t in nice_ticks(self.y0, self.y1, 5):
                py = self.sy(t)
                out.append(f'<line x1="{self.left}" y1="{py:.1f}" x2="{self.left + self.pw:.1f}" y2="{py:.1f}" '
                           f'stroke="#e5e5e5"/>')
                out.append(f'<text x="{self.left - 6}" y="{py + 4:.1f}" text-anchor="end" class="tick">'
                           f'{escape(fmt_num(t))}</text>')
        if x_label:
            out.append(f'<text x="{self.left + self.pw / 2:.1f}" y="{self.height - 6}" text-anchor="middle" '
                       f'class="axis-label">{escape(x_label)}</text>')
        if y_label:
            cy = self.top + self.ph / 2
            out.append(f'<text x="14" y="{cy:.1f}" transform="rotate(-90 14 {cy:.1f})" text-anchor="middle" '
                       f'class="axis-label">{escape(y_label)}</text>')
        return out


def _svg(width: int, height: int, body: list[str], label: str, cls: str) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" class="chart {cls}" viewBox="0 0 {width} {height}" '
            f'width="100%" role="img" aria-label="{escape(label)}" preserveAspectRatio="xMidYMid meet">'
            + "".join(body) + "</svg>")


def legend_html(categories: Sequence[str], extra: Sequence[tuple[str, str]] = ()) -> str:
    """An HTML legend (outside the SVG, so it never covers a point)."""
    items = []
    for label, swatch in extra:
        items.append(f'<li>{swatch}<span>{escape(label)}</span></li>')
    for c in categories:
        label, colour = CATEGORIES[c]
        sw = (f'<svg width="14" height="14" viewBox="0 0 14 14" aria-hidden="true">'
              f'{marker(SHAPES.get(c, "circle"), 7, 7, 4.5, colour)}</svg>')
        items.append(f'<li data-category="{c}">{sw}<span>{escape(label)}</span></li>')
    return '<ul class="legend">' + "".join(items) + "</ul>"


def search_chart(result: dict[str, Any], *, width: int = 900, height: int = 380) -> str:
    """The search of a run: every trial against accelerator-hours spent, and the best kept throughput."""
    data: ChartData = chart_data(result)
    lane_h = 26
    lanes = [("refused by the gate", data.refused)] if data.refused else []
    top_extra = lane_h + 6 if lanes else 0
    bottom_extra = lane_h + 6 if data.failed else 0
    lo, hi = data.y_range()
    span = data.x_max or 1.0
    f = Frame(width, height, (-0.02 * span, span * 1.05), (lo, hi), top=14 + top_extra, bottom=44 + bottom_extra)
    body = f.axes("", data.unit, x_tick_labels=not data.failed)
    body = [b for b in body if 'class="axis-label"' not in b or "rotate" in b]  # x label goes under the lanes
    if data.best:
        d = ""
        for i, (x, y) in enumerate(data.best):
            px, py = f.sx(x), f.sy(y)
            d += f"M{px:.1f},{py:.1f}" if i == 0 else f"H{px:.1f}V{py:.1f}"
        body.append(f'<path class="best-line" d="{d}" fill="none" stroke="#1f77b4" stroke-width="2"/>')
    for p in data.kept:
        body.append(f'<circle class="kept-ring" cx="{f.sx(p.x):.1f}" cy="{f.sy(p.y or 0):.1f}" r="9" fill="none" '
                    f'stroke="#2ca02c" stroke-width="2"><title>kept #{p.id}: {escape(p.label)}</title></circle>')
    for p in data.points:
        px, py = f.sx(p.x), f.sy(p.y or 0)
        if p.noise:
            dy = abs(f.sy((p.y or 0) - p.noise) - py)
            body.append(f'<line x1="{px:.1f}" y1="{py - dy:.1f}" x2="{px:.1f}" y2="{py + dy:.1f}" stroke="#555" '
                        f'stroke-width="1"/>')
        title = f"#{p.id} {p.label}: {p.y:,.0f} {data.unit} — {CATEGORIES[p.category][0]}. {p.detail}"
        body.append(marker(SHAPES.get(p.category, "circle"), px, py, 5, CATEGORIES[p.category][1],
                           f'class="trial" data-trial="{p.id}" data-category="{p.category}"', title))
        body.append(f'<text x="{px + 6:.1f}" y="{py - 6:.1f}" class="pt-label">{p.id}</text>')

    def lane(y_top: float, name: str, pts: list[Any]) -> None:
        body.append(f'<rect x="{f.left}" y="{y_top:.1f}" width="{f.pw:.1f}" height="{lane_h}" fill="#fafafa" '
                    f'stroke="#bbb"/>')
        body.append(f'<text x="{f.left - 6}" y="{y_top + lane_h / 2 + 4:.1f}" text-anchor="end" class="tick">'
                    f'{escape(name)}</text>')
        placed: dict[int, int] = {}
        for p in pts:
            px = f.sx(p.x)
            slot = placed.get(round(px / 8), 0)  # refusals cost nothing: fan out markers at the same hour
            placed[round(px / 8)] = slot + 1
            px += 9 * slot
            cy = y_top + lane_h / 2
            title = f"#{p.id} {p.label} — {CATEGORIES[p.category][0]}. {p.detail}"
            body.append(marker(SHAPES.get(p.category, "circle"), px, cy, 5, CATEGORIES[p.category][1],
                               f'class="trial" data-trial="{p.id}" data-category="{p.category}"', title))
            body.append(f'<text x="{px + 6:.1f}" y="{cy - 4:.1f}" class="pt-label">{p.id}</text>')

    if data.refused:
        lane(f.top - lane_h - 6, "refused", data.refused)
    if data.failed:
        y_top = f.top + f.ph + 8
        lane(y_top, "failed", data.failed)
        for t in nice_ticks(f.x0, f.x1, 6):
            body.append(f'<text x="{f.sx(t):.1f}" y="{y_top + lane_h + 14:.1f}" text-anchor="middle" '
                        f'class="tick">{escape(fmt_num(t))}</text>')
    body.append(f'<text x="{f.left + f.pw / 2:.1f}" y="{height - 6}" text-anchor="middle" class="axis-label">'
                f'accelerator-hours spent</text>')
    return _svg(width, height + 0, body, f"throughput of every trial of {result.get('recipe', 'the run')}",
                "search-chart")


def search_legend(result: dict[str, Any]) -> str:
    data = chart_data(result)
    line = ('<svg width="22" height="14" aria-hidden="true"><line x1="1" y1="7" x2="21" y2="7" stroke="#1f77b4" '
            'stroke-width="2"/></svg>')
    ring = ('<svg width="14" height="14" aria-hidden="true"><circle cx="7" cy="7" r="5.5" fill="none" '
            'stroke="#2ca02c" stroke-width="2"/></svg>')
    extra = [("best kept so far", line)] + ([("change kept here", ring)] if data.kept else [])
    return legend_html(data.categories(), extra)


def loss_chart(evidence: dict[str, Any], *, width: int = 900, height: int = 320) -> str:
    """Baseline and tuned loss curves over the tolerance band around the reference (baseline) curve."""
    ref = list(evidence.get("reference") or [])
    tol = list(evidence.get("tolerance") or [])
    base_runs = [list(r) for r in evidence.get("baseline_runs") or []]
    tuned_runs = [list(r) for r in evidence.get("tuned_runs") or []]
    curves = base_runs + tuned_runs
    steps = max((len(c) for c in curves), default=0)
    if not steps:
        return '<p class="muted">No loss curves were recorded.</p>'
    vals = [v for c in curves for v in c if isinstance(v, (int, float)) and math.isfinite(v)]
    if ref and tol:
        vals += [r + t for r, t in zip(ref, tol)] + [r - t for r, t in zip(ref, tol)]
    lo, hi = (min(vals), max(vals)) if vals else (0.0, 1.0)
    pad = (hi - lo) * 0.08 or abs(hi) * 0.02 or 0.5
    f = Frame(width, height, (0, max(steps - 1, 1)), (lo - pad, hi + pad))
    body = f.axes("step", "loss", x_integer=True)
    if ref and tol:
        n = min(len(ref), len(tol))
        upper = " ".join(f"{f.sx(i):.1f},{f.sy(ref[i] + tol[i]):.1f}" for i in range(n))
        lower = " ".join(f"{f.sx(i):.1f},{f.sy(ref[i] - tol[i]):.1f}" for i in reversed(range(n)))
        body.append(f'<polygon class="tolerance-band" points="{upper} {lower}" fill="#ffbf00" fill-opacity="0.28" '
                    f'stroke="#d4a017" stroke-width="0.6"><title>tolerance band: reference ± derived tolerance'
                    f'</title></polygon>')

    def poly(run: list[float], cls: str, colour: str, dash: str, title: str) -> None:
        pts = " ".join(f"{f.sx(i):.1f},{f.sy(v):.1f}" for i, v in enumerate(run)
                       if isinstance(v, (int, float)) and math.isfinite(v))
        body.append(f'<polyline class="{cls}" points="{pts}" fill="none" stroke="{colour}" stroke-width="1.8" '
                    f'stroke-dasharray="{dash}"><title>{escape(title)}</title></polyline>')

    for i, run in enumerate(base_runs):
        poly(run, "loss-baseline", "#1f77b4", "", f"baseline run {i + 1}")
    for i, run in enumerate(tuned_runs):
        poly(run, "loss-tuned", "#2ca02c", "5 3", f"tuned recipe run {i + 1}")
    return _svg(width, height, body, "loss curves of the baseline and the tuned recipe with the tolerance band",
                "loss-chart")


def loss_diff_chart(evidence: dict[str, Any], *, width: int = 900, height: int = 260) -> str:
    """Each run's loss minus the reference (first baseline) run's, per step, inside the ± tolerance band."""
    ref = list(evidence.get("reference") or [])
    tol = list(evidence.get("tolerance") or [])
    if not ref or not tol:
        return ""
    n = min(len(ref), len(tol))
    series: list[tuple[str, str, str, list[float]]] = []
    for run in (evidence.get("baseline_runs") or [])[1:]:
        series.append(("diff-baseline", "#1f77b4", "", [run[k] - ref[k] for k in range(min(n, len(run)))]))
    for run in evidence.get("tuned_runs") or []:
        series.append(("diff-tuned", "#2ca02c", "5 3", [run[k] - ref[k] for k in range(min(n, len(run)))]))
    finite = [abs(v) for _, _, _, d in series for v in d if math.isfinite(v)]
    span = max([*tol[:n], *finite, 1e-12]) * 1.15
    f = Frame(width, height, (0, max(n - 1, 1)), (-span, span), left=86)
    body = f.axes("step", "Δloss vs baseline", x_integer=True)
    upper = " ".join(f"{f.sx(i):.1f},{f.sy(tol[i]):.1f}" for i in range(n))
    lower = " ".join(f"{f.sx(i):.1f},{f.sy(-tol[i]):.1f}" for i in reversed(range(n)))
    body.append(f'<polygon class="tolerance-band diff-band" points="{upper} {lower}" fill="#ffbf00" '
                f'fill-opacity="0.28" stroke="#d4a017" stroke-width="0.6"><title>± tolerance</title></polygon>')
    body.append(f'<line x1="{f.left}" y1="{f.sy(0):.1f}" x2="{f.left + f.pw:.1f}" y2="{f.sy(0):.1f}" stroke="#888" '
                'stroke-dasharray="2 2"/>')
    for cls, colour, dash, d in series:
        pts = " ".join(f"{f.sx(i):.1f},{f.sy(v):.1f}" for i, v in enumerate(d) if math.isfinite(v))
        body.append(f'<polyline class="{cls}" points="{pts}" fill="none" stroke="{colour}" stroke-width="1.8" '
                    f'stroke-dasharray="{dash}"/>')
        for i, v in enumerate(d):
            if math.isfinite(v):
                body.append(f'<circle cx="{f.sx(i):.1f}" cy="{f.sy(v):.1f}" r="2.5" fill="{colour}">'
                            f'<title>step {i}: Δ {v:.3g} (tolerance {tol[i]:.3g})</title></circle>')
    return _svg(width, height, body, "difference of each run's loss from the baseline's, with the tolerance band",
                "loss-diff-chart")


def loss_legend() -> str:
    def sw(colour: str, dash: str = "") -> str:
        return (f'<svg width="22" height="14" aria-hidden="true"><line x1="1" y1="7" x2="21" y2="7" stroke="{colour}" '
                f'stroke-width="2" stroke-dasharray="{dash}"/></svg>')

    band = ('<svg width="22" height="14" aria-hidden="true"><rect x="1" y="2" width="20" height="10" fill="#ffbf00" '
            'fill-opacity="0.28" stroke="#d4a017"/></svg>')
    return legend_html([], [("baseline (lower panel: another baseline run)", sw("#1f77b4")),
                            ("tuned recipe", sw("#2ca02c", "5 3")), ("tolerance band around the baseline", band)])


__all__ = ["FAILED", "Frame", "fmt_num", "legend_html", "loss_chart", "loss_diff_chart", "loss_legend", "marker",
           "nice_ticks",
           "search_chart", "search_legend"]
