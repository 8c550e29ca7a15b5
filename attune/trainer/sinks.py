"""Where the trainer's records go: a per-rank JSONL file and, optionally, a Prometheus endpoint.

Both implement the two-method :class:`Sink` interface; the loop writes every record to every sink.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any, Protocol

log = logging.getLogger(__name__)

Record = dict[str, Any]


class Sink(Protocol):
    """A destination of trainer records (``start``, ``step``, ``error``, ``done`` events)."""

    def write(self, record: Record) -> None: ...

    def close(self) -> None: ...


class JsonlSink:
    """Appends one JSON object per line to ``OUT_DIR/rank{R}.jsonl``, flushing each line."""

    def __init__(self, out_dir: str, rank: int) -> None:
        os.makedirs(out_dir, exist_ok=True)
        self.path = os.path.join(out_dir, f"rank{rank}.jsonl")
        self._f = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()

    def write(self, record: Record) -> None:
        self._f.write(json.dumps(record, allow_nan=True) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


class PrometheusSink:
    """Serves step metrics of one rank on ``http://0.0.0.0:PORT/metrics`` (label ``rank``)."""

    def __init__(self, port: int, rank: int) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

        self.registry = CollectorRegistry()
        lbl = ["rank"]
        self.step_time = Gauge("attune_trainer_step_time_seconds", "wall time of the last optimizer step", lbl,
                               registry=self.registry).labels(str(rank))
        self.tps = Gauge("attune_trainer_tokens_per_second", "global tokens per second of the last step", lbl,
                         registry=self.registry).labels(str(rank))
        self.loss = Gauge("attune_trainer_loss", "global-batch mean loss of the last step", lbl,
                          registry=self.registry).labels(str(rank))
        self.steps = Counter("attune_trainer_steps", "optimizer steps completed", lbl,
                             registry=self.registry).labels(str(rank))
        self.tokens = Counter("attune_trainer_tokens", "global tokens processed", lbl,
                              registry=self.registry).labels(str(rank))
        self._server, self._thread = start_http_server(port, registry=self.registry)
        log.info("rank %d serves Prometheus metrics on port %d", rank, port)

    def write(self, record: Record) -> None:
        if record.get("event") != "step":
            return
        self.step_time.set(record["step_time_s"])
        self.tps.set(record["tokens_per_s"])
        self.loss.set(record["loss"])
        self.steps.inc()
        self.tokens.inc(record["tokens"])

    def close(self) -> None:
        self._server.shutdown()
