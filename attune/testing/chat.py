"""FakeChat: a scripted :class:`~attune.agent.chat.ChatClient` for tests (plays back replies or raises errors)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from attune.agent.chat import ChatError, ChatReply, Usage


class FakeChat:
    """Returns the scripted items in order (a str, a :class:`ChatReply`, or a :class:`ChatError` to raise).

    When the script runs out the last item repeats. ``calls`` keeps every message list it was given.
    """

    def __init__(self, script: Iterable[str | ChatReply | ChatError]) -> None:
        self.script = list(script)
        self.calls: list[list[dict[str, str]]] = []

    def complete(self, messages: list[dict[str, str]], *, schema: dict[str, Any] | None = None) -> ChatReply:
        self.calls.append(list(messages))
        item = self.script[min(len(self.calls) - 1, len(self.script) - 1)]
        if isinstance(item, ChatError):
            raise item
        if isinstance(item, ChatReply):
            return item
        return ChatReply(text=item, usage=Usage(100, 20), model="fake")
