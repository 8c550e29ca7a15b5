"""`attune runs`: past runs with status, best speedup and accelerator-hours."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from typer.testing import CliRunner

from attune.cli import _mount_optional, app

_mount_optional()
runner = CliRunner()


def test_runs_lists_finished_and_unfinished_runs(recorded_run: Path, tmp_path: Path):
    root = tmp_path / "runs"
    shutil.copytree(recorded_run, root / "done")
    shutil.copytree(recorded_run, root / "group" / "killed")
    journal = root / "group" / "killed" / "journal.jsonl"
    lines = [ln for ln in journal.read_text().splitlines() if '"run_finished"' not in ln]
    journal.write_text("\n".join(lines[:-3]) + "\n")  # killed mid-run, an hour ago: its journal has not moved since
    os.utime(journal, (journal.stat().st_atime - 3600, journal.stat().st_mtime - 3600))
    (root / "not-a-run").mkdir()
    res = runner.invoke(app, ["runs", str(root), "--json"])
    assert res.exit_code == 0, res.output
    rows = {Path(r["run"]).name: r for r in json.loads(res.output)}
    assert set(rows) == {"done", "killed"}
    done = rows["done"]
    result = json.loads((recorded_run / "result.json").read_text())
    assert done["status"] == "finished" and done["speedup"] == result["speedup"]
    assert done["hours"] == result["budget_used_hours"] and done["report"].endswith("report.html")
    assert rows["killed"]["status"] == "unfinished"
    res = runner.invoke(app, ["runs", str(root)])
    assert res.exit_code == 0 and "finished" in res.output and "unfinished" in res.output
    assert f"{result['speedup']:.3f}×" in res.output


def test_runs_in_an_empty_directory(tmp_path: Path):
    res = runner.invoke(app, ["runs", str(tmp_path)])
    assert res.exit_code == 0 and "no runs" in res.output


def test_runs_read_at_80_columns_and_when_piped(recorded_run: Path, tmp_path: Path):
    """A real process, as a user runs it: on an 80-column terminal, every field whole and no line wider; piped,
    one tab-separated line per run."""
    import re
    import subprocess
    import sys

    root = tmp_path / "runs"
    shutil.copytree(recorded_run, root / "a-long-directory-name-of-one-team" / "llama-3-8b-h100x8-seed-17")
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "NO_COLOR", "TERM", "COLUMNS")}
    cmd = [sys.executable, "-m", "attune", "runs", str(root)]
    term = subprocess.run(cmd, env={**env, "FORCE_COLOR": "1", "TERM": "xterm", "COLUMNS": "80"},
                          capture_output=True, text=True, timeout=120, check=True).stdout
    term = re.sub(r"\x1b\[[0-9;]*m", "", term)
    assert max(len(line.rstrip()) for line in term.splitlines()) <= 80
    assert "a-long-directory-name-of-one-team/llama-3-8b-h100x8-seed-17" in term  # the run's name whole
    result = json.loads((recorded_run / "result.json").read_text())
    assert f"speedup: {result['speedup']:.3f}×" in term and "status: finished" in term
    piped = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, check=True).stdout.splitlines()
    assert piped[0].split("\t")[:3] == ["run", "backend", "status"] and len(piped) == 2
    fields = piped[1].split("\t")
    assert len(fields) == 8 and fields[2] == "finished" and fields[4] == f"{result['speedup']:.3f}×"
