"""The tuner benchmark on a reduced suite: two recipes, one seed, a small budget."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attune.bench.oracle import admissible_values, enumerate_space, oracle
from attune.bench.run import Job, make_tuner, parse_budget, run_bench, run_job, trial_cost_hours
from attune.bench.suite import load_suite
from attune.errors import AttuneError
from attune.gate import evaluate
from attune.sim.perf import simulate

REDUCED = ["llama3.2-1b-h100x8", "llama3-8b-fp8-h100x8-nvidia"]


def test_suite_covers_the_issue() -> None:
    cases = load_suite("suite")
    assert len(cases) >= 12
    devices = [c.recipe.resources.devices for c in cases]
    assert min(devices) == 8 and max(devices) >= 1024
    assert any(c.recipe.model.is_moe for c in cases) and any(not c.recipe.model.is_moe for c in cases)
    assert any(c.origin == "nvidia-published" for c in cases)
    for c in cases:
        assert simulate(c.recipe).outcome == "succeeded", c.name  # every start runs


def test_unknown_suite_and_recipe() -> None:
    with pytest.raises(AttuneError):
        load_suite("no-such-suite")
    with pytest.raises(AttuneError):
        load_suite("suite", only=["nope"])


def test_admissible_values_follow_the_gate() -> None:
    r = load_suite("suite", only=["llama3-8b-h100x8"])[0].recipe
    # llama3's vocabulary pads differently at TP=4/8: the gate refuses those, so does the oracle's domain
    assert admissible_values(r, "tensor_model_parallel_size") == [1, 2]
    assert admissible_values(r, "fp8") == [None]  # no fp8 opt-in


def test_oracle_optimum_is_admissible_and_cached(tmp_path: Path) -> None:
    r = load_suite("suite", only=[REDUCED[0]])[0].recipe
    o = oracle(r, tmp_path)
    assert list(tmp_path.glob("*.json"))
    assert o.optimum_tps >= o.baseline_tps > 0
    best = r.with_knobs(**o.optimum_knobs)
    assert evaluate(r, best, (), parent=best).admitted
    assert simulate(best).tokens_per_s_per_device == pytest.approx(o.optimum_tps)
    again = oracle(r, tmp_path)
    assert again.optimum_tps == o.optimum_tps and again.seconds == o.seconds  # read from the cache
    assert enumerate_space(r).admissible == o.admissible


def test_budget_parsing() -> None:
    r = load_suite("suite", only=[REDUCED[0]])[0].recipe
    assert parse_budget("15t", r) == pytest.approx(15 * trial_cost_hours(r))
    assert parse_budget("2.5", r) == 2.5
    with pytest.raises(AttuneError):
        parse_budget("lots", r)


def test_refused_proposals_cost_nothing() -> None:
    case = load_suite("suite", only=[REDUCED[1]])[0]
    o = oracle(case.recipe)
    res = run_job(Job(case=case, tuner="random", seed=0, budget_hours=parse_budget("6t", case.recipe),
                      optimum_tps=o.optimum_tps))
    assert res["available"] and res["refusals"] > 0
    assert res["budget_used_hours"] <= res["budget_hours"] + 1e-9
    # the anytime curve advances only on launched trials: one point per record, flat hours on refusals
    hours = [h for h, _ in res["curve"]]
    assert len(hours) == 1 + res["trials_launched"] + res["refusals"]
    assert sum(1 for a, b in zip(hours, hours[1:]) if b == a) >= res["refusals"]


def test_attune_falls_back_to_coordinate_without_playbook() -> None:
    policy, gate, desc = make_tuner("attune", 0, "playbook")
    assert policy.name in ("coordinate", "playbook")
    assert gate is None


@pytest.mark.slow
def test_reduced_benchmark(tmp_path: Path) -> None:
    run_bench("suite", tuners=["attune", "random", "tpe", "gp"], budget="15t", seeds=1, out_dir=tmp_path,
                only=REDUCED, attune_policy="coordinate", cache_dir=tmp_path / "cache")
    for name in ("bench.json", "bench.md", "anytime.png", "summary.png"):
        assert (tmp_path / name).exists()
    data = json.loads((tmp_path / "bench.json").read_text())
    assert {c["name"] for c in data["cases"]} == set(REDUCED)
    assert set(data["summary"]["tuners"]) == {"attune", "random", "tpe", "gp"}
    optimum = {c["name"]: c["oracle"]["optimum_tps"] for c in data["cases"]}
    for run in data["runs"]:
        if not run["available"]:
            assert run["tuner"] == "gp"  # Optuna's GPSampler needs scipy
            continue
        assert run["best_tps"] <= optimum[run["recipe"]] * (1 + 1e-9)
        assert 0 < run["fraction_of_optimum"] <= 1 + 1e-9
        # the engine starts a trial only while the budget lasts (the last one may run past it)
        hours = sorted({h for h, _ in run["curve"]})
        assert len(hours) < 2 or hours[-2] < run["budget_hours"]
        assert run["wasted_hours"] <= run["budget_used_hours"]
        assert run["curve"][0][0] == 0.0
    assert "done_criteria" in data["summary"]
