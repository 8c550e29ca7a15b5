"""The typed trial vocabulary keeps its JSON forms: records written before statuses and kinds were enums (a journal
of an earlier attune) replay with the status their text meant, and a run that resumes from such a journal carries on
where it stopped (a pending confirmation is confirmed next)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attune.engine.journal import Event
from attune.engine.loop import ActionKind, TuneConfig, Tuner, next_action
from attune.policies.coordinate import CoordinateDescent
from attune.recipe.change import signature
from attune.recipe.io import recipe_to_dict
from attune.testing.factories import tiny_recipe
from attune.testing.fakes import FakeBackend
from attune.trial import (
    NOT_RUN_MOOT,
    PENDING_CONFIRM,
    PENDING_LOSS_CHECK,
    PENDING_MORE,
    PENDING_PAIR,
    Decision,
    FailureKind,
    TrialKind,
    TrialOutcome,
    TrialRecord,
)


def _old(decision: str, *, outcome: str = "succeeded", accepted: bool = False, kind: str = "candidate") -> dict:
    """A record as an earlier attune wrote it: no status field."""
    return {"id": 3, "kind": kind, "outcome": outcome, "accepted": accepted, "decision": decision}


@pytest.mark.parametrize(("record", "status"), [
    (_old(PENDING_CONFIRM), Decision.PENDING_CONFIRM),
    (_old(PENDING_PAIR), Decision.PENDING_PAIR),
    (_old(PENDING_MORE, kind="confirm"), Decision.PENDING_MORE),
    (_old(PENDING_LOSS_CHECK), Decision.PENDING_LOSS_CHECK),
    (_old("accepted: +5.0% over best (floor 1.0%)", accepted=True), Decision.KEPT),
    (_old("rejected: -1.0% does not clear the noise floor 2.0%"), Decision.REJECTED),
    (_old("refused by the gate (no budget spent)", outcome="refused"), Decision.REFUSED),
    (_old(f"{NOT_RUN_MOOT}: nothing to overlap", outcome="refused"), Decision.MOOT),
    (_old("baseline run", kind="baseline"), Decision.NOTED),
])
def test_a_record_without_a_status_gets_the_one_its_text_meant(record: dict, status: Decision) -> None:
    rec = TrialRecord.model_validate(record)
    assert rec.status is status
    assert rec.kind is TrialKind(record["kind"])
    dumped = rec.model_dump(mode="json")
    assert dumped["kind"] == record["kind"] and dumped["status"] == status.value  # plain strings in JSON
    assert TrialRecord.model_validate(dumped) == rec


def test_enums_compare_equal_to_their_journal_strings() -> None:
    assert TrialKind.CANDIDATE == "candidate" and FailureKind.OOM == "oom" and Event.TRIAL_FINISHED == "trial_finished"
    assert FailureKind.OOM.outcome is TrialOutcome.OOM and FailureKind.COMM.outcome is TrialOutcome.CRASHED
    assert json.dumps({"kind": TrialKind.CONFIRM, "failure": FailureKind.DIVERGED}) == \
        '{"kind": "confirm", "failure": "diverged"}'


def test_an_old_journal_with_a_pending_confirmation_resumes_with_the_confirmation(tmp_path: Path) -> None:
    recipe = tiny_recipe()
    config = TuneConfig.from_recipe(recipe, 10.0)
    run = tmp_path / "run"
    run.mkdir()
    sig_records = []
    for i in (1, 2):
        sig_records.append({"id": i, "kind": "baseline", "outcome": "succeeded", "decision": "baseline run",
                            "signature": signature(recipe), "charged_hours": 0.01,
                            "measurement": {"tokens_per_s_per_device": 100.0, "tokens_per_s": 100.0,
                                            "step_time_median_s": 1.0, "step_time_cv": 0.01, "steps_measured": 4}})
    change = {next(iter(config.search_space)): recipe.catalogue[next(iter(config.search_space))].values[-1]}
    cand = {"id": 3, "kind": "candidate", "outcome": "succeeded", "decision": PENDING_CONFIRM, "change": change,
            "charged_hours": 0.01,
            "measurement": {"tokens_per_s_per_device": 120.0, "tokens_per_s": 120.0, "step_time_median_s": 0.8,
                            "step_time_cv": 0.01, "steps_measured": 4}}
    events = [{"event": "run_started", "recipe": recipe_to_dict(recipe), "config": config.to_dict(), "backend": "fake",
               "policy": "playbook"}]
    events += [{"event": "trial_finished", "record": r} for r in (*sig_records, cand)]
    (run / "journal.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))

    tuner = Tuner.resume(run, backend=FakeBackend(), policy=CoordinateDescent())
    try:
        state = tuner.state
        assert [r.status for r in state.records] == [Decision.NOTED, Decision.NOTED, Decision.PENDING_CONFIRM]
        assert next_action(state).kind is ActionKind.CONFIRM
    finally:
        tuner.lock.release()
