"""The knob declaration: what a malformed one is told, field by field."""

from __future__ import annotations

import pytest
import yaml

from attune.errors import RecipeError
from attune.frameworks.command import build_catalogue
from attune.frameworks.command.declaration import Role, load, parse
from attune.recipe.catalogue import Semantics
from tests.frameworks.command.helpers import EXAMPLE, declaration, example_declaration


def test_the_examples_declaration_builds_its_catalogue_and_rules_by_role():
    d, data = load(EXAMPLE / "knobs.yaml")
    assert d.role_knob(Role.BATCH_PER_PROCESS) == "batch_size" and d.batch is not None
    assert parse(data) == d  # what the recipe stores reads back as the same declaration
    cat = build_catalogue(d)
    assert cat.framework == "command" and set(cat.knobs) == {"batch_size", "compile", "threads"}
    assert cat["compile"].semantics is Semantics.NUMERICS_DRIFT and cat["batch_size"].values == (1, 2, 4, 8, 16, 32)
    assert cat.rules is not None and cat.rules[("batch_size", "up")].helps["host_overhead"] > 0
    assert ("compile", "enable") in cat.rules and ("threads", "up") in cat.rules
    assert [c.name for c in cat.constraints] == ["global_batch_divisible", "threads_fit_cores"]


@pytest.mark.parametrize(("changes", "message"), [
    ({"steps": None}, "steps: Field required"),
    ({"steps": "megatron"}, "unknown preset 'megatron'"),
    ({"steps": {"pattern": "loss (?P<loss>\\S+)"}}, "pattern needs a named group step"),
    ({"steps": {"pattern": "(?P<step>\\d+"}}, "pattern is not a regular expression"),
    ({"steps": {"pattern": "(?P<step>\\d+) (?P<lr>\\S+)"}}, "groups ['lr']"),
    ({"knobs": {"bs": {"flag": "--bs", "env": "BS", "values": [1, 2]}}}, "give exactly one of flag, env or launcher"),
    ({"knobs": {"bs": {"flag": "bs", "values": [1, 2]}}}, "must be written as on the command line"),
    ({"knobs": {"bs": {"flag": "--bs", "values": [1]}}}, "knobs.bs.values"),
    ({"knobs": {"fp8": {"flag": "--fp8", "values": [False, True], "semantics": "numerics_changing"}}},
     "needs a numerics_class"),
    ({"knobs": {"t": {"env": "OMP_NUM_THREADS", "values": [1, 2]}}}, "values are strings"),
    ({"batch": {"global": "batch_size * 16", "accumulation": {"flag": "--gradient_accumulation_steps"}}},
     "must name the accumulation (gradient_accumulation_steps) once"),
    ({"batch": {"global": "batch_size * micro * gradient_accumulation_steps",
                "accumulation": {"flag": "--gradient_accumulation_steps"}}}, "'micro' is neither a declared knob"),
    ({"contract": ["--batch_size"]}, "knobs.batch_size: --batch_size is also listed under contract"),
    ({"contract": ["--gradient_accumulation_steps"]}, "attune derives it, so it cannot also be contract"),
    ({"tokens_per_step": 100}, "give one of them"),
    ({"batch": None, "tokens_per_sample": None}, "knobs.batch_size: a batch_per_process knob moves the global batch "
                                                 "unless batch.global names it"),
    ({"knobs": {"batch_size": {"flag": "--batch_size", "values": [1, 2], "role": "batch_per_process"},
                "procs": {"launcher": "processes", "values": [1, 2]}},
      "batch": {"global": "batch_size * gradient_accumulation_steps",
                "accumulation": {"flag": "--gradient_accumulation_steps"}}},
     "knobs.procs: more processes take more samples per step unless the batch invariant accounts for them"),
])
def test_a_malformed_declaration_names_its_field_and_the_fix(changes, message):
    with pytest.raises(RecipeError) as err:
        parse(declaration(**changes))
    assert message in str(err.value), str(err.value)


def test_a_declaration_file_that_is_not_yaml_or_missing_is_named(tmp_path):
    with pytest.raises(RecipeError, match="cannot read the knob declaration"):
        load(tmp_path / "knobs.yaml")
    (tmp_path / "knobs.yaml").write_text("steps: [nanogpt\n")
    with pytest.raises(RecipeError, match="is not YAML"):
        load(tmp_path / "knobs.yaml")
    (tmp_path / "knobs.yaml").write_text(yaml.safe_dump(["steps"]))
    with pytest.raises(RecipeError, match="must be a mapping with steps and knobs"):
        load(tmp_path / "knobs.yaml")


def test_a_recipe_whose_declaration_was_edited_badly_is_refused_with_its_field():
    from attune.recipe.io import parse_recipe
    from tests.frameworks.command.helpers import imported

    data = imported(["python", "train.py", "--batch_size=1", "--gradient_accumulation_steps=16"])
    data["launch"]["declaration"]["knobs"]["batch_size"]["values"] = [2, 4]
    with pytest.raises(RecipeError, match="knobs.batch_size: 1 is not a legal value; legal values: 2, 4"):
        parse_recipe(data)
    data["launch"]["declaration"] = None
    with pytest.raises(RecipeError, match="launch.declaration: a command recipe needs its knob declaration"):
        parse_recipe(data)
    assert example_declaration()["steps"] == "nanogpt"


def test_the_playbook_reads_each_declared_knobs_rules_by_its_role():
    from attune.frameworks.base import Tier
    from attune.policies.playbook import rule_for

    knobs = {"mbs": {"flag": "--mbs", "values": [1, 2, 4], "role": "batch_per_process"},
             "workers": {"flag": "--num_workers", "values": [0, 2, 4], "role": "loader_workers"},
             "ckpt": {"flag": "--ckpt", "values": [False, True], "role": "checkpointing", "semantics": "preserving"},
             "procs": {"launcher": "processes", "values": [1, 2], "role": "processes"},
             "fused": {"flag": "--fused", "values": [False, True]}}
    cat = build_catalogue(parse(declaration(knobs=knobs, batch={
        "global": "mbs * grad_acc * procs", "accumulation": {"flag": "--grad_acc"}})))
    assert rule_for(cat, "mbs", "up").tier == Tier.SCALE and rule_for(cat, "mbs", "up").memory == 1
    assert rule_for(cat, "workers", "up").helps == {"data_loading": 0.2}
    assert rule_for(cat, "ckpt", "disable").tier == Tier.FIT and rule_for(cat, "procs", "up").gain == 0.3
    assert rule_for(cat, "fused", "enable").gain == 0.005  # no role: the playbook's default prior
    assert cat["mbs"].group == cat["procs"].group == "batch_split"  # moved together where one alone cannot divide
