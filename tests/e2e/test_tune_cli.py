"""`attune tune` end to end with real torchrun trials: a kill mid-trial and a resume."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from attune.engine.journal import Journal
from attune.testing.factories import tiny_recipe_dict
from attune.testing.procs import processes_in, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.e2e]


def journal(run_dir: Path) -> list[dict]:
    return Journal(run_dir).read() if (run_dir / Journal.FILENAME).exists() else []




def test_kill_mid_trial_then_resume(tmp_path):
    d = tiny_recipe_dict(micro_batch_size=1, activation_checkpointing="full")
    d["tuning"] = {"search_space": ["micro_batch_size", "activation_checkpointing"], "warmup_steps": 1,
                   "measure_steps": 3, "baseline_repeats": 2, "certify_share": 0}  # resume is the subject here
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(d))
    run_dir = tmp_path / "run"
    # a relative run directory, as `make demo` uses (runs/NAME-TIME)
    cmd = [sys.executable, "-m", "attune", "tune", "recipe.yaml", "--budget", "0.2", "--out", "run",
           "--max-trials", "6"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path)
    try:
        # let two trials finish, then kill the tuner (not its trial) in the middle of trial 3
        wait_for(lambda: any(e["event"] == "trial_started" and e["trial"] == 3 for e in journal(run_dir)), 240,
                 "trial 3 to start")
        wait_for(lambda: (run_dir / "trials" / "0003" / "rank0.jsonl").exists(), 120, "trial 3 to train")
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    before = journal(run_dir)
    finished = {e["record"]["id"]: e["record"] for e in before if e["event"] == "trial_finished"}
    assert sorted(finished) == [1, 2]
    # the trial dies with its tuner: nothing is left to run past its deadline until someone resumes
    wait_for(lambda: not processes_in(run_dir), 20, "the killed tuner's trial to end")

    res = subprocess.run([sys.executable, "-m", "attune", "tune", "--resume", "run"],
                         capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    after = journal(run_dir)
    starts = [e["trial"] for e in after if e["event"] == "trial_started"]
    assert starts.count(1) == 1 and starts.count(2) == 1, "finished trials must not run again"
    records = {e["record"]["id"]: e["record"] for e in after if e["event"] == "trial_finished"}
    for tid, rec in finished.items():
        assert records[tid]["charged_hours"] == rec["charged_hours"]
    assert records[3]["outcome"] == "interrupted" and records[3]["charged_hours"] > 0
    result = json.loads((run_dir / "result.json").read_text())
    assert result["budget_used_hours"] == pytest.approx(sum(r["charged_hours"] for r in records.values()))
    assert result["trials_launched"] >= 4
    assert not processes_in(run_dir), "no trainer process may outlive the run"
    assert (run_dir / "best-recipe.yaml").exists() and (run_dir / "report.md").exists()


def test_two_tuners_on_one_run_directory(tmp_path):
    """A second `attune tune --resume` on a live run is refused and names the holder; the live trial survives."""
    d = tiny_recipe_dict(micro_batch_size=1)
    d["tuning"] = {"search_space": ["micro_batch_size"], "warmup_steps": 1, "measure_steps": 3,
                   "baseline_repeats": 2, "certify_share": 0}
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(d))
    run_dir = tmp_path / "run"
    first = subprocess.Popen([sys.executable, "-m", "attune", "tune", "recipe.yaml", "--budget", "1", "--out",
                              "run", "--max-trials", "3"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             cwd=tmp_path)
    try:
        wait_for(lambda: (run_dir / "trials" / "0001" / "rank0.jsonl").exists(), 240, "trial 1 to train")
        second = subprocess.run([sys.executable, "-m", "attune", "tune", "--resume", "run"], capture_output=True,
                                text=True, timeout=120, cwd=tmp_path)
        assert second.returncode != 0
        flat = " ".join(second.stderr.split())  # rich wraps long messages
        assert "in use by another tuner" in flat and f"pid {first.pid}" in flat
        assert "Traceback" not in second.stderr
        assert first.wait(timeout=600) == 0
    finally:
        if first.poll() is None:
            first.kill()
    events = journal(run_dir)
    starts = [e["trial"] for e in events if e["event"] == "trial_started"]
    assert len(starts) == len(set(starts)), "trial ids must never repeat"
    # --max-trials ends the run, not the budget (0.05 h cut a trial's deadline on a loaded CI machine: interrupted)
    interrupted = [e["record"] for e in events if e["event"] == "trial_finished"
                   and e["record"]["outcome"] == "interrupted"]
    assert not interrupted, [r["message"] for r in interrupted]
