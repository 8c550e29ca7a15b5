"""The gate on `command` recipes: contract flags in the script's own names, undeclared flags, the declaration itself
and the global batch are refused; declared knobs are admitted with the checks they owe."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from attune.gate import evaluate
from attune.gate.sets import apply_sets
from attune.recipe.io import recipe_to_dict
from tests.frameworks.command.helpers import POOR, cli_env, recipe, with_argv


def refused(r, data):
    verdict = evaluate(r, data)
    assert not verdict.admitted
    return {reason.field: reason.message for reason in verdict.reasons}


@pytest.mark.parametrize(("flag", "field"), [
    ("--learning_rate=1e-3", "command.learning_rate"), ("--max_iters=100", "command.max_iters"),
    ("--seed=1", "command.seed"), ("--dtype=bfloat16", "command.dtype"), ("--dataset=openwebtext", "command.dataset"),
])
def test_a_contract_flag_is_refused_in_the_scripts_own_name(flag, field):
    r = recipe()
    reasons = refused(r, with_argv(r, [*POOR, flag]))
    name = field.removeprefix("command.")
    assert field in reasons and f"{name} is a contract setting of this script" in reasons[field], reasons


def test_a_contract_flag_the_command_already_has_cannot_move_either():
    r = recipe([*POOR, "--learning_rate=6e-4"])
    argv = [*POOR, "--learning_rate=1e-3"]
    assert "6e-4" in refused(r, with_argv(r, argv))["command.learning_rate"]


def test_an_undeclared_flag_is_frozen_whether_added_or_changed():
    r = recipe([*POOR, "--eval_interval=2000"])
    reasons = refused(r, with_argv(r, [*POOR, "--eval_interval=10"]))
    assert "launch.args.eval_interval" in reasons and "declare it as a knob" in reasons["launch.args.eval_interval"]
    reasons = refused(r, with_argv(r, [*POOR, "--eval_interval=2000", "--wandb_log=True"]))
    assert "launch.options" in reasons and "--wandb_log" in reasons["launch.options"]


def test_the_accumulation_alone_moves_the_global_batch_and_is_refused():
    r = recipe()
    argv = ["python", "train.py", "--batch_size=1", "--gradient_accumulation_steps=16", "--compile=False",
            "--max_iters=5000"]
    reasons = refused(r, with_argv(r, argv))
    assert "command.global_batch" in reasons and "must stay 32" in reasons["command.global_batch"]


def test_the_declaration_is_the_owners_and_a_candidate_cannot_widen_it():
    r = recipe()
    data = r.model_dump(mode="python")
    data["launch"]["declaration"]["contract"] = ["--seed"]  # drop --learning_rate from the contract
    assert "launch.declaration" in refused(r, data)


def test_declared_knobs_are_admitted_and_owe_the_loss_check():
    r = recipe()
    verdict = evaluate(r, apply_sets(r.model_dump(mode="python"), ["batch_size=8"]))
    assert verdict.admitted and verdict.owed == ["loss_equivalence"]
    verdict = evaluate(r, apply_sets(r.model_dump(mode="python"), ["batch_size=3"]))
    assert not verdict.admitted  # outside the declared domain


def test_gate_check_on_the_command_line_refuses_in_the_scripts_names(tmp_path):
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe_to_dict(recipe())))

    def gate(*sets: str) -> subprocess.CompletedProcess[str]:
        args = [a for s in sets for a in ("--set", s)]
        return subprocess.run([sys.executable, "-m", "attune", "gate", "check", str(path), *args],
                               capture_output=True, text=True, env=cli_env(), timeout=120)

    res = gate("learning_rate=1e-3")
    assert res.returncode == 1 and "command.learning_rate" in res.stdout and "Traceback" not in res.stderr
    res = gate("eval_interval=100")
    assert res.returncode == 1 and "launch.options" in res.stdout
    res = gate("batch_size=4")
    assert res.returncode == 0 and "ADMITTED" in res.stdout
