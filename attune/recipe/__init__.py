"""Recipe model, knob catalogues and changes."""

from __future__ import annotations

from attune.recipe.catalogue import Catalogue, Constraint, Knob, Semantics, get_catalogue
from attune.recipe.change import Change, apply_change, signature
from attune.recipe.io import dump_recipe, load_recipe, parse_recipe
from attune.recipe.model import ModelSpec, Recipe, Resources, TrainingContract, TuningSpec

__all__ = [
    "Catalogue", "Change", "Constraint", "Knob", "ModelSpec", "Recipe", "Resources", "Semantics",
    "TrainingContract", "TuningSpec", "apply_change", "dump_recipe", "get_catalogue", "load_recipe",
    "parse_recipe", "signature",
]
