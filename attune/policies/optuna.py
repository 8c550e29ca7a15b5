"""Whole-configuration Optuna samplers (random, TPE, GP) wrapped as an engine :class:`Policy`.

Each proposal is a full assignment of the search space, sampled by Optuna's ask/tell interface over the
catalogue domains (every knob a categorical distribution). The engine applies it to the current best recipe
as one :class:`~attune.recipe.change.Change` that may move several knobs at once. These samplers are
unconstrained searchers, so the default one-coupling-group rule of the gate refuses almost every proposal;
the benchmark therefore runs them behind :func:`multi_knob_gate`, the same gate minus that one rule (every
other check, constraints, contract, numerics opt-in and repeats, still applies, and a refusal is still
counted and costs nothing).

What Optuna is told: the measured throughput for a succeeded trial, ``FAIL`` for a trial that ran out of
memory, crashed or timed out, ``FAIL`` for a proposal the gate refused as invalid, and for a proposal refused
*only* because it repeats a configuration already measured, that configuration's earlier throughput (what a
user of Optuna would do with a cache). The baseline run is added as a completed trial, so the samplers start
from what the tuner knows. Optuna is imported only here.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from attune.engine.policy import Policy, PolicyContext, Stop
from attune.engine.state import TrialOutcome, TrialRecord
from attune.errors import PolicyError
from attune.recipe.catalogue import Catalogue, KnobValue
from attune.recipe.change import Change

SAMPLERS = ("random", "tpe", "gp")


def _encode(value: KnobValue) -> Any:
    """Optuna categorical choices must be None/bool/int/float/str: they are already."""
    return value


def make_sampler(kind: str, seed: int) -> Any:
    """An Optuna sampler by short name (``random``, ``tpe``, ``gp``); raises :class:`PolicyError` if unavailable."""
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
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=5)
    raise PolicyError(f"unknown Optuna sampler '{kind}'; choose one of: {', '.join(SAMPLERS)}")


class OptunaPolicy(Policy):
    """Proposes whole configurations of the search space drawn by an Optuna sampler."""

    def __init__(self, sampler: str = "tpe", seed: int = 0) -> None:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.kind = sampler
        self.name = f"optuna-{sampler}"
        self.study = optuna.create_study(direction="maximize", sampler=make_sampler(sampler, seed))
        self._pending: tuple[Any, dict[str, KnobValue]] | None = None
        self._dists: dict[str, Any] | None = None
        self._seen: dict[tuple[tuple[str, Any], ...], float] = {}

    # -- helpers -----------------------------------------------------------------------------------
    def _distributions(self, catalogue: Catalogue, space: Sequence[str]) -> dict[str, Any]:
        if self._dists is None:
            from optuna.distributions import CategoricalDistribution

            self._dists = {name: CategoricalDistribution([_encode(v) for v in catalogue[name].values])
                           for name in space}
        return self._dists

    def _key(self, params: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
        return tuple(sorted((k, repr(v)) for k, v in params.items()))

    def _add(self, params: dict[str, Any], value: float | None) -> None:
        import optuna

        if self._dists is None or set(params) != set(self._dists):
            return
        if any(params[k] not in self._dists[k].choices for k in params):
            return
        state = optuna.trial.TrialState.COMPLETE if value is not None else optuna.trial.TrialState.FAIL
        self.study.add_trial(optuna.trial.create_trial(params=params, distributions=self._dists,
                                                       value=value, state=state))

    # -- the Policy interface ----------------------------------------------------------------------
    def propose(self, ctx: PolicyContext) -> Change | Stop:
        dists = self._distributions(ctx.catalogue, ctx.search_space)
        if not self.study.trials:
            base = {k: ctx.baseline.knob(k) for k in ctx.search_space}
            tps = [r.throughput for r in ctx.records if r.kind == "baseline" and r.throughput]
            if tps:
                value = math.fsum(tps) / len(tps)
                self._seen[self._key(base)] = value
                self._add(base, value)
        trial = self.study.ask(dists)
        params = {k: trial.params[k] for k in ctx.search_space}
        self._pending = (trial, params)
        return Change(set=params, source=self.name, rationale=f"{self.kind} sample #{trial.number}")

    def observe(self, record: TrialRecord) -> None:
        if record.kind != "candidate":
            return
        import optuna

        params = dict(record.change)
        value: float | None = None
        if record.outcome is TrialOutcome.SUCCEEDED and record.throughput:
            value = record.throughput
            self._seen[self._key(params)] = value
        elif record.outcome is TrialOutcome.REFUSED:
            codes = {r.get("code") for r in (record.verdict or {}).get("reasons", [])}
            if codes == {"repeat"}:
                value = self._seen.get(self._key(params))
        pending, self._pending = self._pending, None
        if pending is not None and pending[1] == params:
            if value is None:
                self.study.tell(pending[0], state=optuna.trial.TrialState.FAIL)
            else:
                self.study.tell(pending[0], value)
        else:  # replayed from a journal (resume): rebuild the study from the record
            self._add(params, value)


def multi_knob_gate(baseline: Any, candidate: Any, history: Iterable[Any] = (), *, parent: Any = None) -> Any:
    """The engine's gate without the one-coupling-group rule (benchmark baselines only; see module docstring)."""
    from attune.gate import evaluate
    from attune.gate.verdict import ReasonCode

    verdict = evaluate(baseline, candidate, history, parent=parent)
    if verdict.admitted:
        return verdict
    rest = [r for r in verdict.reasons if r.code != ReasonCode.MULTIPLE_GROUPS]
    if rest:
        return verdict.model_copy(update={"reasons": rest})
    from attune.gate.verdict import LOSS_EQUIVALENCE
    from attune.recipe.catalogue import Semantics

    owes = verdict.semantics in (Semantics.NUMERICS_DRIFT, Semantics.NUMERICS_CHANGING)
    return verdict.model_copy(update={"admitted": True, "reasons": [], "owed": [LOSS_EQUIVALENCE] if owes else []})


__all__ = ["SAMPLERS", "OptunaPolicy", "make_sampler", "multi_knob_gate"]
