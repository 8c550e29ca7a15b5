"""From per-step records to steady-state figures: drop warm-up, take the window, median and noise."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from attune.trial import Measurement, TrialRequest


class MeasurementError(ValueError):
    """A trial's step records cannot give a measurement (no token count): a failed trial, with this message."""


def summarise(
    steps: Sequence[dict[str, Any]], *, warmup_steps: int, devices: int, signals: dict[str, float] | None = None,
    reported: dict[str, Any] | None = None, ended: str | None = None,
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
        warmup_steps=warmup_steps,
        ended=ended,
        peak_memory_mb=max(mems) if mems else None,
        phases=phases,
        losses=[float(r["loss"]) for r in ordered],
        grad_norms=[float(r["grad_norm"]) for r in ordered if r.get("grad_norm") is not None],
        signals=dict(signals or {}),
        reported=dict(reported or {}),
    )


# -- the adaptive window: warm-up detected, measurement ended once it is precise enough --------------------------
# A fixed warm-up assumes how long compilation, autotuning and communicator set-up make the first steps slow, which
# differs per framework and recipe (torch.compile's first step ~300x a steady one, the next two still 11 % and 8 %
# slow: the torchtitan log in pytorch/pytorch#158912); a fixed window spends steps on a mean already known far better
# than the run-to-run noise lets one run tell. The adaptive window reads both from the step series as it arrives.

#: a step within this share of the steady level (the median of the later half of it and the steps after it), or
#: WARMUP_SPREAD robust standard deviations of those later steps where they spread more, starts the window; every step before it is warm-up. Both ways: a first
#: step timed by its line's arrival from an arbitrary start can read short as well as long
WARMUP_TOLERANCE = 0.03
WARMUP_SPREAD = 3.0
#: a candidate's window ends as futile once its throughput, this many standard errors up, is still below what it needs
FUTILITY_Z = 3.0
#: relative standard error of a window's median step time, from the steps' coefficient of variation (the median's
#: efficiency against the mean under normal jitter: sqrt(pi/2))
MEDIAN_SE_FACTOR = 1.2533


@dataclass(frozen=True)
class WindowEnd:
    """Where a trial's measurement stands once it may end: the warm-up steps to drop, and why it ends (``precise``,
    ``futile``, ``cap``: its most steps; ``fixed``: the request's fixed warm-up and window)."""

    warmup: int
    reason: str


def detect_warmup(times: Sequence[float], *, min_window: int, max_warmup: int) -> int | None:
    """How many leading steps of ``times`` are warm-up: the first step within :data:`WARMUP_TOLERANCE` of the steady
    level (the median of the later half of it and the steps after it; or :data:`WARMUP_SPREAD` robust standard
    deviations of those later steps, where they spread more) starts the window. None while fewer than ``min_window`` steps would follow it; at most
    ``max_warmup`` (a series that never settles is measured after that many)."""
    for w in range(max(max_warmup, 0) + 1):
        rest = times[w:]
        if len(rest) < min_window:
            return None
        steady = rest[len(rest) // 2:]  # the later steps: past any warm-up there is
        level = statistics.median(steady)
        if level <= 0:
            return w
        mad = statistics.median(abs(x - level) for x in steady) * 1.4826
        if abs(times[w] - level) <= level * max(WARMUP_TOLERANCE, WARMUP_SPREAD * mad / level):
            return w
    return max(max_warmup, 0)


def window_se(times: Sequence[float]) -> float:
    """Relative standard error of the median of ``times`` (inf with fewer than two)."""
    if len(times) < 2:
        return math.inf
    mean = statistics.fmean(times)
    return MEDIAN_SE_FACTOR * statistics.stdev(times) / mean / math.sqrt(len(times)) if mean > 0 else math.inf


def window_end(steps: Sequence[dict[str, Any]], request: TrialRequest, devices: int) -> WindowEnd | None:
    """Whether the trial may end after ``steps`` (its step records so far, in order), and where its window starts;
    None while it must run on. A request without a plan runs its fixed warm-up and window; with one
    (:class:`~attune.trial.MeasurePlan`), the window starts after the detected warm-up and ends when its median is
    known to the plan's standard error, when a candidate is surely below what it needs, or at the request's most
    steps, whichever comes first."""
    plan, n, cap = request.plan, len(steps), request.steps
    if plan is None:
        return WindowEnd(request.warmup_steps, "fixed") if n >= cap else None
    min_window = max(2, min(plan.min_window, request.measure_steps))
    if any(not isinstance(r.get("step_time_s"), (int, float)) for r in steps[:cap]):  # a step not timed (yet)
        return WindowEnd(request.warmup_steps, "cap") if n >= cap else None
    times = [float(r["step_time_s"]) for r in steps[:cap]]
    w = detect_warmup(times, min_window=min_window, max_warmup=cap - min_window)
    if w is None:
        return WindowEnd(request.warmup_steps, "cap") if n >= cap else None
    window = times[w:]
    se = window_se(window)
    if se <= plan.target_se:
        return WindowEnd(w, "precise")
    tokens = [r.get("tokens") for r in steps[w:cap]]
    med = statistics.median(window)
    if plan.futility_tps is not None and med > 0 and all(isinstance(t, (int, float)) for t in tokens):
        tps = statistics.median(float(t) for t in tokens) / med / max(devices, 1)  # type: ignore[arg-type]
        if tps * (1 + FUTILITY_Z * se) < plan.futility_tps:
            return WindowEnd(w, "futile")
    return WindowEnd(w, "cap") if n >= cap else None


# -- measurements that cannot be true ----------------------------------------------------------------------------
# A step timed by the arrival of its line is only as true as the arrival: a job whose output sits in a buffer (a
# launcher that pipes its workers, a script that does not flush) hands attune all its lines at once, and the steps
# then read as the microseconds between two reads of one pipe (seen: a run_clm baseline under torchrun measured at
# 61 µs per step, 2,000× too fast, where HF's own clock on the same lines said ~50 ms). Such a trial is a fault of
# the measurement, not of the recipe: the engine runs it again and never uses its figures.

#: a step line that follows the previous one by less than this arrived in the same burst: the pipe hands over lines
#: already written in tens of microseconds each, and no training step that prints a line (the framework's logging
#: alone) is this short
BURST_GAP_S = 0.002
#: ... or by less than this share of the trial's wall-clock per step (its whole wall-clock over its steps: start-up
#: included, so this is generous to a quick step after a long start)
BURST_SHARE = 0.01
#: steps that read faster than the job's own clock by more than this factor were not timed by it: a job's clock and
#: the arrival of its lines agree to a few percent when the lines are flushed as they are written
OWN_CLOCK_FACTOR = 3.0


def timing_fault(steps: Sequence[dict[str, Any]], *, warmup_steps: int, wall_s: float) -> str | None:
    """Why the step times of a trial's window cannot be true, or None when nothing says so.

    ``steps`` are the step records a parser built (rank 0's), each with its ``arrived_s`` (seconds since launch
    when its line arrived; the local backend adds it) and, where the job prints its own running clock, ``clock_s``
    (seconds by the job's clock: HF's per-step ``train_runtime``). Two checks:

    - **the job's own clock**: over the window, the steps' times sum to far less than the job's clock advanced
      (:data:`OWN_CLOCK_FACTOR`);
    - **a burst**: most of the window's lines arrived within :data:`BURST_GAP_S` (or :data:`BURST_SHARE` of the
      wall-clock per step, if shorter) of the one before, and the window's steps were timed by those arrivals (their
      median step time is as short). Steps timed by the job itself (records marked ``own_time``: a command
      script's ``time_ms`` field) are true however their lines arrived, and pass, however short they are.
    """
    ordered = sorted(steps, key=lambda r: r["step"])
    window = ordered[warmup_steps:]
    if len(window) < 2:
        return None
    times = [float(r["step_time_s"]) for r in window]
    med = statistics.median(times)
    before = ordered[warmup_steps - 1] if warmup_steps > 0 else None
    clocks = [r.get("clock_s") for r in ([before] if before else []) + window]
    if all(isinstance(c, (int, float)) for c in clocks) and len(clocks) == len(window) + 1:
        last = float(clocks[-1])  # type: ignore[arg-type]
        # the clock as printed may have four significant digits only (HF 5 logs '.4g'): at 1,234 s, a second; the
        # span is taken at its shortest that the printed digits allow
        step = 10.0 ** (math.floor(math.log10(last)) - 3) if last > 0 else 0.0
        own = last - float(clocks[0]) - 2 * step  # type: ignore[arg-type]
        if own > 0 and sum(times) * OWN_CLOCK_FACTOR < own:
            return (f"its {len(window)} measured steps took {sum(times):.4g} s as timed by their lines' arrival, "
                    f"where the job's own clock advanced {own:.4g} s over them: the step times are not true")
    if all(r.get("own_time") for r in window):
        return None  # every step was timed by the job's own clock (``own_time``): a burst of lines changes nothing
    arrivals = [r.get("arrived_s") for r in ([before] if before else []) + window]
    if wall_s > 0 and all(isinstance(a, (int, float)) for a in arrivals) and len(arrivals) >= 3:
        gaps = [float(b) - float(a) for a, b in pairwise(arrivals)]  # type: ignore[arg-type]
        tiny = min(BURST_GAP_S, BURST_SHARE * wall_s / max(len(ordered), 1))
        if statistics.median(gaps) < tiny and med < tiny:
            burst = sum(1 for g in gaps if g < tiny)
            return (f"{burst} of its {len(gaps)} measured step lines arrived within {tiny * 1e3:.2g} ms of the one "
                    f"before (median step {med * 1e6:,.0f} µs, in a trial of {wall_s:.1f} s for {len(ordered)} "
                    "steps): the job's output reached attune in a burst, so its steps were not timed; make the job "
                    "flush each step's line (PYTHONUNBUFFERED=1, print(..., flush=True)) or print its own step time")
    return None
