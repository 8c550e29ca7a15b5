"""The agent sidecar: an aiohttp app serving :mod:`attune.agent.protocol` (stateless, like Katib suggestions).

Each ``POST /v1/propose`` carries the whole run, so the policy is rebuilt per request from the records.
A request may carry its tenant's lessons (``lessons``: the operator keeps each namespace's lessons in that
namespace and sends them with each proposal): the policy then steers by those alone, for that request only, and
the sidecar's own store is neither read nor written, so one sidecar serves many tenants without holding their state.
Both endpoints check a run the way the engine would (:func:`check_run`): the body is bounded (bytes and JSON
nesting), the baseline is parsed as a recipe, every record's numbers must be finite and its knobs legal
values of the framework's catalogue, and the search space must name catalogue knobs; anything else is a 422
with per-field errors. At most ``max_concurrency`` proposals run at once and a request beyond that is answered
503 with ``Retry-After`` rather than queued. Nothing is ever answered 500: an unexpected exception is logged
and answered with a JSON error (422 while reading the request, 503 once the policy or the lessons store runs).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ValidationError

from attune.agent.lessons import LessonStore, MemoryLessonStore, record_run
from attune.agent.protocol import MAX_HOURS, ObserveRequest, ProposeRequest, ProposeResponse
from attune.engine.loop import policy_context
from attune.engine.policy import Policy, PolicyContext, Stop
from attune.engine.state import RunState, TuneConfig
from attune.errors import AttuneError, PolicyError, RecipeError
from attune.recipe.change import signature
from attune.recipe.io import parse_recipe
from attune.recipe.model import Recipe
from attune.trial import TrialOutcome, TrialRecord

log = logging.getLogger(__name__)

PolicyFactory = Callable[[str, int], Policy]
POLICY_NAMES = ("playbook", "llm", "hybrid", "coordinate", "random")
#: deepest JSON nesting a request may have (a valid run needs fewer than 10 levels)
MAX_DEPTH = 32
#: largest request body, in bytes
MAX_BODY_BYTES = 16 * 1024 * 1024
#: seconds a client has to send its whole body; a slower one is answered 408 and holds nothing meanwhile
BODY_TIMEOUT_S = 10.0


class RequestInvalid(Exception):
    """A request that is not a valid run: answered 422 with ``errors`` (``loc``, ``msg``, ``type`` each)."""

    def __init__(self, errors: list[dict[str, Any]]) -> None:
        super().__init__("; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in errors[:3]))
        self.errors = errors


def default_factory(lessons: LessonStore | None, llm_options: dict[str, Any] | None = None) -> PolicyFactory:
    """Build policies with ``attune.policies.make_policy``, sharing the lessons store and LLM settings."""

    def build(name: str, seed: int) -> Policy:
        from attune.policies import make_policy

        if name in ("playbook", "llm", "hybrid"):
            return make_policy(name, seed=seed, lessons=lessons if lessons is not None else False,
                               **(llm_options or {}))
        return make_policy(name, seed=seed)

    return build


# -- errors --------------------------------------------------------------------------------------------------

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


def _json(payload: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    # strict JSON out: a NaN or infinity anywhere becomes null rather than an invalid token
    text = json.dumps(_finite(payload), default=str)
    return web.Response(text=text, status=status, content_type="application/json", headers=headers)


def _finite(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def _unavailable(msg: str) -> web.Response:
    return _json({"detail": msg}, status=503)


# -- reading a request ---------------------------------------------------------------------------------------

def _too_deep(obj: Any, limit: int) -> bool:
    """True if ``obj`` nests lists and objects deeper than ``limit`` (iterative: no recursion)."""
    stack: list[tuple[Any, int]] = [(obj, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children: Any = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        if depth > limit:
            return True
        stack.extend((c, depth + 1) for c in children)
    return False


async def _parse(request: web.Request, model: type[BaseModel], timeout_s: float = BODY_TIMEOUT_S) -> Any:
    """The request's body as ``model``: read within ``timeout_s`` and the app's size bound (413), before any
    concurrency slot is taken, so slow or stalled clients cannot hold the slots others need."""
    try:
        raw = await asyncio.wait_for(request.read(), timeout_s)  # over client_max_size: 413
    except TimeoutError:
        raise web.HTTPRequestTimeout(text=f"the request body did not arrive within {timeout_s:g} s") from None
    try:
        body = json.loads(raw)
    except RecursionError:
        raise RequestInvalid([{"loc": ["body"], "msg": f"the body is nested deeper than {MAX_DEPTH} levels",
                               "type": "json_too_deep"}]) from None
    except ValueError as err:  # bad JSON, bad UTF-8, an integer too long to convert
        raise RequestInvalid([{"loc": ["body"], "msg": f"the body is not valid JSON: {err}",
                               "type": "json_invalid"}]) from None
    if _too_deep(body, MAX_DEPTH):
        raise RequestInvalid([{"loc": ["body"], "msg": f"the body is nested deeper than {MAX_DEPTH} levels",
                               "type": "json_too_deep"}])
    try:
        return model.model_validate(body)
    except ValidationError as err:
        raise RequestInvalid(_errors(err)) from None


def _bad_number(value: float, *, upper: float | None = None) -> bool:
    return not math.isfinite(value) or value < 0 or (upper is not None and value > upper)


def _knob_errors(recipe: Recipe, knobs: dict[str, Any], loc: list[Any]) -> list[dict[str, Any]]:
    cat = recipe.catalogue
    out = []
    for name, value in knobs.items():
        if name not in cat:
            out.append({"loc": [*loc, name], "msg": f"'{name}' is not a knob of the {cat.framework} catalogue",
                        "type": "unknown_knob"})
            continue
        problem = cat[name].check_value(value)
        if problem:
            out.append({"loc": [*loc, name], "msg": f"{name}: {problem}", "type": "knob_value"})
    return out


def record_errors(i: int, rec: TrialRecord, baseline: Recipe) -> list[dict[str, Any]]:
    """What the engine would never have written in record ``i``: a non-finite or negative number, a knob the
    catalogue does not have, an illegal value (a refused proposal may hold any scalar change: that is what the
    gate refused), or an accepted assignment that is not a valid recipe."""
    loc: list[Any] = ["records", i]
    out: list[dict[str, Any]] = []

    def bad(path: list[Any], msg: str) -> None:
        out.append({"loc": [*loc, *path], "msg": msg, "type": "value_error"})

    for name in ("charged_hours", "wall_s"):
        value = getattr(rec, name)
        upper = MAX_HOURS if name == "charged_hours" else MAX_HOURS * 3600
        if _bad_number(value, upper=upper):
            bad([name], f"must be a finite number between 0 and {upper:g}, got {value!r}")
    if rec.gain is not None and not math.isfinite(rec.gain):
        bad(["gain"], f"must be a finite number, got {rec.gain!r}")
    m = rec.measurement
    if m is not None:
        for name in ("tokens_per_s_per_device", "tokens_per_s", "step_time_median_s", "step_time_cv"):
            if _bad_number(getattr(m, name)):
                bad(["measurement", name], f"must be a finite number ≥ 0, got {getattr(m, name)!r}")
        if m.steps_measured < 0:
            bad(["measurement", "steps_measured"], f"must be ≥ 0, got {m.steps_measured}")
        if m.peak_memory_mb is not None and _bad_number(m.peak_memory_mb):
            bad(["measurement", "peak_memory_mb"], f"must be a finite number ≥ 0, got {m.peak_memory_mb!r}")
        for field in ("phases", "signals"):
            for key, value in getattr(m, field).items():
                if not math.isfinite(value):
                    bad(["measurement", field, key], f"must be a finite number, got {value!r}")
    if rec.outcome is TrialOutcome.REFUSED:
        for name, value in rec.change.items():
            if not (value is None or isinstance(value, (bool, int, float, str))):
                bad(["change", name], f"a knob value is a scalar, got {type(value).__name__}")
    else:
        out += _knob_errors(baseline, rec.change, [*loc, "change"])
    knob_errors = _knob_errors(baseline, rec.knobs, [*loc, "knobs"])
    out += knob_errors
    if rec.accepted and rec.knobs and not knob_errors:
        try:
            baseline.with_knobs(**baseline.knob_changes(rec.knobs))
        except (RecipeError, ValidationError, ValueError) as err:
            bad(["knobs"], f"the accepted knob assignment is not a valid recipe: {str(err).splitlines()[0]}")
    return out


def check_run(baseline_data: dict[str, Any], records: list[TrialRecord],
              search_space: list[str] | None = None) -> Recipe:
    """The baseline recipe of a request's run, after checking the run the way the engine would (both endpoints
    use this); :class:`RequestInvalid` lists every problem with its field path."""
    try:
        baseline = parse_recipe(baseline_data, "request.baseline")
    except RecipeError as err:
        raise RequestInvalid(_recipe_errors(err, "baseline")) from None
    errors: list[dict[str, Any]] = []
    cat = baseline.catalogue
    for i, name in enumerate(search_space or ()):
        if name not in cat:
            errors.append({"loc": ["search_space", i], "msg": f"'{name}' is not a knob of the {cat.framework} "
                           f"catalogue (knobs: {', '.join(cat.knobs)})", "type": "unknown_knob"})
    for i, rec in enumerate(records):
        errors += record_errors(i, rec, baseline)
    if errors:
        raise RequestInvalid(errors)
    return baseline


def build_context(req: ProposeRequest) -> PolicyContext:
    """A :class:`PolicyContext` from a stateless request, built by the engine's own ``policy_context``
    (the gate pre-check included), with the caller's noise floor, budget and backend."""
    baseline = check_run(req.baseline, list(req.records), list(req.search_space))
    space = tuple(req.search_space) or tuple(n for n, k in baseline.catalogue.knobs.items() if len(k.values) > 1)
    records = list(req.records)
    used = sum(r.charged_hours for r in records)
    config = TuneConfig.from_recipe(baseline, used + max(req.budget_left_hours, 0.0), search_space=space)
    try:
        ctx = policy_context(RunState(baseline=baseline, config=config, records=records, backend=req.backend))
    except RecipeError as err:
        raise RequestInvalid(_recipe_errors(err, "records")) from None
    if req.best is not None and not any(r.accepted for r in records):
        try:
            best = parse_recipe(req.best, "request.best")
        except RecipeError as err:
            raise RequestInvalid(_recipe_errors(err, "best")) from None
        if signature(best) != signature(ctx.best):
            raise RequestInvalid([{"loc": ["best"], "type": "best_mismatch",
                                   "msg": "request.best differs from the best recipe the records imply; send the "
                                          "records that accepted it, or leave best out"}])
    return dataclasses.replace(ctx, noise_floor=req.noise_floor, budget_left_hours=req.budget_left_hours,
                               backend=req.backend)


# -- the app -------------------------------------------------------------------------------------------------

@web.middleware
async def _json_errors(request: web.Request,
                       handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
    """Every error is JSON, and nothing is a 500: an unexpected exception is logged and answered 503."""
    try:
        return await handler(request)
    except RequestInvalid as err:
        return _json({"detail": err.errors}, status=422)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        headers = {k: v for k, v in exc.headers.items() if k.lower() in ("allow", "retry-after")}
        return _json({"detail": exc.reason if exc.text is None else exc.text.removeprefix(f"{exc.status}: ")},
                     status=exc.status if exc.status != 500 else 503, headers=headers)
    except asyncio.CancelledError:
        raise
    except Exception as err:  # noqa: BLE001 - answered, logged, and the sidecar keeps serving
        log.exception("unexpected error serving %s %s", request.method, request.path)
        return _unavailable(f"the agent could not answer: {type(err).__name__}: {err}")


def make_app(*, lessons: LessonStore | None = None, max_concurrency: int = 4,
             policy_factory: PolicyFactory | None = None, llm_options: dict[str, Any] | None = None,
             max_body_bytes: int = MAX_BODY_BYTES, body_timeout_s: float = BODY_TIMEOUT_S) -> web.Application:
    """The sidecar's aiohttp application. A request's body is read (within ``body_timeout_s`` and
    ``max_body_bytes``) before it may take one of the ``max_concurrency`` slots the policies run in."""
    factory = policy_factory or default_factory(lessons, llm_options)
    sem = asyncio.Semaphore(max(1, max_concurrency))
    app = web.Application(client_max_size=max_body_bytes, middlewares=[_json_errors])

    async def healthz(_: web.Request) -> web.Response:
        return _json({"status": "ok", "policies": list(POLICY_NAMES)})

    async def propose(request: web.Request) -> web.Response:
        req = await _parse(request, ProposeRequest, body_timeout_s)  # no slot is held while a body arrives
        if sem.locked():
            return _json({"detail": "the agent is busy; retry shortly"}, status=503, headers={"Retry-After": "1"})
        async with sem:
            try:
                ctx = build_context(req)
            except RequestInvalid:
                raise
            except ValidationError as err:
                raise RequestInvalid(_errors(err)) from None
            except AttuneError as err:
                raise RequestInvalid(_recipe_errors(err, "baseline")) from None
            except Exception as err:  # noqa: BLE001 - a request we cannot interpret is the request's problem
                log.exception("cannot interpret a proposal request")
                raise RequestInvalid([{"loc": ["body"], "type": "request_invalid",
                                       "msg": f"cannot interpret the request: {type(err).__name__}: {err}"}]) from None
            try:
                if req.lessons is not None and policy_factory is None:  # the tenant's lessons, for this request only
                    tenant = MemoryLessonStore(req.lessons.lessons, req.lessons.noise)
                    policy = default_factory(tenant, llm_options)(req.policy, req.seed)
                else:
                    policy = factory(req.policy, req.seed)
            except PolicyError as err:
                log.warning("policy %s is unavailable: %s", req.policy, err)
                return _unavailable(f"policy '{req.policy}' is unavailable: {err}")
            except Exception as err:  # noqa: BLE001
                log.exception("cannot build policy %s", req.policy)
                return _unavailable(f"policy '{req.policy}' is unavailable: {type(err).__name__}: {err}")
            try:
                result = await asyncio.to_thread(policy.propose, ctx)
            except Exception as err:  # noqa: BLE001 - answer 503 with the reason, keep serving
                log.exception("policy %s failed", req.policy)
                return _unavailable(f"policy failed: {type(err).__name__}: {err}")
            if isinstance(result, Stop):
                resp = ProposeResponse(action="stop", reason=result.reason, source=policy.name)
            else:
                resp = ProposeResponse(action="change", change=dict(result.set), rationale=result.rationale,
                                       source=result.source or policy.name)
            return _json(resp.model_dump(mode="json"))

    async def observe(request: web.Request) -> web.Response:
        req = await _parse(request, ObserveRequest, body_timeout_s)
        baseline = check_run(req.baseline, list(req.records))
        if not req.finished or lessons is None:
            return _json({"ok": True, "lessons": 0})
        state = RunState(baseline=baseline, config=TuneConfig(budget_hours=0.0, search_space=()),
                         records=list(req.records), finished="observed", backend=req.backend)
        try:
            touched = await asyncio.to_thread(record_run, state, lessons)
        except Exception as err:  # noqa: BLE001 - the run is fine; the lessons store is not
            log.exception("could not record lessons")
            return _unavailable(f"could not record lessons: {type(err).__name__}: {err}")
        return _json({"ok": True, "lessons": len(touched)})

    app.router.add_get("/healthz", healthz)
    app.router.add_post("/v1/propose", propose)
    app.router.add_post("/v1/observe", observe)
    return app


__all__ = ["MAX_BODY_BYTES", "MAX_DEPTH", "RequestInvalid", "build_context", "check_run", "default_factory",
           "make_app", "record_errors"]
