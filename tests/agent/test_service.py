"""Sidecar HTTP tests: propose, observe, validation (422), saturation (503), health."""

from __future__ import annotations

import asyncio
import threading

import pytest
from aiohttp.test_utils import TestClient, TestServer

from attune.agent.lessons import LessonStore
from attune.engine.policy import Policy, PolicyContext, Stop
from attune.recipe.io import recipe_to_dict
from attune.sidecar import make_app
from attune.testing.factories import tiny_recipe
from tests.agent.helpers import baseline_record

pytestmark = pytest.mark.asyncio


def _body(**extra):
    r = tiny_recipe()
    return {"policy": "playbook", "baseline": recipe_to_dict(r),
            "records": [baseline_record(r).model_dump(mode="json")], "noise_floor": 0.03, **extra}


async def _client(app) -> TestClient:
    client = TestClient(TestServer(app))
    await client.start_server()
    return client


async def test_propose_healthz_and_observe(tmp_path):
    store = LessonStore(tmp_path / "lessons.json")
    client = await _client(make_app(lessons=store))
    try:
        health = await (await client.get("/healthz")).json()
        assert health["status"] == "ok" and "playbook" in health["policies"]
        resp = await client.post("/v1/propose", json=_body())
        assert resp.status == 200
        data = await resp.json()
        assert data["action"] == "change" and data["source"] == "playbook" and len(data["change"]) >= 1
        obs = await client.post("/v1/observe", json={"baseline": _body()["baseline"], "records": _body()["records"],
                                                     "finished": True})
        assert obs.status == 200 and (await obs.json())["ok"] is True
    finally:
        await client.close()


@pytest.mark.parametrize(("body", "field"), [
    ({"policy": "magic"}, "policy"),
    ({"records": [{"id": "x"}]}, "records"),
    ({"unexpected": 1}, "unexpected"),
])
async def test_validation_errors_are_422_with_fields(body, field):
    client = await _client(make_app(lessons=None))
    try:
        resp = await client.post("/v1/propose", json={**_body(), **body})
        assert resp.status == 422
        detail = (await resp.json())["detail"]
        assert any(e["loc"][0] == field for e in detail)
        bad = await client.post("/v1/propose", data=b"{nope", headers={"Content-Type": "application/json"})
        assert bad.status == 422
        broken = _body()
        broken["baseline"]["knobs"] = {"micro_batch_size": 3}
        resp = await client.post("/v1/propose", json=broken)
        assert resp.status == 422
        assert any(e["loc"][:2] == ["baseline", "knobs"] for e in (await resp.json())["detail"])
    finally:
        await client.close()


class _Blocking(Policy):
    name = "blocking"

    def __init__(self, gate: threading.Event, entered: threading.Event | None = None) -> None:
        self.gate = gate
        self.entered = entered or threading.Event()

    def propose(self, ctx: PolicyContext) -> Stop:
        self.entered.set()  # the service is inside its one slot now
        self.gate.wait(10)
        return Stop("done")


async def test_saturation_answers_503():
    gate, entered = threading.Event(), threading.Event()
    client = await _client(make_app(lessons=None, max_concurrency=1,
                                    policy_factory=lambda n, s: _Blocking(gate, entered)))
    try:
        first = asyncio.ensure_future(client.post("/v1/propose", json=_body()))
        assert await asyncio.to_thread(entered.wait, 10), "the first request never reached the policy"
        second = await client.post("/v1/propose", json=_body())
        assert second.status == 503 and second.headers.get("Retry-After")
        gate.set()
        r1 = await first
        assert r1.status == 200 and (await r1.json())["action"] == "stop"
    finally:
        gate.set()
        await client.close()
