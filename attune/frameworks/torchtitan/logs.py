"""Per-step records from torchtitan's output.

The line (``torchtitan/components/metrics.py`` ``MetricsProcessor.log``, identical at v0.2.2 and main @ b5bcd76;
colour codes unless ``metrics.disable_color_printing``; torchrun adds ``[rank0]:`` with ``--tee``)::

    [rank0]:[titan] 2025-10-15 10:37:07,957 - root - INFO - step: 10  loss: 10.2391  grad_norm: 16.1413  memory: 44.84GiB(47.19%)  tps: 5,615  tflops: 325.20  mfu: 32.88%

``tps`` is tokens per second **per device** over the last ``metrics.log_freq`` steps; older 0.1 logs have no
``grad_norm``/``tflops``/``mfu`` (``step:  2  loss:  8.1610  memory:  4.90GiB(6.20%)  tps: 13,785``), and ``mfu``
is ``N/A`` where the peak is unknown. Each record's step time is derived from ``tps``: tokens per step ÷ (tps ×
devices), where tokens per step is the job's global batch × sequence length (torchtitan does not print it);
``validate step:`` lines are skipped. Failures: CUDA/host OOM, NCCL/gloo (PyTorch's own messages) and a NaN/Inf
loss or grad norm.
"""

from __future__ import annotations

import math
import re
from typing import Any

from attune.frameworks.base import TORCH_SIGNATURES, LogParser, Signature
from attune.trial import FailureKind

VERSIONS = ">=0.1,<0.3"
SIGNATURES = (
    *TORCH_SIGNATURES,
    Signature(r"(?<!validate )step:\s*\d+\s+loss:\s*(nan|inf|-inf)\b|grad_norm:\s*(nan|inf)\b", FailureKind.DIVERGED,
              "loss or gradient norm became NaN/Inf"),
)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_STEP = re.compile(r"(?<!validate )\bstep:\s*(\d+)\s+loss:\s*(\S+)")
_FIELDS = {
    "grad_norm": re.compile(r"grad_norm:\s*(\S+)"),
    "memory": re.compile(r"memory:\s*([0-9.]+)\s*GiB\(([0-9.]+)%\)"),
    "tps": re.compile(r"tps:\s*([0-9,]+)"),
    "tflops": re.compile(r"tflops:\s*([0-9,.]+)"),
    "mfu": re.compile(r"mfu:\s*([0-9.]+)%"),
}


def _num(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return math.nan


class TorchtitanLogParser(LogParser):
    signatures = SIGNATURES

    def __init__(self, *, tokens_per_step: int, devices: int) -> None:
        super().__init__()
        self.tokens_per_step = tokens_per_step
        self.devices = max(1, devices)
        self._seen: set[int] = set()

    def parse_line(self, line: str, t: float) -> None:
        line = _ANSI.sub("", line)
        if "Training completed" in line:
            self.done = True
        m = _STEP.search(line)
        if not m:
            return
        step = int(m.group(1))
        if step in self._seen:
            return  # every rank logs the step (LOG_RANK=0,1,...)
        self._seen.add(step)
        rec: dict[str, Any] = {"step": step, "loss": _num(m.group(2)), "phases": {}, "tokens": self.tokens_per_step,
                               "tokens_source": "global_batch×seq_len"}
        g = _FIELDS["grad_norm"].search(line)
        rec["grad_norm"] = _num(g.group(1)) if g else None
        mem = _FIELDS["memory"].search(line)
        rec["peak_mem_mb"] = float(mem.group(1)) * 1024.0 if mem else None
        tps = _FIELDS["tps"].search(line)
        rec["tps_per_device"] = _num(tps.group(1)) if tps else None
        tf = _FIELDS["tflops"].search(line)
        rec["tflops_per_gpu"] = _num(tf.group(1)) if tf else None
        mfu = _FIELDS["mfu"].search(line)
        rec["mfu"] = _num(mfu.group(1)) / 100.0 if mfu else None
        tpsd = rec["tps_per_device"]
        rec["step_time_s"] = self.tokens_per_step / (tpsd * self.devices) if tpsd else math.nan
        self.steps.append(rec)


__all__ = ["SIGNATURES", "VERSIONS", "TorchtitanLogParser"]
