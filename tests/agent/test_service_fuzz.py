"""Property-based fuzzing of the sidecar over real HTTP: whatever the body, never a 500, always JSON.

A real aiohttp ``TestServer`` runs the sidecar (playbook, coordinate and random policies, a lessons store in a
temporary directory) on its own event loop; hypothesis posts generated bodies with a real HTTP client: random
JSON structures, wrong types, huge and non-finite numbers, deep nesting, raw bytes, and valid runs mutated
one or a few places at a time. The default examples stay well under a minute; ``-m slow`` runs more.
"""

from __future__ import annotations

import asyncio
import copy
import json
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from aiohttp.test_utils import TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attune.agent.lessons import LessonStore
from attune.engine.loop import TuneConfig, Tuner
from attune.policies.playbook import PlaybookPolicy
from attune.recipe.change import apply_change, signature
from attune.recipe.io import recipe_to_dict
from attune.sidecar import make_app
from attune.testing.factories import tiny_recipe
from attune.testing.fakes import FakeBackend
from attune.trial import TrialOutcome, TrialRecord

ENDPOINTS = ("/v1/propose", "/v1/observe")
ALLOWED = {200, 413, 422, 503}
FUZZ = settings(deadline=None, database=None, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])


class Sidecar:
    """The real sidecar app in an aiohttp TestServer on a background event loop, and a real HTTP client."""

    def __init__(self, store: LessonStore) -> None:
        self.store = store
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="sidecar-fuzz", daemon=True)
        self.thread.start()

        async def start() -> TestServer:
            server = TestServer(make_app(lessons=store, max_concurrency=64, max_body_bytes=2 * 1024 * 1024),
                                host="127.0.0.1")
            await server.start_server()
            return server

        self.server = asyncio.run_coroutine_threadsafe(start(), self.loop).result(30)
        self.client = httpx.Client(base_url=str(self.server.make_url("")), timeout=60.0)

    def post(self, path: str, content: bytes) -> httpx.Response:
        return self.client.post(path, content=content, headers={"Content-Type": "application/json"})

    def close(self) -> None:
        self.client.close()
        asyncio.run_coroutine_threadsafe(self.server.close(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sidecar]:
    mp = pytest.MonkeyPatch()
    mp.delenv("ATTUNE_LLM_BASE_URL", raising=False)  # llm and hybrid: 503, never a call out
    s = Sidecar(LessonStore(tmp_path_factory.mktemp("fuzz") / "lessons.json"))
    yield s
    s.close()
    mp.undo()


def _valid_run() -> tuple[dict[str, Any], dict[str, Any]]:
    """A valid propose body and observe body from a real (fake-backend) run, plus a failure and a refusal."""
    import tempfile

    r = tiny_recipe()
    with tempfile.TemporaryDirectory() as tmp:
        state = Tuner(r, backend=FakeBackend(), policy=PlaybookPolicy(),
                      config=TuneConfig.from_recipe(r, 10.0, max_trials=7), run_dir=tmp).run()
    records = list(state.records)
    best = state.best_recipe()
    oom = apply_change(best, {"compile_mode": "default"})
    records.append(TrialRecord(id=len(records) + 1, kind="candidate", change={"compile_mode": "default"},
                               knobs=oom.effective_knobs, signature=signature(oom), outcome=TrialOutcome.OOM,
                               decision="rejected: trial oom", charged_hours=0.001))
    records.append(TrialRecord(id=len(records) + 1, kind="candidate", change={"global_batch_size": 16},
                               outcome=TrialOutcome.REFUSED, source="llm", decision="refused by the gate"))
    dumped = [rec.model_dump(mode="json") for rec in records]
    propose = {"policy": "playbook", "baseline": recipe_to_dict(r), "best": recipe_to_dict(best), "records": dumped,
               "search_space": list(state.config.search_space), "noise_floor": 0.03, "budget_left_hours": 1.0,
               "seed": 3, "backend": "local"}
    observe = {"baseline": recipe_to_dict(r), "records": dumped, "finished": True, "backend": "local"}
    return propose, observe


VALID_PROPOSE, VALID_OBSERVE = _valid_run()
CATALOGUE = tiny_recipe().catalogue


def _strict_json(text: str) -> Any:
    def no_constant(name: str) -> Any:
        raise ValueError(f"non-standard JSON constant {name}")

    return json.loads(text, parse_constant=no_constant)


def check(resp: httpx.Response, path: str) -> None:
    assert resp.status_code in ALLOWED, (resp.status_code, resp.text[:2000])
    assert resp.headers.get("content-type", "").startswith("application/json"), resp.headers
    data = _strict_json(resp.text)
    assert isinstance(data, dict)
    if resp.status_code != 200:
        assert "detail" in data, data
        return
    if path == "/v1/propose":
        assert data["action"] in ("change", "stop")
        for knob, value in data["change"].items():  # the playbook and search policies move catalogue knobs only
            assert knob in CATALOGUE and CATALOGUE[knob].check_value(value) is None, data
    else:
        assert data["ok"] is True


# -- strategies ----------------------------------------------------------------------------------------------

numbers = st.one_of(
    st.integers(), st.integers(min_value=-(10**40), max_value=10**40),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0, -1, 1e308, -1e308, 2**63, -(2**63) - 1,
                                                                     1e-320, float("nan"), float("inf")]))
leaves = st.one_of(st.none(), st.booleans(), numbers, st.text(max_size=20),
                   st.sampled_from(["playbook", "llm", "sim", "micro_batch_size", "candidate", "oom", "", "NaN"]))
json_values = st.recursive(leaves, lambda inner: st.one_of(st.lists(inner, max_size=5),
                                                           st.dictionaries(st.text(max_size=12), inner, max_size=5)),
                           max_leaves=25)
PROPOSE_KEYS = list(VALID_PROPOSE) + ["unexpected"]
OBSERVE_KEYS = list(VALID_OBSERVE) + ["unexpected"]


def _encode(value: Any) -> bytes:
    return json.dumps(value, allow_nan=True).encode()


def _paths(obj: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += _paths(v, (*prefix, i))
    return out


def _mutate(body: Any, ops: list[tuple[int, str, Any]]) -> Any:
    body = copy.deepcopy(body)
    for index, action, value in ops:
        paths = [p for p in _paths(body) if p]
        if not paths:
            return value
        path = paths[index % len(paths)]
        parent = body
        for step in path[:-1]:
            parent = parent[step]
        key = path[-1]
        if action == "replace":
            parent[key] = value
        elif action == "delete":
            del parent[key]
        elif action == "wrap":
            parent[key] = [parent[key]]
        elif action == "unwrap" and isinstance(parent[key], (list, dict)) and parent[key]:
            inner = parent[key]
            parent[key] = next(iter(inner.values())) if isinstance(inner, dict) else inner[0]
        elif action == "insert" and isinstance(parent[key], dict):
            parent[key][str(value)[:20]] = value
        elif action == "numeric" and isinstance(parent[key], (int, float)) and not isinstance(parent[key], bool):
            parent[key] = value if isinstance(value, (int, float)) else -parent[key]
        elif action == "stringify":
            parent[key] = str(parent[key])
    return body


mutation_ops = st.lists(st.tuples(st.integers(min_value=0, max_value=10_000),
                                  st.sampled_from(["replace", "delete", "wrap", "unwrap", "insert", "numeric",
                                                   "stringify"]),
                                  st.one_of(leaves, json_values)), min_size=1, max_size=4)


def _nested(depth: int, kind: str) -> bytes:
    if kind == "list":
        return b"[" * depth + b"]" * depth
    if kind == "dict":
        return b'{"a":' * depth + b"1" + b"}" * depth
    return b'{"baseline": ' + b"[" * depth + b"]" * depth + b', "records": []}'


raw_bodies = st.one_of(
    st.binary(max_size=300),
    st.builds(_nested, st.integers(min_value=1, max_value=100_000), st.sampled_from(["list", "dict", "field"])),
    st.builds(lambda cut: _encode(VALID_PROPOSE)[:cut], st.integers(min_value=0, max_value=4000)),
    st.text(max_size=200).map(str.encode),
    st.sampled_from([b"", b"null", b"NaN", b"Infinity", b"-Infinity", b"1e999999", b"9" * 5000, b'"\\ud800"',
                     b"\xff\xfe\x00", b"[]", b"{}", b'{"baseline": {}}', b'{"records": null}']),
)


# -- the properties ------------------------------------------------------------------------------------------

@settings(FUZZ, max_examples=400)
@given(path=st.sampled_from(ENDPOINTS), body=json_values)
def test_any_json_value_is_never_a_500(sidecar, path, body):
    check(sidecar.post(path, _encode(body)), path)


@settings(FUZZ, max_examples=600)
@given(path=st.sampled_from(ENDPOINTS), keys=st.data())
def test_protocol_shaped_bodies_with_wrong_types_are_never_a_500(sidecar, path, keys):
    names = PROPOSE_KEYS if path == "/v1/propose" else OBSERVE_KEYS
    body = keys.draw(st.fixed_dictionaries({}, optional=dict.fromkeys(names, json_values)))
    check(sidecar.post(path, _encode(body)), path)


@settings(FUZZ, max_examples=900)
@given(path=st.sampled_from(ENDPOINTS), ops=mutation_ops)
def test_mutated_valid_runs_are_never_a_500(sidecar, path, ops):
    valid = VALID_PROPOSE if path == "/v1/propose" else VALID_OBSERVE
    check(sidecar.post(path, _encode(_mutate(valid, ops))), path)


@settings(FUZZ, max_examples=300)
@given(path=st.sampled_from(ENDPOINTS), raw=raw_bodies)
def test_raw_bytes_and_deep_nesting_are_never_a_500(sidecar, path, raw):
    check(sidecar.post(path, raw), path)


def test_the_valid_bodies_are_served(sidecar):
    for path, body in (("/v1/propose", VALID_PROPOSE), ("/v1/observe", VALID_OBSERVE)):
        resp = sidecar.post(path, _encode(body))
        assert resp.status_code == 200, resp.text
        check(resp, path)
    for policy in ("coordinate", "random"):
        resp = sidecar.post("/v1/propose", _encode({**VALID_PROPOSE, "policy": policy}))
        assert resp.status_code == 200, resp.text


@pytest.mark.slow
@settings(FUZZ, max_examples=4000)
@given(path=st.sampled_from(ENDPOINTS), ops=mutation_ops, extra=json_values)
def test_many_more_mutated_runs_are_never_a_500(sidecar, path, ops, extra):
    valid = VALID_PROPOSE if path == "/v1/propose" else VALID_OBSERVE
    body = _mutate(valid, ops)
    if isinstance(body, dict) and isinstance(extra, dict):
        body = {**body, **{k: v for k, v in extra.items() if k in body}}
    check(sidecar.post(path, _encode(body)), path)


def test_every_lesson_the_fuzzing_stored_names_a_legal_value(sidecar):
    """Run last: whatever the fuzzing got past /v1/observe, no lesson holds a knob or value the catalogue lacks."""
    lessons = LessonStore(sidecar.store.path).all()
    assert lessons, "the valid observe bodies recorded lessons"
    for lesson in lessons:
        assert lesson.action.knob in CATALOGUE, lesson
        assert CATALOGUE[lesson.action.knob].check_value(lesson.action.value) is None, lesson
