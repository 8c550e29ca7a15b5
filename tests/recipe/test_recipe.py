from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from attune.errors import RecipeError
from attune.recipe import Semantics, apply_change, get_catalogue, load_recipe, parse_recipe, signature
from attune.recipe.io import dump_recipe
from attune.testing.factories import tiny_recipe, tiny_recipe_dict

EXAMPLES = sorted(Path(__file__).parents[2].joinpath("examples").glob("*.yaml"))


@pytest.mark.parametrize("path", [p for p in EXAMPLES if "tuningrun" not in p.name], ids=lambda p: p.name)
def test_examples_are_valid(path):
    load_recipe(path)


def test_every_problem_is_reported_with_its_field_path():
    d = tiny_recipe_dict(micro_batch_size=3, no_such_knob=1)
    d["training"]["global_batch_size"] = -1
    d["model"]["hidden_size"] = 65
    d["resources"]["accelerator"] = "tpu"
    d["extra_section"] = {}
    with pytest.raises(RecipeError) as exc:
        parse_recipe(d)
    text = str(exc.value)
    for needle in ("training.global_batch_size", "model", "resources.accelerator", "extra_section: unknown field"):
        assert needle in text, text


def test_knob_errors_name_the_knob_and_the_fix():
    with pytest.raises(RecipeError) as exc:
        parse_recipe(tiny_recipe_dict(micro_batch_size=3, micro_batch=2))
    text = str(exc.value)
    assert "knobs.micro_batch_size: 3 is not a legal value; legal values: 1, 2, 4" in text
    assert "knobs.micro_batch: 'micro_batch' is not a knob" in text and "Did you mean micro_batch_size" in text


def test_constraint_violation_names_the_rule_values_and_legal_choices():
    with pytest.raises(RecipeError) as exc:
        apply_change(tiny_recipe(nproc_per_node=2), {"micro_batch_size": 8})
    assert "global_batch_size (8) must be divisible by micro_batch_size (8) × data-parallel degree (2)" in str(exc.value)
    assert "legal micro_batch_size here: [1, 2, 4]" in str(exc.value)


def test_round_trip_yaml(tmp_path):
    r = tiny_recipe(micro_batch_size=2)
    dump_recipe(r, tmp_path / "r.yaml")
    assert load_recipe(tmp_path / "r.yaml") == r


def test_apply_change_is_pure_and_signature_tracks_effective_knobs():
    r = tiny_recipe()
    r2 = apply_change(r, {"micro_batch_size": 2})
    assert r.knob("micro_batch_size") == 1 and r2.knob("micro_batch_size") == 2
    assert signature(r) != signature(r2)
    assert signature(r) == signature(tiny_recipe(micro_batch_size=1))  # explicit default == implicit default


def test_catalogue_entries_are_described_and_classified():
    cat = get_catalogue("torch")
    for knob in cat.knobs.values():
        assert len(knob.description) > 20
        assert knob.default in knob.values
        if knob.semantics is Semantics.NUMERICS_CHANGING:
            assert knob.numerics_class
    assert cat["matmul_precision"].semantics_of("highest") is Semantics.NUMERICS_DRIFT
    assert cat["matmul_precision"].semantics_of("medium") is Semantics.NUMERICS_CHANGING


def test_unreadable_and_malformed_files(tmp_path):
    with pytest.raises(RecipeError, match="cannot read recipe"):
        load_recipe(tmp_path / "missing.yaml")
    (tmp_path / "bad.yaml").write_text("model: [unclosed")
    with pytest.raises(RecipeError, match="not valid YAML"):
        load_recipe(tmp_path / "bad.yaml")
    (tmp_path / "list.yaml").write_text(yaml.safe_dump([1, 2]))
    with pytest.raises(RecipeError, match="expected a mapping"):
        load_recipe(tmp_path / "list.yaml")


def test_cli_validate_prints_problems_without_traceback(tmp_path):
    d = tiny_recipe_dict(micro_batch_size=5)
    d["training"]["seq_length"] = 0
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(d))
    proc = subprocess.run([sys.executable, "-m", "attune", "validate", str(tmp_path / "r.yaml")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    out = proc.stdout + proc.stderr
    assert "training.seq_length" in out and "knobs.micro_batch_size" in out
    assert "Traceback" not in out
