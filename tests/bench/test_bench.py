"""The tuner benchmark on a reduced suite: two recipes, one seed, a small budget."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attune.bench.oracle import enumerate_space, oracle
from attune.bench.run import Job, make_tuner, parse_budget, run_bench, run_job, trial_cost_hours
from attune.bench.suite import load_suite
from attune.errors import AttuneError
from attune.gate import evaluate
from attune.gate.rules import admissible_values
from attune.sim import simulate

REDUCED = ["llama3.2-1b-h100x8", "llama3-8b-fp8-h100x8-nvidia"]


def test_suite_covers_the_issue() -> None:
    cases = load_suite("suite")
    assert len(cases) >= 24
    devices = [c.recipe.resources.devices for c in cases]
    assert min(devices) == 8 and max(devices) >= 1024
    assert any(c.recipe.model.is_moe for c in cases) and any(not c.recipe.model.is_moe for c in cases)
    assert any(c.origin == "nvidia-published" for c in cases)
    for c in cases:
        assert simulate(c.recipe).outcome == "succeeded", c.name  # every start runs
    # the headroom recipes: shipped-style starts across model kinds, sizes and accelerators (their 1.3-4x headroom
    # is checked by benchmarks/scripts/make_headroom_suite.py --check: it needs the oracle, minutes per recipe)
    headroom = [c for c in cases if c.path.read_text().startswith("# headroom:")]
    assert len(headroom) >= 10
    assert {c.recipe.resources.accelerator for c in headroom} >= {"a100-80gb", "h100-sxm-80gb", "h200", "b200"}
    assert any(c.recipe.model.is_moe for c in headroom) and any(not c.recipe.model.is_moe for c in headroom)
    assert any(c.recipe.training.seq_length >= 32768 for c in headroom)  # long context, CP off
    assert min(c.recipe.resources.devices for c in headroom) == 8 and max(c.recipe.resources.devices
                                                                          for c in headroom) >= 256
    conservative = [c for c in headroom if c.recipe.knob("recompute_granularity") != "none"
                    and int(c.recipe.knob("pipeline_model_parallel_size")) > 1 and c.recipe.knob("micro_batch_size") == 1
                    and not c.recipe.knob("overlap_grad_reduce")]
    assert len(conservative) >= len(headroom) // 2


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


def test_refused_proposals_cost_nothing_and_baselines_draw_only_admissible_configurations() -> None:
    case = load_suite("suite", only=[REDUCED[1]])[0]
    o = oracle(case.recipe)
    res = run_job(Job(case=case, tuner="random", seed=0, budget_hours=parse_budget("6t", case.recipe),
                      optimum_tps=o.optimum_tps))
    assert res["available"] and res["refusals"] == 0  # inadmissible draws never reach the engine
    assert res["policy_stats"]["inadmissible_draws"] > 0  # ...but they were drawn, and told to the sampler
    assert res["budget_used_hours"] <= res["budget_hours"] + 1e-9
    hours = [h for h, _ in res["curve"]]
    assert len(hours) == 1 + res["trials_launched"] + res["refusals"]


def test_samplers_draw_independently_and_never_repeat_a_refused_configuration() -> None:
    from attune.policies.optuna import sampler_seed

    assert len({sampler_seed(t, 0) for t in ("random", "tpe", "gp", "cmaes")}) == 4
    case = load_suite("suite", only=[REDUCED[0]])[0]
    o = oracle(case.recipe)
    firsts = {}
    for t in ("random", "tpe", "gp", "cmaes"):
        res = run_job(Job(case=case, tuner=t, seed=0, budget_hours=parse_budget("8t", case.recipe),
                          optimum_tps=o.optimum_tps))
        assert res["available"], res.get("error")
        assert "refused by the gate" not in (res["stop_reason"] or ""), t  # no run ends on a wall of refusals
        assert res["refusals"] == 0 and res["budget_used_hours"] <= res["budget_hours"] + 1e-9
        firsts[t] = json.dumps(res["curve"][:4])
    assert len(set(firsts.values())) > 1  # the same run seed does not make the same runs


def test_no_tuner_overspends_or_leaves_the_search_space() -> None:
    case = load_suite("suite", only=["llama3.2-1b-h100x8"])[0]
    o = oracle(case.recipe)
    for t in ("attune", "random", "grid"):
        for seed in (0, 1):
            res = run_job(Job(case=case, tuner=t, seed=seed, budget_hours=parse_budget("8t", case.recipe),
                              optimum_tps=o.optimum_tps))
            assert res["overspend"] == 0.0 and res["budget_used_hours"] <= res["budget_hours"] + 1e-9, (t, seed)
            assert not res["outside_search_space"], (t, res["best_changes"])


def test_grid_prunes_by_the_memory_estimate_and_prefers_little_model_parallelism() -> None:
    from attune.policies.grid import GridPolicy
    from tests.agent.helpers import baseline_record, context

    r = load_suite("suite", only=["mixtral-8x22b-h100x256"])[0].recipe
    pol = GridPolicy()
    ctx = context(r, [baseline_record(r)])
    grid = pol.grid(ctx)
    assert grid and pol.stats["pruned_memory"] > 0
    for point in grid:
        cand = r.with_knobs(**point)
        peak, cap = r.catalogue.memory_model(cand)
        assert peak <= pol.memory_margin * cap
    mp = [int(p.get("tensor_model_parallel_size", 1)) * int(p.get("pipeline_model_parallel_size", 1)) for p in grid]
    assert mp == sorted(mp)


def test_metrics_share_of_gain_hours_to_target_and_area() -> None:
    from attune.bench.run import bootstrap_ci

    case = load_suite("suite", only=["llama3.2-1b-h100x8"])[0]
    o = oracle(case.recipe)
    res = run_job(Job(case=case, tuner="attune", seed=0, budget_hours=parse_budget("15t", case.recipe),
                      optimum_tps=o.optimum_tps))
    start = res["baseline_tps"] / o.optimum_tps
    assert res["gain_share"] == pytest.approx((res["fraction_of_optimum"] - start) / (1 - start))
    assert start - 1e-9 <= res["auc"] <= res["fraction_of_optimum"] + 1e-9
    if res["hours_to_target"] is not None:
        assert 0 <= res["hours_to_target"] <= res["budget_hours"] and res["fraction_of_optimum"] >= 0.95
        assert res["trials_to_target"] == pytest.approx(res["hours_to_target"] / trial_cost_hours(case.recipe))
    lo, hi = bootstrap_ci([0.8, 0.9, 0.95, 1.0, 0.85])
    assert lo <= 0.9 <= hi and bootstrap_ci([0.8, 0.9, 0.95, 1.0, 0.85]) == (lo, hi)  # seeded: reproducible


def test_llm_tuners_are_reported_as_not_run_without_an_endpoint(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ATTUNE_LLM_BASE_URL", raising=False)
    doc = run_bench("suite", tuners=["attune", "llm", "optico"], budget="4t", seeds=1, out_dir=tmp_path,
                    only=["llama3.2-1b-h100x8"], cache_dir=tmp_path / "cache")
    per = doc["summary"]["tuners"]
    assert per["attune"]["available"] and not per["llm"]["available"] and not per["optico"]["available"]
    md = (tmp_path / "bench.md").read_text()
    assert "not run: no OpenAI-compatible endpoint" in md and "ATTUNE_LLM_BASE_URL" in md


def test_several_budgets_make_one_report(tmp_path: Path) -> None:
    doc = run_bench("suite", tuners=["attune", "random"], budget="4t,8t", seeds=1, out_dir=tmp_path,
                    only=["llama3.2-1b-h100x8"], cache_dir=tmp_path / "cache")
    assert set(doc["budgets"]) == {"4t", "8t"}
    for name in ("bench.md", "bench.json", "budget.png", "anytime.png", "summary.png", "4t/bench.md", "8t/bench.json"):
        assert (tmp_path / name).exists(), name
    md = (tmp_path / "bench.md").read_text()
    assert "Median fraction of optimum by budget" in md and "share of available gain" in md
    assert "attune median fraction rises with budget" in doc["done_criteria"]


def test_attune_falls_back_to_coordinate_without_playbook() -> None:
    policy, gate, _ = make_tuner("attune", 0, "playbook")
    assert policy.name in ("coordinate", "playbook")
    assert gate is None


@pytest.mark.slow
def test_reduced_benchmark(tmp_path: Path) -> None:
    run_bench("suite", tuners=["attune", "random", "tpe", "gp", "cmaes", "grid"], budget="15t", seeds=1,
              out_dir=tmp_path, only=REDUCED, attune_policy="playbook", cache_dir=tmp_path / "cache")
    for name in ("bench.json", "bench.md", "anytime.png", "summary.png"):
        assert (tmp_path / name).exists()
    data = json.loads((tmp_path / "bench.json").read_text())
    assert {c["name"] for c in data["cases"]} == set(REDUCED)
    assert set(data["summary"]["tuners"]) == {"attune", "random", "tpe", "gp", "cmaes", "grid"}
    optimum = {c["name"]: c["oracle"]["optimum_tps"] for c in data["cases"]}
    for run in data["runs"]:
        if not run["available"]:
            assert run["tuner"] == "gp"  # Optuna's GPSampler needs scipy
            continue
        assert run["best_tps"] <= optimum[run["recipe"]] * (1 + 1e-9)
        assert 0 < run["fraction_of_optimum"] <= 1 + 1e-9
        # one budget rule for all: a trial runs only when the budget pays for its whole decision
        assert run["budget_used_hours"] <= run["budget_hours"] * (1 + 1e-9)
        assert run["wasted_hours"] <= run["budget_used_hours"]
        assert run["curve"][0][0] == 0.0
        assert not run["outside_search_space"]
        for key in ("gain_share", "hours_to_target", "auc", "budget_left_hours", "stop_reason"):
            assert key in run
    assert "done_criteria" in data["summary"]
    ci = data["summary"]["tuners"]["attune"]["ci_fraction_of_optimum"]
    assert ci is not None and ci[0] <= data["summary"]["tuners"]["attune"]["median_fraction_of_optimum"] <= ci[1]


def test_a_stop_because_every_move_is_priced_out_says_it_was_the_budget(tmp_path: Path) -> None:
    from attune.backends.base import TrialRequest
    from attune.backends.simulated import SimBackend
    from attune.engine.journal import MemoryJournal
    from attune.engine.loop import TuneConfig, Tuner
    from attune.engine.policy import Policy, Stop

    case = load_suite("suite", only=["llama3.2-1b-h100x8"])[0]
    recipe = case.recipe
    cfg = TuneConfig.from_recipe(recipe, 1.0)
    one = SimBackend(seed=1, write_files=False).worst_case_hours(recipe, TrialRequest(
        trial_id=0, trial_dir=tmp_path, warmup_steps=cfg.warmup_steps, measure_steps=cfg.measure_steps,
        timeout_s=cfg.trial_timeout_s))
    assert one is not None and one > 0

    class AsksThenStops(Policy):
        name = "asks-then-stops"

        def __init__(self) -> None:
            self.asked: list[bool] = []

        def propose(self, ctx):  # type: ignore[no-untyped-def]
            self.asked.append(ctx.admissible({"micro_batch_size": 2}))
            return Stop("nothing left")

    def finished(budget_trials: float) -> tuple[str, list[bool]]:
        policy = AsksThenStops()
        config = TuneConfig.from_recipe(recipe, budget_trials * one)
        tuner = Tuner(recipe, backend=SimBackend(seed=1, write_files=False), policy=policy, config=config,
                      run_dir=tmp_path / f"run-{budget_trials}", journal=MemoryJournal())
        return str(tuner.run().finished), policy.asked

    priced_out = 0
    for tenths in range(40, 80, 3):  # after two baselines, around what one candidate's whole decision costs
        reason, asked = finished(tenths / 10)
        if asked == [False]:  # the move was admissible but not affordable: the stop was the budget's
            priced_out += 1
            assert reason.startswith("budget nearly spent") and "nothing left" in reason, reason
        elif asked == [True]:
            assert reason == "policy stopped: nothing left"
    assert priced_out, "no budget in the range left the move admissible but unaffordable"
    reason, asked = finished(40)
    assert asked == [True] and reason == "policy stopped: nothing left"


def test_the_oracle_cache_key_is_the_same_in_every_process():
    """A cached oracle is found again by a later run: its key depends on nothing a process draws at random (string
    hashing orders sets; a cached function's repr holds an address)."""
    import os
    import subprocess
    import sys

    code = ("from attune.bench.suite import load_suite; from attune.bench.oracle import cache_key; "
            "print([cache_key(c.recipe) for c in load_suite('suite', limit=3)])")
    keys = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": seed}).stdout for seed in ("1", "2", "3")}
    assert len(keys) == 1, keys


@pytest.mark.slow
def test_the_lessons_benchmark_holds_each_family_out_of_its_own_store(tmp_path):
    """`attune bench --lessons loo`: every recipe is tuned cold and warm on one noise stream, warm with the lessons
    of the *other* families' learning runs only; the report pairs them and states the done criteria."""
    import json

    from attune.agent.lessons import LessonStore
    from attune.bench.lessons import run_lessons_bench

    only = ["llama3.2-1b-h100x8", "llama3-8b-h100x8", "mixtral-8x7b-h100x64"]
    doc = run_lessons_bench("suite", design="loo", budget="8t", seeds=1, out_dir=tmp_path, only=only,
                            cache_dir=tmp_path / "oracle")
    runs = doc["runs"]
    assert sorted((r["recipe"], r["arm"]) for r in runs) == sorted((n, a) for n in only for a in ("cold", "warm"))
    assert all(r["available"] for r in runs)
    for fam in ("llama3", "mixtral"):
        held_out = LessonStore(tmp_path / "stores" / f"{fam}-0.json").all()
        assert held_out, f"the {fam} store holds the other family's lessons"
        assert {lz.scope.model_family for lz in held_out} == ({"mixtral"} if fam == "llama3" else {"llama3"})
    s = doc["summary"]
    assert set(s["families"]) == {"llama3", "mixtral"} and s["overall"]["cold"]["runs"] == 3
    assert s["overall"]["fraction_difference"]["pairs"] == 3
    assert isinstance(s["done_criteria"]["met"], bool)
    md = (tmp_path / "lessons.md").read_text()
    assert "| **all** | 3 |" in md and "Done criteria" in md and (tmp_path / "lessons.png").stat().st_size > 1000
    assert json.loads((tmp_path / "lessons.json").read_text())["design"] == "loo"


def test_the_lessons_benchmark_says_what_design_it_takes():
    from attune.bench.lessons import parse_design
    from attune.errors import AttuneError

    assert parse_design("loo") == ("loo", None, None)
    assert parse_design("learn=suite,apply=other") == ("transfer", "suite", "other")
    with pytest.raises(AttuneError, match="learn=SUITE_A,apply=SUITE_B"):
        parse_design("learn=suite")


def test_the_done_criteria_name_each_group_and_the_targets_of_the_learning_issue() -> None:
    """Per budget, what ``done_criteria`` reads: the median per group must rise at every step, the largest budget's
    median must reach 0.99, and 15t's headroom share 0.93; a summary that misses them says False."""
    from attune.bench.run import done_criteria

    def doc(all_: float, head: float, little: float, share: float) -> dict:
        a = {"available": True, "median_fraction_of_optimum": all_, "min_fraction_of_optimum": 0.5}
        return {"summary": {"tuners": {"attune": a},
                            "groups": {"headroom": {"attune": {**a, "median_fraction_of_optimum": head,
                                                                "median_gain_share": share,
                                                                "median_trials_to_target": None}},
                                       "little-left": {"attune": {**a, "median_fraction_of_optimum": little}}}}}

    crit = done_criteria({"8t": doc(0.93, 0.89, 0.975, 0.6), "15t": doc(0.97, 0.96, 0.975, 0.9),
                          "30t": doc(0.98, 0.98, 0.98, 0.95)})
    assert crit["attune median fraction rises with budget"] is True
    assert crit["headroom: attune median fraction rises with budget"] is True
    assert crit["little-left: attune median fraction rises with budget"] is False  # 0.975 at 8t and 15t
    assert crit["30t: attune median fraction >= 0.99"] is False
    assert crit["15t headroom: attune median gain share >= 0.93"] is False
    crit = done_criteria({"8t": doc(0.95, 0.92, 0.97, 0.7), "15t": doc(0.98, 0.97, 0.98, 0.94),
                          "30t": doc(0.99, 0.99, 0.99, 0.97)})
    assert crit["little-left: attune median fraction rises with budget"] is True
    assert crit["30t: attune median fraction >= 0.99"] is True
    assert crit["15t headroom: attune median gain share >= 0.93"] is True
