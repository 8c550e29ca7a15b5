"""A TRL SFT run tuned end to end through the CLI with real CPU trials: `attune tune --framework hf -- trl sft ...` on a
tiny local model and dataset (built offline), the best recipe rendered back to the user's `trl sft` command with only
knob flags changed, and a TRL contract change refused by the gate."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from attune.testing.procs import processes_in
from tests.frameworks.hf.trl_helpers import build_tiny_sft, example_command, offline_env

pytestmark = pytest.mark.slow

#: examples/trl/run.sh, a poor but common SFT launch: one sequence per step with accumulation 8; activation
#: checkpointing is on by TRL's default (``_BaseConfig``), which the launch does not mention
COMMAND = example_command()
#: flags a kept knob may change or add (the knobs' TrainingArguments flags, accelerate's process count)
KNOB_FLAGS = {"--per_device_train_batch_size", "--gradient_accumulation_steps", "--activation_checkpointing",
              "--gradient_checkpointing", "--dataloader_num_workers", "--optim", "--torch_compile",
              "--ddp_bucket_cap_mb", "--ddp_find_unused_parameters", "--dataloader_pin_memory", "--num_processes",
              "--multi_gpu"}


def attune(*args: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = {**offline_env(), "ATTUNE_LESSONS": "off"}
    return subprocess.run([sys.executable, "-m", "attune", *args], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=timeout)


def flag_values(argv: list[str]) -> dict[str, list[str]]:
    """``--flag`` → the tokens up to the next flag (argparse's reading of HfArgumentParser flags)."""
    out: dict[str, list[str]] = {}
    current: str | None = None
    for tok in argv[2:]:
        if tok.startswith("--"):
            current = tok
            out[current] = []
        elif current is not None:
            out[current].append(tok)
    return out


def test_a_trl_sft_run_is_tuned_and_rendered_back_with_its_contract(tmp_path):
    work = build_tiny_sft(tmp_path / "work")
    res = attune("tune", "--framework", "hf", "--budget", "0.05", "--max-trials", "6", "--out", "run", "--",
                 *COMMAND, cwd=work)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    result = json.loads((work / "run" / "result.json").read_text())
    assert result["baseline_throughput"] > 0
    measured = [t for t in result["trials"] if t["outcome"] == "succeeded" and t["throughput"]]
    assert len(measured) >= 2
    assert not [t for t in result["trials"] if t["outcome"] in ("crashed", "failed", "timed_out")
                and "end of the budget" not in t["message"]], result["trials"]
    # the best recipe renders back to the user's `trl sft` command: every other flag exactly as written
    rendered = attune("render", "run/best-recipe.yaml", "--json", cwd=work)
    assert rendered.returncode == 0, rendered.stderr
    argv = json.loads(rendered.stdout)["argv"]
    assert argv[:2] == ["trl", "sft"] and "--gradient_checkpointing" not in COMMAND
    mine, theirs = flag_values(COMMAND), flag_values(argv)
    for flag, values in mine.items():
        if flag not in KNOB_FLAGS:
            assert theirs.get(flag) == values, f"contract setting {flag} moved: {values} → {theirs.get(flag)}"
    assert set(theirs) - set(mine) <= KNOB_FLAGS, argv
    if not result["best_changes"]:
        assert argv == COMMAND
    else:
        # the global batch stays: per-device × accumulation × processes
        per, acc = int(theirs["--per_device_train_batch_size"][0]), int(theirs["--gradient_accumulation_steps"][0])
        procs = int(theirs.get("--num_processes", ["1"])[0])
        assert per * acc * procs == 8
    # a contract change in TRL's own name is refused
    refused = attune("gate", "check", "run/best-recipe.yaml", "--set", "packing=true", cwd=work)
    assert refused.returncode == 1 and "packing" in refused.stdout, refused.stdout + refused.stderr
    refused = attune("gate", "check", "run/best-recipe.yaml", "--set", "max_length=128", cwd=work)
    assert refused.returncode == 1 and "max_length" in refused.stdout
    assert not processes_in(work) and not processes_in(tmp_path), "no trial process may outlive the run"
