"""Measuring a trial from its master pod's log, for frameworks whose trials serve no metrics (``metrics_source:
logs``): the user's own job prints its per-step lines, and the kubelet stamps each line with its arrival time.

Everything here is pure: :func:`master_pod` picks the pod the Kubeflow training operator labelled as the job's
master (rank 0), :func:`read_log` feeds a ``timestamps=true`` log to the framework's pod parser with each line's
kubelet time as ``t``, and :func:`log_verdict` decides from the job's phase and the parsed log whether the trial
is still running, measured, or failed (and how). The API calls live in :mod:`attune.operator.kube`.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass, field
from typing import Any

from attune.frameworks.base import LogParser
from attune.trial import FailureKind, TrialOutcome, failure_message

#: labels the Kubeflow training operator (v1.7+) sets on every pod of a PyTorchJob
JOB_NAME_LABEL = "training.kubeflow.org/job-name"
REPLICA_TYPE_LABEL = "training.kubeflow.org/replica-type"
REPLICA_INDEX_LABEL = "training.kubeflow.org/replica-index"
JOB_ROLE_LABEL = "training.kubeflow.org/job-role"
#: at most this much of a pod's log is read per reconcile step (the steps a measurement needs come early)
LOG_LIMIT_BYTES = 16 * 1024 * 1024

_STAMP = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d{1,9})?(Z|[+-]\d\d:\d\d) ?")


class LogsUnavailable(Exception):
    """A trial pod's log (or the pod list) could not be read; ``reason`` is a condition reason."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def pod_selector(job: str) -> str:
    """Label selector of every pod of PyTorchJob ``job``."""
    return f"{JOB_NAME_LABEL}={job}"


def master_pod(pods: list[dict[str, Any]], job: str) -> dict[str, Any] | None:
    """Rank 0's pod among ``pods``: the Master replica's index 0 (a Worker's index 0 where the job has no Master)."""
    def rank(pod: dict[str, Any]) -> int | None:
        meta = pod.get("metadata") or {}
        labels = meta.get("labels") or {}
        if labels.get(JOB_NAME_LABEL) != job or meta.get("deletionTimestamp"):
            return None
        rtype = str(labels.get(REPLICA_TYPE_LABEL, "")).lower()
        index = str(labels.get(REPLICA_INDEX_LABEL, ""))
        if index != "0":
            return None
        if rtype == "master" or labels.get(JOB_ROLE_LABEL) == "master":
            return 0
        return 1 if rtype == "worker" else None

    ranked = sorted(((r, p["metadata"].get("name", "")), p) for p in pods if (r := rank(p)) is not None)
    return ranked[0][1] if ranked else None


def split_timestamp(line: str) -> tuple[float | None, str]:
    """(POSIX time, text) of one ``timestamps=true`` log line: the kubelet's RFC 3339 (nano) stamp and a space.

    Go trims trailing zeros of the fraction (``…:05.12Z``, or ``…:05Z`` with none); a line without a stamp gives
    ``None``."""
    m = _STAMP.match(line)
    if m is None:
        return None, line
    base, frac, zone = m.groups()
    when = dt.datetime.fromisoformat(base + ("+00:00" if zone == "Z" else zone))
    return when.timestamp() + (float(frac) if frac else 0.0), line[m.end():]


@dataclass
class PodLog:
    """What a trial pod's log showed: the parser's step records, when each arrived, and failure signatures."""

    steps: list[dict[str, Any]] = field(default_factory=list)
    arrivals: list[float] = field(default_factory=list)  # arrivals[i]: kubelet time of the line that gave steps[i]
    errors: list[dict[str, Any]] = field(default_factory=list)
    first_error: str | None = None
    done: bool = False
    lines: int = 0
    reported: dict[str, Any] = field(default_factory=dict)  # LogParser.reported


def read_log(text: str, parser: LogParser) -> PodLog:
    """Feed a ``timestamps=true`` pod log to ``parser``, line by line, each at its kubelet time."""
    arrivals: list[float] = []
    last: float | None = None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the log's final newline; a torn last line (no newline yet) is still fed
    for line in lines:
        t, body = split_timestamp(line)
        t = t if t is not None else (last if last is not None else 0.0)
        last = t
        parser.feed(body, t)
        arrivals.extend([t] * (len(parser.steps) - len(arrivals)))
    return PodLog(steps=list(parser.steps), arrivals=arrivals[:len(parser.steps)], errors=list(parser.errors),
                  first_error=parser.first_error_line, done=parser.done, lines=len(lines),
                  reported=dict(parser.reported))


@dataclass(frozen=True)
class LogVerdict:
    """What the operator does with a log-measured trial now.

    ``action``: ``wait`` (keep watching), ``measure`` (enough steps: record the measurement, then stop the job),
    ``fail`` (record ``outcome`` with ``message``; ``stop`` when the job still runs and must be ended; outcome
    ``None``: the log shows no known failure, so the job's own condition decides).
    """

    action: str
    outcome: TrialOutcome | None = None
    message: str = ""
    stop: bool = False


def log_verdict(phase: str, log: PodLog | None, needed: int, *, reason: str = "", message: str = "") -> LogVerdict:
    """The decision for a trial measured from its pod log, from the job's ``phase`` (with the failed job's
    ``reason`` and ``message``) and the parsed log (``None`` when it could not be read).

    A running job is measured as soon as ``needed`` (warm-up plus measurement) steps are in its log: the
    user's own job would otherwise train on to its full step count. A NaN loss ends it at once. A failed job is
    classified from its log's failure signatures (out of memory, NCCL/gloo, NaN) before the job's own reason.
    """
    errors = log.errors if log is not None else []
    n = len(log.steps) if log is not None else 0
    diverged = failure_message(errors, FailureKind.DIVERGED)
    if phase in ("Pending", "Running"):
        if diverged is not None:
            return LogVerdict("fail", TrialOutcome.DIVERGED, diverged, stop=True)
        if n >= needed:
            return LogVerdict("measure")
        return LogVerdict("wait")
    if phase == "Succeeded":
        if diverged is not None:
            return LogVerdict("fail", TrialOutcome.DIVERGED, diverged)
        if n >= needed:
            return LogVerdict("measure")
        if log is None:
            return LogVerdict("fail", TrialOutcome.CRASHED, "the job succeeded, but its master pod's log is gone")
        return LogVerdict("fail", TrialOutcome.CRASHED,
                          f"the job finished after {n} of the {needed} steps the measurement needs; raise its "
                          "step count or lower warmupSteps + measureSteps")
    # Failed: the log's signatures say more than the job's condition
    text = f"{reason} {message}".strip()
    if "DeadlineExceeded" in text:
        return LogVerdict("fail", TrialOutcome.TIMED_OUT, f"job failed: {text} (last step seen: {n}/{needed})")
    for kind in (FailureKind.OOM, FailureKind.DIVERGED):
        hit = failure_message(errors, kind)
        if hit is not None:
            return LogVerdict("fail", kind.outcome, hit)
    comm = failure_message(errors, FailureKind.COMM)
    if comm is not None:
        return LogVerdict("fail", TrialOutcome.CRASHED, comm)
    first = (log.first_error if log is not None else None) or failure_message(errors, FailureKind.CRASH)
    detail = f"job failed: {text}" + (f": {first}" if first else "")
    return LogVerdict("fail", None, detail.strip())  # outcome None: from the job's condition
