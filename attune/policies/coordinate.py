"""One-knob coordinate descent: try each knob's adjacent values around the current best, in order."""

from __future__ import annotations

from attune.engine.policy import Policy, PolicyContext, Stop
from attune.recipe.change import Change


class CoordinateDescent(Policy):
    """Walks the search space in priority order, one neighbour at a time, never repeating a configuration.

    After an accepted move the next proposal starts again from the first knob, so a knob that moved
    keeps moving in the same direction while it pays off.
    """

    name = "coordinate"

    def propose(self, ctx: PolicyContext) -> Change | Stop:
        for knob_name in ctx.search_space:
            knob = ctx.catalogue[knob_name]
            current = ctx.best.knob(knob_name)
            for value in knob.neighbours(current):
                change = {knob_name: value}
                if ctx.admissible(change):
                    return Change(set=change, source=self.name,
                                  rationale=f"coordinate step {knob_name}: {current} → {value}")
        return Stop("every adjacent value of every knob in the search space has been tried or is refused")
