"""What a hostile or careless user types gets a clear message, exits non-zero where nothing was tuned, and never
shows a traceback or spends budget it should not. Each case reproduced a problem of the earlier main."""

from __future__ import annotations

import json
import math

import pytest
import yaml
from typer.testing import CliRunner

from attune.cli import _mount_optional, app
from attune.testing.factories import tiny_recipe_dict

runner = CliRunner()
_mount_optional()


def write(tmp_path, data, name="r.yaml"):
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return path


class Ran:
    def __init__(self, res):
        self.exit_code = res.exit_code
        self.output = " ".join(res.output.split())  # rich wraps long messages


def run(*args):
    res = runner.invoke(app, [str(a) for a in args])
    assert "Traceback" not in res.output and not isinstance(res.exception, (TypeError, KeyError, AttributeError)), \
        res.output
    return Ran(res)


def edited(**sections):
    d = tiny_recipe_dict()
    for path, value in sections.items():
        node = d
        *head, last = path.split("__")
        for part in head:
            node = node.setdefault(part, {})
        node[last] = value
    return d


@pytest.mark.parametrize("edit, words", [
    ({"training__precision": "fp16"}, "fp32 or bf16 on CPU"),
    ({"training__precision": "fp8"}, "fp32 or bf16 on CPU"),
    ({"training__optimizer__lr": math.inf}, "finite number"),
    ({"training__data__source": "tokens", "training__data__path": "/nonexistent/tokens.npy"}, "does not exist"),
    ({"training__schedule__warmup_steps": 10**9}, "exceeds training.steps"),
    ({"resources__accelerator": "h100-sxm-80gb"}, "need an NVIDIA GPU"),
    ({"model__layers": 10**30}, "less than or equal"),
    ({"model__layers": True}, "valid integer"),
    ({"model__layers": "2"}, "valid integer"),
    ({"training__numerics_opt_in": ["bogus"]}, "not a numerics class"),
])
def test_validate_refuses_recipes_that_can_never_run(tmp_path, edit, words):
    res = run("validate", write(tmp_path, edited(**edit)))
    assert res.exit_code == 1 and words in res.output, res.output


def test_validate_refuses_duplicate_keys_and_octal(tmp_path):
    text = yaml.safe_dump(tiny_recipe_dict())
    dup = text.replace("name: tiny", "name: tiny\nname: other")
    res = run("validate", write(tmp_path, dup, "dup.yaml"))
    assert res.exit_code == 1 and "duplicate key 'name'" in res.output
    octal = text.replace("layers: 2", "layers: 010")
    res = run("validate", write(tmp_path, octal, "octal.yaml"))
    assert res.exit_code == 1 and "ambiguous" in res.output


def test_non_utf8_recipe_is_a_message(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes(yaml.safe_dump(tiny_recipe_dict(), allow_unicode=True).replace("tiny", "tïny").encode("latin-1"))
    res = run("validate", path)
    assert res.exit_code == 1 and "not UTF-8" in res.output


@pytest.mark.parametrize("budget", ["nan", "inf", "-1", "0"])
def test_budgets_must_be_finite_and_positive(tmp_path, budget):
    res = run("tune", write(tmp_path, tiny_recipe_dict()), "--budget", budget, "--out", tmp_path / "run")
    assert res.exit_code == 2 and "finite positive" in res.output
    assert not (tmp_path / "run" / "journal.jsonl").exists()


def test_a_tiny_budget_launches_nothing_on_the_simulator(tmp_path):
    res = run("tune", "benchmarks/suite/01-llama3.2-1b-h100x8.yaml", "--backend", "sim", "--budget", "0.0001",
              "--out", tmp_path / "run")
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert result["budget_used_hours"] == 0 and result["trials_launched"] == 0
    assert res.exit_code == 3 and "cannot pay for one trial" in res.output


def test_max_trials_zero_measures_nothing_and_says_so(tmp_path):
    res = run("tune", "benchmarks/suite/01-llama3.2-1b-h100x8.yaml", "--backend", "sim", "--budget", "50",
              "--max-trials", "0", "--out", tmp_path / "run")
    assert res.exit_code == 3 and "baseline could not be measured" in res.output


@pytest.mark.parametrize("name", ["/abs/path", "../../escape", "..", "a/b\\c d"])
def test_recipe_names_become_safe_directory_names(tmp_path, monkeypatch, name):
    from attune import api
    from attune.testing.factories import tiny_recipe

    monkeypatch.chdir(tmp_path)
    recipe = tiny_recipe().model_copy(update={"name": name})
    run_dir = api.default_run_dir(recipe).resolve()
    assert run_dir.parent == (tmp_path / "runs").resolve() and "/" not in run_dir.name


@pytest.mark.parametrize("out", ["file", "/dev/null"])
def test_out_that_is_not_a_directory_is_a_message(tmp_path, out):
    target = tmp_path / "file" if out == "file" else out
    if out == "file":
        target.write_text("x")
    res = run("tune", write(tmp_path, tiny_recipe_dict()), "--budget", "0.1", "--out", target)
    assert res.exit_code == 2 and "not a directory" in res.output


@pytest.mark.parametrize("value", ["[4]", "{a: 1}", "010", "4.5", "true"])
def test_gate_check_with_odd_values_gives_a_verdict_or_a_message(tmp_path, value):
    res = run("gate", "check", write(tmp_path, tiny_recipe_dict()), "--set", f"micro_batch_size={value}")
    assert res.exit_code in (1, 2), res.output
    if value == "010":
        assert "leading zero" in res.output
