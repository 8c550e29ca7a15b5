"""A real trial whose step lines reach attune in one burst is a measurement fault: run again, never averaged into the
baseline (issue 37, item 3: a run_clm baseline under torchrun recorded at 8,396,195 tokens/s against 4,030 for its
twin, its lines timed by their arrival). The script (fixtures/bursty.py) holds its output in a buffer on its first run
only, as a launcher that pipes its workers does, and sleeps its steps for real; the `command` framework times its
steps by line arrival (the declaration's pattern reads the step and the loss, not the script's own time)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from attune.engine.loop import TuneConfig, Tuner
from attune.frameworks import get
from attune.policies import make_policy
from attune.recipe.io import parse_recipe
from attune.report.result import build_result
from attune.testing.trials import backend
from attune.trial import TrialKind, TrialOutcome

FIXTURE = Path(__file__).parent / "fixtures" / "bursty.py"
STEP_S = 0.04
TOKENS = 1000

DECLARATION = {
    "steps": {"pattern": r"^step (?P<step>\d+) \| loss (?P<loss>[-+0-9.eE]+)"},
    "tokens_per_step": TOKENS,
    "knobs": {"workers": {"flag": "--workers", "values": [1, 2], "default": 1, "role": "loader_workers"}},
    "contract": ["--steps", "--step-ms"],
}


def _recipe(tmp_path: Path):
    shutil.copy(FIXTURE, tmp_path / "bursty.py")
    argv = ["python", "bursty.py", "--steps=6", f"--step-ms={STEP_S * 1000:g}",
            f"--burst-once={tmp_path / 'burst-marker'}"]
    data = get("command").import_launch(argv, cwd=tmp_path, env={"OMP_NUM_THREADS": "1"},
                                        options={"declaration": DECLARATION, "devices_per_node": 1})
    return parse_recipe(data)


@pytest.mark.timeout(120)
def test_a_trial_whose_lines_arrive_in_one_burst_is_re_measured_and_never_averaged_into_the_baseline(tmp_path):
    recipe = _recipe(tmp_path)
    cfg = TuneConfig.from_recipe(recipe, 1.0, search_space=(), loss_check=False, warmup_steps=1, measure_steps=4,
                                 baseline_repeats=2, trial_timeout_s=60, certify_share=0.0)
    state = Tuner(recipe, backend=backend(), policy=make_policy("playbook"), config=cfg,
                  run_dir=tmp_path / "run").run()
    base = [r for r in state.records if r.kind == TrialKind.BASELINE]
    burst = base[0]
    assert burst.outcome is TrialOutcome.MISMEASURED and "burst" in burst.message, (burst.message, state.finished)
    assert "runs again" in burst.decision
    # the honest re-runs (on a loaded machine attune's own reader may fall behind and see a burst again: that run is
    # a fault too, and runs again; none of them is ever used)
    good = [r for r in base if r.outcome is TrialOutcome.SUCCEEDED]
    faults = [r for r in base if r.outcome is TrialOutcome.MISMEASURED]
    assert len(good) == 2 and len(faults) + len(good) == len(base), [(r.outcome, r.message) for r in base]
    # what the burst would have contributed: a step of tens of microseconds, hundreds of times the true throughput
    true_tps = TOKENS / STEP_S
    assert burst.measurement is not None and burst.measurement.tokens_per_s_per_device > 20 * true_tps
    for r in good:  # the re-runs were timed by their flushed lines: each near its real 40 ms step
        assert r.measurement is not None and 0.6 * true_tps < r.measurement.tokens_per_s_per_device < 1.1 * true_tps
    # never averaged: the baseline, its noise floor and the report rest on the two honest runs alone
    assert [r.id for r in state.baselines()] == [r.id for r in good]
    assert 0.6 * true_tps < (state.baseline_throughput() or 0) < 1.1 * true_tps
    assert state.floor() < 0.25
    res = build_result(state)
    assert res["speedup"] == 1.0 and res["trials_mismeasured"] == len(faults) and res["trials_failed"] == 0
    log = (tmp_path / "run" / "trials" / "0001" / "log.txt").read_text()
    assert log.count("| loss ") == 6  # the trial's own log holds all its lines: they were read, then judged
