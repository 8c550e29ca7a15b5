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

Token use is recorded per proposal at the end of the rationale, as
``[usage model=M prompt_tokens=P completion_tokens=C attempts=N]`` (:func:`parse_usage` reads it back), so it
lands in the journal's trial record and survives ``--resume``; ``LLMPolicy.usage_log`` keeps it in memory.

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
from attune.agent.playbook import PlaybookPolicy
from attune.engine.policy import Policy, PolicyContext, Stop
from attune.recipe.catalogue import KnobValue
from attune.recipe.change import Change

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

_USAGE_RE = re.compile(r"\[usage model=(?P<model>\S*) prompt_tokens=(?P<p>\d+) completion_tokens=(?P<c>\d+) "
                       r"attempts=(?P<a>\d+)\]")


def parse_usage(rationale: str) -> dict[str, Any] | None:
    """The token-usage record embedded in a proposal's rationale, or ``None``."""
    m = _USAGE_RE.search(rationale or "")
    if not m:
        return None
    return {"model": m["model"], "prompt_tokens": int(m["p"]), "completion_tokens": int(m["c"]),
            "attempts": int(m["a"])}


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
                 max_history: int = 40) -> None:
        self.chat = chat
        self.playbook = playbook or PlaybookPolicy(lessons=lessons)
        self.lessons = lessons if lessons is not None else self.playbook.lessons
        self.mode = mode
        self.name = mode
        self.max_attempts = max(1, int(max_attempts))
        self.max_backoff_s = max_backoff_s
        self.max_history = max_history
        self.usage_log: list[dict[str, Any]] = []

    # -- the policy -------------------------------------------------------------------------------------
    def propose(self, ctx: PolicyContext) -> Change | Stop:
        diag = self.playbook.diagnosis(ctx)
        messages = self.build_messages(ctx, diag)
        usage = Usage()
        model = getattr(self.chat, "model", "") or ""
        failures: list[str] = []
        for attempt in range(1, self.max_attempts + 1):
            try:
                reply = self.chat.complete(messages, schema=ANSWER_SCHEMA)
            except ChatRateLimited as err:
                usage += err.usage
                failures.append("rate limited")
                if attempt < self.max_attempts:
                    time.sleep(min(self.max_backoff_s, err.retry_after_s if err.retry_after_s is not None else 1.0))
                continue
            except ChatError as err:
                usage += err.usage
                failures.append(f"{err.kind}: {err}")
                continue
            usage += reply.usage
            model = reply.model or model
            try:
                result = self._interpret(ctx, reply.text)
            except _Invalid as err:
                failures.append(str(err))
                messages = [*messages, {"role": "assistant", "content": reply.text[:4000]},
                            {"role": "user", "content": f"That answer was rejected: {err}. Answer again with one JSON "
                                                        "object matching the schema: exactly one knob."}]
                continue
            tag = self._usage_tag(model, usage, attempt)
            if isinstance(result, Stop):
                veto = self.playbook.veto_change(ctx, f"the model asked to stop: {result.reason}")
                if veto is not None:
                    return veto.model_copy(update={"source": "playbook-veto",
                                                   "rationale": f"{veto.rationale} {tag}"})
                return Stop(f"{result.reason} {tag}")
            return result.model_copy(update={"rationale": f"{result.rationale} {tag}".strip()})
        reason = _summarise(failures)
        log.warning("the LLM gave no usable proposal after %d attempt(s) (%s); falling back to the playbook "
                    "(recorded in the trial's source as playbook-fallback)", self.max_attempts, reason)
        fallback = self.playbook.propose(ctx)
        tag = self._usage_tag(model, usage, self.max_attempts)
        if isinstance(fallback, Stop):
            return Stop(f"{fallback.reason} (playbook-fallback: {reason}) {tag}")
        return fallback.model_copy(update={"source": f"playbook-fallback: {reason}",
                                           "rationale": f"{fallback.rationale} {tag}"})

    def _usage_tag(self, model: str, usage: Usage, attempts: int) -> str:
        entry = {"model": model or "-", "prompt_tokens": usage.prompt_tokens,
                 "completion_tokens": usage.completion_tokens, "attempts": attempts}
        self.usage_log.append(entry)
        return (f"[usage model={entry['model']} prompt_tokens={usage.prompt_tokens} "
                f"completion_tokens={usage.completion_tokens} attempts={attempts}]")

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
    def build_messages(self, ctx: PolicyContext, diag: Diagnosis) -> list[dict[str, str]]:
        """System and user messages for one proposal."""
        cat = ctx.catalogue
        knobs = [{"name": n, "current": ctx.best.knob(n), "values": list(cat[n].values),
                  "semantics": cat[n].semantics.value, "group": cat[n].coupling_group,
                  "description": cat[n].description} for n in ctx.search_space if n in cat]
        constraints = [{"name": c.name, "knobs": list(c.knobs), "rule": c.description} for c in cat.constraints]
        history = []
        for r in list(ctx.records)[-self.max_history:]:
            history.append({"id": r.id, "kind": r.kind, "change": r.change, "outcome": r.outcome.value,
                            "tokens_per_s_per_device": round(r.throughput, 2) if r.throughput else None,
                            "gain": None if r.gain is None else round(r.gain, 4), "decision": r.decision,
                            "source": r.source})
        base = ctx.baseline.effective_knobs
        tested = sorted({json.dumps({k: v for k, v in r.knobs.items() if base.get(k) != v}, sort_keys=True, default=str)
                         for r in ctx.records if r.knobs})
        candidates = [{"change": c.change, "tier": c.tier, "expected_gain": round(c.expected_gain, 4)}
                      for c in self.playbook.candidates(ctx, diag)[:8]]
        lessons = []
        if self.lessons is not None:
            try:
                lessons = [{"id": lz.id, "summary": lz.summary(), "match": round(m, 2)}
                           for lz, m in self.lessons.in_scope(
                               ctx.baseline, backend=ctx.backend,
                               include_simulated=self.playbook.include_simulated_lessons)[:12]]
            except Exception as err:  # noqa: BLE001 - lessons are advice, never a failure
                log.warning("lessons unavailable: %s", err)
        recipe = ctx.best.model_dump(mode="json", exclude={"tuning"})
        payload = {
            "recipe": recipe, "search_space": knobs, "constraints": constraints, "diagnosis": diag.to_dict(),
            "noise_floor": round(ctx.noise_floor, 4), "budget_left_accelerator_hours": round(ctx.budget_left_hours, 4),
            "history": history, "tested_configurations_vs_baseline": tested,
            "playbook_candidates": candidates, "lessons_in_scope": lessons,
        }
        task = ("Pick the knob family (one knob name) most likely to raise throughput; the value is chosen for you."
                if self.mode == "hybrid" else
                "Propose exactly one knob and one legal value (adjacent values are safest).")
        system = (
            "You tune the throughput (tokens/s per device) of an LLM training recipe, one knob at a time. "
            "Every proposal is checked by a correctness gate and measured. Never repeat a tested configuration. "
            f"{task} Answer with ONE JSON object and nothing else, matching this JSON schema: "
            f"{json.dumps(ANSWER_SCHEMA)}. Set stop=true only when no move is worth a trial."
        )
        return [{"role": "system", "content": system},
                {"role": "user", "content": json.dumps(payload, default=str)}]


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


__all__ = ["ANSWER_SCHEMA", "LLMPolicy", "ProposalAnswer", "parse_usage"]
