"""Local trials: one ``torchrun`` process group of the reference trainer on this machine.

The launch is an argument list built from validated knob values, never a shell string. The whole
process group is killed on every exit path. The budget is charged ``devices × wall-clock`` from
launch to teardown, failed trials included.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from attune.backends.base import TrialBackend, TrialRequest, TrialResult
from attune.engine.budget import charge
from attune.engine.measure import summarise
from attune.engine.state import TrialOutcome
from attune.recipe.model import Recipe
from attune.trainer.config import EXIT_DIVERGED, EXIT_OOM, TrialSpec

log = logging.getLogger(__name__)

_OOM_MARKERS = ("OutOfMemoryError", "out of memory", "MemoryError", "can't allocate memory", "CUDA error: out of memory")


def read_records(trial_dir: Path, rank: int = 0) -> list[dict[str, Any]]:
    """Parsed JSONL records of one rank (a torn last line is skipped)."""
    path = trial_dir / f"rank{rank}.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def build_argv(recipe: Recipe, spec_path: Path, python: str = sys.executable) -> list[str]:
    """torchrun argument list for a trial. Only integers from validated knobs enter it."""
    nproc = int(recipe.knob("nproc_per_node"))
    return [
        python, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
        "-m", "attune.trainer.train", "--spec", str(spec_path),
    ]


def build_env(recipe: Recipe, trial_dir: Path, cache_dir: Path | None) -> dict[str, str]:
    env = dict(os.environ)
    for name, value in recipe.effective_knobs.items():
        if name.startswith("env.") and value not in (None, ""):
            env[name.removeprefix("env.")] = str(value)
    if not env.get("OMP_NUM_THREADS"):
        threads = int(recipe.knob("intra_op_threads")) or max(1, (os.cpu_count() or 1) // int(recipe.knob("nproc_per_node")))
        env["OMP_NUM_THREADS"] = str(threads)
    env["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir or trial_dir / "inductor-cache")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def classify(rc: int | None, timed_out: bool, records: list[dict[str, Any]], log_text: str, steps: int) -> tuple[TrialOutcome, str]:
    """Outcome of a finished process group, from its exit status, its records and its log."""
    errors = [r for r in records if r.get("event") == "error"]
    done = any(r.get("event") == "done" for r in records)
    n_steps = sum(1 for r in records if r.get("event") == "step")
    if timed_out:
        return TrialOutcome.TIMED_OUT, f"no result before the deadline (last step seen: {n_steps}/{steps})"
    if any(e.get("kind") == "oom" for e in errors) or rc == EXIT_OOM:
        return TrialOutcome.OOM, next((str(e.get("message", "")) for e in errors if e.get("kind") == "oom"), "out of memory")
    if any(e.get("kind") == "diverged" for e in errors) or rc == EXIT_DIVERGED:
        return TrialOutcome.DIVERGED, "loss became NaN or Inf"
    if rc == 0 and done and n_steps >= steps:
        return TrialOutcome.SUCCEEDED, ""
    if done and n_steps >= steps:
        # every step ran and was recorded; a rank then failed at shutdown (seen with gloo teardown)
        return TrialOutcome.SUCCEEDED, f"all {steps} steps completed, then the process group exited with {rc} at shutdown"
    if any(m in log_text for m in _OOM_MARKERS):
        return TrialOutcome.OOM, "out of memory (from the log)"
    tail = log_text.strip().splitlines()[-3:]
    return TrialOutcome.CRASHED, f"exit status {rc}: " + " | ".join(tail)


def kill_group(proc: subprocess.Popen[bytes], grace_s: float = 5.0) -> None:
    """SIGTERM the process group, then SIGKILL whatever is left after ``grace_s``."""
    try:
        pgid = os.getpgid(proc.pid)
    except ProcessLookupError:
        pgid = None
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if pgid is None:
            break
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            continue
        # the leader is gone; make sure no child survives it
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            break
    if proc.poll() is None:
        proc.kill()
        proc.wait()


class LocalBackend(TrialBackend):
    """Runs each trial as ``torchrun`` on this machine."""

    name = "local"

    def __init__(self, *, cache_dir: Path | None = None, metrics_port: int | None = None, python: str = sys.executable,
                 extra_env: dict[str, str] | None = None) -> None:
        self.cache_dir = cache_dir.resolve() if cache_dir else None
        self.metrics_port = metrics_port
        self.python = python
        self.extra_env = dict(extra_env or {})

    def release(self, trial_dir: Path) -> None:
        """Kill the process group a killed tuner left running for ``trial_dir``."""
        try:
            pgid = int((trial_dir / "pgid").read_text())
        except (OSError, ValueError):
            return
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(pgid, sig)
            except (ProcessLookupError, PermissionError):
                return
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                try:
                    os.killpg(pgid, 0)
                except ProcessLookupError:
                    return
                time.sleep(0.1)

    def run(self, recipe: Recipe, request: TrialRequest) -> TrialResult:
        trial_dir = request.trial_dir.resolve()  # the trainer runs inside it: every path it gets is absolute
        trial_dir.mkdir(parents=True, exist_ok=True)
        for old in trial_dir.glob("rank*.jsonl"):
            old.unlink()
        spec = TrialSpec(recipe=recipe, max_steps=request.steps, out_dir=str(trial_dir), metrics_port=self.metrics_port)
        spec_path = trial_dir / "spec.json"
        spec_path.write_text(spec.model_dump_json(indent=2))
        argv = build_argv(recipe, spec_path, self.python)
        env = {**build_env(recipe, trial_dir, self.cache_dir), **self.extra_env}
        devices = recipe.resources.devices
        log_path = trial_dir / "log.txt"
        timed_out = False
        t0 = time.monotonic()
        with log_path.open("wb") as log_file:
            proc = subprocess.Popen(argv, stdout=log_file, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True, cwd=trial_dir)
            (trial_dir / "pgid").write_text(str(proc.pid))
            try:
                proc.wait(timeout=request.timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                kill_group(proc)
        wall = time.monotonic() - t0
        records = read_records(trial_dir)
        log_text = log_path.read_text(errors="replace")
        outcome, message = classify(proc.returncode, timed_out, records, log_text, request.steps)
        measurement = None
        if outcome is TrialOutcome.SUCCEEDED:
            measurement = summarise([r for r in records if r.get("event") == "step"],
                                    warmup_steps=request.warmup_steps, devices=devices)
        elif outcome is TrialOutcome.DIVERGED:
            steps = [r for r in records if r.get("event") == "step"]
            measurement = summarise(steps, warmup_steps=0, devices=devices) if steps else None
        log.info("trial %s: %s in %.1fs %s", request.trial_id, outcome.value, wall, message)
        return TrialResult(outcome=outcome, measurement=measurement, wall_s=wall, devices=devices,
                           charged_hours=charge(devices, wall), message=message)
