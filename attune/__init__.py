"""attune: unattended throughput tuning for LLM training recipes.

The tuner changes one execution setting at a time and keeps what makes training faster;
a correctness gate outside the tuner refuses every change that would alter what the model learns.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
