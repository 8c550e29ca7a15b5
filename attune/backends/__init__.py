"""Trial backends by name: local (torchrun here), sim (the cluster simulator)."""

from __future__ import annotations

import inspect
from typing import Any

from attune.backends.base import TrialBackend, TrialRequest, TrialResult
from attune.errors import BackendError

BACKENDS = ("local", "sim")


def _options(name: str, cls: type, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` where ``cls`` takes every one of them; else a :class:`BackendError` naming those it does not."""
    known = [p for p in inspect.signature(cls).parameters if p != "self"]
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise BackendError(f"the {name} backend has no option{'s' if len(unknown) > 1 else ''} "
                           f"{', '.join(map(repr, unknown))}; its options: {', '.join(known)}")
    return options


def make_backend(name: str, **options: Any) -> TrialBackend:
    if name == "local":
        from attune.backends.local import LocalBackend

        return LocalBackend(**_options(name, LocalBackend, options))
    if name == "sim":
        try:
            from attune.backends.simulated import SimBackend
        except ImportError:
            raise BackendError("the simulator backend is not available in this build") from None
        return SimBackend(**_options(name, SimBackend, options))
    raise BackendError(f"unknown backend '{name}'; choose one of: {', '.join(BACKENDS)}")


__all__ = ["BACKENDS", "TrialBackend", "TrialRequest", "TrialResult", "make_backend"]
