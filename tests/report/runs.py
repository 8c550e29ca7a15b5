"""Recorded runs for report, card and leaderboard tests: small, deterministic, and covering every trial fate.

:func:`scripted_run` tunes the tiny torch recipe on the FakeBackend with a scripted policy whose proposals
end every way a trial can: kept without a loss check, refused by the gate, out of memory, crashed, timed
out, rejected under the noise floor, and kept after a confirmation re-run, a calibration run and a
loss-equivalence check. The fake's loss curves get a small per-trial drift so the tolerance band is visible.
:func:`sim_run` tunes a benchmark-suite recipe on the simulator through ``attune tune`` (the CLI).
"""

from __future__ import annotations

import os
import random
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attune.backends.base import TrialRequest, TrialResult
from attune.engine.loop import RunState, TuneConfig, Tuner
from attune.engine.policy import Policy, PolicyContext, Stop
from attune.frameworks.torch.testing import fake_speed
from attune.recipe.change import Change
from attune.recipe.model import Recipe
from attune.report import write_outputs
from attune.testing.factories import tiny_recipe
from attune.testing.fakes import FakeBackend
from attune.trial import TrialOutcome

REPO = Path(__file__).resolve().parents[2]
SUITE = REPO / "benchmarks" / "suite"

#: the scripted proposals and what each should come to
SCRIPT: list[tuple[dict[str, Any], str]] = [
    ({"activation_checkpointing": "none"}, "kept"),
    ({"micro_batch_size": 3}, "gate"),
    ({"micro_batch_size": 8}, "oom"),
    ({"dataloader_workers": 2}, "crashed"),
    ({"dataloader_workers": 4}, "timed_out"),
    ({"dataloader_workers": 1}, "noise"),
    ({"nproc_per_node": 2}, "kept"),
]


def speed(recipe: Recipe) -> float | TrialOutcome:
    k = recipe.effective_knobs
    workers = int(k["dataloader_workers"])
    if workers == 2:
        return TrialOutcome.CRASHED
    if workers == 4:
        return TrialOutcome.TIMED_OUT
    return fake_speed(recipe)


@dataclass
class DriftingFake(FakeBackend):
    """The FakeBackend with per-trial rounding drift on its loss curve (seeded by the trial id): none at the first
    step (identical weights, the same samples), then a random walk of about what fp32 reordering shows on a CPU."""

    drift: float = 2e-6
    name: str = "fake"

    def run(self, recipe: Recipe, request: TrialRequest) -> TrialResult:
        res = super().run(recipe, request)
        if res.measurement is None:
            return res
        rng = random.Random(request.trial_id * 31 + 7)
        losses = [8.0 * (0.97 ** i) + rng.gauss(0, self.drift) * i ** 0.5 for i in range(request.steps)]
        m = res.measurement.model_copy(update={"losses": losses})
        return TrialResult(outcome=res.outcome, measurement=m, wall_s=res.wall_s, devices=res.devices,
                           charged_hours=res.charged_hours, message=res.message, extra=res.extra)


@dataclass
class Scripted(Policy):
    """Proposes :data:`SCRIPT` in order, then stops."""

    script: list[tuple[dict[str, Any], str]] = field(default_factory=lambda: list(SCRIPT))
    name: str = "scripted"

    def propose(self, ctx: PolicyContext) -> Change | Stop:
        done = sum(1 for r in ctx.records if r.kind == "candidate")
        if done >= len(self.script):
            return Stop("script finished")
        change, expect = self.script[done]
        return Change(set=change, rationale=f"scripted step {done + 1}: expect {expect}", source=self.name)


def scripted_run(run_dir: Path, *, backend_name: str = "fake") -> RunState:
    """Run the scripted tuning into ``run_dir`` and write its outputs (report included)."""
    recipe = tiny_recipe(micro_batch_size=1, activation_checkpointing="full")
    cfg = TuneConfig.from_recipe(recipe, 10.0)
    backend = DriftingFake(speed=speed, name=backend_name)
    state = Tuner(recipe, backend=backend, policy=Scripted(), config=cfg, run_dir=run_dir).run()
    write_outputs(state, run_dir)
    return state


def sim_run(run_dir: Path, recipe: str = "01-llama3.2-1b-h100x8.yaml", budget: str = "4.5",
            policy: str = "playbook", cwd: Path = REPO) -> Path:
    """``attune tune SUITE/recipe --backend sim`` through the CLI (in this process), as make openrecipes runs it."""
    from typer.testing import CliRunner

    from attune.cli import _mount_optional, app

    _mount_optional()
    if run_dir.exists():
        shutil.rmtree(run_dir)
    old = os.getcwd()
    os.chdir(cwd)
    argv_backup = list(sys.argv)
    try:
        args = ["tune", f"benchmarks/suite/{recipe}", "--backend", "sim", "--budget", budget, "--policy", policy,
                "--seed", "0", "--out", str(run_dir)]
        sys.argv = ["attune", *args]  # what environment.json records as the invocation
        res = CliRunner().invoke(app, args)
        assert res.exit_code == 0, res.output
    finally:
        sys.argv = argv_backup
        os.chdir(old)
    return run_dir
