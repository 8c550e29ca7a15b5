"""The example's poor command tuned through the CLI with real CPU trials, rendered back, and checked: only knob
settings moved, and LightningCLI's own parser reads the same training contract from the tuned command."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from attune.testing.procs import processes_in
from tests.frameworks.lightning.helpers import EXAMPLE, POOR, lightning_config, lookup

pytestmark = pytest.mark.slow
#: the settings attune may move (the knobs and the accumulation it derives)
KNOB_FLAGS = {"--data.batch_size", "--trainer.accumulate_grad_batches", "--trainer.devices", "--data.num_workers"}
#: what LightningCLI reads as the training contract of the example
CONTRACT = ("seed_everything", "trainer.max_steps", "trainer.max_epochs", "trainer.precision",
            "trainer.gradient_clip_val", "model.learning_rate", "model.warmup_steps", "model.total_steps",
            "model.d_model", "model.n_layers", "data.seq_len", "data.seed", "data.samples")


def attune(*args: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "OMP_NUM_THREADS": "1",
           "ATTUNE_LESSONS": "off"}
    return subprocess.run([sys.executable, "-m", "attune", *args], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=timeout)


def flags(argv: list[str]) -> dict[str, str]:
    """``--name value`` / ``--name=value`` pairs of a command line (after the subcommand)."""
    out: dict[str, str] = {}
    rest = argv[argv.index("fit") + 1:]
    i = 0
    while i < len(rest):
        name, eq, value = rest[i].partition("=")
        if eq:
            out[name], i = value, i + 1
        else:
            out[name], i = rest[i + 1], i + 2
    return out


def test_the_poor_command_is_tuned_and_only_knobs_move(tmp_path):
    pytest.importorskip("lightning")
    work = tmp_path / "lightning-example"
    shutil.copytree(EXAMPLE, work, ignore=shutil.ignore_patterns("__pycache__", "run", "lightning_logs"))
    res = attune("tune", "--framework", "lightning", "--budget", "0.05", "--max-trials", "6", "--out", "run", "--",
                 *POOR, cwd=work)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    result = json.loads((work / "run" / "result.json").read_text())
    assert result["baseline_throughput"] > 0 and result["framework"] == "lightning"
    assert not [t for t in result["trials"] if t["outcome"] in ("crashed", "failed", "timed_out", "diverged")
                and "end of the budget" not in t["message"]], result["trials"]
    measured = [t for t in result["trials"] if t["outcome"] == "succeeded" and t["throughput"]]
    assert len(measured) >= 2

    rendered = attune("render", "run/best-recipe.yaml", "--json", cwd=work)
    assert rendered.returncode == 0, rendered.stderr
    launch = json.loads(rendered.stdout)
    argv = launch["argv"]
    assert argv[:argv.index("fit") + 1] == POOR[:POOR.index("fit") + 1]
    assert launch["files"] == {"config.yaml": (EXAMPLE / "config.yaml").read_text()}
    before, after = flags(POOR), flags(argv)
    moved = {f for f in set(before) | set(after) if before.get(f) != after.get(f)}
    assert moved <= KNOB_FLAGS, moved
    assert bool(moved) == bool(result["best_changes"])
    # LightningCLI's own reading of the tuned command: the same contract, the same global batch
    ours, theirs = lightning_config(POOR[2:], work), lightning_config(argv[2:], work)
    for key in CONTRACT:
        assert lookup(ours, key) == lookup(theirs, key), key

    def global_batch(c: dict) -> int:
        devices = lookup(c, "trainer.devices")
        return (lookup(c, "data.batch_size") * lookup(c, "trainer.accumulate_grad_batches")
                * (1 if devices == "auto" else int(devices)))

    assert global_batch(ours) == global_batch(theirs) == 32

    refused = attune("gate", "check", "run/best-recipe.yaml", "--set", "trainer.precision=bf16-mixed", cwd=work)
    assert refused.returncode == 1 and "trainer.precision" in refused.stdout
    refused = attune("gate", "check", "run/best-recipe.yaml", "--set", "model.learning_rate=2e-3", cwd=work)
    assert refused.returncode == 1 and "launch.args.model.learning_rate" in refused.stdout
    assert not processes_in(tmp_path), "no trial process may outlive the run"
