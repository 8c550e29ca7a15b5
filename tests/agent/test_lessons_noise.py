"""The store keeps the run-to-run noise each run measured; a later run on the same cluster starts with it as a
noise prior (its decisions, not its certification)."""

from __future__ import annotations

import json
import logging

from attune import api
from attune.agent.lessons import LessonStore, NoiseRecord, noise_prior_overrides, record_run, run_noise, scope_of
from attune.engine.acceptance import PRIOR_MAX_DF
from attune.engine.loop import TuneConfig, Tuner
from attune.policies import make_policy
from attune.recipe.model import Recipe
from attune.testing.factories import tiny_recipe, tiny_recipe_dict
from attune.testing.fakes import FakeBackend


def _state(tmp_path, name="a", noise=0.01):
    r = tiny_recipe()
    cfg = TuneConfig.from_recipe(r, 10.0)
    return Tuner(r, backend=FakeBackend(noise=noise), policy=make_policy("coordinate"), config=cfg,
                 run_dir=tmp_path / name).run()


def test_a_finished_run_records_its_noise_and_a_run_on_the_same_cluster_gets_it_back(tmp_path):
    store = LessonStore(tmp_path / "lessons.json")
    state = _state(tmp_path)
    measured = run_noise(state, backend="fake")
    assert measured is not None and measured.df >= 1 and 0.001 < measured.sigma < 0.05  # the fake's 1 % noise
    record_run(state, store, run_id="r1", backend="fake")
    again = LessonStore(tmp_path / "lessons.json")
    (rec,) = again.noise_records()
    assert rec.run == "r1" and rec.df == measured.df and rec.scope.backend == "fake"
    sigma, df, runs = again.noise_prior(tiny_recipe(), backend="fake")
    assert (sigma, df, runs) == (rec.sigma, rec.df, 1)
    # another backend, accelerator or scale is another cluster: no prior
    assert again.noise_prior(tiny_recipe(), backend="local") is None
    other = tiny_recipe_dict()
    other["resources"] = {"accelerator": "cpu", "nodes": 4, "devices_per_node": 4}
    assert again.noise_prior(Recipe.model_validate(other), backend="fake") is None
    # recording the same run again replaces its record
    record_run(state, again, run_id="r1", backend="fake")
    assert len(LessonStore(tmp_path / "lessons.json").noise_records()) == 1


def test_the_prior_pools_the_runs_in_scope(tmp_path):
    store = LessonStore(tmp_path / "lessons.json")
    scope = scope_of(tiny_recipe(), "fake")
    store.add_noise(NoiseRecord(run="a", scope=scope, sigma=0.01, df=2, recorded=1.0))
    store.save()
    r = tiny_recipe()
    part = noise_prior_overrides(store, r, backend="fake")
    assert part == {"noise_prior_sigma": 0.01, "noise_prior_df": 2}
    store.add_noise(NoiseRecord(run="b", scope=scope, sigma=0.02, df=PRIOR_MAX_DF, recorded=2.0))
    store.save()
    whole = noise_prior_overrides(LessonStore(tmp_path / "lessons.json"), r, backend="fake")
    assert whole["noise_prior_df"] == 2 + PRIOR_MAX_DF
    assert abs(whole["noise_prior_sigma"] ** 2 * whole["noise_prior_df"] - (0.01 ** 2 * 2 + 0.02 ** 2 * 6)) < 1e-12
    assert "baseline_repeats" not in whole  # the recipe names its baseline repeats: they stand
    assert noise_prior_overrides(None, r, backend="fake") == {}


def _unrepeated() -> Recipe:
    data = tiny_recipe_dict()
    data["tuning"] = {k: v for k, v in data["tuning"].items() if k != "baseline_repeats"}
    return Recipe.model_validate(data)


def test_with_a_prior_a_run_measures_its_baseline_once_and_screens_on_the_prior(tmp_path):
    """One baseline run where the lessons hold the cluster's noise (issue 40): the prior sizes the first candidate's
    screen (which only rejects) until the run's own repeats (the best's reference runs) can be weighed against it,
    and no change is kept before they are."""
    from attune.engine.loop import screen_floor
    from attune.trial import TrialKind

    store = LessonStore(tmp_path / "lessons.json")
    store.add_noise(NoiseRecord(run="a", scope=scope_of(_unrepeated(), "fake"), sigma=0.015, df=PRIOR_MAX_DF,
                                recorded=1.0))
    store.save()
    r = _unrepeated()
    over = noise_prior_overrides(LessonStore(tmp_path / "lessons.json"), r, backend="fake")
    assert over["baseline_repeats"] == 1
    cfg = TuneConfig.from_recipe(r, 10.0, paired=True, loss_check=False, **over)
    tuner = Tuner(r, backend=FakeBackend(noise=0.01), policy=make_policy("coordinate"), config=cfg,
                  run_dir=tmp_path / "run")
    state = tuner.run()
    kinds = [x.kind for x in state.records if x.launched]
    assert kinds[0] == TrialKind.BASELINE and kinds[1] != TrialKind.BASELINE, kinds
    # before any repeat, the screen's floor is the prior's (1.645 x 1.5 % x sqrt(2)), never the bare min_gain
    one = Tuner(r, backend=FakeBackend(noise=0.01), policy=make_policy("coordinate"), config=cfg,
                run_dir=tmp_path / "one")
    one.state.records.append(state.records[0])
    assert screen_floor(one.state, "x") > 0.034 and one.state.floor() > 0.034
    # every kept change rests on a paired decision whose noise had the run's own degrees of freedom
    for rec in state.records:
        if rec.accepted and rec.kind != TrialKind.LOSS_CHECK:
            assert "interleaved" in rec.decision or "decisively" in rec.decision, rec.decision


def test_a_bad_noise_record_is_kept_aside_and_the_lessons_survive(tmp_path, caplog):
    path = tmp_path / "lessons.json"
    store = LessonStore(path)
    record_run(_state(tmp_path), store, run_id="r1", backend="fake")
    data = json.loads(path.read_text())
    n_lessons = len(data["lessons"])
    data["noise"].append({"run": "bad", "scope": data["noise"][0]["scope"], "sigma": -1.0, "df": 3})
    path.write_text(json.dumps(data))
    with caplog.at_level(logging.WARNING):
        fresh = LessonStore(path)
        assert len(fresh.all()) == n_lessons and [n.run for n in fresh.noise_records()] == ["r1"]
    assert "noise record #2: sigma" in caplog.text
    assert list(tmp_path.glob("lessons.json.corrupt-*"))  # the whole file is kept aside, never overwritten


def test_tune_starts_a_run_with_the_stores_noise_prior_where_lessons_steer(tmp_path, monkeypatch):
    monkeypatch.setattr(api, "make_backend", lambda name, **options: FakeBackend())
    path = tmp_path / "lessons.json"
    first, _ = api.tune(tiny_recipe(), budget_hours=10.0, policy="playbook", out_dir=tmp_path / "one",
                        policy_options={"lessons": str(path)})
    assert first.config.noise_prior() is None and LessonStore(path).noise_records()
    second, _ = api.tune(tiny_recipe(), budget_hours=10.0, policy="playbook", out_dir=tmp_path / "two",
                         policy_options={"lessons": str(path)})
    prior = second.config.noise_prior()
    assert prior is not None and prior.df == LessonStore(path).noise_records()[0].df
    # lessons off: no prior
    third, _ = api.tune(tiny_recipe(), budget_hours=10.0, policy="playbook", out_dir=tmp_path / "three",
                        policy_options={"lessons": False})
    assert third.config.noise_prior() is None


def test_lessons_list_says_which_clusters_have_recorded_noise(tmp_path):
    from typer.testing import CliRunner

    from attune.commands.lessons import app

    path = tmp_path / "lessons.json"
    record_run(_state(tmp_path), LessonStore(path), run_id="r1", backend="fake")
    out = CliRunner().invoke(app, ["list", "--store", str(path)])
    assert out.exit_code == 0, out.output
    assert "run-to-run noise recorded by 1 run(s) on 1 cluster(s)" in " ".join(out.output.split())
