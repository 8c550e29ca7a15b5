"""Analytical cluster performance simulator for Megatron-style LLM training (pure Python, no torch)."""

from __future__ import annotations

from attune.sim.hardware import HARDWARE, Hardware, get_hardware
from attune.sim.perf import SimResult, simulate

__all__ = ["HARDWARE", "Hardware", "SimResult", "get_hardware", "simulate"]
