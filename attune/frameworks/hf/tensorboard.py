"""Full-precision losses of a local HF trial, from the TensorBoard events the Trainer's own integration writes.

transformers 5 prints each logged float with four significant digits (``f"{v:.4g}"``: a loss near 10 reads
``'10.38'``, a resolution of 5e-3), too coarse for a loss-equivalence band of a few 1e-6. The Trainer's
``report_to tensorboard`` integration (``TensorBoardCallback``) writes the same logs unrounded to local files, so
trials ask for it where the trial's interpreter has a writer; it changes nothing the model learns. The callback
prefers ``torch.utils.tensorboard`` (the ``tensorboard`` package, which attune's ``hf`` extra installs), whose
``flush()`` blocks until every queued event is on disk, and it flushes at every ``on_log``, before the printed line
(integrations are registered before the printer): when attune reads step N from the log, step N's event is in the
file. ``tensorboardX``'s flush does not wait for its writer thread, so there the last step may be missing; a trial
whose events do not cover every step it printed keeps the printed values, and the check states their resolution.

An event file is a sequence of TFRecords (``uint64 length``, ``uint32`` masked CRC of the length, the bytes of one
``Event`` protocol buffer, ``uint32`` masked CRC of the data); its scalars are float32 ``simple_value`` fields.
The record framing is read here; the ``Event`` message is decoded by the writer's own generated protobuf classes.
"""

from __future__ import annotations

import importlib
import logging
import math
import struct
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

#: the folder under a trial directory the Trainer's TensorBoard writer puts its events in
TB_DIR = "hf-tensorboard"
#: the environment variable transformers 5's ``TensorBoardCallback`` reads its log folder from (4.x: ``logging_dir``)
TB_ENV = "TENSORBOARD_LOGGING_DIR"
#: the modules the Trainer's integration writes events with (``torch.utils.tensorboard`` needs ``tensorboard``)
WRITERS = ("tensorboard", "tensorboardX")
#: the scalar tag of the training loss (the integration prefixes ``train/``)
LOSS_TAG = "train/loss"
#: ``reported`` key and value of a trial whose losses were read at float32 precision from the events
PRECISION_KEY = "loss_precision"
FULL = "float32"
PRINTED = "printed"
_EVENT_MODULES = ("tensorboard.compat.proto.event_pb2", "tensorboardX.proto.event_pb2")


def _event_class() -> Any | None:
    for name in _EVENT_MODULES:
        try:
            return importlib.import_module(name).Event
        except ImportError:
            continue
    return None


def records(path: Path) -> list[bytes]:
    """The records of one TFRecord file; a record cut short (the writer killed mid-write) ends the list."""
    data = path.read_bytes()
    out: list[bytes] = []
    i = 0
    while i + 12 <= len(data):
        (length,) = struct.unpack_from("<Q", data, i)
        start, end = i + 12, i + 12 + length
        if end + 4 > len(data):
            break
        out.append(data[start:end])
        i = end + 4
    return out


def scalars(folder: Path, tag: str = LOSS_TAG) -> dict[int, float]:
    """``step → value`` of every ``tag`` scalar in the event files under ``folder`` (empty if none, or if no
    protobuf decoder is installed here); a step logged twice keeps its last value."""
    files = sorted(folder.rglob("events.out.tfevents.*")) if folder.is_dir() else []
    if not files:
        return {}
    event_cls = _event_class()
    if event_cls is None:
        log.info("TensorBoard events in %s, but neither tensorboardX nor tensorboard is installed here to read them",
                 folder)
        return {}
    out: dict[int, float] = {}
    for path in files:
        try:
            raw = records(path)
        except OSError:
            continue
        for blob in raw:
            try:
                event = event_cls.FromString(blob)
            except Exception:  # noqa: BLE001 - a corrupt record is skipped, like TensorBoard's own reader does
                continue
            for value in event.summary.value:
                if value.tag == tag and value.WhichOneof("value") == "simple_value":
                    out[int(event.step)] = float(value.simple_value)
    return out


def printed_agrees(full: float, printed: float) -> bool:
    """Whether ``printed`` is ``full`` as transformers 5 prints it (``.4g``) or 4.x rounds it (4 decimals)."""
    if math.isnan(full) or math.isnan(printed):
        return math.isnan(full) and math.isnan(printed)
    if math.isinf(full) or math.isinf(printed):
        return full == printed
    if full == 0:
        return abs(printed) < 1e-4
    unit: float = max(10 ** (math.floor(math.log10(abs(full))) - 3), 1e-4)
    return abs(full - printed) <= 0.5 * unit * 1.01 + abs(full) * 2.0 ** -23


def merge_losses(steps: list[dict[str, Any]], full: dict[int, float]) -> tuple[list[dict[str, Any]], str]:
    """``steps`` with each printed loss replaced by its full-precision value, and the precision they then have.

    Every step must have its event and every printed value must be its event's value as printed; otherwise the
    events are not this trial's (a resumed run's other steps, a stale folder) and the printed values stay."""
    if not steps or not full:
        return steps, PRINTED
    merged = []
    for rec in steps:
        value = full.get(int(rec["step"]))
        if value is None:
            log.info("no TensorBoard event for step %s (its writer had not written it when the trial ended): the "
                     "trial's losses are the printed ones", rec["step"])
            return steps, PRINTED
        if not printed_agrees(value, float(rec["loss"])):
            log.warning("the TensorBoard loss of step %s (%r) is not the printed %r: the events are not this trial's; "
                        "its losses are the printed ones", rec["step"], value, rec["loss"])
            return steps, PRINTED
        merged.append({**rec, "loss": value})
    return merged, FULL


def float32_resolution(loss: float) -> float:
    """Half a float32 unit in the last place at ``loss``: what an event file's ``simple_value`` cannot show."""
    if not math.isfinite(loss) or loss == 0:
        return 0.0
    return 0.5 * math.ulp(abs(loss)) * 2 ** 29  # float32 keeps 24 of float64's 53 significant bits


__all__ = ["FULL", "LOSS_TAG", "PRECISION_KEY", "PRINTED", "TB_DIR", "TB_ENV", "WRITERS", "float32_resolution",
           "merge_losses", "printed_agrees", "records", "scalars"]
