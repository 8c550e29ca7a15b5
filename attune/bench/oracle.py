"""The exhaustive optimum of a recipe's search space, from the noiseless simulator.

The oracle enumerates the product of the catalogue domains of every knob in ``tuning.search_space`` (all other
knobs keep the recipe's values), keeps the configurations the gate would admit as a destination (catalogue
constraints hold, the training contract, including the TP-padded vocabulary, is unchanged, and numerics-changing
values are opted in by the recipe owner), simulates each without noise, and reports the best that does not run
out of memory. The gate's one-group-per-step rule is about the path, not the destination, so it does not apply.

Values the gate refuses whatever else changes (an un-opted-in FP8, a TP that changes the padded vocabulary) are
dropped per knob before the product is formed; the winner is checked once more with :func:`attune.gate.evaluate`.
Results are cached as JSON under a key of the recipe, its search space and the simulator's source, so a CI run
or a re-run of the benchmark only enumerates what changed.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from attune.gate.rules import admissible_values
from attune.recipe.catalogue import KnobValue
from attune.recipe.change import signature
from attune.recipe.model import Recipe

ORACLE_VERSION = "1"
MAX_CONFIGURATIONS = 2_000_000


@dataclass
class Oracle:
    """What exhaustive enumeration found for one recipe."""

    recipe: str
    search_space: list[str]
    space_size: int
    admissible: int
    oom: int
    optimum_tps: float
    optimum_knobs: dict[str, KnobValue]
    baseline_tps: float
    baseline_outcome: str
    seconds: float
    top: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _prune(recipe: Recipe, knob: str, values: list[KnobValue]) -> list[KnobValue]:
    """Drop values that violate a constraint whose other knobs are all outside the search space (they never move,
    so no combination can make that value valid); the optimum is unchanged, the enumeration smaller."""
    space = set(recipe.tuning.search_space)
    local = [c for c in recipe.catalogue.constraints if knob in c.knobs and not (set(c.knobs) - {knob}) & space]
    if not local:
        return values
    kept = []
    for v in values:
        cand = recipe.model_copy(update={"knobs": {**recipe.knobs, knob: v}})
        if not any(c.check(cand) for c in local):
            kept.append(v)
    return kept or values


def cache_key(recipe: Recipe) -> str:
    """A digest of the recipe, its search space and what the optimum depends on: the simulator's source and the
    catalogue's *behaviour* (its knob table, and the code of every constraint and contract function and the module
    functions they call), so an edit elsewhere in the catalogue's module does not invalidate every cached oracle."""
    import attune.sim.hardware as hw
    import attune.sim.megatron as perf
    import attune.sim.model as model

    h = hashlib.sha256()
    h.update(ORACLE_VERSION.encode())
    h.update(recipe.model_dump_json().encode())
    for mod in (perf, model, hw):
        h.update(Path(mod.__file__ or "").read_bytes())
    cat = recipe.catalogue
    h.update(json.dumps(cat.describe(), sort_keys=True, default=str).encode())
    funcs = [c.check for c in cat.constraints]
    fw = recipe.framework_impl
    funcs += [getattr(type(fw), name) for name in ("contract", "equivalent_layouts") if hasattr(type(fw), name)]
    for src in _sources(funcs):
        h.update(src.encode())
    return h.hexdigest()[:16]


def _sources(funcs: list[Any]) -> list[str]:
    """Source of each function and, transitively, of the module-level functions (and constants) it names."""
    import inspect
    import sys

    out: list[str] = []
    seen: set[int] = set()
    todo = list(funcs)
    while todo:
        f = todo.pop()
        f = getattr(f, "__func__", f)
        f = getattr(f, "__wrapped__", f)  # a cached function's own code (the cache's repr holds an address)
        if id(f) in seen:
            continue
        seen.add(id(f))
        code = getattr(f, "__code__", None)
        if code is None:
            out.append(f"{type(f).__module__}.{type(f).__qualname__}:{getattr(f, '__qualname__', '')}")
            continue
        try:
            out.append(inspect.getsource(f))
        except (OSError, TypeError):
            out.append(code.co_code.hex())
        module = sys.modules.get(getattr(f, "__module__", "") or "")
        names = set(code.co_names)
        for const in code.co_consts:
            if hasattr(const, "co_names"):
                names |= set(const.co_names)
        for name in sorted(names):
            obj = getattr(module, name, None) if module is not None else None
            if callable(obj) and getattr(obj, "__module__", None) == getattr(f, "__module__", None):
                todo.append(obj)
            elif isinstance(obj, frozenset):  # a set's repr follows the process's string hashing: sort it
                out.append(f"{name}={sorted(map(repr, obj))!r}")
            elif isinstance(obj, (int, float, str, tuple)):
                out.append(f"{name}={obj!r}")
    return sorted(out)


def search_domains(recipe: Recipe) -> tuple[list[str], list[list[KnobValue]]]:
    """The knobs of ``recipe.tuning.search_space`` and the values the oracle enumerates for each."""
    space = list(recipe.tuning.search_space)
    return space, [_prune(recipe, k, admissible_values(recipe, k)) for k in space]


def configurations(recipe: Recipe, space: list[str], domains: list[list[KnobValue]]
                   ) -> Iterator[tuple[tuple[KnobValue, ...], Recipe]]:
    """Every combination of ``domains`` (one value per knob of ``space``) that satisfies the catalogue's constraints,
    with the recipe it makes."""
    cat = recipe.catalogue
    for combo in itertools.product(*domains):
        cand = recipe.model_copy(update={"knobs": {**recipe.knobs, **dict(zip(space, combo))}})
        if not cat.constraint_problems(cand):
            yield combo, cand


def enumerate_space(recipe: Recipe, *, top: int = 5) -> Oracle:
    """Enumerate ``recipe.tuning.search_space`` exhaustively (see the module docstring)."""
    from attune.gate import evaluate
    from attune.sim import simulate

    t0 = time.monotonic()
    space, domains = search_domains(recipe)
    size = 1
    for d in domains:
        size *= max(1, len(d))
    if size > MAX_CONFIGURATIONS:
        raise ValueError(f"{recipe.name}: the search space has {size:,} configurations; the oracle enumerates at "
                         f"most {MAX_CONFIGURATIONS:,}. Shrink tuning.search_space")
    base = simulate(recipe)
    results: list[tuple[float, dict[str, KnobValue]]] = []
    admissible = oom = 0
    for combo, cand in configurations(recipe, space, domains):
        admissible += 1
        res = simulate(cand)
        if res.outcome != "succeeded":
            oom += 1
            continue
        results.append((res.tokens_per_s_per_device, dict(zip(space, combo))))
    results.sort(key=lambda x: -x[0])
    best_tps, best_knobs = 0.0, {}
    winners: list[dict[str, Any]] = []
    for tps, knobs in results:
        cand = recipe.with_knobs(**knobs)
        if evaluate(recipe, cand, (), parent=cand).admitted:
            if not winners:
                best_tps, best_knobs = tps, knobs
            winners.append({"tokens_per_s_per_device": tps, "knobs": knobs})
            if len(winners) >= top:
                break
    return Oracle(recipe=recipe.name, search_space=space, space_size=size, admissible=admissible, oom=oom,
                  optimum_tps=best_tps, optimum_knobs=best_knobs,
                  baseline_tps=base.tokens_per_s_per_device, baseline_outcome=base.outcome,
                  seconds=time.monotonic() - t0, top=winners)


def oracle(recipe: Recipe, cache_dir: Path | None = None) -> Oracle:
    """The oracle of ``recipe``, from ``cache_dir`` when a result for the same inputs is there."""
    path = cache_dir / f"{recipe.name}-{cache_key(recipe)}.json" if cache_dir else None
    if path is not None and path.exists():
        try:
            return Oracle(**json.loads(path.read_text()))
        except (ValueError, TypeError):
            pass
    result = enumerate_space(recipe)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(result.to_dict(), indent=1, default=str))
        tmp.replace(path)
    return result


def true_throughput(recipe: Recipe, _cache: dict[str, float] | None = None) -> float:
    """Noiseless simulated tokens/s per device of ``recipe`` (0 if it runs out of memory)."""
    from attune.sim import simulate

    sig = signature(recipe)
    if _cache is not None and sig in _cache:
        return _cache[sig]
    res = simulate(recipe)
    tps = res.tokens_per_s_per_device if res.outcome == "succeeded" else 0.0
    if _cache is not None:
        _cache[sig] = tps
    return tps
