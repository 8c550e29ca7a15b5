"""Per-step records from Megatron-LM, Megatron-Bridge and NeMo 2 output (one parser reads all three).

Lines read (formats from the sources named; fixtures of real output in ``tests/frameworks/megatron/fixtures``):

- Megatron-LM / Bridge iteration line (``megatron/training/training.py``, Bridge ``training/utils/train_utils.py``):
  ``[2024-03-30 20:02:40] iteration 10/ 500000 | consumed samples: 1280 | elapsed time per iteration (ms): 9496.4 |
  throughput per GPU (TFLOP/s/GPU): 137.5 | learning rate: ... | global batch size: 128 | lm loss: 2.09E-01 |
  loss scale: 1.0 | grad norm: 51.010 | ... | number of skipped iterations: 0 | number of nan iterations: 0 |``.
  The throughput field needs ``--log-throughput``. With ``--log-interval N`` one line averages N iterations;
- memory reports: ``[Rank 0] (after 10 iterations) memory (MB) | allocated: ... | max allocated: 12003.6 | ...``
  (Megatron-LM) and ``... memory (GB) | ... | peak_allocated_mem: 11.7 | ...`` (Bridge 0.7);
- Bridge ``Step Time : 4.65s GPU utilization: 59892.5MODEL_TFLOP/s/GPU`` (model TFLOP/s, kept as a signal);
- NeMo 2 (``nemo/lightning`` progress printer): ``Training epoch 0, iteration 49/49 | lr: 7.496e-06 |
  global_batch_size: 128 | global_step: 49 | peak_memory_usage: 70833405952 | memory_allocated: 44271689728 |
  reduced_train_loss: 11.96 | train_step_timing in s: 12.39 | consumed_samples: 6400`` (some builds add
  ``TFLOPS_per_GPU`` / ``max_memory_reserved`` / ``tokens_per_sec_per_gpu``).

None of them prints tokens/s on every release, so tokens per step are **derived**: global batch × sequence length
(the launch's own, also printed as ``global batch size``), and throughput = tokens ÷ step time; each record says
so (``tokens_source: "global_batch×seq_length"``).

What the job reports about its contract (``reported``): Megatron-LM prints ``using world size: 8, data-parallel-size:
2, tensor-model-parallel size: 4, pipeline-model-parallel size: 1`` and then every argument it resolved
(``_print_args``: ``  global_batch_size ............................... 256``, the dots reaching column 48), so
the global and micro batch, sequence length, learning rates, seed, precision, clipping, weight decay, iteration or
sample count and the parallel sizes are read from the job itself (:data:`ARGUMENTS`). Bridge and NeMo 2 print no
such dump; their trials are checked by the recipe alone.

Failures: CUDA/host OOM and NCCL/gloo errors (:data:`~attune.frameworks.base.TORCH_SIGNATURES`); divergence when
a loss or grad norm is NaN/Inf, ``number of nan iterations`` is not 0, Megatron's ``found NaN in local grad norm``
assertion, or the rerun state machine's ``Unexpected result nan``.
"""

from __future__ import annotations

import ast
import math
import re
from typing import Any

from attune.frameworks.base import TORCH_SIGNATURES, LogParser, Signature
from attune.trial import FailureKind

VERSIONS = {"megatron-lm": ">=0.12,<0.21", "megatron-bridge": ">=0.1,<0.8", "nemo2": ">=2.0,<3"}

SIGNATURES = (
    *TORCH_SIGNATURES,
    Signature(r"found NaN in local grad norm|Rerun.*(NaN|nan|Inf)|Unexpected result (nan|inf)|loss is NaN|"
              r"lm loss: (nan|inf|-inf)\b|grad norm: (nan|inf)\b|reduced_train_loss: (nan|inf)\b|"
              r"number of nan iterations:\s*[1-9]", FailureKind.DIVERGED, "loss or gradient became NaN/Inf"),
)

_ITER = re.compile(r"\biteration\s+(\d+)/\s*(\d+)\s*\|")
_NEMO = re.compile(r"Training epoch\s+\d+,\s*iteration\s+(\d+)/(\d+)\s*\|")
_FIELD = re.compile(r"\|?\s*([A-Za-z][A-Za-z0-9 _/().-]*?)\s*:\s*([-+0-9.eE]+|nan|inf|-inf|NaN)\s*(?=\||$)")
_STEP_TIME = re.compile(r"Step Time\s*:\s*([0-9.]+)s\s+GPU utilization:\s*([0-9.]+)\s*(?:MODEL_)?TFLOP/s/GPU")
_MEM_MB = re.compile(r"memory \(MB\).*?\bmax allocated:\s*([0-9.]+)")
_MEM_GB = re.compile(r"memory \(GB\).*?\bpeak_allocated_mem:\s*([0-9.]+)")
#: one line of Megatron-LM's argument dump: two spaces, the name, dots to column 48, the value (a launcher may
#: prefix the rank, ``0: ``)
_ARG = re.compile(r"^(?:\[?\d+\]?:\s?)?  ([a-z_][a-z0-9_]*) (\.+) (.*?)\s*$")
#: the sizes of Megatron-LM's ``using world size: ...`` line (``validate_args`` in megatron/training/arguments.py: older
#: releases write ``data-parallel-size: 1, tensor-model-parallel size: 1, ...``, newer ones ``data-parallel size: 1,
#: context-parallel size: 1, hierarchical context-parallel sizes: None`` (no comma) ``tensor-model-parallel size: 4,
#: encoder-tensor-model-parallel size: 0, ...``)
_WORLD_LINE = re.compile(r"\busing world size: (\d+),")
_SIZES = {"data_parallel_size": re.compile(r"\bdata-parallel[- ]size: (\d+)"),
          "context_parallel_size": re.compile(r"(?<!hierarchical )\bcontext-parallel size: (\d+)"),
          "tensor_model_parallel_size": re.compile(r"(?<!encoder-)tensor-model-parallel size: (\d+)"),
          "pipeline_model_parallel_size": re.compile(r"(?<!encoder-)pipeline-model-parallel size: (\d+)")}
#: the arguments read from the dump (the contract and the parallel layout)
ARGUMENTS = ("global_batch_size", "micro_batch_size", "seq_length", "lr", "min_lr", "seed", "fp16", "bf16",
             "clip_grad", "weight_decay", "train_iters", "train_samples", "tensor_model_parallel_size",
             "pipeline_model_parallel_size", "context_parallel_size", "data_parallel_size", "world_size")
_DONE = re.compile(r"\[after training is done\]|`Trainer\.fit` stopped|exiting program at iteration")


def _num(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return math.nan


class MegatronLogParser(LogParser):
    """Step records of one Megatron-family trial from rank-last/rank-0 output."""

    signatures = SIGNATURES

    def __init__(self, *, global_batch: int, seq_length: int) -> None:
        super().__init__()
        self.global_batch = global_batch
        self.seq_length = seq_length
        self._pending_mem_mb: float | None = None
        self._pending_tflops: float | None = None
        self._seen: set[int] = set()

    def _arguments(self, line: str) -> bool:
        """Record a line of Megatron-LM's argument dump or its world-size line in ``reported``; True if it was."""
        m = _ARG.match(line)
        if m and len(m.group(1)) + len(m.group(2)) == 48:
            if m.group(1) in ARGUMENTS and m.group(3) != "None":
                try:
                    value = ast.literal_eval(m.group(3))
                except (ValueError, SyntaxError, MemoryError, RecursionError):
                    value = m.group(3)
                if isinstance(value, (bool, int, float, str)):
                    self.reported.setdefault(m.group(1), value)
            return True
        w = _WORLD_LINE.search(line)
        if w:
            self.reported.setdefault("world_size", int(w.group(1)))
            for name, pattern in _SIZES.items():
                size = pattern.search(line, w.end())
                if size:
                    self.reported.setdefault(name, int(size.group(1)))
            return True
        return False

    def parse_line(self, line: str, t: float) -> None:
        if self._arguments(line):
            return
        if _DONE.search(line):
            self.done = True
        m = _MEM_MB.search(line) or _MEM_GB.search(line)
        if m:
            mb = float(m.group(1)) * (1024.0 if "(GB)" in line else 1.0)
            if self.steps:
                self.steps[-1]["peak_mem_mb"] = max(mb, self.steps[-1].get("peak_mem_mb") or 0.0)
            else:
                self._pending_mem_mb = mb
            return
        st = _STEP_TIME.search(line)
        if st:
            self._pending_tflops = float(st.group(2))
            return
        nemo = _NEMO.search(line)
        it = None if nemo else _ITER.search(line)
        if not it and not nemo:
            return
        fields = {k.strip().lower(): v for k, v in _FIELD.findall(line[(it or nemo).end() - 1:])}  # type: ignore[union-attr]
        if it:
            step = int(it.group(1))
            ms = fields.get("elapsed time per iteration (ms)")
            if ms is None:
                return
            step_time = _num(ms) / 1000.0
            loss = fields.get("lm loss", fields.get("loss"))
            gbs = int(_num(fields.get("global batch size", str(self.global_batch))))
            rec: dict[str, Any] = {"step": step, "step_time_s": step_time,
                                   "loss": _num(loss) if loss is not None else math.nan,
                                   "grad_norm": _num(fields["grad norm"]) if "grad norm" in fields else None,
                                   "tflops_per_gpu": _num(fields["throughput per gpu (tflop/s/gpu)"])
                                   if "throughput per gpu (tflop/s/gpu)" in fields else self._pending_tflops,
                                   "nan_iterations": int(_num(fields.get("number of nan iterations", "0")) or 0)}
        else:
            assert nemo is not None
            step = int(fields["global_step"]) if "global_step" in fields else int(nemo.group(1))
            timing = next((v for k, v in fields.items() if k.startswith("train_step_timing")), None)
            if timing is None:
                return
            step_time = _num(timing)
            gbs = int(_num(fields.get("global_batch_size", str(self.global_batch))))
            peak = fields.get("peak_memory_usage") or fields.get("max_memory_reserved")
            rec = {"step": step, "step_time_s": step_time,
                   "loss": _num(fields.get("reduced_train_loss", "nan")), "grad_norm": None,
                   "tflops_per_gpu": _num(fields["tflops_per_gpu"]) if "tflops_per_gpu" in fields else None}
            if peak is not None:
                rec["peak_mem_mb"] = _num(peak) / 2**20
        if step in self._seen:
            return  # the same iteration printed again (several ranks, or a log pipe that tees)
        self._seen.add(step)
        rec["tokens"] = gbs * self.seq_length
        rec["tokens_source"] = "global_batch×seq_length"
        rec["learning_rate"] = _num(fields["learning rate"]) if "learning rate" in fields else (
            _num(fields["lr"]) if "lr" in fields else None)
        rec.setdefault("peak_mem_mb", self._pending_mem_mb)
        rec["phases"] = {}
        self._pending_mem_mb = None
        self._pending_tflops = None
        if not math.isfinite(rec["loss"]) and not math.isnan(rec["loss"]):
            rec["loss"] = math.nan
        self.steps.append(rec)


__all__ = ["ARGUMENTS", "SIGNATURES", "VERSIONS", "MegatronLogParser"]
