"""Random search over single-knob changes: the reference policy every other one must beat."""

from __future__ import annotations

import random

from attune.engine.policy import Policy, PolicyContext, Stop
from attune.recipe.change import Change


class RandomSearch(Policy):
    """Picks a random knob of the search space and a random legal value for it.

    The generator is reseeded from ``seed`` and the number of records, so a resumed run proposes
    exactly what the uninterrupted one would have.
    """

    name = "random"

    def __init__(self, seed: int = 0, max_draws: int = 200) -> None:
        self.seed = seed
        self.max_draws = max_draws

    def propose(self, ctx: PolicyContext) -> Change | Stop:
        rng = random.Random(self.seed * 1_000_003 + len(ctx.records))
        names = list(ctx.search_space)
        for _ in range(self.max_draws):
            name = rng.choice(names)
            knob = ctx.catalogue[name]
            value = rng.choice([v for v in knob.values if v != ctx.best.knob(name)] or list(knob.values))
            if ctx.admissible({name: value}):
                return Change(set={name: value}, source=self.name, rationale="random draw")
        return Stop(f"no admissible untried change in {self.max_draws} random draws")
