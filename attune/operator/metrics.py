"""Throughput and utilisation of a trial, read from Prometheus over its HTTP API.

Two sources, both selected by the trial's pods: the reference trainer's own metrics (``attune_trainer_*``,
label ``rank``) give step times and losses; NVIDIA's DCGM exporter gives GPU utilisation when present.
The PromQL builders are pure; :class:`PrometheusClient` is the only part that does I/O.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import httpx

from attune.engine.measure import summarise
from attune.engine.state import Measurement
from attune.operator.resources import MetricsSpec

log = logging.getLogger(__name__)

STEP_TIME = "attune_trainer_step_time_seconds"
STEPS = "attune_trainer_steps_total"
LOSS = "attune_trainer_loss"

#: utilisation signal → (DCGM metric, aggregation over the trial's GPUs)
DCGM_SIGNALS: dict[str, tuple[str, str]] = {
    "sm_active": ("DCGM_FI_PROF_SM_ACTIVE", "avg"),
    "sm_occupancy": ("DCGM_FI_PROF_SM_OCCUPANCY", "avg"),
    "tensor_active": ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "avg"),
    "dram_active": ("DCGM_FI_PROF_DRAM_ACTIVE", "avg"),
    "gpu_util_pct": ("DCGM_FI_DEV_GPU_UTIL", "avg"),
    "fb_free_mib_min": ("DCGM_FI_DEV_FB_FREE", "min"),
    "power_w": ("DCGM_FI_DEV_POWER_USAGE", "sum"),
    "nvlink_tx_bytes_per_s": ("DCGM_FI_PROF_NVLINK_TX_BYTES", "sum"),
}


class MetricsUnavailable(Exception):
    """Prometheus could not be queried (unreachable, an error status, or a malformed answer)."""


def quote(value: str) -> str:
    """A PromQL double-quoted string literal."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def regex_escape(value: str) -> str:
    """``value`` with RE2 metacharacters escaped (Kubernetes names only contain ``-`` and ``.``, but be safe)."""
    return "".join("\\" + ch if ch in r".^$*+?()[]{}|\\" else ch for ch in value)


def pod_selector(m: MetricsSpec, namespace: str, job: str, extra: dict[str, str] | None = None) -> str:
    """Label matchers selecting the pods of PyTorchJob ``job`` (``<job>-master-N``, ``<job>-worker-N``)."""
    parts = [f"{m.namespace_label}={quote(namespace)}",
             f"{m.pod_label}=~{quote(regex_escape(job) + '-(master|worker)-[0-9]+')}"]
    parts += [f"{k}={quote(v)}" for k, v in sorted((extra or {}).items())]
    return "{" + ", ".join(parts) + "}"


def trainer_queries(m: MetricsSpec, namespace: str, job: str) -> dict[str, str]:
    """Instant-vector queries of rank 0's step counter, last step time and last loss."""
    sel = pod_selector(m, namespace, job, {"rank": "0"})
    return {"steps": f"max({STEPS}{sel})", "step_time": f"max({STEP_TIME}{sel})", "loss": f"max({LOSS}{sel})"}


def dcgm_queries(m: MetricsSpec, namespace: str, job: str, window_s: int) -> dict[str, str]:
    """Window-averaged DCGM utilisation queries over the trial's GPUs."""
    sel = pod_selector(m, namespace, job)
    w = f"[{max(int(window_s), 1)}s]"
    return {name: f"{agg}(avg_over_time({metric}{sel}{w}))" for name, (metric, agg) in DCGM_SIGNALS.items()}


class PrometheusClient:
    """A small client of the Prometheus HTTP API (``/api/v1/query`` and ``/api/v1/query_range``)."""

    def __init__(self, url: str, timeout_s: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s

    def _get(self, path: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        try:
            resp = httpx.get(self.url + path, params=params, timeout=self.timeout_s)
        except httpx.HTTPError as err:
            raise MetricsUnavailable(f"Prometheus at {self.url} is unreachable: {err}") from None
        if resp.status_code >= 400:
            raise MetricsUnavailable(f"Prometheus answered {resp.status_code}: {resp.text[:200]}")
        try:
            body = resp.json()
            if body.get("status") != "success":
                raise MetricsUnavailable(f"Prometheus query failed: {body.get('error', body)}")
            return list(body["data"]["result"])
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise MetricsUnavailable(f"malformed Prometheus answer: {err}") from None

    def query(self, promql: str, at: float | None = None) -> float | None:
        """The first sample's value of an instant query, or ``None`` when the result is empty."""
        params: dict[str, Any] = {"query": promql}
        if at is not None:
            params["time"] = f"{at:.3f}"
        result = self._get("/api/v1/query", params)
        if not result:
            return None
        value = float(result[0]["value"][1])
        return None if math.isnan(value) else value

    def query_range(self, promql: str, start: float, end: float, step_s: float = 1.0) -> list[tuple[float, float]]:
        """``(timestamp, value)`` samples of the first series of a range query."""
        result = self._get("/api/v1/query_range", {"query": promql, "start": f"{start:.3f}", "end": f"{end:.3f}",
                                                   "step": f"{step_s:g}"})
        if not result:
            return []
        return [(float(t), float(v)) for t, v in result[0]["values"]]

    def healthy(self) -> bool:
        try:
            return httpx.get(self.url + "/-/ready", timeout=self.timeout_s).status_code == 200
        except httpx.HTTPError:
            return False


def step_records(steps: list[tuple[float, float]], times: list[tuple[float, float]],
                 losses: list[tuple[float, float]], tokens_per_step: int) -> list[dict[str, Any]]:
    """Per-step records (the trainer's JSONL shape) from sampled counters and gauges, one per step seen."""
    by_t_time, by_t_loss = dict(times), dict(losses)
    seen: dict[int, dict[str, Any]] = {}
    for t, count in steps:
        step = int(count)
        if step < 1 or step in seen or t not in by_t_time:
            continue
        seen[step] = {"step": step, "step_time_s": by_t_time[t], "tokens": tokens_per_step,
                      "loss": by_t_loss.get(t, float("nan"))}
    return [seen[k] for k in sorted(seen)]


def measure_trial(client: PrometheusClient, m: MetricsSpec, namespace: str, job: str, start: float, end: float,
                  *, tokens_per_step: int, devices: int) -> Measurement | None:
    """The trial's steady-state measurement from Prometheus, or ``None`` if too few steps were sampled.

    Step times are rank 0's gauge sampled at each scrape; steps at or before ``warmupSteps`` are dropped.
    The loss curve is kept only when every step was sampled (the loss-equivalence check needs all of them).
    """
    q = trainer_queries(m, namespace, job)
    lo, hi = start - 1.0, end + 2.0
    steps = client.query_range(q["steps"], lo, hi)
    times = client.query_range(q["step_time"], lo, hi)
    losses = client.query_range(q["loss"], lo, hi)
    records = step_records(steps, times, losses, tokens_per_step)
    window = [r for r in records if r["step"] > m.warmup_steps]
    if len(window) < 2:
        return None
    signals: dict[str, float] = {}
    for name, promql in dcgm_queries(m, namespace, job, int(end - start - m.warmup_seconds)).items():
        value = client.query(promql, at=end)
        if value is not None:
            signals[name] = value
    meas = summarise(window, warmup_steps=0, devices=devices, signals=signals)
    if meas is None:
        return None
    total = m.warmup_steps + m.measure_steps
    complete = [r["step"] for r in records] == list(range(1, total + 1)) and \
        all(not math.isnan(r["loss"]) for r in records)
    return meas.model_copy(update={"losses": [r["loss"] for r in records] if complete else []})
