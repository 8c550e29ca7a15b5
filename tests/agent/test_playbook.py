"""Playbook contract tests on FakeBackend: never repeats, only admissible, stops with a reason, vetoes early stops."""

from __future__ import annotations

from attune.engine.loop import TuneConfig, Tuner
from attune.engine.policy import Stop
from attune.policies.playbook import PlaybookPolicy
from attune.recipe.change import Change, apply_change, signature
from attune.testing.factories import tiny_recipe
from attune.testing.fakes import FakeBackend
from attune.trial import TrialOutcome, TrialRecord
from tests.agent.helpers import baseline_record, context, measurement, megatron_recipe


def _run(tmp_path, policy, recipe=None, backend=None, **cfg):
    recipe = recipe or tiny_recipe()
    config = TuneConfig.from_recipe(recipe, 10.0, **cfg)
    return Tuner(recipe, backend=backend or FakeBackend(), policy=policy, config=config, run_dir=tmp_path).run()


def test_playbook_run_never_repeats_only_admissible_and_stops_with_reason(tmp_path):
    state = _run(tmp_path, PlaybookPolicy())
    cands = [r for r in state.records if r.kind == "candidate"]
    assert cands, "the playbook proposed nothing"
    assert len({r.signature for r in cands}) == len(cands)
    assert not [r for r in state.records if r.outcome is TrialOutcome.REFUSED]
    assert all(r.source == "playbook" and "diagnosis" in r.rationale for r in cands)
    assert state.finished.startswith("policy stopped: ") and len(state.finished) > 30
    # it found the fake landscape's optimum: 2 processes, micro-batch 4
    best = state.best_record()
    assert best.knobs["nproc_per_node"] == 2 and best.knobs["micro_batch_size"] == 4


def test_every_proposal_is_admissible_and_moves_one_group():
    r = tiny_recipe()
    ctx = context(r, [baseline_record(r)])
    ch = PlaybookPolicy().propose(ctx)
    assert isinstance(ch, Change) and ctx.admissible(ch.set)
    assert len({r.catalogue[k].coupling_group for k in ch.set}) == 1  # a bundle stays inside one coupling group
    for knob, value in ch.set.items():
        assert value in r.catalogue[knob].neighbours(r.knob(knob))


def test_orders_by_expected_gain_per_hour_and_cheap_before_compile():
    r = tiny_recipe(activation_checkpointing="full")
    pb = PlaybookPolicy()
    ctx = context(r, [baseline_record(r)])
    ranked = pb.candidates(ctx, pb.diagnosis(ctx))
    top = [c.knob for c in ranked[:4]]
    assert "activation_checkpointing" in top and "nproc_per_node" in top  # the two big priors lead
    assert ranked[0].expected_gain == max(c.expected_gain for c in ranked if c.cost == 1)
    fresh = [c for c in ranked if c.expected_gain >= pb.min_expected_gain and not c.stepped and c.tier >= 0]
    rates = [round(c.gain_per_hour, 6) for c in fresh]
    assert rates == sorted(rates, reverse=True)
    names = [c.knob for c in ranked]
    assert names.index("nproc_per_node") < names.index("compile_mode")


def test_oom_diagnosis_guards_memory_hungry_moves():
    r = tiny_recipe(micro_batch_size=2)
    oom = TrialRecord(id=1, kind="baseline", knobs=r.effective_knobs, signature=signature(r), outcome=TrialOutcome.OOM)
    pb = PlaybookPolicy()
    ctx = context(r, [oom])
    assert pb.diagnosis(ctx).bottleneck == "memory_capacity"
    ranked = pb.candidates(ctx, pb.diagnosis(ctx))
    assert not [c for c in ranked if c.knob == "micro_batch_size" and c.direction == "up"]
    assert ranked[0].direction in ("down", "up") and ranked[0].tier == 0  # a fit move comes first


def test_stops_when_nothing_is_left():
    r = tiny_recipe()
    r = r.model_copy(update={"tuning": r.tuning.model_copy(update={"search_space": ("dataloader_workers",)})})
    recs = [baseline_record(r)]
    for i, v in enumerate((1,), start=2):
        c = r.with_knobs(dataloader_workers=v)
        recs.append(TrialRecord(id=i, kind="candidate", change={"dataloader_workers": v}, knobs=c.effective_knobs,
                                signature=signature(c), outcome=TrialOutcome.SUCCEEDED, measurement=measurement(),
                                gain=0.0))
    out = PlaybookPolicy(stop_early=True).propose(context(r, recs))
    assert isinstance(out, Stop) and ("no admissible" in out.reason or "no move is expected" in out.reason)
    # with budget left and stop_early off, it goes on past the adjacent moves (a value further along)
    more = PlaybookPolicy().propose(context(r, recs))
    assert isinstance(more, Change) and more.set["dataloader_workers"] not in (0, 1)
    # and stops once every value was measured
    rest = [v for v in r.catalogue["dataloader_workers"].values if v not in (0, 1)]
    for i, v in enumerate(rest, start=10):
        c = r.with_knobs(dataloader_workers=v)
        recs.append(TrialRecord(id=i, kind="candidate", change={"dataloader_workers": v}, knobs=c.effective_knobs,
                                signature=signature(c), outcome=TrialOutcome.SUCCEEDED, measurement=measurement(),
                                gain=0.0))
    last = PlaybookPolicy().propose(context(r, recs))
    assert isinstance(last, Stop) and "every admissible move has been tried" in last.reason


def test_with_budget_left_a_move_predicted_below_the_bar_is_still_tried_and_says_so():
    """stop_early off: the run does not end while an admissible move is untried, however small its prediction."""
    r = tiny_recipe()
    r = r.model_copy(update={"tuning": r.tuning.model_copy(update={"search_space": ("dataloader_workers",)})})
    pb = PlaybookPolicy(min_expected_gain=10.0)  # no move can be expected to gain 1000 %
    out = pb.propose(context(r, [baseline_record(r)]))
    assert isinstance(out, Change) and "budget left" in out.rationale, out
    assert isinstance(PlaybookPolicy(min_expected_gain=10.0, stop_early=True).propose(
        context(r, [baseline_record(r)])), Stop)


def _rejected(r, rid, change):
    c = apply_change(r, change)
    return TrialRecord(id=rid, kind="candidate", change=change, knobs=c.effective_knobs, signature=signature(c),
                       outcome=TrialOutcome.SUCCEEDED, measurement=measurement(), gain=-0.01,
                       decision="rejected: -1.0% does not clear the noise floor 2.0%")


def test_premature_stop_is_vetoed_while_high_value_moves_remain():
    r = tiny_recipe()
    recs = [baseline_record(r)] + [_rejected(r, i, ch) for i, ch in enumerate(
        ({"ddp_bucket_cap_mb": 10}, {"ddp_bucket_cap_mb": 50}, {"dataloader_workers": 1}, {"intra_op_threads": 1}),
        start=2)]
    pb = PlaybookPolicy(patience=4)
    out = pb.propose(context(r, recs))
    assert isinstance(out, Change) and out.rationale.startswith("stop vetoed")
    assert out.set.get("nproc_per_node") == 2  # alone, or bundled with the micro-batch of its group
    # with the high-value moves exhausted, the stop stands
    more = recs + [_rejected(r, 10, {"nproc_per_node": 2}), _rejected(r, 11, {"micro_batch_size": 2}),
                   _rejected(r, 12, {"compile_mode": "default"})]
    out2 = PlaybookPolicy(patience=4, high_value_gain=0.2, stop_early=True).propose(context(r, more))
    assert isinstance(out2, Stop) and "no untried high-value move" in out2.reason
    # without stop_early the budget is not left unspent: the next best move is proposed, and says why
    out3 = PlaybookPolicy(patience=4, high_value_gain=0.2).propose(context(r, more))
    assert isinstance(out3, Change) and "budget left" in out3.rationale
    # an external stop (e.g. the LLM's) is vetoed the same way
    assert pb.veto_change(context(r, recs), "llm said stop").set.get("nproc_per_node") == 2


def test_megatron_catalogue_memory_and_comm():
    r = megatron_recipe()
    pb = PlaybookPolicy()
    comm = baseline_record(r, measurement(1.0, {"compute": 0.5, "dp_exposed": 0.4, "host": 0.02}))
    ctx = context(r, [comm])
    ch = pb.propose(ctx)
    assert isinstance(ch, Change) and ctx.admissible(ch.set)
    ranked = pb.candidates(ctx, pb.diagnosis(ctx))
    assert "overlap_grad_reduce" in [c.knob for c in ranked[:6]]
    oom = TrialRecord(id=1, kind="baseline", knobs=r.effective_knobs, signature=signature(r), outcome=TrialOutcome.OOM)
    ctx2 = context(r, [oom])
    first = pb.propose(ctx2)
    assert isinstance(first, Change)
    knob = next(iter(first.set))
    assert knob in ("tensor_model_parallel_size", "pipeline_model_parallel_size", "recompute_granularity",
                    "use_distributed_optimizer", "context_parallel_size", "sequence_parallel", "expert_model_parallel_size")


def test_megatron_coupled_completion_is_admissible():
    r = megatron_recipe(tensor_model_parallel_size=2, sequence_parallel=True)
    pb = PlaybookPolicy()
    ctx = context(r, [baseline_record(r, measurement(1.0, {"compute": 0.5, "tp_comm": 0.4}))])
    ranked = pb.candidates(ctx, pb.diagnosis(ctx))
    overlap = [c for c in ranked if c.knob == "tp_comm_overlap"]
    assert overlap and overlap[0].change.get("env.CUDA_DEVICE_MAX_CONNECTIONS") == "1"
    assert all(ctx.admissible(c.change) for c in ranked)


def test_steps_past_an_inconclusive_neighbour():
    r = tiny_recipe()
    inconclusive = _rejected(r, 2, {"micro_batch_size": 2})  # -1 %: within the noise floor
    ranked = PlaybookPolicy().candidates(context(r, [baseline_record(r), inconclusive]),
                                         PlaybookPolicy().diagnosis(context(r, [baseline_record(r)])))
    past = [c for c in ranked if c.knob == "micro_batch_size"]
    assert past and past[0].value == 4 and "stepping past inconclusive" in " ".join(past[0].notes)
