"""Client of the agent sidecar (``POST /v1/propose``) with a local fallback policy when it is unreachable."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import httpx
from pydantic import ValidationError

from attune.agent.lessons import LessonStore
from attune.agent.protocol import LessonsPayload, ProposeRequest, ProposeResponse
from attune.engine.loop import policy_context
from attune.engine.policy import Stop
from attune.engine.state import RunState
from attune.operator import telemetry
from attune.operator.resources import AgentSpec
from attune.operator.urls import url_problem
from attune.policies import make_policy
from attune.recipe.io import recipe_to_dict

log = logging.getLogger(__name__)


class AgentUnavailable(Exception):
    """The sidecar could not be asked (unreachable, an error status, a malformed answer, or a URL not allowed);
    ``code`` is a condition reason."""

    def __init__(self, message: str, code: str = "AgentUnreachable") -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Proposal:
    """What the proposer said, and whether the local fallback had to answer instead of the sidecar."""

    response: ProposeResponse
    fallback_reason: str | None = None
    fallback_code: str = "AgentUnreachable"


def propose_request(state: RunState, agent: AgentSpec, lessons: LessonStore | None = None) -> ProposeRequest:
    """The stateless request carrying the whole run, and the run's namespace's ``lessons`` where given (see
    :mod:`attune.operator.lessons`): only those in scope of its baseline are sent."""
    best = state.best_recipe()
    payload = None
    if lessons is not None:
        scoped = [lz for lz, _ in lessons.in_scope(state.baseline, backend=state.backend or "k8s")]
        payload = LessonsPayload(lessons=scoped, noise=lessons.noise_records())
    return ProposeRequest(policy=agent.policy, baseline=recipe_to_dict(state.baseline), best=recipe_to_dict(best),
                          records=list(state.records), search_space=list(state.config.search_space),
                          noise_floor=state.floor(), budget_left_hours=state.budget().left, seed=agent.seed,
                          lessons=payload)


def ask_sidecar(endpoint: str, request: ProposeRequest, timeout_s: float,
                namespace: str | None = None) -> ProposeResponse:
    """POST the request to the sidecar (an endpoint a run in ``namespace`` may reach) and parse its answer."""
    problem = url_problem(endpoint, "spec.agent.endpoint", namespace)
    if problem:
        raise AgentUnavailable(problem, code="URLNotAllowed")
    with telemetry.timed_request("agent"):
        try:
            resp = httpx.post(endpoint.rstrip("/") + "/v1/propose", content=request.model_dump_json(),
                              headers={"Content-Type": "application/json"}, timeout=timeout_s, follow_redirects=False)
        except httpx.HTTPError as err:
            raise AgentUnavailable(f"agent sidecar at {endpoint} is unreachable ({type(err).__name__})") from None
        if resp.status_code >= 300:  # its answer is not quoted: the endpoint is user-supplied
            raise AgentUnavailable(f"agent sidecar at {endpoint} answered HTTP {resp.status_code}")
    try:
        return ProposeResponse.model_validate_json(resp.content)
    except ValidationError as err:
        where = ", ".join(".".join(str(x) for x in e.get("loc", ())) or "body" for e in err.errors()[:3])
        raise AgentUnavailable(f"agent sidecar at {endpoint} gave an answer that is not a proposal "
                               f"(invalid: {where})") from None


def local_proposal(state: RunState, policy_name: str, seed: int = 0,
                   lessons: LessonStore | None = None) -> ProposeResponse:
    """The local policy's proposal, in the sidecar's wire format (steered by the namespace's ``lessons``, if given)."""
    policy = make_policy(policy_name, seed=seed, lessons=lessons if lessons is not None else False)
    for rec in state.records:
        policy.observe(rec)
    out = policy.propose(policy_context(state))
    if isinstance(out, Stop):
        return ProposeResponse(action="stop", reason=out.reason, source=policy.name)
    return ProposeResponse(action="change", change=dict(out.set), rationale=out.rationale,
                           source=out.source or policy.name)


def propose(state: RunState, agent: AgentSpec, lessons: LessonStore | None = None,
            namespace: str | None = None) -> Proposal:
    """Ask the sidecar (with the run's namespace's ``lessons``, if given); if it cannot answer, ask the local
    fallback policy and say why."""
    if agent.endpoint:
        try:
            return Proposal(ask_sidecar(agent.endpoint, propose_request(state, agent, lessons), agent.timeout_seconds,
                                        namespace))
        except AgentUnavailable as err:
            log.warning("%s; falling back to the local %s policy", err, agent.fallback_policy)
            reason, code = str(err), err.code
    else:
        reason, code = "no agent endpoint configured", "NoEndpoint"
    resp = local_proposal(state, agent.fallback_policy, agent.seed, lessons)
    return Proposal(resp.model_copy(update={"source": f"{resp.source}-fallback"}), fallback_reason=reason,
                    fallback_code=code)
