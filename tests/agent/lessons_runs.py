"""Shared helpers of the lessons tests: a fake landscape the playbook's prior gets wrong, and a tuning run on it."""

from __future__ import annotations

from attune.engine.loop import TuneConfig, Tuner
from attune.policies.playbook import PlaybookPolicy
from attune.testing.fakes import FakeBackend, default_speed


def fused_matters(recipe):
    """The default fake landscape, plus a big win from the fused optimizer (which the playbook's prior ranks last)."""
    v = default_speed(recipe)
    if isinstance(v, float) and recipe.knob("optimizer_impl") == "fused":
        return v * 1.3
    return v


def tune_with_lessons(tmp_path, recipe, store, name):
    """Tune ``recipe`` on the fused-matters landscape with the playbook consulting the lessons in ``store`` (None: no
    lessons), in the run directory ``tmp_path / name``."""
    cfg = TuneConfig.from_recipe(recipe, 10.0)
    return Tuner(recipe, backend=FakeBackend(speed=fused_matters), policy=PlaybookPolicy(lessons=store), config=cfg,
                 run_dir=tmp_path / name).run()
