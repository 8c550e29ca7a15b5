"""Throughput and utilisation of a trial, read from Prometheus over its HTTP API.

Two sources, both selected by the trial's pods: the reference trainer's own metrics (``attune_trainer_*``,
label ``rank``) give step times and losses; NVIDIA's DCGM exporter gives GPU utilisation when present.
The PromQL builders are pure; :class:`PrometheusClient` is the only part that does I/O.

The trainer exports each step's loss, gradient norm and wall time as series of their own
(``attune_trainer_step_loss{rank, step}`` and so on, kept once set, capped at
:data:`attune.trainer.sinks.STEP_SERIES_CAP` steps) and waits after its last step for one scrape, so any
scrape after the end holds the whole curve. :func:`curve_query` reads it back with ``max_over_time`` over
the trial's lifetime, which works at any later time, also after the series went stale. The loss-equivalence
check needs every step's loss; throughput uses every step time there is. Without the per-step step times (an
older trainer) throughput falls back to the last-step gauge sampled at scrape times.
"""

from __future__ import annotations

import logging
import math
import re
import ssl
from dataclasses import dataclass
from typing import Any

import httpx

from attune.engine.measure import summarise
from attune.operator import telemetry
from attune.operator.resources import PROMETHEUS_LABEL_NAME, MetricsSpec
from attune.trial import Measurement

log = logging.getLogger(__name__)

STEP_TIME = "attune_trainer_step_time_seconds"
STEPS = "attune_trainer_steps_total"
LOSS = "attune_trainer_loss"
STEP_LOSS = "attune_trainer_step_loss"
STEP_GRAD_NORM = "attune_trainer_step_grad_norm"
STEP_SECONDS = "attune_trainer_step_seconds"
#: seconds added on each side of a trial's [start, end] when reading its per-step series (clock skew, the
#: 1 s resolution of job timestamps, the trainer's wait for the final scrape)
CURVE_MARGIN_S = 60

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
    """A PromQL double-quoted string literal of ``value``, whatever it holds (Go's escapes: a backslash, a quote and
    the control characters a literal may not contain raw)."""
    escapes = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}
    return '"' + "".join(escapes.get(ch, ch) if ch >= " " or ch in escapes else f"\\x{ord(ch):02x}"
                         for ch in value) + '"'


def label_name(name: str) -> str:
    """``name`` if it is a Prometheus label name, else ValueError: a label name goes into a selector unquoted."""
    if not re.fullmatch(PROMETHEUS_LABEL_NAME, name):
        raise ValueError(f"{name!r} is not a Prometheus label name ([a-zA-Z_][a-zA-Z0-9_]*)")
    return name


def regex_escape(value: str) -> str:
    """``value`` with RE2 metacharacters escaped (Kubernetes names only contain ``-`` and ``.``, but be safe)."""
    return "".join("\\" + ch if ch in r".^$*+?()[]{}|\\" else ch for ch in value)


def pod_pattern(job: str, pod_regex: str | None = None) -> str:
    """RE2 pattern of job ``job``'s pod names: a PyTorchJob's ``<job>-master-N``/``<job>-worker-N`` unless the
    backend gives its own (``pod_regex`` is a format with ``{job}``, the escaped name)."""
    esc = regex_escape(job)
    return pod_regex.format(job=esc) if pod_regex else esc + "-(master|worker)-[0-9]+"


def pod_selector(m: MetricsSpec, namespace: str, job: str, extra: dict[str, str] | None = None,
                 pod_regex: str | None = None, dcgm: bool = False) -> str:
    """Label matchers selecting the pods of job ``job``: on the trainer's series, or (``dcgm``) on the DCGM
    exporter's, whose labels its own scrape decides (``spec.metrics.dcgm``)."""
    ns_label, pod_label = (m.dcgm.namespace_label, m.dcgm.pod_label) if dcgm else (m.namespace_label, m.pod_label)
    parts = [f"{label_name(ns_label)}={quote(namespace)}",
             f"{label_name(pod_label)}=~{quote(pod_pattern(job, pod_regex))}"]
    parts += [f"{label_name(k)}={quote(v)}" for k, v in sorted((extra or {}).items())]
    return "{" + ", ".join(parts) + "}"


def trainer_queries(m: MetricsSpec, namespace: str, job: str, pod_regex: str | None = None) -> dict[str, str]:
    """Instant-vector queries of rank 0's step counter, last step time and last loss."""
    sel = pod_selector(m, namespace, job, {"rank": "0"}, pod_regex)
    return {"steps": f"max({STEPS}{sel})", "step_time": f"max({STEP_TIME}{sel})", "loss": f"max({LOSS}{sel})"}


def curve_query(m: MetricsSpec, namespace: str, job: str, metric: str, window_s: float,
                pod_regex: str | None = None) -> str:
    """Instant query of rank 0's per-step series ``metric``: one sample per ``step`` label, over ``window_s``.

    Each step's series is constant once set, so ``max_over_time`` over a window covering the trial returns
    its value, whether or not the series is stale by now.
    """
    sel = pod_selector(m, namespace, job, {"rank": "0"}, pod_regex)
    return f"max by (step) (max_over_time({metric}{sel}[{max(math.ceil(window_s), 1)}s]))"


def dcgm_queries(m: MetricsSpec, namespace: str, job: str, window_s: int,
                 pod_regex: str | None = None) -> dict[str, str]:
    """Window-averaged DCGM utilisation queries over the trial's GPUs."""
    sel = pod_selector(m, namespace, job, pod_regex=pod_regex, dcgm=True)
    w = f"[{max(int(window_s), 1)}s]"
    return {name: f"{agg}(avg_over_time({metric}{sel}{w}))" for name, (metric, agg) in DCGM_SIGNALS.items()}


@dataclass(frozen=True)
class Access:
    """How to reach Prometheus: credentials (already read from their Secrets), a CA bundle, a tenant."""

    bearer_token: str | None = None
    basic_auth: tuple[str, str] | None = None
    ca_pem: str | None = None
    tenant: str | None = None

    def headers(self) -> dict[str, str]:
        out = {"X-Scope-OrgID": self.tenant} if self.tenant else {}
        if self.bearer_token:
            out["Authorization"] = f"Bearer {self.bearer_token.strip()}"
        return out


def _clean(text: str, limit: int = 60) -> str:
    """A short identifier-like string from a response (Prometheus's ``errorType``), nothing else of it."""
    return "".join(ch for ch in str(text) if ch.isalnum() or ch in "_-")[:limit] or "unknown"


class PrometheusClient:
    """A small client of the Prometheus HTTP API (``/api/v1/query`` and ``/api/v1/query_range``).

    Errors never quote the response: an operator fetching a user-supplied URL must not copy what it answered into
    a status anyone may read."""

    def __init__(self, url: str, timeout_s: float = 10.0, access: Access | None = None) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.access = access or Access()
        self._verify: Any = True
        if self.access.ca_pem:
            self._verify = ssl.create_default_context(cadata=self.access.ca_pem)
        self._auth = httpx.BasicAuth(*self.access.basic_auth) if self.access.basic_auth else None

    def _get(self, path: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        with telemetry.timed_request("prometheus"):
            return self._get_timed(path, params)

    def _get_timed(self, path: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        try:
            resp = httpx.get(self.url + path, params=params, timeout=self.timeout_s, headers=self.access.headers(),
                             auth=self._auth, verify=self._verify, follow_redirects=False)
        except httpx.HTTPError as err:
            raise MetricsUnavailable(f"Prometheus at {self.url} is unreachable: {type(err).__name__}") from None
        if resp.status_code >= 400 or resp.status_code in (301, 302, 303, 307, 308):
            raise MetricsUnavailable(f"Prometheus at {self.url} answered HTTP {resp.status_code}")
        try:
            body = resp.json()
            if body.get("status") != "success":
                raise MetricsUnavailable(f"Prometheus query failed ({_clean(body.get('errorType', 'error'))})")
            return list(body["data"]["result"])
        except (ValueError, KeyError, TypeError, AttributeError):
            raise MetricsUnavailable(f"Prometheus at {self.url} gave an answer that is not the query API's") from None

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

    def query_vector(self, promql: str, at: float | None = None) -> list[tuple[dict[str, str], float]]:
        """``(labels, value)`` of every series of an instant query (NaN values dropped)."""
        params: dict[str, Any] = {"query": promql}
        if at is not None:
            params["time"] = f"{at:.3f}"
        out: list[tuple[dict[str, str], float]] = []
        for item in self._get("/api/v1/query", params):
            try:
                labels, value = dict(item.get("metric") or {}), float(item["value"][1])
            except (KeyError, IndexError, TypeError, ValueError):
                raise MetricsUnavailable(f"Prometheus at {self.url} gave a malformed sample") from None
            if not math.isnan(value):
                out.append((labels, value))
        return out

    def query_range(self, promql: str, start: float, end: float, step_s: float = 1.0) -> list[tuple[float, float]]:
        """``(timestamp, value)`` samples of the first series of a range query."""
        result = self._get("/api/v1/query_range", {"query": promql, "start": f"{start:.3f}", "end": f"{end:.3f}",
                                                   "step": f"{step_s:g}"})
        if not result:
            return []
        return [(float(t), float(v)) for t, v in result[0]["values"]]

    def healthy(self) -> bool:
        """Whether Prometheus answers its readiness probe."""
        try:
            return httpx.get(self.url + "/-/ready", timeout=self.timeout_s, headers=self.access.headers(),
                             auth=self._auth, verify=self._verify).status_code == 200
        except httpx.HTTPError:
            return False


def step_records(steps: list[tuple[float, float]], times: list[tuple[float, float]],
                 tokens_per_step: int) -> list[dict[str, Any]]:
    """Per-step timing records (the trainer's JSONL shape) from the sampled step counter and step-time gauge."""
    by_t_time = dict(times)
    seen: dict[int, dict[str, Any]] = {}
    for t, count in steps:
        step = int(count)
        if step < 1 or step in seen or t not in by_t_time:
            continue
        seen[step] = {"step": step, "step_time_s": by_t_time[t], "tokens": tokens_per_step, "loss": math.nan}
    return [seen[k] for k in sorted(seen)]


def complete_curve(samples: list[tuple[dict[str, str], float]], total: int) -> list[float]:
    """The per-step values ``1..total`` of a per-step series, or ``[]`` unless every step is there and finite."""
    by_step: dict[int, float] = {}
    for labels, value in samples:
        raw = labels.get("step", "")
        if raw.isdigit():
            by_step[int(raw)] = value
    curve = [by_step.get(step, math.nan) for step in range(1, total + 1)]
    return curve if total > 0 and all(math.isfinite(v) for v in curve) else []


def per_step(samples: list[tuple[dict[str, str], float]]) -> dict[int, float]:
    """Step number → finite value of a per-step series' samples."""
    out: dict[int, float] = {}
    for labels, value in samples:
        raw = labels.get("step", "")
        if raw.isdigit() and math.isfinite(value):
            out[int(raw)] = value
    return out


def min_steps(m: MetricsSpec) -> int:
    """Measured steps a trial needs to count as measured: ``minMeasuredFraction`` of ``measureSteps``, at least 2."""
    return max(2, math.ceil(m.min_measured_fraction * m.measure_steps - 1e-9))


def measure_trial(client: PrometheusClient, m: MetricsSpec, namespace: str, job: str, start: float, end: float,
                  *, tokens_per_step: int, devices: int, pod_regex: str | None = None) -> Measurement | None:
    """The trial's steady-state measurement from Prometheus, or ``None`` if too few steps were seen (fewer than
    :func:`min_steps`).

    Step times are rank 0's per-step series (else its last-step gauge sampled at each scrape); steps at or
    before ``warmupSteps`` are dropped. The loss curve (and gradient norms) are kept only when every step
    ``1..warmupSteps+measureSteps`` is there: the loss-equivalence check needs all of them. DCGM signals that
    Prometheus does not hold are left out of ``signals`` (the operator reports them missing).
    """
    need = min_steps(m)
    at, span = end + CURVE_MARGIN_S, end - start + 2 * CURVE_MARGIN_S
    timed = per_step(client.query_vector(curve_query(m, namespace, job, STEP_SECONDS, span, pod_regex), at=at))
    records = [{"step": k, "step_time_s": v, "tokens": tokens_per_step, "loss": math.nan}
               for k, v in sorted(timed.items())]
    if len([r for r in records if r["step"] > m.warmup_steps]) < need:
        q = trainer_queries(m, namespace, job, pod_regex)
        lo, hi = start - 1.0, end + 2.0
        sampled = step_records(client.query_range(q["steps"], lo, hi), client.query_range(q["step_time"], lo, hi),
                               tokens_per_step)
        if len([r for r in sampled if r["step"] > m.warmup_steps]) > len(
                [r for r in records if r["step"] > m.warmup_steps]):
            records = sampled
    window = [r for r in records if r["step"] > m.warmup_steps]
    if len(window) < need:
        log.info("%s/%s: %d of %d measured steps in Prometheus (%d needed)", namespace, job, len(window),
                 m.measure_steps, need)
        return None
    signals: dict[str, float] = {}
    for name, promql in dcgm_queries(m, namespace, job, int(end - start - m.warmup_seconds), pod_regex).items():
        value = client.query(promql, at=end)
        if value is not None:
            signals[name] = value
    meas = summarise(window, warmup_steps=0, devices=devices, signals=signals)
    if meas is None:
        return None
    total = m.warmup_steps + m.measure_steps
    losses = complete_curve(client.query_vector(curve_query(m, namespace, job, STEP_LOSS, span, pod_regex), at=at),
                            total)
    norms = complete_curve(client.query_vector(curve_query(m, namespace, job, STEP_GRAD_NORM, span, pod_regex),
                                               at=at), total) if losses else []
    if not losses:
        log.info("%s/%s: the per-step loss curve is incomplete in Prometheus; no loss check possible", namespace, job)
    return meas.model_copy(update={"losses": losses, "grad_norms": norms})
