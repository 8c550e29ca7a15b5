"""spec.ttlSecondsAfterFinished and when a run's reconcile timer runs (pure parts; the real API server's view:
tests/k8s/test_real_lifecycle.py::test_a_finished_run_is_no_longer_fetched_and_goes_after_its_ttl)."""

from __future__ import annotations

import datetime as dt

from attune.operator.handlers import _stepping, finished_due


def _run(phase: str | None, ttl: int | None = None, done: str | None = None, gen: int = 1, seen: int = 1) -> dict:
    return {"metadata": {"generation": gen}, "spec": {"ttlSecondsAfterFinished": ttl} if ttl is not None else {},
            "status": {"phase": phase, "completionTime": done, "observedGeneration": seen}}


def test_a_finished_run_is_due_its_ttl_after_its_completion():
    t = dt.datetime(2026, 12, 7, 10, 0, 0, tzinfo=dt.UTC)
    run = _run("Succeeded", ttl=60, done=t.isoformat().replace("+00:00", "Z"))
    assert finished_due(run, t.timestamp() + 10) == 50
    assert finished_due(run, t.timestamp() + 61) < 0
    assert finished_due(_run("Baseline", ttl=60, done=None), t.timestamp()) is None  # not finished
    assert finished_due(_run("Failed", done=t.isoformat()), t.timestamp()) is None  # no ttl: kept


def test_only_unfinished_runs_and_unobserved_edits_are_stepped():
    def stepping(run: dict) -> bool:
        return _stepping(body=run, status=run["status"])

    assert stepping(_run("Baseline"))
    assert not stepping(_run("Succeeded"))
    assert stepping(_run("Succeeded", gen=2, seen=1))  # an edit after the end: one step observes it
