"""Trial backends by name: local (torchrun here), sim (the cluster simulator)."""

from __future__ import annotations

from typing import Any

from attune.backends.base import TrialBackend, TrialRequest, TrialResult
from attune.errors import BackendError

BACKENDS = ("local", "sim")


def make_backend(name: str, **options: Any) -> TrialBackend:
    if name == "local":
        from attune.backends.local import LocalBackend

        return LocalBackend(**options)
    if name == "sim":
        try:
            from attune.backends.simulated import SimBackend
        except ImportError:
            raise BackendError("the simulator backend is not available in this build") from None
        return SimBackend(**options)
    raise BackendError(f"unknown backend '{name}'; choose one of: {', '.join(BACKENDS)}")


__all__ = ["BACKENDS", "TrialBackend", "TrialRequest", "TrialResult", "make_backend"]
