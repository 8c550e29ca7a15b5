"""The LLM policy needs an explicit endpoint, and every fallback to the playbook is a warning with its reason."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from aiohttp import web

from attune import api
from attune.agent.chat import ChatUnavailable, OpenAIChat
from attune.engine.policy import Stop
from attune.errors import PolicyError
from attune.policies import make_policy
from attune.policies.llm import LLMPolicy
from attune.policies.playbook import PlaybookPolicy
from attune.testing.chat import FakeChat
from attune.testing.factories import tiny_recipe
from attune.testing.fakes import FakeBackend
from tests.agent.helpers import baseline_record, context
from tests.agent.llm_server import ScriptedServer, answer


@pytest.fixture
def no_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("ATTUNE_LLM_BASE_URL", "ATTUNE_LLM_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-must-not-leave-this-machine")


@pytest.mark.parametrize("name", ["llm", "hybrid"])
def test_llm_policy_refuses_to_start_without_an_endpoint(no_endpoint, name):
    with pytest.raises(PolicyError, match="ATTUNE_LLM_BASE_URL") as err:
        make_policy(name, lessons=False)
    assert "export ATTUNE_LLM_BASE_URL=" in str(err.value)
    with pytest.raises(PolicyError, match="ATTUNE_LLM_BASE_URL"):
        OpenAIChat()


def test_tune_with_llm_and_no_endpoint_spends_no_budget(no_endpoint, tmp_path, monkeypatch):
    runs = []

    class Counting(FakeBackend):
        def run(self, recipe, request):
            runs.append(request.trial_id)
            return super().run(recipe, request)

    monkeypatch.setattr(api, "make_backend", lambda name, **options: Counting())
    with pytest.raises(PolicyError, match="ATTUNE_LLM_BASE_URL"):
        api.tune(tiny_recipe(), budget_hours=1.0, policy="llm", out_dir=tmp_path / "run",
                 policy_options={"lessons": False})
    assert runs == [] and not (tmp_path / "run" / "journal.jsonl").exists()


def test_an_explicit_endpoint_builds_the_policy(no_endpoint, monkeypatch):
    monkeypatch.setenv("ATTUNE_LLM_BASE_URL", "http://127.0.0.1:9/v1")
    pol = make_policy("llm", lessons=False)
    assert isinstance(pol, LLMPolicy) and pol.chat.base_url == "http://127.0.0.1:9/v1"
    assert isinstance(make_policy("llm", lessons=False, base_url="http://127.0.0.1:8/v1"), LLMPolicy)


def test_every_fallback_to_the_playbook_is_a_warning_with_its_reason(caplog):
    r = tiny_recipe()
    ctx = context(r, [baseline_record(r)])
    pol = LLMPolicy(FakeChat([ChatUnavailable("cannot reach the endpoint: ConnectError")]), playbook=PlaybookPolicy(),
                    max_attempts=2)
    caplog.set_level(logging.WARNING, logger="attune.policies.llm")
    out = pol.propose(ctx)
    assert out.source.startswith("playbook-fallback: unavailable: cannot reach the endpoint")
    warned = [rec for rec in caplog.records if rec.levelno == logging.WARNING]
    assert warned and "playbook" in warned[0].getMessage() and "cannot reach the endpoint" in warned[0].getMessage()


def test_a_fallback_stop_is_a_warning_too(caplog):
    r = tiny_recipe()
    r = r.model_copy(update={"tuning": r.tuning.model_copy(update={"search_space": ("compile_mode",)})})
    ctx = context(r, [baseline_record(r)])
    pol = LLMPolicy(FakeChat(["not json"]), playbook=PlaybookPolicy(min_expected_gain=5.0, stop_early=True),
                    max_attempts=1)
    caplog.set_level(logging.WARNING, logger="attune.policies.llm")
    out = pol.propose(ctx)
    assert isinstance(out, Stop) and "playbook-fallback: it is not valid JSON" in out.reason
    assert any(rec.levelno == logging.WARNING and "not valid JSON" in rec.getMessage() for rec in caplog.records)


class HeaderServer(ScriptedServer):
    """The scripted endpoint, keeping the Authorization header of every request."""

    def __init__(self) -> None:
        self.auth: list[str | None] = []
        super().__init__()

    async def _chat(self, request: web.Request) -> web.Response:
        self.auth.append(request.headers.get("Authorization"))
        return await super()._chat(request)


@pytest.fixture(scope="module")
def header_server() -> Iterator[HeaderServer]:
    s = HeaderServer()
    yield s
    s.close()


def test_openai_key_is_not_sent_to_another_endpoint(no_endpoint, header_server, monkeypatch):
    header_server.script = [("ok", answer())]
    monkeypatch.setenv("ATTUNE_LLM_BASE_URL", f"http://127.0.0.1:{header_server.port}/v1")
    chat = OpenAIChat(model="scripted")
    chat.complete([{"role": "user", "content": "hi"}])
    assert header_server.auth and "sk-must-not-leave" not in (header_server.auth[-1] or "")
    monkeypatch.setenv("ATTUNE_LLM_API_KEY", "sk-for-this-endpoint")
    OpenAIChat(model="scripted").complete([{"role": "user", "content": "hi"}])
    assert header_server.auth[-1] == "Bearer sk-for-this-endpoint"
