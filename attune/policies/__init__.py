"""Proposal policies, by name: the one registry ``attune tune --policy``, the sidecar and the benchmark build them
from. Heavy ones (LLM, Optuna) are imported only when asked for."""

from __future__ import annotations

from typing import Any

from attune.engine.policy import Policy
from attune.errors import PolicyError

POLICIES = ("coordinate", "random", "playbook", "llm", "hybrid")
"""The policies a user tunes with (``attune tune --policy``)."""
BASELINE_POLICIES = ("optuna-random", "tpe", "gp", "cmaes", "grid", "optico")
"""The benchmark's baselines: Optuna's samplers and an AutoConfigurator-style grid over whole configurations, and an
OptiCo-style team of LLM roles (they propose several coupling groups at once: the benchmark runs them behind the
gate minus its one-group rule, :func:`attune.policies.optuna.multi_knob_gate`)."""


def make_policy(name: str, **options: Any) -> Policy:
    """Build the policy called ``name`` (``attune tune --policy NAME``)."""
    if name == "coordinate":
        from attune.policies.coordinate import CoordinateDescent

        return CoordinateDescent()
    if name == "random":
        from attune.policies.random import RandomSearch

        return RandomSearch(seed=int(options.get("seed", 0)))
    if name in ("playbook", "llm", "hybrid"):
        try:
            from attune.agent import make_agent_policy
        except ImportError:
            raise PolicyError(f"policy '{name}' needs attune's agent, which is not available") from None
        return make_agent_policy(name, **options)
    if name in ("optuna-random", "tpe", "gp", "cmaes"):
        from attune.policies.optuna import OptunaPolicy

        return OptunaPolicy("random" if name == "optuna-random" else name, seed=int(options.get("seed", 0)))
    if name == "grid":
        from attune.policies.grid import GridPolicy

        return GridPolicy()
    if name == "optico":
        from attune.policies.optico import OptiCoPolicy

        return OptiCoPolicy.from_env(seed=int(options.get("seed", 0)))
    raise PolicyError(f"unknown policy '{name}'; choose one of: {', '.join(POLICIES + BASELINE_POLICIES)}")


__all__ = ["BASELINE_POLICIES", "POLICIES", "make_policy"]
