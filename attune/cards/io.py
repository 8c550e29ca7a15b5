"""Reading cards back, and checking that a card still says what its run's ``result.json`` says."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from attune.cards.model import Card
from attune.errors import AttuneError


def load_card(path: str | Path) -> Card:
    """A card from its YAML file; :class:`AttuneError` listing every problem by field path otherwise."""
    from attune.recipe.io import read_text

    p = Path(path)
    text = read_text(p, "card")  # a RecipeError (an AttuneError) for unreadable, non-UTF-8 or device files
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise AttuneError(f"{p} is not valid YAML: {err}") from None
    except RecursionError:
        raise AttuneError(f"{p} is nested too deeply to be a recipe card") from None
    if not isinstance(data, dict):
        raise AttuneError(f"{p} is not a recipe card (expected a mapping)")
    try:
        return Card.model_validate(data)
    except ValidationError as err:
        problems = [f"{'.'.join(str(x) for x in e['loc'])}: {e['msg']}" for e in err.errors()]
        raise AttuneError(f"{p} is not a valid recipe card:", problems) from None


def find_cards(directory: str | Path) -> list[Path]:
    """Card files (``*.yaml``) under ``directory``, sorted."""
    d = Path(directory)
    if d.is_file():
        return [d]
    if not d.is_dir():
        raise AttuneError(f"no card directory {d}")
    return sorted(p for p in d.rglob("*.yaml") if p.is_file() and not p.name.startswith("."))


def result_of(card: Card, card_path: Path) -> tuple[Path, dict[str, Any]]:
    path = card_path.parent / card.source.result
    try:
        return path, json.loads(path.read_text())
    except OSError as err:
        raise AttuneError(f"{card_path}: its run's result {path} cannot be read ({err.strerror})") from None
    except ValueError:
        raise AttuneError(f"{card_path}: its run's result {path} is not JSON") from None


def _close(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is b
    return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-12)


def check_card(path: str | Path) -> list[str]:
    """Problems of one card file: schema, digest of its result.json, and every headline number against it."""
    from attune.cards.build import sha256_file

    p = Path(path)
    try:
        card = load_card(p)
    except AttuneError as err:
        return [str(err)]
    problems = []
    if card.id != p.stem:
        problems.append(f"id {card.id!r} differs from the file name {p.stem!r}")
    try:
        rpath, result = result_of(card, p)
    except AttuneError as err:
        return [str(err)]
    digest = sha256_file(rpath)
    if digest != card.source.result_sha256:
        problems.append(f"source.result_sha256 {card.source.result_sha256[:12]}… does not match {rpath.name} "
                        f"({digest[:12]}…): the card and its run disagree")
    pairs = [("throughput.baseline", card.throughput.baseline, result.get("baseline_throughput")),
             ("throughput.tuned", card.throughput.tuned, result.get("best_throughput")),
             ("throughput.speedup", card.throughput.speedup, result.get("speedup")),
             ("throughput.speedup_low", card.throughput.speedup_low, result.get("speedup_low")),
             ("throughput.speedup_high", card.throughput.speedup_high, result.get("speedup_high")),
             ("throughput.noise_floor", card.throughput.noise_floor, result.get("noise_floor")),
             ("cost.accelerator_hours", card.cost.accelerator_hours, result.get("budget_used_hours")),
             ("cost.budget_hours", card.cost.budget_hours, result.get("budget_hours"))]
    for name, mine, theirs in pairs:
        if not _close(mine, theirs):
            problems.append(f"{name} is {mine} but the run's result says {theirs}")
    for name, mine, theirs in (("cost.trials_launched", card.cost.trials_launched, result.get("trials_launched")),
                               ("cost.trials_failed", card.cost.trials_failed, result.get("trials_failed")),
                               ("cost.trials_refused", card.cost.trials_refused, result.get("trials_refused")),
                               ("evidence.gate (one verdict per trial)", len(card.evidence.gate),
                                len(result.get("trials") or []))):
        if mine != theirs:
            problems.append(f"{name} is {mine} but the run's result says {theirs}")
    changes = {k: c.to for k, c in card.recipe.changes.items()}
    if changes != (result.get("best_changes") or {}):
        problems.append(f"recipe.changes {changes} differ from the run's kept changes {result.get('best_changes')}")
    if result.get("recipe") != card.model.name:
        problems.append(f"model.name {card.model.name!r} is not the run's recipe {result.get('recipe')!r}")
    from attune.recipe.io import parse_recipe

    try:
        tuned = parse_recipe(card.recipe.tuned, f"{p}: recipe.tuned")
        baseline = baseline_recipe(card)
    except AttuneError as err:
        problems.append(str(err))
    else:
        if baseline.knob_changes(tuned.effective_knobs) != changes or tuned.name != card.model.name:
            problems.append("recipe.tuned is not the baseline with recipe.changes applied")
    return problems


def baseline_recipe(card: Card) -> Any:
    """The baseline recipe of a card: its tuned recipe with the baseline's knobs."""
    from attune.recipe.io import parse_recipe

    data = dict(card.recipe.tuned)
    data["knobs"] = dict(card.recipe.baseline_knobs)
    return parse_recipe(data, f"card {card.id}: the baseline (recipe.tuned with recipe.baseline_knobs)")
