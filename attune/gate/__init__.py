"""The correctness gate (placeholder until the full rule set lands): contract and validity only."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from attune.recipe.change import signature
from attune.recipe.model import Recipe


@dataclass(frozen=True)
class _Reason:
    code: str
    message: str


@dataclass(frozen=True)
class Verdict:
    admitted: bool
    reasons: list[_Reason] = field(default_factory=list)
    owed: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"admitted": self.admitted, "reasons": [r.__dict__ for r in self.reasons], "owed": self.owed}


def evaluate(baseline: Recipe, candidate: Recipe | dict[str, Any], history: Iterable[Recipe] = (),
             *, parent: Recipe | None = None) -> Verdict:
    if isinstance(candidate, dict):
        try:
            candidate = Recipe.model_validate(candidate)
        except ValidationError as err:
            return Verdict(False, [_Reason("invalid", str(err))])
    if candidate.training != baseline.training or candidate.model != baseline.model:
        return Verdict(False, [_Reason("contract", "training contract changed")])
    if signature(candidate) in {signature(h) for h in history}:
        return Verdict(False, [_Reason("repeat", "already tried")])
    return Verdict(True)
