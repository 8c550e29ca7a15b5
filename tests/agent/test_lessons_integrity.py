"""Lessons integrity: scoped by framework, accelerator and backend; confirmed only by accepted changes;
a corrupt store is kept, not overwritten; concurrent writers lose nothing; failures are infeasible, not effects."""

from __future__ import annotations

import json
import logging
import multiprocessing
from pathlib import Path

from attune.agent.lessons import (
    INFEASIBLE_PRUNE_MATCH,
    Condition,
    LessonAction,
    LessonStore,
    Observation,
    record_run,
    scope_match,
    scope_of,
)
from attune.engine.loop import RunState, TuneConfig, Tuner
from attune.policies.playbook import PlaybookPolicy
from attune.recipe.change import apply_change, signature
from attune.recipe.model import Recipe
from attune.testing.factories import tiny_recipe, tiny_recipe_dict
from attune.testing.fakes import FakeBackend
from attune.trial import TrialOutcome, TrialRecord
from tests.agent.helpers import baseline_record, context, measurement
from tests.agent.lessons_runs import fused_matters

# -- helpers ----------------------------------------------------------------------------------------------


def _trial(recipe: Recipe, rid: int, change: dict, *, gain: float | None = None, accepted: bool = False,
           decision: str = "", kind: str = "candidate",
           outcome: TrialOutcome = TrialOutcome.SUCCEEDED) -> TrialRecord:
    target = apply_change(recipe, change)
    ok = outcome is TrialOutcome.SUCCEEDED and kind != "loss_check"
    return TrialRecord(id=rid, kind=kind, change=change, knobs=target.effective_knobs, signature=signature(target),
                       outcome=outcome, measurement=measurement(0.8) if ok else None, gain=gain, accepted=accepted,
                       decision=decision, charged_hours=0.01 if kind != "loss_check" else 0.0)


def _state(recipe: Recipe, records: list[TrialRecord], backend: str | None = None) -> RunState:
    state = RunState(baseline=recipe, config=TuneConfig.from_recipe(recipe, 1.0), records=records)
    if backend is not None:
        state.backend = backend
    return state


def _backend(name: str) -> FakeBackend:
    be = FakeBackend(speed=fused_matters)
    be.name = name
    return be


def _run(tmp_path: Path, recipe: Recipe, backend: FakeBackend, policy: PlaybookPolicy, name: str) -> RunState:
    return Tuner(recipe, backend=backend, policy=policy, config=TuneConfig.from_recipe(recipe, 10.0),
                 run_dir=tmp_path / name).run()


def _related() -> Recipe:
    data = tiny_recipe_dict()
    data["model"]["layers"] = 3
    return Recipe.model_validate(data)


def _obs(value: str, effect: float = 0.1, **extra) -> Observation:
    return Observation(scope=scope_of(tiny_recipe()), condition=Condition(bottleneck="compute_bound"),
                       action=LessonAction(knob="compile_mode", direction="set", value=value), effect=effect, **extra)


# -- (a) scope: framework, accelerator and backend ------------------------------------------------------------


def test_simulated_lessons_do_not_steer_a_real_run_unless_asked(tmp_path):
    path = tmp_path / "lessons.json"
    store = LessonStore(path)
    first = _run(tmp_path, tiny_recipe(), _backend("sim"), PlaybookPolicy(lessons=store), "first")
    assert record_run(first, store)

    real = _run(tmp_path, _related(), _backend("local"), PlaybookPolicy(lessons=LessonStore(path)), "real")
    assert not [r for r in real.records if "lesson" in r.rationale], "a simulated lesson steered a real run"
    assert all(lz.scope.backend == "sim" for lz in LessonStore(path).all())
    assert LessonStore(path).in_scope(_related(), backend="local") == []

    asked = _run(tmp_path, _related(), _backend("local"),
                 PlaybookPolicy(lessons=LessonStore(path), include_simulated_lessons=True), "asked")
    assert [r for r in asked.records if "lesson" in r.rationale]
    assert LessonStore(path).in_scope(_related(), backend="local", include_simulated=True)
    # a simulated run is steered by simulated lessons
    assert LessonStore(path).in_scope(_related(), backend="sim")


def test_real_lessons_steer_real_runs_of_the_same_framework_and_weigh_less_on_other_hardware(tmp_path):
    path = tmp_path / "lessons.json"
    store = LessonStore(path)
    first = _run(tmp_path, tiny_recipe(), _backend("local"), PlaybookPolicy(lessons=store), "first")
    record_run(first, store)
    assert LessonStore(path).in_scope(_related(), backend="local")
    assert LessonStore(path).in_scope(_related(), backend="k8s"), "every real backend measures the same hardware"
    assert LessonStore(path).in_scope(_related(), backend="sim") == [], "real lessons do not steer the simulator"
    other_hw = tiny_recipe_dict()
    other_hw["resources"]["accelerator"] = "h100-sxm-80gb"
    here = {lz.id: m for lz, m in LessonStore(path).in_scope(_related(), backend="local")}
    there = {lz.id: m for lz, m in LessonStore(path).in_scope(Recipe.model_validate(other_hw), backend="local")}
    assert set(there) == set(here), "another accelerator is a condition, not a wall"
    assert all(there[k] <= 0.6 * here[k] + 1e-9 and there[k] < INFEASIBLE_PRUNE_MATCH for k in there), \
        "lessons of other hardware weigh less and never prune"
    lesson = LessonStore(path).all()[0]
    assert scope_match(lesson.scope, lesson.scope.model_copy(update={"framework": "hf"})) == 0.0, \
        "another framework's knobs are other knobs"


def test_the_tuner_threads_its_backend_name_into_the_policy_context(tmp_path):
    seen = []

    class Spy(PlaybookPolicy):
        def propose(self, ctx):
            seen.append(ctx.backend)
            return super().propose(ctx)

    _run(tmp_path, tiny_recipe(), _backend("sim"), Spy(), "spy")
    assert seen and set(seen) == {"sim"}


# -- (b) confirmed only by accepted changes --------------------------------------------------------------------


def test_a_gain_the_engine_rejected_never_confirms_a_lesson(tmp_path):
    r = tiny_recipe()
    store = LessonStore(tmp_path / "lessons.json")
    rejected = "rejected: +25.0% does not clear the noise floor 30.0%"
    for run in ("r1", "r2", "r3"):
        state = _state(r, [baseline_record(r), _trial(r, 2, {"compile_mode": "default"}, gain=0.25,
                                                      decision=rejected)])
        record_run(state, store, run_id=run)
    lesson = next(lz for lz in LessonStore(tmp_path / "lessons.json").all() if lz.action.knob == "compile_mode")
    assert lesson.status != "confirmed", "a +25 % the engine rejected as noise confirmed the lesson"
    assert lesson.inconclusive == 3 and lesson.supporting == 0


def test_a_gain_that_did_not_hold_on_rerun_is_inconclusive(tmp_path):
    r = tiny_recipe()
    store = LessonStore(tmp_path / "lessons.json")
    recs = [baseline_record(r), _trial(r, 2, {"compile_mode": "default"}, gain=0.25,
                                       decision="pending confirmation re-run"),
            _trial(r, 3, {"compile_mode": "default"}, gain=0.12, kind="confirm",
                   decision="rejected: +12.0% gain did not hold on re-run 30.0%")]
    record_run(_state(r, recs), store, run_id="r1")
    lesson = next(lz for lz in store.all() if lz.action.knob == "compile_mode")
    assert lesson.status == "hypothesis" and lesson.inconclusive == 2


def test_accepted_changes_confirm_directly_or_through_the_loss_check(tmp_path):
    r = tiny_recipe()
    store = LessonStore(tmp_path / "lessons.json")
    direct = [baseline_record(r), _trial(r, 2, {"compile_mode": "default"}, gain=0.25,
                                         decision="pending confirmation re-run"),
              _trial(r, 3, {"compile_mode": "default"}, gain=0.24, kind="confirm", accepted=True,
                     decision="accepted: +24.0% over best")]
    via_loss = [baseline_record(r), _trial(r, 2, {"optimizer_impl": "fused"}, gain=0.2,
                                           decision="pending confirmation re-run"),
                _trial(r, 3, {"optimizer_impl": "fused"}, gain=0.2, kind="confirm",
                       decision="pending loss-equivalence check"),
                _trial(r, 4, {"optimizer_impl": "fused"}, gain=0.2, kind="loss_check", accepted=True,
                       decision="accepted: +20.0% over best; loss curve equivalent")]
    record_run(_state(r, direct), store, run_id="direct")
    record_run(_state(r, via_loss), store, run_id="loss")
    by_knob = {lz.action.knob: lz for lz in store.all()}
    assert by_knob["compile_mode"].status == "confirmed" and by_knob["compile_mode"].supporting == 2
    assert by_knob["optimizer_impl"].status == "confirmed" and by_knob["optimizer_impl"].supporting == 2


# -- (c) a corrupt store is moved aside, never overwritten ----------------------------------------------------


def _eight(path: Path) -> bytes:
    store = LessonStore(path)
    store.add([_obs(f"v{i}") for i in range(8)], "r0")
    store.save()
    assert len(LessonStore(path).all()) == 8
    return path.read_bytes()


def test_a_store_with_one_bad_lesson_is_kept_aside_not_overwritten(tmp_path, caplog):
    path = tmp_path / "lessons.json"
    _eight(path)
    data = json.loads(path.read_text())
    data["lessons"][2]["bogus"] = 1  # one lesson a newer attune (or a hand edit) wrote
    path.write_text(json.dumps(data))
    original = path.read_bytes()
    caplog.set_level(logging.WARNING, logger="attune.agent.lessons")
    store = LessonStore(path)
    store.add([_obs("new")], "r1")
    store.save()
    kept = sorted(tmp_path.glob("lessons.json.corrupt-*"))
    assert len(kept) == 1 and kept[0].read_bytes() == original, "the corrupt store was overwritten"
    assert any("corrupt" in rec.getMessage() and str(kept[0]) in rec.getMessage() for rec in caplog.records
               if rec.levelno >= logging.WARNING)
    assert len(LessonStore(path).all()) == 8, "the 7 readable lessons and the new one are all kept"


def test_a_truncated_store_is_kept_aside(tmp_path, caplog):
    path = tmp_path / "lessons.json"
    full = _eight(path)
    path.write_bytes(full[: len(full) // 2])
    truncated = path.read_bytes()
    caplog.set_level(logging.WARNING, logger="attune.agent.lessons")
    store = LessonStore(path)
    assert store.all() == []
    store.add([_obs("new")], "r1")
    store.save()
    kept = sorted(tmp_path.glob("lessons.json.corrupt-*"))
    assert len(kept) == 1 and kept[0].read_bytes() == truncated
    assert [lz.action.value for lz in LessonStore(path).all()] == ["new"]
    assert any(rec.levelno >= logging.WARNING and "corrupt" in rec.getMessage() for rec in caplog.records)


# -- (d) concurrent writers -----------------------------------------------------------------------------------


def _writer(path: str, worker: int, count: int, barrier) -> None:  # runs in a child process
    barrier.wait(30)
    for i in range(count):
        store = LessonStore(path)
        store.add([_obs(f"w{worker}-{i}")], f"run-w{worker}-{i}")
        store.save()


def test_two_processes_writing_concurrently_lose_no_lesson(tmp_path):
    path = tmp_path / "lessons.json"
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    count = 40
    procs = [ctx.Process(target=_writer, args=(str(path), w, count, barrier)) for w in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert all(p.exitcode == 0 for p in procs)
    values = {lz.action.value for lz in LessonStore(path).all()}
    missing = {f"w{w}-{i}" for w in range(2) for i in range(count)} - values
    assert not missing, f"{len(missing)} lesson(s) lost to a concurrent writer"
    assert not list(tmp_path.glob(".lessons-*")), "no temporary file is left behind"


# -- (e) failures are infeasible, not effects -----------------------------------------------------------------


def test_an_oom_is_recorded_as_infeasible_and_the_playbook_avoids_the_move(tmp_path):
    r = tiny_recipe()
    store = LessonStore(tmp_path / "lessons.json")
    recs = [baseline_record(r), _trial(r, 2, {"nproc_per_node": 2}, outcome=TrialOutcome.OOM,
                                       decision="rejected: trial oom"),
            _trial(r, 3, {"micro_batch_size": 2}, outcome=TrialOutcome.CRASHED, decision="rejected: trial crashed")]
    record_run(_state(r, recs, backend="local"), store, run_id="r1")
    by_knob = {lz.action.knob: lz for lz in LessonStore(tmp_path / "lessons.json").all()}
    oom = by_knob["nproc_per_node"]
    assert oom.effects == (), "an OOM is not a −100 % effect"
    assert oom.infeasible == 1 and oom.failures == ("oom",) and oom.is_infeasible
    assert by_knob["micro_batch_size"].effects == () and by_knob["micro_batch_size"].failures == ("crashed",)

    ctx = context(r, [baseline_record(r)])
    pb = PlaybookPolicy(lessons=LessonStore(tmp_path / "lessons.json"))
    changes = [c.change for c in pb.candidates(ctx, pb.diagnosis(ctx))]
    assert {"nproc_per_node": 2} not in changes and {"micro_batch_size": 2} not in changes
    proposal = pb.propose(ctx)
    assert proposal.set != {"nproc_per_node": 2}


def test_a_failure_demotes_a_confirmed_lesson(tmp_path):
    store = LessonStore(tmp_path / "lessons.json")
    store.add([_obs("default", 0.2, verdict="accepted"), _obs("default", 0.2, verdict="accepted")], "r1")
    assert store.all()[0].status == "confirmed"
    failed = _obs("default").model_copy(update={"effect": None, "verdict": "infeasible", "outcome": "oom"})
    store.add([failed], "r2")
    lesson = store.all()[0]
    assert lesson.status == "hypothesis" and lesson.demotions == 1 and lesson.infeasible == 1
    assert lesson.effects == (0.2, 0.2)


# -- a store written by an older attune -----------------------------------------------------------------------


def test_a_version_1_store_is_migrated_conservatively(tmp_path):
    path = tmp_path / "lessons.json"
    scope = scope_of(tiny_recipe()).model_dump(mode="json")
    del scope["backend"]  # version 1 did not record the backend

    def item(lid, value, effects, status):
        return {"id": lid, "scope": scope, "condition": {"bottleneck": "compute_bound", "evidence": []},
                "action": {"knob": "compile_mode", "direction": "set", "value": value}, "effects": effects,
                "status": status, "demotions": 0, "runs": ["old"], "created": 1.0, "updated": 1.0}

    path.write_text(json.dumps({"version": 1, "lessons": [item("a1", "default", [-1.0], "hypothesis"),
                                                          item("b2", "max-autotune-no-cudagraphs", [0.3, 0.3],
                                                               "confirmed")]}))
    store = LessonStore(path)
    by_id = {lz.id: lz for lz in store.all()}
    assert by_id["a1"].effects == () and by_id["a1"].infeasible == 1 and by_id["a1"].is_infeasible
    assert by_id["b2"].status == "hypothesis" and by_id["b2"].inconclusive == 2, \
        "whether the engine accepted those gains was not recorded"
    assert by_id["b2"].scope.backend == ""
    assert store.in_scope(tiny_recipe(), backend="local") == [], "lessons of unknown provenance count as simulated"
    assert len(store.in_scope(tiny_recipe(), backend="local", include_simulated=True)) == 2
    store.add([_obs("new")], "r1")
    store.save()
    saved = json.loads(path.read_text())
    assert saved["version"] == 2 and len(saved["lessons"]) == 3
    assert not list(tmp_path.glob("lessons.json.corrupt-*"))
