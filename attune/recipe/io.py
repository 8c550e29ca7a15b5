"""Recipe YAML on disk: load with every problem reported by field path, dump round-trippable YAML."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from attune.errors import RecipeError
from attune.recipe.model import Recipe


_OWN_PATHS = ("knobs.", "tuning.", "training", "model", "launch", "resources.")


def format_validation_error(err: ValidationError) -> list[str]:
    """One ``field.path: message`` line per problem, messages that span lines kept together."""
    lines = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"])
        msg = str(e["msg"]).removeprefix("Value error, ")
        for i, part in enumerate(msg.split("\n")):
            # multi-problem messages from model validators already carry their own field paths
            if i == 0 and (not loc or part.split(":", 1)[0].startswith(_OWN_PATHS)):
                lines.append(part)
            elif i == 0:
                lines.append(f"{loc}: {part}")
            else:
                lines.append(part)
        if e["type"] == "extra_forbidden":
            lines[-1] = f"{loc}: unknown field; remove it or check its spelling"
    return lines


def parse_recipe(data: Any, source: str = "recipe") -> Recipe:
    """Validate a mapping into a :class:`Recipe`, raising :class:`RecipeError` listing every problem."""
    if not isinstance(data, dict):
        raise RecipeError(f"{source}: expected a mapping with model, training, resources and knobs, "
                          f"got {type(data).__name__}")
    try:
        return Recipe.model_validate(data)
    except ValidationError as err:
        problems = format_validation_error(err)
        problems += [p for p in _section_problems(data) + _knob_problems(data) if p not in problems]
        raise RecipeError(f"{source} is not a valid recipe:", problems) from None


def _section_problems(data: dict[str, Any]) -> list[str]:
    """Sections the framework needs that are missing (pydantic skips the whole-recipe check when a part failed)."""
    from attune import frameworks

    name = data.get("framework", "torch")
    if not isinstance(name, str) or name not in frameworks.names():
        return []
    needed = ("launch",) if frameworks.get(name).launch_based else ("model", "training")
    return [f"{s}: required for framework {name}" for s in needed if data.get(s) is None]


def _knob_problems(data: dict[str, Any]) -> list[str]:
    """Knob value problems, which pydantic skips when another section already failed."""
    from attune.recipe.catalogue import frameworks, get_catalogue

    knobs, framework = data.get("knobs"), data.get("framework", "torch")
    if not isinstance(knobs, dict) or framework not in frameworks():
        return []
    return get_catalogue(framework).value_problems(knobs)


def parse_recipe_text(text: str, source: str) -> Recipe:
    """A recipe from YAML text (a file's, a ConfigMap key's), errors naming ``source``."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise RecipeError(f"{source} is not valid YAML: {err}") from None
    return parse_recipe(data, source)


def load_recipe(path: str | Path) -> Recipe:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as err:
        raise RecipeError(f"cannot read recipe {p}: {err.strerror}") from None
    return parse_recipe_text(text, str(p))


def recipe_to_dict(recipe: Recipe) -> dict[str, Any]:
    return recipe.model_dump(mode="json", exclude_defaults=False)


def dump_recipe(recipe: Recipe, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(recipe_to_dict(recipe), sort_keys=False))
