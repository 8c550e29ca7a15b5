"""The chat seam: a narrow ``ChatClient`` protocol, and ``OpenAIChat`` (the only place that imports ``openai``).

Errors are normalised to :class:`ChatError` subclasses (timeout, rate limit, refusal, unavailable) so the
LLM policy can retry or fall back without knowing the client library. The API key is never logged or
shown in ``repr``.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Usage:
    """Tokens one chat call used."""

    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(self.prompt_tokens + other.prompt_tokens, self.completion_tokens + other.completion_tokens)


@dataclass(frozen=True)
class ChatReply:
    """One assistant answer: its text, token usage, model and finish reason."""

    text: str
    usage: Usage = Usage()
    model: str = ""
    finish_reason: str = ""


class ChatError(Exception):
    """A chat call failed; ``kind`` names how (timeout, rate_limit, refusal, unavailable)."""

    kind = "error"

    def __init__(self, message: str, usage: Usage | None = None) -> None:
        super().__init__(message)
        self.usage = usage or Usage()


class ChatTimeout(ChatError):
    """The model did not answer before the deadline."""

    kind = "timeout"


class ChatRateLimited(ChatError):
    """The endpoint said 429; ``retry_after_s`` is its hint (None if it gave none)."""

    kind = "rate_limit"

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class ChatRefused(ChatError):
    """The model refused to answer."""

    kind = "refusal"


class ChatUnavailable(ChatError):
    """The endpoint could not be reached or answered with an error status (``status``, where it answered)."""

    kind = "unavailable"

    def __init__(self, message: str, usage: Usage | None = None, *, status: int | None = None) -> None:
        super().__init__(message, usage)
        self.status = status

    @property
    def context_exceeded(self) -> bool:
        """True when the endpoint said the prompt does not fit its context window."""
        text = str(self).lower()
        return self.status == 400 and any(w in text for w in ("context", "too long", "exceed", "n_ctx", "tokens"))


@runtime_checkable
class ChatClient(Protocol):
    """Anything that turns a list of chat messages into one reply (or raises :class:`ChatError`)."""

    def complete(self, messages: list[dict[str, str]], *, schema: dict[str, Any] | None = None) -> ChatReply:
        """The assistant's reply to ``messages``; ``schema`` asks for JSON matching it where supported."""
        ...


#: the hosts ``OPENAI_API_KEY`` may be sent to (any other endpoint gets ``ATTUNE_LLM_API_KEY`` only)
OPENAI_HOSTS = ("api.openai.com",)

NO_ENDPOINT = ("the llm and hybrid policies need an explicit OpenAI-compatible endpoint, and none is set: set "
               "ATTUNE_LLM_BASE_URL (e.g. `export ATTUNE_LLM_BASE_URL=http://127.0.0.1:8000/v1` for a local vLLM or "
               "llama.cpp server, or `export ATTUNE_LLM_BASE_URL=https://api.openai.com/v1` with ATTUNE_LLM_API_KEY), "
               "or pass base_url; attune never falls back to a default public endpoint. Without a model, use "
               "--policy playbook")


def endpoint_from_env(base_url: str | None = None) -> str:
    """The explicit endpoint (``base_url`` or ``ATTUNE_LLM_BASE_URL``); :class:`PolicyError` when there is none."""
    from attune.errors import PolicyError

    url = (base_url or os.environ.get("ATTUNE_LLM_BASE_URL") or "").strip()
    if not url:
        raise PolicyError(NO_ENDPOINT)
    if not url.startswith(("http://", "https://")):
        raise PolicyError(f"ATTUNE_LLM_BASE_URL must be an http:// or https:// URL, got {url!r}")
    return url


class OpenAIChat:
    """A :class:`ChatClient` for any OpenAI-compatible endpoint (OpenAI, vLLM, llama.cpp, Ollama...).

    Base URL, model and key come from the arguments, else ``ATTUNE_LLM_BASE_URL``, ``ATTUNE_LLM_MODEL`` and
    ``ATTUNE_LLM_API_KEY``. The endpoint is required: without one the constructor raises
    :class:`~attune.errors.PolicyError` (before any trial runs). ``OPENAI_API_KEY`` is used only for OpenAI's own
    endpoint. ``json_mode`` (or ``ATTUNE_LLM_JSON_MODE``) chooses ``response_format``: ``schema`` (strict JSON
    schema, default), ``object`` (JSON mode) or ``none`` for servers that support neither; the answer is validated
    strictly either way.
    """

    def __init__(self, base_url: str | None = None, model: str | None = None, api_key: str | None = None, *,
                 timeout_s: float | None = None, json_mode: Literal["schema", "object", "none"] | None = None,
                 temperature: float = 0.0, max_tokens: int | None = None,
                 context_tokens: int | None = None) -> None:
        from urllib.parse import urlparse

        self.base_url = endpoint_from_env(base_url)
        self.model = model or os.environ.get("ATTUNE_LLM_MODEL") or "gpt-4o-mini"
        openai_key = os.environ.get("OPENAI_API_KEY") if urlparse(self.base_url).hostname in OPENAI_HOSTS else None
        self._api_key = api_key or os.environ.get("ATTUNE_LLM_API_KEY") or openai_key or "none"
        self.timeout_s = float(timeout_s if timeout_s is not None else _env_number("ATTUNE_LLM_TIMEOUT_S", 60.0))
        mode = json_mode or os.environ.get("ATTUNE_LLM_JSON_MODE", "schema")
        self.json_mode = mode if mode in ("schema", "object", "none") else "schema"
        self.temperature = temperature
        #: the most tokens an answer may take (the schema bounds an answer well below it, so none is cut off)
        self.max_tokens = int(max_tokens if max_tokens is not None else _env_number("ATTUNE_LLM_MAX_TOKENS", 400))
        self._context = context_tokens if context_tokens is not None else (
            int(_env_number("ATTUNE_LLM_CONTEXT_TOKENS", 0)) or None)
        self._context_asked = self._context is not None
        self._client: Any = None

    def __repr__(self) -> str:
        return f"OpenAIChat(base_url={self.base_url!r}, model={self.model!r}, api_key=***)"

    def _get(self) -> Any:
        if self._client is None:
            import openai

            self._client = openai.OpenAI(base_url=self.base_url, api_key=self._api_key, timeout=self.timeout_s,
                                         max_retries=0)
        return self._client

    def context_window(self) -> int | None:
        """The endpoint's context window in tokens: the setting (``context_tokens``, ``ATTUNE_LLM_CONTEXT_TOKENS``),
        else what the server says (llama.cpp ``/props``, vLLM's ``max_model_len`` in ``/v1/models``), else ``None``."""
        if not self._context_asked:
            self._context_asked = True
            self._context = _ask_context(self.base_url, self._api_key)
        return self._context

    def complete(self, messages: list[dict[str, str]], *, schema: dict[str, Any] | None = None) -> ChatReply:
        import openai

        kwargs: dict[str, Any] = {"model": self.model, "messages": messages, "temperature": self.temperature}
        if self.max_tokens:
            kwargs["max_tokens"] = self.max_tokens
        if schema is not None and self.json_mode == "schema":
            kwargs["response_format"] = {"type": "json_schema",
                                         "json_schema": {"name": "proposal", "schema": schema, "strict": True}}
        elif schema is not None and self.json_mode == "object":
            kwargs["response_format"] = {"type": "json_object"}
        try:
            resp = self._get().chat.completions.create(**kwargs)
        except openai.APITimeoutError as err:
            raise ChatTimeout(f"no answer within {self.timeout_s:g}s") from err
        except openai.RateLimitError as err:
            raise ChatRateLimited("rate limited (429)", _retry_after(err)) from err
        except openai.APIStatusError as err:
            detail = _error_detail(err)
            raise ChatUnavailable(f"endpoint answered {err.status_code}{': ' + detail if detail else ''}",
                                  status=err.status_code) from err
        except openai.APIConnectionError as err:
            raise ChatUnavailable(f"cannot reach the endpoint: {type(err).__name__}") from err
        u = getattr(resp, "usage", None)
        usage = Usage(int(getattr(u, "prompt_tokens", 0) or 0), int(getattr(u, "completion_tokens", 0) or 0))
        if not resp.choices:
            raise ChatUnavailable("the endpoint returned no choices", usage)
        choice = resp.choices[0]
        refusal = getattr(choice.message, "refusal", None)
        if refusal:
            raise ChatRefused(f"the model refused: {str(refusal)[:200]}", usage)
        return ChatReply(text=choice.message.content or "", usage=usage, model=getattr(resp, "model", "") or "",
                         finish_reason=choice.finish_reason or "")


def _env_number(name: str, default: float) -> float:
    try:
        value = float(os.environ.get(name, "") or default)
    except ValueError:
        return default
    return value if value > 0 else default


def _error_detail(err: Any) -> str:
    try:
        body = err.response.json()
        msg = body.get("error", {}).get("message") if isinstance(body.get("error"), dict) else body.get("error")
        return str(msg or "")[:200]
    except Exception:  # noqa: BLE001 - the status alone is enough
        return ""


def _ask_context(base_url: str, api_key: str) -> int | None:
    """Ask an OpenAI-compatible server for its context window (llama.cpp ``/props``, ``/v1/models``)."""
    import json
    import urllib.request

    root = base_url.rstrip("/")
    root = root[: -len("/v1")] if root.endswith("/v1") else root
    headers = {"Authorization": f"Bearer {api_key}"}

    def get(url: str) -> Any:
        req = urllib.request.Request(url, headers=headers)
        with urllib.request.urlopen(req, timeout=5) as resp:  # noqa: S310 - the user's own endpoint
            return json.loads(resp.read().decode())

    try:
        props = get(f"{root}/props")
        n = (props.get("default_generation_settings") or {}).get("n_ctx") or props.get("n_ctx")
        if n:
            return int(n)
    except Exception:  # noqa: BLE001 - not a llama.cpp server
        pass
    try:
        models = get(f"{base_url.rstrip('/')}/models")
        for m in models.get("data", []) if isinstance(models, dict) else []:
            n = m.get("max_model_len") or (m.get("meta") or {}).get("n_ctx") or (m.get("meta") or {}).get("n_ctx_train")
            if n:
                return int(n)
    except Exception:  # noqa: BLE001 - the server does not say
        pass
    return None


def _retry_after(err: Any) -> float | None:
    try:
        value = err.response.headers.get("retry-after")
        return float(value) if value is not None else None
    except (AttributeError, TypeError, ValueError):
        return None


__all__ = [
    "NO_ENDPOINT",
    "ChatClient",
    "ChatError",
    "ChatRateLimited",
    "ChatRefused",
    "ChatReply",
    "ChatTimeout",
    "ChatUnavailable",
    "OpenAIChat",
    "Usage",
    "endpoint_from_env",
]
