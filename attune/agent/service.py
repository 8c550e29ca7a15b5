"""The agent sidecar: an aiohttp app serving :mod:`attune.agent.protocol` (stateless, like Katib suggestions).

Each ``POST /v1/propose`` carries the whole run, so the policy is rebuilt per request from the records.
Requests are validated (422 with per-field errors); at most ``max_concurrency`` proposals run at once and
a request beyond that is answered 503 with ``Retry-After`` rather than queued.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ValidationError

from attune.agent.lessons import LessonStore, record_run
from attune.agent.protocol import ObserveRequest, ProposeRequest, ProposeResponse
from attune.engine.loop import RunState, TuneConfig, policy_context
from attune.engine.policy import Policy, PolicyContext, Stop
from attune.errors import AttuneError
from attune.recipe.change import signature
from attune.recipe.io import parse_recipe

log = logging.getLogger(__name__)

PolicyFactory = Callable[[str, int], Policy]
POLICY_NAMES = ("playbook", "llm", "hybrid", "coordinate", "random")


def default_factory(lessons: LessonStore | None, llm_options: dict[str, Any] | None = None) -> PolicyFactory:
    """Build policies with ``attune.policies.make_policy``, sharing the lessons store and LLM settings."""

    def build(name: str, seed: int) -> Policy:
        from attune.policies import make_policy

        if name in ("playbook", "llm", "hybrid"):
            return make_policy(name, seed=seed, lessons=lessons if lessons is not None else False,
                               **(llm_options or {}))
        return make_policy(name, seed=seed)

    return build


def _errors(err: ValidationError) -> list[dict[str, Any]]:
    return [{"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]} for e in err.errors()]


def _recipe_errors(err: AttuneError, where: str) -> list[dict[str, Any]]:
    """One 422 entry per recipe problem (``field: message`` lines of a RecipeError)."""
    problems = getattr(err, "problems", None) or []
    out = []
    for line in problems:
        field, sep, msg = str(line).partition(": ")
        loc = [where, *field.strip().split(".")] if sep else [where]
        out.append({"loc": loc, "msg": msg if sep else str(line), "type": "recipe_invalid"})
    return out or [{"loc": [where], "msg": str(err), "type": "recipe_invalid"}]


def _unprocessable(errors: list[dict[str, Any]]) -> web.Response:
    return web.json_response({"detail": errors}, status=422)


async def _parse(request: web.Request, model: type[BaseModel]) -> Any:
    try:
        body = await request.json()
    except ValueError:
        return _unprocessable([{"loc": ["body"], "msg": "the body is not valid JSON", "type": "json_invalid"}])
    try:
        return model.model_validate(body)
    except ValidationError as err:
        return _unprocessable(_errors(err))


def build_context(req: ProposeRequest) -> PolicyContext:
    """A :class:`PolicyContext` from a stateless request, built by the engine's own ``policy_context``
    (the gate pre-check included), with the caller's noise floor and budget."""
    baseline = parse_recipe(req.baseline, "request.baseline")
    space = tuple(req.search_space) or tuple(n for n, k in baseline.catalogue.knobs.items() if len(k.values) > 1)
    records = list(req.records)
    used = sum(r.charged_hours for r in records)
    config = TuneConfig.from_recipe(baseline, used + max(req.budget_left_hours, 0.0), search_space=space)
    ctx = policy_context(RunState(baseline=baseline, config=config, records=records))
    if req.best is not None and not any(r.accepted for r in records):
        best = parse_recipe(req.best, "request.best")
        if signature(best) != signature(ctx.best):
            raise AttuneError("request.best differs from the best recipe the records imply; send the records "
                              "that accepted it, or leave best out")
    return dataclasses.replace(ctx, noise_floor=req.noise_floor, budget_left_hours=req.budget_left_hours)


def make_app(*, lessons: LessonStore | None = None, max_concurrency: int = 4,
             policy_factory: PolicyFactory | None = None, llm_options: dict[str, Any] | None = None) -> web.Application:
    """The sidecar's aiohttp application."""
    factory = policy_factory or default_factory(lessons, llm_options)
    sem = asyncio.Semaphore(max(1, max_concurrency))
    app = web.Application(client_max_size=32 * 1024 * 1024)

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "policies": list(POLICY_NAMES)})

    async def propose(request: web.Request) -> web.Response:
        if sem.locked():
            return web.json_response({"detail": "the agent is busy; retry shortly"}, status=503,
                                     headers={"Retry-After": "1"})
        async with sem:
            req = await _parse(request, ProposeRequest)
            if not isinstance(req, ProposeRequest):
                return req
            try:
                ctx = build_context(req)
            except AttuneError as err:
                return _unprocessable(_recipe_errors(err, "best" if "request.best" in str(err) else "baseline"))
            except ValidationError as err:
                return _unprocessable(_errors(err))
            policy = factory(req.policy, req.seed)
            try:
                result = await asyncio.to_thread(policy.propose, ctx)
            except Exception as err:  # noqa: BLE001 - answer 500 with the reason, keep serving
                log.exception("policy %s failed", req.policy)
                return web.json_response({"detail": f"policy failed: {type(err).__name__}: {err}"}, status=500)
            if isinstance(result, Stop):
                resp = ProposeResponse(action="stop", reason=result.reason, source=policy.name)
            else:
                resp = ProposeResponse(action="change", change=dict(result.set), rationale=result.rationale,
                                       source=result.source or policy.name)
            return web.json_response(resp.model_dump(mode="json"))

    async def observe(request: web.Request) -> web.Response:
        req = await _parse(request, ObserveRequest)
        if not isinstance(req, ObserveRequest):
            return req
        if not req.finished or lessons is None:
            return web.json_response({"ok": True, "lessons": 0})
        try:
            baseline = parse_recipe(req.baseline, "request.baseline")
        except AttuneError as err:
            return _unprocessable(_recipe_errors(err, "baseline"))
        from attune.engine.loop import RunState, TuneConfig

        state = RunState(baseline=baseline, config=TuneConfig(budget_hours=0.0, search_space=()),
                         records=list(req.records), finished="observed")
        touched = await asyncio.to_thread(record_run, state, lessons)
        return web.json_response({"ok": True, "lessons": len(touched)})

    app.router.add_get("/healthz", healthz)
    app.router.add_post("/v1/propose", propose)
    app.router.add_post("/v1/observe", observe)
    return app


__all__ = ["build_context", "default_factory", "make_app"]
