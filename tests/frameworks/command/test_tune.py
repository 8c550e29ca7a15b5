"""The nanoGPT-style example (examples/nanogpt: a plain PyTorch loop, not attune's trainer) imported from its poor
launch script with its knob declaration and tuned through the CLI with real CPU trials: only declared knobs move,
every kept change passed the loss check, and the tuned command renders back in the script's own form."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from attune.testing.procs import processes_in
from tests.frameworks.command.helpers import cli_env, example_copy

pytestmark = pytest.mark.slow
DECLARED = {"batch_size", "compile", "threads"}


def attune(*args: str, cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "attune", *args], capture_output=True, text=True, cwd=cwd,
                          env=cli_env(), timeout=timeout)


def test_the_nanogpt_example_is_tuned_from_its_poor_command_and_rendered_back(tmp_path):
    work = example_copy(tmp_path)
    # each micro-batch read waits 25 ms (simulated slow storage): 32 reads a step at batch 1, 8 at batch 4, so the
    # batch move's gain does not depend on how busy the CPU is and the decision to keep it is never chance
    script = (work / "run.sh").read_text().replace("--max_iters=5000", "--max_iters=5000 --read_latency_ms=25")
    (work / "run.sh").write_text(script)
    res = attune("import", "--framework", "command", "--knobs", "knobs.yaml", "--script", "run.sh",
                 "--devices-per-node", "2", "--out", "recipe.yaml", cwd=work)
    assert res.returncode == 0, res.stderr
    recipe = yaml.safe_load((work / "recipe.yaml").read_text())
    exec_line = next(ln for ln in (work / "run.sh").read_text().splitlines() if ln.startswith("exec "))
    poor = shlex.split(exec_line)[1:]
    assert recipe["launch"]["argv"] == poor and recipe["launch"]["env"] == {"OMP_NUM_THREADS": "1"}
    assert recipe["knobs"] == {"batch_size": 1, "compile": False, "threads": "1"}

    res = attune("tune", "recipe.yaml", "--budget", "0.15", "--max-trials", "20", "--out", "run", cwd=work)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    result = json.loads((work / "run" / "result.json").read_text())
    trials = result["trials"]
    assert result["baseline_throughput"] > 0 and len([t for t in trials if t["kind"] == "baseline"]) >= 2
    assert not [t for t in trials if t["outcome"] in ("crashed", "failed", "timed_out")
                and "end of the budget" not in t["message"]], trials
    assert all(set(t["change"]) <= DECLARED for t in trials), "only declared knobs may move"
    # the batch split is kept (bigger GEMMs, fewer micro-steps), and only after its loss check passed
    kept = result["best_changes"]
    assert kept and set(kept) <= DECLARED and kept.get("batch_size", 1) > 1, result["best_changes"]
    accepted = [t for t in trials if t["accepted"] and t["change"]]
    assert accepted and all("loss curve equivalent" in t["decision"] for t in accepted), accepted
    assert result["best_throughput"] > result["baseline_throughput"]
    # the playbook proposed its moves from the diagnosis (py-spy stacks of the script) and the declared roles' rules
    first = next(t for t in trials if t["kind"] == "candidate")
    assert first["rationale"].startswith("diagnosis ") and "tier, expected" in first["rationale"], first

    # the tuned command: the user's own, with only the kept knobs' flags (and the derived accumulation) changed
    rendered = attune("render", "run/best-recipe.yaml", "--json", cwd=work)
    assert rendered.returncode == 0, rendered.stderr
    launch = json.loads(rendered.stdout)
    argv = launch["argv"]
    assert argv[:2] == poor[:2] and len(argv) == len(poor)
    moved = {a.split("=")[0] for a in set(argv) ^ set(poor)}
    assert moved <= {"--batch_size", "--gradient_accumulation_steps", "--compile"}, moved
    value = {a.split("=")[0]: a.split("=")[1] for a in argv[2:]}
    assert int(value["--batch_size"]) * int(value["--gradient_accumulation_steps"]) == 32  # the global batch stays
    assert value["--max_iters"] == "5000"  # contract
    assert launch["env"]["OMP_NUM_THREADS"] == str(kept.get("threads", "1"))

    # the gate refuses, on the tuned recipe, a contract flag in the script's own name and an undeclared flag
    refused = attune("gate", "check", "run/best-recipe.yaml", "--set", "learning_rate=1e-3", cwd=work)
    assert refused.returncode == 1 and "command.learning_rate" in refused.stdout
    refused = attune("gate", "check", "run/best-recipe.yaml", "--set", "eval_interval=10", cwd=work)
    assert refused.returncode == 1 and "launch.options" in refused.stdout
    assert not processes_in(tmp_path), "no trial process may outlive the run"


def test_a_real_trial_reads_the_scripts_own_lines(tmp_path):
    from attune.backends.base import TrialRequest
    from attune.backends.local import LocalBackend
    from attune.trial import TrialOutcome
    from tests.frameworks.command.helpers import POOR, recipe

    work = example_copy(tmp_path)
    r = recipe(POOR, work).with_knobs(batch_size=8)
    req = TrialRequest(trial_id=1, trial_dir=tmp_path / "trial", warmup_steps=1, measure_steps=3, timeout_s=120)
    res = LocalBackend(extra_env={"PATH": cli_env()["PATH"]}).run(r, req)
    assert res.outcome is TrialOutcome.SUCCEEDED, res.message
    m = res.measurement
    assert m.steps_measured == 3 and len(m.losses) == 4 and all(4.0 < x < 4.5 for x in m.losses)
    assert m.tokens_per_s == pytest.approx(32 * 64 / m.step_time_median_s)
    log = (tmp_path / "trial" / "log.txt").read_text()
    assert "--batch_size=8" in log or "Overriding: batch_size = 8" in log
    assert "Overriding: gradient_accumulation_steps = 4" in log  # derived: 8 × 4 = 32
    assert m.reported.get("loss_decimals") == 4
    assert not processes_in(tmp_path)
