"""A change: one knob moved from one value to another. ``apply_change`` is pure."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from attune.errors import RecipeError
from attune.recipe.catalogue import KnobValue
from attune.recipe.model import Recipe
from attune.trial import LLMUsage


class Change(BaseModel):
    """Knob assignments proposed together (normally one knob; coupled knobs may move together)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    set: dict[str, KnobValue] = Field(description="knob name → new value")
    rationale: str = Field(default="", description="why the proposer expects this to help")
    source: str = Field(default="", description="which policy proposed it")
    lessons: tuple[str, ...] = Field(default=(), description="ids of the lessons that moved this proposal's rank")
    usage: LLMUsage | None = Field(default=None, description="what the proposal cost an LLM endpoint, if one made it")

    def label(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.set.items()) or "(baseline)"


def apply_change(recipe: Recipe, change: Change | dict[str, Any]) -> Recipe:
    """The recipe with the change's knobs set; raises :class:`RecipeError` if the result is invalid."""
    assignments = change.set if isinstance(change, Change) else dict(change)
    data = recipe.model_dump(mode="python")
    data["knobs"] = {**recipe.knobs, **assignments}
    try:
        return Recipe.model_validate(data)
    except ValidationError as err:
        from attune.recipe.io import format_validation_error

        raise RecipeError("the change makes an invalid recipe:", format_validation_error(err)) from None


def signature(recipe: Recipe) -> str:
    """A stable identity of a recipe's full effective knob assignment (for never-repeat checks)."""
    eff = recipe.effective_knobs
    return ";".join(f"{k}={eff[k]}" for k in sorted(eff))
