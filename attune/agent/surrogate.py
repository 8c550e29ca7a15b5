"""A surrogate of one run's measurements, for when the playbook's rule moves are spent: a ridge regression of log
throughput on one-hot knob values over every measured trial. It rates a move from the best recipe by the change in
predicted log throughput, and counts the values no trial has measured yet (the evidence still missing)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from attune.recipe.catalogue import KnobValue
from attune.recipe.model import Recipe
from attune.trial import TrialKind, TrialOutcome, TrialRecord

RIDGE = 0.3
"""The ridge penalty: one-hot columns outnumber the trials of a run, so the plain least-squares fit is not unique."""


@dataclass(frozen=True)
class KnobSurrogate:
    """Fitted weights of (knob, value) features; ``predict`` rates a change from ``best``."""

    space: tuple[str, ...]
    columns: Mapping[tuple[str, str], int]
    weights: np.ndarray

    @classmethod
    def fit(cls, records: Sequence[TrialRecord], space: Sequence[str]) -> KnobSurrogate | None:
        """The surrogate of the successful measured trials (the loss checks measure nothing); None before any."""
        rows, ys = [], []
        for r in records:
            if r.outcome is TrialOutcome.SUCCEEDED and r.throughput and r.knobs and r.kind != TrialKind.LOSS_CHECK:
                rows.append({k: repr(r.knobs.get(k)) for k in space})
                ys.append(np.log(r.throughput))
        if not rows:
            return None
        feats = sorted({(k, v) for row in rows for k, v in row.items()})
        col = {f: i for i, f in enumerate(feats)}
        X = np.zeros((len(rows), len(feats)))
        for i, row in enumerate(rows):
            for k, v in row.items():
                X[i, col[(k, v)]] = 1.0
        y = np.array(ys) - np.mean(ys)
        w = np.linalg.solve(X.T @ X + RIDGE * np.eye(len(feats)), X.T @ y)
        return cls(space=tuple(space), columns=col, weights=w)

    def predict(self, change: Mapping[str, KnobValue], best: Recipe) -> tuple[float, int]:
        """(predicted change of log throughput, values of the change no trial measured) of moving ``best``."""
        delta, unseen = 0.0, 0
        for k, v in change.items():
            if k not in self.space:
                continue
            new, old = (k, repr(v)), (k, repr(best.knob(k)))
            if new in self.columns:
                delta += float(self.weights[self.columns[new]])
            else:
                unseen += 1
            if old in self.columns:
                delta -= float(self.weights[self.columns[old]])
        return delta, unseen


__all__ = ["RIDGE", "KnobSurrogate"]
