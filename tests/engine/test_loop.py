from __future__ import annotations

import json

import pytest

from attune.engine.loop import RunState, TuneConfig, Tuner, next_action
from attune.policies.coordinate import CoordinateDescent
from attune.policies.random import RandomSearch
from attune.recipe.change import signature
from attune.report import write_outputs
from attune.testing.factories import tiny_recipe
from attune.testing.fakes import FakeBackend
from attune.trial import TrialOutcome

SPACE = ("nproc_per_node", "micro_batch_size", "activation_checkpointing")


def make(tmp_path, budget=1.0, backend=None, policy=None, **kw):
    recipe = tiny_recipe(micro_batch_size=1, activation_checkpointing="full")
    cfg = TuneConfig.from_recipe(recipe, budget, search_space=SPACE, **kw)
    return Tuner(recipe, backend=backend or FakeBackend(), policy=policy or CoordinateDescent(), config=cfg,
                 run_dir=tmp_path / "run")


class Drifting(FakeBackend):
    """A fake whose runs with ``knob`` at 2 train differently: their losses drift away step by step."""

    def __init__(self, knob: str) -> None:
        super().__init__()
        self.knob = knob

    def run(self, recipe, request):
        res = super().run(recipe, request)
        if recipe.knob(self.knob) == 2 and res.measurement:
            losses = [x + 1e-3 * (i + 1) for i, x in enumerate(res.measurement.losses)]
            res = type(res)(**{**res.__dict__, "measurement": res.measurement.model_copy(update={"losses": losses})})
        return res


def test_coordinate_descent_improves_and_stops(tmp_path):
    tuner = make(tmp_path, budget=2.0)
    state = tuner.run()
    best = state.best_recipe()
    assert best.knob("nproc_per_node") == 2
    assert best.knob("activation_checkpointing") != "full", "less recompute is faster here"
    assert state.best_throughput() > 2.0 * state.baseline_throughput()
    assert state.finished.startswith("policy stopped")
    # then the final best was certified against the baseline, in interleaved pairs, within the budget
    certify = [r for r in state.records if r.kind == "certify"]
    assert certify and [r.signature for r in certify[:2]] == [signature(state.baseline), signature(best)]
    assert state.certified() is not None and state.certified().low > 1.0
    assert state.records[-1].kind == "certify" and state.budget().used <= 2.0 + 1e-9
    # every launched configuration is distinct except baselines and confirmations
    sigs = [r.signature for r in state.records if r.kind == "candidate" and r.outcome is not TrialOutcome.REFUSED]
    assert len(sigs) == len(set(sigs))


def test_baseline_repeats_and_confirmation(tmp_path):
    state = make(tmp_path).run()
    kinds = [r.kind for r in state.records]
    assert kinds[:2] == ["baseline", "baseline"]
    for rec in state.records:
        if rec.accepted:
            prev = [r.kind for r in state.records if r.signature == rec.signature and r.id < rec.id]
            if "loss_equivalence" in rec.verdict["owed"]:
                # numerics-drift changes are confirmed by a re-run, then checked for loss equivalence
                assert rec.kind == "loss_check" and rec.loss_check["passed"]
                # the decision that sent it to the check is stated with its interval: the paired one, or a first run
                # decisive on its own
                assert rec.decision.startswith(("accepted: paired +", "accepted: on its first run, decisively: +")) \
                    and " ± " in rec.decision, rec.decision
                assert prev[0] == "candidate" and set(prev[1:]) <= {"confirm", "decision"}
                assert len(prev) > 1 or "decisively" in rec.decision
            else:  # preserving changes (checkpointing) owe no loss check: kept on their pair (a look on the runs
                # made, or the candidate's own run), or decisively at once
                assert (rec.kind in ("confirm", "decision") and prev[0] == "candidate"
                        and set(prev[1:]) <= {"confirm", "decision"}) or (
                    rec.kind == "candidate" and not prev and "decisively" in rec.decision), rec.decision
    # the loss check measured rounding drift once, on an equivalent layout of the baseline
    assert sum(r.kind == "calibration" for r in state.records) == 1


def test_loss_check_rejects_a_faster_change_whose_losses_differ(tmp_path):
    state = make(tmp_path, backend=Drifting("nproc_per_node")).run()
    failed = [r for r in state.records if r.kind == "loss_check" and not r.accepted]
    assert failed and failed[0].change == {"nproc_per_node": 2}
    assert "loss-equivalence check failed" in failed[0].decision
    assert state.best_recipe().knob("nproc_per_node") == 1


def test_the_drift_reference_is_never_the_candidate_it_judges(tmp_path):
    """The baseline's neighbouring micro-batch split is both the usual calibration layout and the first candidate
    (1 → 2). Measured as its own drift reference, a candidate's difference from the baseline would set the very
    tolerance it is judged by, and the check could not fail; the calibration runs another split instead, and a
    candidate whose losses really move is rejected."""
    tuner = make(tmp_path, budget=5.0, backend=Drifting("micro_batch_size"))
    tuner.state.config = TuneConfig.from_recipe(tuner.state.baseline, 5.0, search_space=("micro_batch_size",))
    state = tuner.run()
    checks = [r for r in state.records if r.kind == "loss_check"]
    calibrations = [r for r in state.records if r.kind == "calibration"]
    assert checks and calibrations
    assert all(c.signature != k.signature for c in calibrations for k in checks)
    first = next(k for k in checks if k.change == {"micro_batch_size": 2})
    assert not first.accepted and "loss-equivalence check failed" in first.decision, first.decision
    assert calibrations[0].change != {"micro_batch_size": 2}


def test_budget_is_charged_for_failures_and_stops_the_run(tmp_path):
    backend = FakeBackend(wall_s=600.0)  # 2 devices × 10 min = 1/3 h per trial
    state = make(tmp_path, budget=2.0, backend=backend).run()
    used = state.budget().used
    assert used <= 2.0 + 1e-9
    assert "spent" in state.finished  # "budget spent", or too little left for a candidate and its confirmation
    assert used == pytest.approx(sum(r.charged_hours for r in state.records))
    assert len(backend.launches) == sum(1 for r in state.records if r.launched)


def test_oom_trial_is_charged_and_rejected(tmp_path):
    tuner = make(tmp_path, budget=5.0)
    tuner.state.config = TuneConfig.from_recipe(tuner.state.baseline, 5.0, search_space=("micro_batch_size",),
                                                baseline_repeats=1, confirm=False, min_gain=0.0)
    state = tuner.run()
    ooms = [r for r in state.records if r.outcome is TrialOutcome.OOM]
    assert ooms and all(r.charged_hours > 0 and not r.accepted for r in ooms)


def test_refused_change_costs_nothing(tmp_path):
    from attune.gate import evaluate

    refused_calls = []

    def strict_gate(baseline, candidate, history, parent=None):
        v = evaluate(baseline, candidate, history, parent=parent)
        return v

    class Sneaky(CoordinateDescent):
        name = "sneaky"

        def propose(self, ctx):
            from attune.recipe.change import Change

            refused_calls.append(1)
            if len(refused_calls) == 1:  # first proposal: a knob that does not exist
                return Change(set={"global_batch_size": 4})
            return super().propose(ctx)

    tuner = make(tmp_path, policy=Sneaky())
    tuner.gate = strict_gate
    state = tuner.run()
    refused = [r for r in state.records if r.outcome is TrialOutcome.REFUSED]
    assert len(refused) == 1 and refused[0].charged_hours == 0
    assert len(tuner.backend.launches) == sum(1 for r in state.records if r.launched)


class Crash(Exception):
    pass


class CrashingBackend(FakeBackend):
    def __init__(self, crash_at: int, noise: float = 0.01):
        super().__init__(noise=noise)
        self.crash_at = crash_at

    def run(self, recipe, request):
        if request.trial_id == self.crash_at:
            request.trial_dir.mkdir(parents=True, exist_ok=True)
            (request.trial_dir / "rank0.jsonl").write_text("{}\n")
            raise Crash()
        return super().run(recipe, request)


@pytest.mark.parametrize("policy_factory", [CoordinateDescent, lambda: RandomSearch(seed=3)])
def test_resume_after_kill_does_not_rerun_or_recharge(tmp_path, policy_factory):
    # a noise-free machine: the fake draws its noise per trial id, and an interrupted trial shifts every later id, so
    # only without noise is "ends where an uninterrupted run ends" a property of the engine rather than of the draws
    reference = make(tmp_path / "ref", backend=FakeBackend(noise=0.0), policy=policy_factory()).run()

    crashing = CrashingBackend(crash_at=6, noise=0.0)
    with pytest.raises(Crash):
        make(tmp_path, backend=crashing, policy=policy_factory()).run()
    launched_before = len(crashing.launches)
    journal = [json.loads(line) for line in (tmp_path / "run" / "journal.jsonl").read_text().splitlines()]
    finished_before = [e["record"] for e in journal if e["event"] == "trial_finished"]
    charged_before = sum(r["charged_hours"] for r in finished_before)

    backend = FakeBackend(noise=0.0)
    resumed = Tuner.resume(tmp_path / "run", backend=backend, policy=policy_factory()).run()
    ids = [r.id for r in resumed.records]
    assert ids == sorted(set(ids))
    interrupted = [r for r in resumed.records if r.outcome is TrialOutcome.INTERRUPTED]
    assert [r.id for r in interrupted] == [6]
    # finished trials were neither re-run nor re-charged
    for old in finished_before:
        rec = next(r for r in resumed.records if r.id == old["id"])
        assert rec.charged_hours == old["charged_hours"]
    assert launched_before == 4 and [e["kind"] for e in finished_before][-1] == "decision"  # a look: no launch
    assert resumed.budget().used == pytest.approx(charged_before + sum(r.charged_hours for r in resumed.records
                                                                      if r.id >= 6))
    # the resumed run ends where an uninterrupted one ends
    assert signature(resumed.best_recipe()) == signature(reference.best_recipe())


def test_next_action_is_pure_and_level_triggered(tmp_path):
    recipe = tiny_recipe()
    st = RunState(baseline=recipe, config=TuneConfig.from_recipe(recipe, 1.0))
    assert next_action(st).kind == "baseline"
    st.finished = "done"
    assert next_action(st).kind == "finish"


def test_outputs_are_written(tmp_path):
    tuner = make(tmp_path)
    state = tuner.run()
    paths = write_outputs(state, tmp_path / "run")
    result = json.loads(paths["result"].read_text())
    assert result["speedup"] > 1.5
    assert all(t["verdict"] is not None and "charged_hours" in t and "noise_cv" in t for t in result["trials"])
    assert paths["plot"].stat().st_size > 1000
    from attune.recipe.io import load_recipe

    best = load_recipe(paths["best_recipe"])
    assert best.training == tuner.state.baseline.training


def test_no_trial_is_launched_that_the_budget_cannot_pay_for(tmp_path):
    """A backend that can estimate a trial's cost (the simulator) launches nothing under a tiny budget."""
    from attune.backends.simulated import SimBackend
    from attune.bench.suite import load_suite
    from attune.policies import make_policy

    recipe = load_suite("suite")[0].recipe
    cfg = TuneConfig.from_recipe(recipe, 0.0001)
    state = Tuner(recipe, backend=SimBackend(), policy=make_policy("coordinate"), config=cfg,
                  run_dir=tmp_path / "r").run()
    assert not [r for r in state.records if r.launched]
    assert state.budget().used == 0 and "cannot pay for one trial" in state.finished


def test_a_winner_found_late_is_still_confirmed(tmp_path):
    """The confirmation run is reserved when its candidate launches, so a late win is settled, not left pending."""
    backend = FakeBackend(wall_s=600.0)  # 1/3 h per trial on 2 devices
    state = make(tmp_path, budget=1.5, backend=backend).run()
    pending = [r for r in state.records if r.decision == "pending confirmation re-run"]
    confirmed = {r.signature for r in state.records if r.kind == "confirm"}
    assert all(r.signature in confirmed for r in pending)
    assert state.budget().used <= 1.5 + 1e-9


def test_no_calibration_is_launched_in_a_layout_the_memory_model_says_cannot_run(tmp_path):
    """Mixtral 8x22B on 256 H100s at micro-batch 1: the neighbouring split (micro-batch 2) is predicted out of
    memory, so it is no drift reference; the baseline's own two runs are, and no calibration run fails with an OOM
    (before, every run whose change owed a loss check spent one trial on it)."""
    from attune.backends.simulated import SimBackend
    from attune.bench.suite import load_suite
    from attune.engine.loop import needs_calibration
    from attune.gate import equivalent_layout
    from attune.policies import make_policy

    r = load_suite("suite", only=["mixtral-8x22b-h100x256"])[0].recipe
    assert r.catalogue.predicts_infeasible(r.with_knobs(micro_batch_size=2))
    assert equivalent_layout(r) is None
    config = TuneConfig.from_recipe(r, 40 * 11.5, max_trials=12)
    state = Tuner(r, backend=SimBackend(seed=0, write_files=False), policy=make_policy("playbook"), config=config,
                  run_dir=tmp_path / "run").run()
    assert not [x for x in state.records if x.kind == "calibration"], [(x.kind, x.change) for x in state.records]
    checks = [x for x in state.records if x.kind == "loss_check"]
    assert checks, "a change that reorders sums was judged"
    assert all("no drift reference" not in (x.decision or "") for x in checks)
    assert not needs_calibration(state, checks[0].signature)


def test_without_a_lead_a_decisively_faster_change_that_owes_a_loss_check_is_kept_after_its_reference_run(tmp_path):
    """A candidate rejected on its first run ends the chain of the best's runs, so the next one has no lead: its
    first run cannot be judged on its own (two baseline runs give the noise one degree of freedom), but the reference
    run of the best that follows gives a second, and against three runs of the best its one run is decisively
    faster (its lower end at 0.1 % above 3 × min_gain). The change reorders sums, so its loss check keeps it: no
    confirm run is spent on a decision already made."""
    from attune.policies import make_policy

    script = iter([1000.0, 1010.0, 900.0, 2000.0, 1005.0])

    def speed(recipe):
        return next(script, 1000.0)

    r = tiny_recipe()
    cfg = TuneConfig.from_recipe(r, 500.0, search_space=("micro_batch_size", "nproc_per_node"), paired=True,
                                 max_trials=8, certify_share=0)
    state = Tuner(r, backend=FakeBackend(speed=speed, noise=0.005), policy=make_policy("coordinate"), config=cfg,
                  run_dir=tmp_path / "run").run()
    assert "not worth a paired re-measurement" in state.records[2].decision  # the chain of the best's runs ends
    assert [x.kind for x in state.records[3:5]] == ["candidate", "reference"]
    assert state.records[4].decision == "reference run of the best, between the candidate's two runs"
    kept = next(x for x in state.records if x.accepted)
    assert kept.kind == "loss_check" and kept.loss_check["passed"] and kept.change == {"nproc_per_node": 2}
    assert "on its first run, decisively" in kept.decision and "against 3 run(s) of the best" in kept.decision, \
        kept.decision
    assert [x.kind for x in state.records if x.signature == kept.signature and x.id < kept.id] == ["candidate"]


def test_a_faster_change_that_owes_a_loss_check_is_kept_after_its_reference_run_without_a_confirm(tmp_path):
    """DeepSeek-V2-Lite on 32 H100s: micro-batch 1 → 8 doubles throughput. Its first run follows the baseline's
    second run (its lead), and the reference run of the best after it completes an A-B-A look: a zero-cost
    ``decision`` record shows the gain paired and sends it to its loss check (a record that costs nothing), which
    keeps it. No confirm run is spent on a decision already made: three runs to the decision, not four."""
    from attune.backends.simulated import SimBackend
    from attune.bench.suite import load_suite
    from attune.policies import make_policy

    r = load_suite("suite", only=["deepseek-v2-lite-h100x32"])[0].recipe
    config = TuneConfig.from_recipe(r, 40 * 11.5, max_trials=6)
    state = Tuner(r, backend=SimBackend(seed=0, write_files=False), policy=make_policy("playbook"), config=config,
                  run_dir=tmp_path / "run").run()
    kept = next(x for x in state.records if x.accepted)
    assert kept.kind == "loss_check" and kept.loss_check["passed"]
    assert "paired +" in kept.decision and "over 1 candidate and 2 interleaved runs" in kept.decision, kept.decision
    runs = [x.kind for x in state.records if x.signature == kept.signature and x.id < kept.id]
    assert runs == ["candidate", "decision"], runs  # no confirm run
    between = [x.kind for x in state.records if x.id < kept.id]
    assert between[:5] == ["baseline", "baseline", "candidate", "reference", "decision"], between
    assert kept.change == {"micro_batch_size": 8}
