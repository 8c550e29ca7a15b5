"""Measurements that cannot be true are never used (issue 37, item 3): a run_clm baseline under torchrun was recorded at
8,396,195 tokens/s against 4,030 for its twin (its step lines reached attune in one burst, and steps are timed by
line arrival); it was averaged into the baseline, the run-to-run noise became 287 %, and the summary printed
"speedup 0.40×" beside "nothing was kept". Here: the checks on a trial's own timing, the twin check, the re-runs and
their bound, on the engine's fake backend (the real-process burst is tests/backends/test_burst.py)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest

from attune.backends.base import TrialRequest, TrialResult
from attune.engine.loop import LEAP_FACTOR, TWIN_FACTOR, TuneConfig, Tuner
from attune.engine.measure import BURST_GAP_S, timing_fault
from attune.policies import make_policy
from attune.recipe.model import Recipe
from attune.testing.factories import tiny_recipe
from attune.testing.fakes import FakeBackend
from attune.trial import MAX_REMEASURES, Decision, TrialKind, TrialOutcome

# -- a trial's own timing ------------------------------------------------------------------------------------------


def _steps(times: list[float], arrivals: list[float], clocks: list[float] | None = None) -> list[dict]:
    recs = [{"step": i + 1, "step_time_s": t, "tokens": 1000, "loss": 4.0, "arrived_s": a}
            for i, (t, a) in enumerate(zip(times, arrivals, strict=True))]
    for rec, c in zip(recs, clocks or [], strict=False):
        rec["clock_s"] = c
    return recs


def test_step_lines_that_arrive_in_one_burst_are_a_measurement_fault():
    # eight 50 ms steps whose lines all arrived at the end, 40 µs apart: timed by arrival, they read as 40 µs each
    arrivals = [2.0 + 40e-6 * i for i in range(8)]
    times = [2.0] + [40e-6] * 7
    fault = timing_fault(_steps(times, arrivals), warmup_steps=2, wall_s=2.1)
    assert fault is not None and "burst" in fault and "flush" in fault


def test_lines_flushed_as_written_are_no_fault_however_fast_the_steps():
    # 5 ms steps (a small model), each line flushed: the gaps are the steps, above the burst gap
    arrivals = [1.0 + 0.005 * i for i in range(8)]
    assert timing_fault(_steps([1.0] + [0.005] * 7, arrivals), warmup_steps=2, wall_s=1.05) is None


def test_a_burst_of_lines_whose_steps_the_job_timed_itself_is_no_fault():
    # the lines came in one burst, but each carries the job's own step time (a time_ms field): those are true
    arrivals = [2.0 + 40e-6 * i for i in range(8)]
    assert timing_fault(_steps([0.05] * 8, arrivals), warmup_steps=2, wall_s=2.1) is None


def test_steps_far_faster_than_the_jobs_own_clock_are_a_fault_even_when_the_gaps_look_like_steps():
    # HF logs its own running clock (train_runtime) on each step's line: it advanced 50 ms a step while the lines
    # arrived 3 ms apart (a chunked pipe: gaps above the burst gap, yet the steps read 16× too fast)
    arrivals = [1.0 + 0.003 * i for i in range(8)]
    clocks = [0.05 * (i + 1) for i in range(8)]
    fault = timing_fault(_steps([1.0] + [0.003] * 7, arrivals, clocks), warmup_steps=2, wall_s=1.05)
    assert BURST_GAP_S < 0.003 and fault is not None and "own clock" in fault
    assert timing_fault(_steps([1.0] + [0.05] * 7, arrivals, clocks), warmup_steps=2, wall_s=1.05) is None


# -- the engine: a fault is run again and never used ---------------------------------------------------------------

def landscape(recipe: Recipe) -> float:
    return {"full": 1000.0, "selective": 1300.0, "none": 1200.0}[recipe.knob("activation_checkpointing")]


@dataclass
class Faulty(FakeBackend):
    """The fake backend, with faults by trial id: ``burst`` (the backend saw the lines arrive at once: mismeasured,
    its throughput absurd) or ``absurd`` (a run that measured ``ABSURD``× its true throughput and says nothing)."""

    faults: dict[int, str] = field(default_factory=dict)
    always: str | None = None  # a fault of every run of this kind of trial ("baseline" / "candidate")
    kinds: dict[int, str] = field(default_factory=dict)
    ABSURD = 2083.0  # 8,396,195 / 4,030

    def run(self, recipe: Recipe, request: TrialRequest) -> TrialResult:
        res = super().run(recipe, request)
        fault = self.faults.get(request.trial_id)
        if self.always is not None and (recipe.knob("activation_checkpointing") != "full") == (
                self.always == "candidate"):
            fault = "burst"
        if fault is None or res.measurement is None:
            return res
        m = res.measurement
        absurd = m.model_copy(update={"tokens_per_s_per_device": m.tokens_per_s_per_device * self.ABSURD,
                                      "tokens_per_s": m.tokens_per_s * self.ABSURD,
                                      "step_time_median_s": m.step_time_median_s / self.ABSURD})
        if fault == "absurd":
            return replace(res, measurement=absurd)
        return replace(res, outcome=TrialOutcome.MISMEASURED, measurement=absurd,
                       message="measurement fault: its step lines arrived in one burst")


def _tune(tmp_path, backend: FakeBackend, *, space=("activation_checkpointing",), **kw):
    r = tiny_recipe(activation_checkpointing="full")
    cfg = TuneConfig.from_recipe(r, 50.0, search_space=space, loss_check=False, **kw)
    return Tuner(r, backend=backend, policy=make_policy("playbook"), config=cfg, run_dir=tmp_path / "run").run()


@pytest.mark.parametrize("fault", ["burst", "absurd"])
def test_a_baseline_run_measured_2000x_too_fast_is_run_again_and_never_averaged(tmp_path, fault):
    """The issue's case: the second baseline run measures 2,083× its twin. Whether the backend saw the burst
    (``burst``) or only its twin shows it (``absurd``), it is a measurement fault: run again, never averaged."""
    state = _tune(tmp_path, Faulty(speed=landscape, noise=0.01, faults={2: fault}), space=())
    base = [r for r in state.records if r.kind == TrialKind.BASELINE]
    assert [r.outcome for r in base] == [TrialOutcome.SUCCEEDED, TrialOutcome.MISMEASURED, TrialOutcome.SUCCEEDED]
    bad = base[1]
    assert bad.status is Decision.NOTED and "runs again" in bad.decision and "measurement fault" in bad.message
    if fault == "absurd":
        assert f"beyond the {TWIN_FACTOR:g}×" in bad.message and "1 earlier run(s)" in bad.message
        assert "× above" in bad.message  # about 2,083× (each run has its 1 % noise)
    # what the run knows of the baseline rests on the good runs alone: no 287 % noise, no inflated baseline
    assert [r.id for r in state.baselines()] == [1, 3]
    assert state.baseline_throughput() == pytest.approx(1000.0, rel=0.05)
    assert state.floor() < 0.1
    assert state.search_speedup() == 1.0 and state.best_record() is None


def test_a_candidate_whose_run_was_a_fault_is_run_again_as_it_was_and_decided_on_the_rerun(tmp_path):
    backend = Faulty(speed=landscape, noise=0.01, faults={3: "burst"})
    state = _tune(tmp_path, backend, certify_share=0.0)
    first = next(r for r in state.records if r.kind == TrialKind.CANDIDATE and r.launched)
    assert first.id == 3 and first.outcome is TrialOutcome.MISMEASURED and first.status is Decision.NOTED
    again = state.records[state.records.index(first) + 1]
    assert again.kind == TrialKind.CANDIDATE and again.change == first.change and again.id == 4
    assert again.outcome is TrialOutcome.SUCCEEDED
    # the kept change is the true best (selective, +30 %), decided on its good runs: the absurd one never counted
    assert state.best_recipe().knob("activation_checkpointing") == "selective"
    assert state.best_throughput() == pytest.approx(1300.0, rel=0.05)
    assert not any(r.outcome.failed for r in state.records)


def test_re_runs_are_bounded_a_baseline_that_cannot_be_measured_ends_the_run_with_the_reason(tmp_path):
    state = _tune(tmp_path, Faulty(speed=landscape, noise=0.01, always="baseline"))
    base = [r for r in state.records if r.kind == TrialKind.BASELINE]
    assert all(r.outcome is TrialOutcome.MISMEASURED for r in base)
    assert len(base) == MAX_REMEASURES + 2  # two re-runs, then two settled faults: the baseline fails, said so
    assert "baseline recipe itself fails (mismeasured" in str(state.finished)
    assert "burst" in str(state.finished)
    assert state.baseline_throughput() is None and state.search_speedup() is None


def test_a_candidate_that_is_always_mismeasured_is_rejected_after_its_re_runs_and_the_search_goes_on(tmp_path):
    state = _tune(tmp_path, Faulty(speed=landscape, noise=0.01, always="candidate"), certify_share=0.0)
    cands = [r for r in state.records if r.kind == TrialKind.CANDIDATE and r.launched]
    first = cands[0].change
    same = [r for r in cands if r.change == first]
    assert len(same) == MAX_REMEASURES + 1
    assert [r.status for r in same] == [Decision.NOTED] * MAX_REMEASURES + [Decision.REJECTED]
    assert "measurement was a fault 3 times in a row" in same[-1].decision
    assert any(r.change != first for r in cands), "the search moves on to other changes"
    assert state.best_record() is None  # nothing measurable was faster: nothing kept, never on an absurd figure
    assert not any(r.outcome.failed for r in state.records)  # not failures of the recipes


def test_the_jobs_clock_printed_to_four_digits_is_read_at_its_shortest():
    # HF 5 prints train_runtime to four significant digits: after a long compile (1,234 s) it moves in whole seconds,
    # so six 50 ms steps can read as a 1 s span; that is no evidence against their 0.3 s
    arrivals = [1234.0 + 0.05 * i for i in range(8)]
    clocks = [1234.0] * 4 + [1235.0] * 4
    assert timing_fault(_steps([1234.0] + [0.05] * 7, arrivals, clocks), warmup_steps=2, wall_s=1240) is None


def test_a_candidates_first_run_far_above_the_best_is_a_fault_not_a_twin_for_its_confirmation(tmp_path):
    """A candidate's first run, measured 2,083× too fast and silent about it, has no twins yet: against the best it
    is beyond any one move's reach, so it is run again; kept as a measurement, it would have made its honest
    confirmation runs look like the faults."""
    state = _tune(tmp_path, Faulty(speed=landscape, noise=0.01, faults={3: "absurd"}), certify_share=0.0)
    first = state.records[2]
    assert first.kind == TrialKind.CANDIDATE and first.outcome is TrialOutcome.MISMEASURED, first
    assert f"more than {LEAP_FACTOR:g}× faster" in first.message
    assert not [r for r in state.records if r.outcome is TrialOutcome.MISMEASURED and r.id != first.id]
    assert state.best_recipe().knob("activation_checkpointing") == "selective"
    assert state.best_throughput() == pytest.approx(1300.0, rel=0.05)


def test_steps_the_job_timed_itself_are_true_however_short_and_however_their_lines_arrived():
    """A small script that prints its own step time (nanoGPT's ``time 1.93ms``) and flushes: under load its lines can
    reach attune together, and its steps are genuinely shorter than the burst gap. Its own clock decides (seen: a
    loaded CI run flagged such a run as a burst and failed a loss check)."""
    from attune.engine.measure import timing_fault

    records = [{"step": i, "step_time_s": 0.0019, "tokens": 256, "loss": 4.0, "arrived_s": 1.0 + i * 1e-5,
                "own_time": True} for i in range(1, 8)]
    assert timing_fault(records, warmup_steps=1, wall_s=3.0) is None
    arrival_timed = [{**r, "own_time": False} for r in records]
    assert timing_fault(arrival_timed, warmup_steps=1, wall_s=3.0) is not None
