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
    from attune import registry

    name = data.get("framework", "torch")
    if not isinstance(name, str) or name not in registry.names():
        return []
    needed = ("launch",) if registry.get(name).launch_based else ("model", "training")
    return [f"{s}: required for framework {name}" for s in needed if data.get(s) is None]


def _knob_problems(data: dict[str, Any]) -> list[str]:
    """Knob value problems, which pydantic skips when another section already failed."""
    from attune.recipe.catalogue import frameworks, get_catalogue

    knobs, framework = data.get("knobs"), data.get("framework", "torch")
    if not isinstance(knobs, dict) or framework not in frameworks():
        return []
    launch = data.get("launch")
    if isinstance(launch, dict) and _launch_unreadable(framework, launch):
        return []  # the launch's own problem (a command recipe without its declaration) says why
    return get_catalogue(framework, launch).value_problems(knobs)


def _launch_unreadable(framework: str, launch: dict[str, Any]) -> bool:
    from attune import registry

    return bool(registry.get(framework).launch_problems(launch))


class StrictLoader(yaml.SafeLoader):  # type: ignore[misc]  # PyYAML has no stubs here: SafeLoader is Any
    """YAML without the surprises: a duplicate key is an error, and so are YAML 1.1's octal (``010`` is 8) and
    sexagesimal (``1:30`` is 90) integers, which people never mean in a recipe."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, Any] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first at line {seen[key].start_mark.line + 1}); a recipe "
                    "names each field once", key_node.start_mark)
            seen[key] = key_node
        mapping: dict[Any, Any] = super().construct_mapping(node, deep=deep)
        return mapping

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        text = str(node.value).replace("_", "")
        digits = text.lstrip("+-")
        if (len(digits) > 1 and digits.startswith("0") and digits[1:2].isdigit()) or ":" in digits:
            raise yaml.constructor.ConstructorError(
                None, None, f"{node.value!r} is ambiguous (YAML reads it as octal or base 60); write it without "
                "leading zeros, or quote it if you mean text", node.start_mark)
        value: int = super().construct_yaml_int(node)
        return value


StrictLoader.add_constructor("tag:yaml.org,2002:int", StrictLoader.construct_yaml_int)
StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, StrictLoader.construct_mapping)


def load_yaml(text: str, source: str) -> Any:
    """Parse YAML text strictly (:class:`StrictLoader`); problems become a :class:`RecipeError` naming ``source``."""
    try:
        return yaml.load(text, Loader=StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as err:
        raise RecipeError(f"{source} is not valid YAML: {err}") from None
    except RecursionError:
        raise RecipeError(f"{source} is nested too deeply to be a recipe (thousands of levels)") from None


def parse_recipe_text(text: str, source: str) -> Recipe:
    """A recipe from YAML text (a file's, a ConfigMap key's), errors naming ``source``."""
    return parse_recipe(load_yaml(text, source), source)


#: the largest file attune reads as a recipe, card or args file (a recipe is kilobytes; this is a guard, not a limit)
MAX_TEXT_BYTES = 64 * 2**20


def read_text(path: str | Path, what: str = "recipe") -> str:
    """A regular file's text as UTF-8, at most :data:`MAX_TEXT_BYTES`; a device, pipe, huge, unreadable or
    non-UTF-8 file becomes a :class:`RecipeError` (``attune validate /dev/zero`` is a message, not a hang)."""
    p = Path(path)
    try:
        if p.exists() and not p.is_file() and not p.is_dir():
            raise RecipeError(f"cannot read {what} {p}: not a regular file (a device, pipe or socket)")
        with p.open("rb") as f:
            data = f.read(MAX_TEXT_BYTES + 1)
        if len(data) > MAX_TEXT_BYTES:
            raise RecipeError(f"cannot read {what} {p}: larger than {MAX_TEXT_BYTES // 2**20} MiB")
        return data.decode("utf-8")
    except IsADirectoryError:
        raise RecipeError(f"cannot read {what} {p}: it is a directory") from None
    except OSError as err:
        raise RecipeError(f"cannot read {what} {p}: {err.strerror}") from None
    except UnicodeDecodeError as err:
        raise RecipeError(f"cannot read {what} {p}: not UTF-8 text (byte {err.start}); save it as UTF-8") from None


def load_recipe(path: str | Path) -> Recipe:
    """A recipe file; a native launch's relative working directory is read from the file's own directory."""
    recipe = parse_recipe_text(read_text(path), str(path))
    launch = recipe.launch
    if launch is not None and not (launch.cwd and Path(launch.cwd).is_absolute()):
        cwd = (Path(path).resolve().parent / (launch.cwd or ".")).resolve()
        recipe = recipe.model_copy(update={"launch": launch.model_copy(update={"cwd": str(cwd)})})
    return recipe


def recipe_to_dict(recipe: Recipe) -> dict[str, Any]:
    return recipe.model_dump(mode="json", exclude_defaults=False)


def dump_recipe(recipe: Recipe, path: str | Path) -> None:
    """Write the recipe's YAML atomically (a reader never sees half a file)."""
    p = Path(path)
    tmp = p.with_name(f".{p.name}.tmp")
    tmp.write_text(yaml.safe_dump(recipe_to_dict(recipe), sort_keys=False))
    tmp.replace(p)
