"""The equal-budget tuner benchmark: suite loading, the exhaustive oracle, runs and reports."""

from __future__ import annotations
