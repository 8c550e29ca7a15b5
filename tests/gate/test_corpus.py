"""Every proposed change of the corpus gets the verdict the corpus says."""

from __future__ import annotations

import pytest

from attune.gate import apply_sets, evaluate
from attune.gate.verdict import ReasonCode
from attune.recipe import parse_recipe
from tests.gate.corpus import CORPUS
from tests.gate.recipes import base


def test_corpus_is_big_and_well_formed() -> None:
    ids = [c["id"] for c in CORPUS]
    assert len(ids) >= 40 and len(set(ids)) == len(ids)
    assert sum(not c["admitted"] for c in CORPUS) >= 20 and sum(c["admitted"] for c in CORPUS) >= 15
    assert {c["base"] for c in CORPUS} >= {"tiny", "tiny_optin", "megatron", "megatron_optin", "megatron_moe"}
    assert all(c["admitted"] or c["code"] in ReasonCode.ALL for c in CORPUS)


@pytest.mark.parametrize("case", CORPUS, ids=[c["id"] for c in CORPUS])
def test_corpus_case(case: dict) -> None:
    data = base(case["base"])
    baseline = parse_recipe(data)
    verdict = evaluate(baseline, apply_sets(data, case["sets"]))
    assert verdict.admitted is case["admitted"], verdict.render()
    if case["admitted"]:
        assert verdict.reasons == []
        assert verdict.owed == case["owed"], verdict.render()
    else:
        assert verdict.owed == []
        assert case["code"] in verdict.codes, verdict.render()
        if case.get("field"):
            fields = [r.field for r in verdict.reasons if r.code == case["code"]]
            assert any(case["field"] in f for f in fields), verdict.render()
        for reason in verdict.reasons:  # every message is actionable: it names what to do
            assert reason.field and len(reason.message) > 20
