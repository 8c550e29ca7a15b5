"""The adaptive window (issue 40): the warm-up read from the step series, the measurement ended once its median is
known well enough against the run-to-run noise, a candidate surely too slow stopped early, never more steps than the
fixed window; the simulator and real local processes both honour it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from attune.backends.simulated import SimBackend
from attune.bench.suite import load_suite
from attune.engine.loop import DEFAULT_RUN_NOISE, WINDOW_SHARE, TuneConfig, Tuner, measure_plan
from attune.engine.measure import detect_warmup, window_end, window_se
from attune.engine.policy import Policy, PolicyContext, Stop
from attune.frameworks import get
from attune.recipe.io import parse_recipe
from attune.testing.trials import backend, request
from attune.trial import MeasurePlan, TrialKind, TrialOutcome, TrialRequest

FIXTURES = Path(__file__).parent.parent / "backends" / "fixtures"


def _steps(times: list[float], tokens: float = 1000.0) -> list[dict[str, float]]:
    return [{"step": i, "step_time_s": t, "tokens": tokens} for i, t in enumerate(times)]


def _req(warmup: int = 2, measure: int = 6, plan: MeasurePlan | None = None) -> TrialRequest:
    return TrialRequest(0, Path("/nonexistent"), warmup, measure, 1e9, plan=plan)


# -- the warm-up, read from the series --------------------------------------------------------------------------

def test_the_warm_up_ends_at_the_first_step_near_the_steady_level():
    # torch.compile's shape (pytorch/pytorch#158912): a one-off first step, then 11 % and 8 % slow, then steady
    times = [300.0, 1.11, 1.08, 1.0, 1.004, 0.997, 1.002]
    assert detect_warmup(times, min_window=3, max_warmup=4) == 3
    # a flat series has no warm-up: nothing is dropped that could be measured
    assert detect_warmup([1.0, 1.002, 0.999, 1.001], min_window=3, max_warmup=1) == 0


def test_a_first_step_that_reads_short_is_warm_up_too():
    # a step timed by its line's arrival from an arbitrary start can read far shorter than a real one
    assert detect_warmup([0.001, 0.040, 0.041, 0.040, 0.039], min_window=3, max_warmup=2) == 1


def test_the_warm_up_is_unknown_until_enough_steps_follow_it_and_is_capped():
    assert detect_warmup([3.0, 1.1, 1.0], min_window=3, max_warmup=3) is None
    # a series that keeps speeding up never settles: measured after the most warm-up allowed
    assert detect_warmup([8.0, 4.0, 2.0, 1.0, 0.5, 0.25], min_window=3, max_warmup=2) == 2
    assert detect_warmup([5.0, 4.0, 3.0, 2.0, 1.0, 1.0], min_window=3, max_warmup=1) == 1


# -- when the window ends ---------------------------------------------------------------------------------------

def test_a_fixed_request_runs_its_whole_window_and_drops_its_fixed_warm_up():
    times = [3.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    assert window_end(_steps(times[:7]), _req(), devices=1) is None
    end = window_end(_steps(times), _req(), devices=1)
    assert end is not None and (end.warmup, end.reason) == (2, "fixed")


def test_a_steady_window_ends_as_soon_as_its_median_is_precise():
    plan = MeasurePlan(target_se=0.005)
    times = [3.0, 1.11, 1.08, 1.0, 1.003, 0.998, 1.001, 1.0]
    ends = [window_end(_steps(times[:n]), _req(plan=plan), devices=1) for n in range(1, len(times) + 1)]
    first = next(i for i, e in enumerate(ends) if e is not None)
    end = ends[first]
    assert end is not None and end.reason == "precise" and end.warmup == 3
    assert first + 1 == 6  # three warm-up steps, three measured: two fewer than the fixed eight
    assert window_se(times[3:6]) <= plan.target_se


def test_a_noisy_window_runs_to_the_fixed_cap_and_never_past_it():
    plan = MeasurePlan(target_se=0.005)
    times = [3.0, 1.0, 1.2, 0.9, 1.15, 0.85, 1.1, 0.95]
    assert all(window_end(_steps(times[:n]), _req(plan=plan), devices=1) is None for n in range(1, 8))
    end = window_end(_steps(times), _req(plan=plan), devices=1)
    assert end is not None and end.reason == "cap"


def test_a_step_not_timed_yet_keeps_the_window_open_and_never_raises():
    plan = MeasurePlan(target_se=0.5)
    steps = _steps([3.0, 1.0, 1.0, 1.0])
    del steps[2]["step_time_s"]
    assert window_end(steps, _req(warmup=1, measure=3, plan=plan), devices=1) is not None  # at its cap: fixed warm-up
    assert window_end(steps[:3], _req(plan=plan), devices=1) is None


def test_a_candidate_surely_below_what_it_needs_is_stopped_as_futile():
    noisy = [3.0, 1.0, 1.2, 0.9, 1.15, 0.85, 1.1, 0.95]  # ~1,000 tokens/s, noisy: never precise
    slow = MeasurePlan(target_se=0.005, futility_tps=2000.0)
    end = window_end(_steps(noisy[:4]), _req(plan=slow), devices=1)
    assert end is not None and end.reason == "futile"
    # one that could still reach it is measured on (the bound is on its throughput three standard errors up)
    close = MeasurePlan(target_se=0.005, futility_tps=1050.0)
    assert window_end(_steps(noisy[:4]), _req(plan=close), devices=1) is None
    # throughput is per device: the same steps on 4 devices are a quarter as fast per device
    per_device = MeasurePlan(target_se=0.005, futility_tps=600.0)
    assert window_end(_steps(noisy[:4]), _req(plan=per_device), devices=1) is None
    assert window_end(_steps(noisy[:4]), _req(plan=per_device), devices=4) is not None


# -- the engine's plan ------------------------------------------------------------------------------------------

class _OneChange(Policy):
    name = "one-change"

    def __init__(self, change: dict[str, object]) -> None:
        self.change = change

    def propose(self, ctx: PolicyContext):
        from attune.recipe.change import Change

        if any(r.kind == "candidate" for r in ctx.records):
            return Stop("tried")
        return Change(set=dict(self.change), rationale="test", source=self.name)  # type: ignore[arg-type]


def _case():
    return next(c for c in load_suite("suite") if c.recipe.name == "llama3-8b-h100x8")


@pytest.mark.parametrize("adaptive", [True, False])
def test_the_engine_measures_adaptively_where_the_recipe_says_and_each_trial_costs_less(tmp_path, adaptive):
    case = _case()
    cfg = TuneConfig.from_recipe(case.recipe, 10.0, loss_check=False, adaptive_window=adaptive)
    assert cfg.adaptive_window is adaptive
    state = Tuner(case.recipe, backend=SimBackend(seed=4, write_files=False), policy=_OneChange({}), config=cfg,
                  run_dir=tmp_path / "run").run()
    base = [r for r in state.records if r.kind == TrialKind.BASELINE and r.outcome is TrialOutcome.SUCCEEDED]
    assert len(base) == 2
    for r in base:
        m = r.measurement
        assert m is not None
        if adaptive:
            assert m.ended == "precise" and m.steps_measured < cfg.measure_steps and m.warmup_steps == 3
        else:
            assert m.ended is None and m.steps_measured == cfg.measure_steps and m.warmup_steps == cfg.warmup_steps


def test_an_adaptive_trial_costs_less_than_a_fixed_one_and_measures_the_same(tmp_path):
    recipe = _case().recipe
    sim = SimBackend(seed=7, write_files=False)
    fixed = sim.run(recipe, _req())
    adaptive = sim.run(recipe, _req(plan=MeasurePlan(target_se=WINDOW_SHARE * 0.015)))
    assert fixed.measurement is not None and adaptive.measurement is not None
    assert adaptive.charged_hours < 0.95 * fixed.charged_hours, (adaptive.wall_s, fixed.wall_s)
    a, f = adaptive.measurement.tokens_per_s_per_device, fixed.measurement.tokens_per_s_per_device
    assert abs(a / f - 1) < 0.02  # the same run's noise, its window shorter: the same throughput within the tail


def test_the_plan_aims_at_a_share_of_the_noise_known_and_stops_only_candidates_as_futile(tmp_path):
    case = _case()
    cfg = TuneConfig.from_recipe(case.recipe, 10.0, loss_check=False)
    state = Tuner(case.recipe, backend=SimBackend(seed=4, write_files=False), policy=_OneChange({}), config=cfg,
                  run_dir=tmp_path / "run").state
    from attune.engine.loop import TrialPlan

    def plan(kind: TrialKind) -> TrialPlan:
        return TrialPlan(id=1, kind=kind, recipe=case.recipe, change={}, rationale="", source="", verdict=None)

    first = measure_plan(state, plan(TrialKind.BASELINE))
    assert first is not None and first.target_se == pytest.approx(WINDOW_SHARE * DEFAULT_RUN_NOISE)
    assert first.futility_tps is None
    off = Tuner(case.recipe, backend=SimBackend(seed=4, write_files=False), policy=_OneChange({}),
                config=TuneConfig.from_recipe(case.recipe, 10.0, adaptive_window=False),
                run_dir=tmp_path / "off").state
    assert measure_plan(off, plan(TrialKind.BASELINE)) is None


# -- a real process, ended by the window ----------------------------------------------------------------------------

DECLARATION = {
    "steps": {"pattern": r"^step (?P<step>\d+) \| loss (?P<loss>[-+0-9.eE]+) \| time (?P<time_ms>[0-9.]+)ms"},
    "tokens_per_step": 1000,
    "knobs": {"workers": {"flag": "--workers", "values": [1, 2], "default": 1, "role": "loader_workers"}},
    "contract": ["--steps", "--step-ms"],
}


@pytest.mark.timeout(120)
def test_a_real_trial_is_ended_by_its_window_and_charged_only_what_it_ran(tmp_path):
    shutil.copy(FIXTURES / "bursty.py", tmp_path / "bursty.py")
    argv = ["python", "bursty.py", "--steps=400", "--step-ms=50"]
    recipe = parse_recipe(get("command").import_launch(argv, cwd=tmp_path, env={"OMP_NUM_THREADS": "1"},
                                                       options={"declaration": DECLARATION, "devices_per_node": 1}))
    # the script times its own steps (sleeps of 50 ms: steady to a few percent even on a loaded machine)
    # a target a loaded machine's oversleeps still reach long before the cap (at a 30 % spread, ~60 steps)
    req = request(tmp_path, warmup_steps=2, measure_steps=200, plan=MeasurePlan(target_se=0.05))
    res = backend().run(recipe, req)
    assert res.outcome is TrialOutcome.SUCCEEDED, res.message
    m = res.measurement
    assert m is not None and m.ended == "precise", m
    assert m.steps_measured < 200 and m.warmup_steps is not None
    assert 1000 / 0.050 * 0.8 < m.tokens_per_s_per_device < 1000 / 0.050 * 1.02
    assert res.wall_s < 0.050 * 202  # ended by the window: the fixed 202 steps sleep 10 s at the least
    log = (tmp_path / "trial" / "log.txt").read_text()
    assert "step 400" not in log
