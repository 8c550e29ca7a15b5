"""The simulator backend: measurements like a real trial's, seeded noise, cluster-like charging."""

from __future__ import annotations

from pathlib import Path

from attune.backends import make_backend
from attune.backends.base import TrialRequest
from attune.backends.simulated import LAUNCH_S, SimBackend
from attune.recipe.io import load_recipe
from attune.trial import TrialOutcome

SUITE = Path(__file__).resolve().parents[2] / "benchmarks" / "suite"
SMALL = SUITE / "01-llama3.2-1b-h100x8.yaml"


def _req(tmp_path: Path, tid: int = 1, timeout: float = 1800) -> TrialRequest:
    return TrialRequest(trial_id=tid, trial_dir=tmp_path / f"t{tid}", warmup_steps=2, measure_steps=6,
                        timeout_s=timeout)


def test_make_backend_sim() -> None:
    assert make_backend("sim").name == "sim"


def test_success_has_measurement_and_charge(tmp_path: Path) -> None:
    r = load_recipe(SMALL)
    res = SimBackend(seed=1).run(r, _req(tmp_path))
    assert res.outcome is TrialOutcome.SUCCEEDED
    m = res.measurement
    assert m is not None and m.steps_measured == 6
    assert {"compute", "dp_exposed", "host_overhead"} <= set(m.phases)
    assert {"sm_active", "tensor_active", "dram_active", "nvlink_bytes", "fb_used_gb"} <= set(m.signals)
    assert res.wall_s > LAUNCH_S[0] + 8 * m.step_time_median_s * 0.9
    assert abs(res.charged_hours - 8 * res.wall_s / 3600) < 1e-9
    assert (tmp_path / "t1" / "sim.json").exists()


def test_noise_is_seeded_by_seed_and_trial(tmp_path: Path) -> None:
    r = load_recipe(SMALL)
    a = SimBackend(seed=3).run(r, _req(tmp_path, 1)).measurement
    b = SimBackend(seed=3).run(r, _req(tmp_path, 1)).measurement
    c = SimBackend(seed=3).run(r, _req(tmp_path, 2)).measurement
    assert a is not None and b is not None and c is not None
    assert a.tokens_per_s_per_device == b.tokens_per_s_per_device
    assert a.tokens_per_s_per_device != c.tokens_per_s_per_device
    assert abs(a.tokens_per_s_per_device / c.tokens_per_s_per_device - 1) < 0.1


def test_oom_costs_launch_and_first_step(tmp_path: Path) -> None:
    r = load_recipe(SMALL).with_knobs(tensor_model_parallel_size=1, sequence_parallel=False, micro_batch_size=16)
    res = SimBackend(seed=0).run(r, _req(tmp_path))
    assert res.outcome is TrialOutcome.OOM
    assert res.measurement is None
    assert LAUNCH_S[0] < res.wall_s < 400
    assert res.charged_hours > 0


def test_timeout_is_charged_the_deadline(tmp_path: Path) -> None:
    r = load_recipe(SMALL)
    res = SimBackend(seed=0).run(r, _req(tmp_path, timeout=130))
    assert res.outcome is TrialOutcome.TIMED_OUT
    assert res.wall_s == 130
