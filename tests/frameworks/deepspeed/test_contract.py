"""The gate on native DeepSpeed recipes: contract keys in DeepSpeed's own names are refused (by evaluate and by
`attune gate check --set`), every other key is frozen, and unclassified settings move only when explored."""

from __future__ import annotations

import json

import pytest
import yaml
from typer.testing import CliRunner

from attune.cli import _mount_optional, app
from attune.gate import apply_sets, evaluate
from attune.gate.verdict import LOSS_EQUIVALENCE, ReasonCode
from attune.recipe.catalogue import Semantics
from attune.recipe.io import parse_recipe, recipe_to_dict
from tests.frameworks.deepspeed.helpers import POOR_CONFIG, hf_recipe, poor, with_argv, with_config


def sets(r, *assignments):
    return apply_sets(r.model_dump(mode="python"), list(assignments))


@pytest.mark.parametrize("assignment,field", [
    ("train_batch_size=64", "deepspeed.train_batch_size"),
    ("optimizer.params.lr=1e-3", "deepspeed.config.optimizer.params.lr"),
    ("optimizer.type=SGD", "deepspeed.config.optimizer.type"),
    ("scheduler.params.warmup_num_steps=10", "deepspeed.config.scheduler.params.warmup_num_steps"),
    ("gradient_clipping=0.5", "deepspeed.config.gradient_clipping"),
    ("bf16.enabled=true", "deepspeed.config.bf16.enabled"),
])
def test_contract_keys_in_deepspeeds_names_are_refused(tmp_path, assignment, field):
    base = poor(tmp_path)
    v = evaluate(base, sets(base, assignment))
    assert not v.admitted and v.semantics is Semantics.CONTRACT
    reason = next(r for r in v.reasons if r.field == field)
    assert reason.code == ReasonCode.CONTRACT and "training contract" in reason.message and "restore it" in reason.message


def test_gate_check_cli_refuses_train_batch_size(tmp_path):
    base = poor(tmp_path)
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe_to_dict(base), sort_keys=False))
    _mount_optional()
    res = CliRunner().invoke(app, ["gate", "check", str(path), "--set", "train_batch_size=64", "--json"])
    assert res.exit_code == 1, res.output
    verdict = json.loads(res.output)
    assert not verdict["admitted"] and "deepspeed.train_batch_size" in {r["field"] for r in verdict["reasons"]}
    res = CliRunner().invoke(app, ["gate", "check", str(path), "--set", "zero_optimization.stage=1"])
    assert res.exit_code == 0, res.output
    assert "ADMITTED" in res.output and "loss_equivalence" in res.output


def test_set_native_edits_the_config_file_and_flags(tmp_path):
    base = poor(tmp_path)
    data = sets(base, "optimizer.params.lr=0.001")
    assert json.loads(data["launch"]["files"]["ds_config.json"])["optimizer"]["params"]["lr"] == 0.001
    assert data["knobs"] == base.knobs
    data = sets(base, "zero_optimization.stage=2")  # a knob, not a native edit
    assert data["knobs"]["zero_optimization.stage"] == 2 and data["launch"] == base.model_dump()["launch"]


def test_every_other_key_is_frozen(tmp_path):
    base = poor(tmp_path)
    v = evaluate(base, with_config(base, POOR_CONFIG.replace('"steps_per_print": 100', '"steps_per_print": 10')))
    reason = next(r for r in v.reasons if r.field == "deepspeed.config.steps_per_print")
    assert not v.admitted and "frozen" in reason.message
    added = POOR_CONFIG.replace('"wall_clock_breakdown": false', '"wall_clock_breakdown": false, "dump_state": true')
    v = evaluate(base, with_config(base, added))
    assert not v.admitted and "deepspeed.config_keys" in {r.field for r in v.reasons}


def test_a_knob_key_edited_in_the_file_is_no_knob_change(tmp_path):
    base = poor(tmp_path)  # the file says stage 3, the knob says 3: editing the file does not move the knob
    v = evaluate(base, with_config(base, POOR_CONFIG.replace('"stage": 3', '"stage": 2')))
    assert v.admitted and not v.changed_knobs


def test_launch_edits_are_frozen(tmp_path):
    base = poor(tmp_path)
    v = evaluate(base, with_argv(base, [*base.launch.argv, "--seed", "7"]))
    assert not v.admitted and "launch.options" in {r.field for r in v.reasons}
    seeded = parse_recipe(with_argv(base, [*base.launch.argv, "--seed", "7"]))
    v = evaluate(seeded, with_argv(seeded, [*base.launch.argv, "--seed", "8"]))
    reason = next(r for r in v.reasons if r.field == "launch.args.seed")
    assert reason.code == ReasonCode.CONTRACT and not v.admitted
    v = evaluate(seeded, sets(seeded, "seed=9"))  # --set seed=9 edits the script's own flag
    assert not v.admitted and "launch.args.seed" in {r.field for r in v.reasons}


def test_micro_batch_and_processes_keep_train_batch_size(tmp_path):
    base = poor(tmp_path)
    v = evaluate(base, base.with_knobs(train_micro_batch_size_per_gpu=8))
    assert v.admitted and v.owed == [LOSS_EQUIVALENCE] and v.semantics is Semantics.NUMERICS_DRIFT
    data = base.model_dump(mode="python")
    data["knobs"]["train_micro_batch_size_per_gpu"] = 64  # 64 does not divide 32
    v = evaluate(base, data)
    assert not v.admitted and "train_batch_divisible" in v.reasons[0].message
    v = evaluate(base, base.with_knobs(**{"zero_optimization.contiguous_gradients": True}))
    assert v.admitted and v.owed == [] and v.semantics is Semantics.PRESERVING


def test_stage3_knobs_only_move_at_stage3(tmp_path):
    base = poor(tmp_path)
    at2 = base.with_knobs(**{"zero_optimization.stage": 2})
    data = at2.model_dump(mode="python")
    data["knobs"]["zero_optimization.stage3_prefetch_bucket_size"] = 50_000_000
    v = evaluate(base, data, parent=at2)
    assert not v.admitted and "stage3_knobs_need_stage3" in v.reasons[0].message
    assert evaluate(base, base.with_knobs(**{"zero_optimization.stage3_prefetch_bucket_size": 50_000_000})).admitted


def test_hf_mode_contract_includes_the_training_arguments(tmp_path):
    base = hf_recipe(tmp_path)
    argv = list(base.launch.argv)
    argv[argv.index("--learning_rate") + 1] = "1e-3"
    v = evaluate(base, with_argv(base, argv))
    fields = {r.field for r in v.reasons}
    assert not v.admitted
    # the flag is contract, and so is the optimizer lr the config's "auto" takes from it
    assert {"launch.args.learning_rate", "deepspeed.config.optimizer.params.lr",
            "deepspeed.config.scheduler.params.warmup_max_lr"} <= fields
    v = evaluate(base, apply_sets(base.model_dump(mode="python"), ["learning_rate=1e-3"]))
    assert not v.admitted and "launch.args.learning_rate" in {r.field for r in v.reasons}


# -- exploratory settings ------------------------------------------------------------------------------------

SUB_GROUP = "zero_optimization.sub_group_size"


def test_unclassified_setting_is_refused_by_default(tmp_path):
    base = poor(tmp_path)
    v = evaluate(base, sets(base, f"{SUB_GROUP}=100000000"))
    assert not v.admitted and v.codes == [ReasonCode.NUMERICS_NOT_OPTED_IN]
    assert "tuning.explore" in v.reasons[0].message and "unclassified" in v.reasons[0].message
    assert v.changed_groups == [f"exploratory:{SUB_GROUP}"] and v.semantics is Semantics.NUMERICS_CHANGING


def test_explored_setting_is_admitted_owing_its_loss_check(tmp_path):
    data = poor(tmp_path).model_dump(mode="python")
    data["tuning"]["explore"] = [SUB_GROUP]
    base = parse_recipe(data)
    cand = base.with_knobs(**{SUB_GROUP: 100_000_000})
    v = evaluate(base, cand)
    assert v.admitted and v.owed == [LOSS_EQUIVALENCE] and v.semantics is Semantics.NUMERICS_CHANGING
    assert v.changed_groups == [f"exploratory:{SUB_GROUP}"]  # reported as exploratory
    assert v.changed_knobs == {SUB_GROUP: (None, 100_000_000)}
    from attune.frameworks.deepspeed import render_launch

    text = render_launch(cand).files["ds_config.json"]
    assert json.loads(text)["zero_optimization"]["sub_group_size"] == 100_000_000
    assert render_launch(base).files["ds_config.json"] == POOR_CONFIG  # null: the launch's own value
    other = evaluate(base, base.with_knobs(**{"zero_optimization.round_robin_gradients": True}))
    assert not other.admitted  # only the named settings are explored


def test_explore_is_granted_by_the_baseline_only(tmp_path):
    base = poor(tmp_path)
    data = base.with_knobs(**{SUB_GROUP: 100_000_000}).model_dump(mode="python")
    data["tuning"]["explore"] = [SUB_GROUP]  # the candidate grants itself: no effect
    assert not evaluate(base, data).admitted
    data = base.model_dump(mode="python")
    data["launch"]["numerics_opt_in"] = ["exploratory"]  # no blanket opt-in: "exploratory" is no class to opt in to
    with pytest.raises(Exception, match="not a numerics class"):
        parse_recipe(data)


@pytest.mark.parametrize("name,message", [
    ("zero_optimization.stage", "curated knob"),
    ("optimizer.params.lr", "training contract"),
    ("optimizer.params", "training contract"),
    ("zero_optimization.offload_optimizer.nvme_path", "no unclassified DeepSpeed setting"),
    ("no_such_key", "no unclassified DeepSpeed setting"),
])
def test_explore_names_are_checked(tmp_path, name, message):
    data = poor(tmp_path).model_dump(mode="python")
    data["tuning"]["explore"] = [name]
    with pytest.raises(Exception, match=message):
        parse_recipe(data)


# -- the tuner explores what the owner names ----------------------------------------------------------------------

def _tune(base, tmp_path, name):
    from attune.engine.loop import TuneConfig, Tuner
    from attune.policies import make_policy
    from attune.testing.fakes import FakeBackend

    def speed(r):  # a made-up landscape: the explored setting at 1e8 is 30% faster
        return 1000.0 * (1.3 if r.knob(SUB_GROUP) == 100_000_000 else 1.0)

    cfg = TuneConfig.from_recipe(base, 1.0, search_space=(SUB_GROUP,), max_trials=8, paired=False)
    backend = FakeBackend(speed=speed, noise=0.001)
    state = Tuner(base, backend=backend, policy=make_policy("coordinate"), config=cfg, run_dir=tmp_path / name).run()
    return state, backend


def test_the_tuner_explores_a_named_setting_and_owes_its_loss_check(tmp_path):
    data = poor(tmp_path).model_dump(mode="python")
    data["tuning"]["explore"] = [SUB_GROUP]
    base = parse_recipe(data)
    state, _ = _tune(base, tmp_path, "explored")
    tried = [r for r in state.records if r.kind == "candidate" and SUB_GROUP in r.change]
    assert tried and all(r.verdict["semantics"] == "numerics_changing" for r in tried)
    assert all(r.verdict["owed"] == [LOSS_EQUIVALENCE] and r.verdict["changed_groups"] == [f"exploratory:{SUB_GROUP}"]
               for r in tried)
    assert any(r.kind == "loss_check" for r in state.records)  # the change was kept only after its loss check
    assert state.best_recipe().knob(SUB_GROUP) == 100_000_000
    assert json.loads(render_best(state))["zero_optimization"]["sub_group_size"] == 100_000_000


def test_without_explore_the_tuner_is_refused_and_spends_nothing(tmp_path):
    base = poor(tmp_path)
    state, backend = _tune(base, tmp_path, "frozen")
    launched = [r for r in state.records if r.kind == "candidate" and SUB_GROUP in r.change
                and r.outcome.value != "refused"]
    assert not launched  # the policy asks the gate first: a frozen setting is never tried
    assert all(r.knob(SUB_GROUP) is None for r in backend.launches) and backend.launches  # the baselines ran
    assert state.best_recipe().knob(SUB_GROUP) is None


def render_best(state) -> str:
    from attune.frameworks.deepspeed import render_launch

    return render_launch(state.best_recipe()).files["ds_config.json"]
