"""Journals that survive torn writes, one writer per run directory, and resumes that never re-spend budget."""

from __future__ import annotations

import json

import pytest

from attune.engine.journal import Event, Journal, RunLock
from attune.engine.loop import TuneConfig, Tuner
from attune.errors import JournalError
from attune.policies import make_policy
from attune.testing.factories import tiny_recipe
from attune.testing.fakes import FakeBackend


def finished_run(run_dir, trials=4):
    r = tiny_recipe()
    cfg = TuneConfig.from_recipe(r, 10.0, search_space=("micro_batch_size", "nproc_per_node"), max_trials=trials)
    Tuner(r, backend=FakeBackend(), policy=make_policy("coordinate"), config=cfg, run_dir=run_dir).run()
    return Journal(run_dir)


def resume(run_dir, budget=None):
    return Tuner.resume(run_dir, backend=FakeBackend(), policy=make_policy("coordinate"), budget_hours=budget)


def test_a_torn_last_record_at_every_byte_offset_is_set_aside_and_the_run_resumes(tmp_path):
    src = finished_run(tmp_path / "src")
    data = src.path.read_bytes()
    lines = data.splitlines(keepends=True)
    # drop the run_finished line so the resumed run has work left, then tear the last trial record
    body, last = b"".join(lines[:-2]), lines[-2]
    assert json.loads(last)["event"] == "trial_finished"
    for cut in range(1, len(last)):
        run = tmp_path / f"cut{cut}"
        run.mkdir()
        (run / "journal.jsonl").write_bytes(body + last[:cut])
        tuner = resume(run, budget=10.0)
        before = len(tuner.state.records)
        state = tuner.run()
        assert state.finished
        side = list(run.glob("journal.torn-*.jsonl"))
        if cut < len(last) - 1:  # anything short of the full record is torn and kept aside
            assert len(side) == 1 and side[0].read_bytes() == last[:cut]
        events = Journal(run).read()  # the repaired journal replays cleanly, appends and all
        assert events[-1]["event"] == Event.RUN_FINISHED.value
        assert len([e for e in events if e["event"] == "trial_finished"]) >= before


def test_two_tuners_cannot_hold_one_run_directory(tmp_path):
    src = finished_run(tmp_path / "run")
    held = RunLock(tmp_path / "run").acquire()
    try:
        with pytest.raises(JournalError, match="in use by another tuner .*pid"):
            resume(tmp_path / "run")
    finally:
        held.release()
    assert resume(tmp_path / "run").state.records  # free again once released
    assert src.exists()


@pytest.mark.parametrize("content, match", [
    (b"\xff\xfe not utf-8\n{}\n", "corrupt"),
    (b'{"event": "run_started", "recipe": {"bogus": 1}, "config": {}}\n', "run_started"),
    (b'{"no_event": 1}\n{"event": "run_finished"}\n', "not a journal event"),
])
def test_unreadable_journals_are_errors_not_tracebacks(tmp_path, content, match):
    (tmp_path / "journal.jsonl").write_bytes(content)
    with pytest.raises(JournalError, match=match):
        resume(tmp_path)


def test_a_schema_invalid_trial_record_names_its_line(tmp_path):
    journal = finished_run(tmp_path)
    lines = journal.path.read_text().splitlines()
    rec = json.loads(lines[2])
    rec["record"]["outcome"] = "exploded"
    lines[2] = json.dumps(rec)
    journal.path.write_text("\n".join(lines) + "\n")
    with pytest.raises(JournalError, match=r"journal.jsonl:3 is not a valid trial_finished record"):
        resume(tmp_path)


def test_a_journal_that_is_a_directory(tmp_path):
    (tmp_path / "journal.jsonl").mkdir()
    with pytest.raises(JournalError, match="not a file"):
        resume(tmp_path)
