"""What happened to each trial, and the best-so-far curve, from a run's ``result.json`` document.

Both the PNG plot, the HTML report and the leaderboard's card pages draw from :func:`chart_data`, so a trial
is marked the same way everywhere: kept, rejected under the noise floor, refused by the gate (its rules or
its loss-equivalence check), or failed (OOM, crash, timeout, divergence). A candidate's *fate* is the
decision at the end of its chain (candidate → confirmation re-run → loss check), so the first run of a change
that was later kept is drawn as kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from attune.trial import FAILED_OUTCOMES, Decision

#: category → (label, colour) used by every renderer
CATEGORIES: dict[str, tuple[str, str]] = {
    "baseline": ("baseline run", "#1f77b4"),
    "calibration": ("drift reference (equivalent layout)", "#17becf"),
    "reference": ("re-run of the best (paired reference)", "#9ecae1"),
    "kept": ("kept", "#2ca02c"),
    "noise": ("rejected: under the noise floor", "#8c8c8c"),
    "gate": ("refused by the gate", "#d4a017"),
    "moot": ("not run: cannot matter here", "#c7c7c7"),
    "loss": ("refused: loss-equivalence check", "#e377c2"),
    "oom": ("failed: out of memory", "#d62728"),
    "crashed": ("failed: crash", "#a01010"),
    "failed": ("failed: exit status", "#c0392b"),
    "finished_early": ("failed: finished before the window", "#e6550d"),
    "timed_out": ("failed: timeout", "#ff7f0e"),
    "diverged": ("failed: diverged", "#9467bd"),
    "interrupted": ("interrupted", "#7f7f7f"),
    "mismeasured": ("measurement fault: run again", "#b07aa1"),
    "pending": ("awaiting its decision", "#bcbd22"),
}
FAILED = FAILED_OUTCOMES
#: marker shape per category (the SVG and the PNG use the same shapes)
SHAPES: dict[str, str] = {"baseline": "square", "calibration": "square", "reference": "square", "kept": "circle",
                          "noise": "circle",
                          "gate": "cross", "moot": "cross", "loss": "cross", "oom": "triangle-down", "crashed": "x",
                          "failed": "x", "finished_early": "triangle-up",
                          "timed_out": "diamond", "diverged": "star", "interrupted": "x", "mismeasured": "x",
                          "pending": "circle"}


def change_label(change: dict[str, Any] | None) -> str:
    return ", ".join(f"{k}={v}" for k, v in (change or {}).items())


def own_category(t: dict[str, Any]) -> str:
    """The category of one trial record by itself."""
    outcome, kind, decision = t.get("outcome"), t.get("kind"), str(t.get("decision") or "")
    given = t.get("status")
    status = Decision(given) if isinstance(given, str) and given in Decision.__members__.values() else \
        Decision.of_text(decision, accepted=bool(t.get("accepted")), refused=outcome == "refused")  # older result
    if outcome == "refused":
        return "moot" if status is Decision.MOOT else "gate"
    if outcome in FAILED:
        return str(outcome)
    if outcome in ("interrupted", "mismeasured"):
        return str(outcome)
    if kind == "baseline":
        return "baseline"
    if kind in ("calibration", "reference"):
        return str(kind)
    if t.get("accepted"):
        return "kept"
    if kind == "loss_check":
        return "loss"
    if status.pending:
        return "pending"
    return "noise"


def fates(trials: Sequence[dict[str, Any]]) -> dict[int, str]:
    """Trial id → the category at the end of its candidate chain (its own category outside chains)."""
    out: dict[int, str] = {}
    for i, t in enumerate(trials):
        out.setdefault(t["id"], own_category(t))
        if t.get("kind") != "candidate" or t.get("outcome") != "succeeded":
            continue
        chain = [t]
        for u in trials[i + 1:]:
            if u.get("kind") in ("calibration", "reference"):  # runs between a candidate's runs
                continue
            if u.get("kind") in ("confirm", "decision", "loss_check") and u.get("change") == t.get("change"):
                chain.append(u)
                continue
            break
        end = own_category(chain[-1])
        for member in chain:
            if own_category(member) in ("pending", "kept", "noise", "loss"):
                out[member["id"]] = end
    return out


@dataclass(frozen=True)
class Point:
    id: int
    x: float
    y: float | None
    kind: str
    category: str
    label: str
    noise: float | None = None
    detail: str = ""


@dataclass
class ChartData:
    """Everything a throughput-against-hours chart shows."""

    points: list[Point] = field(default_factory=list)  # launched trials with a throughput
    failed: list[Point] = field(default_factory=list)  # launched trials without one (OOM, crash, timeout, …)
    refused: list[Point] = field(default_factory=list)  # gate refusals (no cost, no throughput)
    best: list[tuple[float, float]] = field(default_factory=list)  # best-so-far steps (x, y)
    kept: list[Point] = field(default_factory=list)  # where the best line stepped up
    x_max: float = 0.0
    unit: str = "tokens/s per device"

    def y_range(self) -> tuple[float, float]:
        ys = [p.y for p in self.points if p.y is not None] + [y for _, y in self.best]
        if not ys:
            return 0.0, 1.0
        lo, hi = min(ys), max(ys)
        # equal values (or ones a float rounding apart: a trial and the best line through it) get a visible band
        flat = hi - lo <= 1e-9 * max(abs(lo), abs(hi))
        pad = (abs(hi) * 0.05 or 1.0) if flat else (hi - lo) * 0.08
        return lo - pad, hi + pad

    def categories(self) -> list[str]:
        seen: list[str] = []
        for p in [*self.points, *self.failed, *self.refused]:
            if p.category not in seen:
                seen.append(p.category)
        return [c for c in CATEGORIES if c in seen]


def chart_data(result: dict[str, Any]) -> ChartData:
    """The chart of a ``result.json`` document (see the module docstring for how trials are marked)."""
    trials = list(result.get("trials") or [])
    fate = fates(trials)
    data = ChartData(unit=str(result.get("throughput_unit") or "tokens/s per device"))
    spent = 0.0
    best: float | None = None
    baseline = result.get("baseline_throughput")
    kept_any = False
    for t in trials:
        spent += float(t.get("charged_hours") or 0.0)
        cat = fate.get(t["id"], own_category(t))
        kind = str(t.get("kind"))
        label = kind if kind in ("baseline", "calibration", "reference") else change_label(t.get("change")) or kind
        if kind == "confirm":
            label += " (re-run)"
        tp = t.get("throughput")
        if kind == "baseline" and t.get("outcome") == "succeeded" and tp and not kept_any:
            best = float(baseline or tp)  # the mean of the baseline runs: what candidates are measured against
        if t.get("accepted"):
            kept_any = True
            new = result.get("best_throughput") if t["id"] == result.get("best_trial") else t.get("gain_tps")
            if new:
                best = float(new)
                data.kept.append(Point(t["id"], spent, best, kind, "kept", change_label(t.get("change")),
                                       detail=str(t.get("decision") or "")))
        detail = str(t.get("decision") or t.get("message") or "")
        if t.get("outcome") == "refused":
            data.refused.append(Point(t["id"], spent, None, kind, "gate", label, detail=str(t.get("message") or "")))
        elif kind in ("loss_check", "decision"):
            pass  # a comparison of earlier runs: launches nothing; its verdict shows on the chain's markers
        elif tp and t.get("outcome") != "mismeasured":  # a measurement fault's figure is not a throughput
            cv = t.get("noise_cv")
            data.points.append(Point(t["id"], spent, float(tp), kind, cat, label,
                                     noise=float(tp) * float(cv) if cv is not None else None, detail=detail))
        else:
            data.failed.append(Point(t["id"], spent, None, kind, cat, label,
                                     detail=str(t.get("message") or t.get("decision") or "")))
        if best is not None:
            data.best.append((spent, best))
    data.x_max = spent
    return data
