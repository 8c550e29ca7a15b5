"""Lessons as evidence with a scope: alike jobs move the prior, unlike ones stay out of the way, a lesson is tried at
most once per run and a counter-example in this run demotes it, never-paid lessons are forgotten, and what a lesson
moved is on the trial's record and in the report."""

from __future__ import annotations

import math

from attune.agent.lessons import (
    FORGET_AFTER_RUNS,
    PRIOR_WEIGHT,
    UNKNOWN_SIMILARITY,
    Condition,
    Lesson,
    LessonAction,
    LessonStore,
    Observation,
    direction_of,
    estimate,
    job_features,
    never_paid,
    record_run,
    scope_of,
    similarity,
)
from attune.policies.playbook import PlaybookPolicy
from attune.recipe.change import apply_change, signature
from attune.report.evidence import steered
from attune.testing.factories import tiny_recipe
from attune.trial import TrialOutcome, TrialRecord
from tests.agent.helpers import baseline_record, context
from tests.agent.lessons_runs import tune_with_lessons

COMM = {"bottleneck:communication": 1.0, "share:communication": 0.35, "share:compute": 0.55, "log10_params": 9.9,
        "log2_seq": 12.0, "log2_devices": 6.0, "moe": 0.0, "accelerator:h100-sxm-80gb": 1.0}
COMPUTE = {"bottleneck:compute_bound": 1.0, "share:communication": 0.02, "share:compute": 0.95, "log10_params": 8.1,
           "log2_seq": 15.0, "log2_devices": 3.0, "moe": 1.0, "accelerator:b200": 1.0}


def _lesson(features: dict[str, float], effects: tuple[float, ...], lid: str = "l1", knob: str = "optimizer_impl",
            value: str = "fused") -> Lesson:
    scope = scope_of(tiny_recipe())
    return Lesson(id=lid, scope=scope, condition=Condition(bottleneck="communication", features=features),
                  action=LessonAction(knob=knob, direction="set", value=value), effects=effects,
                  conditions=tuple(features for _ in effects), supporting=len(effects), runs=("r",))


def test_similarity_is_one_for_alike_jobs_and_falls_for_unlike_ones():
    assert similarity(COMM, COMM) == 1.0
    near = dict(COMM, **{"share:communication": 0.30, "share:compute": 0.6})
    assert 0.9 < similarity(COMM, near) < 1.0
    assert similarity(COMM, COMPUTE) < 0.05
    assert similarity({}, COMM) == UNKNOWN_SIMILARITY


def test_alike_evidence_moves_the_prior_and_unlike_evidence_converges_to_no_effect():
    prior = 0.01
    alike = [(_lesson(COMM, (0.30, 0.28), lid=f"a{i}"), 1.0) for i in range(3)]
    est = estimate(alike, "optimizer_impl", "set", "fused", COMM, prior)
    assert est.moved and est.gain > 0.2, "six alike measurements of +29% outweigh a prior of +1%"
    assert math.isclose(est.gain, (6 * 0.29 + PRIOR_WEIGHT * prior) / (6 + PRIOR_WEIGHT), rel_tol=0.02)
    # a hundred lessons from unlike jobs, half saying +40 %, half −20 %: they barely move the prior
    unlike = [(_lesson(COMPUTE, (0.4 if i % 2 else -0.2,), lid=f"u{i}"), 1.0) for i in range(100)]
    est = estimate(unlike, "optimizer_impl", "set", "fused", COMM, prior)
    assert abs(est.gain - prior) < 0.02
    # and lessons about another knob say nothing
    assert not estimate(alike, "micro_batch_size", "up", 2, COMM, prior).moved


def test_a_lesson_raises_a_move_at_most_once_per_run_and_a_counter_example_demotes_it(tmp_path):
    r = tiny_recipe()
    store = LessonStore(tmp_path / "lessons.json")
    feats = job_features(r, baseline_record(r).measurement)
    way = direction_of(r.catalogue, "optimizer_impl", r.knob("optimizer_impl"), "fused")
    obs = Observation(scope=scope_of(r, "local"), condition=Condition(bottleneck="compute_bound", features=feats),
                      action=LessonAction(knob="optimizer_impl", direction=way, value="fused"), effect=0.3,
                      verdict="accepted")
    store.add([obs, obs], "earlier")
    store.save()
    policy = PlaybookPolicy(lessons=store)
    base = baseline_record(r)

    def fused_candidate(records):
        ctx = context(r, records=records)
        return next((c for c in policy.candidates(ctx, policy.diagnosis(ctx))
                     if c.change.get("optimizer_impl") == "fused"), None)

    fresh = fused_candidate([base])
    assert fresh is not None and fresh.lessons, "the lesson moves the fused optimizer's prior"
    without = PlaybookPolicy(lessons=None)
    ctx0 = context(r, records=[base])
    plain = next(c for c in without.candidates(ctx0, without.diagnosis(ctx0)) if c.change.get("optimizer_impl") == "fused")
    assert fresh.expected_gain > plain.expected_gain
    # this run tried it once (from another parent): the lesson no longer raises it
    tried = TrialRecord(id=2, kind="candidate", change={"optimizer_impl": "fused", "micro_batch_size": 2},
                        signature="x", outcome=TrialOutcome.SUCCEEDED, gain=0.0)
    again = fused_candidate([base, tried])
    assert again is None or not again.lessons
    # a counter-example on the same knob in this run (another value, no gain) demotes the lesson at once
    other = next(v for v in r.catalogue["optimizer_impl"].values if v not in ("fused", r.knob("optimizer_impl")))
    moved = apply_change(r, {"optimizer_impl": other})
    counter = TrialRecord(id=2, kind="candidate", change={"optimizer_impl": other}, knobs=moved.effective_knobs,
                          signature=signature(moved), outcome=TrialOutcome.SUCCEEDED, gain=-0.01,
                          measurement=base.measurement)
    demoted = fused_candidate([base, counter])
    assert demoted is None or not demoted.lessons


def test_a_lesson_that_never_paid_is_forgotten(tmp_path):
    r = tiny_recipe()
    store = LessonStore(tmp_path / "lessons.json")
    obs = Observation(scope=scope_of(r), condition=Condition(bottleneck="compute_bound"),
                      action=LessonAction(knob="compile_mode", direction="up", value="default"), effect=-0.01,
                      verdict="rejected")
    for run in range(FORGET_AFTER_RUNS - 1):
        store.add([obs], f"r{run}")
    store.save()
    lz = next(lz for lz in LessonStore(store.path).all() if lz.action.knob == "compile_mode")
    assert not never_paid(lz), "two runs are not a record yet"
    store.add([obs], "last")
    store.save()
    assert not [lz for lz in LessonStore(store.path).all() if lz.action.knob == "compile_mode"]
    paid = Observation(scope=scope_of(r), condition=Condition(bottleneck="compute_bound"),
                       action=LessonAction(knob="compile_mode", direction="up", value="max-autotune"), effect=0.05,
                       verdict="accepted")
    for run in range(FORGET_AFTER_RUNS + 1):
        store.add([paid if run == 0 else paid.model_copy(update={"effect": -0.01, "verdict": "rejected"})], f"p{run}")
    store.save()
    assert [lz for lz in LessonStore(store.path).all() if lz.action.value == "max-autotune"], \
        "a lesson that paid once is kept (the counter-examples weigh it down instead)"


def test_each_measured_effect_keeps_the_conditions_it_was_measured_under(tmp_path):
    store = LessonStore(tmp_path / "lessons.json")
    record_run(tune_with_lessons(tmp_path, tiny_recipe(), None, "a"), store)
    lessons = LessonStore(store.path).all()
    assert lessons and all(len(lz.conditions) == len(lz.effects) for lz in lessons)
    measured = [c for lz in lessons for c in lz.conditions if c]
    assert measured and all("log2_devices" in c and "accelerator:cpu" in c for c in measured), \
        "the fake backend reports no phases: the recipe's own conditions are recorded"


def test_the_report_lists_what_each_lesson_moved_and_what_came_of_it(tmp_path):
    store = LessonStore(tmp_path / "lessons.json")
    first = tune_with_lessons(tmp_path, tiny_recipe(), store, "first")
    record_run(first, store)
    warm = tune_with_lessons(tmp_path, tiny_recipe(), LessonStore(store.path), "warm")
    rows = steered(warm)
    assert rows and all(row["lessons"] for row in rows)
    assert {row["trial"] for row in rows} == {r.id for r in warm.records if r.lessons and r.kind == "candidate"}
    assert any(row["kept"] for row in rows) and all(isinstance(row["kept"], bool) for row in rows)
    assert steered(first) == []


def test_old_lessons_without_conditions_still_load_and_weigh_little():
    lz = Lesson.model_validate({"id": "old", "scope": scope_of(tiny_recipe()).model_dump(),
                                "condition": {"bottleneck": "compute_bound"},
                                "action": {"knob": "optimizer_impl", "direction": "set", "value": "fused"},
                                "effects": [0.3], "supporting": 1})
    est = estimate([(lz, 1.0)], "optimizer_impl", "set", "fused", COMM, 0.01)
    assert est.gain < 0.01 + 0.3 * UNKNOWN_SIMILARITY
