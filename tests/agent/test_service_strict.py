"""The sidecar never answers 500: bounded bodies, the engine's strict recipe and record checks on both endpoints,
field paths for every bad number, and a JSON error for anything unexpected."""

from __future__ import annotations

import json
import logging

import pytest
from aiohttp.test_utils import TestClient, TestServer

from attune import sidecar as service
from attune.agent.lessons import LessonStore
from attune.engine.policy import Policy, PolicyContext
from attune.recipe.change import apply_change, signature
from attune.recipe.io import recipe_to_dict
from attune.sidecar import make_app
from attune.testing.factories import tiny_recipe
from attune.trial import TrialOutcome, TrialRecord
from tests.agent.helpers import baseline_record, measurement

pytestmark = pytest.mark.asyncio
MAX_DEPTH = getattr(service, "MAX_DEPTH", 32)


def _body(**extra):
    r = tiny_recipe()
    return {"policy": "playbook", "baseline": recipe_to_dict(r),
            "records": [baseline_record(r).model_dump(mode="json")], "noise_floor": 0.03, **extra}


def _illegal_record(rid: int = 2, accepted: bool = False) -> dict:
    """A launched candidate whose change and knobs hold a value the catalogue does not allow."""
    r = tiny_recipe()
    ok = apply_change(r, {"micro_batch_size": 2})
    knobs = {**ok.effective_knobs, "micro_batch_size": 3}
    return TrialRecord(id=rid, kind="candidate", change={"micro_batch_size": 3}, knobs=knobs,
                       signature=signature(ok) + "x", outcome=TrialOutcome.SUCCEEDED, measurement=measurement(0.5),
                       gain=0.9, accepted=accepted, decision="accepted: +90%" if accepted else "rejected",
                       charged_hours=0.01).model_dump(mode="json")


async def _client(app) -> TestClient:
    client = TestClient(TestServer(app))
    await client.start_server()
    return client


async def _post(client: TestClient, path: str, body, raw: bool = False):
    data = body if raw else json.dumps(body, allow_nan=True)
    resp = await client.post(path, data=data, headers={"Content-Type": "application/json"})
    assert resp.content_type == "application/json", await resp.text()
    return resp.status, await resp.json()


def _locs(detail) -> list[list]:
    return [e["loc"] for e in detail]


# -- bounded bodies ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("path", ["/v1/propose", "/v1/observe"])
async def test_deeply_nested_json_is_rejected_not_a_500(path):
    client = await _client(make_app(lessons=None))
    try:
        for depth in (MAX_DEPTH + 1, 5_000, 200_000):
            deep = "[" * depth + "]" * depth
            status, data = await _post(client, path, f'{{"baseline": {deep}, "records": []}}', raw=True)
            assert status == 422, (depth, status, data)
            assert "nest" in json.dumps(data)
        dict_deep = '{"a":' * 3_000 + "1" + "}" * 3_000
        status, _ = await _post(client, path, dict_deep, raw=True)
        assert status == 422
    finally:
        await client.close()


async def test_a_body_over_the_byte_limit_is_413_json():
    client = await _client(make_app(lessons=None, max_body_bytes=64 * 1024))
    try:
        body = _body()
        body["search_space"] = ["x" * 1000] * 100
        status, data = await _post(client, "/v1/propose", body)
        assert status == 413 and "detail" in data
    finally:
        await client.close()


# -- the same strict recipe and record models on both endpoints -----------------------------------------------

@pytest.mark.parametrize("accepted", [False, True])
async def test_illegal_record_values_are_422_on_both_endpoints_and_never_stored(tmp_path, accepted):
    store = LessonStore(tmp_path / "lessons.json")
    client = await _client(make_app(lessons=store))
    try:
        body = _body()
        body["records"].append(_illegal_record(accepted=accepted))
        status, data = await _post(client, "/v1/propose", body)
        assert status == 422, data
        assert ["records", 1, "change", "micro_batch_size"] in _locs(data["detail"])
        status, data = await _post(client, "/v1/observe", {"baseline": body["baseline"], "records": body["records"],
                                                           "finished": True})
        assert status == 422, data
        assert ["records", 1, "change", "micro_batch_size"] in _locs(data["detail"])
        assert ["records", 1, "knobs", "micro_batch_size"] in _locs(data["detail"])
        assert not (tmp_path / "lessons.json").exists() and store.all() == []
        # an unfinished run, or a sidecar without lessons, checks just as strictly
        status, _ = await _post(client, "/v1/observe", {"baseline": body["baseline"], "records": body["records"]})
        assert status == 422
    finally:
        await client.close()


async def test_observe_checks_the_baseline_even_without_lessons():
    client = await _client(make_app(lessons=None))
    try:
        baseline = _body()["baseline"]
        baseline["knobs"] = {"micro_batch_size": 3}
        status, data = await _post(client, "/v1/observe", {"baseline": baseline, "records": [], "finished": True})
        assert status == 422 and any(loc[:2] == ["baseline", "knobs"] for loc in _locs(data["detail"]))
    finally:
        await client.close()


async def test_unknown_knobs_in_a_record_are_422():
    client = await _client(make_app(lessons=None))
    try:
        body = _body()
        rec = dict(_illegal_record())
        rec["change"] = {"turbo": True}
        rec["knobs"] = {**rec["knobs"], "micro_batch_size": 2, "turbo": True}
        body["records"].append(rec)
        status, data = await _post(client, "/v1/propose", body)
        assert status == 422
        assert ["records", 1, "change", "turbo"] in _locs(data["detail"])
        assert any("turbo" in e["msg"] for e in data["detail"])
    finally:
        await client.close()


async def test_a_refused_record_may_hold_the_change_the_gate_refused():
    client = await _client(make_app(lessons=None))
    try:
        body = _body()
        body["records"].append(TrialRecord(id=2, kind="candidate", change={"global_batch_size": 16},
                                           outcome=TrialOutcome.REFUSED, source="llm",
                                           decision="refused by the gate").model_dump(mode="json"))
        status, data = await _post(client, "/v1/propose", body)
        assert status == 200, data
    finally:
        await client.close()


async def test_an_unknown_search_space_knob_is_422_naming_it():
    client = await _client(make_app(lessons=None))
    try:
        status, data = await _post(client, "/v1/propose", _body(search_space=["micro_batch_size", "warp_drive"]))
        assert status == 422, data
        assert ["search_space", 1] in _locs(data["detail"])
        assert any("warp_drive" in e["msg"] for e in data["detail"])
    finally:
        await client.close()


@pytest.mark.parametrize(("patch", "loc"), [
    ({"noise_floor": float("nan")}, ["noise_floor"]),
    ({"noise_floor": -0.1}, ["noise_floor"]),
    ({"noise_floor": float("inf")}, ["noise_floor"]),
    ({"budget_left_hours": float("inf")}, ["budget_left_hours"]),
    ({"budget_left_hours": -1.0}, ["budget_left_hours"]),
    ({"budget_left_hours": float("nan")}, ["budget_left_hours"]),
    ({"seed": 1e300}, ["seed"]),
])
async def test_bad_numbers_are_422_with_their_field_path(patch, loc):
    client = await _client(make_app(lessons=None))
    try:
        status, data = await _post(client, "/v1/propose", _body(**patch))
        assert status == 422, data
        assert loc in _locs(data["detail"]) or any(x[: len(loc)] == loc for x in _locs(data["detail"]))
    finally:
        await client.close()


@pytest.mark.parametrize(("field", "value"), [
    ("charged_hours", -0.5), ("charged_hours", float("inf")), ("charged_hours", float("nan")),
    ("wall_s", -1.0), ("gain", float("nan")), ("gain", float("inf")),
])
@pytest.mark.parametrize("path", ["/v1/propose", "/v1/observe"])
async def test_bad_record_numbers_are_422_with_their_field_path(tmp_path, path, field, value):
    store = LessonStore(tmp_path / "lessons.json")
    client = await _client(make_app(lessons=store))
    try:
        body = _body()
        body["records"][0][field] = value
        if path == "/v1/observe":
            body = {"baseline": body["baseline"], "records": body["records"], "finished": True}
        status, data = await _post(client, path, body)
        assert status == 422, data
        assert ["records", 0, field] in _locs(data["detail"])
    finally:
        await client.close()


async def test_bad_measurement_numbers_are_422():
    client = await _client(make_app(lessons=None))
    try:
        body = _body()
        body["records"][0]["measurement"]["tokens_per_s_per_device"] = float("nan")
        status, data = await _post(client, "/v1/propose", body)
        assert status == 422
        assert ["records", 0, "measurement", "tokens_per_s_per_device"] in _locs(data["detail"])
    finally:
        await client.close()


# -- nothing unexpected becomes a 500 ------------------------------------------------------------------------

class _Broken(Policy):
    name = "broken"

    def propose(self, ctx: PolicyContext):
        raise RuntimeError("the policy tripped over itself")


async def test_a_policy_that_raises_is_a_503_json_error_and_logged(caplog):
    caplog.set_level(logging.ERROR, logger="attune.sidecar")
    client = await _client(make_app(lessons=None, policy_factory=lambda n, s: _Broken()))
    try:
        status, data = await _post(client, "/v1/propose", _body())
        assert status == 503 and "tripped over itself" in data["detail"]
        assert any("tripped over itself" in (r.exc_text or r.getMessage()) for r in caplog.records)
    finally:
        await client.close()


async def test_a_factory_that_raises_is_a_json_error():
    def factory(name, seed):
        raise KeyError(name)

    client = await _client(make_app(lessons=None, policy_factory=factory))
    try:
        status, data = await _post(client, "/v1/propose", _body())
        assert status == 503 and "detail" in data
    finally:
        await client.close()


async def test_the_llm_policy_without_an_endpoint_is_503_naming_the_setting(monkeypatch):
    monkeypatch.delenv("ATTUNE_LLM_BASE_URL", raising=False)
    client = await _client(make_app(lessons=None))
    try:
        status, data = await _post(client, "/v1/propose", _body(policy="llm"))
        assert status == 503 and "ATTUNE_LLM_BASE_URL" in data["detail"]
    finally:
        await client.close()


async def test_an_observe_that_cannot_write_lessons_is_a_json_error(tmp_path):
    (tmp_path / "ro").mkdir()
    store = LessonStore(tmp_path / "ro" / "lessons.json")
    (tmp_path / "ro" / "lessons.json.lock").mkdir()  # the lock cannot be taken: writing fails
    client = await _client(make_app(lessons=store))
    try:
        r = tiny_recipe()
        cand = apply_change(r, {"micro_batch_size": 2})
        rec = TrialRecord(id=2, kind="candidate", change={"micro_batch_size": 2}, knobs=cand.effective_knobs,
                          signature=signature(cand), outcome=TrialOutcome.SUCCEEDED, measurement=measurement(0.9),
                          gain=0.1, decision="rejected", charged_hours=0.01).model_dump(mode="json")
        body = {"baseline": recipe_to_dict(r), "records": [baseline_record(r).model_dump(mode="json"), rec],
                "finished": True}
        status, data = await _post(client, "/v1/observe", body)
        assert status == 503 and "lessons" in data["detail"]
    finally:
        await client.close()


@pytest.mark.parametrize(("method", "path", "status"), [("GET", "/v1/propose", 405), ("POST", "/v1/nope", 404)])
async def test_http_errors_are_json(method, path, status):
    client = await _client(make_app(lessons=None))
    try:
        resp = await client.request(method, path)
        assert resp.status == status and resp.content_type == "application/json"
        assert "detail" in await resp.json()
    finally:
        await client.close()
