"""A held-out HF training script (tests/frameworks/hf/fixtures/unseen/, written independently of attune's examples)
tuned through the CLI with the exact command line its author uses: real trials of the author's own command."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from attune.testing.procs import processes_in

UNSEEN = Path(__file__).parent / "fixtures" / "unseen"
pytestmark = pytest.mark.slow


def attune(*args: str, cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "OMP_NUM_THREADS": "1",
           "ATTUNE_LESSONS": "off"}
    return subprocess.run([sys.executable, "-m", "attune", *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=timeout)


def test_the_authors_own_command_is_tuned_and_rendered_back(tmp_path):
    shutil.copy(UNSEEN / "pretrain_tiny_mistral.py", tmp_path)
    command = shlex.split((UNSEEN / "COMMAND.txt").read_text().strip())
    res = attune("tune", "--framework", "hf", "--budget", "0.08", "--max-trials", "6", "--out", "run", "--",
                 *command, cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    measured = [t for t in result["trials"] if t["outcome"] == "succeeded" and t["throughput"]]
    assert len(measured) >= 2 and result["baseline_throughput"] > 0
    # no trial failed; one stopped at the budget's end (its deadline cut so the run cannot overspend) is no failure
    assert not [t for t in result["trials"] if t["outcome"] in ("crashed", "failed", "timed_out")
                and "end of the budget" not in t["message"]], result["trials"]
    # the tuned recipe renders back to the author's command with only the kept settings changed
    rendered = attune("render", "run/best-recipe.yaml", "--json", cwd=tmp_path)
    assert rendered.returncode == 0, rendered.stderr
    argv = json.loads(rendered.stdout)["argv"]
    if not result["best_changes"]:
        assert argv == command
    else:
        # the launcher keeps its spelling; only its process count may change, and then to the kept value
        launcher = command[:command.index("pretrain_tiny_mistral.py")]
        expected = list(launcher)
        if "nproc_per_node" in result["best_changes"]:
            expected[launcher.index("--nproc_per_node") + 1] = str(result["best_changes"]["nproc_per_node"])
        assert argv[:len(launcher)] == expected, argv
        differing = {a for a in argv if a.startswith("--")} ^ {a for a in command if a.startswith("--")}
        assert differing <= {"--gradient_accumulation_steps", "--per_device_train_batch_size",
                             "--activation_checkpointing", "--gradient_checkpointing", "--dataloader_num_workers",
                             "--optim", "--torch_compile", "--ddp_bucket_cap_mb", "--dataloader_pin_memory",
                             "--ddp_find_unused_parameters"}
    # a contract setting in the author's own names is refused
    refused = attune("gate", "check", "run/best-recipe.yaml", "--set", "learning_rate=1e-3", cwd=tmp_path)
    assert refused.returncode == 1 and "learning_rate" in refused.stdout
    assert not processes_in(tmp_path), "no trial process may outlive the run"
