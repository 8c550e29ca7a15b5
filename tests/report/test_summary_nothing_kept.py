"""A run that kept nothing reports no speedup but 1.00×, however its baseline's runs disagree (issue 37, item 3: the
summary printed "speedup 0.40×" beside "nothing was kept: the baseline stays best", the baseline's mean resting on its
repeats alone and the best's on the repeats and the reference runs)."""

from __future__ import annotations

import re

import pytest
from rich.console import Console

from attune.cli import summary_table
from attune.engine.loop import RunState, TuneConfig
from attune.recipe.change import signature
from attune.report.result import build_result, render_markdown
from attune.testing.factories import tiny_recipe
from attune.trial import Decision, Measurement, TrialKind, TrialOutcome, TrialRecord

BASE = tiny_recipe(activation_checkpointing="full")


def _run(i: int, kind: TrialKind, tps: float, change: dict | None = None, **kw) -> TrialRecord:
    recipe = BASE.with_knobs(**(change or {}))
    m = Measurement(tokens_per_s_per_device=tps, tokens_per_s=2 * tps, step_time_median_s=256 / tps,
                    step_time_cv=0.02, steps_measured=3)
    return TrialRecord(id=i, kind=kind, change=dict(change or {}), knobs=recipe.effective_knobs,
                       signature=signature(recipe), outcome=TrialOutcome.SUCCEEDED, measurement=m,
                       charged_hours=0.01, **kw)


def _state(baselines: list[float], references: list[float]) -> RunState:
    """Baseline repeats, one candidate (a slowdown) decided on A-B-A pairs whose reference runs are of the baseline,
    nothing kept: the records a journal of the issue's run holds (its baseline runs recorded as measured)."""
    cfg = TuneConfig.from_recipe(BASE, 1.0, search_space=("activation_checkpointing",), loss_check=False)
    records = [_run(i + 1, TrialKind.BASELINE, x, decision="baseline run") for i, x in enumerate(baselines)]
    n = len(records)
    slow = {"activation_checkpointing": "none"}
    for j, ref in enumerate(references):
        records.append(_run(n + 1, TrialKind.CANDIDATE if j == 0 else TrialKind.CONFIRM, 160.0, slow,
                            status=Decision.PENDING_PAIR if j == 0 else Decision.REJECTED,
                            decision="rejected: paired -96.0%" if j else "pending"))
        records.append(_run(n + 2, TrialKind.REFERENCE, ref, decision="reference run of the best"))
        n += 2
    return RunState(baseline=BASE, config=cfg, records=records,
                    finished="policy stopped: every admissible move has been tried")


ISSUE = ([8_396_195.0, 4_030.0], [4_010.0, 3_990.0, 4_050.0])  # the issue's baseline runs, then its references
DISAGREEING = ([4_000.0, 9_000.0], [4_100.0])  # two runs 2.25× apart (inside the twin check's factor) and a reference


@pytest.mark.parametrize("baselines, references", [ISSUE, DISAGREEING])
def test_nothing_kept_reports_a_speedup_of_exactly_one_in_the_result_the_report_and_the_tune_summary(
        baselines, references):
    state = _state(baselines, references)
    assert state.best_record() is None
    res = build_result(state)
    assert res["speedup"] == 1.0 and res["search_speedup"] == 1.0 and res["certified"] is None
    assert res["best_throughput"] == res["baseline_throughput"]
    assert res["certification"].startswith("nothing was kept")

    md = render_markdown(res)
    assert re.findall(r"(\d+\.\d\d)×", md) == ["1.00"], md  # the search's estimate: 1.00× the baseline, nothing else

    console = Console(record=True, width=200)
    console.print(summary_table(res))
    text = console.export_text()
    speedup_line = next(line for line in text.splitlines() if "speedup" in line)
    assert "1.00×" in speedup_line and "nothing was kept" in speedup_line, text
    assert re.findall(r"(\d+\.\d\d)×", text) == ["1.00"], text


def test_the_baseline_is_summarised_by_the_decisions_estimator_not_an_arithmetic_mean():
    """The baseline's figure is the geometric mean of its runs (the mean log throughput its paired decisions and
    certification compare), over every run of it: its repeats and the reference runs made of it."""
    state = _state([4_000.0, 9_000.0], [4_100.0])
    expected = (4_000.0 * 9_000.0 * 4_100.0) ** (1 / 3)
    assert state.baseline_throughput() == pytest.approx(expected)
    assert state.baseline_throughput() < (4_000.0 + 9_000.0 + 4_100.0) / 3
