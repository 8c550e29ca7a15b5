"""A noise prior: the run-to-run noise past runs on the same cluster measured, pooled into a new run's decisions.

It makes a change far above that noise keepable on its first run (no pair), it is set aside where the run's own runs
are noisier than it says, and it never enters the certification, which rests on the run's own runs alone."""

from __future__ import annotations

import json
import math

import pytest

from attune.engine.acceptance import PRIOR_MAX_DF, RunNoise, paired_gain
from attune.engine.loop import TuneConfig, Tuner, needs_calibration
from attune.policies import make_policy
from attune.testing.factories import tiny_recipe
from attune.testing.fakes import FakeBackend
from attune.trial import Measurement, TrialOutcome


def m(tps: float) -> Measurement:
    return Measurement(tokens_per_s_per_device=tps, tokens_per_s=tps, step_time_median_s=1.0, step_time_cv=0.001,
                       steps_measured=6)


def test_a_prior_pools_with_the_runs_own_noise_and_is_capped():
    own = RunNoise.pooled([[(1, 1000.0), (2, 1010.0)]])  # one degree of freedom
    prior = RunNoise(sigma=0.01, df=40)
    both = own.with_prior(prior)
    assert both.df == own.df + PRIOR_MAX_DF and both.prior_df == PRIOR_MAX_DF  # 40 past df count as PRIOR_MAX_DF
    expected = math.sqrt((own.sigma ** 2 * own.df + 0.01 ** 2 * PRIOR_MAX_DF) / both.df)
    assert both.sigma == pytest.approx(max(expected, own.sigma))
    # a prior lends degrees of freedom; it never makes the run's own spread look smaller
    loud = RunNoise(sigma=0.0105, df=1).with_prior(prior)
    assert loud.prior_df == PRIOR_MAX_DF and loud.sigma == pytest.approx(0.0105)
    assert own.with_prior(None) == own and own.with_prior(RunNoise(0.0, 0)) == own
    # no repeat of its own yet: nothing to check the prior against, so it is not used
    assert RunNoise(0.0, 0).with_prior(prior) == RunNoise(0.0, 0)


def test_a_prior_is_set_aside_where_the_runs_own_runs_are_noisier():
    noisy = RunNoise.pooled([[(1, 1000.0), (2, 1300.0), (3, 800.0)]])  # about 24 % run to run
    assert noisy.with_prior(RunNoise(sigma=0.01, df=6)) == noisy  # the prior does not describe this job
    # even a modest excess sets it aside: twice the prior's spread on one degree of freedom of its own
    twice = RunNoise.pooled([[(1, 1000.0), (2, 1000.0 * math.exp(0.02 * math.sqrt(2)))]])
    assert twice.sigma == pytest.approx(0.02) and twice.with_prior(RunNoise(sigma=0.01, df=6)) == twice
    quiet = RunNoise.pooled([[(1, 1000.0), (2, 1008.0), (3, 995.0)]])
    assert quiet.sigma < 0.01 and quiet.with_prior(RunNoise(sigma=0.01, df=6)).prior_df == 6


def test_a_prior_narrows_a_first_run_decision_and_the_decision_says_where_its_noise_came_from():
    baseline = [[(1, 1000.0), (2, 1008.0)]]
    refs = [(1, m(1000.0)), (2, m(1008.0))]
    alone = paired_gain([(3, m(1300.0))], refs, baseline, alpha=0.001)
    warm = paired_gain([(3, m(1300.0))], refs, baseline, alpha=0.001, prior=RunNoise(sigma=0.01, df=12))
    assert warm.half_width < alone.half_width / 10  # 1 df against 7: Student's t at 0.1 % is 318 against 4.8
    assert warm.prior_df == PRIOR_MAX_DF and "from past runs on this cluster" in warm.describe()
    assert "past runs" not in alone.describe()


def _run(tmp_path, name, **cfg):
    def landscape(recipe):  # selective checkpointing is 40 % faster than full: far above 1 % noise
        return {"full": 1000.0, "selective": 1400.0, "none": 1030.0}[recipe.knob("activation_checkpointing")]

    r = tiny_recipe(activation_checkpointing="full")
    config = TuneConfig.from_recipe(r, 50.0, **{"search_space": ("activation_checkpointing",), "paired": True,
                                                 "max_trials": 8, "loss_check": False, **cfg})
    return Tuner(r, backend=FakeBackend(speed=landscape, noise=0.01), policy=make_policy("coordinate"),
                 config=config, run_dir=tmp_path / name)


def test_with_a_prior_a_change_far_above_the_noise_is_kept_on_its_first_run(tmp_path):
    cold = _run(tmp_path, "cold").run()
    warm = _run(tmp_path, "warm", noise_prior_sigma=0.015, noise_prior_df=12).run()  # the fake runs at 1 %
    kept = [r for r in warm.records if r.accepted]
    assert kept and kept[0].kind == "candidate" and kept[0].change == {"activation_checkpointing": "selective"}
    assert "on its first run, decisively" in kept[0].decision and "past runs" in kept[0].decision
    cold_kept = next(r for r in cold.records if r.accepted)
    # without the prior, the baseline's one degree of freedom needs the pair: the best's run after the candidate,
    # and the look (a zero-cost decision record) on it
    assert cold_kept.kind == "decision"
    spent = lambda s, rec: sum(r.charged_hours for r in s.records if r.id <= rec.id)  # noqa: E731
    assert spent(warm, kept[0]) < spent(cold, cold_kept)
    # the certification rests on the run's own runs: its degrees of freedom carry nothing of the prior
    # (pooled in, the prior alone would bring PRIOR_MAX_DF degrees of freedom)
    cert = warm.certified()
    assert cert is not None and cert.pairs >= 1 and 0 < cert.df < PRIOR_MAX_DF


def test_the_prior_is_journaled_and_a_resumed_run_keeps_it(tmp_path):
    tuner = _run(tmp_path, "j", noise_prior_sigma=0.0125, noise_prior_df=9, max_trials=3)
    tuner.run()
    started = json.loads((tmp_path / "j" / "journal.jsonl").read_text().splitlines()[0])
    assert started["config"]["noise_prior_sigma"] == 0.0125 and started["config"]["noise_prior_df"] == 9
    again = Tuner.resume(tmp_path / "j", backend=FakeBackend(), policy=make_policy("coordinate"))
    assert again.state.config.noise_prior() == RunNoise(sigma=0.0125, df=9)
    again.lock.release()


def test_a_failed_calibration_with_one_baseline_run_falls_back_to_the_baseline_again(tmp_path):
    """With one baseline run (``tuning.baseline_repeats: 1``), the loss check's drift reference is the calibration
    run alone; when that layout fails (an OOM), one more run of the baseline is the reference, rather than every
    later loss check being refused for want of one."""
    def landscape(recipe):
        mbs = recipe.knob("micro_batch_size")
        return TrialOutcome.OOM if mbs >= 4 else {1: 1000.0, 2: 1500.0}[mbs]

    r = tiny_recipe(micro_batch_size=1)
    config = TuneConfig.from_recipe(r, 50.0, search_space=("micro_batch_size",), paired=True, max_trials=10,
                                    baseline_repeats=1)
    state = Tuner(r, backend=FakeBackend(speed=landscape, noise=0.01), policy=make_policy("coordinate"),
                  config=config, run_dir=tmp_path / "c").run()
    cals = [x for x in state.records if x.kind == "calibration"]
    assert [c.outcome for c in cals] == [TrialOutcome.OOM, TrialOutcome.SUCCEEDED], [(c.change, c.outcome) for c in cals]
    assert cals[1].change == {} and cals[1].signature == state.records[0].signature  # the baseline once more
    check = next(x for x in state.records if x.kind == "loss_check")
    assert check.accepted and check.change == {"micro_batch_size": 2}, check.decision
    assert not needs_calibration(state, check.signature)
