"""What several framework packages share: their catalogues' rules, and the small helpers their imports and renders
use (each framework package imports what applies to it)."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from attune.frameworks.base import Rule, Tier

if TYPE_CHECKING:
    from attune.recipe.model import Recipe

MICRO_BATCH = "micro_batch_size"
_MEM = "memory_capacity"
#: parts of an environment variable's name that mark a secret (a launch never records such a variable)
SECRET_PARTS = ("TOKEN", "SECRET", "KEY", "PASSWORD", "CREDENTIAL")

_V = TypeVar("_V")


def same_value(a: Any, b: Any) -> bool:
    """Equality that does not confuse a bool with a number (``True`` is not ``1``)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return bool(a == b)


def recordable_env(env: Mapping[str, _V], prefixes: tuple[str, ...], names: Collection[str] = ()) -> dict[str, _V]:
    """The variables of a launch's ``env`` that shape a run and are safe to record: a name that starts with one of
    ``prefixes`` or is one of ``names``, never one with a part of :data:`SECRET_PARTS` in it (tokens, keys)."""
    return {k: v for k, v in env.items()
            if (k.startswith(prefixes) or k in names) and not any(s in k for s in SECRET_PARTS)}


def repoint(token: str, copies: Mapping[str, str]) -> str:
    """A launch token with a file path it names (alone, or as ``--flag=PATH``) replaced by that file's copy."""
    if token in copies:
        return copies[token]
    head, eq, value = token.partition("=")
    if eq and head.startswith("--") and value in copies:
        return f"{head}={copies[value]}"
    return token


def processes_fit_problem(recipe: Recipe, knob: str) -> str | None:
    """A process count (``knob``) above the recipe's device slots per node: one process per device slot."""
    n = int(recipe.knob(knob))
    if n > recipe.resources.devices_per_node:
        return (f"{knob} ({n}) exceeds resources.devices_per_node ({recipe.resources.devices_per_node}); lower it or "
                "request more devices (import with --devices-per-node N)")
    return None


def batch_split_problem(recipe: Recipe, dp: int, knob: str = MICRO_BATCH) -> str | None:
    """The global batch must split into micro-batches (``knob``) across ``dp`` data-parallel ranks."""
    assert recipe.training is not None
    gbs, mbs = recipe.training.global_batch_size, int(recipe.knob(knob))
    if gbs % (mbs * dp) == 0:
        return None
    ok = [m for m in recipe.catalogue[knob].values if isinstance(m, int) and gbs % (m * dp) == 0]
    return (f"training.global_batch_size ({gbs}) must be divisible by {knob} ({mbs}) × "
            f"data-parallel degree ({dp}); legal {knob} here: {ok}")


def micro_batch_layouts(recipe: Recipe, knob: str = MICRO_BATCH, avoid: Sequence[str] = ()) -> list[dict[str, Any]]:
    """Other micro-batch splits of ``recipe``, nearest first: the neighbouring values; with ``avoid`` (recipe
    signatures, e.g. the candidate a loss check judges), any other value of the knob's domain whose recipe is none of
    those; never one that does not divide the global batch or that the catalogue predicts cannot run (a constraint it
    breaks, or out of memory). The gate picks the first it admits as pure reordering of sums."""
    from attune.recipe.change import signature

    cat = recipe.catalogue
    if knob not in cat:
        return []
    values = cat[knob].neighbours(recipe.knob(knob))
    if avoid:
        values += [v for v in cat[knob].values if v not in values and v != recipe.knob(knob)]
    out: list[dict[str, Any]] = []
    for value in values:
        try:
            cand = recipe.with_knobs(**{knob: value})
        except ValueError:  # the split does not divide the global batch
            continue
        if avoid and signature(cand) in avoid:
            continue
        if cat.predicts_infeasible(cand):
            continue  # a drift reference that cannot run measures nothing (the baseline once more serves instead)
        out.append({knob: value})
    return out


def micro_batch_rules(knob: str = MICRO_BATCH) -> dict[tuple[str, str], Rule]:
    """Playbook priors of a micro-batch knob (bigger GEMMs and fewer launches; more activation memory)."""
    return {
        (knob, "up"): Rule(Tier.SCALE, 0.08, {"host_overhead": 0.15, "compute_bound": 0.1},
                           (_MEM, "pipeline_bubble"), memory=+1),
        (knob, "down"): Rule(Tier.FIT, 0.0, {_MEM: 0.3, "pipeline_bubble": 0.08}, memory=-1),
    }


def process_rules(knob: str) -> dict[tuple[str, str], Rule]:
    """Playbook priors of a data-parallel process count (more processes share the work; fewer talk less)."""
    return {(knob, "up"): Rule(Tier.SCALE, 0.3, {"compute_bound": 0.35, "host_overhead": 0.3}),
            (knob, "down"): Rule(Tier.SCALE, 0.0, {"communication": 0.05})}


def recompute_rules(knob: str, *, off: str = "disable") -> dict[tuple[str, str], Rule]:
    """Playbook priors of activation recomputation; ``off`` is the direction that turns recomputation off (``enable``
    for a knob that disables it, as LLaMA-Factory's ``disable_gradient_checkpointing``)."""
    on = "enable" if off == "disable" else "disable"
    return {(knob, off): Rule(Tier.FIT, 0.12, {"compute_bound": 0.2}, (_MEM,), memory=+1),
            (knob, on): Rule(Tier.FIT, 0.0, {_MEM: 0.3}, memory=-1)}


def loader_worker_rules(knob: str) -> dict[tuple[str, str], Rule]:
    """Playbook priors of data-loader worker processes (they hide data loading)."""
    return {(knob, "up"): Rule(Tier.OVERLAP, 0.005, {"data_loading": 0.2}),
            (knob, "down"): Rule(Tier.OVERLAP, 0.0, {"host_overhead": 0.02})}


def compile_rules(knob: str) -> dict[tuple[str, str], Rule]:
    """Playbook priors of a graph compiler switch (fused kernels; a compile trial costs about three)."""
    return {(knob, "enable"): Rule(Tier.MICRO, 0.05, {"compute_bound": 0.08, "host_overhead": 0.1}, cost=3.0,
                                   memory=+1),
            (knob, "disable"): Rule(Tier.MICRO, 0.0)}


def thread_rules(knob: str) -> dict[tuple[str, str], Rule]:
    """Playbook priors of CPU threads per process (OMP_NUM_THREADS)."""
    return {(knob, "up"): Rule(Tier.MICRO, 0.04, {"compute_bound": 0.08}),
            (knob, "down"): Rule(Tier.MICRO, 0.01, {"host_overhead": 0.02})}


GLOBAL_BATCH_HINT = ("To change the work per forward/backward, change knobs.{knob} instead: gradient "
                     "accumulation keeps the global batch fixed")
