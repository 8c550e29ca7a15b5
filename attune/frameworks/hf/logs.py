"""HF ``Trainer`` output → per-step records.

With ``logging_steps=1`` the Trainer prints one Python-dict line per optimizer step (``PrinterCallback`` with
``disable_tqdm``; ``ProgressCallback`` writes the same dict through tqdm otherwise). transformers 5 formats
floats as ``.4g`` strings; 4.x printed the numbers themselves, NaN as a bare ``nan``::

    {'loss': '6.265', 'grad_norm': '0.8155', 'learning_rate': '0.0005', 'epoch': '1.6e-05'}      # 5.x
    {'loss': 6.9561, 'grad_norm': 0.7412, 'learning_rate': 0.0008, 'epoch': 0.0}                # 4.x

With ``include_num_input_tokens_seen`` each step also carries ``num_input_tokens_seen`` (cumulative, summed over
processes) and, in 5.x, ``train_runtime`` (seconds since training started) and ``train_tokens_per_second``. What it
counts depends on the value (transformers 5.24 ``Trainer._track_num_input_tokens``; the values exist from 4.57):
``all`` (what ``True`` maps to) counts every element of ``input_ids``, padding included, so a larger per-device
batch padded to its longest sample "sees" more tokens for the same samples; ``non_padding`` sums the
``attention_mask`` (or counts the ids that are not the pad id), the same for the same samples whatever the
micro-batch shape. transformers 5.24's argument parser reads that flag as a bool on the command line (``str | bool``
becomes ``bool`` in ``HfArgumentParser._parse_dataclass_field``): only an args file (JSON/YAML, read with
``parse_dict``) can say ``non_padding``. TRL's ``SFTTrainer`` logs its own count of non-padding tokens,
``num_tokens`` (cumulative, summed over processes: the ``attention_mask`` of every micro-batch, trl 1.16
``SFTTrainer.compute_loss``). Which count a trial's steps are measured in: :class:`TokenUnit`.

The run ends with a summary dict (``train_runtime``, ``train_samples_per_second``, ``train_steps_per_second``,
``train_loss``), which sets ``done``.

At ``log_level info`` (trials ask for it) the Trainer states its contract before the first step (transformers
5.24, ``Trainer._inner_training_loop``)::

    [transformers] ***** Running training *****
    [transformers]   Instantaneous batch size per device = 2
    [transformers]   Total train batch size (w. parallel, distributed & accumulation) = 6
    [transformers]   Gradient Accumulation steps = 3
    [transformers]   Total optimization steps = 2
    [transformers]   Number of trainable parameters = 984,192

Those values go to ``reported`` (:data:`REPORTED`), so every trial is checked against what it really trains.
"""

from __future__ import annotations

import ast
import math
import re
import time
from enum import Enum
from typing import Any

from attune.frameworks.base import TORCH_SIGNATURES, LogParser, Signature
from attune.trial import FailureKind

NAN_LOSS = Signature(r"""['"]loss['"]:\s*['"]?(nan|-?inf)['"]?\s*[,}]""", FailureKind.DIVERGED,
                     "loss became NaN or Inf")
HF_SIGNATURES = (*TORCH_SIGNATURES, NAN_LOSS)

#: the Trainer's start-up lines → ``reported`` names (values are integers, printed with thousands separators)
REPORTED = {
    "Instantaneous batch size per device": "per_device_train_batch_size",
    "Total train batch size (w. parallel, distributed & accumulation)": "total_train_batch_size",
    "Gradient Accumulation steps": "gradient_accumulation_steps",
    "Total optimization steps": "total_optimization_steps",
    "Number of trainable parameters": "trainable_parameters",
}
_REPORTED_LINE = re.compile(r"^(?:\[[^\]]*\]\s*)*\s*(" + "|".join(re.escape(k) for k in REPORTED) +
                            r")\s*=\s*([0-9][0-9,_]*)\s*$")

#: ``reported`` name of the unit a trial's per-step ``tokens`` are in (framework ``reported_contract``: a throughput
#: compares only with one in the same unit)
UNIT_KEY = "throughput_unit"


class TokenUnit(str, Enum):
    """What a trial's per-step ``tokens`` count. A speedup must count the same work on both sides: the non-padding
    tokens of a step's samples are the same whatever the per-device batch (the samples of an optimizer step do not
    depend on how they are split into micro-batches); the global batch is fixed by the contract."""

    NON_PADDING = "non-padding tokens"  #: a count of the tokens that are not padding (``num_tokens`` of TRL's SFT, or
    #: ``num_input_tokens_seen`` where the trial asked for ``non_padding``)
    BATCH_TOKENS = "global batch x tokens_per_sample"  #: the recipe's sample length times the global batch
    SAMPLES = "samples"  #: the global batch itself, where nothing says the sample length

    def __str__(self) -> str:
        return self.value


_BARE_NONFINITE = re.compile(r"(?<=[:\[,\s])(-?inf|nan)(?=\s*[,}\]])")


def parse_dict(line: str) -> dict[str, Any] | None:
    """The dict a log line prints (prefixes such as ``[rank0]:`` or tqdm's ``\\r`` ignored), else ``None``."""
    start, end = line.find("{"), line.rfind("}")
    if start < 0 or end <= start:
        return None
    text = _BARE_NONFINITE.sub(lambda m: repr(m.group(1)), line[start:end + 1])
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    return value if isinstance(value, dict) and all(isinstance(k, str) for k in value) else None


def number(value: Any) -> float | None:
    """A logged value as a float (HF 5 logs ``'6.956'``, 4.x ``6.956``); ``None`` if it is not a number."""
    if isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


class HFLogParser(LogParser):
    """Per-step records from the Trainer's per-step log dicts.

    - ``step``: 1, 2, ... in the order the dicts arrive (trials log every step);
    - ``step_time_s``: arrival time of this step's line minus the previous one's; the first step's is its
      ``train_runtime`` where logged, else its arrival minus ``t0`` (the parser's creation, or for pod logs the
      first line's time), so it includes start-up and belongs in the warm-up;
    - ``tokens``: with ``count_key`` (the log key of a cumulative non-padding token count: ``num_tokens`` for TRL's
      SFT, ``num_input_tokens_seen`` where the trial asked for ``non_padding``) the step's increase of it; otherwise,
      or as soon as one step lacks the count (then for every step of the trial), the global batch ×
      ``tokens_per_sample`` where the recipe knows the sample length, else the global batch itself (then "tokens"
      are samples: throughputs compare between trials of one recipe, nothing more). A count that includes padding
      (``include_num_input_tokens_seen True``) is never used. ``reported["throughput_unit"]`` says which unit
      (:class:`TokenUnit`);
    - ``loss``, ``grad_norm``, ``learning_rate`` as logged (floats; NaN stays NaN and is a ``diverged`` failure);
    - ``clock_s``: the step's ``train_runtime`` where HF logs one (5.x): the Trainer's own clock, against which
      arrival-timed steps are checked (:func:`attune.engine.measure.timing_fault`).
    """

    signatures = HF_SIGNATURES

    def __init__(self, *, global_batch: int, tokens_per_sample: int | None = None, t0: float | None = None,
                 count_key: str | None = None) -> None:
        super().__init__()
        self.global_batch = global_batch
        self.tokens_per_sample = tokens_per_sample
        self.count_key = count_key
        self.t0 = time.monotonic() if t0 is None else t0
        self._last_t: float | None = None
        self._last_seen: float | None = None
        self.summary: dict[str, Any] | None = None

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * (self.tokens_per_sample or 1)

    @property
    def fixed_unit(self) -> TokenUnit:
        """The unit of :attr:`tokens_per_step`."""
        return TokenUnit.BATCH_TOKENS if self.tokens_per_sample else TokenUnit.SAMPLES

    def parse_line(self, line: str, t: float) -> None:
        if not self.steps and "=" in line:
            m = _REPORTED_LINE.match(line.strip())
            if m is not None:
                self.reported[REPORTED[m.group(1)]] = int(m.group(2).replace(",", "").replace("_", ""))
                return
        d = parse_dict(line)
        if d is None:
            return
        if "loss" in d and ("learning_rate" in d or "grad_norm" in d or "epoch" in d):
            self._step(d, t)
        elif "train_runtime" in d and ("train_loss" in d or "train_steps_per_second" in d):
            self.summary = d
            self.done = True

    def _step(self, d: dict[str, Any], t: float) -> None:
        loss = number(d.get("loss"))
        runtime = number(d.get("train_runtime"))
        if self._last_t is None:
            step_time = runtime if runtime is not None and runtime > 0 else t - self.t0
        else:
            step_time = t - self._last_t
        self._last_t = t
        tokens = self._tokens(number(d.get(self.count_key)) if self.count_key else None)
        rec: dict[str, Any] = {"step": len(self.steps) + 1, "step_time_s": max(step_time, 0.0), "tokens": tokens,
                               "loss": loss if loss is not None else math.nan,
                               "grad_norm": number(d.get("grad_norm")),
                               "learning_rate": number(d.get("learning_rate"))}
        if runtime is not None:
            rec["clock_s"] = runtime  # the Trainer's own clock: a check on the arrival-timed step (engine.measure)
        self.steps.append(rec)
        if (loss is None or not math.isfinite(loss)) and "diverged" not in self._error_kinds:
            self._error_kinds.add("diverged")
            self.errors.append({"kind": FailureKind.DIVERGED,
                                "message": f"loss became {d.get('loss')!r} at step {rec['step']}"})

    def _tokens(self, seen: float | None) -> float:
        """This step's tokens, in the trial's one unit (``reported["throughput_unit"]``)."""
        counted: float | None = None
        if self.count_key and seen is not None:
            previous = self._last_seen or 0.0  # the first step of a fresh run: all seen so far is this step's
            counted = seen - previous if seen > previous else None
            self._last_seen = seen
        if counted is None and self.count_key:
            # a step without a count (the Trainer found no input ids to count): no step of this trial counts real
            # tokens, so none is compared in another unit than the rest
            self.count_key = None
            for rec in self.steps:
                rec["tokens"] = self.tokens_per_step
        self.reported[UNIT_KEY] = str(TokenUnit.NON_PADDING if self.count_key else self.fixed_unit)
        return counted if counted is not None else self.tokens_per_step


class PodLogParser(HFLogParser):
    """The same parser for pod logs, whose ``t`` is the kubelet's wall-clock stamp: ``t0`` is the first line's."""

    _first: float | None

    def feed(self, line: str, t: float) -> None:
        if self._first is None:
            self._first = t
            self.t0 = t
        super().feed(line, t)

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self._first = None


__all__ = ["HF_SIGNATURES", "NAN_LOSS", "REPORTED", "UNIT_KEY", "HFLogParser", "PodLogParser", "TokenUnit",
           "number", "parse_dict"]
