"""DeepSpeed output → per-step records (formats of deepspeed 0.19.8; ``fixtures/README.md`` has real excerpts).

With ``steps_per_print: 1`` and ``log_level: "info"`` (what a trial sets) rank 0 logs, per optimizer step::

    [2026-12-01 10:14:16,848] [INFO] [logging.py:123:log_dist] [Rank 0] step=3, skipped=0, lr=[0.000119], mom=[(0.9, 0.95)]
    [2026-12-01 10:14:16,848] [INFO] [timer.py:264:stop] epoch=0/micro_step=12/global_step=3, RunningAvgSamplesPerSec=24.3, CurrSamplesPerSec=24.3, MemAllocated=0.43GB, MaxMemAllocated=0.43GB

The throughput line starts at the third step (DeepSpeed's ``ThroughputTimer`` skips two). With
``wall_clock_breakdown: true`` it also prints ``[Rank 0] time (ms) | fwd: 165.24 | bwd: 507.01 | ... | step: 9.94``
per step (and ``..._microstep`` lines per micro-batch). DeepSpeed prints no loss: the loss comes from the script's
own lines (``step 12 loss 6.41``, ``loss: 6.41``, ``loss=6.41``, ``'loss': 6.41``): the one that names the step, else
the first after the step's line.

- ``step``: 1, 2, ... for each ``step=N`` line (``step=0``, printed at start-up, is skipped);
- ``step_time_s``: ``train_batch_size / CurrSamplesPerSec`` where DeepSpeed prints it (its own timer of that step's
  micro-batches), else the arrival time of the step's line minus the previous one's (the first step: minus the
  parser's creation, so it includes start-up and belongs in the warm-up);
- ``tokens``: train_batch_size × tokens per sample where the recipe knows the sample length, else the samples;
- ``phases``: the ``time (ms)`` breakdown in seconds as diagnosis reads it (``fwd`` → forward, ``bwd_inner`` →
  backward, ``bwd_allreduce`` → dp_comm, ``step`` → optimizer; all of it in ``ds_timers_s``); ``skipped`` (DeepSpeed's
  count of skipped steps), ``wall_s`` (arrival-time delta) and ``ds_samples_per_s`` ride along;
- ``reported``: what DeepSpeed itself resolved, from the ``DeepSpeedEngine configuration:`` dump it prints at
  start-up (``[config.py:678:print]   train_batch_size ............. 16``): the batch triple and world size, the
  gradient clipping, fp16/bf16 enabled, the optimizer's name and learning rate and the scheduler's name
  (:data:`CONFIG_REPORTED`), checked against the recipe and the baseline's run;
- failures: out of memory, NCCL/gloo errors, a NaN/Inf loss, and fp16 loss scaling that hit its minimum
  (``Current loss scale already at minimum``) or three optimizer steps in a row skipped for overflowing gradients
  (``skipped=`` growing; bf16 logs ``OVERFLOW! Skipping step. Gradients are non-finite``), all ``diverged``; a single
  skipped step is normal fp16 start-up (the loss scale settles) and is only counted.
"""

from __future__ import annotations

import ast
import math
import re
import time
from collections.abc import Callable
from typing import Any

from attune.frameworks.base import TORCH_SIGNATURES, LogParser, Signature
from attune.frameworks.hf.logs import HF_SIGNATURES, HFLogParser
from attune.trial import FailureKind

SCALE_AT_MINIMUM = Signature(r"Current loss scale already at minimum|cannot decrease scale anymore",
                             FailureKind.DIVERGED, "fp16 loss scale hit its minimum (gradients keep overflowing)")
DS_SIGNATURES = (*TORCH_SIGNATURES, SCALE_AT_MINIMUM,
                 Signature(r"DeepSpeedConfigError|Check batch related parameters", FailureKind.CRASH,
                           "DeepSpeed config refused"))

STEP = re.compile(r"\bstep=(\d+), skipped=(\d+), lr=\[([^\]]*)\]")
THROUGHPUT = re.compile(r"global_step=(\d+), RunningAvgSamplesPerSec=([-\w.+]+), CurrSamplesPerSec=([-\w.+]+)"
                        r"(?:, MemAllocated=([\d.]+)GB, MaxMemAllocated=([\d.]+)GB)?")
TIMERS = re.compile(r"time \(ms\) \| (.*)$")
LOSS = re.compile(r"""(?<![\w.])['"]?loss['"]?\s*[:=]?\s*['"]?(-?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+)|-?inf|nan)\b""",
                  re.IGNORECASE)
OVERFLOW = re.compile(r"OVERFLOW! .*Skipping step")
STEP_NUMBER = re.compile(r"\bstep\b\D{0,3}(\d+)", re.IGNORECASE)
#: consecutive skipped optimizer steps (overflowing gradients) that count as divergence: fp16's dynamic loss scaling
#: skips a step or two while it settles; three in a row, or any run under bf16/fp32's static scale, is not settling
SKIPPED_IN_A_ROW = 3
#: DeepSpeed's global timers (``wall_clock_breakdown``) → the phases diagnosis reads (``bwd`` = inner + allreduce)
PHASES = {"fwd": "forward", "bwd_inner": "backward", "bwd_allreduce": "dp_comm", "step": "optimizer"}


#: one line of DeepSpeed's config dump (``DeepSpeedConfig.print``: ``"  {name} {dots} {value}"``, dots to column 29)
CONFIG_LINE = re.compile(r"\[config\.py:\d+:print\]\s+(\w+)\s+(?:\.+\s+)?(.*?)\s*$")
ENABLED = re.compile(r"\benabled=(True|False)\b")


def _literal(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return text


def _enabled(text: str) -> bool | None:
    m = ENABLED.search(text)
    return None if m is None else m.group(1) == "True"


def _lr(text: str) -> Any:
    params = _literal(text)
    return params.get("lr") if isinstance(params, dict) else None


#: the config dump's entries → ``reported`` names and how each value is read
CONFIG_REPORTED: dict[str, tuple[str, Callable[[str], Any]]] = {
    "train_batch_size": ("train_batch_size", _literal),
    "train_micro_batch_size_per_gpu": ("train_micro_batch_size_per_gpu", _literal),
    "gradient_accumulation_steps": ("gradient_accumulation_steps", _literal),
    "world_size": ("world_size", _literal),
    "gradient_clipping": ("gradient_clipping", _literal),
    "float16_config": ("fp16_enabled", _enabled),
    "bfloat16_config": ("bf16_enabled", _enabled),
    "optimizer_name": ("optimizer_name", str),
    "optimizer_params": ("optimizer_lr", _lr),
    "scheduler_name": ("scheduler_name", str),
}


def read_config_line(line: str, reported: dict[str, Any]) -> bool:
    """Record one line of DeepSpeed's start-up config dump in ``reported`` (the first dump wins); True when the
    line was one."""
    if "print]" not in line:
        return False
    m = CONFIG_LINE.search(line)
    if m is None:
        return False
    entry = CONFIG_REPORTED.get(m.group(1))
    if entry is not None:
        name, read = entry
        value = read(m.group(2))
        if value is not None:
            reported.setdefault(name, value)
    return True


def _float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


class DeepSpeedLogParser(LogParser):
    """Per-step records from DeepSpeed's own step and throughput lines plus the script's loss lines.

    A step's record is published (appended to ``steps``) once its loss has arrived, or when the next step begins
    (a script that prints no loss that step): the trial is ended on the count of published steps, so the last
    measured step keeps its loss. A loss line that names its step (``step 12 loss 6.41``) goes to that step."""

    signatures = DS_SIGNATURES

    def __init__(self, *, train_batch: int, tokens_per_sample: int | None = None, t0: float | None = None) -> None:
        super().__init__()
        self.train_batch = train_batch
        self.tokens_per_sample = tokens_per_sample
        self.t0 = time.monotonic() if t0 is None else t0
        self._last_t: float | None = None
        self.overflows = 0
        self._by_step: dict[int, dict[str, Any]] = {}
        self._pending: dict[str, Any] | None = None
        self._held_timers: dict[str, float] = {}
        self._skipped = 0  # DeepSpeed's count of skipped steps so far
        self._skip_run = 0  # consecutive steps it skipped

    @property
    def tokens_per_step(self) -> int:
        return self.train_batch * (self.tokens_per_sample or 1)

    def flush(self) -> None:
        """Publish a step still waiting for its loss (at the end of the output)."""
        if self._pending is not None:
            self._publish(self._pending)

    def _publish(self, rec: dict[str, Any]) -> None:
        if rec is self._pending:
            self._pending = None
        rec["step"] = len(self.steps) + 1
        self.steps.append(rec)

    def parse_line(self, line: str, t: float) -> None:
        if read_config_line(line, self.reported):
            return
        m = STEP.search(line)
        if m:
            self._step(int(m.group(1)), int(m.group(2)), m.group(3), t)
            return
        m = THROUGHPUT.search(line)
        if m:
            rec = self._by_step.get(int(m.group(1)))
            curr = _float(m.group(3))
            if rec is not None and curr is not None and curr > 0 and math.isfinite(curr):
                rec["step_time_s"] = self.train_batch / curr
                rec["ds_samples_per_s"] = curr
                if m.group(5):
                    rec["peak_mem_mb"] = float(m.group(5)) * 1024
            return
        m = TIMERS.search(line)
        if m:
            timers = {}
            for part in m.group(1).split("|"):
                name, _, value = part.partition(":")
                v = _float(value.strip())
                if v is not None and name.strip():
                    timers[name.strip()] = v / 1000.0
            if timers and not any(k.endswith("_microstep") for k in timers):
                if self._pending is None:  # ZeRO's optimizer timers print before their step's line
                    self._held_timers.update(timers)
                else:
                    self._pending["ds_timers_s"].update(timers)
                    self._pending["phases"].update({PHASES[k]: v for k, v in timers.items() if k in PHASES})
            return
        target = self._pending or (self.steps[-1] if self.steps else None)
        if OVERFLOW.search(line):
            self.overflows += 1
            return
        if "[Rank" in line or "] [INFO]" in line or "] [WARNING]" in line:
            return  # DeepSpeed's own lines carry no loss
        m = LOSS.search(line)
        if m is None or target is None:
            return
        named = STEP_NUMBER.search(line[:m.start()])
        if named and int(named.group(1)) in self._by_step:
            target = self._by_step[int(named.group(1))]
        loss = float(m.group(1))
        target["loss"] = loss
        if target is self._pending:
            self._publish(target)
        if not math.isfinite(loss) and FailureKind.DIVERGED not in self._error_kinds:
            self._error_kinds.add(FailureKind.DIVERGED)
            self.errors.append({"kind": FailureKind.DIVERGED,
                                "message": f"loss became {m.group(1)} at step {target['step']}"})

    def _step(self, n: int, skipped: int, lr: str, t: float) -> None:
        if n <= 0 or n in self._by_step:
            return
        self.flush()
        self._skip_run = self._skip_run + 1 if skipped > self._skipped else 0
        self._skipped = skipped
        if self._skip_run >= SKIPPED_IN_A_ROW and FailureKind.DIVERGED not in self._error_kinds:
            self._error_kinds.add(FailureKind.DIVERGED)
            self.errors.append({"kind": FailureKind.DIVERGED,
                                "message": f"DeepSpeed skipped {self._skip_run} optimizer steps in a "
                                f"row up to step {n} (gradients non-finite: the weights are not being updated)"})
        wall = t - (self._last_t if self._last_t is not None else self.t0)
        self._last_t = t
        first_lr = _float(lr.split(",")[0].strip()) if lr.strip() else None
        rec: dict[str, Any] = {"step": len(self.steps) + 1, "step_time_s": max(wall, 0.0),
                               "tokens": self.tokens_per_step, "loss": math.nan, "grad_norm": None,
                               "learning_rate": first_lr, "phases": {}, "wall_s": max(wall, 0.0), "skipped": skipped,
                               "ds_timers_s": dict(self._held_timers)}
        self._held_timers = {}
        self._by_step[n] = rec
        self._pending = rec


class HFDeepSpeedLogParser(HFLogParser):
    """An HF Trainer run under DeepSpeed: the Trainer's per-step dicts, plus DeepSpeed's failure signatures."""

    signatures = (*HF_SIGNATURES, SCALE_AT_MINIMUM)

    def parse_line(self, line: str, t: float) -> None:
        if not read_config_line(line, self.reported):
            super().parse_line(line, t)


__all__ = ["CONFIG_REPORTED", "DS_SIGNATURES", "PHASES", "SCALE_AT_MINIMUM", "SKIPPED_IN_A_ROW", "DeepSpeedLogParser",
           "HFDeepSpeedLogParser", "read_config_line"]
