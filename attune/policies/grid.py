"""A NeMo AutoConfigurator-style grid: parallel layouts and micro-batch sizes, pruned by a memory estimate.

NeMo's AutoConfigurator (``nemo.collections.llm.tools.auto_configurator``) generates every combination of tensor,
pipeline, context and expert parallel sizes and micro-batch sizes in user-given ranges, drops the ones that
violate divisibility rules or that its memory estimate says will not fit, runs each remaining configuration for a
few steps, and keeps the fastest. Everything else in the recipe stays as the user wrote it.

This policy does the same inside attune's engine, so it runs at equal budget behind the same gate as every other
tuner: the grid is the product of the admissible values of ``tensor_model_parallel_size``,
``pipeline_model_parallel_size``, ``context_parallel_size``, ``expert_model_parallel_size`` and
``micro_batch_size`` that are in the recipe's search space (a virtual pipeline size in the search space is set to
``None`` where the pipeline size no longer allows it); every other knob keeps the baseline's value. A point is pruned
when a catalogue constraint fails or the catalogue's memory model predicts more than ``memory_margin`` of the
device (the framework's own estimate, as AutoConfigurator uses its own). The remaining points run in
AutoConfigurator's order of preference, smallest model-parallel size first (less communication), then the largest
micro-batch, until the budget is spent. A point the gate refuses (a repeat, or a point that moves nothing) is
skipped; the policy stops when the grid is exhausted.
"""

from __future__ import annotations

import itertools
from typing import Any

from attune.engine.policy import Policy, PolicyContext, Stop
from attune.recipe.catalogue import KnobValue
from attune.recipe.change import Change


def layout_grid(ctx: PolicyContext) -> Any:
    """The framework's grid declaration (``Framework.layout_grid``: axes, the interleaving knob, the model-parallel
    knobs and the micro-batch knob), or ``None`` when the framework has none."""
    return ctx.baseline.framework_impl.layout_grid


class GridPolicy(Policy):
    """AutoConfigurator-style grid over the parallel layout and micro-batch, with memory-estimate pruning."""

    name = "grid"

    def __init__(self, memory_margin: float = 0.95) -> None:
        self.memory_margin = memory_margin
        self._grid: list[dict[str, KnobValue]] | None = None
        self.stats = {"grid_points": 0, "pruned_memory": 0, "pruned_constraints": 0}

    def grid(self, ctx: PolicyContext) -> list[dict[str, KnobValue]]:
        """The ordered, pruned grid of the run's recipe (computed once)."""
        if self._grid is not None:
            return self._grid
        from attune.policies.optuna import admissible_domains

        base = ctx.baseline
        cat = ctx.catalogue
        spec = layout_grid(ctx)
        if spec is None:
            self._grid = []
            return self._grid
        vpp, micro = spec["interleave"], spec["micro_batch"]
        axes = [k for k in spec["axes"] if k in ctx.search_space]
        domains = admissible_domains(base, axes)
        points: list[tuple[tuple[int, int], dict[str, KnobValue]]] = []
        for combo in itertools.product(*(domains[k] for k in axes)):
            point: dict[str, KnobValue] = dict(zip(axes, combo, strict=True))
            self.stats["grid_points"] += 1
            if vpp in ctx.search_space:
                point[vpp] = base.knob(vpp)
            cand = _with(base, point)
            if cand is None and vpp in ctx.search_space and point[vpp] is not None:
                point[vpp] = None
                cand = _with(base, point)
            if cand is None or cat.constraint_problems(cand):
                self.stats["pruned_constraints"] += 1
                continue
            mem = cat.memory_model(cand) if cat.memory_model is not None else None
            if mem is not None and mem[0] > self.memory_margin * mem[1]:
                self.stats["pruned_memory"] += 1
                continue
            mp = 1
            for k in spec["model_parallel"]:
                mp *= int(cand.knob(k))
            points.append(((mp, -int(cand.knob(micro))), point))
        points.sort(key=lambda p: p[0])
        self._grid = [p for _, p in points]
        return self._grid

    def propose(self, ctx: PolicyContext) -> Change | Stop:
        grid = self.grid(ctx)
        for i, point in enumerate(grid):
            if ctx.admissible(point):
                return Change(set=point, source=self.name,
                              rationale=f"grid point {i + 1} of {len(grid)} (memory-estimate pruned "
                                        f"{self.stats['pruned_memory']} of {self.stats['grid_points']})")
        return Stop(f"every one of the {len(grid)} grid points that fit the memory estimate was run or is refused")


def _with(base: Any, point: dict[str, KnobValue]) -> Any:
    try:
        return base.with_knobs(**point)
    except Exception:  # noqa: BLE001 - a point that is not a valid recipe is pruned
        return None


__all__ = ["GridPolicy"]
