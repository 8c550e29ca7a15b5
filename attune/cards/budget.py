"""``python -m attune.cards.budget RECIPE Nt``: accelerator-hours of N simulated trials of a recipe, for scripts.

``make openrecipes`` sizes each suite recipe's budget with it (the same rule as ``attune bench --budget Nt``), so
the budget written into every card's reproduce command is a plain number of accelerator-hours.
"""

from __future__ import annotations

import math
import sys


def hours(recipe_path: str, budget: str) -> float:
    from attune.bench.run import parse_budget
    from attune.recipe.io import load_recipe

    h = parse_budget(budget, load_recipe(recipe_path))
    return math.ceil(h * 100) / 100  # two decimals, rounded up: the command stays short and the budget whole


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        sys.stderr.write("usage: python -m attune.cards.budget RECIPE.yaml BUDGET   (BUDGET: hours, or Nt trials)\n")
        return 2
    print(f"{hours(args[0], args[1]):g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
