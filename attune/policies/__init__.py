"""Every proposal policy, in one home, by name: the one registry ``attune tune --policy``, the sidecar
(:mod:`attune.sidecar`) and the benchmark build them from. The agent's policies (the playbook, the LLM policy) read
what :mod:`attune.agent` knows (diagnosis, lessons); the baselines (random, Optuna, grid, OptiCo) do not. Heavy ones
(LLM, Optuna) are imported only when asked for."""

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


AGENT_POLICIES = ("playbook", "llm", "hybrid")
"""The policies that read the diagnosis and the lessons (:mod:`attune.agent`)."""


def _agent_policy(name: str, **options: Any) -> Policy:
    """Build the agent policy ``name`` (playbook, llm or hybrid).

    Options: ``lessons`` (a :class:`~attune.agent.lessons.LessonStore`, a path, or ``False`` to disable;
    default: the user's store where :func:`~attune.agent.lessons.lessons_steer` says lessons steer, else none),
    ``include_simulated_lessons`` (let lessons measured on the simulator steer a real run; default off), ``chat`` (a
    :class:`~attune.agent.chat.ChatClient`; default :class:`~attune.agent.chat.OpenAIChat` from ``ATTUNE_LLM_*``),
    ``base_url``, ``model``, ``api_key``, ``max_attempts``, and the playbook's thresholds (:data:`POLICY_OPTIONS`;
    :func:`make_policy` refuses any other).

    ``llm`` and ``hybrid`` need an explicit endpoint (``base_url`` or ``ATTUNE_LLM_BASE_URL``): without one this
    raises :class:`~attune.errors.PolicyError` here, before any trial is run or charged.
    """
    from attune.agent.lessons import LessonStore, lessons_steer
    from attune.policies.playbook import PlaybookPolicy

    lessons_opt = options.pop("lessons", None)
    lessons: LessonStore | None
    if lessons_opt is False or (lessons_opt is None and not lessons_steer()):
        lessons = None
    elif isinstance(lessons_opt, LessonStore):
        lessons = lessons_opt
    else:
        lessons = LessonStore(lessons_opt)
    pb_keys = ("min_expected_gain", "high_value_gain", "patience", "include_simulated_lessons")
    playbook = PlaybookPolicy(lessons=lessons, **{k: options[k] for k in pb_keys if k in options})
    if name == "playbook":
        return playbook
    from attune.agent.chat import OpenAIChat
    from attune.policies.llm import LLMPolicy

    chat = options.get("chat")
    if chat is None:
        chat = OpenAIChat(base_url=options.get("base_url"), model=options.get("model"),
                          api_key=options.get("api_key"), timeout_s=options.get("timeout_s"))
    llm_keys = ("max_attempts", "max_backoff_s")
    return LLMPolicy(chat, playbook=playbook, lessons=lessons, mode="llm" if name == "llm" else "hybrid",
                     **{k: options[k] for k in llm_keys if k in options})


#: the options every policy takes: ``seed``, and ``lessons`` (a store, a path, or False; the policies that read no
#: lessons take it and ignore it, so a caller can pass one setting for whichever policy the user names)
COMMON_OPTIONS = frozenset({"seed", "lessons"})
_PLAYBOOK_OPTIONS = frozenset({"min_expected_gain", "high_value_gain", "patience", "include_simulated_lessons"})
_LLM_OPTIONS = frozenset({"chat", "base_url", "model", "api_key", "timeout_s", "max_attempts", "max_backoff_s"})
#: the options each policy takes besides :data:`COMMON_OPTIONS`; any other is refused by name
POLICY_OPTIONS: dict[str, frozenset[str]] = {
    "coordinate": frozenset(), "random": frozenset(), "playbook": _PLAYBOOK_OPTIONS,
    "llm": _PLAYBOOK_OPTIONS | _LLM_OPTIONS, "hybrid": _PLAYBOOK_OPTIONS | _LLM_OPTIONS,
    "optuna-random": frozenset(), "tpe": frozenset(), "gp": frozenset(), "cmaes": frozenset(), "grid": frozenset(),
    "optico": frozenset(),
}


def make_policy(name: str, **options: Any) -> Policy:
    """Build the policy called ``name`` (``attune tune --policy NAME``) with ``options``: those of
    :data:`COMMON_OPTIONS` and :data:`POLICY_OPTIONS` for it; any other is a :class:`~attune.errors.PolicyError`
    naming it, never silently ignored."""
    if name in POLICY_OPTIONS:
        unknown = sorted(set(options) - COMMON_OPTIONS - POLICY_OPTIONS[name])
        if unknown:
            takes = sorted(COMMON_OPTIONS | POLICY_OPTIONS[name])
            raise PolicyError(f"policy '{name}' takes no option {', '.join(map(repr, unknown))}; it takes: "
                              f"{', '.join(takes)}")
    if name == "coordinate":
        from attune.policies.coordinate import CoordinateDescent

        return CoordinateDescent()
    if name == "random":
        from attune.policies.random import RandomSearch

        return RandomSearch(seed=int(options.get("seed", 0)))
    if name in AGENT_POLICIES:
        return _agent_policy(name, **options)
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


__all__ = ["AGENT_POLICIES", "BASELINE_POLICIES", "COMMON_OPTIONS", "POLICIES", "POLICY_OPTIONS", "make_policy"]
