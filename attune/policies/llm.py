"""The LLM policy: an OpenAI-compatible model proposes one knob move; the playbook catches every failure.

The prompt carries the recipe, the search-space knobs with their domains, semantics and the catalogue's
constraints, the diagnosis, the trial history (with every tested configuration), the playbook's own
ranked candidates and the lessons in scope. The answer must be one JSON object
(:class:`ProposalAnswer`: one knob, its value, a rationale, the expected gain, a stop flag), validated
with pydantic. Malformed JSON, two knobs, an unknown knob, an illegal or inadmissible value, timeouts,
rate limits and refusals are retried (with the error fed back) up to ``max_attempts``; then the
playbook proposes instead and the Change's ``source`` says ``playbook-fallback: <reason>``.

Safety does not rest on the prompt: a move of a *training-contract* field (``global_batch_size``,
``lr``...) is handed to the engine unchanged, so the **gate** refuses it and the refusal is journaled.

The response schema is built from the catalogue (:func:`answer_schema`): the knob is an enum of the search space,
the value an enum of those knobs' legal values, the rationale's length bounded, so a constrained decoder (llama.cpp,
vLLM, OpenAI structured outputs) can only emit a well-formed, short answer with a real knob name and a legal value;
the answer is still validated (the value must be legal *for that knob*, and admissible). The prompt is fitted to
the endpoint's context window (the server's own figure, or ``ATTUNE_LLM_CONTEXT_TOKENS``): history, candidates,
lessons and knob descriptions are shortened until it fits with room for the answer, and an endpoint that still
says the prompt is too long gets a smaller one on the next attempt. An answer cut off by the token limit is retried.

Per proposal, tokens, seconds and whether the playbook had to take over are a typed record on the proposal
(``Change.usage``, an :class:`~attune.trial.LLMUsage`), so they land in the journal's trial record
(``TrialRecord.usage``) and survive ``--resume``; the rationale shows them to a person as
``[usage model=M prompt_tokens=P completion_tokens=C attempts=N seconds=S playbook=0|1]``, and
``LLMPolicy.usage_log`` keeps them in memory.

In ``hybrid`` mode the model only picks the knob (family); the playbook picks the value.
"""

from __future__ import annotations

import json
import logging
import re
import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from attune.agent.chat import ChatClient, ChatError, ChatRateLimited, Usage
from attune.agent.diagnose import Diagnosis
from attune.agent.lessons import LessonStore
from attune.engine.policy import Policy, PolicyContext, Stop
from attune.policies.playbook import PlaybookPolicy
from attune.recipe.catalogue import KnobValue
from attune.recipe.change import Change
from attune.trial import LLMUsage, TrialOutcome

log = logging.getLogger(__name__)


class ProposalAnswer(BaseModel):
    """The model's answer: exactly one knob and value (or a stop), with why and how much it expects."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    knob: str | None = Field(default=None, description="one knob name from the search space")
    value: KnobValue = Field(default=None, description="its new value (ignored in hybrid mode)")
    rationale: str = Field(default="", max_length=2000)
    expected_gain: float | None = Field(default=None, ge=-1.0, le=10.0, description="expected relative gain")
    stop: bool = Field(default=False, description="true if no justified move is left")


ANSWER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["knob", "value", "rationale", "expected_gain", "stop"],
    "properties": {
        "knob": {"type": ["string", "null"]},
        "value": {"type": ["string", "number", "integer", "boolean", "null"]},
        "rationale": {"type": "string"},
        "expected_gain": {"type": ["number", "null"]},
        "stop": {"type": "boolean"},
    },
}

RATIONALE_MAX = 160
"""Characters the schema allows the model's rationale (a bounded answer is never cut off mid-string)."""
CHARS_PER_TOKEN = 3.0
"""Conservative characters per token for JSON-heavy prompts (no tokenizer is assumed on the client)."""
DEFAULT_PROMPT_TOKENS = 6000
"""Prompt budget when the endpoint does not say its context window."""


def _usage_tag(spent: LLMUsage) -> str:
    """The usage as the rationale shows it to a person (machines read ``Change.usage`` / ``TrialRecord.usage``)."""
    return (f"[usage model={spent.model} prompt_tokens={spent.prompt_tokens} "
            f"completion_tokens={spent.completion_tokens} attempts={spent.attempts} seconds={spent.seconds:.2f} "
            f"playbook={int(spent.fallback)}]")


def estimate_tokens(text: str) -> int:
    """A conservative token count of ``text`` (no tokenizer on the client)."""
    return int(len(text) / CHARS_PER_TOKEN) + 1


def answer_schema(ctx: PolicyContext, mode: str = "llm", rationale_max: int = RATIONALE_MAX, *,
                  paired: bool = True) -> dict[str, Any]:
    """The response schema of one proposal, from the catalogue, with the rationale's length bounded.

    ``paired`` (the default, for llama.cpp, vLLM and other constrained decoders): one branch per search-space knob,
    its name a constant and its value an enum of *that knob's* legal values other than the current one, plus a stop
    branch, so a decoder cannot pair a knob with another knob's value. Unpaired (OpenAI's strict mode allows no
    top-level ``anyOf``): the knob an enum of the search space, the value an enum of all their values. In hybrid
    mode the value is free (the playbook picks it).
    """
    cat = ctx.catalogue
    knobs = [k for k in ctx.search_space if k in cat]
    text = {"type": "string", "maxLength": rationale_max}
    gain = {"type": ["number", "null"], "minimum": -1, "maximum": 10}
    required = ["knob", "value", "rationale", "expected_gain", "stop"]
    if paired and knobs:
        branches = []
        for k in knobs:
            vals = [v for v in cat[k].values if not (type(v) is type(ctx.best.knob(k)) and v == ctx.best.knob(k))]
            if not vals:
                continue
            value: dict[str, Any] = {"enum": vals} if mode != "hybrid" else {"type": ["string", "integer", "boolean",
                                                                                        "null"]}
            branches.append({"type": "object", "additionalProperties": False, "required": required,
                             "properties": {"knob": {"const": k}, "value": value, "rationale": text,
                                            "expected_gain": gain, "stop": {"const": False}}})
        branches.append({"type": "object", "additionalProperties": False, "required": required,
                         "properties": {"knob": {"type": "null"}, "value": {"type": "null"}, "rationale": text,
                                        "expected_gain": gain, "stop": {"const": True}}})
        return {"type": "object", "anyOf": branches}
    values: list[Any] = [None]
    for k in knobs:
        for v in cat[k].values:
            if not any(type(v) is type(u) and v == u for u in values):
                values.append(v)
    return {
        "type": "object",
        "additionalProperties": False,
        "required": required,
        "properties": {
            "knob": {"enum": [*knobs, None]},
            "value": {"enum": values} if mode != "hybrid" else {"type": ["string", "integer", "boolean", "null"]},
            "rationale": text,
            "expected_gain": gain,
            "stop": {"type": "boolean"},
        },
    }


def _paired_schema(chat: Any) -> bool:
    """Whether the endpoint takes a top-level ``anyOf`` (everyone but OpenAI's own strict mode)."""
    from urllib.parse import urlparse

    from attune.agent.chat import OPENAI_HOSTS

    url = getattr(chat, "base_url", "") or ""
    return urlparse(url).hostname not in OPENAI_HOSTS


def _contract_fields() -> set[str]:
    from attune.recipe.model import ModelSpec, OptimizerSpec, Resources, ScheduleSpec, TrainingContract

    names: set[str] = set()
    for prefix, model in (("training", TrainingContract), ("training.optimizer", OptimizerSpec),
                          ("training.schedule", ScheduleSpec), ("model", ModelSpec), ("resources", Resources)):
        for f in model.model_fields:
            names.update({f, f"{prefix}.{f}"})
    return names


class _Invalid(Exception):
    """An answer that must be retried; the message is fed back to the model."""


class LLMPolicy(Policy):
    """Asks a chat model for one move per trial, validated strictly; falls back to the playbook."""

    name = "llm"

    def __init__(self, chat: ChatClient, *, playbook: PlaybookPolicy | None = None, lessons: LessonStore | None = None,
                 mode: Literal["llm", "hybrid"] = "llm", max_attempts: int = 3, max_backoff_s: float = 5.0,
                 max_history: int = 40, max_prompt_tokens: int | None = None) -> None:
        self.chat = chat
        self.playbook = playbook or PlaybookPolicy(lessons=lessons)
        self.lessons = lessons if lessons is not None else self.playbook.lessons
        self.mode = mode
        self.name = mode
        self.max_attempts = max(1, int(max_attempts))
        self.max_backoff_s = max_backoff_s
        self.max_history = max_history
        #: an upper bound on the prompt's tokens whatever the endpoint's window (a slow local model answers faster)
        self.max_prompt_tokens = max_prompt_tokens
        self.usage_log: list[dict[str, Any]] = []

    # -- the policy -------------------------------------------------------------------------------------
    def propose(self, ctx: PolicyContext) -> Change | Stop:
        t0 = time.monotonic()
        diag = self.playbook.diagnosis(ctx)
        schema = answer_schema(ctx, self.mode, paired=_paired_schema(self.chat))
        budget = self.prompt_budget(schema)
        messages = self.build_messages(ctx, diag, max_tokens=budget, schema=schema)
        usage = Usage()
        model = getattr(self.chat, "model", "") or ""
        failures: list[str] = []
        for attempt in range(1, self.max_attempts + 1):
            try:
                reply = self.chat.complete(messages, schema=schema)
            except ChatRateLimited as err:
                usage += err.usage
                failures.append("rate limited")
                if attempt < self.max_attempts:
                    time.sleep(min(self.max_backoff_s, err.retry_after_s if err.retry_after_s is not None else 1.0))
                continue
            except ChatError as err:
                usage += err.usage
                failures.append(f"{err.kind}: {err}")
                if getattr(err, "context_exceeded", False):  # the endpoint counts tokens differently: shrink
                    budget = max(256, budget // 2)
                    messages = self.build_messages(ctx, diag, max_tokens=budget, schema=schema)
                continue
            usage += reply.usage
            model = reply.model or model
            try:
                if reply.finish_reason == "length":
                    raise _Invalid("it was cut off by the token limit; answer with a shorter rationale")
                result = self._interpret(ctx, reply.text)
            except _Invalid as err:
                failures.append(str(err))
                messages = [*messages, {"role": "assistant", "content": reply.text[:1000]},
                            {"role": "user", "content": f"That answer was rejected: {err}. Answer again with one JSON "
                                                        "object matching the schema: exactly one knob."}]
                if estimate_tokens(json.dumps(messages)) > budget:
                    messages = [*self.build_messages(ctx, diag, max_tokens=budget // 2, schema=schema),
                                messages[-1]]
                continue
            spent = self._usage(model, usage, attempt, time.monotonic() - t0, fallback=False)
            tag = _usage_tag(spent)
            if isinstance(result, Stop):
                veto = self.playbook.veto_change(ctx, f"the model asked to stop: {result.reason}")
                if veto is not None:
                    return veto.model_copy(update={"source": "playbook-veto", "usage": spent,
                                                   "rationale": f"{veto.rationale} {tag}"})
                return Stop(f"{result.reason} {tag}")
            return result.model_copy(update={"rationale": f"{result.rationale} {tag}".strip(), "usage": spent})
        reason = _summarise(failures)
        log.warning("the LLM gave no usable proposal after %d attempt(s) (%s); falling back to the playbook "
                    "(recorded in the trial's source as playbook-fallback)", self.max_attempts, reason)
        fallback = self.playbook.propose(ctx)
        spent = self._usage(model, usage, self.max_attempts, time.monotonic() - t0, fallback=True)
        tag = _usage_tag(spent)
        if isinstance(fallback, Stop):
            return Stop(f"{fallback.reason} (playbook-fallback: {reason}) {tag}")
        return fallback.model_copy(update={"source": f"playbook-fallback: {reason}", "usage": spent,
                                           "rationale": f"{fallback.rationale} {tag}"})

    def prompt_budget(self, schema: dict[str, Any] | None = None) -> int:
        """Tokens the prompt may take: the endpoint's context window less room for the answer and a margin."""
        ask = getattr(self.chat, "context_window", None)
        window = None
        if callable(ask):
            try:
                window = ask()
            except Exception:  # noqa: BLE001 - an endpoint that cannot say gets the default
                window = None
        if not window:
            return self.max_prompt_tokens or DEFAULT_PROMPT_TOKENS
        answer = int(getattr(self.chat, "max_tokens", 0) or 400)
        fitted = max(256, int(window) - answer - 64)
        return min(fitted, self.max_prompt_tokens) if self.max_prompt_tokens else fitted

    def _usage(self, model: str, usage: Usage, attempts: int, seconds: float = 0.0,
               fallback: bool = False) -> LLMUsage:
        spent = LLMUsage(model=model or "-", prompt_tokens=usage.prompt_tokens,
                         completion_tokens=usage.completion_tokens, attempts=attempts, seconds=round(seconds, 3),
                         fallback=fallback)
        self.usage_log.append(spent.model_dump())
        return spent

    # -- answer checking ----------------------------------------------------------------------------------
    def _interpret(self, ctx: PolicyContext, text: str) -> Change | Stop:
        data = _parse_json(text)
        if isinstance(data.get("knob"), list) or any(k in data for k in ("knobs", "changes", "set")):
            raise _Invalid("it moves more than one knob; propose exactly one")
        try:
            answer = ProposalAnswer.model_validate(data)
        except ValidationError as err:
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'answer'}: {e['msg']}" for e in err.errors())
            raise _Invalid(f"it does not match the schema ({problems})") from None
        if answer.stop:
            return Stop(f"the model found no justified move: {answer.rationale or 'no reason given'}")
        if not answer.knob:
            raise _Invalid("it names no knob and does not stop")
        knob = answer.knob.strip()
        if "," in knob or " and " in knob:
            raise _Invalid("it moves more than one knob; propose exactly one")
        gain = f" (expected {answer.expected_gain:+.1%})" if answer.expected_gain is not None else ""
        rationale = f"{answer.rationale.strip()}{gain}"
        if knob not in ctx.catalogue:
            if knob in _contract_fields():
                # not filtered here on purpose: the gate refuses it, and the refusal is journaled
                return Change(set={knob: answer.value}, rationale=rationale, source=self.mode)
            raise _Invalid(f"'{knob}' is not a knob of the {ctx.catalogue.framework} catalogue")
        if knob not in ctx.search_space:
            raise _Invalid(f"'{knob}' is outside the search space ({', '.join(ctx.search_space)})")
        if self.mode == "hybrid":
            pick = self.playbook.best_value_for(ctx, knob)
            if pick is None:
                raise _Invalid(f"no admissible untried value of '{knob}' is left; pick another knob")
            return pick.model_copy(update={"source": "hybrid",
                                           "rationale": f"{rationale}; value by playbook: {pick.rationale}"})
        value = _coerce(ctx.catalogue[knob].type, answer.value)
        problem = ctx.catalogue[knob].check_value(value)
        if problem:
            raise _Invalid(f"{knob}: {problem}")
        if value == ctx.best.knob(knob):
            raise _Invalid(f"{knob} is already {value!r} in the current best recipe")
        change = self.playbook._admissible_change(ctx, knob, value)  # noqa: SLF001 - shared coupled completion
        if change is None:
            raise _Invalid(f"{knob}={value!r} was already tried or the gate would refuse it")
        return Change(set=change, rationale=rationale, source=self.mode)

    # -- the prompt --------------------------------------------------------------------------------------
    #: successively shorter prompts: (history records, playbook candidates, lessons, knob descriptions, recipe
    #: detail, tested configurations, constraints)
    LEVELS = ((40, 8, 12, True, "full", 200, True), (20, 6, 6, True, "full", 60, True),
              (12, 5, 3, False, "compact", 30, True), (8, 4, 0, False, "compact", 12, True),
              (5, 3, 0, False, "minimal", 6, False), (3, 2, 0, False, "minimal", 0, False),
              (1, 1, 0, False, "minimal", 0, False))

    def build_messages(self, ctx: PolicyContext, diag: Diagnosis, *, max_tokens: int | None = None,
                       schema: dict[str, Any] | None = None) -> list[dict[str, str]]:
        """System and user messages for one proposal, shortened until they fit ``max_tokens``."""
        schema = schema if schema is not None else answer_schema(ctx, self.mode)
        messages: list[dict[str, str]] = []
        for level in self.LEVELS:
            messages = self._messages(ctx, diag, schema, *level)
            if max_tokens is None or estimate_tokens(json.dumps(messages)) <= max_tokens:
                return messages
        return messages

    def _messages(self, ctx: PolicyContext, diag: Diagnosis, schema: dict[str, Any], n_history: int,
                  n_candidates: int, n_lessons: int, descriptions: bool, recipe_detail: str, n_tested: int,
                  with_constraints: bool) -> list[dict[str, str]]:
        cat = ctx.catalogue
        knobs = []
        for n in ctx.search_space:
            if n not in cat:
                continue
            k: dict[str, Any] = {"name": n, "current": ctx.best.knob(n), "values": list(cat[n].values)}
            if recipe_detail != "minimal":
                k.update(semantics=cat[n].semantics.value, group=cat[n].coupling_group)
            if descriptions:
                k["description"] = cat[n].description
            knobs.append(k)
        constraints = [{"name": c.name, "knobs": list(c.knobs), "rule": c.description} for c in cat.constraints
                       if set(c.knobs) & set(ctx.search_space)] if with_constraints else []
        history = []
        for r in list(ctx.records)[-n_history:] if n_history else []:
            item: dict[str, Any] = {"id": r.id, "kind": r.kind, "change": r.change, "outcome": r.outcome.value,
                                    "tokens_per_s_per_device": round(r.throughput, 2)
                                    if r.throughput and r.outcome is not TrialOutcome.MISMEASURED else None,
                                    "gain": None if r.gain is None else round(r.gain, 4)}
            if recipe_detail == "full":
                item.update(decision=r.decision, source=r.source)
            history.append(item)
        base = ctx.baseline.effective_knobs
        tested = sorted({json.dumps({k: v for k, v in r.knobs.items() if base.get(k) != v}, sort_keys=True, default=str)
                         for r in ctx.records if r.knobs})[-n_tested:] if n_tested else []
        candidates = [{"change": c.change, "tier": c.tier, "expected_gain": round(c.expected_gain, 4)}
                      for c in self.playbook.candidates(ctx, diag)[:n_candidates]] if n_candidates else []
        lessons = []
        if self.lessons is not None and n_lessons:
            try:
                lessons = [{"id": lz.id, "summary": lz.summary(), "match": round(m, 2)}
                           for lz, m in self.lessons.in_scope(
                               ctx.baseline, backend=ctx.backend,
                               include_simulated=self.playbook.include_simulated_lessons)[:n_lessons]]
            except Exception as err:  # noqa: BLE001 - lessons are advice, never a failure
                log.warning("lessons unavailable: %s", err)
        if recipe_detail == "full":
            recipe: dict[str, Any] = ctx.best.model_dump(mode="json", exclude={"tuning"})
        else:
            m, t, res = ctx.best.model, ctx.best.training, ctx.best.resources
            recipe = {"name": ctx.best.name, "framework": ctx.best.framework,
                      "resources": f"{res.devices} x {res.accelerator}"}
            if m is not None:
                recipe["model"] = {"layers": m.layers, "hidden_size": m.hidden_size, "heads": m.heads,
                                   "moe_experts": m.moe_experts}
            if t is not None:
                recipe["training"] = {"global_batch_size": t.global_batch_size, "seq_length": t.seq_length}
        payload = {
            "recipe": recipe, "search_space": knobs, "constraints": constraints,
            "diagnosis": diag.to_dict() if recipe_detail != "minimal" else diag.label(),
            "noise_floor": round(ctx.noise_floor, 4), "budget_left_accelerator_hours": round(ctx.budget_left_hours, 4),
            "history": history, "tested_configurations_vs_baseline": tested,
            "playbook_candidates": candidates, "lessons_in_scope": lessons,
        }
        task = ("Pick the knob family (one knob name) most likely to raise throughput; the value is chosen for you."
                if self.mode == "hybrid" else
                "Propose exactly one knob and one legal value of that knob (adjacent values are safest).")
        shape = (json.dumps(schema) if recipe_detail == "full" else
                 '{"knob": one search_space name or null, "value": one of its values, "rationale": short text, '
                 '"expected_gain": number, "stop": boolean}')
        system = (
            "You tune the throughput (tokens/s per device) of an LLM training recipe, one knob at a time. "
            "Every proposal is checked by a correctness gate and measured. Never repeat a tested configuration. "
            f"{task} Answer with ONE JSON object and nothing else, matching this JSON schema: "
            f"{shape}. Set stop=true only when no move is worth a trial."
        )
        return [{"role": "system", "content": system},
                {"role": "user", "content": json.dumps(payload, default=str, separators=(",", ":"))}]


def _parse_json(text: str) -> dict[str, Any]:
    s = (text or "").strip()
    fence = re.match(r"^```(?:json)?\s*(.*?)\s*```$", s, re.S)
    if fence:
        s = fence.group(1)
    try:
        data = json.loads(s)
    except json.JSONDecodeError as err:
        raise _Invalid(f"it is not valid JSON ({err.msg} at char {err.pos})") from None
    if isinstance(data, list):
        raise _Invalid("it moves more than one knob; propose exactly one" if len(data) > 1
                       else "it is a JSON list, not an object")
    if not isinstance(data, dict):
        raise _Invalid("it is not a JSON object")
    return data


def _coerce(kind: str, value: Any) -> Any:
    if kind == "int" and isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    if kind == "int" and isinstance(value, float) and value.is_integer():
        return int(value)
    if kind == "bool" and isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    if kind == "choice" and isinstance(value, str) and value.lower() in ("none", "null"):
        return None
    return value


def _summarise(failures: list[str]) -> str:
    if not failures:
        return "no answer"
    counts: dict[str, int] = {}
    for f in failures:
        counts[f] = counts.get(f, 0) + 1
    return "; ".join(f"{f} ×{n}" if n > 1 else f for f, n in counts.items())[:300]


__all__ = ["ANSWER_SCHEMA", "LLMPolicy", "ProposalAnswer", "answer_schema", "estimate_tokens"]
