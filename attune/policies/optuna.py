"""Whole-configuration Optuna samplers (random, TPE, GP, CMA-ES) wrapped as an engine :class:`Policy`.

Each proposal is a full assignment of the search space, drawn by Optuna's ask/tell interface; the engine applies it
to the current best recipe as one :class:`~attune.recipe.change.Change` that may move several knobs at once. These
samplers are unconstrained searchers, so the benchmark runs them behind :func:`multi_knob_gate`, the same gate minus
its one-coupling-group rule (every other check, constraints, contract, numerics opt-in and repeats, still applies).

The sampler is given **the admissible space the gate defines**, so a baseline never burns its run on refusals:

* each knob's distribution holds only the values the gate can admit whatever the other knobs are (the oracle's
  per-knob domain: no un-opted-in FP8, no TP that changes the padded vocabulary);
* a draw the gate would refuse (a violated constraint, a repeat) is never handed to the engine: it is told to
  Optuna at once as an *infeasible* trial, through Optuna's constraints (``constraints_func``) for the samplers that
  learn them (TPE, GP: ``Trial.set_constraint``), and as the worst value for CMA-ES, then the sampler is asked again; after
  ``max_asks`` such draws in a row the policy proposes a uniformly random admissible, untried configuration instead
  (enqueued, so the sampler is told its result like any other), so no sampler can propose the same refused
  configuration over and over;
* a trial that runs out of memory, crashes or times out is infeasible in the same way (the samplers learn the
  memory wall); a succeeded trial is told its measured throughput relative to the measured baseline.

The baseline run is added as a completed trial, so the samplers start from what the tuner knows. Draws are counted
in :attr:`OptunaPolicy.stats`. Optuna is imported only here.
"""

from __future__ import annotations

import math
import random
import zlib
from collections.abc import Iterable, Sequence
from typing import Any

from attune.engine.policy import Policy, PolicyContext, Stop
from attune.errors import PolicyError
from attune.recipe.catalogue import KnobValue
from attune.recipe.change import Change
from attune.recipe.model import Recipe
from attune.trial import TrialOutcome, TrialRecord

SAMPLERS = ("random", "tpe", "gp", "cmaes")
INFEASIBLE = 0.0
"""Objective value told for an infeasible draw or trial (the objective is throughput relative to the baseline)."""
_CONSTRAINT = "infeasible"


def sampler_seed(kind: str, seed: int) -> int:
    """A seed of its own for each sampler, so two samplers given the same run seed do not make the same draws."""
    return zlib.crc32(f"{kind}:{seed}".encode()) & 0x7FFFFFFF


def make_sampler(kind: str, seed: int) -> Any:
    """An Optuna sampler by short name; raises :class:`PolicyError` if unavailable."""
    try:
        import optuna
    except ImportError:
        raise PolicyError("the Optuna baselines need optuna: pip install 'attune-llm[optuna]'") from None
    if kind == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if kind == "tpe":
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=5, multivariate=True)
    if kind == "gp":
        try:
            import scipy  # noqa: F401  (GPSampler optimises its acquisition with scipy)
            import torch  # noqa: F401
        except ImportError as err:
            raise PolicyError(f"Optuna's GPSampler needs {err.name}, which is not installed") from None
        torch.set_num_threads(1)  # tiny GPs: threads only contend
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=5, warn_independent_sampling=False)
    if kind == "cmaes":
        try:
            import cmaes  # noqa: F401
        except ImportError:
            raise PolicyError("Optuna's CmaEsSampler needs cmaes: pip install 'attune-llm[optuna]'") from None
        import warnings

        with warnings.catch_warnings():  # with_margin (CMA-ES with margin, for integer spaces) is "experimental"
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.samplers.CmaEsSampler(seed=seed, n_startup_trials=1, popsize=4, with_margin=True,
                                                warn_independent_sampling=False)
    raise PolicyError(f"unknown Optuna sampler '{kind}'; choose one of: {', '.join(SAMPLERS)}")


def admissible_domains(baseline: Recipe, space: Sequence[str]) -> dict[str, list[KnobValue]]:
    """Per knob, the values the gate can admit whatever the other knobs are (the oracle's domain)."""
    from attune.gate.rules import admissible_values

    return {k: admissible_values(baseline, k) or [baseline.knob(k)] for k in space}


class OptunaPolicy(Policy):
    """Proposes whole configurations of the admissible search space drawn by an Optuna sampler."""

    def __init__(self, sampler: str = "tpe", seed: int = 0, *, max_asks: int | None = None,
                 max_random_draws: int = 600) -> None:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.kind = sampler
        self.name = f"optuna-{sampler}"
        self.seed = sampler_seed(sampler, seed)
        make_sampler(sampler, self.seed)  # fail early when unavailable
        self.max_asks = max_asks if max_asks is not None else {"random": 400, "tpe": 40, "gp": 8, "cmaes": 40}[sampler]
        self.max_random_draws = max_random_draws
        self.study: Any = None
        self._pending: tuple[Any, dict[str, KnobValue]] | None = None
        self._domains: dict[str, list[KnobValue]] = {}
        self._dists: dict[str, Any] = {}
        self._seen: dict[tuple[tuple[str, str], ...], float] = {}
        self._rng = random.Random(self.seed)
        self._base_tps: list[float] = []
        self._ordered: dict[str, bool] = {}
        self.stats = {"inadmissible_draws": 0, "repeat_draws": 0, "random_fallbacks": 0}

    # -- encoding --------------------------------------------------------------------------------------
    def _encoded(self, knob: str) -> bool:
        """True when ``knob`` is given to the sampler as an ordinal index (CMA-ES: every knob; GP: ordered ones)."""
        if self.kind == "cmaes":
            return True
        return self.kind == "gp" and self._ordered.get(knob, False)

    def _setup(self, ctx: PolicyContext) -> None:
        if self.study is not None:
            return
        import optuna
        from optuna.distributions import CategoricalDistribution, IntDistribution

        self._domains = admissible_domains(ctx.baseline, ctx.search_space)
        self._ordered = {k: ctx.catalogue[k].type == "int" for k in ctx.search_space}
        for k, vals in self._domains.items():
            if self._encoded(k):
                self._dists[k] = IntDistribution(0, max(0, len(vals) - 1))
            else:
                self._dists[k] = CategoricalDistribution(list(vals))
        self.study = optuna.create_study(direction="maximize", sampler=make_sampler(self.kind, self.seed))

    def _decode(self, params: dict[str, Any]) -> dict[str, KnobValue]:
        return {k: (self._domains[k][int(v)] if self._encoded(k) else v) for k, v in params.items()}

    def _encode(self, config: dict[str, KnobValue]) -> dict[str, Any] | None:
        out: dict[str, Any] = {}
        for k, v in config.items():
            vals = self._domains.get(k, [])
            hit = [i for i, d in enumerate(vals) if type(d) is type(v) and d == v]
            if not hit:
                return None
            out[k] = hit[0] if self._encoded(k) else vals[hit[0]]
        return out

    @staticmethod
    def _key(config: dict[str, Any]) -> tuple[tuple[str, str], ...]:
        return tuple(sorted((k, repr(v)) for k, v in config.items()))

    def _tell(self, trial: Any, value: float | None) -> None:
        """Tell a trial: its relative throughput, or infeasible (constraint violated / worst value for CMA-ES)."""
        if self.kind != "cmaes":  # CMA-ES learns infeasibility from the worst value only
            trial.set_constraint(_CONSTRAINT, 1.0 if value is None else 0.0)
        self.study.tell(trial, INFEASIBLE if value is None else value)

    def _add(self, config: dict[str, KnobValue], value: float | None) -> None:
        import optuna

        params = self._encode(config)
        if params is None or set(params) != set(self._dists):
            return
        self.study.add_trial(optuna.trial.create_trial(
            params=params, distributions=self._dists, value=INFEASIBLE if value is None else value,
            constraints=None if self.kind == "cmaes" else {_CONSTRAINT: 1.0 if value is None else 0.0}))

    # -- the Policy interface ----------------------------------------------------------------------------
    def propose(self, ctx: PolicyContext) -> Change | Stop:
        self._setup(ctx)
        if not self.study.trials:
            base = {k: ctx.baseline.knob(k) for k in ctx.search_space}
            self._seen[self._key(base)] = 1.0
            self._add(base, 1.0)
        for _ in range(self.max_asks):
            trial = self.study.ask(self._dists)
            config = self._decode({k: trial.params[k] for k in ctx.search_space})
            key = self._key(config)
            if key in self._seen:  # a repeat: what a user with a cache would tell the sampler
                self.stats["repeat_draws"] += 1
                self._tell(trial, self._seen[key] if self._seen[key] > 0 else None)
                continue
            if not ctx.admissible(config):
                self.stats["inadmissible_draws"] += 1
                self._seen[key] = 0.0
                self._tell(trial, None)
                continue
            self._pending = (trial, config)
            return Change(set=config, source=self.name, rationale=f"{self.kind} sample #{trial.number}")
        drawn = self._random_admissible(ctx)
        if drawn is None:
            return Stop(f"no admissible, untried configuration found in {self.max_random_draws} random draws")
        self.stats["random_fallbacks"] += 1
        params = self._encode(drawn)
        self.study.enqueue_trial(params, skip_if_exists=False)
        trial = self.study.ask(self._dists)
        self._pending = (trial, self._decode({k: trial.params[k] for k in ctx.search_space}))
        return Change(set=self._pending[1], source=self.name,
                      rationale=f"{self.kind}: uniform admissible draw after {self.max_asks} refused samples")

    def _random_admissible(self, ctx: PolicyContext) -> dict[str, KnobValue] | None:
        for _ in range(self.max_random_draws):
            config = {k: self._rng.choice(v) for k, v in self._domains.items()}
            key = self._key(config)
            if key in self._seen:
                continue
            if ctx.admissible(config):
                return config
            self._seen[key] = 0.0
        return None

    def observe(self, record: TrialRecord) -> None:
        if record.kind == "baseline" and record.outcome is TrialOutcome.SUCCEEDED and record.throughput:
            self._base_tps.append(record.throughput)
            return
        if record.kind != "candidate" or self.study is None:
            return
        config = dict(record.change)
        ref = math.fsum(self._base_tps) / len(self._base_tps) if self._base_tps else 1.0
        value: float | None = None
        if record.outcome is TrialOutcome.SUCCEEDED and record.throughput:
            value = record.throughput / ref
        elif record.outcome is TrialOutcome.REFUSED:
            codes = {r.get("code") for r in (record.verdict or {}).get("reasons", [])}
            if codes == {"repeat"}:
                value = self._seen.get(self._key(config)) or None
        self._seen.setdefault(self._key(config), value or 0.0)
        if value is not None:
            self._seen[self._key(config)] = value
        pending, self._pending = self._pending, None
        if pending is not None and pending[1] == config:
            self._tell(pending[0], value)
        else:  # replayed from a journal (resume): rebuild the study from the record
            self._add(config, value)


def multi_knob_gate(baseline: Any, candidate: Any, history: Iterable[Any] = (), *, parent: Any = None) -> Any:
    """The engine's gate without the one-coupling-group rule (benchmark baselines only; see module docstring)."""
    from attune.gate import evaluate
    from attune.gate.rules import whole_recipe

    return whole_recipe(evaluate(baseline, candidate, history, parent=parent))


__all__ = ["SAMPLERS", "OptunaPolicy", "admissible_domains", "make_sampler", "multi_knob_gate", "sampler_seed"]
