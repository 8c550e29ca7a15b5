"""The decision benchmark's reference: each run's budget is what it says (12 trials of its baseline), so a missed
keep is the decision rule's, never a budget that could not pay for the decision."""

from __future__ import annotations

from pathlib import Path

from attune.backends.simulated import SimBackend
from attune.bench.decisions import BUDGET_TRIALS, one_run
from attune.bench.suite import load_suite
from attune.trial import TrialRequest


def test_a_big_recipes_budget_pays_for_its_decision(tmp_path: Path) -> None:
    """Seed 6 tunes gpt3-175b-h100x128, whose trials last about 11 minutes: priced with a 300-s request, its
    budget paid for its two baseline runs and nothing else, so even a +30 % change was never tried."""
    case = load_suite("suite")[6 % len(load_suite("suite"))]
    t = case.recipe.tuning
    quiet = SimBackend(noise=False, write_files=False)
    assert (quiet.estimate_hours(case.recipe, TrialRequest(0, tmp_path, t.warmup_steps, t.measure_steps, 1e9))
            > 1.5 * quiet.estimate_hours(case.recipe, TrialRequest(0, tmp_path, t.warmup_steps, t.measure_steps, 300)))
    out = one_run(6, 0.30, 0.015, tmp_path)
    assert out is not None and out.ran and out.kept, out
    # within its budget (adaptive windows make a trial cheaper than the fixed one the budget is counted in, so more
    # than BUDGET_TRIALS of them may fit)
    assert 0 < out.spent <= BUDGET_TRIALS


def test_the_false_keep_target_is_read_at_the_simulators_shipped_noise():
    from attune.bench.decisions import SHIPPED_NOISE
    from attune.sim.model import NOISE_SIGMA

    assert SHIPPED_NOISE == NOISE_SIGMA


def test_the_set_effect_is_what_the_adaptive_windows_futility_bound_judges(tmp_path: Path) -> None:
    """The benchmark sets a candidate's throughput to (1 + effect) × the baseline's. The window's futility bound
    must judge that throughput, not the candidate's natural one: seed 13's +30 % change (naturally slower than its
    bar) was stopped as futile on its first run, read 10 % below its set rate, and rejected."""
    from dataclasses import replace

    from attune.bench.decisions import SetEffect
    from attune.recipe.change import apply_change
    from attune.trial import MeasurePlan

    case = load_suite("suite")[0]
    t = case.recipe.tuning
    cand = apply_change(case.recipe, {"micro_batch_size": case.recipe.knob("micro_batch_size") * 2}) \
        if "micro_batch_size" in case.recipe.catalogue.knobs else case.recipe
    set_up = SetEffect(SimBackend(seed=1, write_files=False), case.recipe, cand, 0.30)
    req = TrialRequest(3, tmp_path / "t3", t.warmup_steps, t.measure_steps, 1e9)
    natural = SimBackend(noise=False, write_files=False).run(cand, req).measurement
    base = SimBackend(noise=False, write_files=False).run(case.recipe, req).measurement
    assert natural is not None and base is not None
    bar = 1.1 * base.tokens_per_s_per_device  # what a +30 % change clears, whatever its natural throughput
    plan = MeasurePlan(target_se=1e-6, futility_tps=bar)
    res = set_up.run(cand, replace(req, plan=plan))
    assert res.measurement is not None and res.measurement.ended != "futile", res.measurement
    assert res.measurement.tokens_per_s_per_device > bar
    if natural.tokens_per_s_per_device * 1.2 < bar:  # naturally far below the bar: the bound would have stopped it
        unscaled = SimBackend(seed=1, write_files=False).run(cand, replace(req, plan=plan)).measurement
        assert unscaled is not None and unscaled.ended == "futile"
