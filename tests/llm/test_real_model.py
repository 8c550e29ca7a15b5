"""The LLM policy and the OptiCo-style baseline end to end through the real ``openai`` client against a real local model.

SmolLM2-135M-Instruct always answers valid JSON under the schema and never a sensible choice, so these tests check
the plumbing, not tuning quality: the server's context window is asked and respected (no HTTP 400), every answer is
schema-valid, bounded and validated, a knob is always one of the search space with one of *its* legal values, every
proposal records tokens, seconds and whether the playbook took over, and a whole tuning run completes on the
simulator. Do not read its tuning results as the LLM policy's quality.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest

from attune.agent.chat import OpenAIChat
from attune.backends.simulated import SimBackend
from attune.bench.oracle import oracle
from attune.bench.run import Job, parse_budget, run_job
from attune.bench.suite import load_suite
from attune.engine.loop import TuneConfig, Tuner
from attune.policies.llm import RATIONALE_MAX, LLMPolicy, answer_schema
from attune.policies.playbook import PlaybookPolicy
from attune.trial import TrialOutcome
from tests.agent.helpers import baseline_record, context
from tests.llm.conftest import CONTEXT

pytestmark = [pytest.mark.llm, pytest.mark.timeout(600)]

RECIPE = "llama3.2-1b-h100x8"


def _chat(url: str, **kw: object) -> OpenAIChat:
    return OpenAIChat(base_url=url, model="smollm2-135m", timeout_s=180.0, **kw)


def _recipe():
    return load_suite("suite", only=[RECIPE])[0].recipe


def test_the_server_says_its_context_window(llm_endpoint: str) -> None:
    assert _chat(llm_endpoint).context_window() == CONTEXT
    assert _chat(llm_endpoint, context_tokens=1024).context_window() == 1024  # a setting wins over the server


def test_schema_constrained_answers_are_valid_bounded_and_paired(llm_endpoint: str) -> None:
    r = _recipe()
    ctx = context(r, [baseline_record(r)])
    schema = answer_schema(ctx)
    chat = _chat(llm_endpoint)
    pol = LLMPolicy(chat, playbook=PlaybookPolicy(), max_prompt_tokens=900)
    messages = pol.build_messages(ctx, pol.playbook.diagnosis(ctx), max_tokens=900, schema=schema)
    reply = chat.complete(messages, schema=schema)
    assert reply.finish_reason != "length", "the bounded schema must never let an answer be cut off"
    data = json.loads(reply.text)  # always valid JSON
    assert set(data) == {"knob", "value", "rationale", "expected_gain", "stop"}
    assert len(data["rationale"]) <= RATIONALE_MAX
    if not data["stop"]:
        assert data["knob"] in r.tuning.search_space  # no invented knob names
        legal = r.catalogue[data["knob"]].values
        assert any(type(v) is type(data["value"]) and v == data["value"] for v in legal)  # its own legal value
        assert data["value"] != r.knob(data["knob"])


def test_llm_policy_tunes_end_to_end_with_the_real_model(llm_endpoint: str) -> None:
    r = _recipe()
    chat = _chat(llm_endpoint)
    pol = LLMPolicy(chat, playbook=PlaybookPolicy(), max_attempts=2, max_prompt_tokens=1500)
    cfg = TuneConfig.from_recipe(r, 1e6, max_trials=8)
    with tempfile.TemporaryDirectory() as tmp:
        state = Tuner(r, backend=SimBackend(seed=0, write_files=False), policy=pol, config=cfg,
                      run_dir=Path(tmp)).run()
    cands = [x for x in state.records if x.kind == "candidate"]
    assert cands and state.finished
    assert pol.usage_log and len(pol.usage_log) == len(cands)
    for rec, usage in zip(cands, pol.usage_log):
        details = rec.usage  # the journal's typed record of what the proposal cost
        assert details is not None and details.prompt_tokens > 0 and details.seconds >= 0
        assert details.fallback == rec.source.startswith("playbook"), rec.source
        # every prompt fitted the server's window: no HTTP 400, and the tokens the server counted fit
        assert usage["prompt_tokens"] / max(1, usage["attempts"]) < CONTEXT
        assert "unavailable" not in rec.source
        if rec.source == "llm":  # the model's own answer: a search-space knob, one of its legal values
            assert set(rec.change) <= set(r.tuning.search_space)
            for k, v in rec.change.items():
                assert r.catalogue[k].check_value(v) is None
        assert rec.outcome is not TrialOutcome.REFUSED or rec.source == "llm"


def test_a_small_context_window_is_respected(llm_endpoint: str) -> None:
    r = _recipe()
    chat = _chat(llm_endpoint, context_tokens=1200)
    pol = LLMPolicy(chat, playbook=PlaybookPolicy(), max_attempts=1)
    ctx = context(r, [baseline_record(r)])
    out = pol.propose(ctx)
    usage = pol.usage_log[-1]
    assert usage["prompt_tokens"] <= 1200 - chat.max_tokens, usage  # the real tokenizer's count fits
    assert "unavailable" not in getattr(out, "source", "")


def test_optico_baseline_runs_end_to_end_with_the_real_model(llm_endpoint: str,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ATTUNE_LLM_BASE_URL", llm_endpoint)
    monkeypatch.setenv("ATTUNE_LLM_TIMEOUT_S", "180")
    monkeypatch.setenv("ATTUNE_LLM_CONTEXT_TOKENS", "1536")
    case = load_suite("suite", only=[RECIPE])[0]
    o = oracle(case.recipe)
    import attune.policies.optico as optico

    monkeypatch.setattr(optico.OptiCoPolicy, "from_env",
                        classmethod(lambda cls, seed=0, **kw: cls(_chat(llm_endpoint, context_tokens=1536),
                                                                  seed=seed, iterations=1, max_attempts=1)))
    res = run_job(Job(case=case, tuner="optico", seed=0, budget_hours=parse_budget("12t", case.recipe),
                      optimum_tps=o.optimum_tps, budget="12t"))
    assert res["available"], res.get("error")
    stats = res["policy_stats"]
    assert stats["proposals"] == 1 and stats["llm_calls"] >= 2  # analyst, planner (and reviewer when it planned)
    assert stats["llm_proposals"] == 1 and "llm_fallbacks" in stats
    assert stats["llm_tokens"] > 0 and stats["llm_seconds"] > 0
    assert res["budget_used_hours"] <= res["budget_hours"] * (1 + 1e-9)
    assert not res["outside_search_space"]
