"""Lessons on Kubernetes: each namespace's lessons in its own ConfigMap ``attune-lessons`` (one entry per finished
run, merged by key), folded by the operator and sent with each proposal; the sidecar keeps no tenant state."""

from __future__ import annotations

import asyncio
import json

from aiohttp.test_utils import TestClient, TestServer

from attune import sidecar as service
from attune.agent.lessons import (
    Condition,
    LessonAction,
    LessonStore,
    MemoryLessonStore,
    Observation,
    fold,
    scope_of,
)
from attune.agent.protocol import ProposeRequest
from attune.engine.loop import RunState, TuneConfig
from attune.operator import agent_client
from attune.operator.lessons import LESSONS_CONFIGMAP, entry_key, lessons_configmap, store_from_data
from attune.operator.resources import AgentSpec
from attune.recipe.io import recipe_to_dict
from attune.testing.factories import tiny_recipe
from tests.agent.helpers import baseline_record
from tests.k8s.fakes import FakePorts, tuning_run
from tests.k8s.fakes import drive as _drive


def _lesson(recipe, knob="micro_batch_size", value=2, effect=0.2, run="ns-a/r/1"):
    obs = Observation(scope=scope_of(recipe, "k8s"), condition=Condition(bottleneck="compute"),
                      action=LessonAction(knob=knob, direction="up", value=value), effect=effect, verdict="accepted")
    return fold(None, obs, run)


def test_a_finished_run_adds_its_entry_to_its_namespaces_lessons():
    ports = FakePorts()
    run = _drive(tuning_run(), ports)
    assert run["status"]["phase"] == "Succeeded"
    cm = ports.configmaps[LESSONS_CONFIGMAP]  # today: no lessons are ever recorded on Kubernetes
    assert cm["metadata"]["namespace"] == run["metadata"]["namespace"]
    assert not cm["metadata"].get("ownerReferences")  # lessons outlive the run
    key = entry_key(run)
    entry = json.loads(cm["data"][key])
    assert entry["run"].startswith(f"{run['metadata']['namespace']}/r/")
    assert entry["observations"], entry  # the candidate's measured move
    store = store_from_data(cm["data"])
    knobs = {lz.action.knob for lz in store.all()}
    assert "activation_checkpointing" in knobs and all(lz.scope.backend == "k8s" for lz in store.all())


def test_two_replicas_entries_merge_and_fold_in_recording_order():
    recipe = tiny_recipe()
    state = RunState(baseline=recipe, config=TuneConfig.from_recipe(recipe, 1.0), records=[baseline_record(recipe)])
    a = {"metadata": {"name": "a", "namespace": "ml", "uid": "uid-a"}}
    b = {"metadata": {"name": "b", "namespace": "ml", "uid": "uid-b"}}
    cm_a, cm_b = lessons_configmap(a, state, now=1.0), lessons_configmap(b, state, now=2.0)
    assert cm_a["metadata"]["name"] == cm_b["metadata"]["name"] == LESSONS_CONFIGMAP
    assert set(cm_a["data"]).isdisjoint(cm_b["data"])  # merge patches of distinct keys: neither write is lost
    merged = {**cm_a["data"], **cm_b["data"], "junk": "x", "run.bad.json": "{not json"}
    assert store_from_data(merged).all() == []  # baselines teach no move; unreadable entries are skipped


def test_the_request_carries_only_the_namespaces_lessons_in_scope():
    recipe = tiny_recipe()
    state = RunState(baseline=recipe, config=TuneConfig.from_recipe(recipe, 1.0), records=[baseline_record(recipe)],
                     backend="k8s")
    mine = MemoryLessonStore([_lesson(recipe)])
    req = agent_client.propose_request(state, AgentSpec(endpoint=None), mine)
    assert req.lessons is not None and [lz.id for lz in req.lessons.lessons] == [lz.id for lz in mine.all()]
    assert agent_client.propose_request(state, AgentSpec(endpoint=None)).lessons is None
    ProposeRequest.model_validate_json(req.model_dump_json())  # the wire round-trips


def test_the_sidecar_uses_the_requests_lessons_and_never_its_own_store(tmp_path, monkeypatch):
    recipe = tiny_recipe()
    own = LessonStore(tmp_path / "lessons.json")  # another tenant's lessons in the sidecar's store
    own.add([], "x")
    seen = []
    real = service.default_factory

    def spy(lessons, llm_options=None):
        seen.append(lessons)
        return real(lessons, llm_options)

    monkeypatch.setattr(service, "default_factory", spy)
    tenant = _lesson(recipe)
    body = {"policy": "playbook", "baseline": recipe_to_dict(recipe),
            "records": [baseline_record(recipe).model_dump(mode="json")], "noise_floor": 0.03,
            "lessons": {"lessons": [tenant.model_dump(mode="json")], "noise": []}}

    async def go():
        client = TestClient(TestServer(service.make_app(lessons=own)))
        await client.start_server()
        try:
            resp = await client.post("/v1/propose", json=body)
            return resp.status, await resp.json()
        finally:
            await client.close()

    status, data = asyncio.run(go())
    assert status == 200, data
    used = seen[-1]
    assert isinstance(used, MemoryLessonStore) and [lz.id for lz in used.all()] == [tenant.id]
    assert not (tmp_path / "lessons.json").exists()  # nothing of the tenant's was written to the sidecar
