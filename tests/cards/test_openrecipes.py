"""The cards shipped in openrecipes/: at least 30, each valid, each matching the run it came from, made by
`make openrecipes` (not by hand), simulated ones marked so, and a sample whose claims still hold when re-run."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import jsonschema
import pytest
import yaml

from attune.cards.io import baseline_recipe, check_card, find_cards, load_card
from attune.cards.model import json_schema
from attune.cards.verify import HOLDS, verify
from attune.recipe.io import load_recipe, recipe_to_dict

REPO = Path(__file__).resolve().parents[2]
ROOT = REPO / "openrecipes"
CARDS = find_cards(ROOT / "cards") if (ROOT / "cards").is_dir() else []
SCHEMA = ROOT / "schema" / "recipe-card.schema.json"


def test_there_are_at_least_thirty_cards():
    assert len(CARDS) >= 30
    kinds = {load_card(p).measurement.kind for p in CARDS}
    assert "simulated" in kinds


def test_the_shipped_schema_is_the_models():
    assert json.loads(SCHEMA.read_text()) == json_schema(), "run `make openrecipes-schema`"


@pytest.mark.parametrize("path", CARDS, ids=[p.stem for p in CARDS])
def test_card_is_valid_and_matches_its_run(path: Path):
    data = yaml.safe_load(path.read_text())
    jsonschema.Draft202012Validator(json.loads(SCHEMA.read_text())).validate(data)
    assert check_card(path) == []
    card = load_card(path)
    assert path.read_text().startswith("# attune recipe card")  # written by `attune card`
    words = shlex.split(card.reproduce.command)
    assert words[:3] == ["ATTUNE_LESSONS=off", "attune", "tune"]  # the Makefile's command, lessons off
    if card.simulated:
        assert card.measurement.backend == "sim" and path.parent.name == "simulated"
        assert "--backend" in words and words[words.index("--backend") + 1] == "sim"
        assert "simulated" in card.summary and card.measurement.machine.get("simulator")
        # made from the benchmark suite's recipe, unchanged
        suite = REPO / str(card.reproduce.recipe_path)
        assert suite.parent == REPO / "benchmarks" / "suite" and suite.exists()
        assert recipe_to_dict(load_recipe(suite)) == recipe_to_dict(baseline_recipe(card))
    else:
        assert card.measurement.backend == "local" and path.parent.name == "measured"
        assert card.framework.version and card.evidence.loss_equivalence.modelled


SIMULATED = [p for p in CARDS if load_card(p).simulated]


@pytest.mark.parametrize("index", [0, 1])
def test_a_sample_of_simulated_claims_still_holds(index: int, tmp_path: Path):
    sims = [p for p in SIMULATED if load_card(p).recipe.changes]
    v = verify(sims[index * (len(sims) // 2)], out=tmp_path)
    assert v.code == HOLDS, (v.summary, v.checks)


@pytest.mark.slow
@pytest.mark.parametrize("path", SIMULATED, ids=[p.stem for p in SIMULATED])
def test_every_simulated_claim_still_holds(path: Path, tmp_path: Path):
    """A change to the engine, the playbook or the simulator that changes what a shipped card's reproduce command
    gives fails here: regenerate the cards with `make openrecipes-sim`."""
    v = verify(path, out=tmp_path)
    assert v.code == HOLDS, (v.summary, v.checks)


def test_a_measured_card_ships_and_the_readme_shows_its_report_and_the_leaderboard_command():
    measured = [p for p in CARDS if not load_card(p).simulated]
    assert measured, "run `make openrecipes-cpu` on a quiet machine"
    readme = (REPO / "README.md").read_text()
    images = [line.split("](", 1)[1].rstrip(")") for line in readme.splitlines() if line.startswith("![")]
    assert "docs/images/demo-report.png" in images
    for image in images:
        assert (REPO / image).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", image
    assert "attune leaderboard build openrecipes/cards --out SITE" in readme and "make leaderboard" in readme
