"""Bottleneck diagnosis: which resource limits a trial, from phase timers, DCGM-like signals and simulator breakdowns.

:func:`diagnose` is pure and total: it accepts a :class:`~attune.trial.TrialRecord`, a
:class:`~attune.trial.Measurement` or nothing, never raises on missing or odd inputs, and lowers its
confidence instead. Three kinds of evidence are understood, all optional:

- trainer phase timers (``phases``: forward, backward, optimizer, data, comm, seconds per step);
- simulator breakdowns (``phases`` or ``signals`` keys such as compute, tp_comm, dp_exposed, pp_bubble,
  ep_comm, cp_comm, pp_comm, host, data, seconds per step);
- DCGM-like utilisation signals in ``signals`` (sm_active, tensor_active, dram_active in 0..1,
  nvlink_bytes / pcie_bytes per second, fb_used / fb_total in MB).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any, Literal

from attune.trial import Measurement, TrialOutcome, TrialRecord

log = logging.getLogger(__name__)

Bottleneck = Literal["memory_capacity", "communication", "pipeline_bubble", "host_overhead", "data_loading",
                     "compute_bound"]
BOTTLENECKS: tuple[str, ...] = ("memory_capacity", "communication", "pipeline_bubble", "host_overhead",
                                "data_loading", "compute_bound")

#: simulator / trainer phase keys → (bottleneck, communication sub-kind)
_COMM_KEYS = {"tp_comm": "tp", "dp_exposed": "dp", "dp_comm": "dp", "pp_comm": "pp", "ep_comm": "ep",
              "a2a": "ep", "cp_comm": "cp", "comm": None}
_COMPUTE_KEYS = ("compute", "forward", "backward", "recompute")
_HOST_KEYS = ("host", "launch", "optimizer")
_BUBBLE_KEYS = ("pp_bubble", "bubble")
_DATA_KEYS = ("data", "data_loading")


@dataclass(frozen=True)
class Diagnosis:
    """What limits a trial: a bottleneck class, an optional sub-kind, the evidence and a confidence in 0..1."""

    bottleneck: str
    confidence: float
    evidence: tuple[str, ...] = ()
    sub_kind: str | None = None
    shares: dict[str, float] = field(default_factory=dict)

    def label(self) -> str:
        """``communication/dp`` style label."""
        return f"{self.bottleneck}/{self.sub_kind}" if self.sub_kind else self.bottleneck

    def to_dict(self) -> dict[str, Any]:
        return {"bottleneck": self.bottleneck, "sub_kind": self.sub_kind, "confidence": round(self.confidence, 3),
                "evidence": list(self.evidence), "shares": {k: round(v, 3) for k, v in self.shares.items()}}


def _num(x: Any) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) and v >= 0 else None


def _clean(d: Any) -> dict[str, float]:
    if not isinstance(d, dict):
        return {}
    out = {}
    for k, v in d.items():
        n = _num(v)
        if n is not None:
            out[str(k)] = n
    return out


def _memory_cap_mb(recipe: Any, signals: dict[str, float]) -> float | None:
    if "fb_total" in signals and signals["fb_total"] > 0:
        return signals["fb_total"]
    try:
        gb = recipe.resources.device_memory_gb if recipe is not None else None
    except AttributeError:
        gb = None
    if gb:
        return float(gb) * 1024.0
    try:
        from attune.sim.hardware import get_hardware

        hw = get_hardware(recipe.resources.accelerator)
        mem = getattr(hw, "memory_gb", None) or getattr(hw, "hbm_gb", None)
        return float(mem) * 1024.0 if mem else None
    except Exception:  # noqa: BLE001 - unknown accelerator, no simulator: no cap known
        return None


def diagnose(source: TrialRecord | Measurement | None, recipe: Any = None,
             outcome: TrialOutcome | str | None = None) -> Diagnosis:
    """The bottleneck of one trial. Missing signals lower the confidence; nothing here raises."""
    measurement: Measurement | None
    if isinstance(source, TrialRecord):
        measurement = source.measurement
        outcome = outcome if outcome is not None else source.outcome
    else:
        measurement = source if isinstance(source, Measurement) else None
    try:
        outcome = TrialOutcome(outcome) if outcome is not None else None
    except ValueError:
        outcome = None

    if outcome is TrialOutcome.OOM:
        return Diagnosis("memory_capacity", 0.95, ("the trial ran out of memory",))

    if measurement is None:
        return Diagnosis("compute_bound", 0.05, ("no measurement: nothing to diagnose from",))

    phases = _clean(measurement.phases)
    signals = _clean(measurement.signals)
    # simulator breakdowns may arrive in signals; merge the time-like keys
    for key in list(signals):
        if key in _COMM_KEYS or key in _COMPUTE_KEYS or key in _HOST_KEYS or key in _BUBBLE_KEYS or key in _DATA_KEYS:
            phases.setdefault(key, signals[key])
    step = _num(measurement.step_time_median_s) or 0.0
    total = max(step, sum(phases.values())) if phases else step
    evidence: list[str] = []
    shares: dict[str, float] = {}

    def share(keys: tuple[str, ...] | list[str]) -> float:
        return sum(phases.get(k, 0.0) for k in keys) / total if total > 0 else 0.0

    comm_by_kind: dict[str, float] = {}
    for key, kind in _COMM_KEYS.items():
        if key in phases and total > 0:
            comm_by_kind[kind or "dp"] = comm_by_kind.get(kind or "dp", 0.0) + phases[key] / total
    if phases and total > 0:
        shares = {"compute": share(_COMPUTE_KEYS), "communication": sum(comm_by_kind.values()),
                  "host_overhead": share(_HOST_KEYS), "pipeline_bubble": share(_BUBBLE_KEYS),
                  "data_loading": share(_DATA_KEYS)}

    # -- memory pressure (near the cap) ---------------------------------------------------------------
    cap = _memory_cap_mb(recipe, signals)
    used = signals.get("fb_used") or _num(measurement.peak_memory_mb)
    mem_frac = used / cap if used and cap else None
    if mem_frac is not None:
        shares["memory"] = mem_frac
        if mem_frac >= 0.92:
            evidence.append(f"memory at {mem_frac:.0%} of the device capacity")
            return Diagnosis("memory_capacity", min(0.9, 0.5 + (mem_frac - 0.92) * 5), tuple(evidence), None, shares)

    # -- DCGM-like utilisation ------------------------------------------------------------------------
    sm, tensor, dram = signals.get("sm_active"), signals.get("tensor_active"), signals.get("dram_active")
    link = (signals.get("nvlink_bytes") or 0.0) + (signals.get("pcie_bytes") or 0.0)
    dcgm_vote: str | None = None
    if sm is not None:
        evidence.append(f"sm_active {sm:.2f}")
        if sm < 0.5 and link > 0 and (signals.get("nvlink_bytes") or signals.get("pcie_bytes")):
            dcgm_vote = "communication"
            evidence.append("SMs idle while NVLink/PCIe traffic flows")
        elif sm < 0.5:
            dcgm_vote = "host_overhead"
            evidence.append("SMs idle without link traffic: the host does not keep the device fed")
        elif tensor is not None and tensor >= 0.4:
            dcgm_vote = "compute_bound"
            evidence.append(f"tensor cores active {tensor:.2f}")
        elif dram is not None and dram >= 0.6:
            dcgm_vote = "compute_bound"
            evidence.append(f"dram_active {dram:.2f}: memory-bandwidth bound kernels")

    if not shares:
        if dcgm_vote is None:
            return Diagnosis("compute_bound", 0.1, tuple(evidence) + ("no phase timers or signals; assuming compute",),
                             None, shares)
        return Diagnosis(dcgm_vote, 0.45, tuple(evidence), None, shares)

    # -- phase shares ---------------------------------------------------------------------------------
    ranked = sorted(((v, k) for k, v in shares.items() if k in ("communication", "host_overhead",
                                                                "pipeline_bubble", "data_loading")), reverse=True)
    top_share, top = ranked[0] if ranked else (0.0, "")
    thresholds = {"communication": 0.2, "host_overhead": 0.25, "pipeline_bubble": 0.15, "data_loading": 0.1}
    for k in ("communication", "host_overhead", "pipeline_bubble", "data_loading", "compute"):
        if shares.get(k):
            evidence.append(f"{k} {shares[k]:.0%} of the step")
    if signals.get("stack_samples"):
        evidence.append(f"phase shares from {signals['stack_samples']:.0f} sampled Python stacks (py-spy)")
    coverage = min(1.0, sum(phases.values()) / step) if step > 0 else 0.7
    sub = None
    if top and top_share >= thresholds[top]:
        if top == "communication" and comm_by_kind:
            sub = max(comm_by_kind.items(), key=lambda kv: kv[1])[0]
        conf = 0.45 + min(0.45, top_share - thresholds[top] + 0.15)
        if dcgm_vote is not None:
            conf += 0.1 if dcgm_vote == top else -0.15
        return Diagnosis(top, _clamp(conf * (0.6 + 0.4 * coverage)), tuple(evidence), sub, shares)
    conf = 0.35 + 0.4 * shares.get("compute", 0.0)
    if dcgm_vote is not None:
        conf += 0.15 if dcgm_vote == "compute_bound" else -0.15
    if dcgm_vote not in (None, "compute_bound") and conf < 0.3:
        return Diagnosis(dcgm_vote, 0.4, tuple(evidence), None, shares)
    return Diagnosis("compute_bound", _clamp(conf * (0.6 + 0.4 * coverage)), tuple(evidence), sub, shares)


def _clamp(x: float) -> float:
    return max(0.0, min(1.0, x))


__all__ = ["BOTTLENECKS", "Bottleneck", "Diagnosis", "diagnose"]
