"""What a trial hands the reference trainer: the recipe, how many steps to run, and where to write.

The local backend writes one ``TrialSpec`` as JSON and launches
``torchrun ... -m attune.trainer.train --spec SPEC.json``. The trainer writes, per rank,
``OUT_DIR/rank{R}.jsonl`` with one JSON object per line:

- ``{"event": "start", "rank", "world", "threads", "params", "accum", "micro_batch_size", "device", ...}``
- ``{"event": "step", "step", "loss", "grad_norm", "lr", "step_time_s", "tokens", "phases": {...},
  "peak_mem_mb"}`` — ``phases`` holds seconds for forward, backward, optimizer, data, comm where measured;
  ``loss`` is the global-batch mean loss (identical on every rank), ``tokens`` the global tokens of the step.
- ``{"event": "error", "kind": "oom"|"diverged"|"crash", "message"}`` before a non-zero exit
- ``{"event": "done", "steps"}`` after the last step

Exit codes: 0 success, 3 out of memory, 4 diverged (non-finite loss), anything else a crash.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from attune.recipe.model import Recipe

EXIT_OOM = 3
EXIT_DIVERGED = 4

#: test-only fault injection, read by the trainer: "oom@STEP", "hang@STEP", "crash@STEP", "nan@STEP", "finish@STEP"
#: (exit 0 before STEP, as a script with a short max_steps of its own does)
FAULT_ENV = "ATTUNE_TRAINER_FAULT"

#: simulated storage latency, read by the trainer: milliseconds each micro-batch read waits (a data-bound job for
#: demos and tests; the wait is a sleep, so its share of a step does not move with CPU load). Unset or 0: none.
READ_LATENCY_ENV = "ATTUNE_TRAINER_READ_LATENCY_MS"


def read_latency_s(environ: dict[str, str]) -> float:
    """Seconds each micro-batch read waits, from ``ATTUNE_TRAINER_READ_LATENCY_MS`` (a finite number ≥ 0)."""
    raw = environ.get(READ_LATENCY_ENV, "").strip()
    if not raw:
        return 0.0
    try:
        ms = float(raw)
    except ValueError:
        ms = -1.0
    if not 0 <= ms <= 60_000:
        raise ValueError(f"{READ_LATENCY_ENV}={raw!r}: expected milliseconds between 0 and 60000")
    return ms / 1000


class TrialSpec(BaseModel):
    """One trial for the reference trainer: the recipe, the steps to run, and where records and metrics go."""

    model_config = ConfigDict(extra="forbid")

    recipe: Recipe
    max_steps: int = Field(gt=0, description="optimizer steps this process runs (the first of the schedule)")
    out_dir: str = Field(description="directory for rank{R}.jsonl")
    metrics_port: int | None = Field(default=None, description="if set, rank R serves Prometheus on port+R")
    device: str = Field(default="auto", description="auto, cpu or cuda")
    metrics_linger_s: float = Field(
        default=30.0, ge=0, le=600,
        description="with metrics_port: after the last step, wait at most this long for a scrape of the final "
                    "metrics (default: two 15 s scrape intervals)")
