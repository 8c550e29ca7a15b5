"""Paired (A-B-A) decisions: a candidate is judged against the best measured right between its two runs, so slow
drifts of machine load cancel, where comparing with old baseline runs would keep a loser or reject a winner."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest

from attune.backends.base import TrialRequest, TrialResult
from attune.engine.acceptance import RunNoise, paired_gain
from attune.engine.budget import charge
from attune.engine.loop import TuneConfig, Tuner
from attune.policies import make_policy
from attune.testing.factories import tiny_recipe
from attune.testing.fakes import FakeBackend
from attune.trial import Measurement, TrialOutcome


def m(tps: float, cv: float = 0.01, n: int = 6) -> Measurement:
    return Measurement(tokens_per_s_per_device=tps, tokens_per_s=tps, step_time_median_s=1.0, step_time_cv=cv,
                       steps_measured=n)


#: the baseline's repeats and earlier references, agreeing within about 1 %
QUIET = [[(1, 1000.0), (2, 1010.0), (4, 990.0)], [(6, 1200.0), (7, 1188.0), (9, 1212.0)]]


def aba(a1: float, b: float, a2: float, **kw) -> tuple[list, list]:
    return [(3, m(a1, **kw)), (5, m(a2, **kw))], [(4, m(b, **kw))]


def test_paired_gain_cancels_a_linear_drift():
    # the machine slows by 10 % per trial; the candidate is truly 20 % faster
    a1, b, a2 = 1.2 * 1000, 1000 * 0.9, 1.2 * 1000 * 0.81
    drifting = [[(1, 1000.0), (2, 900.0), (6, 1000 * 0.9 ** 5)], [(7, 1100 * 0.9 ** 6), (8, 1100 * 0.9 ** 7)]]
    noise = RunNoise.pooled(drifting)
    assert noise.trend == pytest.approx(math.log(0.9)) and noise.sigma < 1e-9  # all of it was drift
    assert RunNoise.pooled(QUIET).trend == 0.0 and RunNoise.pooled(QUIET).df == 4  # no drift shown: none taken out
    p = paired_gain(*aba(a1, b, a2), drifting)
    assert p.gain == pytest.approx(0.2, rel=1e-9)  # exp(mean log A - log B): the drift cancels
    assert p.lower > 0.02 and p.consistent  # kept
    assert paired_gain(*aba(1000, 1000, 1000), QUIET).lower < 0.02  # no gain: not kept
    assert math.isfinite(paired_gain(*aba(1000, 1000, 1000, cv=0.5, n=1), QUIET).half_width)


def test_noisy_runs_widen_the_interval():
    quiet, noisy = paired_gain(*aba(1100, 1000, 1100), QUIET), paired_gain(*aba(1100, 1000, 1100, cv=0.3), QUIET)
    assert noisy.half_width > quiet.half_width and noisy.lower < quiet.lower
    # the run-to-run noise the run has seen widens it too, and with few degrees of freedom more than the normal
    wide = paired_gain(*aba(1100, 1000, 1100), [[(1, 1000.0), (2, 1100.0), (6, 950.0)]])
    assert wide.half_width > 3 * quiet.half_width


def test_the_issue_19_false_keep_is_not_kept():
    """Issue 19's run: candidate 4,809, the best between 2,449, candidate again 2,924 (tokens/s per device), the
    best's other runs 3,015-4,750 and the baseline's noise floor 21.9 %. The paired rule kept it at "+57.9 %"."""
    best_runs = [(1, 3015.0), (2, 3900.0), (6, 4750.0), (9, 3400.0)]
    p = paired_gain([(10, m(4809)), (12, m(2924))], [(11, m(2449))], [best_runs])
    assert p.gain > 0.3 and p.lower < 0.02  # promising on its face, not shown


def test_a_shown_gain_worth_keeping_is_kept_and_the_decision_says_what_falls_short():
    """Kept: the interval's lower end is above zero (how often a change that does nothing is kept) and the estimate
    is at least min_gain. A +4.5 % gain with an interval of ± 3.9 % is kept at min_gain 2 %; the earlier rule (the lower
    end above min_gain) rejected it, and with it most real gains between one and two min_gains."""
    p = paired_gain(*aba(1045, 1000, 1045), QUIET)
    assert 0 < p.lower < 0.02 <= p.gain and p.shows(0.02)
    assert not p.shows(0.05) and "below min_gain 5%" in p.shortfall(0.05)  # shown, and not worth keeping at 5 %
    none = paired_gain(*aba(1000, 1000, 1000), QUIET)
    assert not none.shows(0.0) and "lower end is not above 0" in none.shortfall(0.02)
    split = paired_gain(*aba(1500, 1000, 1000), QUIET)
    assert not split.shows(0.02) and split.shortfall(0.02) == "inconclusive"


def test_a_candidate_whose_own_runs_disagree_beyond_the_noise_is_inconsistent():
    p = paired_gain(*aba(1500, 1000, 1000), QUIET)
    assert not p.consistent and "disagree" in p.describe()
    assert paired_gain(*aba(1105, 1000, 1095), QUIET).consistent


@dataclass
class DriftingBackend(FakeBackend):
    """The fake landscape on a machine that gets steadily busier: every launch is 6 % slower than the last."""

    slowdown: float = 0.94

    def run(self, recipe, request: TrialRequest) -> TrialResult:
        res = super().run(recipe, request)
        if res.measurement is None:
            return res
        factor = self.slowdown ** (len(self.launches) - 1)
        meas = res.measurement.model_copy(update={
            "tokens_per_s_per_device": res.measurement.tokens_per_s_per_device * factor,
            "tokens_per_s": res.measurement.tokens_per_s * factor})
        return TrialResult(outcome=res.outcome, measurement=meas, wall_s=res.wall_s, devices=res.devices,
                           charged_hours=charge(res.devices, res.wall_s))


def test_a_slowing_machine_does_not_hide_a_real_gain_when_paired(tmp_path):
    def landscape(recipe):  # selective checkpointing is truly 15 % faster than full
        return {"full": 1000.0, "selective": 1150.0, "none": 1100.0}[recipe.knob("activation_checkpointing")]

    r = tiny_recipe(activation_checkpointing="full")
    cfg = TuneConfig.from_recipe(r, 50.0, search_space=("activation_checkpointing",), paired=True, max_trials=8,
                                 loss_check=False)
    state = Tuner(r, backend=DriftingBackend(speed=landscape, noise=0.005), policy=make_policy("coordinate"),
                  config=cfg, run_dir=tmp_path / "p").run()
    kinds = [x.kind for x in state.records]
    assert "reference" in kinds, kinds
    kept = state.best_recipe().knob("activation_checkpointing")
    assert kept == "selective", [(x.kind, x.label(), x.decision) for x in state.records]
    # unpaired, the same drift makes every later run look slower than the early baselines: nothing is kept
    cfg_u = TuneConfig.from_recipe(r, 50.0, search_space=("activation_checkpointing",), paired=False, max_trials=8,
                                   loss_check=False)
    unpaired = Tuner(r, backend=DriftingBackend(speed=landscape, noise=0.005), policy=make_policy("coordinate"),
                     config=cfg_u, run_dir=tmp_path / "u").run()
    assert unpaired.best_recipe().knob("activation_checkpointing") == "full"


def test_a_failed_reference_falls_back_to_the_noise_floor(tmp_path):
    calls = {"n": 0}

    def landscape(recipe):
        calls["n"] += 1
        if calls["n"] == 4:  # the reference run of the pair
            return TrialOutcome.CRASHED
        return {"full": 1000.0, "selective": 1400.0, "none": 1300.0}[recipe.knob("activation_checkpointing")]

    r = tiny_recipe(activation_checkpointing="full")
    cfg = TuneConfig.from_recipe(r, 50.0, search_space=("activation_checkpointing",), paired=True, max_trials=6,
                                 loss_check=False)
    state = Tuner(r, backend=FakeBackend(speed=landscape, noise=0.005), policy=make_policy("coordinate"),
                  config=cfg, run_dir=tmp_path / "f").run()
    ref = [x for x in state.records if x.kind == "reference"]
    assert ref and ref[0].outcome is TrialOutcome.CRASHED
    assert state.best_recipe().knob("activation_checkpointing") == "selective"


def test_the_certified_speedup_is_a_point_with_its_interval_and_says_when_no_gain_is_shown():
    from attune.engine.acceptance import certified_speedup

    base = [(20, 1000.0), (22, 1010.0)]
    best = [(21, 1500.0), (23, 1490.0)]
    c = certified_speedup(base, best, QUIET)
    assert c is not None and c.pairs == 2 and c.shown and c.low < c.speedup < c.high
    assert c.speedup == pytest.approx(math.sqrt(1500 * 1490) / math.sqrt(1000 * 1010), rel=1e-9)
    assert "gain shown" in c.describe() and "95 % interval" in c.describe()
    # a busy machine: the best's runs are no better than the noise allows; the interval straddles 1
    noisy = [[(1, 1000.0), (2, 1400.0), (5, 800.0)], [(6, 1500.0), (8, 1000.0)]]
    c = certified_speedup([(20, 1000.0)], [(21, 1150.0)], noisy)
    assert c is not None and c.low < 1.0 < c.high and not c.shown and "no gain shown" in c.describe()
    assert certified_speedup([], best, QUIET) is None


def test_a_run_certifies_its_final_best_and_reports_the_interval(tmp_path):
    from attune.report.result import build_result

    def landscape(recipe):
        return {"full": 1000.0, "selective": 1300.0, "none": 1200.0}[recipe.knob("activation_checkpointing")]

    r = tiny_recipe(activation_checkpointing="full")
    cfg = TuneConfig.from_recipe(r, 50.0, search_space=("activation_checkpointing",), loss_check=False)
    state = Tuner(r, backend=FakeBackend(speed=landscape, noise=0.01), policy=make_policy("coordinate"),
                  config=cfg, run_dir=tmp_path / "c").run()
    result = build_result(state)
    assert result["certified"] and result["certified"]["pairs"] >= 1 and result["certified"]["shown"]
    assert result["speedup_low"] < result["speedup"] < result["speedup_high"]
    assert abs(result["speedup"] - 1.3) < 0.05  # the certification runs' own figure, not the search's best run
    assert "interval" in result["certification"]
    # with certification off the headline is the search's estimate, and says so
    off = TuneConfig.from_recipe(r, 50.0, search_space=("activation_checkpointing",), loss_check=False,
                                 certify_share=0.0)
    state = Tuner(r, backend=FakeBackend(speed=landscape, noise=0.01), policy=make_policy("coordinate"),
                  config=off, run_dir=tmp_path / "o").run()
    result = build_result(state)
    assert result["certified"] is None and "certification off" in result["certification"]
    assert not [x for x in state.records if x.kind == "certify"]


def _scripted(script: list[float], tmp_path) -> list:
    """Run a one-knob tuning whose launches read ``script`` in order (then the landscape: a slower 'none'), with no
    noise of the backend's own: the decisions below are the rule's on exactly these throughputs."""
    launches = iter(script)

    def speed(recipe):
        return next(launches, 1000.0 if recipe.knob("activation_checkpointing") == "full" else 900.0)

    r = tiny_recipe(activation_checkpointing="full")
    cfg = TuneConfig.from_recipe(r, 500.0, search_space=("activation_checkpointing",), paired=True, max_trials=14,
                                 loss_check=False, certify_share=0)
    return Tuner(r, backend=FakeBackend(speed=speed, noise=0.0), policy=make_policy("coordinate"), config=cfg,
                 run_dir=tmp_path).run().records


def test_a_promising_candidate_gets_further_looks_until_a_small_real_gain_is_shown(tmp_path):
    """A +4 % change measured against ~1.5 % run-to-run noise, from the baseline's second run (its lead): the A-B-A
    look on that run, the candidate's and the best's reference run after it, and the next two B-A pairs are not
    enough to show it; the fourth look is. Each look is a zero-cost ``decision`` record taken after the best's run,
    and tests at Pocock's level for four looks, so a change that does nothing is still kept at most 2.5 % of the
    time."""
    from attune.engine.acceptance import MAX_LOOKS

    assert MAX_LOOKS == 4
    script = [980, 1000, 1045, 985, 1015, 1020, 1050, 1005, 1045, 995]
    records = _scripted([float(x) for x in script], tmp_path / "kept")
    looks = [x for x in records if x.kind == "decision"]
    assert [x.status.value for x in looks] == ["pending_more"] * 3 + ["kept"]
    assert all(x.decision.startswith("pending one more interleaved pair (the candidate, then the best)")
               for x in looks[:3])
    assert looks[-1].accepted and "over 4 candidate and 5 interleaved runs" in looks[-1].decision
    assert [x.kind for x in records[2:14]] == ["candidate", "reference", "decision"] + \
        ["confirm", "reference", "decision"] * 3  # A-B-A from the lead, then B-A pairs
    assert sum(x.launched for x in records[:14]) == 10  # a look launches nothing
    assert records[-2].kind == "reference" and records[-2].decision.startswith("the best's run just before")


def test_without_a_lead_the_candidates_runs_frame_the_best_and_each_look_is_on_its_run(tmp_path):
    """A candidate rejected on its first run ends the chain of the best's runs: the next candidate has no lead, so
    its runs frame the best's (B-A-B), then A-B pairs, and each look is taken on its own run, as before there were
    leads: the same +4 % change, shown at the fourth look."""
    script = [990, 990, 900, 1062, 989, 1020, 1024, 1032, 1009, 1055, 989, 1045]
    records = _scripted([float(x) for x in script], tmp_path / "unled")
    assert records[2].kind == "candidate" and "not worth a paired re-measurement" in records[2].decision
    confirms = [x for x in records if x.kind == "confirm"]
    assert [x.decision.startswith("pending one more interleaved pair (the best, then the candidate)")
            for x in confirms] == [True, True, True, False]
    assert confirms[-1].accepted and "over 5 candidate and 4 interleaved runs" in confirms[-1].decision
    assert [x.kind for x in records[3:12]] == ["candidate"] + ["reference", "confirm"] * 4
    assert not [x for x in records if x.kind == "decision"]


def test_each_look_tests_at_pococks_level_for_the_overall_false_keep_rate():
    """:data:`LOOK_ALPHA` is the one-sided level at which :data:`MAX_LOOKS` equally spaced looks of a change that does
    nothing keep it :data:`FALSE_KEEP_ALPHA` of the time: the maximum of the looks' cumulative z statistics, simulated,
    exceeds the level's quantile that often (Pocock's constant, 2.562 for four looks at 1.5 %)."""
    import numpy as np
    from scipy.stats import norm

    from attune.engine.acceptance import FALSE_KEEP_ALPHA, LOOK_ALPHA, MAX_LOOKS

    rng = np.random.default_rng(40)
    walks = np.cumsum(rng.standard_normal((200_000, MAX_LOOKS)), axis=1) / np.sqrt(np.arange(1, MAX_LOOKS + 1))
    kept = float((walks.max(axis=1) > norm.ppf(1 - LOOK_ALPHA)).mean())
    assert kept == pytest.approx(FALSE_KEEP_ALPHA, abs=0.0015)
    assert LOOK_ALPHA < FALSE_KEEP_ALPHA / 2  # one look at the whole level would keep far more often


def test_a_candidate_never_shown_stops_at_the_last_look(tmp_path):
    """A change that reads about +1.5 % on every run stays promising, never shown: it is rejected at the last look,
    not measured for ever; the reference run that ended its decision leads the next candidate's."""
    from attune.engine.acceptance import MAX_LOOKS

    script = [1000, 1000, 1015] + [1000, 1015, 985, 1000, 1010, 1025] * 3
    records = _scripted([float(x) for x in script], tmp_path / "never")
    looks = [x for x in records if x.kind == "decision" and x.label() == "activation_checkpointing=selective"]
    assert len(looks) == MAX_LOOKS and not any(x.accepted for x in records if x.kind in ("confirm", "decision"))
    assert looks[-1].decision.startswith("rejected") and "over 4 candidate and 5 interleaved" in looks[-1].decision
    nxt = next(x for x in records if x.kind == "candidate" and x.label() == "activation_checkpointing=none")
    assert records[nxt.id - 3].kind == "reference" and records[nxt.id - 2].kind == "decision"
    assert records[nxt.id].decision.startswith("reference run of the best, after the candidate's run")
