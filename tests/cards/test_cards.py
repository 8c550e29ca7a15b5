"""Recipe cards: made from a finished run, valid against the schema, checked against the run, and verifiable."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jsonschema
import pytest
import yaml
from typer.testing import CliRunner

from attune.cards.build import dump_card, make_card
from attune.cards.io import check_card, load_card
from attune.cards.model import Card, json_schema
from attune.cards.verify import DOES_NOT_HOLD, HOLDS, UNAVAILABLE, verify
from attune.cli import _mount_optional, app
from attune.errors import AttuneError
from tests.report.runs import scripted_run, sim_run

_mount_optional()
runner = CliRunner()


@pytest.fixture(scope="module")
def sim_card(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("simcard")
    run = sim_run(root / "run")
    return make_card(run, root / "cards")


def _edit(card_path: Path, out: Path, change) -> Path:
    """A copy of a card (and its result) with ``change(data)`` applied; the copy keeps the original's id."""
    out.mkdir(parents=True, exist_ok=True)
    data = yaml.safe_load(card_path.read_text())
    change(data)
    shutil.copyfile(card_path.parent / data["source"]["result"], out / data["source"]["result"])
    dst = out / card_path.name
    dst.write_text(dump_card(Card.model_validate(data)))
    return dst


def test_a_card_holds_the_claim_and_its_evidence(sim_card):
    c = sim_card.card
    result = json.loads(sim_card.result_path.read_text())
    assert c.id == "llama3.2-1b-h100x8--sim-playbook-s0" and sim_card.card_path.name == f"{c.id}.yaml"
    assert c.measurement.kind == "simulated" and c.measurement.backend == "sim" and c.simulated
    assert c.throughput.tuned == result["best_throughput"] and c.throughput.speedup == result["speedup"]
    assert c.cost.accelerator_hours == result["budget_used_hours"]
    assert {k: v.to for k, v in c.recipe.changes.items()} == result["best_changes"] != {}
    assert len(c.evidence.gate) == len(result["trials"]) and all(g.admitted for g in c.evidence.gate
                                                                 if g.outcome != "refused")
    assert c.evidence.loss_equivalence.verdict == "passed" and not c.evidence.loss_equivalence.modelled
    assert 0 < (c.mfu.value or 0) < 1 and c.mfu.peak_tflops_per_device
    assert c.model.parameters and c.model.size == "1B-10B" and c.hardware.devices == 8
    assert c.measurement.runs["baseline"] == 2 and c.measurement.runs["tuned"] >= 2
    assert c.measurement.machine["simulator"]["digest"] and c.measurement.software["attune"]
    assert c.reproduce.command == ("ATTUNE_LESSONS=off attune tune benchmarks/suite/01-llama3.2-1b-h100x8.yaml "
                                   "--backend sim --budget 4.5 --policy playbook --seed 0")
    assert c.recipe.launch.form == "knobs" and any(line.startswith("+") for line in c.recipe.launch.diff)


def test_a_card_validates_against_the_json_schema(sim_card):
    data = yaml.safe_load(sim_card.card_path.read_text())
    jsonschema.Draft202012Validator(json_schema()).validate(data)
    bad = dict(data, throughput={**data["throughput"], "tuned": "fast"})
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(json_schema()).validate(bad)


def test_check_finds_a_card_that_disagrees_with_its_run(sim_card, tmp_path: Path):
    assert check_card(sim_card.card_path) == []
    inflated = _edit(sim_card.card_path, tmp_path / "a",
                     lambda d: d["throughput"].update(speedup=d["throughput"]["speedup"] * 1.1))
    assert any("throughput.speedup" in p for p in check_card(inflated))
    edited = _edit(sim_card.card_path, tmp_path / "b", lambda d: None)
    result = edited.parent / load_card(edited).source.result
    result.write_text(result.read_text().replace('"speedup": ', '"speedup": 1.5, "was": ', 1))
    problems = check_card(edited)
    assert any("sha256" in p for p in problems)
    res = runner.invoke(app, ["card", "check", str(edited.parent)])
    assert res.exit_code == 1 and "0 of 1 cards agree" in res.output


def test_verify_reruns_the_search_and_the_claim_holds(sim_card, tmp_path: Path):
    v = verify(sim_card.card_path, out=tmp_path / "v")
    assert v.code == HOLDS, (v.summary, v.checks)
    assert (tmp_path / "v" / "run" / "result.json").exists()
    assert {w: ok for w, ok, _ in v.checks}["speedup"] is True
    res = runner.invoke(app, ["card", "verify", str(sim_card.card_path)])
    assert res.exit_code == HOLDS and "the claim holds" in res.output


def test_verify_says_when_a_claim_does_not_hold(sim_card, tmp_path: Path):
    def inflate(d):
        d["throughput"].update(speedup=d["throughput"]["speedup"] * 1.25, tuned=d["throughput"]["tuned"] * 1.25)

    card = _edit(sim_card.card_path, tmp_path / "c", inflate)
    res = runner.invoke(app, ["card", "verify", str(card)])
    assert res.exit_code == DOES_NOT_HOLD and "does NOT hold" in res.output


def test_verify_uses_the_cards_own_baseline_when_the_recipe_file_is_gone(sim_card, tmp_path: Path):
    def move(d):
        d["reproduce"]["command"] = d["reproduce"]["command"].replace("benchmarks/suite/", "gone/")
        d["reproduce"]["recipe_path"] = d["reproduce"]["recipe_path"].replace("benchmarks/suite/", "gone/")

    card = _edit(sim_card.card_path, tmp_path / "d", move)
    v = verify(card)
    assert v.code == HOLDS and "is not here" in v.checks[0][2]


def test_a_fake_backend_card_cannot_be_verified(recorded_run: Path, tmp_path: Path):
    files = make_card(recorded_run, tmp_path)
    assert files.card.measurement.kind == "simulated" and files.card.measurement.backend == "fake"
    assert "reconstructed" in files.card.reproduce.notes  # made through the API, not `attune tune`
    res = runner.invoke(app, ["card", "verify", str(files.card_path)])
    assert res.exit_code == UNAVAILABLE and "cannot verify here" in res.output


def test_a_measured_cpu_card(tmp_path: Path):
    run = tmp_path / "cpu-run"
    scripted_run(run, backend_name="local")  # the fake, named as the real backend would be
    files = make_card(run, tmp_path / "cards")
    c = files.card
    assert c.measurement.kind == "measured" and c.id.endswith("--real-scripted-s0")
    assert c.mfu.value is None and "no peak" in c.mfu.basis and c.mfu.achieved_tflops_per_device > 0
    assert c.framework.version  # torch's version from the run's environment
    assert c.recipe.launch.form == "launch" and any("--nproc_per_node=2" in ln for ln in c.recipe.launch.diff)
    assert c.evidence.loss_equivalence.modelled and c.evidence.loss_equivalence.verdict == "passed"
    assert check_card(files.card_path) == []


def test_card_command_line(tmp_path: Path, sim_card):
    run = sim_card.card_path.parent.parent / "run"
    res = runner.invoke(app, ["card", str(run), "--out", str(tmp_path), "--id", "mine"])  # `card DIR` = `card make`
    assert res.exit_code == 0, res.output
    assert (tmp_path / "mine.yaml").exists() and (tmp_path / "mine.result.json").exists()
    res = runner.invoke(app, ["card", "schema"])
    assert res.exit_code == 0 and json.loads(res.output)["title"] == "attune recipe card"
    res = runner.invoke(app, ["card", str(tmp_path / "nothing")])
    assert res.exit_code == 2 and "journal" in res.output


def test_an_unfinished_run_makes_no_card(tmp_path: Path, recorded_run: Path):
    run = tmp_path / "unfinished"
    shutil.copytree(recorded_run, run)
    lines = (run / "journal.jsonl").read_text().splitlines()
    (run / "journal.jsonl").write_text("\n".join(ln for ln in lines if '"run_finished"' not in ln) + "\n")
    with pytest.raises(AttuneError, match="not finished"):
        make_card(run, tmp_path / "cards")
