"""LLM policy against a real local OpenAI-compatible HTTP server (aiohttp on 127.0.0.1) via the real openai client."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from attune.agent.chat import OpenAIChat
from attune.engine.loop import TuneConfig, Tuner
from attune.engine.policy import Stop
from attune.policies.llm import LLMPolicy
from attune.policies.playbook import PlaybookPolicy
from attune.recipe.change import Change
from attune.testing.chat import FakeChat
from attune.testing.factories import tiny_recipe
from attune.testing.fakes import FakeBackend
from attune.trial import TrialOutcome
from tests.agent.helpers import baseline_record, context
from tests.agent.llm_server import ScriptedServer, answer


@pytest.fixture(scope="module")
def server() -> Iterator[ScriptedServer]:
    s = ScriptedServer()
    yield s
    s.close()


def _policy(server: ScriptedServer, script: list[tuple[str, Any]], mode: str = "llm", timeout_s: float = 5.0,
            attempts: int = 3) -> LLMPolicy:
    server.script = script
    server.requests.clear()
    chat = OpenAIChat(base_url=f"http://127.0.0.1:{server.port}/v1", model="scripted", api_key="sk-secret-123",
                      timeout_s=timeout_s)
    return LLMPolicy(chat, playbook=PlaybookPolicy(), mode=mode, max_attempts=attempts, max_backoff_s=0.05)


def _ctx():
    r = tiny_recipe()
    return context(r, [baseline_record(r)])


def test_valid_answer_is_used_with_usage_recorded(server):
    pol = _policy(server, [("ok", answer())])
    ch = pol.propose(_ctx())
    assert isinstance(ch, Change) and ch.set == {"nproc_per_node": 2} and ch.source == "llm"
    assert ch.usage is not None
    assert (ch.usage.model, ch.usage.prompt_tokens, ch.usage.completion_tokens, ch.usage.attempts) == \
        ("scripted", 900, 40, 1)
    assert "[usage model=scripted prompt_tokens=900 completion_tokens=40 attempts=1 " in ch.rationale  # for people
    sent = server.requests[0]
    prompt = sent["messages"][1]["content"]
    for part in ("search_space", "constraints", "diagnosis", "history", "tested_configurations_vs_baseline",
                 "lessons_in_scope", "global_batch_divisible"):
        assert part in prompt
    assert sent["response_format"]["type"] == "json_schema"
    assert "sk-secret-123" not in repr(pol.chat)


def test_malformed_json_is_retried_with_feedback(server):
    pol = _policy(server, [("ok", "{not json"), ("ok", answer())])
    ch = pol.propose(_ctx())
    assert ch.source == "llm" and ch.usage.attempts == 2
    assert "rejected" in server.requests[1]["messages"][-1]["content"]


@pytest.mark.parametrize(("reply", "reason"), [
    (json.dumps([json.loads(answer()), json.loads(answer("micro_batch_size", 2))]), "more than one knob"),
    (answer(knob=["nproc_per_node", "micro_batch_size"]), "more than one knob"),
    (answer(knob="turbo_mode", value=True), "not a knob"),
    (answer(extra_field=1), "does not match the schema"),
    (answer(value=3), "not a legal value"),
])
def test_bad_answers_fall_back_to_the_playbook(server, reply, reason):
    pol = _policy(server, [("ok", reply)])
    ch = pol.propose(_ctx())
    assert isinstance(ch, Change)
    assert ch.source.startswith("playbook-fallback: ") and reason in ch.source and "×3" in ch.source
    assert ch.usage.prompt_tokens == 2700
    assert len(server.requests) == 3


def test_rate_limit_then_success(server):
    pol = _policy(server, [("429", None), ("ok", answer())])
    ch = pol.propose(_ctx())
    assert ch.source == "llm" and ch.usage.attempts == 2


def test_timeouts_and_refusals_fall_back(server):
    pol = _policy(server, [("sleep", 1.5)], timeout_s=0.3, attempts=2)
    ch = pol.propose(_ctx())
    assert ch.source.startswith("playbook-fallback: timeout")
    pol = _policy(server, [("refuse", "I cannot help with that")], attempts=2)
    assert pol.propose(_ctx()).source.startswith("playbook-fallback: refusal")


def test_stop_is_vetoed_while_high_value_moves_remain(server):
    pol = _policy(server, [("ok", answer(knob=None, value=None, stop=True))])
    ch = pol.propose(_ctx())
    assert isinstance(ch, Change) and ch.source == "playbook-veto" and "stop vetoed" in ch.rationale


def test_hybrid_lets_the_playbook_pick_the_value(server):
    pol = _policy(server, [("ok", answer(knob="micro_batch_size", value=64))], mode="hybrid")
    ch = pol.propose(_ctx())
    assert ch.source == "hybrid" and ch.set == {"micro_batch_size": 2}


def test_hostile_contract_change_is_refused_by_the_gate(server, tmp_path):
    pol = _policy(server, [("ok", answer(knob="global_batch_size", value=16)), ("ok", answer())])
    r = tiny_recipe()
    cfg = TuneConfig.from_recipe(r, 10.0, max_trials=3)
    state = Tuner(r, backend=FakeBackend(), policy=pol, config=cfg, run_dir=tmp_path).run()
    refused = [x for x in state.records if x.outcome is TrialOutcome.REFUSED]
    assert refused and refused[0].change == {"global_batch_size": 16} and refused[0].source == "llm"
    assert refused[0].verdict and refused[0].verdict["admitted"] is False
    assert all(x.knobs.get("global_batch_size") is None for x in state.records)
    assert state.baseline.training.global_batch_size == 8
    launched = [x for x in state.records if x.kind == "candidate" and x.outcome is not TrialOutcome.REFUSED]
    assert launched and launched[0].change == {"nproc_per_node": 2}


def test_fake_chat_stop_without_moves_stops():
    r = tiny_recipe()
    r = r.model_copy(update={"tuning": r.tuning.model_copy(update={"search_space": ("compile_mode",)})})
    ctx = context(r, [baseline_record(r)])
    pol = LLMPolicy(FakeChat([answer(knob=None, value=None, stop=True)]), playbook=PlaybookPolicy(high_value_gain=0.5))
    out = pol.propose(ctx)
    assert isinstance(out, Stop) and "usage" in out.reason
