"""Playbook moves sized by the memory model on real suite recipes: coupled changes, long steps, the search space,
and a budget turned into gain instead of an early stop."""

from __future__ import annotations

from pathlib import Path

import pytest

from attune.backends.base import TrialRequest
from attune.backends.simulated import SimBackend
from attune.bench.suite import load_suite
from attune.engine.policy import PolicyContext
from attune.errors import RecipeError
from attune.gate import evaluate
from attune.gate.verdict import ReasonCode
from attune.policies.playbook import PlaybookPolicy
from attune.recipe.change import apply_change, signature
from attune.recipe.model import Recipe
from attune.trial import TrialRecord

NO_RECOMPUTE = {"recompute_granularity": "none", "recompute_method": None, "recompute_num_layers": None}


def _suite(name: str) -> Recipe:
    return load_suite("suite", only=[name])[0].recipe


def _ctx(baseline: Recipe, best: Recipe | None = None) -> PolicyContext:
    """A context whose best was measured once on the (noiseless) simulator, behind the engine's gate."""
    best = best or baseline
    res = SimBackend(seed=1, noise=False, write_files=False).run(best, TrialRequest(
        trial_id=1, trial_dir=Path("/nonexistent"), warmup_steps=2, measure_steps=6, timeout_s=1800))
    rec = TrialRecord(id=1, kind="baseline", knobs=best.effective_knobs, signature=signature(best),
                      outcome=res.outcome, measurement=res.measurement, charged_hours=1.0)

    def admissible(change: dict) -> bool:
        try:
            cand = apply_change(best, change)
        except RecipeError:  # the change makes an invalid recipe
            return False
        return signature(cand) != signature(best) and evaluate(baseline, cand, [best], parent=best).admitted

    return PolicyContext(baseline=baseline, best=best, best_measurement=res.measurement, records=(rec,),
                         search_space=baseline.tuning.search_space, noise_floor=0.02, budget_left_hours=1e9,
                         admissible=admissible, backend="sim")


def test_fewer_pipeline_stages_come_with_the_distributed_optimizer_as_one_change():
    r = _suite("llama3-8b-a100x16")
    best = r.with_knobs(**NO_RECOMPUTE)
    assert best.catalogue.predicts_infeasible(best.with_knobs(pipeline_model_parallel_size=1))  # alone: OOM
    pb = PlaybookPolicy()
    ctx = _ctx(r, best)
    ranked = pb.candidates(ctx, pb.diagnosis(ctx))
    pp = [c for c in ranked if c.knob == "pipeline_model_parallel_size" and c.value == 1]
    assert pp, "the coupled move is offered"
    change = pp[0].change
    assert change["use_distributed_optimizer"] is True and any("coupled" in n for n in pp[0].notes)
    assert {"pipeline_model_parallel_size": 1} not in [c.change for c in ranked]  # never the OOM move alone
    verdict = evaluate(r, apply_change(best, change), [best], parent=best)
    assert verdict.admitted and set(verdict.changed_groups) == {"pipeline", "dp_overlap"}  # one change, two groups


def test_the_gate_admits_two_groups_only_where_declared_coupled_and_one_alone_cannot_fit():
    r = _suite("llama3-70b-h200x64")
    ok = r.with_knobs(pipeline_model_parallel_size=1, use_distributed_optimizer=True)
    assert evaluate(r, ok, (), parent=r).admitted  # PP=1 alone runs out of memory: coupled, admitted
    fits_alone = r.with_knobs(pipeline_model_parallel_size=2, use_distributed_optimizer=True)
    assert not r.catalogue.predicts_infeasible(r.with_knobs(pipeline_model_parallel_size=2))
    v = evaluate(r, fits_alone, (), parent=r)
    assert not v.admitted and [x.code for x in v.reasons] == [ReasonCode.MULTIPLE_GROUPS]  # measure each alone
    undeclared = r.with_knobs(manual_gc=True, use_distributed_optimizer=True)
    assert not evaluate(r, undeclared, (), parent=r).admitted


def test_less_tensor_parallelism_that_cannot_fit_alone_comes_with_a_smaller_micro_batch():
    """deepseek-v2-lite on 32 H100s, tuned to TP 2, PP 2, micro-batch 8 without recompute: TP 1 alone runs out of
    memory, TP 1 with micro-batch 2 is about 6 % faster on the simulator. The catalogue couples TP and PP with the
    micro-batch, so the gate admits the pair and the playbook proposes TP 1 with a micro-batch that fits."""
    r = _suite("deepseek-v2-lite-h100x32")
    best = r.with_knobs(pipeline_model_parallel_size=2, micro_batch_size=8, recompute_granularity="none",
                        recompute_method=None, recompute_num_layers=None)
    assert r.catalogue.predicts_infeasible(best.with_knobs(tensor_model_parallel_size=1))
    assert evaluate(r, best.with_knobs(tensor_model_parallel_size=1, micro_batch_size=2), (), parent=best).admitted
    assert not evaluate(r, best.with_knobs(tensor_model_parallel_size=4, micro_batch_size=4), (),
                        parent=best).admitted  # TP 4 fits alone: each is measured alone
    pb = PlaybookPolicy()
    ctx = _ctx(r, best)
    moves = [c.change for c in pb.candidates(ctx, pb.diagnosis(ctx)) if c.change.get("tensor_model_parallel_size") == 1]
    assert moves and all(m.get("micro_batch_size", 8) < 8 for m in moves), moves
    assert all(pb._fit_share(ctx, m) <= 1.0 for m in moves)  # noqa: SLF001


def test_a_long_micro_batch_step_where_the_memory_model_says_it_fits_and_kernels_are_small():
    r = _suite("deepseek-v2-lite-h100x32")  # fine-grained experts: tiny GEMMs, low MFU
    pb = PlaybookPolicy()
    ctx = _ctx(r)
    ranked = pb.candidates(ctx, pb.diagnosis(ctx))
    mbs = [c for c in ranked if c.knob == "micro_batch_size" and c.direction == "up"]
    jump = max(mbs, key=lambda c: c.steps)
    assert jump.steps >= 2 and jump.value >= 4  # micro-batch 1 → 4 or 8 in one trial, not one doubling at a time
    share = pb._fit_share(ctx, jump.change)  # noqa: SLF001
    assert share is not None and share <= pb.memory_margin
    assert ranked[0].knob == "micro_batch_size" and ranked[0].steps >= 2


def test_no_long_step_where_kernels_are_already_efficient():
    r = _suite("llama3.2-3b-h100x8")
    pb = PlaybookPolicy()
    ctx = _ctx(r, r.with_knobs(**NO_RECOMPUTE))
    ranked = pb.candidates(ctx, pb.diagnosis(ctx))
    assert all(c.steps == 1 for c in ranked if c.knob == "micro_batch_size")
    # the parallel dimensions the model does not need lead instead
    assert {ranked[0].knob, ranked[1].knob} == {"tensor_model_parallel_size", "pipeline_model_parallel_size"}


def test_completions_never_leave_the_search_space():
    r = _suite("llama3.2-1b-h100x8")  # dp_overlap holds bucket_size, which this search space does not
    pb = PlaybookPolicy()
    ctx = _ctx(r)
    space = set(r.tuning.search_space)
    for c in pb.candidates(ctx, pb.diagnosis(ctx)):
        assert set(c.change) <= space, c.change


def test_more_budget_buys_more_gain_instead_of_an_early_stop():
    from attune.bench.oracle import oracle
    from attune.bench.run import Job, parse_budget, run_job

    case = load_suite("suite", only=["llama3-8b-a100x16"])[0]
    o = oracle(case.recipe)
    runs = {}
    for policy in ("playbook", "playbook-stop-early"):
        job = Job(case=case, tuner="attune", seed=0, budget_hours=parse_budget("30t", case.recipe),
                  optimum_tps=o.optimum_tps, budget="30t")
        if policy == "playbook-stop-early":
            import attune.bench.run as run

            orig = run.make_tuner

            def early(name, seed, attune_policy="playbook", recipe=None, lessons=None, _orig=orig):
                pol, gate, desc = _orig(name, seed, attune_policy, recipe, lessons)
                pol.stop_early = True
                return pol, gate, desc

            run.make_tuner = early
            try:
                runs[policy] = run_job(job)
            finally:
                run.make_tuner = orig
        else:
            runs[policy] = run_job(job)
    keep, early = runs["playbook"], runs["playbook-stop-early"]
    assert keep["budget_used_hours"] >= early["budget_used_hours"]
    assert keep["fraction_of_optimum"] >= early["fraction_of_optimum"]
    assert keep["fraction_of_optimum"] >= 0.95


def test_a_bigger_micro_batch_comes_with_more_experts_sharded_and_a_second_completion_is_the_smallest():
    r = _suite("deepseek-v2-lite-h200x16")
    best = r.with_knobs(micro_batch_size=2)
    assert best.catalogue.predicts_infeasible(best.with_knobs(micro_batch_size=4))  # alone: out of memory
    pb = PlaybookPolicy()
    ctx = _ctx(r, best)

    def move(context: PolicyContext) -> dict | None:
        ranked = pb.candidates(context, pb.diagnosis(context))
        return next((c.change for c in ranked if c.knob == "micro_batch_size" and c.value == 4), None)

    first = move(ctx)
    assert first is not None and first["expert_model_parallel_size"] > 1  # EP frees the memory: one change
    v = evaluate(r, apply_change(best, first), [best], parent=best)
    assert v.admitted and set(v.changed_groups) == {"expert_parallel", "micro_batch_size"}

    def rejected(change: dict, rid: int) -> TrialRecord:
        cand = apply_change(best, change)
        return TrialRecord(id=rid, kind="candidate", change=change, knobs=cand.effective_knobs,
                           signature=signature(cand), outcome="succeeded", decision="rejected", gain=-0.03)

    def after(*changes: dict) -> PolicyContext:
        recs = [rejected(c, i + 2) for i, c in enumerate(changes)]
        tried = {signature(best)} | {x.signature for x in recs}
        inner = ctx.admissible
        return PolicyContext(baseline=r, best=best, best_measurement=ctx.best_measurement,
                             records=(*ctx.records, *recs), search_space=ctx.search_space, noise_floor=0.02,
                             budget_left_hours=1e9, backend="sim",
                             admissible=lambda c: inner(c) and signature(apply_change(best, c)) not in tried)

    second = move(after(first))
    assert second is not None and second != first
    assert len(second) == 2 or len(first) == 2  # the second completion changes the fewest knobs
    assert len(second) <= len(first)
    assert move(after(first, second)) is None  # never a third completion of the same move from this best


def test_a_memory_bound_recipe_gets_fewer_stages_only_with_the_tensor_parallelism_that_frees_the_memory():
    """Nemotron-4 340B on 256 H100s (NVIDIA's published layout TP 8, PP 8) is memory-bound: PP 4 alone adds memory and
    would not fit, so the guard never offers it alone; with TP 16 the model-parallel size is the same and the peak is
    lower, so the catalogue couples the two (the TP×PP layouts the auto-configurator sweeps) and the playbook offers
    the pair as one change, which the gate admits as one change of two groups."""
    r = _suite("nemotron4-340b-h100x256-nvidia")
    pb = PlaybookPolicy()
    ctx = _ctx(r)
    diag = pb.diagnosis(ctx)
    assert diag.bottleneck == "memory_capacity"
    assert r.catalogue.predicts_infeasible(r.with_knobs(pipeline_model_parallel_size=4))  # alone: out of memory
    ranked = pb.candidates(ctx, diag)
    changes = [c.change for c in ranked]
    assert {"pipeline_model_parallel_size": 4} not in changes
    pair = {"pipeline_model_parallel_size": 4, "tensor_model_parallel_size": 16}
    assert pair in changes
    share = pb._share(ctx, apply_change(r, pair))
    assert share is not None and share < pb._share(ctx, r)  # it frees memory
    verdict = evaluate(r, apply_change(r, pair), [r], parent=r)
    assert verdict.admitted and set(verdict.changed_groups) == {"pipeline", "tensor_parallel"}
    for c in ranked:  # no offered move adds memory to this memory-bound recipe unless its completion frees more
        if c.adds_memory:
            assert len(c.change) > 1 and pb._share(ctx, apply_change(r, c.change)) < pb._share(ctx, r)


def test_a_long_step_to_fewer_stages_is_offered_with_the_completion_that_makes_it_fit():
    """Llama 3 70B on 64 H200s without recompute, at PP 4: PP 1 alone is predicted out of memory, but with the
    distributed optimizer it fits, so the long step PP 4 → 1 is offered as one change (before, only the adjacent
    PP 2 was, and a run that took it stopped on a layout from which no single move gains min_gain). A step up along
    a knob (more micro-batch) is never completed this way: its completion would change the parallel layout."""
    r = _suite("llama3-70b-h200x64")
    best = r.with_knobs(**NO_RECOMPUTE)
    assert best.knob("pipeline_model_parallel_size") == 4
    assert best.catalogue.predicts_infeasible(best.with_knobs(pipeline_model_parallel_size=1))  # alone: OOM
    pb = PlaybookPolicy()
    ctx = _ctx(r, best)
    ranked = pb.candidates(ctx, pb.diagnosis(ctx))
    far = [c for c in ranked if c.knob == "pipeline_model_parallel_size" and c.value == 1]
    assert far and far[0].steps == 2, [(c.change, c.steps) for c in ranked]
    assert far[0].change["use_distributed_optimizer"] is True
    assert pb._share(ctx, apply_change(best, far[0].change)) <= pb.memory_margin
    assert evaluate(r, apply_change(best, far[0].change), [best], parent=best).admitted
    assert not any(c.knob == "micro_batch_size" and c.steps > 1 and len(c.change) > 1 for c in ranked)


def test_a_move_further_along_a_direction_that_lost_decisively_is_demoted():
    """nemotron4-340b at PP 8: PP 16 measured 30 % slower, so PP 32 (further the same way) is ranked as a long shot;
    PP 4 (the other way) is not touched, nor is anything before the loss was measured."""
    from attune.trial import TrialOutcome

    r = _suite("nemotron4-340b-h100x256-nvidia")
    assert r.knob("pipeline_model_parallel_size") == 8
    ctx = _ctx(r)
    pb = PlaybookPolicy()
    assert pb._further_than_a_loss(ctx, "pipeline_model_parallel_size", 32) is None  # nothing measured yet
    loss = TrialRecord(id=2, kind="candidate", change={"pipeline_model_parallel_size": 16},
                       knobs={**r.effective_knobs, "pipeline_model_parallel_size": 16}, outcome=TrialOutcome.SUCCEEDED,
                       measurement=ctx.best_measurement, gain=-0.30, charged_hours=1.0)
    after = PolicyContext(**{**ctx.__dict__, "records": (*ctx.records, loss)})
    why = pb._further_than_a_loss(after, "pipeline_model_parallel_size", 32)
    assert why is not None and "-30.0%" in why
    assert pb._further_than_a_loss(after, "pipeline_model_parallel_size", 4) is None  # the other way
    small = loss.model_copy(update={"gain": -0.01})  # within the noise: no evidence about the direction
    assert pb._further_than_a_loss(PolicyContext(**{**ctx.__dict__, "records": (*ctx.records, small)}),
                                   "pipeline_model_parallel_size", 32) is None
    up = {name: pb._score(c, pb.diagnosis(c), "pipeline_model_parallel_size", 32, "up", [])
          for name, c in (("before", ctx), ("after", after))}
    assert up["before"] is not None and up["after"] is not None
    assert up["after"].expected_gain == pytest.approx(up["before"].expected_gain * 0.2)
    assert any("goes further than pipeline_model_parallel_size=16" in n for n in up["after"].notes)


def test_among_completions_the_rules_score_alike_the_one_that_moves_least_is_chosen():
    """deepseek-v2-lite-h100x32 at PP 1, EP 4, micro-batch 8 without recompute: TP 2 -> 1 does not fit alone.
    Micro-batch 2 and 1 both make it fit and the rules score them alike; 2 is the smaller step from 8 and keeps more
    of the work unit (the noiseless simulator: 0.988 of the optimum against 0.961), so it is the completion offered."""
    r = _suite("deepseek-v2-lite-h100x32")
    best = r.with_knobs(pipeline_model_parallel_size=1, expert_model_parallel_size=4, micro_batch_size=8,
                        **NO_RECOMPUTE)
    ctx = _ctx(r, best)
    pb = PlaybookPolicy()
    shares = {m: pb._fit_share(ctx, {"tensor_model_parallel_size": 1, "micro_batch_size": m}) for m in (1, 2, 4)}
    assert shares[4] > 1.0 and shares[1] < shares[2] < 0.985  # 4 does not fit; 2 and 1 do
    done = pb._coupled_completion(ctx, "tensor_model_parallel_size", {"tensor_model_parallel_size": 1})
    assert done == {"tensor_model_parallel_size": 1, "micro_batch_size": 2}
