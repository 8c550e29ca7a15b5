"""benchmarks/scripts/decision_cost.py: when a run's kept recipe reached 0.95 and 0.98 of the optimum, read from its
anytime curve, and what it spent per kept change."""

from __future__ import annotations

import json
import sys
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[2] / "benchmarks" / "scripts"
sys.path.insert(0, str(SCRIPTS))

import decision_cost  # noqa: E402  (a script of the repository, not a package)


def _bench(curve, fraction, best, accepted=2, budget_hours=20.0):
    run = {"tuner": "attune", "budget": "15t", "recipe": "r", "seed": 0, "fraction_of_optimum": fraction,
           "best_tps": best, "curve": curve, "budget_hours": budget_hours, "budget_used_hours": 18.0,
           "accepted": accepted, "trials_launched": 12, "budget_left_fraction": 0.1}
    return {"cases": [{"name": "r", "trial_cost_hours": 2.0, "group": "headroom"}], "runs": [run]}


def test_the_first_point_at_each_fraction_is_read_in_trials_worth(tmp_path: Path, capsys) -> None:
    # optimum 100: 0.95 first reached after 6 h (3 trials' worth), 0.98 after 14 h (7)
    bench = _bench([[0.0, 50.0], [6.0, 96.0], [14.0, 99.0], [18.0, 99.0]], fraction=0.99, best=99.0)
    [row] = decision_cost.rows([bench], "attune")
    assert row["to_0.95"] == 3.0 and row["to_0.98"] == 7.0 and row["spent_trials"] == 9.0
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(bench))
    assert decision_cost.main([str(path)]) == 0
    out = capsys.readouterr().out
    assert "| 15t | all | 1 | 0.990 | 3.0 (1/1) | 7.0 (1/1) | 4.5 | 6.0 | 0 | 10% |" in out


def test_a_fraction_reached_only_past_the_budget_is_never(tmp_path: Path) -> None:
    bench = _bench([[0.0, 50.0], [25.0, 99.0]], fraction=0.99, best=99.0, budget_hours=20.0)
    [row] = decision_cost.rows([bench], "attune")
    assert row["to_0.95"] is None and row["to_0.98"] is None
    assert decision_cost.main([str(tmp_path / "missing.json")]) == 2
