"""A local OpenAI-compatible chat endpoint (aiohttp on 127.0.0.1) replaying a script of answers, for the LLM tests."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

from aiohttp import web


def answer(knob: Any = "nproc_per_node", value: Any = 2, stop: bool = False, **extra: Any) -> str:
    return json.dumps({"knob": knob, "value": value, "rationale": "more processes use both cores",
                       "expected_gain": 0.3, "stop": stop, **extra})


class ScriptedServer:
    """An OpenAI-compatible /v1/chat/completions endpoint replaying a script (the last item repeats)."""

    def __init__(self) -> None:
        self.script: list[tuple[str, Any]] = []
        self.requests: list[dict[str, Any]] = []
        self.loop = asyncio.new_event_loop()
        self.port = 0
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
        self._ready.wait(10)

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        self.runner = web.AppRunner(app)
        self.loop.run_until_complete(self.runner.setup())
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]  # noqa: SLF001
        self._ready.set()
        self.loop.run_forever()

    async def _chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(body)
        kind, payload = self.script[min(len(self.requests) - 1, len(self.script) - 1)]
        if kind == "429":
            return web.json_response({"error": {"message": "slow down", "type": "rate_limit"}}, status=429,
                                     headers={"Retry-After": "0"})
        if kind == "sleep":
            await asyncio.sleep(payload)
            payload = answer()
        message: dict[str, Any] = {"role": "assistant", "content": payload}
        if kind == "refuse":
            message = {"role": "assistant", "content": None, "refusal": payload}
        return web.json_response({
            "id": "cmpl-1", "object": "chat.completion", "created": int(time.time()), "model": body["model"],
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 900, "completion_tokens": 40, "total_tokens": 940}})

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)
