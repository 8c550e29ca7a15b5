"""The gate's rules beyond the corpus: history, parents, candidates as dicts, the verdict's forms."""

from __future__ import annotations

import json

import pytest

from attune.errors import GateRefusal
from attune.gate import Verdict, apply_sets, effective_contract, enforce, evaluate
from attune.recipe import Semantics, parse_recipe
from tests.gate.recipes import base


@pytest.fixture()
def tiny():
    return parse_recipe(base("tiny"))


def test_repeat_of_a_tried_configuration_is_refused(tiny) -> None:
    tried = tiny.with_knobs(micro_batch_size=2)
    verdict = evaluate(tiny, tiny.with_knobs(micro_batch_size=2), history=[tiny, tried])
    assert not verdict.admitted and verdict.codes == ["repeat"]
    assert "micro_batch_size=2" in verdict.reasons[0].message


def test_explicit_default_counts_as_the_same_configuration(tiny) -> None:
    verdict = evaluate(tiny, tiny.with_knobs(matmul_precision="highest"), history=[tiny])
    assert verdict.codes == ["repeat"]


def test_groups_are_counted_relative_to_the_parent(tiny) -> None:
    parent = tiny.with_knobs(micro_batch_size=2)
    cand = parent.with_knobs(activation_checkpointing="none")
    verdict = evaluate(tiny, cand, history=[tiny, parent], parent=parent)
    assert verdict.admitted, verdict.render()
    assert verdict.changed_knobs == {"activation_checkpointing": ("full", "none")}
    assert verdict.owed == [] and verdict.semantics is Semantics.PRESERVING
    assert evaluate(tiny, cand).codes == ["multiple_groups"]  # relative to the baseline: two groups


def test_parent_cannot_launder_a_numerics_change(tiny) -> None:
    laundered = tiny.with_knobs(matmul_precision="high")
    cand = laundered.with_knobs(dataloader_workers=2)
    verdict = evaluate(tiny, cand, parent=laundered)
    assert "numerics_not_opted_in" in verdict.codes


def test_opt_in_is_read_from_the_baseline_not_the_candidate(tiny) -> None:
    data = apply_sets(base("tiny"), ["training.numerics_opt_in=[tf32]", "matmul_precision=high"])
    verdict = evaluate(tiny, data)
    assert set(verdict.codes) == {"opt_in_changed", "numerics_not_opted_in"}


def test_invalid_dict_reports_every_problem(tiny) -> None:
    data = apply_sets(base("tiny"), ["micro_batch_size=3", "foo=1", "training.optimizer.lr=2e-4"])
    verdict = evaluate(tiny, data)
    assert sorted(verdict.codes) == ["contract", "illegal_value", "multiple_groups", "unknown_knob"]
    data = apply_sets(base("tiny"), ["training.seq_length=-1", "model.layers=zero"])
    verdict = evaluate(tiny, data)
    assert {r.field for r in verdict.reasons} == {"training.seq_length", "model.layers"}
    assert all("got" in r.message for r in verdict.reasons)


def test_non_mapping_candidate_is_refused(tiny) -> None:
    verdict = evaluate(tiny, ["not", "a", "recipe"])  # type: ignore[arg-type]
    assert verdict.codes == ["invalid_recipe"]


def test_recipe_and_dict_candidates_agree(tiny) -> None:
    as_recipe = evaluate(tiny, tiny.with_knobs(compile_mode="default"))
    as_dict = evaluate(tiny, apply_sets(base("tiny"), ["compile_mode=default"]))
    assert as_recipe == as_dict


def test_contract_reason_names_both_values_and_the_fix(tiny) -> None:
    verdict = evaluate(tiny, apply_sets(base("tiny"), ["training.global_batch_size=16"]))
    msg = verdict.reasons[0].message
    assert "8" in msg and "16" in msg and "restore" in msg and "micro_batch_size" in msg


def test_effective_contract_includes_derived_quantities() -> None:
    mc = parse_recipe(base("megatron"))
    contract = effective_contract(mc)
    assert contract["model.padded_vocab_size"] == 128256
    assert contract["training.tokens_per_step"] == 64 * 4096
    assert "training.numerics_opt_in" not in contract
    assert effective_contract(mc.with_knobs(tensor_model_parallel_size=4))["model.padded_vocab_size"] == 128512


def test_enforce_raises_with_every_reason(tiny) -> None:
    with pytest.raises(GateRefusal, match="training.optimizer.lr"):
        enforce(tiny, apply_sets(base("tiny"), ["training.optimizer.lr=1e-3"]))
    assert enforce(tiny, tiny.with_knobs(dataloader_workers=1)).admitted


def test_verdict_json_round_trips_and_is_frozen(tiny) -> None:
    verdict = evaluate(tiny, apply_sets(base("tiny"), ["micro_batch_size=2", "training.seed=3"]))
    again = Verdict.model_validate_json(verdict.to_json())
    assert again == verdict
    doc = json.loads(verdict.to_json())
    assert doc["admitted"] is False and doc["changed_knobs"] == {"micro_batch_size": [1, 2]}
    assert doc["reasons"][0]["code"] == "contract"
    with pytest.raises((AttributeError, TypeError, ValueError)):  # frozen, whichever way the model refuses
        verdict.admitted = True  # type: ignore[misc]


def test_render_fits_one_screen(tiny) -> None:
    sets = [f"training.optimizer.{k}={v}" for k, v in (("lr", 1), ("eps", 1), ("weight_decay", 1))]
    sets += ["training.seed=9", "training.steps=9", "training.seq_length=128", "training.dropout=0.2",
             "model.layers=2", "model.hidden_size=128", "model.ffn_hidden_size=128", "model.vocab_size=100",
             "training.data.seed=1", "training.schedule.warmup_steps=1", "foo=1"]
    verdict = evaluate(tiny, apply_sets(base("tiny"), sets))
    text = verdict.render()
    assert len(verdict.reasons) > 12
    assert text.startswith("REFUSED") and "more (use --json" in text and len(text.splitlines()) < 25
