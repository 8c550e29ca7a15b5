"""Lessons: distil, persist, demote a contradicted lesson, and make a related second run reach its best sooner."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from attune.agent.lessons import Condition, LessonAction, LessonStore, Observation, fold, record_run, scope_of
from attune.commands.lessons import app
from attune.recipe.model import Recipe
from attune.testing.factories import tiny_recipe, tiny_recipe_dict
from tests.agent.lessons_runs import tune_with_lessons


def _trials_to_best(state):
    best = state.best_record()
    launched = [r for r in state.records if r.outcome.value != "refused"]
    return next(i for i, r in enumerate(launched, start=1) if r.signature == best.signature)


def test_record_run_distils_and_persists(tmp_path):
    store = LessonStore(tmp_path / "lessons.json")
    state = tune_with_lessons(tmp_path, tiny_recipe(), store, "a")
    touched = record_run(state, store)
    assert touched and (tmp_path / "lessons.json").exists()
    again = LessonStore(tmp_path / "lessons.json").all()
    assert {lz.id for lz in again} == {lz.id for lz in store.all()}
    nproc = next(lz for lz in again if lz.action.knob == "nproc_per_node" and lz.action.direction == "up")
    # kept at the look after its reference run (A-B-A from the baseline's second run): its first run and the paired
    # look are two observations, as a candidate and its confirm are
    assert nproc.status == "confirmed" and nproc.mean_effect > 0.3 and len(nproc.effects) == 2
    mbs = next(lz for lz in again if lz.action.knob == "micro_batch_size" and lz.action.direction == "up"
               and lz.effects)
    # kept on its pair: its first run and each look (as a candidate and each confirm were before the lead run)
    assert mbs.status == "confirmed" and len(mbs.effects) >= 2
    assert nproc.scope.framework == "torch" and nproc.scope.accelerator == "cpu"
    assert [lz for lz in again if lz.mean_effect < 0.02], "moves that did not pay are recorded too"


def test_contradicted_lesson_is_demoted_then_disproven():
    scope = scope_of(tiny_recipe())

    obs = Observation(scope=scope, condition=Condition(bottleneck="compute_bound"),
                      action=LessonAction(knob="compile_mode", direction="up", value="default"), effect=0.08,
                      verdict="accepted")
    lz = fold(fold(None, obs, "r1"), obs, "r1")
    assert lz.status == "confirmed"
    lz = fold(lz, obs.model_copy(update={"effect": -0.03}), "r2")
    assert lz.status == "hypothesis" and lz.demotions == 1
    lz = fold(lz, obs.model_copy(update={"effect": -0.05}), "r3")
    lz = fold(lz, obs.model_copy(update={"effect": -0.02}), "r3")
    assert lz.status == "disproven" and lz.runs == ("r1", "r2", "r3")


def test_second_related_run_reaches_best_in_fewer_trials(tmp_path):
    store = LessonStore(tmp_path / "lessons.json")
    first = tune_with_lessons(tmp_path, tiny_recipe(), store, "first")
    assert first.best_record().knobs["optimizer_impl"] == "fused"
    record_run(first, store)
    data = tiny_recipe_dict()
    data["model"]["layers"] = 3  # a related recipe: same family, size bucket, accelerator and scale
    related = Recipe.model_validate(data)
    cold = tune_with_lessons(tmp_path, related, None, "cold")
    warm = tune_with_lessons(tmp_path, related, LessonStore(tmp_path / "lessons.json"), "warm")
    assert warm.best_record().knobs == cold.best_record().knobs
    assert _trials_to_best(warm) < _trials_to_best(cold)
    fused = next(r for r in warm.records if r.kind == "candidate" and r.change.get("optimizer_impl") == "fused")
    assert fused.lessons and "lessons" in fused.rationale, "the report can say which proposal a lesson moved"
    assert not any(r.lessons for r in cold.records)


def test_lessons_cli_list_show_forget(tmp_path):
    path = tmp_path / "lessons.json"
    store = LessonStore(path)
    record_run(tune_with_lessons(tmp_path, tiny_recipe(), store, "a"), store)
    runner = CliRunner()
    out = runner.invoke(app, ["list", "--store", str(path), "--json"])
    assert out.exit_code == 0, out.output
    ids = [item["id"] for item in json.loads(out.output)]
    shown = runner.invoke(app, ["show", ids[0], "--store", str(path)])
    assert shown.exit_code == 0 and ids[0] in shown.output
    gone = runner.invoke(app, ["forget", ids[0], "--store", str(path)])
    assert gone.exit_code == 0
    assert LessonStore(path).get(ids[0]) is None
    assert runner.invoke(app, ["show", "nope", "--store", str(path)]).exit_code == 1


def test_recording_the_same_run_twice_changes_nothing(tmp_path):
    store = LessonStore(tmp_path / "lessons.json")
    state = tune_with_lessons(tmp_path, tiny_recipe(), store, "a")
    record_run(state, store, run_id="run-a")
    before = {lz.id: lz.effects for lz in store.all()}
    assert record_run(state, store, run_id="run-a") == []
    assert {lz.id: lz.effects for lz in LessonStore(tmp_path / "lessons.json").all()} == before
