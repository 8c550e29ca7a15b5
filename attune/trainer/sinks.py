"""Where the trainer's records go: a per-rank JSONL file and, optionally, a Prometheus endpoint.

Both implement the two-method :class:`Sink` interface; the loop writes every record to every sink.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
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


#: most steps whose loss and gradient norm :class:`PrometheusSink` keeps as per-step series (per rank); later
#: steps update only the last-step gauges. A trial (warm-up plus measured steps) is tens of steps, so the cap
#: bounds the series a rank exports (three per step) without cutting a trial's curve short.
STEP_SERIES_CAP = 1000


class PrometheusSink:
    """Serves the step metrics of one rank on ``http://0.0.0.0:PORT/metrics`` (label ``rank``).

    Besides last-step gauges and counters it exports every step's loss and gradient norm as a series of its
    own (``attune_trainer_step_loss{rank, step}``, ``attune_trainer_step_grad_norm{rank, step}``,
    ``attune_trainer_step_seconds{rank, step}``) that stays exported once set, so a reader sees the whole curve in any single scrape after the last step, however
    the scrapes fell. Steps beyond :data:`STEP_SERIES_CAP` are not kept per step. It counts the scrapes it
    served so that :meth:`wait_for_scrape` can hold the process until the final state has been collected.
    """

    def __init__(self, port: int, rank: int) -> None:
        from wsgiref.simple_server import make_server

        from prometheus_client import CollectorRegistry, Counter, Gauge, make_wsgi_app
        from prometheus_client.exposition import ThreadingWSGIServer, _SilentHandler

        self.registry = CollectorRegistry()
        self.rank = str(rank)
        lbl = ["rank"]
        self.step_time = Gauge("attune_trainer_step_time_seconds", "wall time of the last optimizer step", lbl,
                               registry=self.registry).labels(self.rank)
        self.tps = Gauge("attune_trainer_tokens_per_second", "global tokens per second of the last step", lbl,
                         registry=self.registry).labels(self.rank)
        self.loss = Gauge("attune_trainer_loss", "global-batch mean loss of the last step", lbl,
                          registry=self.registry).labels(self.rank)
        self.step_loss = Gauge("attune_trainer_step_loss", "global-batch mean loss of each optimizer step",
                               ["rank", "step"], registry=self.registry)
        self.step_grad_norm = Gauge("attune_trainer_step_grad_norm", "gradient norm (before clipping) of each step",
                                    ["rank", "step"], registry=self.registry)
        self.step_seconds = Gauge("attune_trainer_step_seconds", "wall time of each optimizer step",
                                  ["rank", "step"], registry=self.registry)
        self.steps = Counter("attune_trainer_steps", "optimizer steps completed", lbl,
                             registry=self.registry).labels(self.rank)
        self.tokens = Counter("attune_trainer_tokens", "global tokens processed", lbl,
                              registry=self.registry).labels(self.rank)
        self._cond = threading.Condition()
        self._begun = 0  # scrape requests received
        self._mark = 0  # requests received before the final state was set
        self._after_mark = 0  # scrapes that began after the mark and were answered in full
        self._capped = False
        self._server = make_server("0.0.0.0", port, self._counting(make_wsgi_app(self.registry)),
                                   ThreadingWSGIServer, handler_class=_SilentHandler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="attune-metrics", daemon=True)
        self._thread.start()
        log.info("rank %d serves Prometheus metrics on port %d", rank, port)

    def _counting(self, app: Callable[..., Any]) -> Callable[..., Any]:
        """``app`` wrapped so that each answered scrape of the metrics is counted once its body was sent."""
        sink = self

        class Body:
            def __init__(self, chunks: Iterable[bytes], index: int) -> None:
                self.chunks, self.index = chunks, index

            def __iter__(self) -> Iterator[bytes]:
                return iter(self.chunks)

            def close(self) -> None:  # wsgiref calls this after the body was written
                with sink._cond:
                    if self.index > sink._mark:
                        sink._after_mark += 1
                        sink._cond.notify_all()

        def counted(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
            if environ.get("PATH_INFO") == "/favicon.ico":
                return app(environ, start_response)
            with sink._cond:
                sink._begun += 1
                index = sink._begun
            return Body(app(environ, start_response), index)

        return counted

    @property
    def scrapes(self) -> int:
        """Scrape requests received so far."""
        with self._cond:
            return self._begun

    def write(self, record: Record) -> None:
        if record.get("event") != "step":
            return
        self.step_time.set(record["step_time_s"])
        self.tps.set(record["tokens_per_s"])
        self.loss.set(record["loss"])
        step = int(record.get("step", 0))
        if 0 < step <= STEP_SERIES_CAP:
            self.step_loss.labels(self.rank, str(step)).set(record["loss"])
            self.step_seconds.labels(self.rank, str(step)).set(record["step_time_s"])
            if "grad_norm" in record:
                self.step_grad_norm.labels(self.rank, str(step)).set(record["grad_norm"])
        elif step > STEP_SERIES_CAP and not self._capped:
            self._capped = True
            log.warning("step %d is past STEP_SERIES_CAP (%d): later steps get no per-step series",
                        step, STEP_SERIES_CAP)
        self.steps.inc()
        self.tokens.inc(record["tokens"])

    def wait_for_scrape(self, timeout_s: float) -> bool:
        """Block until a scrape that began after this call has been answered, at most ``timeout_s`` seconds.

        Called after the last record was written, that scrape carries the final state. Returns whether one
        came; ``False`` (nobody scraped in time) is logged and otherwise harmless.
        """
        deadline = time.monotonic() + max(timeout_s, 0.0)
        with self._cond:
            self._mark, self._after_mark = self._begun, 0
            while self._after_mark == 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    log.warning("rank %s: no scrape of the final metrics within %.1f s", self.rank, timeout_s)
                    return False
                self._cond.wait(left)
        return True

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
