"""Calibration of the simulator against NVIDIA-published throughputs."""

from __future__ import annotations

import math

from pydantic import ValidationError

from attune.recipe.model import Recipe
from attune.sim import simulate
from attune.sim.calibration import ROWS, calibrate, median_abs_error

NEIGHBOURS = {
    "tensor_model_parallel_size": (1, 2, 4, 8),
    "pipeline_model_parallel_size": (1, 2, 4, 8, 16),
    "micro_batch_size": (1, 2, 4),
    "context_parallel_size": (1, 2, 4),
}


def _neighbour_recipes(row) -> list[tuple[str, Recipe]]:
    cur = {"tensor_model_parallel_size": row.tp, "pipeline_model_parallel_size": row.pp,
           "micro_batch_size": row.mbs, "context_parallel_size": row.cp}
    out = []
    for knob, vals in NEIGHBOURS.items():
        i = vals.index(cur[knob])
        for j in (i - 1, i + 1):
            if 0 <= j < len(vals):
                for extra in ({}, {"virtual_pipeline_model_parallel_size": None}):
                    try:
                        out.append((f"{knob}={vals[j]}", row.recipe(**{knob: vals[j]}, **extra)))
                        break
                    except ValidationError:  # invalid layout: not a neighbour
                        continue
    return out


def test_all_rows_valid_and_fit():
    results = calibrate()
    assert len(results) == len(ROWS) >= 15
    for r in results:
        assert r.predicted.outcome == "succeeded", (r.row.name, r.predicted.message)
        assert math.isfinite(r.error)


def test_median_absolute_error_under_15_percent():
    results = calibrate()
    assert median_abs_error(results) < 0.15
    assert sum(abs(r.error) < 0.30 for r in results) >= 0.85 * len(results)


def test_fp8_over_bf16_speedup_in_published_range():
    by_name = {r.row.name: r for r in calibrate()}
    for model in ("llama3-8b", "llama3-405b", "nemotron4-15b", "nemotron4-340b"):
        bf, f8 = by_name[f"{model}-bf16-h100"], by_name[f"{model}-fp8-h100"]
        ratio = f8.predicted.tokens_per_s_per_device / bf.predicted.tokens_per_s_per_device
        assert 1.15 < ratio < 1.75, (model, ratio)


def test_published_setting_beats_most_neighbours():
    """The published layout should beat its TP±/PP±/MBS±/CP± neighbours (ranking fidelity)."""
    wins = total = 0
    for row in ROWS:
        if row.accelerator != "h100-sxm-80gb":
            continue
        base = simulate(row.recipe()).tokens_per_s_per_device
        for _, rec in _neighbour_recipes(row):
            total += 1
            wins += simulate(rec).tokens_per_s_per_device <= base * 1.01
    assert total >= 30
    assert wins / total >= 0.85, (wins, total)


def test_calibrate_command_reports_every_row():
    import json

    from typer.testing import CliRunner

    from attune.cli import _mount_optional, app

    _mount_optional()
    res = CliRunner().invoke(app, ["calibrate", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert len(doc["rows"]) >= 12 and doc["median_abs_error"] < 0.15
    assert all(r["published"] > 0 and r["predicted"] > 0 for r in doc["rows"])
