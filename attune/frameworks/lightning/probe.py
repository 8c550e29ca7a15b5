"""The step probe of a Lightning trial: a Lightning ``Callback`` that prints one JSON line per optimizer step.

attune never imports this module: a trial writes a copy of this file into its own directory (as
``attune_lightning_probe.py``), puts that directory on ``PYTHONPATH`` and adds the callback to the launch with
LightningCLI's own list-append syntax, ``--trainer.callbacks+=attune_lightning_probe.AttuneStepProbe``. It runs in
the user's training interpreter, so it imports nothing of attune, only Lightning (the ``Callback`` of whichever of
``lightning.pytorch`` and ``pytorch_lightning`` the script already imported) and the standard library.

What it prints (prefix ``attune-lightning``, then JSON), every value read from the trainer itself:

- ``start`` (rank 0, ``on_train_start``): the layout and contract the Trainer really runs: batch size of its train
  data loader, ``accumulate_grad_batches``, world size, nodes, precision, ``max_steps``/``max_epochs``, the
  estimated optimizer steps of the run (what a schedule built from ``estimated_stepping_batches`` sees), trainable
  parameters, the global seed, the optimizers' initial learning rates;
- ``step`` (every rank, ``on_train_batch_end`` of the micro-batch that completed an optimizer step): the step, this
  rank's loss over the step's micro-batches (the mean of what ``training_step`` returned: Lightning hands the
  callback each micro-batch's loss divided by the accumulation, so their sum is the mean; null when no micro-batch
  returned one), its samples and, where
  the batch's first tensor is a 2-D integer tensor (token ids), its tokens;
- ``end`` (``on_train_end``).

Nothing it does changes what is learned: it reads outputs after Lightning used them, draws no random numbers and
starts no collective. The module also holds :class:`TrialLogger`, the logger a trial runs with.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import sys
from typing import Any

PREFIX = "attune-lightning"


def _callback_bases() -> tuple[type, ...]:
    """Lightning's ``Callback`` class of every Lightning package the script imported (``lightning.pytorch``,
    ``pytorch_lightning``; both where both are loaded, so the trainer's type check passes whichever it uses)."""
    names = [n for n in ("lightning.pytorch", "pytorch_lightning") if n in sys.modules] or ["lightning.pytorch"]
    bases = []
    for name in names:
        try:
            bases.append(importlib.import_module(name).Callback)
        except ImportError:
            continue
    return tuple(bases) or (importlib.import_module("pytorch_lightning").Callback,)


def _emit(event: str, **fields: Any) -> None:
    line = f"{PREFIX} " + json.dumps({"event": event, **fields}, default=str) + "\n"
    sys.stdout.flush()
    os.write(sys.stdout.fileno(), line.encode())  # one write: lines of several ranks never interleave


def _first_tensor(batch: Any) -> Any:
    if hasattr(batch, "shape") and hasattr(batch, "dtype"):
        return batch
    items = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (list, tuple)) else ()
    for item in items:
        found = _first_tensor(item)
        if found is not None:
            return found
    return None


def _number(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError, RuntimeError):
        return None


_Callback: Any = type("_Callback", _callback_bases(), {})
#: where :class:`TrialLogger` writes (the trial sets it to a folder of its own directory)
LOGS_ENV = "ATTUNE_LIGHTNING_LOGS"


def _loggers() -> Any:
    name = next((n for n in ("lightning.pytorch", "pytorch_lightning") if n in sys.modules), "lightning.pytorch")
    return importlib.import_module(f"{name}.loggers")


class TrialLogger(_loggers().CSVLogger):  # type: ignore[misc]
    """The trial's logger in place of the launch's own: Lightning's CSV logger, writing under the trial directory
    (``$ATTUNE_LIGHTNING_LOGS``). ``self.log`` and callbacks that need a logger (``LearningRateMonitor``) work as in the
    user's run, and a trial never writes to the user's log folders or an online tracker."""

    def __init__(self) -> None:
        super().__init__(save_dir=os.environ.get(LOGS_ENV, "."), name="lightning_logs")


class AttuneStepProbe(_Callback):
    """Prints the trainer's layout at the start and one line per optimizer step (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self._step: int | None = None
        self._loss: float | None = None
        self._samples = 0
        self._tokens: int | None = 0

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._step = int(trainer.global_step)
        if trainer.global_rank != 0:
            return
        loader = trainer.train_dataloader
        try:
            stepping = float(trainer.estimated_stepping_batches)
        except Exception:  # noqa: BLE001 - a loader without a length; the field is informative
            stepping = None
        _emit("start", batch_size=getattr(loader, "batch_size", None),
              accumulate_grad_batches=int(trainer.accumulate_grad_batches), world_size=int(trainer.world_size),
              num_nodes=int(trainer.num_nodes), devices=int(trainer.num_devices), precision=str(trainer.precision),
              max_steps=int(trainer.max_steps), max_epochs=trainer.max_epochs,
              estimated_stepping_batches=stepping if stepping is None or math.isfinite(stepping) else None,
              trainable_parameters=sum(p.numel() for p in pl_module.parameters() if p.requires_grad),
              seed=os.environ.get("PL_GLOBAL_SEED"),
              learning_rates=[g.get("lr") for opt in trainer.optimizers for g in opt.param_groups])

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        loss: Any = outputs.get("loss") if isinstance(outputs, dict) else outputs
        value = _number(loss.detach() if hasattr(loss, "detach") else loss)
        if value is not None:  # None: training_step skipped this batch (it returned None)
            self._loss = value if self._loss is None else self._loss + value
        tensor = _first_tensor(batch)
        if tensor is not None and len(tensor.shape) >= 1:
            self._samples += int(tensor.shape[0])
            integer = not (tensor.dtype.is_floating_point or tensor.dtype.is_complex)
            if self._tokens is not None and len(tensor.shape) == 2 and integer:
                self._tokens += int(tensor.numel())
            else:
                self._tokens = None
        step = int(trainer.global_step)
        if self._step is not None and step > self._step:
            _emit("step", step=step, rank=int(trainer.global_rank), world=int(trainer.world_size),
                  loss=self._loss, samples=self._samples, tokens=self._tokens)
            self._loss, self._samples, self._tokens = None, 0, 0
        self._step = step

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        if trainer.global_rank == 0:
            _emit("end", step=int(trainer.global_step))
