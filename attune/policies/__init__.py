"""Proposal policies, by name. Heavy ones (LLM, Optuna) are imported only when asked for."""

from __future__ import annotations

from typing import Any

from attune.engine.policy import Policy
from attune.errors import PolicyError

POLICIES = ("coordinate", "random", "playbook", "llm", "hybrid")


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
    raise PolicyError(f"unknown policy '{name}'; choose one of: {', '.join(POLICIES)}")


__all__ = ["POLICIES", "make_policy"]
