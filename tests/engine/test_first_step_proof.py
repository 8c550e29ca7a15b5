"""The run loop's loss check proves its references by their first logged loss (fakes: pure and fast; the real
processes are in tests/gate/test_first_step_hazards.py).

- a drift reference whose first step is not the baseline's is set aside, and the baseline once more measures drift;
- a candidate whose first step is not the baseline's is refused as another random stream, whatever its band says;
- a baseline that does not repeat its own first step allows no loss check at all;
- an owner's ``numerics_opt_in: [random_stream]`` admits such a change, and the decision says so.
"""

from __future__ import annotations

from attune.engine.loop import RunState, TuneConfig, Tuner, first_step_bound
from attune.policies.coordinate import CoordinateDescent
from attune.recipe.model import Recipe
from attune.testing.factories import tiny_recipe_dict
from attune.testing.fakes import FakeBackend

SPACE = ("micro_batch_size",)


class Shifted(FakeBackend):
    """A fake whose runs with another micro-batch size than 1 draw "other samples": their whole curve, first step
    included, moves by ``shift`` per step; ``twin_shift`` moves every other run of the baseline itself."""

    def __init__(self, shift: float = 0.02, twin_shift: float = 0.0) -> None:
        super().__init__()
        self.shift, self.twin_shift, self.baseline_runs = shift, twin_shift, 0

    def run(self, recipe, request):
        res = super().run(recipe, request)
        if res.measurement is None:
            return res
        delta = 0.0
        if recipe.knob("micro_batch_size") != 1:
            delta = self.shift
        elif recipe.knob("nproc_per_node") == 1 and recipe.knob("activation_checkpointing") == "full":
            self.baseline_runs += 1
            delta = self.twin_shift if self.baseline_runs % 2 == 0 else 0.0
        losses = [x + delta * (1 + 0.5 * i) for i, x in enumerate(res.measurement.losses)]
        return type(res)(**{**res.__dict__, "measurement": res.measurement.model_copy(update={"losses": losses})})


def run(tmp_path, backend, **training):
    data = tiny_recipe_dict(micro_batch_size=1, activation_checkpointing="full")
    data["training"].update(training)
    recipe = Recipe.model_validate(data)
    cfg = TuneConfig.from_recipe(recipe, 3.0, search_space=SPACE)
    return Tuner(recipe, backend=backend, policy=CoordinateDescent(), config=cfg, run_dir=tmp_path / "run").run()


def checks(state: RunState):
    return [r for r in state.records if r.kind == "loss_check"]


def test_a_reference_that_draws_other_samples_is_set_aside_and_the_candidate_refused(tmp_path):
    state = run(tmp_path, Shifted())
    found = checks(state)
    assert found, [r.decision for r in state.records]
    first = found[0]
    assert not first.accepted
    assert "draws another random stream or other samples" in first.decision
    assert "first logged loss, before any update, differs" in first.decision
    assert "numerics_opt_in: [random_stream]" in first.decision
    # its calibration layout (another micro-batch size) was set aside: the baseline's two runs measure drift alone
    calibrations = [r for r in state.records if r.kind == "calibration"]
    assert calibrations[0].change
    assert first.loss_check["first_step"]["set_aside"][0].startswith(f"calibration run {calibrations[0].id} ")
    assert state.best_recipe().knob("micro_batch_size") == 1


def test_without_the_shift_the_same_change_is_kept(tmp_path):
    state = run(tmp_path, Shifted(shift=0.0))
    kept = [r for r in checks(state) if r.accepted]
    assert kept and kept[0].loss_check["first_step"]["set_aside"] == []
    assert state.best_recipe().knob("micro_batch_size") != 1


def test_a_baseline_that_does_not_repeat_its_first_step_allows_no_loss_check(tmp_path):
    state = run(tmp_path, Shifted(shift=0.0, twin_shift=0.05))
    found = checks(state)
    assert found and not any(r.accepted for r in found)
    assert "the baseline's own runs differ at their first step" in found[0].decision


def test_an_owner_opt_in_admits_another_random_stream_and_the_decision_says_so(tmp_path):
    state = run(tmp_path, Shifted(), numerics_opt_in=["random_stream"])
    kept = [r for r in checks(state) if r.accepted]
    assert kept, [r.decision for r in checks(state)]
    assert "opts in to random_stream" in kept[0].decision
    assert kept[0].loss_check["first_step"]["opt_in"] == "random_stream"


def test_the_bound_grows_with_the_tokens_and_the_precision_and_covers_the_print_resolution(tmp_path):
    state = run(tmp_path, Shifted(shift=0.0))
    bound = first_step_bound(state)
    assert bound.n_terms > 1 and bound.precision == "fp32"
    assert bound.at(4.0) < bound.model_copy(update={"n_terms": bound.n_terms * 4}).at(4.0)
    assert bound.at(4.0) < bound.model_copy(update={"precision": "bf16"}).at(4.0)
    assert bound.model_copy(update={"resolution": 5e-5}).at(4.0) >= 1e-4
    assert bound.at(4.0, step=3) == 2 * bound.at(4.0, step=0)


def test_the_progress_line_prints_the_opt_in_hint_as_written(tmp_path, capsys):
    """The refusal names ``numerics_opt_in: [random_stream]``; the terminal's progress line must not read the
    bracket as rich markup and drop it (seen on a nanoGPT tune: the line ended at "numerics_opt_in:")."""
    from attune import cli
    from attune.engine.journal import Event

    state = run(tmp_path, Shifted())
    refused = next(r for r in checks(state) if not r.accepted)
    progress = cli.Progress(3.0, live=False)
    progress(Event.TRIAL_FINISHED, {"record": refused, "state": state})
    out = " ".join(capsys.readouterr().out.split())
    assert "numerics_opt_in: [random_stream]" in out
