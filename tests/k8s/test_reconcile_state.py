"""A run's state through :func:`reconcile` and :func:`decide`: a status that stays small over hundreds of trials, one
run driver whose stop rules live in the engine, and the spec the run accepted (frozen edits that slipped past are
ignored and reported)."""

from __future__ import annotations

import copy
import json

import pytest

from attune.engine.loop import ActionKind, RunState, TuneConfig, next_action, plan_trial
from attune.operator.reconcile import (
    NeedObservation,
    Observations,
    decide,
    reconcile,
)
from attune.trial import TrialOutcome, TrialRecord
from tests.k8s.fakes import FakePorts, conds, records, step, tuning_run

pytestmark = pytest.mark.k8s


# -- bounded status ------------------------------------------------------------------------------------------------

def test_the_run_object_stays_small_over_200_trials():
    ports = FakePorts()
    run = tuning_run()
    run["spec"]["metrics"].update(baselineRepeats=200, measureSteps=60)
    run["spec"]["budget"].update(acceleratorHours=1000, maxTrials=200)
    sizes = {}
    for _ in range(1000):
        step(run, ports)
        ports.finish()
        n = len(records(ports, run)) if len(ports.trials) % 50 == 0 else None
        if n:
            sizes[n] = len(json.dumps(run))
        if run["status"].get("phase") in ("Succeeded", "Failed"):
            break
    assert run["status"]["phase"] == "Succeeded", run["status"]["message"]
    assert len(ports.trials) == 200 and run["status"]["trials"]["total"] == 200
    size = len(json.dumps(run))
    trial_size = max(len(json.dumps(t)) for t in ports.trials.values())
    print(f"run object {size} B after 200 trials, largest trial {trial_size} B; sizes {sizes}")
    assert size < 32 * 1024, size
    assert max(sizes.values()) - min(sizes.values()) < 2048, sizes  # does not grow with the trials
    assert trial_size < 64 * 1024
    assert run["status"]["cursor"]["nextTrial"] == 201


def test_refusals_are_kept_bounded():
    from attune.operator.resources import REFUSED_KEPT

    ports = FakePorts()
    run = tuning_run()
    old = step(run, ports).status
    status = {**run["status"], "refused": [], "cursor": {"refused": 0}}
    for i in range(40):
        rec = TrialRecord(id=100 + i, kind="candidate", outcome=TrialOutcome.REFUSED, message="no",
                          verdict={"admitted": False})
        status["refused"] = (status["refused"] + [rec.model_dump(mode="json")])[-REFUSED_KEPT:]
    assert old
    run["status"] = status
    res = reconcile(run, ports)
    assert len(res.status["refused"]) == REFUSED_KEPT


# -- one run driver, a pure decision -------------------------------------------------------------------------------

def test_actions_are_typed_and_every_stop_rule_lives_in_the_engine():
    from attune.recipe.io import parse_recipe

    recipe = parse_recipe(tuning_run()["spec"]["recipe"]["inline"])
    cfg = TuneConfig.from_recipe(recipe, 1.0, max_failed_trials=2)
    st = RunState(baseline=recipe, config=cfg)
    a = next_action(st)
    assert a.kind is ActionKind.BASELINE and a.kind == "baseline"
    plan = plan_trial(st, a)
    from attune.trial import Measurement

    m = Measurement(tokens_per_s_per_device=100, tokens_per_s=100, step_time_median_s=1, step_time_cv=0.01,
                    steps_measured=10)
    crashed = [TrialRecord(id=i, kind="baseline", outcome=TrialOutcome.SUCCEEDED, signature=plan.signature,
                           charged_hours=0.01, measurement=m) for i in (1, 2)] + \
              [TrialRecord(id=i, kind="candidate", outcome=TrialOutcome.CRASHED, signature=f"s{i}",
                           charged_hours=0.01) for i in (3, 4)]
    st.records.extend(crashed)
    st.config = TuneConfig.from_recipe(recipe, 1.0, max_failed_trials=2, baseline_repeats=5)
    assert next_action(st).kind is ActionKind.FINISH and "max_failed_trials 2" in next_action(st).reason
    st.config = TuneConfig.from_recipe(recipe, 1.0, max_failed_trials=3, baseline_repeats=5)
    assert next_action(st).kind is ActionKind.BASELINE  # under the limit: the engine goes on
    # the operator's maxFailedTrials is the engine's
    from attune.operator.reconcile import tune_config
    from attune.operator.resources import TuningRunSpec

    assert tune_config(TuningRunSpec.model_validate(tuning_run()["spec"]), recipe).max_failed_trials == 2


def test_decide_is_pure_and_asks_for_what_it_needs():
    run = tuning_run()
    obs = Observations(1_000_000.0)
    with pytest.raises(NeedObservation) as need:
        decide(run, obs)  # no ports at all: it can only ask
    assert need.value.key == ("trials", "ml", "r")
    with pytest.raises(NeedObservation) as need:
        decide(copy.deepcopy(run), Observations(1_000_000.0, {("trials", "ml", "r"): []}))
    assert need.value.key == ("hours_left", "ml")  # the namespace's quota, before a trial is launched
    seen = {("trials", "ml", "r"): [], ("hours_left", "ml"): None}
    a = decide(copy.deepcopy(run), Observations(1_000_000.0, dict(seen)))
    b = decide(copy.deepcopy(run), Observations(1_000_000.0, dict(seen)))
    assert a.status == b.status and a.effects == b.effects  # same inputs, same decision
    assert [type(e).__name__ for e in a.effects] == ["CreateTrial"]


def test_the_operators_baseline_record_is_the_engines():
    """The CLI's tuner and the operator assemble records alike: same plan, same verdict, same decision."""
    from attune.backends.base import TrialResult
    from attune.engine.loop import trial_record
    from attune.recipe.io import parse_recipe

    ports = FakePorts()
    run = tuning_run()
    for _ in range(3):
        step(run, ports)
        ports.finish()
    [rec] = records(ports, run)
    recipe = parse_recipe(run["spec"]["recipe"]["inline"])
    st = RunState(baseline=recipe, config=TuneConfig.from_recipe(recipe, 1.0))
    plan = plan_trial(st, next_action(st))
    mine = trial_record(st, plan, TrialResult(TrialOutcome.SUCCEEDED, None, 1.0, 1, 0.0))
    assert rec["verdict"] == mine.verdict and rec["verdict"] is not None
    assert rec["decision"] == mine.decision and rec["source"] == mine.source and rec["signature"] == mine.signature


# -- the operator runs on the spec it accepted ---------------------------------------------------------------------

def test_frozen_edits_that_slipped_past_are_ignored_and_reported_then_cleared():
    ports = FakePorts()
    run = tuning_run()
    step(run, ports)
    step(run, ports)
    ports.finish()
    image = run["spec"]["trialTemplate"]["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    original = image["image"]
    edited = copy.deepcopy(run)
    edited["spec"]["trialTemplate"]["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0][
        "image"] = "evil/image:latest"
    edited["spec"]["searchSpace"] = ["micro_batch_size"]
    edited["spec"]["budget"]["acceleratorHours"] = 5.0  # an increase: taken
    edited["metadata"]["generation"] = 2
    frozen_events = []  # per step, the FrozenFieldChanged events it emitted
    for _ in range(4):
        res = step(edited, ports)
        frozen_events.append([e for e in res.events if e[1] == "FrozenFieldChanged"])
        ports.finish()
    c = conds(edited)["SpecAccepted"]
    assert c["status"] == "False" and c["reason"] == "FrozenFieldChanged"
    assert "spec.trialTemplate is frozen" in c["message"] and "spec.searchSpace is frozen" in c["message"]
    assert c["observedGeneration"] == 2
    # reported once as a Warning event, by the step that first saw the edit; the later steps keep the condition but
    # do not repeat the event while the condition already says the same
    assert frozen_events == [[("Warning", "FrozenFieldChanged", c["message"])], [], [], []]
    for name in ports.jobs_created:
        pod = ports.jobs[name]["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
        assert pod["image"] == original, "a frozen field's edit reached a trial"
    assert edited["status"]["budget"]["hoursLimit"] == 5.0
    edited["spec"]["trialTemplate"] = copy.deepcopy(run["spec"]["trialTemplate"])
    edited["spec"]["searchSpace"] = run["spec"]["searchSpace"]
    edited["metadata"]["generation"] = 3
    step(edited, ports)
    c = conds(edited)["SpecAccepted"]
    assert c["status"] == "True" and c["observedGeneration"] == 3  # it returns to True
