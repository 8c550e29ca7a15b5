"""Refusals that say why, in the user's words: a contract flag of the script, an undeclared flag, and a run that
measured nothing."""

from __future__ import annotations

import json

import yaml

from attune.recipe.io import recipe_to_dict
from tests.frameworks.command.helpers import POOR, attune_cli, nanoshape_copy, recipe


def _gate(path, *sets: str):
    args = [a for s in sets for a in ("--set", s)]
    return attune_cli("gate", "check", str(path), *args, cwd=path.parent)


def test_a_contract_flag_is_refused_as_the_scripts_contract_setting_with_its_real_value(tmp_path):
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe_to_dict(recipe([*POOR, "--learning_rate=6e-4"]))))
    res = _gate(path, "learning_rate=1e-3")
    assert res.returncode == 1, res.stdout + res.stderr
    assert "learning_rate is a contract setting of this script (it decides what the model learns): attune never " \
           "changes it" in res.stdout, res.stdout
    assert "6e-4" in res.stdout and "null" not in res.stdout, res.stdout


def test_a_contract_setting_a_config_file_holds_is_refused_with_the_files_value(tmp_path):
    work = nanoshape_copy(tmp_path)
    res = attune_cli("import", "--framework", "command", "--knobs", "knobs.yaml", "-o", "recipe.yaml", "--",
                     "python", "train.py", "config/accum1.py", "--batch_size=4", cwd=work)
    assert res.returncode == 0, res.stderr
    res = _gate(work / "recipe.yaml", "max_iters=100")
    assert res.returncode == 1 and "max_iters is a contract setting of this script" in res.stdout, res.stdout
    assert "2000" in res.stdout and "config/accum1.py" in res.stdout, res.stdout
    assert "null" not in res.stdout and "absent" not in res.stdout, res.stdout


def test_an_undeclared_flag_is_refused_saying_it_is_not_declared_and_why_that_matters(tmp_path):
    decl = yaml.safe_load((nanoshape_copy(tmp_path) / "knobs.yaml").read_text())
    decl["contract"] = ["--max_iters"]  # --learning_rate is neither a knob nor contract
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe_to_dict(recipe(POOR, decl=decl))))
    res = _gate(path, "learning_rate=1e-3")
    assert res.returncode == 1, res.stdout + res.stderr
    out = res.stdout
    assert "--learning_rate is not declared" in out and "changed from [" not in out, out
    assert "cannot know what it does to what the model learns" in out, out


def test_a_budget_that_pays_for_nothing_prints_no_speedup_and_no_zero_baseline(tmp_path):
    work = nanoshape_copy(tmp_path)
    res = attune_cli("import", "--framework", "command", "--knobs", "knobs.yaml", "-o", "recipe.yaml", "--",
                     "python", "train.py", "config/accum1.py", "--batch_size=4", cwd=work)
    assert res.returncode == 0, res.stderr
    res = attune_cli("tune", "recipe.yaml", "--budget", "1e-9", "--out", "run", cwd=work,
                     env={"COLUMNS": "200"})
    out = res.stdout + res.stderr
    assert "nothing was spent" in out
    assert "0.00×" not in out and "0 tokens/s" not in out, out
    assert "not measured" in out, out
    result = json.loads((work / "run" / "result.json").read_text())
    assert result["speedup"] is None and result["baseline_throughput"] is None
    report = (work / "run" / "report.md").read_text()
    assert "0.00×" not in report and "nothing was measured" in report, report


def test_a_run_that_kept_nothing_reports_exactly_one_times_its_measured_baseline():
    from attune.engine.loop import RunState, TuneConfig
    from attune.recipe.change import signature
    from attune.report.result import build_result, render_markdown
    from attune.testing.factories import tiny_recipe
    from attune.trial import Measurement, TrialKind, TrialOutcome, TrialRecord

    base = tiny_recipe(micro_batch_size=1)

    def run(i: int, kind: TrialKind, tps: float, mbs: int = 1) -> TrialRecord:
        r = base.with_knobs(micro_batch_size=mbs)
        m = Measurement(tokens_per_s_per_device=tps, tokens_per_s=tps, step_time_median_s=1.0, step_time_cv=0.02,
                        steps_measured=6)
        return TrialRecord(id=i, kind=kind, change=base.knob_changes(r.effective_knobs), knobs=dict(r.effective_knobs),
                           signature=signature(r), outcome=TrialOutcome.SUCCEEDED, measurement=m, charged_hours=0.01)

    # the baseline's runs differ by noise; the one candidate was not kept
    records = [run(1, TrialKind.BASELINE, 1000.0), run(2, TrialKind.BASELINE, 1040.0),
               run(3, TrialKind.CANDIDATE, 1010.0, mbs=2), run(4, TrialKind.REFERENCE, 980.0)]
    state = RunState(baseline=base, config=TuneConfig(budget_hours=1.0, search_space=("micro_batch_size",)),
                     records=records)
    result = build_result(state)
    assert result["baseline_throughput"] > 0 and result["speedup"] == 1.0 and result["search_speedup"] == 1.0
    assert "1.00× the baseline" in render_markdown(result)
