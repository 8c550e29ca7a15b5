"""One loop: the benchmark measures the tuner users run. A simulated recipe tuned by `attune tune --backend sim`
(a real process, its journal on disk) and by the benchmark (in memory) with the same seed makes the same trials,
in the same order, with the same decisions and the same stop."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from attune.bench.oracle import oracle
from attune.bench.run import Job, make_tuner, parse_budget, tune_job
from attune.bench.suite import load_suite

ROOT = Path(__file__).resolve().parents[2]
SEED = 3


def _trial(r: dict) -> tuple:
    return (r["id"], r["kind"], r["signature"], r["outcome"], r["decision"], round(r["charged_hours"], 9),
            None if r.get("throughput") is None else round(r["throughput"], 6))


def test_attune_tune_on_the_simulator_and_the_benchmark_make_the_same_trials(tmp_path: Path) -> None:
    case = load_suite("suite", only=["llama3-8b-h100x8"])[0]
    hours = parse_budget("8t", case.recipe)
    # `attune tune --backend sim` draws the simulator's noise from stream 0; the benchmark, from the recipe and seed
    job = Job(case=case, tuner="attune", seed=SEED, budget_hours=hours,
              optimum_tps=oracle(case.recipe, tmp_path / "oracle").optimum_tps, budget="8t", noise_seed=0)
    policy, gate, _ = make_tuner("attune", SEED)
    state, _ = tune_job(job, policy, gate)
    benched = [_trial(r.model_dump(mode="json")) for r in state.records]

    out = tmp_path / "run"
    env = {**os.environ, "ATTUNE_LESSONS": "off", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "attune", "tune", str(case.path), "--backend", "sim",
                           "--budget", repr(hours), "--seed", str(SEED), "--out", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    events = [json.loads(line) for line in (out / "journal.jsonl").read_text().splitlines()]
    tuned = [_trial(e["record"]) for e in events if e["event"] == "trial_finished"]
    finished = [e["reason"] for e in events if e["event"] == "run_finished"]

    assert len(benched) >= 5, "too short a run to show anything"
    assert tuned == benched
    assert finished == [state.finished]
