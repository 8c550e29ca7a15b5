from __future__ import annotations

import json
import re

from typer.testing import CliRunner

from attune import api
from attune.cli import _mount_optional, app

runner = CliRunner()
_mount_optional()


def test_tune_maps_options_to_api(monkeypatch, tmp_path):
    seen = {}

    def fake_tune(recipe, **kw):
        seen.update(kw, recipe=recipe)
        raise api.AttuneError("stop here")

    monkeypatch.setattr(api, "tune", fake_tune)
    res = runner.invoke(app, ["tune", "r.yaml", "--budget", "0.5", "--policy", "random", "--out", str(tmp_path),
                              "--seed", "7", "--max-trials", "3"])
    assert res.exit_code == 2 and "stop here" in res.output
    assert seen["budget_hours"] == 0.5 and seen["policy"] == "random" and seen["seed"] == 7
    assert seen["max_trials"] == 3 and str(seen["recipe"]) == "r.yaml"


def test_tune_requires_budget_for_a_new_run(tmp_path):
    res = runner.invoke(app, ["tune", "examples/tiny-gpt-cpu.yaml", "--out", str(tmp_path / "x")])
    assert res.exit_code == 2 and "--budget" in res.output


def test_resume_of_a_non_run_directory_is_a_clear_error(tmp_path):
    res = runner.invoke(app, ["tune", "--resume", str(tmp_path)])
    assert res.exit_code == 2 and "no journal" in res.output


def test_knobs_json_lists_the_catalogue():
    res = runner.invoke(app, ["knobs", "--json"])
    assert res.exit_code == 0
    names = {k["name"] for k in json.loads(res.output)}
    assert {"micro_batch_size", "nproc_per_node", "activation_checkpointing"} <= names


def test_unknown_policy_and_backend_are_clear_errors(tmp_path):
    res = runner.invoke(app, ["tune", "examples/tiny-gpt-cpu.yaml", "--budget", "1", "--policy", "nope",
                              "--out", str(tmp_path / "a")])
    assert res.exit_code == 2 and "unknown policy 'nope'" in res.output
    res = runner.invoke(app, ["tune", "examples/tiny-gpt-cpu.yaml", "--budget", "1", "--backend", "nope",
                              "--out", str(tmp_path / "b")])
    assert res.exit_code == 2 and "unknown backend 'nope'" in res.output


def test_resume_keeps_the_backend_and_policy_the_run_started_with(tmp_path):
    run = tmp_path / "run"
    res = runner.invoke(app, ["tune", "benchmarks/suite/02-llama3-8b-h100x8.yaml", "--backend", "sim",
                              "--policy", "random", "--budget", "1", "--out", str(run)])
    assert res.exit_code == 0, res.output
    first = len((run / "journal.jsonl").read_text().splitlines())
    res = runner.invoke(app, ["tune", "--resume", str(run), "--budget", "2"])
    assert res.exit_code == 0, res.output
    events = [json.loads(line) for line in (run / "journal.jsonl").read_text().splitlines()]
    resumed = [e["record"] for e in events[first:] if e["event"] == "trial_finished" and e["record"]["measurement"]]
    assert resumed and all(r["measurement"]["signals"].get("sm_active") for r in resumed)  # simulated trials
    assert events[0]["backend"] == "sim" and events[0]["policy"] == "random"
    sources = {e["record"]["source"] for e in events if e["event"] == "trial_finished"
               and e["record"]["kind"] == "candidate"}
    assert sources <= {"random"}, sources
    result = json.loads((run / "result.json").read_text())
    assert result["budget_hours"] == 2 and 1 < result["budget_used_hours"] <= 2


def test_the_summary_gives_each_kept_change_its_own_interval(tmp_path):
    res = runner.invoke(app, ["tune", "benchmarks/suite/02-llama3-8b-h100x8.yaml", "--backend", "sim",
                              "--budget", "8", "--out", str(tmp_path / "run")], terminal_width=200)
    assert res.exit_code == 0, res.output
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert result["best_changes"], "the simulated run keeps something"
    flat = " ".join(res.output.replace("│", " ").split())  # the table's rows, unwrapped
    rows = flat.count("when it was kept")
    assert rows >= 1 and len(re.findall(r"paired [+-][\d.]+% ± [\d.]+% over .*? when it was kept", flat)) == rows, flat


def _knobs_output(columns: int | None, terminal: bool) -> str:
    """``attune knobs`` as a user sees it: a real process, on an 80/140-column terminal or piped."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "NO_COLOR", "TERM", "COLUMNS")}
    if terminal:
        env.update(FORCE_COLOR="1", TERM="xterm-256color", COLUMNS=str(columns))
    out = subprocess.run([sys.executable, "-m", "attune", "knobs", "--framework", "torch"], env=env,
                         capture_output=True, text=True, timeout=120, check=True).stdout
    return re.sub(r"\x1b\[[0-9;]*m", "", out)


def test_the_knob_catalogue_reads_at_80_columns_on_a_wide_terminal_and_when_piped():
    from attune.recipe.catalogue import get_catalogue

    cat = get_catalogue("torch")
    description = cat.knobs["micro_batch_size"].description
    narrow = _knobs_output(80, terminal=True)
    assert max(len(line.rstrip()) for line in narrow.splitlines()) <= 80
    # prose wrapped at the terminal's width, not in a 15-character column: its first words on one line
    assert " ".join(description.split()[:8]) in narrow, narrow[:800]
    assert all(name in narrow for name in cat.knobs)
    wide = _knobs_output(140, terminal=True)
    assert max(len(line.rstrip()) for line in wide.splitlines()) <= 140 and "┃ knob" in wide
    piped = _knobs_output(None, terminal=False).splitlines()
    assert piped[0].split("\t") == ["knob", "values", "default", "semantics", "description"]
    rows = {line.split("\t")[0]: line.split("\t") for line in piped[1:]}
    assert set(rows) == set(cat.knobs) and all(len(r) == 5 for r in rows.values())
    assert rows["micro_batch_size"][4] == " ".join(description.split())  # whole, on one line: grep finds it
    assert "\x1b" not in "\n".join(piped) and "│" not in "\n".join(piped)
