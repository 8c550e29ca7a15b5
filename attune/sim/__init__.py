"""The cluster simulator (pure Python, no torch): hardware, noise, and each framework's own performance model."""

from __future__ import annotations

from attune.sim.hardware import HARDWARE, Hardware, get_hardware
from attune.sim.model import NOISE_SIGMA, SimResult, simulate

__all__ = ["HARDWARE", "NOISE_SIGMA", "Hardware", "SimResult", "get_hardware", "simulate"]
