"""A certification trial is a whole recipe (the final best, reached one coupling group at a time, or the baseline):
the CRD admits its kind and the trial webhook judges it as the engine does, without the one-group rule. Seen on
the real control plane: once a search kept a change, every certification trial was refused by the API server
(``spec.kind: Unsupported value: "certify"``) and the run failed."""

from __future__ import annotations

from attune.operator.manifests import build_trial
from attune.operator.resources import TuningTrialSpec
from attune.operator.webhook import trial_problems, trial_verdict
from attune.recipe.io import parse_recipe
from tests.k8s.fakes import tuning_run

TWO_GROUPS = {"activation_checkpointing": "selective", "dataloader_workers": 2}


def _trial(run, kind, change):
    base = parse_recipe(run["spec"]["recipe"]["inline"])
    return build_trial(run, 9, kind, change, {**base.effective_knobs, **change}, "engine", "certification")


def test_a_certification_trial_of_a_best_reached_in_two_groups_is_admitted():
    run = tuning_run(searchSpace=sorted(TWO_GROUPS))
    assert "certify" in TuningTrialSpec.model_json_schema()["properties"]["kind"]["enum"]
    assert trial_problems(run, _trial(run, "certify", TWO_GROUPS)) == []
    # the same two groups proposed as one candidate: refused, as ever
    verdict = trial_verdict(run, _trial(run, "candidate", TWO_GROUPS))
    assert not isinstance(verdict, str) and not verdict.admitted
    assert any(r.code == "multiple_groups" for r in verdict.reasons), verdict.reasons
    # a certification run of a recipe the gate refuses for another reason stays refused
    bad = trial_problems(run, _trial(run, "certify", {**TWO_GROUPS, "matmul_precision": "medium"}))
    assert bad and any("numerics_not_opted_in" in p for p in bad), bad
