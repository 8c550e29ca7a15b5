"""An OptiCo-style LLM-agent tuner: cooperating LLM roles sharing one message pool, whole configurations.

OptiCo-like systems tune a training job with a small team of LLM agents that talk through a shared message pool
instead of one model answering alone. This anchor does the same against any OpenAI-compatible endpoint
(:class:`~attune.agent.chat.OpenAIChat`), inside attune's engine, at equal budget and behind the benchmark's gate:

1. the **analyst** reads the pool (every earlier message and every trial's result, posted by the engine) and posts
   what limits the best configuration so far;
2. the **planner** reads the pool and proposes a *whole configuration* of the search space;
3. the **reviewer** reads the pool and the planner's proposal together with the gate's and the memory model's
   verdict on it, and approves it or changes one knob.

Each role answers one JSON object whose schema is built from the catalogue (knob names and each knob's legal
values as enums, bounded free text), so a constrained decoder can only emit a well-formed answer; every answer is
still validated. A configuration the gate would refuse goes back to the planner with the refusal (``max_attempts``);
if none is admissible the policy proposes a seeded random admissible configuration and records that it had to.
Per proposal it records the tokens, seconds, calls and whether it fell back (``usage_log``, ``stats``). It stops
after ``iterations`` proposals (about twenty, as OptiCo's runs).
"""

from __future__ import annotations

import json
import logging
import random
import time
from typing import Any

from attune.agent.chat import ChatClient, ChatError, Usage
from attune.engine.policy import Policy, PolicyContext, Stop
from attune.policies.llm import estimate_tokens
from attune.recipe.catalogue import KnobValue
from attune.recipe.change import Change, apply_change
from attune.trial import TrialOutcome, TrialRecord

log = logging.getLogger(__name__)

BOTTLENECKS = ("memory", "compute", "tensor_parallel_communication", "data_parallel_communication",
               "pipeline_bubble", "expert_all_to_all", "host_overhead", "unknown")
TEXT_MAX = 160


class OptiCoPolicy(Policy):
    """Analyst, planner and reviewer LLM roles sharing a message pool; one whole configuration per proposal."""

    name = "optico"

    def __init__(self, chat: ChatClient, *, iterations: int = 20, max_attempts: int = 2, pool_size: int = 16,
                 seed: int = 0, max_prompt_tokens: int | None = None) -> None:
        self.chat = chat
        self.iterations = iterations
        self.max_attempts = max(1, max_attempts)
        self.pool_size = pool_size
        self.max_prompt_tokens = max_prompt_tokens
        self._rng = random.Random(seed)
        self.pool: list[dict[str, str]] = []
        self.proposals = 0
        self.usage_log: list[dict[str, Any]] = []
        self.stats = {"proposals": 0, "llm_calls": 0, "invalid_answers": 0, "refused_plans": 0, "fallbacks": 0}
        self._domains: dict[str, list[KnobValue]] | None = None

    @classmethod
    def from_env(cls, seed: int = 0, **options: Any) -> OptiCoPolicy:
        """The policy against ``ATTUNE_LLM_BASE_URL`` (model, key, timeout and context from ``ATTUNE_LLM_*``)."""
        from attune.agent.chat import OpenAIChat

        return cls(OpenAIChat(), seed=seed, **options)

    # -- prompts ------------------------------------------------------------------------------------------
    def _domains_of(self, ctx: PolicyContext) -> dict[str, list[KnobValue]]:
        if self._domains is None:
            from attune.policies.optuna import admissible_domains

            self._domains = admissible_domains(ctx.baseline, ctx.search_space)
        return self._domains

    def _budget(self) -> int:
        ask = getattr(self.chat, "context_window", None)
        window = ask() if callable(ask) else None
        answer = int(getattr(self.chat, "max_tokens", 0) or 400)
        fitted = max(256, int(window) - answer - 128) if window else 6000
        return min(fitted, self.max_prompt_tokens) if self.max_prompt_tokens else fitted

    def _context_text(self, ctx: PolicyContext, pool_items: int) -> str:
        r = ctx.best
        domains = self._domains_of(ctx)
        knobs = {k: {"best": ctx.best.knob(k), "values": v} for k, v in domains.items()}
        head: dict[str, Any] = {"recipe": r.name, "devices": f"{r.resources.devices} x {r.resources.accelerator}"}
        if r.model is not None:
            head["model"] = {"layers": r.model.layers, "hidden": r.model.hidden_size, "experts": r.model.moe_experts}
        if r.training is not None:
            head["batch"] = {"global": r.training.global_batch_size, "seq": r.training.seq_length}
        pool = self.pool[-pool_items:] if pool_items else []
        return json.dumps({"job": head, "search_space": knobs, "best_tokens_per_s_per_device":
                           round(ctx.best_measurement.tokens_per_s_per_device, 1) if ctx.best_measurement else None,
                           "message_pool": pool}, default=str, separators=(",", ":"))

    def _ask(self, role: str, task: str, schema: dict[str, Any], ctx: PolicyContext, usage: list[Usage],
             extra: str = "") -> dict[str, Any] | None:
        budget = self._budget()
        for items in (self.pool_size, self.pool_size // 2, 4, 1, 0):
            text = self._context_text(ctx, items)
            messages = [{"role": "system", "content": f"You are the {role} of a team tuning the throughput of an "
                                                       f"LLM training job. {task} Answer with one JSON object only."},
                        {"role": "user", "content": text + (("\n" + extra) if extra else "")}]
            if estimate_tokens(json.dumps(messages)) <= budget:
                break
        self.stats["llm_calls"] += 1
        try:
            reply = self.chat.complete(messages, schema=schema)
        except ChatError as err:
            usage.append(err.usage)
            self.stats["invalid_answers"] += 1
            log.warning("optico %s: %s", role, err)
            return None
        usage.append(reply.usage)
        try:
            data = json.loads(reply.text)
        except json.JSONDecodeError:
            self.stats["invalid_answers"] += 1
            return None
        if not isinstance(data, dict) or reply.finish_reason == "length":
            self.stats["invalid_answers"] += 1
            return None
        return data

    def _analyst(self, ctx: PolicyContext, usage: list[Usage]) -> None:
        schema = {"type": "object", "additionalProperties": False, "required": ["bottleneck", "observation"],
                  "properties": {"bottleneck": {"enum": list(BOTTLENECKS)},
                                 "observation": {"type": "string", "maxLength": TEXT_MAX}}}
        data = self._ask("analyst", "Read the message pool and say what limits the best configuration so far.",
                         schema, ctx, usage)
        if data and data.get("bottleneck") in BOTTLENECKS:
            self._post("analyst", f"bottleneck {data['bottleneck']}: {str(data.get('observation', ''))[:TEXT_MAX]}")

    def _planner(self, ctx: PolicyContext, usage: list[Usage], feedback: str = "") -> dict[str, KnobValue] | None:
        domains = self._domains_of(ctx)
        schema = {"type": "object", "additionalProperties": False, "required": ["config", "rationale"],
                  "properties": {"config": {"type": "object", "additionalProperties": False,
                                            "required": list(domains),
                                            "properties": {k: {"enum": v} for k, v in domains.items()}},
                                 "rationale": {"type": "string", "maxLength": TEXT_MAX}}}
        data = self._ask("planner", "Propose the next whole configuration to measure (every knob of the search "
                                    "space), different from every configuration in the pool.", schema, ctx, usage,
                         feedback)
        config = data.get("config") if data else None
        if not isinstance(config, dict):
            return None
        out = {}
        for k, vals in domains.items():
            v = config.get(k)
            if not any(type(v) is type(u) and v == u for u in vals):
                self.stats["invalid_answers"] += 1
                return None
            out[k] = v
        why = str((data or {}).get("rationale", ""))[:TEXT_MAX]
        self._post("planner", f"proposes {json.dumps(out, default=str)}: {why}")
        return out

    def _reviewer(self, ctx: PolicyContext, config: dict[str, KnobValue], verdict: str,
                  usage: list[Usage]) -> dict[str, KnobValue]:
        domains = self._domains_of(ctx)
        values: list[Any] = []
        for vals in domains.values():
            for v in vals:
                if not any(type(v) is type(u) and v == u for u in values):
                    values.append(v)
        schema = {"type": "object", "additionalProperties": False,
                  "required": ["approve", "fix_knob", "fix_value", "note"],
                  "properties": {"approve": {"type": "boolean"}, "fix_knob": {"enum": [*domains, None]},
                                 "fix_value": {"enum": values}, "note": {"type": "string", "maxLength": TEXT_MAX}}}
        data = self._ask("reviewer", "Check the planner's configuration against the gate's verdict and the pool; "
                                     "approve it, or change one knob.", schema, ctx, usage,
                         f"planner's configuration: {json.dumps(config, default=str)}; gate: {verdict}")
        if not data:
            return config
        knob, value = data.get("fix_knob"), data.get("fix_value")
        if not data.get("approve") and knob in domains and any(type(value) is type(u) and value == u
                                                               for u in domains[knob]):
            self._post("reviewer", f"sets {knob}={value}: {str(data.get('note', ''))[:TEXT_MAX]}")
            return {**config, knob: value}
        self._post("reviewer", f"approves: {str(data.get('note', ''))[:TEXT_MAX]}")
        return config

    def _post(self, author: str, text: str) -> None:
        self.pool.append({"from": author, "text": text})

    @staticmethod
    def _verdict(ctx: PolicyContext, config: dict[str, KnobValue]) -> str:
        if ctx.admissible(config):
            try:
                cand = apply_change(ctx.best, config)
            except Exception:  # noqa: BLE001 - admissible already checked it is a recipe
                return "admissible"
            why = cand.catalogue.predicts_infeasible(cand)
            return f"admissible, but {why}" if why else "admissible"
        return "refused (a catalogue constraint, the training contract, or a configuration already measured)"

    # -- the Policy interface ---------------------------------------------------------------------------------
    def propose(self, ctx: PolicyContext) -> Change | Stop:
        if self.proposals >= self.iterations:
            return Stop(f"OptiCo-style team: {self.iterations} iterations done")
        self.proposals += 1
        self.stats["proposals"] += 1
        t0 = time.monotonic()
        usage: list[Usage] = []
        self._analyst(ctx, usage)
        config, feedback = None, ""
        for _ in range(self.max_attempts):
            plan = self._planner(ctx, usage, feedback)
            if plan is None:
                feedback = "The last answer was not a valid configuration; use only the listed values."
                continue
            verdict = self._verdict(ctx, plan)
            plan = self._reviewer(ctx, plan, verdict, usage)
            if ctx.admissible(plan):
                config = plan
                break
            self.stats["refused_plans"] += 1
            feedback = f"The gate refused {json.dumps(plan, default=str)}; propose another configuration."
            self._post("engine", feedback)
        fallback = config is None
        if config is None:
            config = self._random_admissible(ctx)
            self.stats["fallbacks"] += 1
            if config is None:
                return Stop("OptiCo-style team: no admissible configuration left")
        total = Usage()
        for u in usage:
            total += u
        seconds = time.monotonic() - t0
        self.usage_log.append({"model": getattr(self.chat, "model", "-"), "prompt_tokens": total.prompt_tokens,
                               "completion_tokens": total.completion_tokens, "calls": len(usage),
                               "seconds": round(seconds, 3), "fallback": fallback})
        why = "random admissible configuration (no admissible plan from the team)" if fallback else "team plan"
        return Change(set=config, source=self.name,
                      rationale=f"optico iteration {self.proposals}: {why} [usage prompt_tokens={total.prompt_tokens} "
                                f"completion_tokens={total.completion_tokens} calls={len(usage)} "
                                f"seconds={seconds:.2f} fallback={int(fallback)}]")

    def _random_admissible(self, ctx: PolicyContext, draws: int = 600) -> dict[str, KnobValue] | None:
        domains = self._domains_of(ctx)
        for _ in range(draws):
            config = {k: self._rng.choice(v) for k, v in domains.items()}
            if ctx.admissible(config):
                return config
        return None

    def observe(self, record: TrialRecord) -> None:
        if record.kind not in ("candidate", "baseline"):
            return
        if record.kind == "baseline" and any(m.get("from") == "engine" and "baseline" in m.get("text", "")
                                             for m in self.pool):
            return
        tps = f"{record.throughput:.1f} tokens/s/device" if record.throughput else record.outcome.value
        if record.outcome is TrialOutcome.REFUSED:
            tps = "refused by the gate"
        what = "baseline" if record.kind == "baseline" else json.dumps(record.change, default=str)
        self._post("engine", f"trial {record.id} {what}: {tps}; {record.decision[:80]}")


__all__ = ["OptiCoPolicy"]
