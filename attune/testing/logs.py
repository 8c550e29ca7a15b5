"""Feeding a framework's log parser the way a trial's output reaches it, for tests of log parsing."""

from __future__ import annotations

from typing import Any, TypeVar

P = TypeVar("P")


def feed(parser: P, text: str, dt: float = 0.5, t0: float = 100.0) -> P:
    """Feed every line of ``text`` to ``parser`` (a :class:`~attune.frameworks.base.LogParser`), line ``i`` arriving
    at ``t0 + i * dt``; returns the parser."""
    sink: Any = parser
    for i, line in enumerate(text.splitlines(keepends=True)):
        sink.feed(line, t0 + i * dt)
    return parser


__all__ = ["feed"]
