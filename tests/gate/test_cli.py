"""``attune gate check``: exit codes 0 admitted, 1 refused, 2 bad usage; --json."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from attune.commands.gate import app
from tests.gate.recipes import ROOT

RECIPE = str(ROOT / "examples" / "tiny-gpt-cpu.yaml")
runner = CliRunner()


def test_admitted_change_exits_0() -> None:
    result = runner.invoke(app, ["check", RECIPE, "--set", "micro_batch_size=2"])
    assert result.exit_code == 0, result.output
    assert "ADMITTED" in result.output and "loss_equivalence" in result.output


def test_unchanged_recipe_is_admitted() -> None:
    assert runner.invoke(app, ["check", RECIPE]).exit_code == 0


def test_refused_change_exits_1_and_names_the_field() -> None:
    result = runner.invoke(app, ["check", RECIPE, "--set", "training.optimizer.lr=1e-3"])
    assert result.exit_code == 1, result.output
    assert "REFUSED" in result.output and "training.optimizer.lr" in result.output and "0.0003" in result.output


def test_json_output() -> None:
    result = runner.invoke(app, ["check", RECIPE, "-s", "micro_batch_size=2", "--set", "nproc_per_node=2", "--json"])
    assert result.exit_code == 0
    doc = json.loads(result.output)
    assert doc["admitted"] is True and doc["owed"] == ["loss_equivalence"] and doc["changed_groups"] == ["batch_split"]
    result = runner.invoke(app, ["check", RECIPE, "--set", "matmul_precision=high", "--json"])
    assert result.exit_code == 1 and json.loads(result.output)["reasons"][0]["code"] == "numerics_not_opted_in"


def test_malformed_set_exits_2() -> None:
    result = runner.invoke(app, ["check", RECIPE, "--set", "micro_batch_size"])
    assert result.exit_code == 2 and "PATH=VALUE" in result.output


def test_unreadable_recipe_exits_2(tmp_path) -> None:
    assert runner.invoke(app, ["check", str(tmp_path / "missing.yaml")]).exit_code == 2
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [unclosed")
    assert runner.invoke(app, ["check", str(bad)]).exit_code == 2
    invalid = tmp_path / "invalid.yaml"
    invalid.write_text("model: {layers: 1}\n")
    result = runner.invoke(app, ["check", str(invalid)])
    assert result.exit_code == 2 and "training" in result.output


def test_missing_argument_is_usage_error() -> None:
    assert runner.invoke(app, ["check"]).exit_code == 2
