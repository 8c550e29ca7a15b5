"""nanoGPT's config files: a launch `python train.py config/x.py --batch_size=4` is read the way nanoGPT's
configurator reads it (the file's literal assignments in order, `--key=value` after them overriding), without running
anything; the script's own "tokens per iteration will be: N" line is checked against the global batch attune
believes; and the tuned command keeps the environment every trial ran with."""

from __future__ import annotations

import json

import pytest
import yaml

from attune.errors import RecipeError
from attune.gate import evaluate
from attune.gate.sets import apply_sets
from tests.frameworks.command.helpers import attune_cli, command, nanoshape_copy, recipe


def _decl(work):
    return yaml.safe_load((work / "knobs.yaml").read_text())


def test_the_accumulation_a_config_file_sets_is_read_not_the_declarations_default(tmp_path):
    work = nanoshape_copy(tmp_path)
    r = recipe(["python", "train.py", "config/accum1.py", "--batch_size=4"], work, decl=_decl(work), env={})
    assert r.tokens_per_step == 4 * 1 * 64  # batch 4 × accumulation 1 (config/accum1.py), not × 40
    # the global batch is 4: a move to 8 cannot keep it, and a move to 2 derives an accumulation of 2
    assert not evaluate(r, apply_sets(r.model_dump(mode="python"), ["batch_size=8"])).admitted
    argv = list(command().render(r.with_knobs(batch_size=2)).argv)
    assert argv == ["python", "train.py", "config/accum1.py", "--batch_size=2", "--gradient_accumulation_steps=2"]


def test_a_flag_before_the_config_file_is_overridden_by_it_and_moved_after_it(tmp_path):
    work = nanoshape_copy(tmp_path)
    # nanoGPT applies its arguments in order: the file's gradient_accumulation_steps = 1 wins over the flag before it
    r = recipe(["python", "train.py", "--gradient_accumulation_steps=8", "config/accum1.py", "--batch_size=4"],
               work, decl=_decl(work), env={})
    assert r.tokens_per_step == 4 * 64
    argv = list(command().render(r.with_knobs(batch_size=2)).argv)
    assert argv == ["python", "train.py", "config/accum1.py", "--batch_size=2", "--gradient_accumulation_steps=2"]


def test_a_config_file_that_computes_a_declared_setting_is_an_error_naming_the_file_and_line(tmp_path):
    work = nanoshape_copy(tmp_path)
    with pytest.raises(RecipeError) as err:
        recipe(["python", "train.py", "config/computed.py", "--batch_size=4"], work, decl=_decl(work), env={})
    text = str(err.value)
    assert "config/computed.py line 2" in text and "gradient_accumulation_steps = 5 * 8" in text, text


def test_a_contract_setting_from_a_config_file_is_its_real_value(tmp_path):
    work = nanoshape_copy(tmp_path)
    r = recipe(["python", "train.py", "config/accum1.py", "--batch_size=4"], work, decl=_decl(work), env={})
    field = command().contract(r)["command.max_iters"]
    assert field.value == 2000 and "null" not in field.fix and "absent" not in field.fix


def test_a_trial_whose_own_token_count_contradicts_attunes_fails_naming_both(tmp_path):
    work = nanoshape_copy(tmp_path)  # config/short_blocks.py sets block_size = 32; the declaration says 64
    res = attune_cli("import", "--framework", "command", "--knobs", "knobs.yaml", "--devices-per-node", "1", "-o",
                     "recipe.yaml", "--", "python", "train.py", "config/short_blocks.py", "--batch_size=4", cwd=work)
    assert res.returncode == 0, res.stderr
    res = attune_cli("tune", "recipe.yaml", "--budget", "0.02", "--max-trials", "1", "--out", "run", cwd=work)
    result = json.loads((work / "run" / "result.json").read_text())
    baseline = result["trials"][0]
    assert baseline["outcome"] != "succeeded", baseline
    # the script's "tokens per iteration will be: 128" (1 × 4 × 32) against attune's 256 (global batch 4 × 64)
    assert "128" in baseline["message"] and "256" in baseline["message"], baseline["message"]
    assert res.returncode != 0 and "Traceback" not in res.stderr


def test_the_tuned_command_keeps_the_environment_the_trials_ran_with(tmp_path):
    work = nanoshape_copy(tmp_path)  # its declaration has no threads knob
    res = attune_cli("import", "--framework", "command", "--knobs", "knobs.yaml", "-o", "recipe.yaml", "--",
                     "python", "train.py", "config/accum1.py", "--batch_size=4", cwd=work,
                     env={"OMP_NUM_THREADS": "1", "MY_SECRET_TOKEN": "x"})
    assert res.returncode == 0, res.stderr
    rendered = attune_cli("render", "recipe.yaml", cwd=work)
    assert rendered.returncode == 0, rendered.stderr
    line = rendered.stdout.strip().splitlines()[-1]  # after the carried config file's text
    assert line.endswith(" python train.py config/accum1.py --batch_size=4"), line
    assert "OMP_NUM_THREADS=1" in line.split(" python ")[0].split() and "SECRET" not in line, line
    # a declared threads knob at its declared default: the variable is set, as every trial sets it
    decl = _decl(work)
    decl["knobs"]["threads"] = {"env": "OMP_NUM_THREADS", "values": ["1", "2"], "default": "1", "role": "threads"}
    r = recipe(["python", "train.py", "config/accum1.py", "--batch_size=4"], work, decl=decl, env={})
    assert dict(command().render(r.with_knobs(batch_size=2)).env) == {"OMP_NUM_THREADS": "1"}
