"""Lightning trial output → per-step records.

Lightning itself prints nothing per step that a program can read (its progress bar redraws one line with ``\\r``
and shows only what the model chose to ``self.log``; loggers write files, flushed every N steps), so a trial adds a
Lightning callback of attune's own (:mod:`attune.frameworks.lightning.probe`, through LightningCLI's
``--trainer.callbacks+=``): the trainer's own hook, reading what the trainer did. Each rank prints one JSON line per
optimizer step::

    attune-lightning {"event": "step", "step": 3, "rank": 0, "world": 2, "loss": 5.61, "samples": 8, "tokens": 512}

and rank 0 a ``start`` line with the layout and contract the Trainer really runs, and an ``end`` line. A step whose ``training_step`` returned no loss (manual optimization returning None) is a ``crash``
failure naming the fix: without the loss no change can be checked for loss equivalence.

A step's record is complete when every rank's line for it has arrived; its time is that arrival's minus the
previous step's (the first step's: minus the parser's start, so it holds start-up and belongs in the warm-up). Its
loss is the mean over ranks of each rank's mean micro-batch loss (equal shards: the global batch's mean loss, so a
re-split job's losses compare with the baseline's), at full float precision. Its tokens: the samples of all ranks ×
the recipe's ``tokens_per_sample`` where the recipe states it, else the token ids the probe counted (2-D integer
batches), else the samples.

Lightning's own lines count too: ```Trainer.fit` stopped: ...`` means the run finished (done), as does the probe's
``end``; a NaN loss (the probe's, or ``detect_anomaly``'s "returned nan values", or ``EarlyStopping``'s "is not
finite") is a ``diverged`` failure; OOM, NCCL and gloo errors are PyTorch's (:data:`TORCH_SIGNATURES`).
"""

from __future__ import annotations

import json
import math
import time
from typing import Any

from attune.frameworks.base import TORCH_SIGNATURES, LogParser, Signature
from attune.trial import FailureKind

PREFIX = "attune-lightning "
LIGHTNING_SIGNATURES = (
    *TORCH_SIGNATURES,
    Signature(r"returned nan values in its \d+th output", FailureKind.DIVERGED,
              "NaN in the backward pass (detect_anomaly)"),
    Signature(r"Monitored metric \S+ = (nan|-?inf) is not finite", FailureKind.DIVERGED,
              "a monitored metric became NaN or Inf"),
)
DONE = "`Trainer.fit` stopped:"
#: the probe's ``start`` fields that go to ``reported`` as they are
_START_FIELDS = ("batch_size", "accumulate_grad_batches", "world_size", "num_nodes", "devices", "precision",
                 "max_steps", "max_epochs", "estimated_stepping_batches", "trainable_parameters", "seed")


def probe_record(line: str) -> dict[str, Any] | None:
    """The probe's JSON of a line (a ``[rank: 1]`` prefix or other text before it ignored), else None."""
    at = line.find(PREFIX)
    if at < 0:
        return None
    try:
        value = json.loads(line[at + len(PREFIX):])
    except ValueError:
        return None
    return value if isinstance(value, dict) and isinstance(value.get("event"), str) else None


class LightningLogParser(LogParser):
    """Per-step records from the probe's lines (see the module docstring)."""

    signatures = LIGHTNING_SIGNATURES

    def __init__(self, *, tokens_per_sample: int | None = None, t0: float | None = None) -> None:
        super().__init__()
        self.tokens_per_sample = tokens_per_sample
        self.t0 = time.monotonic() if t0 is None else t0
        self._last_t: float | None = None
        self._pending: dict[int, dict[int, dict[str, Any]]] = {}

    def parse_line(self, line: str, t: float) -> None:
        if DONE in line:
            self.done = True
            return
        d = probe_record(line)
        if d is None:
            return
        event = d["event"]
        if event == "start":
            self._start(d)
        elif event == "end":
            self.done = True
        elif event == "step":
            self._rank_step(d, t)

    def _start(self, d: dict[str, Any]) -> None:
        for name in _START_FIELDS:
            value = d.get(name)
            if isinstance(value, float) and value == int(value):
                value = int(value)
            if isinstance(value, (bool, int, float, str)):
                self.reported[name] = value
        lrs = d.get("learning_rates")
        if isinstance(lrs, list) and lrs:
            self.reported["learning_rate"] = lrs[0] if len(lrs) == 1 and isinstance(lrs[0], (int, float)) \
                else ",".join(str(x) for x in lrs)
        layout = [d.get(k) for k in ("batch_size", "accumulate_grad_batches", "world_size")]
        if all(isinstance(x, int) and not isinstance(x, bool) for x in layout):
            self.reported["global_batch"] = math.prod(int(x) for x in layout if isinstance(x, int))

    def _rank_step(self, d: dict[str, Any], t: float) -> None:
        try:
            step, rank, world = int(d["step"]), int(d.get("rank", 0)), max(1, int(d.get("world", 1)))
        except (KeyError, TypeError, ValueError):
            return
        ranks = self._pending.setdefault(step, {})
        ranks[rank] = d
        if len(ranks) < world:
            return
        del self._pending[step]
        lines = list(ranks.values())
        losses = [_number(x.get("loss")) for x in lines]
        loss = sum(x if x is not None else math.nan for x in losses) / len(losses)
        if None in losses and FailureKind.CRASH not in self._error_kinds:
            self._error_kinds.add(FailureKind.CRASH)
            self.errors.append({"kind": FailureKind.CRASH, "message": (
                f"training_step returned no loss in optimizer step {step}: attune reads a step's loss from what "
                "training_step returns (automatic optimization); return the loss from training_step")})
        samples = sum(int(_number(x.get("samples")) or 0.0) for x in lines)
        counted = [c for c in (x.get("tokens") for x in lines) if isinstance(c, int) and c > 0]
        if self.tokens_per_sample:
            tokens: float = samples * self.tokens_per_sample
        elif len(counted) == len(lines):
            tokens = sum(counted)
        else:
            tokens = samples
        step_time = t - (self._last_t if self._last_t is not None else self.t0)
        self._last_t = t
        rec: dict[str, Any] = {"step": len(self.steps) + 1, "step_time_s": max(step_time, 0.0), "tokens": tokens,
                               "loss": loss, "grad_norm": None, "peak_mem_mb": None}
        self.steps.append(rec)
        if not self.steps[:-1]:
            self.reported["samples_per_step"] = samples
        if not math.isfinite(loss) and None not in losses and FailureKind.DIVERGED not in self._error_kinds:
            self._error_kinds.add(FailureKind.DIVERGED)
            self.errors.append({"kind": FailureKind.DIVERGED,
                                "message": f"loss became {loss} at step {rec['step']} (Lightning step {step})"})


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


__all__ = ["DONE", "LIGHTNING_SIGNATURES", "PREFIX", "LightningLogParser", "probe_record"]
