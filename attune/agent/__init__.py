"""attune's tuning agent: diagnosis, the playbook policy, lessons, the LLM policy and the sidecar service.

Nothing here imports Kubernetes; only :mod:`attune.agent.chat` imports ``openai`` (lazily).
"""

from __future__ import annotations

import logging
from typing import Any

from attune.engine.policy import Policy
from attune.errors import PolicyError

log = logging.getLogger(__name__)

AGENT_POLICIES = ("playbook", "llm", "hybrid")


def make_agent_policy(name: str, **options: Any) -> Policy:
    """Build the agent policy ``name`` (playbook, llm or hybrid).

    Options: ``lessons`` (a :class:`~attune.agent.lessons.LessonStore`, a path, or ``False`` to disable;
    default: the user's store where :func:`~attune.agent.lessons.lessons_steer` says lessons steer, else none), ``include_simulated_lessons`` (let lessons measured on the simulator steer a
    real run; default off), ``chat`` (a :class:`~attune.agent.chat.ChatClient`; default
    :class:`~attune.agent.chat.OpenAIChat` from ``ATTUNE_LLM_*``), ``base_url``, ``model``, ``api_key``,
    ``max_attempts``, and the playbook's thresholds. Unknown options are ignored (``seed`` among them).

    ``llm`` and ``hybrid`` need an explicit endpoint (``base_url`` or ``ATTUNE_LLM_BASE_URL``): without one this
    raises :class:`~attune.errors.PolicyError` here, before any trial is run or charged.
    """
    from attune.agent.lessons import LessonStore
    from attune.agent.playbook import PlaybookPolicy

    lessons_opt = options.pop("lessons", None)
    lessons: LessonStore | None
    from attune.agent.lessons import lessons_steer

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
    if name in ("llm", "hybrid"):
        from attune.agent.chat import OpenAIChat
        from attune.agent.llm import LLMPolicy

        chat = options.get("chat")
        if chat is None:
            chat = OpenAIChat(base_url=options.get("base_url"), model=options.get("model"),
                              api_key=options.get("api_key"), timeout_s=options.get("timeout_s"))
        llm_keys = ("max_attempts", "max_backoff_s")
        return LLMPolicy(chat, playbook=playbook, lessons=lessons, mode="llm" if name == "llm" else "hybrid",
                         **{k: options[k] for k in llm_keys if k in options})
    raise PolicyError(f"unknown agent policy '{name}'; choose one of: {', '.join(AGENT_POLICIES)}")


__all__ = ["AGENT_POLICIES", "make_agent_policy"]
