"""Reading a ``command`` recipe's output: one step record per line that matches the declared step pattern.

Presets name the lines common scripts print:

- ``nanogpt``: karpathy/nanoGPT's ``train.py`` (``print(f"iter {iter_num}: loss {lossf:.4f}, time {dt*1000:.2f}ms,
  mfu {running_mfu*100:.2f}%")``), e.g. ``iter 12: loss 3.1234, time 41.57ms, mfu 0.01%``;
- ``step_loss``: the ``step 10 | loss 2.3100`` / ``step: 10, loss: 2.31`` lines of many hand-written and Accelerate
  loops (Accelerate itself prints no per-step line: its examples log through ``accelerator.print``);
- ``hf``: HuggingFace Trainer's per-step dicts (``{'loss': '6.265', 'grad_norm': ..., 'epoch': ...}``), for a script
  that wraps the Trainer behind its own command line.

A step's time is the script's own (a ``time_ms`` or ``time_s`` group) where the pattern has one, else the time
between the arrivals of two step lines. Tokens per step come from a ``tokens`` group, else from the declaration.
The script's own count (nanoGPT's ``tokens per iteration will be: N`` line, the first step line's ``tokens``) is
kept in ``reported``, for the framework to check against the count attune believes.
"""

from __future__ import annotations

import math
import re
from typing import Any

from attune.frameworks.base import TORCH_SIGNATURES, LogParser, Signature
from attune.trial import FailureKind

_NUM = r"[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|nan|inf)"
PRESETS: dict[str, str] = {
    "nanogpt": rf"\biter (?P<step>\d+): loss (?P<loss>{_NUM}), time (?P<time_ms>\d+(?:\.\d*)?)ms",
    "step_loss": rf"(?i)\bstep\b[\s:=#]*(?P<step>\d+)\b.*?\bloss\b[\s:=]*(?P<loss>{_NUM})",
    "hf": "",  # HF's dict lines (read by :func:`attune.frameworks.hf.logs.parse_dict`)
}
#: nanoGPT's line before its first iteration (``print(f"tokens per iteration will be: {tokens_per_iter:,}")``)
TOKENS_PER_ITERATION = re.compile(r"\btokens per iteration will be: (\d[\d,]*)")
NAN_LOSS = Signature(r"(?i)\bloss\b['\"]?[\s:=]*['\"]?(nan|[-+]?inf)\b", FailureKind.DIVERGED, "loss became NaN or Inf")


class StepLineParser(LogParser):
    """Step records from lines matching ``pattern`` (a preset's or the declaration's own)."""

    signatures = (*TORCH_SIGNATURES, NAN_LOSS)

    def __init__(self, pattern: str, *, tokens_per_step: int | None = None) -> None:
        super().__init__()
        self.hf = pattern == ""
        self.regex = re.compile(pattern) if pattern else None
        self.tokens_per_step = tokens_per_step
        self._last_t: float | None = None
        self._started: float | None = None

    def parse_line(self, line: str, t: float) -> None:
        if self._started is None:
            self._started = t
        count = TOKENS_PER_ITERATION.search(line)
        if count is not None:  # the script's own token count, checked against attune's (report_problems)
            self.reported["tokens_per_iteration"] = int(count.group(1).replace(",", ""))
            return
        fields = self._fields(line)
        if fields is None:
            return
        own = None
        if fields.get("time_ms") is not None:
            own = float(fields["time_ms"]) / 1000
        elif fields.get("time_s") is not None:
            own = float(fields["time_s"])
        since = self._last_t if self._last_t is not None else self._started
        self._last_t = t
        loss_text = fields.get("loss")
        loss = float(loss_text) if loss_text is not None else None
        if loss_text is not None and loss is not None and math.isfinite(loss):
            decimals = len(loss_text.partition(".")[2]) if "e" not in loss_text.lower() else None
            if decimals is not None:
                self.reported["loss_decimals"] = min(decimals, self.reported.get("loss_decimals", decimals))
        tokens = fields.get("tokens")
        if tokens is not None:
            self.reported.setdefault("tokens_per_step_line", int(float(tokens)))
        self.steps.append({
            "step": len(self.steps) + 1,
            "step_time_s": own if own is not None else max(t - since, 1e-9),
            "tokens": int(float(tokens)) if tokens is not None else self.tokens_per_step,
            "loss": loss, "grad_norm": None, "peak_mem_mb": None, "phases": {},
            "own_time": own is not None,  # timed by the script itself: true however its line arrived
        })

    def _fields(self, line: str) -> dict[str, Any] | None:
        if self.hf:
            from attune.frameworks.hf.logs import parse_dict

            d = parse_dict(line)
            if not d or "loss" not in d or ("train_runtime" in d and "train_loss" in d):
                if d and "train_loss" in d:
                    self.done = True
                return None
            return {"loss": str(d["loss"]), "tokens": None}
        assert self.regex is not None
        m = self.regex.search(line)
        return m.groupdict() if m else None


def step_pattern(preset: str | None, pattern: str | None) -> str:
    """The regular expression of a declaration's ``steps`` (a preset's, or its own pattern)."""
    return PRESETS[preset] if preset is not None else str(pattern)


__all__ = ["NAN_LOSS", "PRESETS", "TOKENS_PER_ITERATION", "StepLineParser", "step_pattern"]
