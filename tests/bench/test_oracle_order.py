"""The oracle-ordered benchmark policy (benchmarks/scripts/oracle_order.py): it proposes only admissible moves that
truly gain, the one leading furthest first, and its run goes through the benchmark's own engine."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "benchmarks" / "scripts"
sys.path.insert(0, str(SCRIPTS))

import oracle_order  # noqa: E402  (a script of the repository, not a package)

from attune.bench.run import trial_cost_hours  # noqa: E402
from attune.bench.suite import load_suite  # noqa: E402
from attune.engine.policy import PolicyContext, Stop  # noqa: E402
from attune.gate import evaluate  # noqa: E402

NAME = "llama3.2-1b-h100x8"  # the smallest enumerated space of the suite (640 configurations)


@pytest.fixture(scope="module")
def parts():
    case = load_suite("suite", only=[NAME])[0]
    space, table = oracle_order.space_table(case.recipe)
    return case.recipe, space, table


def _ctx(recipe, hours: float) -> PolicyContext:
    def admissible(change):
        return bool(evaluate(recipe, recipe.with_knobs(**change), (), parent=recipe).admitted)

    return PolicyContext(baseline=recipe, best=recipe, best_measurement=None, records=(), search_space=[],
                         noise_floor=0.02, budget_left_hours=hours, admissible=admissible)


@pytest.mark.parametrize("goal", ["furthest", "fastest"])
def test_first_proposal_is_an_admissible_true_gain(parts, goal: str) -> None:
    recipe, space, table = parts
    policy = oracle_order.OracleOrder(recipe, space, table, recipe.tuning.min_gain, trial_cost_hours(recipe), goal)
    start = tuple(recipe.knob(k) for k in space)
    change = policy.propose(_ctx(recipe, 30 * trial_cost_hours(recipe)))
    assert not isinstance(change, Stop)
    cand = tuple(change.set.get(k, v) for k, v in zip(space, start, strict=True))
    assert table[cand] >= table[start] * (1 + recipe.tuning.min_gain)  # a true gain of at least min_gain
    children = policy.children(start)
    assert cand in children
    if goal == "fastest":
        assert table[cand] == max(table[c] for c in children)
    else:  # the move that leads furthest within the moves the budget pays for
        left = policy.moves_left(_ctx(recipe, 30 * trial_cost_hours(recipe)))
        assert policy.reach(cand, left - 1) == max(policy.reach(c, left - 1) for c in children)
        assert policy.reach(start, left) >= table[cand]


def test_a_run_and_its_report(parts) -> None:
    row = oracle_order.run_one((NAME, "8t", 0, "furthest"))
    assert row["recipe"] == NAME and 0 < row["fraction_of_optimum"] <= 1.0 + 1e-9
    text = oracle_order.report([row], ["8t"], {})
    assert "| 8t | oracle order |" in text and NAME in text
