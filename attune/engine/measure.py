"""From per-step records to steady-state figures: drop warm-up, take the window, median and noise."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from attune.trial import Measurement


class MeasurementError(ValueError):
    """A trial's step records cannot give a measurement (no token count): a failed trial, with this message."""


def summarise(
    steps: Sequence[dict[str, Any]], *, warmup_steps: int, devices: int, signals: dict[str, float] | None = None,
    reported: dict[str, Any] | None = None,
) -> Measurement | None:
    """Measurement of a trial from its step records (rank 0's), or ``None`` if the window is empty.

    Throughput uses the *median* step time of the window, so one slow step (a GC pause, a noisy
    neighbour) does not decide a trial; its spread is reported as the coefficient of variation.
    :class:`MeasurementError` where the window's records carry no token count (throughput is tokens per second).
    """
    ordered = sorted(steps, key=lambda r: r["step"])
    window = ordered[warmup_steps:]
    if not window:
        return None
    missing = sum(1 for r in window if r.get("tokens") is None)
    if missing:
        raise MeasurementError(
            f"the trial's step records carry no token count ({missing} of the {len(window)} measured steps), so "
            "attune cannot compute its throughput: the recipe must say how many tokens a step holds (a command "
            "recipe: tokens_per_sample or tokens_per_step in its knob declaration, or a tokens group in its step "
            "pattern)")
    times = [float(r["step_time_s"]) for r in window]
    med = statistics.median(times)
    mean = statistics.fmean(times)
    cv = statistics.stdev(times) / mean if len(times) > 1 and mean > 0 else 0.0
    tokens = statistics.median(float(r["tokens"]) for r in window)
    tps = tokens / med if med > 0 else 0.0
    phase_names = sorted({k for r in window for k in (r.get("phases") or {})})
    phases = {p: statistics.median(float((r.get("phases") or {}).get(p, 0.0)) for r in window) for p in phase_names}
    mems = [float(r["peak_mem_mb"]) for r in ordered if r.get("peak_mem_mb") is not None]
    return Measurement(
        tokens_per_s_per_device=tps / max(devices, 1),
        tokens_per_s=tps,
        step_time_median_s=med,
        step_time_cv=cv,
        steps_measured=len(window),
        peak_memory_mb=max(mems) if mems else None,
        phases=phases,
        losses=[float(r["loss"]) for r in ordered],
        grad_norms=[float(r["grad_norm"]) for r in ordered if r.get("grad_norm") is not None],
        signals=dict(signals or {}),
        reported=dict(reported or {}),
    )
