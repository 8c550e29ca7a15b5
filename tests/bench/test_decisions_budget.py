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
