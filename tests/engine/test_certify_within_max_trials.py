"""`--max-trials` keeps the last two trials back for a certification pair once the search kept a change: a run that
spends its trials searching still certifies what it kept (seen: TRL tunes of 40 and 56 trials that certified
nothing)."""

from __future__ import annotations

from attune.engine.loop import TuneConfig, Tuner
from attune.policies import make_policy
from attune.testing.factories import tiny_recipe
from attune.testing.fakes import FakeBackend
from attune.trial import TrialKind


def landscape(recipe):
    return {"full": 1000.0, "selective": 1300.0, "none": 1200.0}[recipe.knob("activation_checkpointing")]


def _tune(tmp_path, max_trials: int, certify_share: float = 0.15):
    r = tiny_recipe(activation_checkpointing="full")
    cfg = TuneConfig.from_recipe(r, 50.0, search_space=("activation_checkpointing",), loss_check=False,
                                 max_trials=max_trials, certify_share=certify_share)
    backend = FakeBackend(speed=landscape, noise=0.01)
    return Tuner(r, backend=backend, policy=make_policy("playbook"), config=cfg,
                 run_dir=tmp_path / f"run-{max_trials}-{certify_share}").run()


def test_a_search_cut_by_max_trials_still_certifies_what_it_kept(tmp_path):
    state = _tune(tmp_path, max_trials=8)
    launched = [r for r in state.records if r.launched]
    certs = [r for r in launched if r.kind == TrialKind.CERTIFY]
    assert len(launched) <= 8 and state.best_record() is not None
    assert len(certs) >= 2 and len(certs) % 2 == 0, [(r.id, r.kind, r.change) for r in launched]
    cert = state.certified()
    expected = landscape(state.best_recipe()) / 1000.0  # what the search kept before its trials ran out
    assert cert is not None and cert.pairs == len(certs) // 2 and abs(cert.speedup - expected) < 0.05 and cert.shown
    assert "kept back to certify the best" in str(state.finished)


def test_without_certification_every_trial_goes_to_the_search(tmp_path):
    state = _tune(tmp_path, max_trials=8, certify_share=0.0)
    launched = [r for r in state.records if r.launched]
    assert len(launched) == 8 and not [r for r in launched if r.kind == TrialKind.CERTIFY]
    assert str(state.finished) == "reached max_trials (8)"
