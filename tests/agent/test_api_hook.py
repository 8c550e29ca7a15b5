"""``attune.api.tune`` distils lessons at the end of a run (into the store named in the policy options)."""

from __future__ import annotations

from attune import api
from attune.agent.lessons import LessonStore
from attune.testing.factories import tiny_recipe
from attune.testing.fakes import FakeBackend


def test_tune_records_lessons(tmp_path, monkeypatch):
    monkeypatch.setattr(api, "make_backend", lambda name, **options: FakeBackend())
    path = tmp_path / "lessons.json"
    state, _ = api.tune(tiny_recipe(), budget_hours=10.0, policy="playbook", out_dir=tmp_path / "run",
                        policy_options={"lessons": str(path)})
    assert state.finished and path.exists()
    lessons = LessonStore(path).all()
    assert lessons and all(lz.runs == ("run",) for lz in lessons)


def test_tune_without_lessons_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(api, "make_backend", lambda name, **options: FakeBackend())
    api.tune(tiny_recipe(), budget_hours=10.0, policy="coordinate", out_dir=tmp_path / "run")
    assert not list(tmp_path.glob("*.json"))
